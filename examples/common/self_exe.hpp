// The path a program starts another copy of itself by (Linux).
#pragma once

#include <string>

#include <climits>
#include <unistd.h>

namespace weightcache::examples {

// This executable's path, read from /proc/self/exe. Started by that path rather than through the
// link itself: qemu-user (7.2) runs an execve of "/proc/self/exe" as the emulator's own binary,
// while it answers readlink with the program it emulates.
inline std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace weightcache::examples
