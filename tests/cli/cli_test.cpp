// Runs the `weightcache` executable (path from WEIGHTCACHE_CLI_PATH) as a child process and
// checks exit codes and output. Good files come from the library's public API; damaged files are
// made by flipping or cutting bytes; ExecuTorch XPWC files are written here by hand.
#include "child_exit.hpp"
#include "format/format.hpp"
#include "xpwc_image.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
namespace wf = weightcache::format;
using weightcache::Options;
using weightcache::WeightCache;

// ---- the tool's JSON, parsed strictly: a document that is not valid JSON (or not valid UTF-8)
// does not parse -----------------------------------------------------------------------------
using Json = nlohmann::json;

std::optional<Json> parse_json(const std::string& s) {
  Json j = Json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// ---- files ------------------------------------------------------------------------------------
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void flip_byte(const std::string& path, std::uint64_t offset) {
  std::string b = read_file(path);
  ASSERT_LT(offset, b.size());
  b[offset] = static_cast<char>(b[offset] ^ 0x5A);
  write_file(path, b);
}

std::uint64_t inode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_ino;
}

std::string hex(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string out = "0x";
  for (unsigned char c : bytes) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string pattern(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<std::string> split_tabs(const std::string& l) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const auto t = l.find('\t', start);
    out.push_back(l.substr(start, t - start));
    if (t == std::string::npos) return out;
    start = t + 1;
  }
}

// The newest commit slot of a weightcache file, decoded with the library's own format code.
wf::CommitSlot newest_slot(const std::string& path, int* which = nullptr) {
  const std::string b = read_file(path);
  wf::DecodedHeader h;
  EXPECT_EQ(wf::decode_header({reinterpret_cast<const std::byte*>(b.data()), wf::kHeaderSize}, &h), wf::Problem::none);
  const int i = h.slot[1].sequence > h.slot[0].sequence ? 1 : 0;
  if (which) *which = i;
  return h.slot[i];
}

// ---- XPWC files (ExecuTorch's layout, written here byte by byte: tests/support) ---------------
using weightcache::test::make_xpwc;
using weightcache::test::put;
using weightcache::test::XpwcEntry;
using weightcache::test::XpwcFile;

const std::vector<XpwcEntry> kXpwcEntries = {
    {"conv1.weight", pattern(5000, 1), 7},
    {"fc.bias", pattern(100, 2), 7},
    {"fc.weight", pattern(12288, 3), 9},
};

// ---- the fixture ------------------------------------------------------------------------------
struct CliRun {
  int code = -1;
  bool exited = false;  // false: killed by a signal (a crash)
  std::string out, err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/wc-cli-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Runs the tool; with `address_limit`, under that address-space limit (RLIMIT_AS, bytes).
  CliRun run(const std::vector<std::string>& args, std::uint64_t address_limit = 0) {
    const std::string out_path = path(".stdout"), err_path = path(".stderr");
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (address_limit != 0) {
        struct rlimit lim {};
        lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(address_limit);
        if (::setrlimit(RLIMIT_AS, &lim) != 0)
          weightcache::test::child_exit(weightcache::test::kChildSetupFailed, "setrlimit(RLIMIT_AS)");
      }
      const int in = ::open("/dev/null", O_RDONLY);
      const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (in < 0 || out < 0 || err < 0) weightcache::test::child_exit(weightcache::test::kChildExecFailed, "redirect");
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<char*> argv;
#ifdef WEIGHTCACHE_TEST_EMULATOR
      argv.push_back(const_cast<char*>(WEIGHTCACHE_TEST_EMULATOR));  // see tests/support/spawn.hpp
#endif
      argv.push_back(const_cast<char*>(WEIGHTCACHE_CLI_PATH));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv.front(), argv.data());
      weightcache::test::child_exit(weightcache::test::kChildExecFailed, "exec");
    }
    CliRun r;
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    r.exited = WIFEXITED(status);
    r.code = r.exited ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_file(out_path);
    r.err = read_file(err_path);
    ::unlink(out_path.c_str());
    ::unlink(err_path.c_str());
    return r;
  }

  Options options(const std::string& file, const std::string& compat = "model-a|packer-1",
                  std::size_t alignment = 64) const {
    Options o;
    o.path = file;
    o.compat_key = compat;
    o.alignment = alignment;
    o.backing = weightcache::Backing::file;
    o.durability = weightcache::Durability::none;  // tests do not need power-loss durability
    return o;
  }

  // Inserts the entries through the public API and finalizes; returns each key's offset.
  std::map<std::string, std::uint64_t> make_cache(const std::string& file,
                                                  const std::vector<std::pair<std::string, std::string>>& entries,
                                                  const std::string& compat = "model-a|packer-1",
                                                  std::size_t alignment = 64) {
    std::map<std::string, std::uint64_t> offsets;
    auto c = WeightCache::open(options(file, compat, alignment));
    if (!c) {
      ADD_FAILURE() << "open: " << c.error().message;
      return offsets;
    }
    for (const auto& [k, v] : entries) {
      const std::size_t off = c->insert(k, v);
      EXPECT_NE(off, weightcache::kNotFound) << k;
      offsets[k] = off;
    }
    auto f = c->finalize();
    EXPECT_TRUE(f.ok()) << f.error().message;
    return offsets;
  }

  // True when the library, opening `file` afresh and verifying every entry, serves `expected`.
  ::testing::AssertionResult library_serves(const std::string& file, const std::map<std::string, std::string>& expected,
                                            const std::string& compat = "model-a|packer-1",
                                            std::size_t alignment = 64) {
    Options o = options(file, compat, alignment);
    o.read_only = true;
    o.verify = weightcache::Verify::on_open;
    auto c = WeightCache::open(o);
    if (!c) return ::testing::AssertionFailure() << "open: " << c.error().message;
    const auto s = c->stats();
    if (s.entries != expected.size())
      return ::testing::AssertionFailure() << s.entries << " entries, expected " << expected.size();
    if (s.verify_failures != 0) return ::testing::AssertionFailure() << s.verify_failures << " verify failures";
    for (const auto& [k, v] : expected) {
      const std::size_t off = c->look_up(k);
      if (off == weightcache::kNotFound) return ::testing::AssertionFailure() << "missing " << k;
      const void* p = c->offset_to_addr(off);
      if (p == nullptr || std::memcmp(p, v.data(), v.size()) != 0)
        return ::testing::AssertionFailure() << "bytes of " << k << " differ";
    }
    return ::testing::AssertionSuccess();
  }

  // Files in the temp dir other than the cache and its lock: leftovers of a rewrite.
  std::vector<std::string> strays(const std::string& keep) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string n = e.path().filename().string();
      if (n != keep && n != keep + ".lock" && n[0] != '.') out.push_back(n);
    }
    return out;
  }

  // `info --json FILE`, parsed; nullopt (with a failure) unless it succeeds with valid JSON.
  std::optional<Json> info_json(const std::string& file) {
    const CliRun r = run({"info", "--json", file});
    EXPECT_EQ(r.code, 0) << r.err;
    auto j = parse_json(r.out);
    EXPECT_TRUE(j) << r.out;
    return r.code == 0 ? j : std::nullopt;
  }

  // Why the tool cannot be run under an address-space limit of `limit` bytes here (nullopt: it
  // can). The limit must be enforced (a child maps twice as much) and the tool must start under
  // it: a sanitizer build reserves terabytes of shadow memory before main.
  std::optional<std::string> address_limit_unusable(std::uint64_t limit) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      struct rlimit lim {};
      lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(limit);
      if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(2);
      void* p = ::mmap(nullptr, 2 * limit, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      ::_exit(p == MAP_FAILED ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return "cannot probe RLIMIT_AS";
    if (WEXITSTATUS(status) == 2) return "setrlimit(RLIMIT_AS) fails here";
    if (WEXITSTATUS(status) == 1) return "RLIMIT_AS is not enforced here";
    const CliRun r = run({"--version"}, limit);
    if (r.code != 0)
      return "the tool does not start under an address-space limit of " + std::to_string(limit >> 20) +
             " MiB (exit " + std::to_string(r.code) + "; a sanitizer build reserves its shadow memory first): " + r.err;
    return std::nullopt;
  }

  std::map<std::string, std::string> info_fields(const std::string& file, std::uint64_t address_limit = 0) {
    std::map<std::string, std::string> f;
    const CliRun r = run({"info", file}, address_limit);
    EXPECT_EQ(r.code, 0) << r.err;
    for (const auto& l : lines_of(r.out)) {
      const auto colon = l.find(':');
      if (colon == std::string::npos) continue;
      const auto v = l.find_first_not_of(' ', colon + 1);
      f[l.substr(0, colon)] = v == std::string::npos ? "" : l.substr(v);
    }
    return f;
  }

  std::string dir_;
};

const std::vector<std::pair<std::string, std::string>> kEntries = {
    {"layer1.weight", pattern(4096, 11)},
    {"layer1.bias", pattern(256, 12)},
    {std::string("bin\0\xff key", 9), pattern(640, 13)},  // not printable: shown in hex
    {"0xdead", pattern(128, 14)},                           // looks like hex: shown in hex
    {"quote\"back\\slash", pattern(192, 15)},               // needs JSON escaping
};

