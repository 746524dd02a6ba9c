// The examples' command line: `--name` flags and `--name VALUE` options, in any order, with
// -h/--help. A usage error prints "<program>: <what is wrong>" on stderr and exits with status 1;
// --help prints the usage on stdout and exits with status 0. Numbers are checked whole (no
// trailing junk) and against their least value, so "--threads x" is an error, not 0 threads.
//
//   weightcache::example::CommandLine cl(argc, argv, "my-runtime", kUsage);
//   while (cl.next()) {
//     if (cl.take("--model", model) || cl.take("--threads", threads, 1) || cl.flag("--json", json)) continue;
//     cl.unknown();
//   }
//   cl.require("--model", model);
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weightcache::example {

class CommandLine {
 public:
  CommandLine(int argc, char** argv, const char* program, const char* usage)
      : argc_(argc), argv_(argv), program_(program), usage_(usage) {}

  // Steps to the next argument: false after the last. -h and --help print the usage and exit.
  bool next() {
    if (++at_ >= argc_) return false;
    arg_ = argv_[at_];
    if (arg_ == "-h" || arg_ == "--help") {
      std::fputs(usage_, stdout);
      std::exit(0);
    }
    return true;
  }

  // The current argument is the flag `name`: `on` becomes true.
  bool flag(const char* name, bool& on) {
    if (arg_ != name) return false;
    on = true;
    return true;
  }

  // The current argument is the option `name`: its value, the argument after it, is put in `out`.
  bool take(const char* name, std::string& out) {
    if (arg_ != name) return false;
    out = value();
    return true;
  }
  template <class Int, std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>, int> = 0>
  // A whole number from `least` to `most` (at most what Int holds).
  bool take(const char* name, Int& out, long long least,
            long long most = static_cast<long long>(std::min<unsigned long long>(
                std::numeric_limits<Int>::max(), std::numeric_limits<long long>::max()))) {
    if (arg_ != name) return false;
    const std::string v = value();
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    const long long cap = static_cast<long long>(
        std::min<unsigned long long>(static_cast<unsigned long long>(most), std::numeric_limits<Int>::max()));
    if (v.empty() || *end != '\0' || errno != 0 || n < least || n > cap)
      fail(std::string(name) + ": '" + v + "' is not a whole number from " + std::to_string(least) + " to " +
           std::to_string(cap));
    out = static_cast<Int>(n);
    return true;
  }
  bool take(const char* name, double& out) {
    if (arg_ != name) return false;
    const std::string v = value();
    char* end = nullptr;
    out = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') fail(std::string(name) + ": '" + v + "' is not a number");
    return true;
  }
  // A repeatable `name key=value`: the pair is appended to `out`.
  bool take(const char* name, std::vector<std::pair<std::string, std::string>>& out) {
    if (arg_ != name) return false;
    const std::string v = value();
    const std::size_t eq = v.find('=');
    if (eq == std::string::npos || eq == 0) fail(std::string(name) + ": expected key=value, got '" + v + "'");
    out.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    return true;
  }
  // An option whose value is one of a few words, each standing for a value of `T`.
  template <class T>
  bool choose(const char* name, T& out, std::initializer_list<std::pair<const char*, T>> words) {
    if (arg_ != name) return false;
    const std::string v = value();
    std::string known;
    for (const auto& [word, meaning] : words) {
      if (v == word) {
        out = meaning;
        return true;
      }
      known += (known.empty() ? "" : ", ") + std::string(word);
    }
    fail(std::string(name) + ": '" + v + "' is not one of " + known);
  }

  // The current argument is none of the program's.
  [[noreturn]] void unknown() const { fail("unknown argument '" + arg_ + "'\n" + usage_); }
  // A required option that was not given.
  void require(const char* name, const std::string& value) const {
    if (value.empty()) fail(std::string(name) + " is required\n" + usage_);
  }
  [[noreturn]] void fail(const std::string& why) const {
    std::fflush(stdout);
    const char* end = !why.empty() && why.back() == '\n' ? "" : "\n";
    std::fprintf(stderr, "%s: %s%s", program_, why.c_str(), end);
    std::exit(1);
  }

 private:
  std::string value() {
    if (at_ + 1 >= argc_) fail(arg_ + " needs a value");
    return argv_[++at_];
  }

  int argc_;
  char** argv_;
  const char* program_;
  const char* usage_;
  int at_ = 0;
  std::string arg_;
};

}  // namespace weightcache::example
