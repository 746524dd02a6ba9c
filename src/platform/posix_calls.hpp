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

#include <cstddef>

// The table's entries, in order, as X(name, result, parameters). The table, its enumerators, their
// names and the iteration below are all generated from this list: adding an entry here is the
// whole change (posix.cpp then refuses to compile until the entry has a default).
#define WC_POSIX_CALLS(X)                                                                               \
  X(open, int, (const char* path, int flags, mode_t mode))                                              \
  X(close, int, (int fd))                                                                               \
  X(fstat, int, (int fd, struct stat* st))                                                              \
  X(pread, ssize_t, (int fd, void* buf, size_t n, off_t off))                                           \
  X(pwrite, ssize_t, (int fd, const void* buf, size_t n, off_t off))                                    \
  /* SEEK_HOLE only: reads and writes say their offset */                                               \
  X(lseek, off_t, (int fd, off_t off, int whence))                                                      \
  /* FS_IOC_FIEMAP only */                                                                              \
  X(ioctl, int, (int fd, unsigned long request, void* arg))                                             \
  /* returns an error number, as libc's */                                                              \
  X(posix_fallocate, int, (int fd, off_t off, off_t len))                                               \
  X(ftruncate, int, (int fd, off_t len))                                                                \
  X(fdatasync, int, (int fd))                                                                           \
  X(fsync, int, (int fd))                                                                               \
  X(rename, int, (const char* from, const char* to))                                                    \
  X(mmap, void*, (void* addr, size_t len, int prot, int flags, int fd, off_t off))                      \
  X(munmap, int, (void* addr, size_t len))                                                              \
  X(mprotect, int, (void* addr, size_t len, int prot))                                                  \
  X(msync, int, (void* addr, size_t len, int flags))                                                    \
  X(flock, int, (int fd, int op))                                                                       \
  X(stat, int, (const char* path, struct stat* st))                                                     \
  X(lstat, int, (const char* path, struct stat* st))                                                    \
  /* the commands with an int argument (F_GETFL, F_SETFL) */                                            \
  X(fcntl, int, (int fd, int cmd, int arg))                                                             \
  /* F_OFD_SETLK, F_OFD_GETLK */                                                                        \
  X(fcntl_lock, int, (int fd, int cmd, struct flock* lock))                                             \
  X(unlink, int, (const char* path))                                                                    \
  X(futimens, int, (int fd, const struct timespec times[2]))                                            \
  /* Linux; ENOSYS elsewhere */                                                                         \
  X(memfd_create, int, (const char* name, unsigned flags))                                              \
  X(madvise, int, (void* addr, size_t len, int advice))                                                 \
  X(getrlimit, int, (int resource, struct rlimit* rl))                                                  \
  X(sysconf, long, (int name))                                                                          \
  X(getpid, pid_t, ())                                                                                  \
  X(opendir, DIR*, (const char* path))                                                                  \
  X(readdir, struct dirent*, (DIR* dir))                                                                \
  X(closedir, int, (DIR* dir))                                                                          \
  /* the file system a file is on (is it local?) and the clock its change times come from */          \
  X(fstatfs, int, (int fd, struct statfs* st))                                                          \
  X(clock_gettime, int, (clockid_t clock, struct timespec* ts))

namespace weightcache::platform {

struct PosixCalls {
#define WC_POSIX_CALL_MEMBER(name, result, params) result(*name) params;
  WC_POSIX_CALLS(WC_POSIX_CALL_MEMBER)
#undef WC_POSIX_CALL_MEMBER
};

/// The entries by name: PosixCall::open is PosixCalls::open.
enum class PosixCall {
#define WC_POSIX_CALL_ID(name, result, params) name,
  WC_POSIX_CALLS(WC_POSIX_CALL_ID)
#undef WC_POSIX_CALL_ID
};

#define WC_POSIX_CALL_ONE(name, result, params) +1
inline constexpr int kPosixCallCount = 0 WC_POSIX_CALLS(WC_POSIX_CALL_ONE);
#undef WC_POSIX_CALL_ONE

/// The entry's name ("open", "posix_fallocate", ...).
constexpr const char* call_name(PosixCall c) noexcept {
  constexpr const char* kNames[] = {
#define WC_POSIX_CALL_NAME(name, result, params) #name,
      WC_POSIX_CALLS(WC_POSIX_CALL_NAME)
#undef WC_POSIX_CALL_NAME
  };
  return kNames[static_cast<int>(c)];
}

/// Calls f(CallEntry<PosixCall::x, &PosixCalls::x>{}) for every entry x, in table order.
template <class F>
constexpr void for_each_posix_call(F&& f) {
#define WC_POSIX_CALL_VISIT(name, result, params) f(CallEntry<PosixCall::name, &PosixCalls::name>{});
  WC_POSIX_CALLS(WC_POSIX_CALL_VISIT)
#undef WC_POSIX_CALL_VISIT
}

/// The table in use (mutable for tests; swap entries only while no cache is open).
PosixCalls& posix_calls() noexcept;
/// The libc defaults.
const PosixCalls& default_posix_calls() noexcept;

}  // namespace weightcache::platform