std::map<std::string, std::string> as_map(const std::vector<std::pair<std::string, std::string>>& v) {
  return {v.begin(), v.end()};
}

std::uint64_t expected_dead(std::uint64_t file_size, const std::map<std::string, std::string>& live) {
  std::uint64_t used = wf::kHeaderSize + wf::kIndexHeaderSize + wf::kFooterSize;
  for (const auto& [k, v] : live) used += wf::kRecordFixedSize + k.size() + v.size();
  return file_size - used;
}

// ---- usage ------------------------------------------------------------------------------------
TEST_F(CliTest, HelpListsEveryCommandAndTheExitCodes) {
  const CliRun r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* c : {"info", "ls", "verify", "cat", "compact", "convert", "gc", "exit codes", "busy"})
    EXPECT_NE(r.out.find(c), std::string::npos) << c;
  for (const char* c : {"info", "ls", "verify", "cat", "compact", "convert", "gc"}) {
    const CliRun h = run({c, "--help"});
    EXPECT_EQ(h.code, 0) << c;
    EXPECT_NE(h.out.find(std::string("usage: weightcache ") + c), std::string::npos) << c;
    EXPECT_NE(h.out.find("exit codes"), std::string::npos) << c;
  }
  const CliRun v = run({"--version"});
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.out.find(wc_version()), std::string::npos);
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  const std::string f = path("c.wcache");
  make_cache(f, kEntries);
  EXPECT_EQ(run({}).code, 2);
  EXPECT_EQ(run({"frobnicate", f}).code, 2);
  EXPECT_EQ(run({"info"}).code, 2);
  EXPECT_EQ(run({"info", f, f}).code, 2);
  EXPECT_EQ(run({"info", "--bogus", f}).code, 2);
  EXPECT_EQ(run({"cat", f}).code, 2);
  EXPECT_EQ(run({"cat", f, "0xabc"}).code, 2);  // odd number of hex digits
  EXPECT_EQ(run({"cat", f, "0xzz"}).code, 2);
  EXPECT_EQ(run({"convert", "--alignment", "48", f, path("o")}).code, 2);
  EXPECT_EQ(run({"convert", f}).code, 2);
  EXPECT_EQ(run({"compact", "--compat-key"}).code, 2);
  const CliRun r = run({"ls", "--json", "--frob", f});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--frob"), std::string::npos);
}

TEST_F(CliTest, MissingFileExitsThree) {
  const std::string f = path("absent.wcache");
  for (auto args : std::vector<std::vector<std::string>>{
           {"info", f}, {"ls", f}, {"verify", f}, {"cat", f, "k"}, {"compact", f}, {"convert", f, path("out")}}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 3) << args[0] << ": " << r.err;
    EXPECT_FALSE(r.err.empty()) << args[0];
  }
  EXPECT_FALSE(fs::exists(f + ".lock"));  // compact did not create a lock for a missing file
}

// ---- info -------------------------------------------------------------------------------------
TEST_F(CliTest, InfoReportsALibraryFile) {
  const std::string f = path("c.wcache");
  make_cache(f, kEntries);
  const auto size = fs::file_size(f);
  const auto info = info_fields(f);
  EXPECT_EQ(info.at("format"), "weightcache, format version 1");
  EXPECT_EQ(info.at("compat key hash"), hex64(wf::hash_bytes("model-a|packer-1")));
  EXPECT_EQ(info.at("alignment"), "64");
  EXPECT_EQ(info.at("entries"), "5");
  std::uint64_t payload = 0;
  for (const auto& [k, v] : kEntries) payload += v.size();
  EXPECT_EQ(info.at("payload bytes"), std::to_string(payload));
  EXPECT_EQ(info.at("file bytes"), std::to_string(size));
  // A fresh file: the empty first index (created with the file) plus padding to the first entry.
  const std::uint64_t dead = expected_dead(size, as_map(kEntries));
  EXPECT_EQ(info.at("dead bytes"), std::to_string(dead));
  EXPECT_GT(dead, 0u);
  EXPECT_EQ(info.count("problems"), 0u);
  // The library's own count agrees (no zero-size entries, size_alignment 1, no tail).
  auto c = WeightCache::open(options(f));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->stats().dead_bytes, dead);
}

TEST_F(CliTest, InfoJsonIsWellFormed) {
  const std::string f = path("we\"ird\\name.wcache");
  make_cache(f, kEntries);
  const auto j = info_json(f);
  ASSERT_TRUE(j);
  EXPECT_EQ((*j)["file"].get<std::string>(), f);
  EXPECT_EQ((*j)["format"].get<std::string>(), "weightcache");
  EXPECT_EQ((*j)["version"].get<std::uint64_t>(), 1u);
  EXPECT_EQ((*j)["compat_hash"].get<std::string>(), hex64(wf::hash_bytes("model-a|packer-1")));
  EXPECT_EQ((*j)["alignment"].get<std::uint64_t>(), 64u);
  EXPECT_EQ((*j)["entries"].get<std::uint64_t>(), 5u);
  EXPECT_EQ((*j)["file_bytes"].get<std::uint64_t>(), fs::file_size(f));
  EXPECT_EQ((*j)["dead_bytes"].get<std::uint64_t>(), expected_dead(fs::file_size(f), as_map(kEntries)));
  EXPECT_EQ((*j)["problems"].get<std::uint64_t>(), 0u);
}

// A file name is whatever bytes the filesystem holds. --json still prints valid JSON (UTF-8):
// each byte that is not UTF-8 becomes U+FFFD; valid UTF-8 passes through unchanged.
TEST_F(CliTest, JsonStaysValidForANameThatIsNotUtf8) {
  const std::string f = path("caf\xc3\xa9-\xff\xfe-\xc3.wcache");
  make_cache(f, kEntries);
  const auto j = info_json(f);
  ASSERT_TRUE(j);
  const std::string replacement = "\xef\xbf\xbd";
  EXPECT_EQ((*j)["file"].get<std::string>(),
            path("caf\xc3\xa9-" + replacement + replacement + "-" + replacement + ".wcache"));
  EXPECT_EQ((*j)["entries"].get<std::uint64_t>(), 5u);
}

// ---- ls ---------------------------------------------------------------------------------------
TEST_F(CliTest, LsListsEveryEntry) {
  const std::string f = path("c.wcache");
  const auto offsets = make_cache(f, kEntries);
  const CliRun r = run({"ls", f});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), kEntries.size());
  std::map<std::string, std::vector<std::string>> by_key;
  for (const auto& l : lines) {
    const auto cols = split_tabs(l);
    ASSERT_EQ(cols.size(), 4u) << l;
    by_key[cols[0]] = cols;
  }
  for (const auto& [k, v] : kEntries) {
    const bool printable = std::all_of(k.begin(), k.end(), [](char c) { return c >= 0x20 && c <= 0x7E; }) &&
                           k.rfind("0x", 0) != 0;
    const std::string shown = printable ? k : hex(k);
    ASSERT_EQ(by_key.count(shown), 1u) << shown;
    const auto& cols = by_key[shown];
    EXPECT_EQ(cols[1], std::to_string(offsets.at(k))) << shown;
    EXPECT_EQ(cols[2], std::to_string(v.size())) << shown;
    EXPECT_EQ(cols[3], hex64(wf::hash_bytes(v))) << shown;
  }
  EXPECT_EQ(by_key.count(hex("0xdead")), 1u);  // "0xdead" itself is shown in hex
}

TEST_F(CliTest, LsJsonEscapesKeys) {
  const std::string f = path("c.wcache");
  const auto offsets = make_cache(f, kEntries);
  const CliRun r = run({"ls", "--json", f});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = parse_json(r.out);
  ASSERT_TRUE(j) << r.out;
  const Json& entries = (*j)["entries"];
  ASSERT_TRUE(entries.is_array());
  ASSERT_EQ(entries.size(), kEntries.size());
  std::map<std::string, const Json*> by_key;
  for (const auto& e : entries) by_key[e["key"].get<std::string>()] = &e;
  ASSERT_EQ(by_key.count("quote\"back\\slash"), 1u);  // escaped in JSON, decoded back intact
  ASSERT_EQ(by_key.count(hex(kEntries[2].first)), 1u);
  EXPECT_EQ((*by_key["layer1.bias"])["offset"].get<std::uint64_t>(), offsets.at("layer1.bias"));
  EXPECT_EQ((*by_key["layer1.bias"])["size"].get<std::uint64_t>(), 256u);
  EXPECT_EQ((*by_key["layer1.bias"])["checksum"].get<std::string>(), hex64(wf::hash_bytes(kEntries[1].second)));
}

// ---- verify -----------------------------------------------------------------------------------
TEST_F(CliTest, VerifyPassesAGoodFile) {
  const std::string f = path("c.wcache");
  make_cache(f, kEntries);
  const CliRun r = run({"verify", f});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("OK"), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << r.err;  // stderr is not a terminal: no progress line
  const CliRun j = run({"verify", "--json", f});
  EXPECT_EQ(j.code, 0);
  const auto v = parse_json(j.out);
  ASSERT_TRUE(v) << j.out;
  EXPECT_TRUE((*v)["ok"].get<bool>());
  EXPECT_EQ((*v)["entries"].get<std::uint64_t>(), kEntries.size());
  EXPECT_TRUE((*v)["problems"].empty());
}

