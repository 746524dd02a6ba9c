// The anonymous cache's edges on Linux (the Windows counterparts are in
// tests/windows/memory_edges_test.cpp): a cache that joins a ":memory:" cache through its
// descriptor flushes nothing, as its creator, while a cache file on disk joined the same way is
// flushed (the flush calls are counted through the call table); ":memory:" with read_only, or
// given to wc_compact, is a caller's mistake.
#include "hooks.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>

#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace {

using weightcache::Backing;
using weightcache::Errc;
using weightcache::kNotFound;
using weightcache::Options;
using weightcache::WeightCache;
using wctest::Call;
using wctest::Decision;

Options memory_options() {
  Options o;
  o.path = weightcache::kMemoryPath;
  o.compat_key = "memory-descriptor-test";
  o.backing = Backing::file;
  return o;
}

// Joins the cache on descriptor `fd` (default durability, full), inserts and finalizes a few
// times: the flush calls (msync, fdatasync, fsync) that made.
int flushes_of_a_joiner(int fd) {
  std::atomic<int> flushes{0};
  wctest::Hooks count([&](Call c, std::uint64_t) {
    if (c == Call::msync || c == Call::fdatasync || c == Call::fsync) ++flushes;
    return Decision{};
  });
  Options o = memory_options();
  o.path.clear();
  o.fd = fd;
  auto joined = WeightCache::open(o);
  EXPECT_TRUE(joined.ok()) << joined.error().message;
  if (!joined.ok()) return -1;
  for (int round = 0; round < 3; ++round) {
    const std::string bytes(70000, static_cast<char>('a' + round));
    EXPECT_NE(joined->insert("joiner/" + std::to_string(round), bytes), kNotFound)
        << weightcache::last_error().message;
    EXPECT_TRUE(joined->finalize().ok()) << weightcache::last_error().message;
  }
  return flushes.load();
}

TEST(MemoryDescriptor, AJoinerFlushesNothingAsItsCreator) {
  auto created = WeightCache::open(memory_options());
  ASSERT_TRUE(created.ok()) << created.error().message;
  ASSERT_NE(created->insert("creator", "bytes of the creator"), kNotFound);
  ASSERT_TRUE(created->finalize().ok());
  EXPECT_EQ(flushes_of_a_joiner(created->descriptor()), 0) << "a cache joined on a ':memory:' memfd flushed it";
  ASSERT_TRUE(created->refresh().ok());
  EXPECT_NE(created->look_up("joiner/2"), kNotFound);

  // The count is worth something: a cache file on disk joined the same way is flushed.
  weightcache::test::TempDir dir("wc-memory-descriptor");
  const int disk = ::open(dir.file("disk.wc").c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ASSERT_GE(disk, 0);
  EXPECT_GT(flushes_of_a_joiner(disk), 0) << "a cache file on disk was not flushed";
  ::close(disk);
}

}  // namespace
