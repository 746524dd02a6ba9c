// Helpers of the Windows suite: deterministic entry contents, the golden files' definition
// (shared by the generator and the tests on both platforms) and, on Windows, a child process.
#pragma once

#include <weightcache/weight_cache.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef _WIN32
#include "platform/platform.hpp"
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
  return {.path = path, .compat_key = "weightcache-golden-v1", .alignment = 4096, .backing = Backing::file};
}

/// Options of the suite's own caches (not the golden files).
inline Options suite_options(const std::string& path) {
  return {.path = path, .compat_key = "weightcache-windows-suite", .backing = Backing::file};
}

/// An entry the suite packs: `size` bytes of pattern_bytes(seed) under `key`.
struct PatternEntry {
  std::string key;
  std::uint64_t seed;
  std::size_t size;
};

/// Reserves room for `e`, writes its bytes there and inserts them in place: the entry's offset,
/// or kNotFound.
inline std::size_t pack_entry(WeightCache& cache, const PatternEntry& e) {
  const std::string bytes = pattern_bytes(e.seed, e.size);
  void* p = cache.reserve(bytes.size());
  if (p == nullptr) return kNotFound;
  std::memcpy(p, bytes.data(), bytes.size());
  return cache.look_up_or_insert(e.key, p, bytes.size());
}

/// What is wrong with `e` in `cache`: "" when a look-up serves exactly its bytes, at an offset
/// and an address aligned to `align`.
inline std::string entry_problem(WeightCache& cache, const PatternEntry& e, std::size_t align = 1) {
  const std::size_t off = cache.look_up(e.key);
  if (off == kNotFound) return e.key + ": miss";
  const void* p = cache.offset_to_addr(off);
  if (p == nullptr) return e.key + ": no address";
  if (off % align != 0 || reinterpret_cast<std::uintptr_t>(p) % align != 0)
    return e.key + ": offset " + std::to_string(off) + " or address not aligned to " + std::to_string(align);
  if (std::memcmp(p, pattern_bytes(e.seed, e.size).data(), e.size) != 0) return e.key + ": wrong bytes";
  return "";
}

/// The entries of the caches a test hands to a child process by its handle (win_child's
/// handle-* commands): `count` of them, sizes straddling the 4 KiB page and the 64 KiB
/// granularity.
inline std::vector<PatternEntry> shared_entries(std::size_t count) {
  const std::size_t sizes[] = {1, 4096, 65535, 65536, 65537, 300000, 1u << 20};
  std::vector<PatternEntry> v;
  for (std::size_t i = 0; i < count; ++i)
    v.push_back({"shared/" + std::to_string(i), 7000 + i, sizes[i % (sizeof sizes / sizeof sizes[0])] + i});
  return v;
}

#ifdef _WIN32
/// Opens `path` with every sharing mode (so the library can reopen the handle as its own).
constexpr DWORD kShareAll = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;

/// The suite's options for a cache on the caller's handle `h`.
inline Options on_handle(HANDLE h) {
  Options o = suite_options("");
  o.handle = h;
  return o;
}

/// The platform probes its mapping mode once per process through the call table: call this
/// before hooking any entry, so the probe is not what a hook sees first.
inline void warm_up() { (void)platform::os().map_granularity(); }

inline HANDLE open_handle(const std::string& path, DWORD access, DWORD disposition,
                          DWORD flags = FILE_ATTRIBUTE_NORMAL) {
  return ::CreateFileW(wide(path).c_str(), access, kShareAll, nullptr, disposition, flags, nullptr);
}

/// A handle as a command-line argument, and back.
inline std::string handle_arg(HANDLE h) { return std::to_string(reinterpret_cast<std::uintptr_t>(h)); }
inline HANDLE handle_of(const char* arg) {
  return reinterpret_cast<HANDLE>(static_cast<std::uintptr_t>(std::strtoull(arg, nullptr, 10)));
}

/// Runs `exe` to completion, with `env_name` (when set) added to the environment it inherits:
/// its exit code, or -1 when it could not start.
#ifdef WEIGHTCACHE_WIN_CHILD
/// The suite's second process (win_child.cpp), built next to the test binary; CMake names it in
/// WEIGHTCACHE_WIN_CHILD for the test executable only (tests/windows/CMakeLists.txt).
inline std::string win_child_exe() { return sibling_exe(WEIGHTCACHE_WIN_CHILD); }
#endif

/// With `inherit_handles`, the child inherits this process's inheritable handles.
inline long run_child(const std::string& exe, const std::vector<std::string>& args, const char* env_name = nullptr,
                      const char* env_value = nullptr, bool inherit_handles = false) {
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
  const Process child = spawn_process(exe, args, &error, inherit_handles);
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
