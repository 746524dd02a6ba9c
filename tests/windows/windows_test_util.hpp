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
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
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

/// True under Wine (ntdll exports wine_get_version), where a few Windows behaviours differ.
inline bool under_wine() {
  HMODULE ntdll = ::GetModuleHandleW(L"ntdll.dll");
  return ntdll != nullptr && ::GetProcAddress(ntdll, "wine_get_version") != nullptr;
}

/// UTF-16 from UTF-8.
inline std::wstring wide(const std::string& s) {
  if (s.empty()) return {};
  const int n = ::MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), nullptr, 0);
  std::wstring w(static_cast<std::size_t>(n), L'\0');
  ::MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), w.data(), n);
  return w;
}

/// Path (UTF-8) of `name` in the directory of the running executable: the suite's helper is
/// built next to the test binary.
inline std::string sibling_exe(const std::string& name) {
  std::wstring buf(32768, L'\0');
  const DWORD n = ::GetModuleFileNameW(nullptr, buf.data(), static_cast<DWORD>(buf.size()));
  buf.resize(n);
  const auto slash = buf.find_last_of(L"\\/");
  const std::wstring dir = slash == std::wstring::npos ? L"." : buf.substr(0, slash);
  const int len = ::WideCharToMultiByte(CP_UTF8, 0, dir.data(), static_cast<int>(dir.size()), nullptr, 0, nullptr, nullptr);
  std::string out(static_cast<std::size_t>(len), '\0');
  ::WideCharToMultiByte(CP_UTF8, 0, dir.data(), static_cast<int>(dir.size()), out.data(), len, nullptr, nullptr);
  return out + "\\" + name;
}

/// One argument quoted for CommandLineToArgvW / the C runtime's parser.
inline std::wstring quote_arg(const std::wstring& arg) {
  if (!arg.empty() && arg.find_first_of(L" \t\"") == std::wstring::npos) return arg;
  std::wstring out = L"\"";
  std::size_t slashes = 0;
  for (wchar_t c : arg) {
    if (c == L'\\') {
      ++slashes;
      continue;
    }
    if (c == L'"') out.append(2 * slashes + 1, L'\\');
    else out.append(slashes, L'\\');
    slashes = 0;
    out += c;
  }
  out.append(2 * slashes, L'\\');
  out += L'"';
  return out;
}

/// A running child process (CreateProcessW, no shell, no inherited handles).
class Child {
 public:
  /// Starts `exe` with `args` and, when `env_name` is set, that variable added to the
  /// environment. Check started() before use.
  Child(const std::string& exe, const std::vector<std::string>& args, const char* env_name = nullptr,
        const char* env_value = nullptr) {
    std::wstring cmd = quote_arg(wide(exe));
    for (const auto& a : args) cmd += L" " + quote_arg(wide(a));
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
    STARTUPINFOW si{};
    si.cb = sizeof si;
    PROCESS_INFORMATION pi{};
    const std::wstring app = wide(exe);
    // Process creation is the harness, not the code under test. Under Wine it has failed once
    // in CI on a freshly made prefix (no child ran; the cause was not recorded), so a failed
    // launch is reported with its error and tried again a few times before the test sees it.
    for (int attempt = 0; attempt < 5 && !started_; ++attempt) {
      if (attempt > 0) ::Sleep(100u * static_cast<DWORD>(attempt));
      std::wstring line = cmd;  // CreateProcessW may modify the command line in place
      started_ = ::CreateProcessW(app.c_str(), line.data(), nullptr, nullptr, FALSE, 0, nullptr, nullptr, &si, &pi) != 0;
      error_ = started_ ? 0 : ::GetLastError();
      if (!started_)
        std::fprintf(stderr, "Child: CreateProcessW attempt %d failed: Windows error %lu\n", attempt + 1,
                     static_cast<unsigned long>(error_));
    }
    if (env_name != nullptr) ::SetEnvironmentVariableW(name.c_str(), had_old ? old.c_str() : nullptr);
    if (started_) {
      ::CloseHandle(pi.hThread);
      process_ = pi.hProcess;
    }
  }
  ~Child() {
    if (process_ != nullptr) {
      ::WaitForSingleObject(process_, INFINITE);
      ::CloseHandle(process_);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return started_; }
  DWORD start_error() const { return error_; }
  /// Waits for the exit; the exit code, or -1 if it never started.
  long wait() {
    if (!started_) return -1;
    ::WaitForSingleObject(process_, INFINITE);
    DWORD code = 0;
    ::GetExitCodeProcess(process_, &code);
    return static_cast<long>(code);
  }

 private:
  bool started_ = false;
  DWORD error_ = 0;
  HANDLE process_ = nullptr;
};

/// Runs `exe` to completion: its exit code, or -1 when it could not start.
inline long run_child(const std::string& exe, const std::vector<std::string>& args, const char* env_name = nullptr,
                      const char* env_value = nullptr) {
  Child c(exe, args, env_name, env_value);
  if (!c.started()) {
    std::fprintf(stderr, "run_child: could not start %s: Windows error %lu\n", exe.c_str(),
                 static_cast<unsigned long>(c.start_error()));
    return -1;
  }
  const long code = c.wait();
  if (code != 0) std::fprintf(stderr, "run_child: %s exited with 0x%08lx\n", exe.c_str(), static_cast<unsigned long>(code));
  return code;
}

#endif  // _WIN32

}  // namespace weightcache::test
