// Every system call the POSIX platform makes, as a table of function pointers. The product path
// uses the libc defaults; fault-injection tests swap entries to fail the Nth call with EIO,
// ENOSPC, EINTR, short writes, mmap or msync failures, below the retry loops that handle them.
// posix.cpp calls the OS only through this table: a call made around it could not be failed.
#pragma once

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <dirent.h>
#include <fcntl.h>

#include <cstddef>

namespace weightcache::platform {

struct PosixCalls {
  int (*open)(const char* path, int flags, mode_t mode);
  int (*close)(int fd);
  int (*fstat)(int fd, struct stat* st);
  ssize_t (*pread)(int fd, void* buf, size_t n, off_t off);
  ssize_t (*pwrite)(int fd, const void* buf, size_t n, off_t off);
  off_t (*lseek)(int fd, off_t off, int whence);  // SEEK_HOLE only: reads and writes say their offset
  int (*ioctl)(int fd, unsigned long request, void* arg);  // FS_IOC_FIEMAP only
  int (*posix_fallocate)(int fd, off_t off, off_t len);  // returns an error number, as libc's
  int (*ftruncate)(int fd, off_t len);
  int (*fdatasync)(int fd);
  int (*fsync)(int fd);
  int (*rename)(const char* from, const char* to);
  void* (*mmap)(void* addr, size_t len, int prot, int flags, int fd, off_t off);
  int (*munmap)(void* addr, size_t len);
  int (*mprotect)(void* addr, size_t len, int prot);
  int (*msync)(void* addr, size_t len, int flags);
  int (*flock)(int fd, int op);
  int (*stat)(const char* path, struct stat* st);
  int (*lstat)(const char* path, struct stat* st);
  int (*fcntl)(int fd, int cmd, int arg);  // the commands with an int argument (F_GETFL, F_SETFL)
  int (*fcntl_lock)(int fd, int cmd, struct flock* lock);  // F_OFD_SETLK, F_OFD_GETLK
  int (*unlink)(const char* path);
  int (*futimens)(int fd, const struct timespec times[2]);
  int (*memfd_create)(const char* name, unsigned flags);  // Linux; ENOSYS elsewhere
  int (*madvise)(void* addr, size_t len, int advice);
  int (*getrlimit)(int resource, struct rlimit* rl);
  long (*sysconf)(int name);
  pid_t (*getpid)();
  DIR* (*opendir)(const char* path);
  struct dirent* (*readdir)(DIR* dir);
  int (*closedir)(DIR* dir);
};

/// The table in use (mutable for tests; swap entries only while no cache is open).
PosixCalls& posix_calls() noexcept;
/// The libc defaults.
const PosixCalls& default_posix_calls() noexcept;

}  // namespace weightcache::platform
