// Shared by the multi-process tests and their helper process (no GoogleTest here): entry bytes
// that every process derives from the key alone, the options every process opens with, a tiny
// key=value argument / results format, and pipe helpers for start gates and "ready" signals.
#pragma once

#include "key_content.hpp"
#include "random_bytes.hpp"

#include <weightcache/weight_cache.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

namespace weightcache::test::mp {

/// Exit codes of the helper process; anything else is a crash or a signal.
inline constexpr int kOk = 0;
inline constexpr int kUsage = 10;
inline constexpr int kCacheError = 11;  // a library call failed
inline constexpr int kMismatch = 12;    // wrong bytes, or a key missing / present where it must not be
inline constexpr int kFellBack = 13;    // an entry went to the heap where the file was expected

inline std::string shared_key(std::size_t i) { return "shared/" + std::to_string(i); }
inline std::string own_key(std::string_view tag, std::size_t i) {
  return "own/" + std::string(tag) + "/" + std::to_string(i);
}

/// Options of every process in these tests. Durability none: page-cache coherence between
/// processes is what is tested, not power loss, and skipping fdatasync keeps the suite fast.
inline Options cache_options(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = "multiprocess-test";
  o.durability = Durability::none;
  return o;
}

/// "" when `key` hits in `cache` with exactly bytes_for_key(key, size), else what is wrong.
inline std::string check_entry(WeightCache& cache, const std::string& key, std::size_t size) {
  const std::size_t off = cache.look_up(key);
  if (off == kNotFound) return "'" + key + "' misses";
  const void* p = cache.offset_to_addr(off);
  if (p == nullptr) return "'" + key + "': offset_to_addr returned NULL for a hit";
  const std::string want = bytes_for_key(key, size);
  if (std::memcmp(p, want.data(), size) != 0) return "'" + key + "': wrong bytes";
  return {};
}

// ---- key=value arguments and results ------------------------------------------------------------

using KeyValues = std::map<std::string, std::string>;

inline KeyValues parse_args(int argc, char** argv, int first) {
  KeyValues kv;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    if (eq != std::string::npos) kv[a.substr(0, eq)] = a.substr(eq + 1);
  }
  return kv;
}

inline std::string arg(const std::string& name, const std::string& value) { return name + "=" + value; }
inline std::string arg(const std::string& name, std::uint64_t value) { return name + "=" + std::to_string(value); }

/// Results a helper hands back: one "name=value" line each, written to a file the test names.
inline bool write_results(const std::string& path, const std::map<std::string, std::uint64_t>& r) {
  std::ofstream out(path, std::ios::trunc);
  for (const auto& [k, v] : r) out << k << "=" << v << "\n";
  return static_cast<bool>(out.flush());
}

inline std::map<std::string, std::uint64_t> read_results(const std::string& path) {
  std::map<std::string, std::uint64_t> r;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) r[line.substr(0, eq)] = std::strtoull(line.c_str() + eq + 1, nullptr, 10);
  }
  return r;
}

// ---- pipes ------------------------------------------------------------------------------------

/// Blocks until the other end writes a byte (returns true) or every writer closed it (false).
inline bool read_byte(int fd) {
  char c = 0;
  for (;;) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n == 1) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

inline bool write_byte(int fd) {
  const char c = 1;
  for (;;) {
    const ssize_t n = ::write(fd, &c, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

}  // namespace weightcache::test::mp
