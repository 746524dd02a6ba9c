// Syscall-level hooks over platform::posix_calls() for fault injection and crash simulation.
// Installed for the life of a Hooks object over every entry of the call table but the few that
// hooked() leaves out: everything else the platform layer does to the OS passes here, is counted
// and may be failed. The table's own list (WC_POSIX_CALLS) says which entries there are, so a new
// entry is hooked with nothing to add here: it fails as its result type says (-1, or a null
// pointer, with errno) unless failure() says otherwise. Not here: the std::filesystem calls of
// src/core_open.cpp and src/registry.cpp (symlink resolution, canonical paths), which fail into
// their error_code paths unseen.
#pragma once

#include "platform/posix_calls.hpp"

#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace wctest {

using Call = weightcache::platform::PosixCall;
inline constexpr int kCallCount = weightcache::platform::kPosixCallCount;
inline const char* call_name(Call c) { return weightcache::platform::call_name(c); }

// The entries the hooks leave alone: getpid, which cannot fail, and sysconf(_SC_PAGESIZE), which
// cannot where mmap exists and is asked once per process; and the directory listing (opendir,
// readdir, closedir: stale temporaries at open, gc), which the sweeps, numbered by call, were
// calibrated without.
constexpr bool hooked(Call c) {
  return c != Call::getpid && c != Call::sysconf && c != Call::opendir && c != Call::readdir && c != Call::closedir;
}

