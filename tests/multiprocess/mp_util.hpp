// Shared by the multi-process tests and their helper process (no GoogleTest here): entry bytes
// that every process derives from the key alone, the options every process opens with, a tiny
// key=value argument / results format, and pipe helpers for start gates and "ready" signals
// (POSIX descriptors or Windows handles, both passed to children as numbers).
#pragma once

#include "child_exit.hpp"
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

#ifdef _WIN32
#include "win32_util.hpp"
#else
#include <fcntl.h>
#include <unistd.h>
#endif

namespace weightcache::test::mp {

inline std::string shared_key(std::size_t i) { return "shared/" + std::to_string(i); }
inline std::string own_key(std::string_view tag, std::size_t i) {
  return "own/" + std::string(tag) + "/" + std::to_string(i);
}

/// Options of every process in these tests. Durability none: page-cache coherence between
/// processes is what is tested, not power loss, and skipping fdatasync keeps the suite fast.
inline Options cache_options(const std::string& path) {
  return {.path = path, .compat_key = "multiprocess-test", .durability = Durability::none};
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

/// Packs `key` as a backend does (reserve, fill, look_up_or_insert), unless it is there already;
/// "" when the key then holds its bytes, else what went wrong.
inline std::string pack_key(WeightCache& cache, const std::string& key, std::size_t size) {
  if (cache.look_up(key) != kNotFound) return check_entry(cache, key, size);  // someone packed it
  void* p = cache.reserve(size);
  if (p == nullptr) return "reserve failed: " + last_error().message;
  fill_for_key(key, p, size);
  if (cache.look_up_or_insert(key, p, size) == kNotFound)
    return "look_up_or_insert('" + key + "') failed: " + last_error().message;
  return check_entry(cache, key, size);
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

/// One end of a pipe as a number a command line can carry: a descriptor on POSIX, the value of
/// an inherited HANDLE on Windows (an inherited handle has the same value in the child).
using PipeEnd = std::intptr_t;
inline constexpr PipeEnd kNoPipe = -1;

inline PipeEnd parse_pipe_end(const std::string& s) {
  return s.empty() ? kNoPipe : static_cast<PipeEnd>(std::strtoll(s.c_str(), nullptr, 10));
}

/// Blocks until the other end writes a byte (returns true) or every writer closed it (false).
inline bool read_byte(PipeEnd end) {
  char c = 0;
#ifdef _WIN32
  for (;;) {
    DWORD n = 0;
    // Every write handle closed (or its process gone): ERROR_BROKEN_PIPE, the EOF of a pipe.
    if (::ReadFile(reinterpret_cast<HANDLE>(end), &c, 1, &n, nullptr) == 0) return false;
    if (n == 1) return true;
  }
#else
  for (;;) {
    const ssize_t n = ::read(static_cast<int>(end), &c, 1);
    if (n == 1) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
#endif
}

inline bool write_byte(PipeEnd end) {
  const char c = 1;
#ifdef _WIN32
  DWORD n = 0;
  return ::WriteFile(reinterpret_cast<HANDLE>(end), &c, 1, &n, nullptr) != 0 && n == 1;
#else
  for (;;) {
    const ssize_t n = ::write(static_cast<int>(end), &c, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
#endif
}

inline void close_pipe_end(PipeEnd end) {
  if (end == kNoPipe) return;
#ifdef _WIN32
  ::CloseHandle(reinterpret_cast<HANDLE>(end));
#else
  ::close(static_cast<int>(end));
#endif
}

}  // namespace weightcache::test::mp
