// Verify-ahead: with verify first_use and a large file, a background thread checksums entries
// before their first look-up. It must never change what a look-up returns: every hit is the
// committed bytes, a damaged entry is a miss counted once, and closing (at any moment) is safe.
#include "unit_test_util.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <mutex>
#include <string_view>
#include <thread>

#ifndef _WIN32
#include <sys/wait.h>
#include <unistd.h>
#endif

namespace weightcache::test {
namespace {

// 48 entries of 1 MiB: above the 16 MiB at which the thread starts.
const EntrySetSpec kBig{.seed = 71, .count = 48, .min_size = 1u << 20, .max_size = 1u << 20};

Options ahead_options(const std::string& path, bool ahead) {
  Options o = file_options(path);
  o.verify = Verify::first_use;
  o.verify_ahead = ahead;
  return o;
}

/// Writes kBig to `path`; returns the entries' file offsets.
std::vector<std::size_t> write_big(const std::string& path) {
  std::vector<std::size_t> offsets;
  WeightCache cache = open_or_fail(ahead_options(path, false));
  EXPECT_EQ(write_entry_set(cache, kBig), "");
  EXPECT_TRUE(cache.finalize().ok()) << last_error().message;
  for (std::size_t i = 0; i < kBig.count; ++i) offsets.push_back(cache.look_up(entry_key(i)));
  return offsets;
}

void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  ASSERT_TRUE(f.good());
}

bool machine_has_two_cpus() { return std::thread::hardware_concurrency() >= 2; }

TEST(VerifyAhead, ChecksEveryEntryBeforeItsFirstLookUp) {
  if (!machine_has_two_cpus()) GTEST_SKIP() << "verify-ahead runs only with two or more CPUs";
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  write_big(path);
  WeightCache cache = open_or_fail(ahead_options(path, true));
  ASSERT_TRUE(cache);
  // No look-up yet: the thread alone brings the count to every entry (ctest's timeout bounds it).
  while (cache.stats().verified_ahead < kBig.count) std::this_thread::yield();
  EXPECT_EQ(cache.stats().verified_ahead, kBig.count);
  for (std::size_t i = 0; i < kBig.count; ++i)
    EXPECT_EQ(verify_entry(cache, entry_key(i), entry_bytes(kBig, i), "entry " + std::to_string(i)), "");
  EXPECT_EQ(cache.stats().verify_failures, 0u);
  EXPECT_EQ(cache.stats().hits, kBig.count);
}

TEST(VerifyAhead, OffMeansLookUpsDoAllTheChecking) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  write_big(path);
  WeightCache cache = open_or_fail(ahead_options(path, false));
  ASSERT_TRUE(cache);
  for (std::size_t i = 0; i < kBig.count; ++i)
    EXPECT_EQ(verify_entry(cache, entry_key(i), entry_bytes(kBig, i), "entry " + std::to_string(i)), "");
  EXPECT_EQ(cache.stats().verified_ahead, 0u);
}

TEST(VerifyAhead, DamagedEntriesAreMissesCountedOnce) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const auto offsets = write_big(path);
  // One near each end: the thread starts at the end of the file, look-ups at the start.
  const std::size_t bad[] = {1, kBig.count - 2};
  for (std::size_t i : bad) flip_byte(path, offsets[i] + 1000);
  for (int round = 0; round < 3; ++round) {
    WeightCache cache = open_or_fail(ahead_options(path, true));
    ASSERT_TRUE(cache);
    for (std::size_t i = 0; i < kBig.count; ++i) {
      const bool damaged = i == bad[0] || i == bad[1];
      if (damaged) EXPECT_EQ(cache.look_up(entry_key(i)), kNotFound) << "damaged entry " << i << " was served";
      else EXPECT_EQ(verify_entry(cache, entry_key(i), entry_bytes(kBig, i), "entry " + std::to_string(i)), "");
    }
    // Looking the damaged ones up again does not count them again.
    for (std::size_t i : bad) EXPECT_EQ(cache.look_up(entry_key(i)), kNotFound);
    EXPECT_EQ(cache.stats().verify_failures, 2u);
  }
}

// The thread's verdict on an entry is counted (verified_ahead) before it is published, as a verify
// failure is: a look-up that finds the verdict and then reads the stats must find the entry
// counted. The thread is held right after it published its verdict on a damaged entry (in the
// warning it logs then) until the look-up has read the stats, so a count made after the verdict
// is never there in time.
TEST(VerifyAhead, AVerdictIsCountedBeforeALookUpCanSeeIt) {
  if (!machine_has_two_cpus()) GTEST_SKIP() << "verify-ahead runs only with two or more CPUs";
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const auto offsets = write_big(path);
  const std::size_t bad = kBig.count / 2;  // the thread starts from the middle byte: its first entry
  flip_byte(path, offsets[bad] + 1000);
  struct Hold {
    std::mutex mu;
    std::condition_variable cv;
    bool published = false, stats_read = false;
    void release() {
      std::lock_guard<std::mutex> lk(mu);
      stats_read = true;
      cv.notify_all();
    }
    ~Hold() { wc_set_log_callback(nullptr, nullptr); }
  } hold;
  wc_set_log_level(WC_LOG_WARN);
  wc_set_log_callback(
      [](void* user, wc_log_level, const char* message, size_t size) {
        if (std::string_view(message, size).find("fails its checksum") == std::string_view::npos) return;
        auto* h = static_cast<Hold*>(user);
        std::unique_lock<std::mutex> lk(h->mu);
        h->published = true;
        h->cv.notify_all();
        // Bounded, so that a look-up that never comes does not keep close waiting for the thread.
        h->cv.wait_for(lk, std::chrono::seconds(10), [&] { return h->stats_read; });
      },
      &hold);
  WeightCache cache = open_or_fail(ahead_options(path, true));
  ASSERT_TRUE(cache);
  {
    std::unique_lock<std::mutex> lk(hold.mu);
    ASSERT_TRUE(hold.cv.wait_for(lk, std::chrono::seconds(60), [&] { return hold.published; }))
        << "the verify-ahead thread never reached the damaged entry";
  }
  EXPECT_EQ(cache.look_up(entry_key(bad)), kNotFound);
  const Stats s = cache.stats();
  hold.release();
  EXPECT_EQ(s.verify_failures, 1u);
  EXPECT_GE(s.verified_ahead, 1u) << "a look-up saw the thread's verdict before the thread counted it";
}

