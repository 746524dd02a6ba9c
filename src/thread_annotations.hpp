// Clang's thread-safety analysis (-Wthread-safety, on in every clang build): which mutex guards
// which member, and which functions must hold it, checked at compile time. Other compilers see
// plain code. std::mutex carries no annotations in libstdc++, hence the thin wrappers here.
#pragma once

#include <mutex>

#if defined(__clang__)
#define WC_TSA(x) __attribute__((x))
#else
#define WC_TSA(x)
#endif

#define WC_CAPABILITY(name) WC_TSA(capability(name))
#define WC_SCOPED_CAPABILITY WC_TSA(scoped_lockable)
#define WC_GUARDED_BY(m) WC_TSA(guarded_by(m))
#define WC_REQUIRES(...) WC_TSA(requires_capability(__VA_ARGS__))
#define WC_EXCLUDES(...) WC_TSA(locks_excluded(__VA_ARGS__))
#define WC_ACQUIRE(...) WC_TSA(acquire_capability(__VA_ARGS__))
#define WC_RELEASE(...) WC_TSA(release_capability(__VA_ARGS__))
#define WC_TRY_ACQUIRE(...) WC_TSA(try_acquire_capability(__VA_ARGS__))
#define WC_NO_THREAD_SAFETY_ANALYSIS WC_TSA(no_thread_safety_analysis)

namespace weightcache {

/// A std::mutex the analysis knows as a capability.
class WC_CAPABILITY("mutex") Mutex {
 public:
  void lock() WC_ACQUIRE() { m_.lock(); }
  void unlock() WC_RELEASE() { m_.unlock(); }
  bool try_lock() WC_TRY_ACQUIRE(true) { return m_.try_lock(); }

 private:
  std::mutex m_;
};

/// Holds a Mutex for its scope (std::lock_guard); unlock() and lock() let a holder wait without
/// it (std::unique_lock's use here: waiting for another process's lease).
class WC_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& m) WC_ACQUIRE(m) : m_(m) { m_.lock(); }
  ~MutexLock() WC_RELEASE() {
    if (owns_) m_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() WC_RELEASE() {
    m_.unlock();
    owns_ = false;
  }
  void lock() WC_ACQUIRE() {
    m_.lock();
    owns_ = true;
  }

 private:
  Mutex& m_;
  bool owns_ = true;
};

}  // namespace weightcache
