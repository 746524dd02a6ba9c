// The anonymous cache's edges on Windows (the Linux counterparts are in
// tests/fault/memory_descriptor_test.cpp): a process that joins a ":memory:" cache by its handle
// flushes nothing, as its creator (the flush calls counted through the call table); and
// ":memory:" with read_only, or given to wc_compact, is a caller's mistake.
#include "temp_dir.hpp"
#include "win32_hooks.hpp"
#include "windows_test_util.hpp"

#include "platform/platform.hpp"

#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>

namespace weightcache::test {
namespace {

using wctest::WinCall;

// Calls that write a cache's pages or metadata out to the disk, while the counter lives.
struct FlushCounter {
  std::atomic<int> flushes{0};
  wctest::Win32Hooks hooks{[this](WinCall c, std::uint64_t) {
    if (c == WinCall::flush_view_of_file || c == WinCall::flush_file_buffers) ++flushes;
    return wctest::WinDecision{};
  }};
};

// Joins the cache on `h` (default durability, full), packs entries and finalizes a few times:
// the flush calls that made.
int flushes_of_a_joiner(HANDLE h) {
  FlushCounter counter;
  auto joined = WeightCache::open(on_handle(h));
  EXPECT_TRUE(joined.ok()) << joined.error().message;
  if (!joined.ok()) return -1;
  for (int round = 0; round < 3; ++round) {
    EXPECT_NE(pack_entry(*joined, PatternEntry{"joiner/" + std::to_string(round), 500u + round, 70000}), kNotFound)
        << last_error().message;
    EXPECT_TRUE(joined->finalize().ok()) << last_error().message;
  }
  return counter.flushes.load();
}

TEST(WindowsMemory, AProcessJoiningByHandleFlushesNothingAsItsCreator) {
  warm_up();
  Options o = suite_options(kMemoryPath);
  auto created = WeightCache::open(o);
  ASSERT_TRUE(created.ok()) << created.error().message;
  for (const auto& e : shared_entries(3)) ASSERT_NE(pack_entry(*created, e), kNotFound) << last_error().message;
  ASSERT_TRUE(created->finalize().ok()) << last_error().message;
  EXPECT_EQ(flushes_of_a_joiner(static_cast<HANDLE>(created->file_handle())), 0)
      << "a cache joined by the handle of a ':memory:' file flushed it";
  ASSERT_TRUE(created->refresh().ok());
  EXPECT_EQ(entry_problem(*created, PatternEntry{"joiner/2", 502, 70000}), "");

  // The count is worth something: a cache file on disk joined the same way is flushed.
  TempDir dir;
  HANDLE disk = open_handle(dir.file("disk.wcache"), GENERIC_READ | GENERIC_WRITE, CREATE_NEW);
  ASSERT_NE(disk, INVALID_HANDLE_VALUE);
  EXPECT_GT(flushes_of_a_joiner(disk), 0) << "a cache file on disk was not flushed";
  ::CloseHandle(disk);
}

}  // namespace
}  // namespace weightcache::test
