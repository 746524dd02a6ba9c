// A thread waiting for another process's writer lease (up to lease_timeout, two minutes by
// default) must not stall the reading threads of its process: look_up, offset_to_addr, stats
// and refresh go on. The lease is held here through a handle of our own on "<cache>.lock"
// (tests/support/lease_probe.hpp: it conflicts with the library's lock even within one
// process), and the library's lock attempts are observed to know when the waiter waits: through
// the POSIX platform's call table, or on Windows, which has none, through a platform that
// forwards to the OS and counts (the cache is then opened on it without the registry: the
// mutexes this test is about belong to the cache, not to the registry).
#include "lease_probe.hpp"
#include "thread_test_util.hpp"

#ifdef _WIN32
#include "core.hpp"
#include "forwarding_platform.hpp"
#else
#include "platform/posix_calls.hpp"

#include <sys/file.h>
#endif

#include <atomic>
#include <chrono>
#include <thread>

namespace weightcache::test {
namespace {

std::atomic<int> g_busy_locks{0};

#ifdef _WIN32
// Counts the library's lock attempts that find the lock held.
class ObservingPlatform final : public ForwardingPlatform {
 public:
  Result<bool> try_lock(const File& h) noexcept override {
    auto r = os_.try_lock(h);
    if (r && !r.value()) g_busy_locks.fetch_add(1);
    return r;
  }
};
#else
int observing_flock(int fd, int op) {
  const int r = platform::default_posix_calls().flock(fd, op);
  if (r != 0 && errno == EWOULDBLOCK) g_busy_locks.fetch_add(1);
  return r;
}

// Installs the observer for the life of the object (no cache may be open across either edge).
struct FlockObserver {
  FlockObserver() { platform::posix_calls().flock = &observing_flock; }
  ~FlockObserver() { platform::posix_calls().flock = platform::default_posix_calls().flock; }
};
#endif

TEST(LeaseWait, ReadersOfAProcessAreNotStalledByItsThreadWaitingForTheLease) {
  TempDir dir("wc-leasewait");
  const std::string path = dir.file("cache.wcache");
  const std::string old_bytes = bytes_for_key("old", 50000);
  {
    auto w = WeightCache::open(thread_options(path));
    ASSERT_TRUE(w.ok());
    ASSERT_NE(w->insert("old", old_bytes), kNotFound);
    ASSERT_TRUE(w->finalize().ok());
  }

  g_busy_locks = 0;
  Options o = thread_options(path);
  o.lease_timeout = std::chrono::milliseconds(3000);
#ifdef _WIN32
  ObservingPlatform observer;
  auto opened = Core::open(o, observer);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  Core& cache = *opened.value();
#else
  FlockObserver observer;
  auto opened = WeightCache::open(o);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  WeightCache& cache = opened.value();
#endif

  LeaseProbe lease(path);
  ASSERT_TRUE(lease.valid());
  ASSERT_TRUE(lease.try_take());

  std::atomic<bool> writer_done{false};
  std::uint64_t writer_fallbacks = 0;
  std::thread writer([&] {
    const std::string bytes = bytes_for_key("new", 70000);
    void* p = cache.reserve(bytes.size());  // waits for the lease we hold
    if (p != nullptr) {
      std::memcpy(p, bytes.data(), bytes.size());
      (void)cache.look_up_or_insert("new", p, bytes.size());
    }
    writer_fallbacks = cache.stats().heap_fallbacks;
    writer_done = true;
  });
  // The writer has tried the lease and found it taken: it is in its wait now, and stays
  // there until we let go (or its lease_timeout passes).
  while (g_busy_locks.load() == 0 && !writer_done) std::this_thread::yield();
  const bool writer_waited = g_busy_locks.load() > 0;

  EXPECT_EQ(check_bytes(cache, "old", old_bytes), "");
  EXPECT_EQ(cache.stats().entries, 1u);
  const bool refresh_ok = cache.refresh().ok();

  // Let go. A writer still waiting takes the lease now and packs into the file; one whose
  // wait already timed out (because refresh() could not return before) packed to the heap.
  lease.release();
  writer.join();

  ASSERT_TRUE(writer_waited) << "the writer never found the lease taken";
  EXPECT_TRUE(refresh_ok) << last_error().message;
  EXPECT_EQ(writer_fallbacks, 0u)
      << "refresh() returned only after the writer thread's lease wait timed out: it waits on the mutex the "
         "writer holds while it waits for another process's lease";
  EXPECT_EQ(check_bytes(cache, "new", bytes_for_key("new", 70000)), "");
}

}  // namespace
}  // namespace weightcache::test
