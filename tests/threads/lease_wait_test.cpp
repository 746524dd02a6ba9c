// A thread waiting for another process's writer lease (up to lease_timeout, two minutes by
// default) must not stall the reading threads of its process: look_up, offset_to_addr, stats
// and refresh go on. The lease is held here through a descriptor of our own on "<cache>.lock"
// (flock conflicts between open file descriptions even within one process), and the library's
// flock calls are observed through the platform's call table to know when the waiter waits.
#include "thread_test_util.hpp"

#include "platform/posix_calls.hpp"

#include <atomic>
#include <chrono>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace weightcache::test {
namespace {

std::atomic<int> g_busy_flocks{0};

int observing_flock(int fd, int op) {
  const int r = platform::default_posix_calls().flock(fd, op);
  if (r != 0 && errno == EWOULDBLOCK) g_busy_flocks.fetch_add(1);
  return r;
}

// Installs the observer for the life of the object (no cache may be open across either edge).
struct FlockObserver {
  FlockObserver() {
    g_busy_flocks = 0;
    platform::posix_calls().flock = &observing_flock;
  }
  ~FlockObserver() { platform::posix_calls().flock = platform::default_posix_calls().flock; }
};

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

  FlockObserver observer;
  {
    Options o = thread_options(path);
    o.lease_timeout = std::chrono::milliseconds(3000);
    auto opened = WeightCache::open(o);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    WeightCache& cache = opened.value();

    const int lease = ::open((path + ".lock").c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(lease, 0);
    ASSERT_EQ(::flock(lease, LOCK_EX | LOCK_NB), 0);

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
    while (g_busy_flocks.load() == 0 && !writer_done) std::this_thread::yield();
    const bool writer_waited = g_busy_flocks.load() > 0;

    EXPECT_EQ(check_bytes(cache, "old", old_bytes), "");
    EXPECT_EQ(cache.stats().entries, 1u);
    const bool refresh_ok = cache.refresh().ok();

    // Let go. A writer still waiting takes the lease now and packs into the file; one whose
    // wait already timed out (because refresh() could not return before) packed to the heap.
    ::flock(lease, LOCK_UN);
    ::close(lease);
    writer.join();

    ASSERT_TRUE(writer_waited) << "the writer never found the lease taken";
    EXPECT_TRUE(refresh_ok) << last_error().message;
    EXPECT_EQ(writer_fallbacks, 0u)
        << "refresh() returned only after the writer thread's lease wait timed out: it waits on the mutex the "
           "writer holds while it waits for another process's lease";
    EXPECT_EQ(check_bytes(cache, "new", bytes_for_key("new", 70000)), "");
  }
}

}  // namespace
}  // namespace weightcache::test
