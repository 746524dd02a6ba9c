// A finalize whose last sync fails has already written its commit slot: the slot sits in the
// page cache, and another process (or a read-only handle) may load it and map up to the size it
// names. The writer reports the failure, but must never cut the file below that size afterwards
// (when it trims its preallocated tail, or at close): the reader would take SIGBUS on entries
// it was told are there.
#include "child_exit.hpp"
#include "hooks.hpp"
#include "key_content.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

namespace {

using weightcache::Backing;
using weightcache::Durability;
using weightcache::kNotFound;
using weightcache::Options;
using weightcache::WeightCache;

constexpr std::size_t kEntrySize = 3 << 20;  // big enough that the second batch grows the file

std::string key_of(int batch, int i) { return "batch" + std::to_string(batch) + "/w" + std::to_string(i); }

void insert_batch(WeightCache& c, int batch, int n) {
  for (int i = 0; i < n; ++i) {
    const std::string k = key_of(batch, i);
    void* p = c.reserve(kEntrySize);
    ASSERT_NE(p, nullptr);
    weightcache::test::fill_for_key(k, p, kEntrySize);
    ASSERT_NE(c.look_up_or_insert(k, p, kEntrySize), kNotFound);
  }
}

// Reads every entry the reader knows, in a child so that a SIGBUS is a test failure, not a crash
// of the test binary. Exits kChildOk when all bytes are right, kChildMismatch at a wrong byte or a
// miss; killed: a fault.
int read_all_in_child(WeightCache& reader, const std::vector<std::string>& keys) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& k : keys) {
      const std::size_t off = reader.look_up(k);
      const void* p = off == kNotFound ? nullptr : reader.offset_to_addr(off);
      if (p == nullptr || weightcache::test::bytes_for_key(k, kEntrySize) !=
                              std::string(static_cast<const char*>(p), kEntrySize))
        weightcache::test::child_exit(weightcache::test::kChildMismatch, "wrong bytes or a miss for " + k);
    }
    weightcache::test::child_exit(weightcache::test::kChildOk);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(VisibleSlot, AFinalizeWhoseLastSyncFailsNeverLeavesAReaderPastTheEnd) {
  weightcache::test::TempDir dir("wc-fault-visible");
  const std::string path = dir.file("cache.wc");
  Options o;
  o.path = path;
  o.backing = Backing::file;
  o.durability = Durability::full;
  o.verify_ahead = false;

  std::atomic<bool> armed{false};
  std::atomic<int> datasyncs{0};
  wctest::Hooks hooks([&](wctest::Call c, std::uint64_t) {
    // With durability full a finalize syncs twice: after the index, then after the slot. Fail
    // the second: the slot is written, but not known to be durable.
    if (armed.load() && (c == wctest::Call::fdatasync || c == wctest::Call::fsync) && ++datasyncs == 2)
      return wctest::Decision{wctest::Decision::fail, EIO};
    return wctest::Decision{};
  });

  std::vector<std::string> keys;
  {
    auto writer = WeightCache::open(o);
    ASSERT_TRUE(writer) << writer.error().message;
    insert_batch(*writer, 0, 2);
    ASSERT_TRUE(writer->finalize());
    insert_batch(*writer, 1, 4);
    armed = true;
    ASSERT_FALSE(writer->finalize()) << "the injected sync failure must be reported";
    armed = false;
    ASSERT_EQ(datasyncs.load(), 2) << "the fault was not injected where intended";

    // A read-only handle is a separate cache (its own descriptor and mappings), like another
    // process: it loads the newest slot it finds, the one whose sync failed.
    Options ro = o;
    ro.read_only = true;
    auto reader = WeightCache::open(ro);
    ASSERT_TRUE(reader) << reader.error().message;
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < (b == 0 ? 2 : 4); ++i)
        if (reader->look_up(key_of(b, i)) != kNotFound) keys.push_back(key_of(b, i));
    ASSERT_EQ(keys.size(), 6u) << "the reader should see the slot the failed finalize wrote";

    // The writer closes still holding the lease, and trims what it grew past its last good
    // commit. That cut must not reach what the reader maps.
    writer.value() = WeightCache{};
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    const std::size_t last = reader->look_up(keys.back());
    ASSERT_NE(last, kNotFound);
    EXPECT_GE(static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(last) + kEntrySize)
        << "the file was cut below an entry a reader maps";
    const int status = read_all_in_child(*reader, keys);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << (WIFSIGNALED(status) ? "reader killed by signal " + std::to_string(WTERMSIG(status))
                                : "reader found wrong bytes or a miss");
  }

  // And the file stays loadable, with every entry of the finalize that returned ok.
  auto again = WeightCache::open(o);
  ASSERT_TRUE(again) << again.error().message;
  for (int i = 0; i < 2; ++i) {
    const std::string k = key_of(0, i);
    const std::size_t off = again->look_up(k);
    ASSERT_NE(off, kNotFound) << k;
    EXPECT_EQ(std::string(static_cast<const char*>(again->offset_to_addr(off)), kEntrySize),
              weightcache::test::bytes_for_key(k, kEntrySize));
  }
}

}  // namespace
