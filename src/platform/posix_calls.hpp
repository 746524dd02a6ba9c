// Every system call the POSIX platform makes, as a table of function pointers. The product path
// uses the libc defaults; fault-injection tests swap entries to fail the Nth call with EIO,
// ENOSPC, EINTR, short writes, mmap or msync failures, below the retry loops that handle them.
// posix.cpp calls the OS only through this table: a call made around it could not be failed.
#pragma once

#include "platform/call_table.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <time.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#if defined(__linux__)
#include <sys/xattr.h>
#endif
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>

namespace weightcache::platform::posix_default {

// A call this system does not have: fails with `err`, as the missing call would.
template <class R = int, class... Args>
inline R unavailable(int err, const Args&... /*args*/) {
  errno = err;
  return R(-1);
}

inline int open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
inline int ioctl(int fd, unsigned long request, void* arg) { return ::ioctl(fd, request, arg); }
inline int stat(const char* path, struct stat* st) { return ::stat(path, st); }
inline int lstat(const char* path, struct stat* st) { return ::lstat(path, st); }
inline int fcntl(int fd, int cmd, int arg) { return ::fcntl(fd, cmd, arg); }
inline int fcntl_lock(int fd, int cmd, struct flock* lock) { return ::fcntl(fd, cmd, lock); }
inline int memfd_create(const char* name, unsigned flags) {
#if defined(__linux__)
  return ::memfd_create(name, flags);
#else
  return unavailable(ENOSYS, name, flags);
#endif
}
inline int sync_file_range(int fd, off_t off, off_t n, unsigned flags) {
#if defined(__linux__)
  return ::sync_file_range(fd, off, n, flags);
#else
  return unavailable(ENOSYS, fd, off, n, flags);
#endif
}
inline ssize_t fgetxattr(int fd, const char* name, void* value, size_t size) {
#if defined(__linux__)
  return ::fgetxattr(fd, name, value, size);
#else
  return unavailable<ssize_t>(ENOTSUP, fd, name, value, size);
#endif
}
// Android has pwritev from API level 24, macOS from 11 (iOS 14): before those, one pwrite per
// buffer, which ends where the first one falls short or fails, as a short pwritev would.
inline ssize_t pwritev(int fd, const struct iovec* iov, int count, off_t off) {
#if (defined(__ANDROID__) && __ANDROID_API__ < 24) || defined(__APPLE__)
  ssize_t done = 0;
  for (int i = 0; i < count; ++i) {
    const ssize_t n = ::pwrite(fd, iov[i].iov_base, iov[i].iov_len, off + done);
    if (n < 0) return done > 0 ? done : n;
    done += n;
    if (static_cast<size_t>(n) < iov[i].iov_len) break;
  }
  return done;
#else
  return ::pwritev(fd, iov, count, off);
#endif
}
inline int getrlimit(int resource, struct rlimit* rl) {
  return ::getrlimit(static_cast<decltype(RLIMIT_FSIZE)>(resource), rl);  // an enum in glibc's C++
}

}  // namespace weightcache::platform::posix_default