// What to do with one call: run it, fail it with an errno, or (pwrite and pwritev only) write half.
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

  explicit Hooks(Policy policy, Observer observer = nullptr) : below_(weightcache::platform::posix_calls()) {
    instance() = this;
    policy_ = std::move(policy);
    observer_ = std::move(observer);
    auto& t = weightcache::platform::posix_calls();
    weightcache::platform::for_each_posix_call([&t](auto entry) { install(t, entry, entry.member); });
    // The entries whose hook does more than fail or forward and record.
    t.close = close;
    t.pwrite = pwrite;
    t.pwritev = pwritev;
    t.munmap = munmap;
    t.clock_gettime = clock_gettime;
  }

  ~Hooks() {
    weightcache::platform::posix_calls() = below_;
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
  using Calls = weightcache::platform::PosixCalls;

  struct Map {
    std::size_t len;
    int fd;
    std::int64_t off;
  };

  static Hooks*& instance() {
    static Hooks* h = nullptr;
    return h;
  }
  // The table the hooks replaced (the libc defaults, or tests/support/page_size_shim.cpp's
  // entries over them): what a call that goes through is made with, and what comes back after.
  static const Calls& below() { return instance()->below_; }
  static Decision decide(Call c) {
    Hooks* h = instance();
    const std::uint64_t i = h->counter_.fetch_add(1) + 1;
    return h->policy_ ? h->policy_(c, i) : Decision{};
  }

  // ---- every hooked entry ----

  // Puts the generic hook in the entry's place, unless hooked() leaves the entry alone.
  template <class Entry, class R, class... A>
  static void install(Calls& t, Entry, R (*Calls::*)(A...)) {
    if constexpr (hooked(Entry::id)) t.*Entry::member = &hook<Entry::id, Entry::member, R, A...>;
  }

  // Fails the call as the policy says, or makes it and records it.
  template <Call C, auto Member, class R, class... A>
  static R hook(A... a) {
    if (const Decision d = decide(C); d.kind != Decision::pass) return failure<C, R>(d.err);
    const R r = (below().*Member)(a...);
    const int err = errno;  // the recorders must not change what the caller sees
    record<C>(r, a...);
    errno = err;
    return r;
  }

  // What the entry returns when it fails with `err`.
  template <Call C, class R>
  static R failure(int err) {
    if constexpr (C == Call::posix_fallocate) {
      return err;  // the error number itself, errno untouched
    } else {
      errno = err;
      if constexpr (C == Call::mmap) return MAP_FAILED;
      else if constexpr (std::is_pointer_v<R>) return nullptr;
      else return -1;
    }
  }

  // What the recorders (observer, descriptor paths, file mappings) learn of a call that reached
  // the OS: the entries below, each with its own arguments.
  template <Call C, class R, class... A>
  static void record(R r, [[maybe_unused]] A... a) {
    Hooks& h = *instance();
    if constexpr (C == Call::open) h.opened(r, a...);
    else if constexpr (C == Call::fdatasync || C == Call::fsync) h.synced(C, r, a...);
    else if constexpr (C == Call::rename) h.renamed(r, a...);
    else if constexpr (C == Call::mmap) h.mapped(r, a...);
    else if constexpr (C == Call::msync) h.msynced(r, a...);
    else if constexpr (C == Call::madvise) h.advised(r, a...);
    else if constexpr (C == Call::lseek) h.sought(r, a...);
  }

  void opened(int fd, const char* path, int, mode_t) {
    if (fd < 0) return;
    std::lock_guard<std::mutex> l(mu_);
    fds_[fd] = path;
  }
  void synced(Call c, int r, int fd) {
    if (r == 0) observe(c, fd, nullptr, 0, 0, 0);
  }
  void renamed(int r, const char* from, const char* to) {
    if (r == 0 && rename_observer_) rename_observer_(from, to);
  }
  void mapped(void* r, void*, size_t len, int, int, int fd, off_t off) {
    // Anonymous reservations are not the cache file (they are counted all the same, so a sweep
    // can fail them).
    if (r == MAP_FAILED || fd < 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    maps_[reinterpret_cast<std::uintptr_t>(r)] = Map{len, fd, off};
  }
  void msynced(int r, void* addr, size_t len, int flags) {
    if (r == 0) observe(Call::msync, -1, addr, len, 0, flags);
  }
  void advised(int, void* addr, size_t len, int advice) {
    // Observed whenever it reaches the OS, with the advice in `flags`: the result of an advice
    // is the caller's business (an old kernel refuses MADV_POPULATE_READ).
    observe(Call::madvise, -1, addr, len, 0, advice);
  }
  void sought(off_t r, int fd, off_t, int whence) {
    if (r >= 0) observe(Call::lseek, fd, nullptr, 0, r, whence);
  }

  // ---- the entries whose hook does more ----

  static int close(int fd) {
    {
      std::lock_guard<std::mutex> l(instance()->mu_);
      instance()->fds_.erase(fd);
    }
    const Decision d = decide(Call::close);
    const int r = below().close(fd);
    if (d.kind != Decision::pass) return (errno = d.err, -1);  // as Linux: released all the same
    return r;
  }
  static ssize_t pwrite(int fd, const void* b, size_t n, off_t o) {
    const Decision d = decide(Call::pwrite);
    if (d.kind == Decision::fail) return (errno = d.err, -1);
    if (d.kind == Decision::short_write && n > 1) n /= 2;
    const ssize_t r = below().pwrite(fd, b, n, o);
    if (r > 0) instance()->observe(Call::pwrite, fd, b, static_cast<size_t>(r), o, 0);
    return r;
  }
  static ssize_t pwritev(int fd, const struct iovec* iov, int count, off_t o) {
    const Decision d = decide(Call::pwritev);
    if (d.kind == Decision::fail) return (errno = d.err, -1);
    std::vector<struct iovec> v(iov, iov + count);
    if (d.kind == Decision::short_write) {  // the first half of the bytes, cut inside a buffer if need be
      std::size_t total = 0;
      for (const auto& b : v) total += b.iov_len;
      std::size_t keep = total / 2;
      std::size_t i = 0;
      for (; i < v.size() && keep > 0; ++i) {
        v[i].iov_len = std::min(v[i].iov_len, keep);
        keep -= v[i].iov_len;
      }
      if (i > 0) v.resize(i);
    }
    return below().pwritev(fd, v.data(), static_cast<int>(v.size()), o);
  }
  // A fixed clock, far ahead of any file's change time: whether a process may record what it
  // verified (core_trust.cpp) must not depend on how fast a run goes, or the runs of a sweep would
  // not repeat each other's calls.
  static int clock_gettime(clockid_t, struct timespec* ts) {
    if (const Decision d = decide(Call::clock_gettime); d.kind != Decision::pass) return (errno = d.err, -1);
    ts->tv_sec = 4102444800;  // 2100-01-01
    ts->tv_nsec = 0;
    return 0;
  }
  static int munmap(void* a, size_t l) {
    (void)decide(Call::munmap);  // never fail an unmap: a leak, not a fault worth modelling
    return below().munmap(a, l);
  }

  void observe(Call c, int fd, const void* a, std::size_t l, std::int64_t o, int f) {
    if (observer_) observer_(c, fd, a, l, o, f);
  }

 public:
  std::function<void(const std::string&, const std::string&)> rename_observer_;

 private:
  const Calls below_;
  Policy policy_;
  Observer observer_;
  std::atomic<std::uint64_t> counter_{0};
  std::mutex mu_;
  std::map<int, std::string> fds_;
  std::map<std::uintptr_t, Map> maps_;
};

}  // namespace wctest