TEST_F(CliTest, VerifyNamesAnEntryWithAFlippedDataBit) {
  const std::string f = path("c.wcache");
  const auto offsets = make_cache(f, kEntries);
  flip_byte(f, offsets.at("layer1.weight") + 1000);
  const CliRun r = run({"verify", f});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("'layer1.weight'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checksum"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("layer1.bias"), std::string::npos) << r.out;  // only the damaged entry

  const CliRun j = run({"verify", "--json", f});
  EXPECT_EQ(j.code, 1);
  const auto v = parse_json(j.out);
  ASSERT_TRUE(v) << j.out;
  EXPECT_FALSE((*v)["ok"].get<bool>());
  ASSERT_EQ((*v)["problems"].size(), 1u);
  EXPECT_EQ((*v)["problems"][0]["kind"].get<std::string>(), "entry_checksum");
  EXPECT_EQ((*v)["problems"][0]["key"].get<std::string>(), "layer1.weight");

  // cat refuses the damaged entry, writing nothing, and still serves the others.
  const CliRun bad = run({"cat", f, "layer1.weight"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(bad.out.empty());
  const CliRun good = run({"cat", f, "layer1.bias"});
  EXPECT_EQ(good.code, 0);
  EXPECT_EQ(good.out, kEntries[1].second);
}

TEST_F(CliTest, VerifyReportsABrokenNewestIndex) {
  const std::string f = path("c.wcache");
  make_cache(f, kEntries);
  const auto s = newest_slot(f);
  flip_byte(f, s.index_offset + wf::kIndexHeaderSize + 40);  // inside the records
  const CliRun r = run({"verify", f});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("index"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sequence " + std::to_string(s.sequence)), std::string::npos) << r.out;
  // Readers fall back to the previous (empty) commit; info says so.
  const auto info = info_fields(f);
  EXPECT_NE(info.at("commit").find("newest commit is damaged"), std::string::npos);
  EXPECT_EQ(info.at("entries"), "0");
  EXPECT_EQ(info.count("problems"), 1u);
  // compact refuses: it would throw away what the damaged commit still holds.
  EXPECT_EQ(run({"compact", f}).code, 1);
}

TEST_F(CliTest, VerifyDiagnosesAFileWithNoValidIndex) {
  const std::string f = path("c.wcache");
  const auto offsets = make_cache(f, kEntries);
  int newest = 0;
  const auto s = newest_slot(f, &newest);
  flip_byte(f, s.index_offset + wf::kIndexHeaderSize + 8);  // offset field of the first record
  flip_byte(f, wf::kSlotOffset[1 - newest] + 3);            // and the older slot's checksum
  flip_byte(f, offsets.at("layer1.bias") + 7);              // and one entry's data
  const CliRun r = run({"verify", f});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(r.exited);
  EXPECT_NE(r.out.find("commit slot " + std::to_string(1 - newest)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no commit slot points at a valid index"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checksum in its commit slot"), std::string::npos) << r.out;
  // The records still parse, so the data check still runs and finds the damaged entry.
  EXPECT_NE(r.out.find("'layer1.bias'"), std::string::npos) << r.out;
  EXPECT_EQ(run({"info", f}).code, 3);
  EXPECT_EQ(run({"ls", f}).code, 3);
  EXPECT_EQ(run({"cat", f, "layer1.bias"}).code, 3);
}

TEST_F(CliTest, VerifyReportsADamagedHeader) {
  const std::string f = path("c.wcache");
  make_cache(f, kEntries);
  flip_byte(f, 30);  // inside the fixed header
  const CliRun r = run({"verify", f});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("header"), std::string::npos) << r.out;
  const std::string g = path("g.wcache");
  make_cache(g, kEntries);
  flip_byte(g, 0);  // the magic: the footer still identifies the file
  const CliRun m = run({"verify", g});
  EXPECT_EQ(m.code, 1);
  EXPECT_NE(m.out.find("header"), std::string::npos) << m.out;
  EXPECT_EQ(run({"info", g}).code, 3);
}

TEST_F(CliTest, TruncatedFilesNeverCrashTheTool) {
  const std::string good = path("good.wcache");
  const auto offsets = make_cache(good, kEntries);
  const std::string bytes = read_file(good);
  const std::uint64_t size = bytes.size();
  const std::vector<std::uint64_t> cuts = {0,    5,    19,   100, 4095, 4096, 4100, offsets.at("layer1.weight") + 10,
                                           size - 60, size - 21, size - 20, size - 1};
  for (const std::uint64_t cut : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    const std::string f = path("t.wcache");
    write_file(f, bytes.substr(0, cut));
    for (auto args : std::vector<std::vector<std::string>>{
             {"info", f}, {"ls", f}, {"verify", f}, {"cat", f, "layer1.weight"}, {"compact", f}}) {
      const CliRun r = run(args);
      EXPECT_TRUE(r.exited) << args[0] << " crashed with signal " << r.code - 128;
      EXPECT_LT(r.code, 6) << args[0];
      if (args[0] != "info" && args[0] != "ls") {
        EXPECT_NE(r.code, 0) << args[0] << ": " << r.out;
      }
    }
    EXPECT_EQ(read_file(f), bytes.substr(0, cut)) << "compact must not touch a damaged file";
  }
}

// ---- cat --------------------------------------------------------------------------------------
TEST_F(CliTest, CatWritesAnEntrysBytes) {
  const std::string f = path("c.wcache");
  auto entries = kEntries;
  entries.emplace_back("big", pattern((9u << 20) + 123, 99));  // larger than the tool's read chunk
  make_cache(f, entries);
  for (const auto& [k, v] : entries) {
    const std::string arg = k.find('\0') != std::string::npos || k.rfind("0x", 0) == 0 ? hex(k) : k;
    const CliRun r = run({"cat", f, arg});
    EXPECT_EQ(r.code, 0) << arg << ": " << r.err;
    EXPECT_TRUE(r.out == v) << arg;
  }
  // Upper-case hex works too; a key starting with '-' after "--".
  std::string upper = hex("layer1.bias");
  std::transform(upper.begin() + 2, upper.end(), upper.begin() + 2, ::toupper);
  EXPECT_EQ(run({"cat", f, upper}).out, kEntries[1].second);
  const CliRun missing = run({"cat", f, "--", "-nope"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(missing.out.empty());
  EXPECT_NE(missing.err.find("-nope"), std::string::npos);
  EXPECT_EQ(run({"verify", f}).code, 0);
}

// ---- ExecuTorch XPWC files ---------------------------------------------------------------------
TEST_F(CliTest, ReadsAndConvertsXpwcVersion1) {
  std::vector<XpwcEntry> entries = kXpwcEntries;
  const XpwcFile x = make_xpwc(1, entries, false, 52);
  const std::string in = path("v1.xnn");
  write_file(in, x.image);

  const auto info = info_fields(in);
  EXPECT_EQ(info.at("format"), "ExecuTorch XPWC, version 1, little-endian");
  EXPECT_EQ(info.at("entries"), "3");
  std::uint64_t payload = 0, index = 0;
  for (const auto& e : entries) {
    payload += e.bytes.size();
    index += 20 + e.name.size();
  }
  EXPECT_EQ(info.at("payload bytes"), std::to_string(payload));
  EXPECT_EQ(info.at("file bytes"), std::to_string(x.image.size()));
  EXPECT_EQ(info.at("dead bytes"), std::to_string(x.image.size() - payload - index - 20));

  const CliRun ls = run({"ls", in});
  ASSERT_EQ(ls.code, 0) << ls.err;
  const auto lines = lines_of(ls.out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "conv1.weight\t0\t5000\t-");
  EXPECT_EQ(lines[2], "fc.weight\t" + std::to_string(x.offsets[2]) + "\t12288\t-");

  const CliRun v = run({"verify", in});
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("no checksums"), std::string::npos);
  EXPECT_EQ(run({"cat", in, "fc.bias"}).out, entries[1].bytes);

  const std::string out = path("v1.wcache");
  const CliRun c = run({"convert", in, out});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_TRUE(library_serves(out, {{"conv1.weight", entries[0].bytes}, {"fc.bias", entries[1].bytes},
                                   {"fc.weight", entries[2].bytes}},
                             ""));
  EXPECT_EQ(run({"verify", out}).code, 0);
  EXPECT_EQ(info_fields(out).at("dead bytes"),
            std::to_string(expected_dead(fs::file_size(out), {{"conv1.weight", entries[0].bytes},
                                                              {"fc.bias", entries[1].bytes},
                                                              {"fc.weight", entries[2].bytes}})));
  EXPECT_TRUE(strays("v1.wcache").size() == 1u);  // only the input file is left besides OUT
}

TEST_F(CliTest, ReadsAndConvertsXpwcVersion2WithSeeds) {
  const XpwcFile x = make_xpwc(2, kXpwcEntries);
  const std::string in = path("v2.xnn");
  write_file(in, x.image);
  EXPECT_EQ(info_fields(in).at("format"), "ExecuTorch XPWC, version 2, little-endian");

  const CliRun ls = run({"ls", "--json", in});
  ASSERT_EQ(ls.code, 0) << ls.err;
  const auto j = parse_json(ls.out);
  ASSERT_TRUE(j) << ls.out;
  ASSERT_EQ((*j)["entries"].size(), 3u);
  const Json& e0 = (*j)["entries"][0];
  EXPECT_EQ(e0["key"].get<std::string>(), "conv1.weight#seed=7");
  EXPECT_EQ(e0["name"].get<std::string>(), "conv1.weight");
  EXPECT_EQ(e0["seed"].get<std::uint64_t>(), 7u);
  EXPECT_TRUE(e0["checksum"].is_null());

  const CliRun v = run({"verify", "--json", in});
  EXPECT_EQ(v.code, 0);
  ASSERT_TRUE(parse_json(v.out)) << v.out;

  const std::string out = path("v2.wcache");
  const CliRun c = run({"convert", "--compat-key", "xnn|v2", "--alignment", "4096", in, out});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::map<std::string, std::string> expected = {{"conv1.weight#seed=7", kXpwcEntries[0].bytes},
                                                       {"fc.bias#seed=7", kXpwcEntries[1].bytes},
                                                       {"fc.weight#seed=9", kXpwcEntries[2].bytes}};
  EXPECT_TRUE(library_serves(out, expected, "xnn|v2", 4096));
  const auto info = info_fields(out);
  EXPECT_EQ(info.at("alignment"), "4096");
  EXPECT_EQ(info.at("compat key hash"), hex64(wf::hash_bytes("xnn|v2")));
  for (const auto& l : lines_of(run({"ls", out}).out)) EXPECT_EQ(std::stoull(split_tabs(l)[1]) % 4096, 0u) << l;
}

// An unnamed entry cannot be a key, in either version: version 2 would otherwise make it
// "#seed=N", a key no ExecuTorch name maps to (and two unnamed entries with one seed collide).
TEST_F(CliTest, ConvertRefusesAnEntryWithAnEmptyName) {
  for (std::uint32_t version : {1u, 2u}) {
    SCOPED_TRACE("XPWC version " + std::to_string(version));
    std::vector<XpwcEntry> entries = kXpwcEntries;
    entries[1].name.clear();
    entries[1].seed = 1;
    const std::string in = path("unnamed" + std::to_string(version) + ".xnn");
    write_file(in, make_xpwc(version, entries).image);
    const std::string out = path("unnamed" + std::to_string(version) + ".wcache");
    const CliRun c = run({"convert", in, out});
    EXPECT_EQ(c.code, 1) << c.out << c.err;
    EXPECT_NE(c.err.find("empty name"), std::string::npos) << c.err;
    EXPECT_NE(c.err.find("entry 1 "), std::string::npos) << c.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

TEST_F(CliTest, ReadsByteSwappedXpwc) {
  const XpwcFile x = make_xpwc(2, kXpwcEntries, true);
  const std::string in = path("be.xnn");
  write_file(in, x.image);
  const auto info = info_fields(in);
  EXPECT_NE(info.at("format").find("big-endian (byte-swapped"), std::string::npos) << info.at("format");
  EXPECT_EQ(info.at("entries"), "3");
  const CliRun ls = run({"ls", in});
  EXPECT_EQ(lines_of(ls.out).at(1), "fc.bias#seed=7\t" + std::to_string(x.offsets[1]) + "\t100\t-");
  EXPECT_EQ(run({"verify", in}).code, 0);
  const std::string out = path("be.wcache");
  ASSERT_EQ(run({"convert", in, out}).code, 0);
  EXPECT_TRUE(library_serves(out, {{"conv1.weight#seed=7", kXpwcEntries[0].bytes},
                                   {"fc.bias#seed=7", kXpwcEntries[1].bytes},
                                   {"fc.weight#seed=9", kXpwcEntries[2].bytes}},
                             ""));
}

TEST_F(CliTest, VerifyFindsBrokenXpwcFiles) {
  {  // an entry pointing past the index
    XpwcFile x = make_xpwc(1, kXpwcEntries);
    std::string img = x.image;
    // data_size of fc.bias: after name_len(4) + name of the first record, then the second record.
    const std::size_t rec1 = x.index_start + 4 + kXpwcEntries[0].name.size() + 16;
    const std::size_t size_at = rec1 + 4 + kXpwcEntries[1].name.size() + 8;
    img[size_at + 3] = 0x7F;
    const std::string f = path("oob.xnn");
    write_file(f, img);
    const CliRun r = run({"verify", f});
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("'fc.bias'"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("outside"), std::string::npos) << r.out;
    EXPECT_EQ(run({"convert", f, path("oob.wcache")}).code, 1);
    EXPECT_FALSE(fs::exists(path("oob.wcache")));
  }
  {  // the footer counts more entries than the index holds
    XpwcFile x = make_xpwc(2, kXpwcEntries);
    std::string img = x.image;
    img[img.size() - 12] = 9;
    const std::string f = path("count.xnn");
    write_file(f, img);
    const CliRun r = run({"verify", f});
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("cut off"), std::string::npos) << r.out;
    EXPECT_EQ(run({"ls", f}).code, 3);
  }
  {  // an unknown version
    XpwcFile x = make_xpwc(2, kXpwcEntries);
    std::string img = x.image;
    img[img.size() - 4] = 3;
    const std::string f = path("v3.xnn");
    write_file(f, img);
    const CliRun r = run({"verify", f});
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("version 3"), std::string::npos) << r.out;
  }
  {  // neither format
    const std::string f = path("junk.bin");
    write_file(f, pattern(10000, 5));
    EXPECT_EQ(run({"verify", f}).code, 1);
    EXPECT_EQ(run({"info", f}).code, 3);
    EXPECT_EQ(run({"convert", f, path("junk.wcache")}).code, 3);
  }
}

// ---- hostile files: what reading them may cost -------------------------------------------------
// How many problems of one kind verify describes before it counts them (docs/CLI.md).
constexpr std::size_t kListedPerKind = 100;

// A weightcache file of one header page whose only commit names a 1 GiB index (the format's
// largest) behind it, all hole: a few KiB on disk. Returns why it could not be made, or "".
std::string write_sparse_index_claim(const std::string& file) {
  wf::HeaderFixed fixed;
  fixed.alignment = 64;
  fixed.size_alignment = 1;
  wf::CommitSlot s;
  s.sequence = 1;
  s.index_offset = wf::kHeaderSize;
  s.index_size = wf::kMaxIndexSize;
  s.committed_size = s.index_offset + s.index_size + wf::kFooterSize;
  s.index_checksum = 1;  // not what a hole hashes to
  const auto h = wf::encode_header(fixed, {}, s);
  write_file(file, std::string(reinterpret_cast<const char*>(h.data()), h.size()));
  std::error_code ec;
  fs::resize_file(file, s.committed_size, ec);
  return ec ? ec.message() : std::string();
}

// An ExecuTorch XPWC file of `records` version 2 index records from offset 0, all hole but its
// footer: each record reads as an empty name with seed 0, at offset 0 and of size 0, so every one
// after the first is a duplicate key and overlaps the first. 24 bytes per record (96 MB for 4
// million). Returns why it could not be made, or "".
std::string write_sparse_xpwc(const std::string& file, std::uint32_t records) {
  std::string footer;
  put(&footer, 0, 8, false);  // index_start
  put(&footer, records, 4, false);
  put(&footer, 0x58505743, 4, false);
  put(&footer, 2, 4, false);
  write_file(file, "");
  std::error_code ec;
  fs::resize_file(file, std::uint64_t{records} * 24, ec);
  if (ec) return ec.message();
  std::ofstream out(file, std::ios::binary | std::ios::app);
  out.write(footer.data(), static_cast<std::streamsize>(footer.size()));
  return out ? std::string() : "cannot write the footer";
}

// Each problem listed by `verify --json`, counted by kind; `unlisted` gets what the closing
// finding of each kind says was left out.
std::map<std::string, std::uint64_t> listed_by_kind(const Json& verify, std::map<std::string, std::uint64_t>* unlisted) {
  std::map<std::string, std::uint64_t> listed;
  for (const Json& p : verify["problems"]) {
    const std::string kind = p["kind"].get<std::string>();
    if (p.contains("unlisted")) (*unlisted)[kind] += p["unlisted"].get<std::uint64_t>();
    else ++listed[kind];
  }
  return listed;
}

// Few damaged things of a kind are each described; many are described up to the limit and the
// rest counted in one more finding of that kind. A real (not sparse) XPWC file of 250 entries on
// one spot, and a weightcache file whose 150 entries all fail their checksum.
TEST_F(CliTest, VerifyDescribesAHundredProblemsOfAKindAndCountsTheRest) {
  {
    constexpr std::uint32_t kRecords = 250;
    std::string img = std::string(64, 'x');
    const std::uint64_t index_start = img.size();
    for (std::uint32_t i = 0; i < kRecords; ++i) {
      put(&img, 1, 4, false);
      img += "w";
      put(&img, 0, 8, false);
      put(&img, 64, 8, false);
    }
    put(&img, index_start, 8, false);
    put(&img, kRecords, 4, false);
    put(&img, 0x58505743, 4, false);
    put(&img, 1, 4, false);
    const std::string f = path("crowded.xnn");
    write_file(f, img);
    const CliRun v = run({"verify", f});
    EXPECT_EQ(v.code, 1) << v.err;
    const auto lines = lines_of(v.out);
    EXPECT_EQ(lines.size(), 2 * (kListedPerKind + 1) + 1) << v.out;
    const std::string more = std::to_string(kRecords - 1 - kListedPerKind) + " more problems of this kind";
    EXPECT_NE(v.out.find(f + ": " + more + " (duplicate_key)"), std::string::npos) << v.out;
    EXPECT_NE(v.out.find(f + ": " + more + " (entry_overlap)"), std::string::npos) << v.out;
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines.back(), f + ": " + std::to_string(2 * (kRecords - 1)) + " problems found");

    const CliRun vj = run({"verify", "--json", f});
    const auto j = parse_json(vj.out);
    ASSERT_TRUE(j) << vj.out;
    EXPECT_EQ((*j)["problem_count"].get<std::uint64_t>(), 2 * (kRecords - 1));
    std::map<std::string, std::uint64_t> unlisted;
    const std::map<std::string, std::uint64_t> listed = listed_by_kind(*j, &unlisted);
    EXPECT_EQ(listed, (std::map<std::string, std::uint64_t>{{"duplicate_key", kListedPerKind},
                                                            {"entry_overlap", kListedPerKind}}));
    EXPECT_EQ(unlisted, (std::map<std::string, std::uint64_t>{{"duplicate_key", kRecords - 1 - kListedPerKind},
                                                              {"entry_overlap", kRecords - 1 - kListedPerKind}}));
    EXPECT_NE(run({"info", f}).out.find("problems:        " + std::to_string(2 * (kRecords - 1)) + " "),
              std::string::npos);
  }
  {
    constexpr int kDamaged = 150;
    std::vector<std::pair<std::string, std::string>> entries;
    for (int i = 0; i < kDamaged; ++i) entries.emplace_back("w" + std::to_string(i), pattern(100, i));
    const std::string f = path("damaged.wcache");
    const auto offsets = make_cache(f, entries);
    std::string b = read_file(f);
    for (const auto& [k, at] : offsets) b[at] = static_cast<char>(b[at] ^ 1);
    write_file(f, b);
    const CliRun vj = run({"verify", "--json", f});
    EXPECT_EQ(vj.code, 1);
    const auto j = parse_json(vj.out);
    ASSERT_TRUE(j) << vj.out;
    EXPECT_EQ((*j)["problem_count"].get<std::uint64_t>(), static_cast<std::uint64_t>(kDamaged));
    std::map<std::string, std::uint64_t> unlisted;
    EXPECT_EQ(listed_by_kind(*j, &unlisted), (std::map<std::string, std::uint64_t>{{"entry_checksum", kListedPerKind}}));
    EXPECT_EQ(unlisted, (std::map<std::string, std::uint64_t>{{"entry_checksum", kDamaged - kListedPerKind}}));
  }
}

// A commit slot naming a 1 GiB index in a sparse file of a few KiB, and a sparse 96 MB XPWC file
// whose index is 4 million records on one spot: `verify` and `info` read both under an
// address-space limit of 512 MiB, exit as docs/CLI.md says, and list at most a hundred problems
// of a kind. (Unbounded, they took 1 GiB and 3.3 GB.)
TEST_F(CliTest, HostileFilesAreReadInBoundedMemory) {
  constexpr std::uint64_t kLimit = std::uint64_t{512} << 20;
  if (auto why = address_limit_unusable(kLimit)) {
    std::printf("skipped: %s\n", why->c_str());
    GTEST_SKIP() << *why;
  }
  const std::string wc = path("claims-1gib-index.wcache");
  if (const std::string why = write_sparse_index_claim(wc); !why.empty()) GTEST_SKIP() << "no sparse 1 GiB file: " << why;
  {
    const CliRun v = run({"verify", wc}, kLimit);
    EXPECT_EQ(v.code, 1) << v.out << v.err;
    EXPECT_NE(v.out.find("does not match the checksum in its commit slot"), std::string::npos) << v.out;
    EXPECT_NE(v.out.find("is not read further"), std::string::npos) << v.out;
    EXPECT_EQ(v.err, "");
    const CliRun i = run({"info", wc}, kLimit);
    EXPECT_EQ(i.code, 3) << i.err;
    EXPECT_NE(i.err.find("has no usable index"), std::string::npos) << i.err;
  }
  constexpr std::uint32_t kRecords = 4'000'000;
  constexpr std::uint64_t kRepeats = kRecords - 1;  // duplicate keys, and as many overlaps
  const std::string xp = path("overlapping.xnn");
  if (const std::string why = write_sparse_xpwc(xp, kRecords); !why.empty()) GTEST_SKIP() << "no sparse file: " << why;
  {
    const CliRun v = run({"verify", "--json", xp}, kLimit);
    EXPECT_EQ(v.code, 1) << v.err;
    const auto j = parse_json(v.out);
    ASSERT_TRUE(j) << v.out.substr(0, 2000);
    EXPECT_EQ((*j)["entries"].get<std::uint64_t>(), kRecords);
    EXPECT_EQ((*j)["problem_count"].get<std::uint64_t>(), 2 * kRepeats);
    std::map<std::string, std::uint64_t> unlisted;
    EXPECT_EQ(listed_by_kind(*j, &unlisted), (std::map<std::string, std::uint64_t>{{"duplicate_key", kListedPerKind},
                                                                                  {"entry_overlap", kListedPerKind}}));
    EXPECT_EQ(unlisted, (std::map<std::string, std::uint64_t>{{"duplicate_key", kRepeats - kListedPerKind},
                                                              {"entry_overlap", kRepeats - kListedPerKind}}));
  }
  {
    const CliRun v = run({"verify", xp}, kLimit);
    EXPECT_EQ(v.code, 1) << v.err;
    const auto lines = lines_of(v.out);
    EXPECT_EQ(lines.size(), 2 * (kListedPerKind + 1) + 1);
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines.back(), xp + ": " + std::to_string(2 * kRepeats) + " problems found");
  }
  const auto info = info_fields(xp, kLimit);
  EXPECT_EQ(info.count("entries") ? info.at("entries") : "", std::to_string(kRecords));
  EXPECT_EQ(info.count("problems") ? info.at("problems") : "",
            std::to_string(2 * kRepeats) + " (run 'weightcache verify' for details)");
}

// `ls --json` writes its document as it makes it: 400,000 entries list under an address-space
// limit of 128 MiB (as one JSON value they took some 700 bytes each), and the output is still one
// valid document.
TEST_F(CliTest, LsJsonListsAnIndexLargerThanMemoryWouldHoldAsOneDocument) {
  constexpr std::uint64_t kLimit = std::uint64_t{128} << 20;
  if (auto why = address_limit_unusable(kLimit)) {
    std::printf("skipped: %s\n", why->c_str());
    GTEST_SKIP() << *why;
  }
  constexpr std::uint32_t kRecords = 400'000;
  const std::string xp = path("many.xnn");
  if (const std::string why = write_sparse_xpwc(xp, kRecords); !why.empty()) GTEST_SKIP() << "no sparse file: " << why;
  const CliRun r = run({"ls", "--json", xp}, kLimit);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = parse_json(r.out);
  ASSERT_TRUE(j) << r.out.substr(0, 1000);
  EXPECT_EQ((*j)["file"].get<std::string>(), xp);
  EXPECT_EQ((*j)["format"].get<std::string>(), "xpwc");
  ASSERT_EQ((*j)["entries"].size(), kRecords);
  const Json& last = (*j)["entries"][kRecords - 1];
  EXPECT_EQ(last["key"].get<std::string>(), "#seed=0");
  EXPECT_EQ(last["seed"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(last["checksum"].is_null());
}

// Where memory truly runs out (that XPWC index's 4 million entries need more than 128 MiB), every
// command says so in the words docs/CLI.md gives and exits 5, never 3 ("cannot read") nor with an
// abort; convert leaves nothing behind.
TEST_F(CliTest, RunningOutOfMemoryExitsFive) {
  constexpr std::uint64_t kLimit = std::uint64_t{128} << 20;
  if (auto why = address_limit_unusable(kLimit)) {
    std::printf("skipped: %s\n", why->c_str());
    GTEST_SKIP() << *why;
  }
  const std::string xp = path("overlapping.xnn");
  if (const std::string why = write_sparse_xpwc(xp, 4'000'000); !why.empty()) GTEST_SKIP() << "no sparse file: " << why;
  const std::string out = path("out.wcache");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"verify", xp}, {"info", xp}, {"ls", xp}, {"cat", xp, "#seed=0"}, {"convert", xp, out}}) {
    SCOPED_TRACE(args[0]);
    const CliRun r = run(args, kLimit);
    EXPECT_EQ(r.code, 5) << r.err;
    EXPECT_EQ(r.err, "weightcache: out of memory\n");
  }
  EXPECT_EQ(strays("out.wcache"), std::vector<std::string>{"overlapping.xnn"});
}