TEST(VerifyAhead, ManyThreadsLookingUpWhileItRuns) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  write_big(path);
  WeightCache cache = open_or_fail(ahead_options(path, true));
  ASSERT_TRUE(cache);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (std::size_t n = 0; n < kBig.count; ++n) {
        const std::size_t i = (n * 7 + static_cast<std::size_t>(t) * 13) % kBig.count;  // each its own order
        if (!verify_entry(cache, entry_key(i), entry_bytes(kBig, i), "").empty()) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(cache.stats().verify_failures, 0u);
}

TEST(VerifyAhead, CloseRightAfterOpenStopsTheThread) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  write_big(path);
  for (int i = 0; i < 20; ++i) {
    WeightCache cache = open_or_fail(ahead_options(path, true));
    ASSERT_TRUE(cache);
    if (i % 2 == 1) {
      EXPECT_EQ(verify_entry(cache, entry_key(0), entry_bytes(kBig, 0), "entry 0"), "");
    }
  }
  // The file is untouched and a last open serves everything.
  WeightCache cache = open_or_fail(ahead_options(path, true));
  for (std::size_t i = 0; i < kBig.count; ++i)
    EXPECT_EQ(verify_entry(cache, entry_key(i), entry_bytes(kBig, i), "entry " + std::to_string(i)), "");
}

#ifdef __linux__
TEST(Verification, AFileCutShortUnderTheMappingGivesMissesNotSigbus) {
  // Another program truncates the file while we have it mapped (we never do: docs/DESIGN.md).
  // Touching the lost pages would raise SIGBUS in the host; verification asks the kernel first
  // (MADV_POPULATE_READ fails with EFAULT there) and serves misses. Without the verify-ahead
  // thread, so that every check comes after the cut: a cut that lands between the check and the
  // hash of an entry still faults (docs/DESIGN.md, "Known limits").
  {
    const bool ahead = false;
    TempDir dir;
    const std::string path = dir.file("cache.wcache");
    const auto offsets = write_big(path);
    WeightCache cache = open_or_fail(ahead_options(path, ahead));
    ASSERT_TRUE(cache);
    const std::size_t keep = kBig.count / 2;
    std::filesystem::resize_file(path, offsets[keep]);  // entries keep.. now lie past EOF
    for (std::size_t i = 0; i < kBig.count; ++i) {
      if (i < keep) EXPECT_EQ(verify_entry(cache, entry_key(i), entry_bytes(kBig, i), "entry " + std::to_string(i)), "");
      else EXPECT_EQ(cache.look_up(entry_key(i)), kNotFound) << "entry " << i << " past EOF was served";
    }
    EXPECT_EQ(cache.stats().verify_failures, kBig.count - keep);
  }
}
#endif

#ifndef _WIN32
TEST(VerifyAhead, AForkedChildLooksUpAndClosesWithoutTheThread) {
  // The child of a fork has the parent's entry states but not its verify-ahead thread: entries
  // the thread was hashing at the fork must not leave the child waiting forever.
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  write_big(path);
  for (int round = 0; round < 10; ++round) {
    WeightCache cache = open_or_fail(ahead_options(path, true));
    ASSERT_TRUE(cache);
    if (round % 2 == 1)  // sometimes let the thread get going first
      while (cache.stats().verified_ahead == 0 && std::thread::hardware_concurrency() >= 2) std::this_thread::yield();
    // The child allocates nothing: a parent thread may hold an allocator lock at the fork, and a
    // sanitizer's allocator, unlike glibc's, does not reset it in the child.
    std::vector<std::string> keys, bytes;
    for (std::size_t i = 0; i < kBig.count; ++i) {
      keys.push_back(entry_key(i));
      bytes.push_back(entry_bytes(kBig, i));
    }
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = kChildOk;
      {
        WeightCache mine = std::move(cache);
        for (std::size_t i = 0; i < kBig.count; ++i) {
          const std::size_t off = mine.look_up(keys[i]);
          const void* p = off == kNotFound ? nullptr : mine.offset_to_addr(off);
          if (p == nullptr || std::memcmp(p, bytes[i].data(), bytes[i].size()) != 0) code = kChildMismatch;
        }
      }  // closes the child's handle: no thread to join here
      child_exit(code);  // no message: building one allocates
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "round " << round << ": status " << status;
  }
}
#endif

}  // namespace
}  // namespace weightcache::test
