// Small Win32 helpers the test suites share on Windows: UTF-8 <-> UTF-16, the directory of the
// running executable, command-line quoting, whole-file locks, whether a file is held open, and
// whether Wine is what runs us.
#pragma once
#ifdef _WIN32

#include "platform/windows_h.hpp"  // <windows.h> as the library includes it

#include <cstdlib>
#include <cstring>
#include <string>

namespace weightcache::test {

/// UTF-16 from UTF-8.
inline std::wstring wide(const std::string& s) {
  if (s.empty()) return {};
  const int n = ::MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), nullptr, 0);
  std::wstring w(static_cast<std::size_t>(n), L'\0');
  ::MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), w.data(), n);
  return w;
}

/// UTF-8 from UTF-16.
inline std::string narrow(const std::wstring& w) {
  if (w.empty()) return {};
  const int n = ::WideCharToMultiByte(CP_UTF8, 0, w.data(), static_cast<int>(w.size()), nullptr, 0, nullptr, nullptr);
  std::string s(static_cast<std::size_t>(n), '\0');
  ::WideCharToMultiByte(CP_UTF8, 0, w.data(), static_cast<int>(w.size()), s.data(), n, nullptr, nullptr);
  return s;
}

/// Path (UTF-8) of `name` in the directory of the running executable: a suite's helpers are
/// built next to its test binary.
inline std::string sibling_exe(const std::string& name) {
  std::wstring buf(32768, L'\0');
  const DWORD n = ::GetModuleFileNameW(nullptr, buf.data(), static_cast<DWORD>(buf.size()));
  buf.resize(n);
  const auto slash = buf.find_last_of(L"\\/");
  const std::wstring dir = slash == std::wstring::npos ? L"." : buf.substr(0, slash);
  return narrow(dir) + "\\" + name;
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

/// Takes an exclusive byte-range lock on every byte of the file `h` (0 to 2^63), waiting for it
/// when `wait`, else failing at once when any part is locked by another handle. Any lock someone
/// else holds anywhere in the file conflicts with it, wherever the library puts its lease byte:
/// tests use it on "<cache>.lock" as an independent probe of the writer lease (Windows locks
/// belong to the handle, like flock, so it conflicts with this process's own caches too).
inline bool lock_whole_file(HANDLE h, bool wait) {
  OVERLAPPED ov{};
  const DWORD flags = LOCKFILE_EXCLUSIVE_LOCK | (wait ? 0 : LOCKFILE_FAIL_IMMEDIATELY);
  return ::LockFileEx(h, flags, 0, MAXDWORD, 0x7fffffff, &ov) != 0;
}

inline void unlock_whole_file(HANDLE h) {
  OVERLAPPED ov{};
  (void)::UnlockFileEx(h, 0, MAXDWORD, 0x7fffffff, &ov);
}

/// Whether some handle keeps the file at `path` (UTF-8) open, in this process or another: an
/// open that shares nothing is refused then (ERROR_SHARING_VIOLATION). A view of the file keeps
/// it open too, so when this says false nothing maps it either. False if there is no such file.
inline bool file_held_open(const std::string& path) {
  HANDLE h = ::CreateFileW(wide(path).c_str(), GENERIC_READ, 0, nullptr, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (h != INVALID_HANDLE_VALUE) {
    ::CloseHandle(h);
    return false;
  }
  return ::GetLastError() == ERROR_SHARING_VIOLATION;
}

/// True under Wine (ntdll exports wine_get_version), where a few Windows behaviours differ.
inline bool under_wine() {
  HMODULE ntdll = ::GetModuleHandleW(L"ntdll.dll");
  return ntdll != nullptr && ::GetProcAddress(ntdll, "wine_get_version") != nullptr;
}

/// True when the Win32 backend maps files in its legacy mode (docs/PLATFORMS.md): forced by
/// WEIGHTCACHE_WIN32_MAPPING=legacy, or under Wine, which has no placeholders (Wine 8). There a
/// read-write open grows a file whose size is not a multiple of 64 KiB to the granule's end.
inline bool legacy_mapping() {
  const char* force = std::getenv("WEIGHTCACHE_WIN32_MAPPING");
  return (force != nullptr && std::strcmp(force, "legacy") == 0) || under_wine();
}

}  // namespace weightcache::test

#endif  // _WIN32
