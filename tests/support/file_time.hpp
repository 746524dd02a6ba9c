// A file's size and modification time at the file system's own resolution (nanoseconds on
// Linux, 100 ns on NTFS), and setting that time. std::filesystem::last_write_time would do on
// Linux, but mingw-w64's libstdc++ reads and writes it in whole seconds.
#pragma once

#include <cstdint>
#include <string>

#ifdef _WIN32
#include "win32_util.hpp"
#else
#include <fcntl.h>
#include <sys/stat.h>
#endif

namespace weightcache::test {

struct FileTimes {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;  // since the Unix epoch
};

/// Size and modification time of `path` (UTF-8); false if it cannot be read.
inline bool read_file_times(const std::string& path, FileTimes* out) {
#ifdef _WIN32
  WIN32_FILE_ATTRIBUTE_DATA a{};
  if (::GetFileAttributesExW(wide(path).c_str(), GetFileExInfoStandard, &a) == 0) return false;
  out->size = (std::uint64_t{a.nFileSizeHigh} << 32) | a.nFileSizeLow;
  const std::int64_t ticks =
      static_cast<std::int64_t>((std::uint64_t{a.ftLastWriteTime.dwHighDateTime} << 32) | a.ftLastWriteTime.dwLowDateTime);
  out->mtime_ns = (ticks - 116444736000000000) * 100;  // FILETIME: 100 ns ticks since 1601
#else
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  out->size = static_cast<std::uint64_t>(st.st_size);
  out->mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
#endif
  return true;
}

/// Sets the modification (and access) time of `path` to `mtime_ns` since the Unix epoch,
/// rounded down to the file system's resolution; false on failure.
inline bool set_file_mtime(const std::string& path, std::int64_t mtime_ns) {
#ifdef _WIN32
  const HANDLE h = ::CreateFileW(wide(path).c_str(), FILE_WRITE_ATTRIBUTES,
                                 FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr, OPEN_EXISTING,
                                 FILE_ATTRIBUTE_NORMAL, nullptr);
  if (h == INVALID_HANDLE_VALUE) return false;
  const auto ticks = static_cast<std::uint64_t>(mtime_ns / 100 + 116444736000000000);
  FILETIME ft;
  ft.dwLowDateTime = static_cast<DWORD>(ticks);
  ft.dwHighDateTime = static_cast<DWORD>(ticks >> 32);
  const bool ok = ::SetFileTime(h, nullptr, &ft, &ft) != 0;
  ::CloseHandle(h);
  return ok;
#else
  struct timespec t;
  t.tv_sec = static_cast<time_t>(mtime_ns / 1000000000);
  t.tv_nsec = static_cast<long>(mtime_ns % 1000000000);
  const struct timespec times[2] = {t, t};
  return ::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0;
#endif
}

}  // namespace weightcache::test