TEST_F(CliTest, ConvertAndCompactRefuseTheWrongFormatOrAnExistingOutput) {
  const std::string w = path("c.wcache");
  make_cache(w, kEntries);
  const std::string x = path("v1.xnn");
  write_file(x, make_xpwc(1, kXpwcEntries).image);
  EXPECT_EQ(run({"convert", w, path("o.wcache")}).code, 2);
  EXPECT_EQ(run({"compact", x}).code, 2);
  const CliRun exists = run({"convert", x, w});
  EXPECT_EQ(exists.code, 2);
  EXPECT_NE(exists.err.find("--force"), std::string::npos);
  EXPECT_TRUE(library_serves(w, as_map(kEntries)));  // untouched
  EXPECT_EQ(run({"convert", "--force", x, w}).code, 0);
  EXPECT_TRUE(library_serves(w, {{"conv1.weight", kXpwcEntries[0].bytes},
                                 {"fc.bias", kXpwcEntries[1].bytes},
                                 {"fc.weight", kXpwcEntries[2].bytes}},
                             ""));
}

// convert replaces its output under the library's writer lease: a writer of that cache with an
// outstanding reservation holds it, so convert says busy and leaves the file alone.
TEST_F(CliTest, ConvertRefusesWhileALibraryWriterHoldsTheLease) {
  const std::string w = path("c.wcache");
  make_cache(w, kEntries);
  const std::string x = path("v1.xnn");
  write_file(x, make_xpwc(1, kXpwcEntries).image);
  const std::string before = read_file(w);
  {
    auto c = WeightCache::open(options(w));
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->reserve(1000), nullptr);
    const CliRun busy = run({"convert", "--force", x, w});
    EXPECT_EQ(busy.code, 4) << busy.err;
    EXPECT_NE(busy.err.find("busy"), std::string::npos) << busy.err;
    EXPECT_NE(busy.err.find(w + ".lock"), std::string::npos) << busy.err;
  }
  EXPECT_EQ(read_file(w), before);
  EXPECT_EQ(strays("c.wcache"), std::vector<std::string>{"v1.xnn"});  // no temporary left behind
  // Given back by the writer: convert goes ahead, and gives it back in turn.
  EXPECT_EQ(run({"convert", "--force", x, w}).code, 0);
  auto c = WeightCache::open(options(w, ""));  // convert's default compatibility key
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_NE(c->reserve(1000), nullptr) << "the lease stayed taken after convert";
}

