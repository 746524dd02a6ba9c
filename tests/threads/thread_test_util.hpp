// Helpers of the in-process sharing suite: entry bytes derived from the key alone, a
// thread-safe error sink (threads record, the test thread asserts), a barrier, and the usual
// options.
#pragma once

#include "key_content.hpp"
#include "random_bytes.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <weightcache/weight_cache.hpp>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace weightcache::test {

/// Sizes from 1 byte to 64 KiB, varied so entries straddle pages and mapping boundaries.
inline std::size_t size_for(std::size_t i) { return 1 + (i * 7919 + 13) % (64 * 1024); }

/// Durability none: these tests are about concurrency, not power loss.
inline Options thread_options(const std::string& path) {
  return {.path = path, .compat_key = "threads-test", .durability = Durability::none};
}

/// A reusable barrier for `count` threads, like std::barrier without a completion. Not
/// std::barrier itself: libstdc++ 12 builds it on std::atomic::wait, whose fallback for
/// targets without a futex (mingw-w64's, on winpthreads condition variables) can miss a
/// wake-up: the suite hung under Wine with all eight threads inside std::barrier's wait.
class Barrier {
 public:
  explicit Barrier(std::size_t count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t phase = phase_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++phase_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return phase_ != phase; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const std::size_t count_;
  std::size_t arrived_ = 0;
  std::uint64_t phase_ = 0;
};

/// Failures seen on worker threads, asserted on the test thread.
class Errors {
 public:
  void add(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (list_.size() < 20) list_.push_back(std::move(what));
    ++count_;
  }
  ::testing::AssertionResult none() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (count_ == 0) return ::testing::AssertionSuccess();
    auto r = ::testing::AssertionFailure() << count_ << " failures on worker threads:";
    for (const auto& e : list_) r << "\n  " << e;
    return r;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> list_;
  std::size_t count_ = 0;
};

/// "" when `key` hits with exactly `want`, else what is wrong (thread-safe). `Cache` is a
/// WeightCache, or the Core behind one where a test opens it on a platform of its own.
template <class Cache>
std::string check_bytes(Cache& cache, const std::string& key, const std::string& want) {
  const std::size_t off = cache.look_up(key);
  if (off == kNotFound) return "'" + key + "' misses";
  const void* p = cache.offset_to_addr(off);
  if (p == nullptr) return "'" + key + "': offset_to_addr returned NULL for a hit";
  if (std::memcmp(p, want.data(), want.size()) != 0) return "'" + key + "': wrong bytes";
  return {};
}

}  // namespace weightcache::test
