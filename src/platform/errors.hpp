// What the POSIX and Win32 platforms say alike when the OS refuses: the message shape
// "<what> '<path>': <the OS's reason>. <hint>", the Errc of an errno value (the C runtime's
// errors, which both have), and the errors about a file that do not depend on the OS. Each
// platform keeps its own table of OS error codes (posix.cpp uses errno itself; win32.cpp maps
// GetLastError codes) and builds its errors with these. os_error (platform.hpp) is defined here.
#pragma once

#include "platform/platform.hpp"

#include <string>

namespace weightcache::platform {

/// "<what> '<path>': <reason>.", then " <hint>" when there is one.
std::string error_message(const std::string& what, const std::string& path, const std::string& reason,
                          const char* hint = nullptr);

/// The Errc of an errno value: no_space, no_memory, read_only, invalid_argument, unsupported,
/// io for everything else.
Errc errc_of_errno(int err) noexcept;

/// Something other than a regular file is at `path`.
Error not_a_regular_file(const std::string& path);

/// An out-of-memory error that says what ran out and names the file: "<what> '<path>'". Never
/// throws: if even that message cannot be built, `what` alone, or no message (set_last_error
/// then says "out of memory").
Error no_memory_error(const char* what, const std::string& path) noexcept;

}  // namespace weightcache::platform