// A writer process rewrites IN in place over and over, alternating two versions of its entries'
// bytes (same names, sizes and index: ExecuTorch rewriting its cache), while convert runs. Every
// run either refuses (exit 3, IN changed, no OUT and no temporary left) or writes an OUT that
// holds one version whole, never entries of both; and the race is seen, within a bounded number
// of runs.
TEST_F(CliTest, ConvertBesideAnInPlaceRewriteNeverMixesTwoVersions) {
  constexpr int kEntries = 8;
  constexpr std::size_t kEntrySize = std::size_t{2} << 20;  // 16 MiB in all
  constexpr int kRuns = 20;
  std::vector<XpwcEntry> versions[2];
  for (int v = 0; v < 2; ++v)
    for (int i = 0; i < kEntries; ++i)
      versions[v].push_back({"layer" + std::to_string(i), pattern(kEntrySize, static_cast<unsigned>(100 * v + i))});
  const std::string in = path("rewritten.xnn");
  const XpwcFile first = make_xpwc(1, versions[0]);
  write_file(in, first.image);
  ASSERT_EQ(make_xpwc(1, versions[1]).image.size(), first.image.size());

  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t writer = ::fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    // Only system calls from here: the test process may have threads.
    const int fd = ::open(in.c_str(), O_WRONLY);
    if (fd < 0) ::_exit(weightcache::test::kChildSetupFailed);
    for (unsigned pass = 1;; ++pass) {
      for (int i = 0; i < kEntries; ++i) {
        const std::string& b = versions[pass % 2][i].bytes;
        if (::pwrite(fd, b.data(), b.size(), static_cast<off_t>(first.offsets[i])) != static_cast<ssize_t>(b.size()))
          ::_exit(weightcache::test::kChildSetupFailed);
      }
      if (pass == 1 && ::write(ready[1], "r", 1) != 1) ::_exit(weightcache::test::kChildSetupFailed);
    }
  }
  ::close(ready[1]);
  char c = 0;
  const bool started = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);

  int refused = 0, converted = 0;
  for (int run_no = 0; started && run_no < kRuns && refused < 3; ++run_no) {
    const std::string out = path("out" + std::to_string(run_no) + ".wcache");
    const CliRun r = run({"convert", in, out});
    if (r.code == 3) {
      ++refused;
      EXPECT_NE(r.err.find("changed while it was being converted"), std::string::npos) << r.err;
      EXPECT_FALSE(fs::exists(out)) << "a refused conversion left " << out;
      continue;
    }
    ASSERT_EQ(r.code, 0) << r.err;
    ++converted;
    // One version whole: every entry of the first one, or every entry of the second.
    Options o = options(out, "");
    o.read_only = true;
    o.verify = weightcache::Verify::on_open;
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache.ok()) << cache.error().message;
    std::string held;
    for (int i = 0; i < kEntries; ++i) {
      const std::size_t off = cache->look_up("layer" + std::to_string(i));
      const void* p = off == weightcache::kNotFound ? nullptr : cache->offset_to_addr(off);
      char v = '-';
      for (int k = 0; k < 2; ++k)
        if (p != nullptr && std::memcmp(p, versions[k][i].bytes.data(), kEntrySize) == 0) v = static_cast<char>('1' + k);
      held += v;
    }
    EXPECT_TRUE(held == std::string(kEntries, '1') || held == std::string(kEntries, '2'))
        << "run " << run_no << ": OUT mixes two versions of IN (entry by entry: " << held << ")";
  }
  ::kill(writer, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(writer, &status, 0), writer);
  ASSERT_TRUE(started) << "the writer never finished its first pass (exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ")";
  EXPECT_GT(refused, 0) << "no conversion saw the rewrite in " << converted << " runs";
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
}

