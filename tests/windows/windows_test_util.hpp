// Helpers of the Windows suite: deterministic entry contents, the golden files' definition
// (shared by the generator and the tests on both platforms) and, on Windows, a child process.
#pragma once

#include <weightcache/weight_cache.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#ifdef _WIN32
#include "spawn.hpp"  // <windows.h>, wide(), under_wine(), spawn_process()
#endif

namespace weightcache::test {

/// `n` bytes that depend only on `seed` (splitmix64), so two processes or two platforms agree.
inline std::string pattern_bytes(std::uint64_t seed, std::size_t n) {
  std::string out(n, '\0');
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < n; i += 8) {
    x += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    for (std::size_t b = 0; b < 8 && i + b < n; ++b) out[i + b] = static_cast<char>(z >> (8 * b));
  }
  return out;
}

// ---- golden files (tests/windows/data) ----
// linux-made.wcache was written by wc_make_golden built for Linux, windows-made.wcache by the
// same program built with mingw-w64 and run under Wine. Each side must serve the other's.

struct GoldenEntry {
  const char* key;
  std::uint64_t seed;
  std::size_t size;
};

// Sizes straddle the 4 KiB page and the 64 KiB Windows allocation granularity.
inline const std::vector<GoldenEntry>& golden_entries() {
  static const std::vector<GoldenEntry> entries = {
      {"conv1/weights", 1, 100},
      {"conv2/weights", 2, 70000},
      {"fc/weights", 3, 4096},
      {"fc/bias", 4, 1},
      {"embedding", 5, 20000},
  };
  return entries;
}

inline Options golden_options(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = "weightcache-golden-v1";
  o.alignment = 4096;
  o.backing = Backing::file;
  return o;
}

/// Options of the suite's own caches (not the golden files).
inline Options suite_options(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = "weightcache-windows-suite";
  o.backing = Backing::file;
  return o;
}

#ifdef _WIN32

/// Runs `exe` to completion, with `env_name` (when set) added to the environment it inherits:
/// its exit code, or -1 when it could not start.
inline long run_child(const std::string& exe, const std::vector<std::string>& args, const char* env_name = nullptr,
                      const char* env_value = nullptr) {
  std::wstring name, old;
  bool had_old = false;
  if (env_name != nullptr) {
    name = wide(env_name);
    wchar_t buf[512];
    const DWORD n = ::GetEnvironmentVariableW(name.c_str(), buf, 512);
    had_old = n > 0 && n < 512;
    if (had_old) old.assign(buf, n);
    ::SetEnvironmentVariableW(name.c_str(), wide(env_value).c_str());
  }
  int error = 0;
  const Process child = spawn_process(exe, args, &error);
  if (env_name != nullptr) ::SetEnvironmentVariableW(name.c_str(), had_old ? old.c_str() : nullptr);
  if (child == kNoProcess) {
    std::fprintf(stderr, "run_child: could not start %s: Windows error %d\n", exe.c_str(), error);
    return -1;
  }
  const ExitStatus st = wait_process(child);
  if (!st.ok()) std::fprintf(stderr, "run_child: %s %s\n", exe.c_str(), st.describe().c_str());
  return st.exited ? static_cast<long>(static_cast<unsigned>(st.code)) : -1;
}

#endif  // _WIN32

}  // namespace weightcache::test
