// What the two halves of the Win32 platform, win32.cpp (files, locks, the Platform itself) and
// win32_segments.cpp (the address space), both use: the call table, the Windows error
// reporting, and the file queries they both make. Defined in win32.cpp.
#pragma once

#include "platform/platform.hpp"
#include "platform/win32_calls.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace weightcache::platform::win32 {

// The call table in use: every call to the OS goes through it (win32_calls.hpp).
inline Win32Calls& sys() noexcept { return win32_calls(); }

// The errno closest to a Windows error code (the core tests sys_errno against ENOENT, as on
// POSIX).
int errno_of(DWORD code);
// The Errc of a Windows error code.
Errc errc_of_win(DWORD code);
// The system's text for `code`, in UTF-8, without the trailing period, then
// " (Windows error N)".
std::string win_message(DWORD code);
// "<what> '<path>': <Windows message> (Windows error N). <hint>", with sys_errno errno_of(code).
Error win_error(DWORD code, const std::string& what, const std::string& path, const char* hint = nullptr);

// Fails (with the thread's last error set) when either query fails: a file whose type cannot
// be read is not thereby "not a regular file". `attributes` gets the FILE_ATTRIBUTE_* bits.
bool info_of(HANDLE h, FileInfo* out, DWORD* attributes = nullptr);
// Fails with the thread's last error set.
bool file_size_of(HANDLE h, std::uint64_t* size);
// Reads exactly `size` bytes at `offset` of `h`, which is the file at `path` (for messages), or
// fails (a short read is Errc::corrupt).
Result<void> read_file_at(HANDLE h, const std::string& path, void* buf, std::size_t size, std::uint64_t offset);

inline std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v & ~(a - 1); }
inline std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace weightcache::platform::win32