// ---- compact ----------------------------------------------------------------------------------
TEST_F(CliTest, CompactDropsAReplacedEntry) {
  const std::string f = path("c.wcache");
  // Sizes are multiples of the alignment, so a compacted file has no padding at all.
  std::map<std::string, std::string> live = {{"a", pattern(4096, 1)}, {"b", pattern(640, 2)}, {"c", pattern(64, 3)}};
  make_cache(f, {live.begin(), live.end()});
  {
    auto c = WeightCache::open(options(f));
    ASSERT_TRUE(c.ok());
    live["a"] = pattern(4096, 42);
    ASSERT_NE(c->insert("a", live["a"]), weightcache::kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  const auto before = fs::file_size(f);
  const auto dead_before = std::stoull(info_fields(f).at("dead bytes"));
  EXPECT_GE(dead_before, 4096u);  // the replaced 4 KiB at least

  const CliRun r = run({"compact", f});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  const auto info = info_fields(f);
  EXPECT_EQ(info.at("dead bytes"), "0");
  EXPECT_EQ(info.at("entries"), "3");
  EXPECT_EQ(info.at("compat key hash"), hex64(wf::hash_bytes("model-a|packer-1")));
  EXPECT_EQ(fs::file_size(f), before - dead_before);
  EXPECT_TRUE(library_serves(f, live));
  EXPECT_EQ(run({"verify", f}).code, 0);
  EXPECT_EQ(run({"cat", f, "a"}).out, live["a"]);
  EXPECT_TRUE(strays("c.wcache").empty());
}

TEST_F(CliTest, CompactDropsOldTrailersAfterTwoFinalizes) {
  const std::string f = path("c.wcache");
  std::map<std::string, std::string> live = {{"first", pattern(1024, 1)}};
  make_cache(f, {live.begin(), live.end()});
  {
    auto c = WeightCache::open(options(f));
    ASSERT_TRUE(c.ok());
    live["second"] = pattern(2048, 2);
    ASSERT_NE(c->insert("second", live["second"]), weightcache::kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  const auto dead_before = std::stoull(info_fields(f).at("dead bytes"));
  EXPECT_GT(dead_before, 0u);
  ASSERT_EQ(run({"compact", f}).code, 0);
  EXPECT_EQ(info_fields(f).at("dead bytes"), "0");
  EXPECT_TRUE(library_serves(f, live));

  // Nothing left to reclaim: the file is not rewritten.
  const auto inode = inode_of(f);
  const CliRun again = run({"compact", f});
  EXPECT_EQ(again.code, 0);
  EXPECT_NE(again.out.find("already compact"), std::string::npos) << again.out;
  EXPECT_EQ(inode_of(f), inode);
}

TEST_F(CliTest, CompactKeepsOddSizesAlignmentAndCompatKey) {
  const std::string f = path("c.wcache");
  std::map<std::string, std::string> live;
  std::vector<std::pair<std::string, std::string>> v;
  for (int i = 0; i < 6; ++i) v.emplace_back("w" + std::to_string(i), pattern(100 + 77 * i, i));
  make_cache(f, v, "key-b", 256);
  live = as_map(v);
  {
    auto c = WeightCache::open(options(f, "key-b", 256));
    ASSERT_TRUE(c.ok());
    live["w2"] = pattern(999, 77);
    ASSERT_NE(c->insert("w2", live["w2"]), weightcache::kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  EXPECT_EQ(run({"compact", "--compat-key", "wrong", f}).code, 2);
  const CliRun r = run({"compact", "--compat-key=key-b", f});  // the library verifies the result
  ASSERT_EQ(r.code, 0) << r.err;
  const auto info = info_fields(f);
  EXPECT_EQ(info.at("alignment"), "256");
  EXPECT_LT(std::stoull(info.at("dead bytes")), 6u * 256u);  // only padding is left
  EXPECT_TRUE(library_serves(f, live, "key-b", 256));
  for (const auto& l : lines_of(run({"ls", f}).out)) EXPECT_EQ(std::stoull(split_tabs(l)[1]) % 256, 0u) << l;
}

TEST_F(CliTest, CompactRefusesWhileTheLeaseIsHeld) {
  const std::string f = path("c.wcache");
  make_cache(f, kEntries);
  {
    auto c = WeightCache::open(options(f));
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->insert("extra", pattern(300, 9)), weightcache::kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  {
    auto c = WeightCache::open(options(f));
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->insert("layer1.bias", pattern(256, 99)), weightcache::kNotFound);  // replaces: dead bytes
    ASSERT_TRUE(c->finalize().ok());
  }
  const std::string before = read_file(f);

  // Someone else's flock on FILE.lock, through a descriptor of our own.
  const int fd = ::open((f + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const CliRun busy = run({"compact", f});
  EXPECT_EQ(busy.code, 4);
  EXPECT_NE(busy.err.find("lease"), std::string::npos) << busy.err;
  EXPECT_EQ(read_file(f), before);
  EXPECT_TRUE(strays("c.wcache").empty());
  ::close(fd);

  // A library writer with an outstanding reservation holds the lease too.
  {
    auto c = WeightCache::open(options(f));
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->reserve(1000), nullptr);
    EXPECT_EQ(run({"compact", f}).code, 4);
  }
  EXPECT_EQ(read_file(f), before);
  EXPECT_EQ(run({"compact", f}).code, 0);
  EXPECT_LT(fs::file_size(f), before.size());
}

TEST_F(CliTest, CompactRefusesWhileAnyProcessHasTheFileOpen) {
  const std::string f = path("c.wcache");
  make_cache(f, kEntries);
  {
    auto c = WeightCache::open(options(f));
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->insert("layer1.weight", pattern(4096, 55)), weightcache::kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  const std::string before = read_file(f);
  const auto inode = inode_of(f);
  {
    // A reader (no lease, nothing pending) still uses the file: it is never replaced under it.
    Options ro = options(f);
    ro.read_only = true;
    auto reader = WeightCache::open(ro);
    ASSERT_TRUE(reader.ok());
    const std::size_t off = reader->look_up("layer1.bias");
    ASSERT_NE(off, weightcache::kNotFound);
    const CliRun busy = run({"compact", f});
    EXPECT_EQ(busy.code, 4) << busy.err;
    EXPECT_NE(busy.err.find("in use"), std::string::npos) << busy.err;
    EXPECT_EQ(inode_of(f), inode);
    EXPECT_EQ(read_file(f), before);
    EXPECT_TRUE(strays("c.wcache").empty());
    EXPECT_EQ(std::memcmp(reader->offset_to_addr(off), kEntries[1].second.data(), kEntries[1].second.size()), 0);
  }
  ASSERT_EQ(run({"compact", f}).code, 0);
  EXPECT_NE(inode_of(f), inode);  // a new file took the name once nobody used the old one
  EXPECT_LT(fs::file_size(f), before.size());
}

TEST_F(CliTest, CompactRefusesDamagedEntriesUnlessTold) {
  const std::string f = path("c.wcache");
  const auto offsets = make_cache(f, kEntries);
  {
    auto c = WeightCache::open(options(f));
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->insert("layer1.bias", pattern(256, 77)), weightcache::kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  flip_byte(f, offsets.at("layer1.weight") + 5);
  const std::string before = read_file(f);
  const CliRun r = run({"compact", f});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("'layer1.weight'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--drop-corrupt"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(f), before);
  EXPECT_TRUE(strays("c.wcache").empty());

  const CliRun d = run({"compact", "--drop-corrupt", f});
  ASSERT_EQ(d.code, 0) << d.err;
  auto live = as_map(kEntries);
  live.erase("layer1.weight");
  live["layer1.bias"] = pattern(256, 77);
  EXPECT_TRUE(library_serves(f, live));
  EXPECT_EQ(run({"verify", f}).code, 0);
}

// ---- gc -----------------------------------------------------------------------------------------
std::uint64_t allocated(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
}

bool set_lock_time(const std::string& cache, std::int64_t seconds) {
  const struct timespec t[2] = {{static_cast<time_t>(seconds), 0}, {static_cast<time_t>(seconds), 0}};
  return ::utimensat(AT_FDCWD, (cache + ".lock").c_str(), t, 0) == 0 &&
         ::utimensat(AT_FDCWD, cache.c_str(), t, 0) == 0;
}

TEST_F(CliTest, GcRejectsBadSizesAndArguments) {
  const std::string d = path("caches");
  ASSERT_TRUE(fs::create_directory(d));
  make_cache(d + "/a.wcache", kEntries);
  for (const char* bad : {"", "x", "12Q", "-1", "1.5G", "1 K", "K", "0x10", "18446744073709551616",
                          "17179869184G", "10KB"}) {
    const CliRun r = run({"gc", d, "--max-size", bad});
    EXPECT_EQ(r.code, 2) << "'" << bad << "'";
    EXPECT_NE(r.err.find("--max-size"), std::string::npos) << bad << ": " << r.err;
  }
  EXPECT_EQ(run({"gc", d}).code, 2);                                 // no budget
  EXPECT_EQ(run({"gc", "--max-size", "1G"}).code, 2);                // no DIR
  EXPECT_EQ(run({"gc", d, d, "--max-size", "1G"}).code, 2);          // two
  EXPECT_EQ(run({"gc", d, "--max-size"}).code, 2);                   // no value
  EXPECT_EQ(run({"gc", d, "--max-size", "1G", "--frob"}).code, 2);
  EXPECT_TRUE(fs::exists(d + "/a.wcache"));  // none of these touched anything
  EXPECT_EQ(run({"gc", path("absent"), "--max-size", "1G"}).code, 3);
  EXPECT_EQ(run({"gc", d + "/a.wcache", "--max-size", "1G"}).code, 3);  // not a directory

  // Sizes: bytes, or K, M, G in powers of 1024, either case; --name=value works too.
  const std::map<std::string, std::uint64_t> sizes = {
      {"0", 0}, {"7", 7}, {"10K", 10240}, {"3m", 3145728}, {"2G", 2147483648}, {"16777216g", 1ull << 54}};
  for (const auto& [arg, bytes] : sizes) {
    const CliRun r = run({"gc", "--json", "--max-size=" + arg + "", d});
    ASSERT_TRUE(r.code == 0) << arg << ": " << r.err;
    const auto j = parse_json(r.out);
    ASSERT_TRUE(j) << r.out;
    EXPECT_EQ((*j)["max_bytes"].get<std::uint64_t>(), bytes) << arg;
    if (bytes == 0) {
      EXPECT_FALSE(fs::exists(d + "/a.wcache"));
    }
  }
}

TEST_F(CliTest, GcRemovesTheLeastRecentlyUsedAndSaysWhatItDid) {
  const std::string d = path("caches");
  ASSERT_TRUE(fs::create_directory(d));
  for (const char* n : {"old.wcache", "mid.wcache", "new.wcache"}) make_cache(d + "/" + n, kEntries);
  ASSERT_TRUE(set_lock_time(d + "/old.wcache", 1600000000));
  ASSERT_TRUE(set_lock_time(d + "/mid.wcache", 1600000100));
  ASSERT_TRUE(set_lock_time(d + "/new.wcache", 1600000200));
  write_file(d + "/notes.wcache", "not a cache");
  const std::uint64_t each = allocated(d + "/old.wcache") + allocated(d + "/old.wcache.lock");
  ASSERT_EQ(allocated(d + "/new.wcache") + allocated(d + "/new.wcache.lock"), each);

  const CliRun r = run({"gc", d, "--max-size", std::to_string(2 * each), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = parse_json(r.out);
  ASSERT_TRUE(j) << r.out;
  EXPECT_EQ((*j)["dir"].get<std::string>(), d);
  EXPECT_EQ((*j)["max_bytes"].get<std::uint64_t>(), 2 * each);
  EXPECT_EQ((*j)["total_before"].get<std::uint64_t>(), 3 * each);
  EXPECT_EQ((*j)["total_after"].get<std::uint64_t>(), 2 * each);
  EXPECT_TRUE((*j)["within_budget"].get<bool>());
  EXPECT_EQ((*j)["removed_files"].get<std::uint64_t>(), 1u);
  EXPECT_EQ((*j)["removed_bytes"].get<std::uint64_t>(), each);
  EXPECT_EQ((*j)["kept_files"].get<std::uint64_t>(), 2u);
  EXPECT_EQ((*j)["kept_in_use"].get<std::uint64_t>(), 0u);
  const auto& files = (*j)["files"];
  ASSERT_EQ(files.size(), 3u);  // caches only, least recently used first
  EXPECT_EQ(files[0]["path"].get<std::string>(), d + "/old.wcache");
  EXPECT_EQ(files[0]["action"].get<std::string>(), "removed");
  EXPECT_EQ(files[0]["reason"].get<std::string>(), "least_recently_used");
  EXPECT_EQ(files[0]["last_used"].get<std::string>(), "2020-09-13T12:26:40.000000000Z");
  EXPECT_EQ(files[0]["bytes"].get<std::uint64_t>(), each);
  EXPECT_TRUE(files[0]["detail"].is_null());
  EXPECT_EQ(files[1]["path"].get<std::string>(), d + "/mid.wcache");
  EXPECT_EQ(files[1]["action"].get<std::string>(), "kept");
  EXPECT_EQ(files[1]["reason"].get<std::string>(), "within_budget");
  EXPECT_EQ(files[2]["path"].get<std::string>(), d + "/new.wcache");
  EXPECT_FALSE(fs::exists(d + "/old.wcache"));
  EXPECT_FALSE(fs::exists(d + "/old.wcache.lock"));
  EXPECT_EQ(read_file(d + "/notes.wcache"), "not a cache");

  // Text: one line per cache, then the totals.
  const CliRun t = run({"gc", d, "--max-size", std::to_string(each)});
  ASSERT_EQ(t.code, 0) << t.err;
  const auto lines = lines_of(t.out);
  ASSERT_GE(lines.size(), 5u) << t.out;
  EXPECT_EQ(lines[0].rfind("removed " + d + "/mid.wcache", 0), 0u) << t.out;
  EXPECT_NE(lines[0].find("least recently used"), std::string::npos) << t.out;
  EXPECT_EQ(lines[1].rfind("kept    " + d + "/new.wcache", 0), 0u) << t.out;
  EXPECT_NE(lines[1].find("within budget"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("total before: " + std::to_string(2 * each) + " bytes"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("total after:  " + std::to_string(each) + " bytes"), std::string::npos) << t.out;
}

TEST_F(CliTest, GcExitsBusyWhenAFileInUseKeepsTheDirectoryOverBudget) {
  const std::string d = path("caches");
  ASSERT_TRUE(fs::create_directory(d));
  make_cache(d + "/open.wcache", kEntries);
  make_cache(d + "/idle.wcache", kEntries);
  auto held = WeightCache::open(options(d + "/open.wcache"));  // this process is another user
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(set_lock_time(d + "/open.wcache", 1600000000));  // the older of the two

  const CliRun r = run({"gc", d, "--max-size", "0", "--json"});
  EXPECT_EQ(r.code, 4) << r.out << r.err;
  const auto j = parse_json(r.out);
  ASSERT_TRUE(j) << r.out;
  EXPECT_FALSE((*j)["within_budget"].get<bool>());
  EXPECT_EQ((*j)["kept_in_use"].get<std::uint64_t>(), 1u);
  EXPECT_EQ((*j)["kept_in_use_bytes"].get<std::uint64_t>(),
            allocated(d + "/open.wcache") + allocated(d + "/open.wcache.lock"));
  EXPECT_EQ((*j)["total_after"].get<std::uint64_t>(), (*j)["kept_in_use_bytes"].get<std::uint64_t>());
  EXPECT_EQ((*j)["kept_unremovable"].get<std::uint64_t>(), 0u);
  EXPECT_EQ((*j)["removed_files"].get<std::uint64_t>(), 1u);
  const auto& files = (*j)["files"];
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0]["path"].get<std::string>(), d + "/open.wcache");
  EXPECT_EQ(files[0]["action"].get<std::string>(), "kept");
  EXPECT_EQ(files[0]["reason"].get<std::string>(), "in_use");
  EXPECT_NE(files[0]["detail"].get<std::string>().find("open"), std::string::npos);
  EXPECT_TRUE(fs::exists(d + "/open.wcache"));
  EXPECT_FALSE(fs::exists(d + "/idle.wcache"));
  EXPECT_NE(held->look_up("layer1.weight"), weightcache::kNotFound);

  const CliRun t = run({"gc", d, "--max-size", "0"});
  EXPECT_EQ(t.code, 4);
  EXPECT_NE(t.out.find("in use"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("over budget"), std::string::npos) << t.out;

  held = WeightCache{};  // closed: nothing holds it now
  EXPECT_EQ(run({"gc", d, "--max-size", "0"}).code, 0);
  EXPECT_FALSE(fs::exists(d + "/open.wcache"));
}

// ---- reproducible artifacts ---------------------------------------------------------------------
// The same 1,000 entries inserted in three orders (one pass in order, one by 4 threads, one by 2
// processes, each with finalizes in between) become three byte-identical files after
// `compact --canonical`, which `verify --compat-key` then accepts for the right key only.
TEST_F(CliTest, CanonicalCompactionMakesByteIdenticalFilesWhateverTheInsertionOrder) {
  constexpr int kEntries = 1000;
  auto key_of = [](int i) { return "layer." + std::to_string(i * 7919 % kEntries) + ".weight"; };
  auto bytes_of = [](int i) { return pattern(64 + (i * 37) % 3000, i); };
  auto insert_range = [&](const std::string& f, std::vector<int> order) {
    auto c = WeightCache::open(options(f));
    if (!c.ok()) return false;
    for (std::size_t n = 0; n < order.size(); ++n) {
      if (c->insert(key_of(order[n]), bytes_of(order[n])) == weightcache::kNotFound) return false;
      if (n % 97 == 0 && !c->finalize().ok()) return false;
    }
    return c->finalize().ok();
  };
  std::vector<int> all(kEntries);
  for (int i = 0; i < kEntries; ++i) all[i] = i;

  const std::string a = path("a.wcache"), b = path("b.wcache"), c = path("c.wcache");
  ASSERT_TRUE(insert_range(a, all));
  {
    // Four threads of one process, each a quarter, interleaved by the scheduler.
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    auto cache = WeightCache::open(options(b));
    ASSERT_TRUE(cache.ok());
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = kEntries - 1 - t; i >= 0; i -= 4) {
          if (cache->insert(key_of(i), bytes_of(i)) == weightcache::kNotFound) ++failures;
          if (i % 50 == 0 && !cache->finalize().ok()) ++failures;
        }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    ASSERT_TRUE(cache->finalize().ok());
  }
  {
    // Two processes at once, odd and even entries, each finalizing as it goes.
    pid_t kids[2];
    for (int k = 0; k < 2; ++k) {
      kids[k] = ::fork();
      ASSERT_GE(kids[k], 0);
      if (kids[k] == 0) {
        std::vector<int> mine;
        for (int i = k; i < kEntries; i += 2) mine.push_back(i);
        std::reverse(mine.begin(), mine.end());
        if (!insert_range(c, mine)) weightcache::test::child_exit(weightcache::test::kChildCacheError, "insert_range");
        weightcache::test::child_exit(weightcache::test::kChildOk);
      }
    }
    for (pid_t kid : kids) {
      int status = 0;
      ASSERT_EQ(::waitpid(kid, &status, 0), kid);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
  }
  EXPECT_NE(read_file(a), read_file(b));  // the orders really differ
  for (const auto& f : {a, b, c}) {
    const CliRun r = run({"compact", "--canonical", f});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  const std::string canonical = read_file(a);
  EXPECT_EQ(read_file(b), canonical) << "canonical compaction of the threads' file differs";
  EXPECT_EQ(read_file(c), canonical) << "canonical compaction of the processes' file differs";
  // Canonical twice is the same file again.
  ASSERT_EQ(run({"compact", "--canonical", a}).code, 0);
  EXPECT_EQ(read_file(a), canonical);
  std::map<std::string, std::string> live;
  for (int i = 0; i < kEntries; ++i) live[key_of(i)] = bytes_of(i);
  EXPECT_TRUE(library_serves(a, live));

  EXPECT_EQ(run({"verify", "--compat-key", "model-a|packer-1", a}).code, 0);
  const CliRun wrong = run({"verify", "--compat-key", "model-a|packer-2", a});
  EXPECT_EQ(wrong.code, 1);
  EXPECT_NE(wrong.out.find("another compatibility key"), std::string::npos) << wrong.out;
}

}  // namespace
