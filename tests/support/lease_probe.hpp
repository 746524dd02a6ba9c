// A handle of the test's own on "<cache>.lock", the sidecar whose lock is the writer lease: it
// tells whether anyone holds the lease, takes it as another process packing the file would, and
// lets go. Implemented with the OS calls directly, not through the library, so it checks the
// library's lease independently: flock on POSIX (which conflicts between open file descriptions
// even within one process), a lock over the whole file on Windows (which conflicts with the
// library's one-byte lock wherever that byte lies; Windows locks belong to the handle).
#pragma once

#include <cerrno>
#include <string>

#ifdef _WIN32
#include "win32_util.hpp"
#else
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#endif

namespace weightcache::test {

class LeaseProbe {
 public:
  /// Opens (creating if needed) "<cache_path>.lock". Never inherited by child processes.
  explicit LeaseProbe(const std::string& cache_path) {
    const std::string lock_path = cache_path + ".lock";
#ifdef _WIN32
    h_ = ::CreateFileW(wide(lock_path).c_str(), GENERIC_READ | GENERIC_WRITE,
                       FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr, OPEN_ALWAYS,
                       FILE_ATTRIBUTE_NORMAL, nullptr);
#else
    fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
#endif
  }
  ~LeaseProbe() {
#ifdef _WIN32
    if (h_ != INVALID_HANDLE_VALUE) ::CloseHandle(h_);  // releases a lock still held
#else
    if (fd_ >= 0) ::close(fd_);
#endif
  }
  LeaseProbe(const LeaseProbe&) = delete;
  LeaseProbe& operator=(const LeaseProbe&) = delete;

  bool valid() const noexcept {
#ifdef _WIN32
    return h_ != INVALID_HANDLE_VALUE;
#else
    return fd_ >= 0;
#endif
  }
  /// True when the lease was free and is now ours.
  bool try_take() noexcept { return lock(false); }
  /// Waits until the lease is ours; false on an error.
  bool take() noexcept { return lock(true); }
  void release() noexcept {
#ifdef _WIN32
    unlock_whole_file(h_);
#else
    (void)::flock(fd_, LOCK_UN);
#endif
  }

 private:
  bool lock(bool wait) noexcept {
#ifdef _WIN32
    return lock_whole_file(h_, wait);
#else
    for (;;) {
      if (::flock(fd_, LOCK_EX | (wait ? 0 : LOCK_NB)) == 0) return true;
      if (errno != EINTR) return false;
    }
#endif
  }

#ifdef _WIN32
  HANDLE h_ = INVALID_HANDLE_VALUE;
#else
  int fd_ = -1;
#endif
};

}  // namespace weightcache::test
