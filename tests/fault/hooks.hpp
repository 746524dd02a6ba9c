// Syscall-level hooks over platform::posix_calls() for fault injection and crash simulation.
// Installed for the life of a Hooks object; everything the platform layer does to the OS passes
// here. Not the std::filesystem calls of src/core.cpp, src/registry.cpp and src/gc.cpp (symlink
// resolution, removal of stale temporaries, canonical paths, gc's listing of a directory): those
// fail into their error_code paths unseen.
#pragma once

#include "platform/posix_calls.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace wctest {

// Every entry of the call table that can fail. Not here: getpid, which cannot, and
// sysconf(_SC_PAGESIZE), which cannot where mmap exists and is asked once per process.
enum class Call { open, close, fstat, pread, pwrite, fallocate, ftruncate, fdatasync, fsync, rename, mmap, munmap,
                  mprotect, msync, flock, stat, lstat, fcntl, fcntl_lock, unlink, futimens, memfd_create, madvise,
                  getrlimit, lseek, ioctl };
inline constexpr int kCallCount = static_cast<int>(Call::ioctl) + 1;

inline const char* call_name(Call c) {
  static const char* names[] = {"open",   "close",  "fstat",    "pread", "pwrite", "fallocate", "ftruncate",
                                "fdatasync", "fsync", "rename", "mmap", "munmap", "mprotect", "msync",
                                "flock",  "stat",   "lstat",    "fcntl", "fcntl_lock", "unlink", "futimens", "memfd_create",
                                "madvise",   "getrlimit", "lseek", "ioctl"};
  static_assert(sizeof(names) / sizeof(names[0]) == kCallCount);
  return names[static_cast<int>(c)];
}

// What to do with one call: run it, fail it with an errno, or (pwrite only) write half.
struct Decision {
  enum Kind { pass, fail, short_write } kind = pass;
  int err = 0;
};

// The interposer: a single global instance, since the call table is global.
class Hooks {
 public:
  using Policy = std::function<Decision(Call, std::uint64_t index)>;
  // Called after a successful call (for recording); fd/addr context in arguments.
  using Observer = std::function<void(Call, int fd, const void* addr, std::size_t len, std::int64_t off, int flags)>;