// The table's entries, in order, as X(name, default, result, parameters). The table, its
// enumerators, their names, the iteration below and the libc defaults are all generated from
// this list (as SQLite's aSyscall[] keeps each call's name beside its default): adding an entry
// here is the whole change. A default is libc's function where its type is the entry's, else
// an adapter in posix_default (variadic or overloaded calls, and one that may be missing).
#define WC_POSIX_CALLS(X)                                                                               \
  X(open, posix_default::open, int, (const char* path, int flags, mode_t mode))                         \
  X(close, ::close, int, (int fd))                                                                      \
  X(fstat, ::fstat, int, (int fd, struct stat* st))                                                     \
  X(pread, ::pread, ssize_t, (int fd, void* buf, size_t n, off_t off))                                  \
  X(pwrite, ::pwrite, ssize_t, (int fd, const void* buf, size_t n, off_t off))                          \
  /* zeros for space about to be stored into (Platform::prepare_for_stores) */                          \
  X(pwritev, posix_default::pwritev, ssize_t, (int fd, const struct iovec* iov, int count, off_t off))  \
  /* SEEK_HOLE only: reads and writes say their offset */                                               \
  X(lseek, ::lseek, off_t, (int fd, off_t off, int whence))                                             \
  /* FS_IOC_FIEMAP only */                                                                              \
  X(ioctl, posix_default::ioctl, int, (int fd, unsigned long request, void* arg))                       \
  /* returns an error number, as libc's */                                                              \
  X(posix_fallocate, ::posix_fallocate, int, (int fd, off_t off, off_t len))                            \
  X(ftruncate, ::ftruncate, int, (int fd, off_t len))                                                   \
  X(fdatasync, ::fdatasync, int, (int fd))                                                              \
  X(fsync, ::fsync, int, (int fd))                                                                      \
  X(rename, ::rename, int, (const char* from, const char* to))                                          \
  X(mmap, ::mmap, void*, (void* addr, size_t len, int prot, int flags, int fd, off_t off))              \
  X(munmap, ::munmap, int, (void* addr, size_t len))                                                    \
  X(mprotect, ::mprotect, int, (void* addr, size_t len, int prot))                                      \
  X(msync, ::msync, int, (void* addr, size_t len, int flags))                                           \
  X(flock, ::flock, int, (int fd, int op))                                                              \
  X(stat, posix_default::stat, int, (const char* path, struct stat* st))                                \
  X(lstat, posix_default::lstat, int, (const char* path, struct stat* st))                              \
  /* the commands with an int argument (F_GETFL, F_SETFL) */                                            \
  X(fcntl, posix_default::fcntl, int, (int fd, int cmd, int arg))                                       \
  /* F_OFD_SETLK, F_OFD_GETLK */                                                                        \
  X(fcntl_lock, posix_default::fcntl_lock, int, (int fd, int cmd, struct flock* lock))                  \
  X(unlink, ::unlink, int, (const char* path))                                                          \
  X(futimens, ::futimens, int, (int fd, const struct timespec times[2]))                                \
  /* Linux; ENOSYS elsewhere */                                                                         \
  X(memfd_create, posix_default::memfd_create, int, (const char* name, unsigned flags))                 \
  X(madvise, ::madvise, int, (void* addr, size_t len, int advice))                                      \
  X(getrlimit, posix_default::getrlimit, int, (int resource, struct rlimit* rl))                        \
  X(sysconf, ::sysconf, long, (int name))                                                               \
  X(getpid, ::getpid, pid_t, ())                                                                        \
  X(opendir, ::opendir, DIR*, (const char* path))                                                       \
  X(readdir, ::readdir, struct dirent*, (DIR* dir))                                                     \
  X(closedir, ::closedir, int, (DIR* dir))                                                              \
  /* the file system a file is on (is it local?) and the clock its change times come from */          \
  X(fstatfs, ::fstatfs, int, (int fd, struct statfs* st))                                               \
  X(clock_gettime, ::clock_gettime, int, (clockid_t clock, struct timespec* ts))                       \
  /* Linux; ENOSYS elsewhere: clean pages before a verification is recorded */                         \
  X(sync_file_range, posix_default::sync_file_range, int, (int fd, off_t off, off_t n, unsigned flags)) \
  /* Linux; ENOTSUP elsewhere: does a lock file carry an access control list? */                        \
  X(fgetxattr, posix_default::fgetxattr, ssize_t, (int fd, const char* name, void* value, size_t size))    \
  /* verification records of files on read-only mounts: their directory, and whose it is */           \
  X(mkdir, ::mkdir, int, (const char* path, mode_t mode))                                               \
  X(geteuid, ::geteuid, uid_t, ())

namespace weightcache::platform {

// PosixCalls (the table), PosixCall (an enumerator per entry: PosixCall::open), kPosixCallCount,
// call_name(PosixCall) ("open", "posix_fallocate", ...) and for_each_posix_call.
#define WC_CALL_TABLE_CONV
WC_CALL_TABLE(PosixCalls, PosixCall, kPosixCallCount, for_each_posix_call, WC_POSIX_CALLS, WC_CALL_TABLE_NAME_IS_ENTRY)
#undef WC_CALL_TABLE_CONV

/// The table in use (mutable for tests; swap entries only while no cache is open).
PosixCalls& posix_calls() noexcept;
/// The libc defaults.
const PosixCalls& default_posix_calls() noexcept;

}  // namespace weightcache::platform