  explicit Hooks(Policy policy, Observer observer = nullptr) {
    instance() = this;
    policy_ = std::move(policy);
    observer_ = std::move(observer);
    auto& t = weightcache::platform::posix_calls();
    t.open = [](const char* p, int f, mode_t m) -> int {
      if (auto d = decide(Call::open); d.kind != Decision::pass) return (errno = d.err, -1);
      int fd = weightcache::platform::default_posix_calls().open(p, f, m);
      if (fd >= 0) instance()->note_open(fd, p);
      return fd;
    };
    t.close = [](int fd) -> int {
      instance()->note_close(fd);
      const Decision d = decide(Call::close);
      const int r = weightcache::platform::default_posix_calls().close(fd);
      if (d.kind != Decision::pass) return (errno = d.err, -1);  // as Linux: released all the same
      return r;
    };
    t.fstat = [](int fd, struct stat* st) -> int {
      if (auto d = decide(Call::fstat); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().fstat(fd, st);
    };
    t.pread = [](int fd, void* b, size_t n, off_t o) -> ssize_t {
      if (auto d = decide(Call::pread); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().pread(fd, b, n, o);
    };
    t.pwrite = [](int fd, const void* b, size_t n, off_t o) -> ssize_t {
      auto d = decide(Call::pwrite);
      if (d.kind == Decision::fail) return (errno = d.err, -1);
      if (d.kind == Decision::short_write && n > 1) n /= 2;
      ssize_t r = weightcache::platform::default_posix_calls().pwrite(fd, b, n, o);
      if (r > 0) instance()->observe(Call::pwrite, fd, b, static_cast<size_t>(r), o, 0);
      return r;
    };
    t.posix_fallocate = [](int fd, off_t o, off_t l) -> int {
      if (auto d = decide(Call::fallocate); d.kind != Decision::pass) return d.err;
      return weightcache::platform::default_posix_calls().posix_fallocate(fd, o, l);
    };
    t.ftruncate = [](int fd, off_t l) -> int {
      if (auto d = decide(Call::ftruncate); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().ftruncate(fd, l);
    };
    t.fdatasync = [](int fd) -> int {
      if (auto d = decide(Call::fdatasync); d.kind != Decision::pass) return (errno = d.err, -1);
      int r = weightcache::platform::default_posix_calls().fdatasync(fd);
      if (r == 0) instance()->observe(Call::fdatasync, fd, nullptr, 0, 0, 0);
      return r;
    };
    t.fsync = [](int fd) -> int {
      if (auto d = decide(Call::fsync); d.kind != Decision::pass) return (errno = d.err, -1);
      int r = weightcache::platform::default_posix_calls().fsync(fd);
      if (r == 0) instance()->observe(Call::fsync, fd, nullptr, 0, 0, 0);
      return r;
    };
    t.rename = [](const char* a, const char* b) -> int {
      if (auto d = decide(Call::rename); d.kind != Decision::pass) return (errno = d.err, -1);
      int r = weightcache::platform::default_posix_calls().rename(a, b);
      if (r == 0) instance()->note_rename(a, b);
      return r;
    };
    t.mmap = [](void* a, size_t l, int p, int f, int fd, off_t o) -> void* {
      // Anonymous reservations are not the cache file: let them through so the run gets going,
      // but still count them so a sweep can fail them.
      if (auto d = decide(Call::mmap); d.kind != Decision::pass) return (errno = d.err, MAP_FAILED);
      void* r = weightcache::platform::default_posix_calls().mmap(a, l, p, f, fd, o);
      if (r != MAP_FAILED && fd >= 0) instance()->note_map(r, l, fd, o);
      return r;
    };
    t.munmap = [](void* a, size_t l) -> int {
      (void)decide(Call::munmap);  // never fail an unmap: a leak, not a fault worth modelling
      return weightcache::platform::default_posix_calls().munmap(a, l);
    };
    t.mprotect = [](void* a, size_t l, int p) -> int {
      if (auto d = decide(Call::mprotect); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().mprotect(a, l, p);
    };
    t.msync = [](void* a, size_t l, int f) -> int {
      if (auto d = decide(Call::msync); d.kind != Decision::pass) return (errno = d.err, -1);
      int r = weightcache::platform::default_posix_calls().msync(a, l, f);
      if (r == 0) instance()->observe_msync(a, l, f);
      return r;
    };
    t.flock = [](int fd, int op) -> int {
      if (auto d = decide(Call::flock); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().flock(fd, op);
    };
    t.stat = [](const char* p, struct stat* st) -> int {
      if (auto d = decide(Call::stat); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().stat(p, st);
    };
    t.lstat = [](const char* p, struct stat* st) -> int {
      if (auto d = decide(Call::lstat); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().lstat(p, st);
    };
    t.fcntl = [](int fd, int cmd, int arg) -> int {
      if (auto d = decide(Call::fcntl); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().fcntl(fd, cmd, arg);
    };
    t.futimens = [](int fd, const struct timespec times[2]) -> int {
      if (auto d = decide(Call::futimens); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().futimens(fd, times);
    };
    t.memfd_create = [](const char* name, unsigned flags) -> int {
      if (auto d = decide(Call::memfd_create); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().memfd_create(name, flags);
    };
    t.fcntl_lock = [](int fd, int cmd, struct flock* lock) -> int {
      if (auto d = decide(Call::fcntl_lock); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().fcntl_lock(fd, cmd, lock);
    };
    t.unlink = [](const char* p) -> int {
      if (auto d = decide(Call::unlink); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().unlink(p);
    };
    t.madvise = [](void* a, size_t l, int advice) -> int {
      if (auto d = decide(Call::madvise); d.kind != Decision::pass) return (errno = d.err, -1);
      // Observed whenever it reaches the OS, with the advice in `flags`: the result of an advice
      // is the caller's business (an old kernel refuses MADV_POPULATE_READ).
      instance()->observe(Call::madvise, -1, a, l, 0, advice);
      return weightcache::platform::default_posix_calls().madvise(a, l, advice);
    };
    t.lseek = [](int fd, off_t o, int whence) -> off_t {
      if (auto d = decide(Call::lseek); d.kind != Decision::pass) return (errno = d.err, -1);
      const off_t r = weightcache::platform::default_posix_calls().lseek(fd, o, whence);
      if (r >= 0) instance()->observe(Call::lseek, fd, nullptr, 0, r, whence);
      return r;
    };
    t.ioctl = [](int fd, unsigned long request, void* arg) -> int {
      if (auto d = decide(Call::ioctl); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().ioctl(fd, request, arg);
    };
    t.getrlimit = [](int resource, struct rlimit* rl) -> int {
      if (auto d = decide(Call::getrlimit); d.kind != Decision::pass) return (errno = d.err, -1);
      return weightcache::platform::default_posix_calls().getrlimit(resource, rl);
    };
  }

  ~Hooks() {
    weightcache::platform::posix_calls() = weightcache::platform::default_posix_calls();
    instance() = nullptr;
  }
  Hooks(const Hooks&) = delete;
  Hooks& operator=(const Hooks&) = delete;

  std::uint64_t calls() const { return counter_.load(); }
  // Path of an open descriptor ("" if unknown).
  std::string path_of(int fd) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = fds_.find(fd);
    return it == fds_.end() ? std::string() : it->second;
  }
  // File offset behind a mapped address, if it is inside a file mapping.
  bool file_of(const void* addr, int* fd, std::int64_t* off) {
    std::lock_guard<std::mutex> l(mu_);
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    auto it = maps_.upper_bound(a);
    if (it == maps_.begin()) return false;
    --it;
    if (a >= it->first + it->second.len) return false;
    *fd = it->second.fd;
    *off = it->second.off + static_cast<std::int64_t>(a - it->first);
    return true;
  }

 private:
  struct Map {
    std::size_t len;
    int fd;
    std::int64_t off;
  };

  static Hooks*& instance() {
    static Hooks* h = nullptr;
    return h;
  }
  static Decision decide(Call c) {
    Hooks* h = instance();
    const std::uint64_t i = h->counter_.fetch_add(1) + 1;
    return h->policy_ ? h->policy_(c, i) : Decision{};
  }
  void observe(Call c, int fd, const void* a, std::size_t l, std::int64_t o, int f) {
    if (observer_) observer_(c, fd, a, l, o, f);
  }
  void observe_msync(void* a, std::size_t l, int f) {
    if (observer_) observer_(Call::msync, -1, a, l, 0, f);
  }
  void note_open(int fd, const char* p) {
    std::lock_guard<std::mutex> l(mu_);
    fds_[fd] = p;
  }
  void note_close(int fd) {
    std::lock_guard<std::mutex> l(mu_);
    fds_.erase(fd);
  }
  void note_rename(const char* a, const char* b) {
    if (rename_observer_) rename_observer_(a, b);
  }
  void note_map(void* a, std::size_t l, int fd, std::int64_t o) {
    std::lock_guard<std::mutex> lk(mu_);
    maps_[reinterpret_cast<std::uintptr_t>(a)] = Map{l, fd, o};
  }

 public:
  std::function<void(const std::string&, const std::string&)> rename_observer_;

 private:
  Policy policy_;
  Observer observer_;
  std::atomic<std::uint64_t> counter_{0};
  std::mutex mu_;
  std::map<int, std::string> fds_;
  std::map<std::uintptr_t, Map> maps_;
};

}  // namespace wctest
