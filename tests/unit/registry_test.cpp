// The process-wide registry: handles on one file share one cache (one mapping per file per
// process), while private_cache opts out with an independent heap cache.
#include "unit_test_util.hpp"

#include <weightcache/weightcache.h>

namespace weightcache::test {
namespace {

TEST(Registry, HandlesOnOnePathShareEntries) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  WeightCache a = open_or_fail(file_options(path));
  ASSERT_TRUE(a);
  WeightCache b = open_or_fail(file_options(path));
  ASSERT_TRUE(b);

  const std::string bytes = random_bytes(1, 20000);
  void* p = a.reserve(bytes.size());
  ASSERT_NE(p, nullptr);
  std::memcpy(p, bytes.data(), bytes.size());
  const std::size_t off = a.look_up_or_insert("shared", p, bytes.size());
  ASSERT_NE(off, kNotFound);
  // No refresh, no finalize: the other handle sees it at once, at the same address.
  EXPECT_EQ(b.look_up("shared"), off);
  EXPECT_EQ(b.offset_to_addr(off), a.offset_to_addr(off));
  EXPECT_FALSE(b.is_finalized());

  const std::size_t off_b = b.insert("from-b", "bytes of b");
  ASSERT_NE(off_b, kNotFound);
  EXPECT_EQ(a.look_up("from-b"), off_b);
  EXPECT_EQ(a.offset_to_addr(off_b), b.offset_to_addr(off_b));
  EXPECT_EQ(a.stats().entries, 2u);
  EXPECT_EQ(b.stats().entries, 2u);
  EXPECT_EQ(a.stats().mappings, b.stats().mappings);

  // The same file by another spelling of its path is the same cache.
  WeightCache c = open_or_fail(file_options((dir.path() / "." / "cache.wcache").string()));
  ASSERT_TRUE(c);
  EXPECT_EQ(c.look_up("shared"), off);
  EXPECT_EQ(c.offset_to_addr(off), a.offset_to_addr(off));

  // A C handle joins the same cache too.
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.compat_key = "unit-test";
  o.compat_key_size = 9;
  o.durability = WC_DURABILITY_NONE;
  wc_cache* h = nullptr;
  ASSERT_EQ(wc_open(&o, &h), WC_OK) << wc_last_error();
  EXPECT_EQ(wc_look_up(h, "from-b", 6), off_b);
  EXPECT_EQ(wc_offset_to_addr(h, off_b), b.offset_to_addr(off_b));
  wc_close(h);

  // Finalizing through one handle persists what the others inserted; closing one handle leaves
  // the others' pointers valid.
  ASSERT_TRUE(b.finalize().ok()) << last_error().message;
  EXPECT_TRUE(a.is_finalized());
  b = WeightCache{};
  c = WeightCache{};
  EXPECT_EQ(std::memcmp(a.offset_to_addr(off), bytes.data(), bytes.size()), 0);
  a = WeightCache{};

  WeightCache reopened = open_or_fail(file_options(path));
  ASSERT_TRUE(reopened);
  EXPECT_EQ(verify_entry(reopened, "shared", bytes, "shared"), "");
  EXPECT_EQ(verify_entry(reopened, "from-b", "bytes of b", "from-b"), "");
}

TEST(Registry, PrivateCacheIsIndependentHeapCache) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  WeightCache shared = open_or_fail(file_options(path));
  ASSERT_TRUE(shared);
  ASSERT_NE(shared.insert("in-shared", "s"), kNotFound);

  Options po = file_options(path);
  po.private_cache = true;
  po.backing = Backing::automatic;
  WeightCache mine = open_or_fail(po);
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine.stats().backing, Backing::heap);
  EXPECT_EQ(mine.stats().entries, 0u);
  EXPECT_EQ(mine.look_up("in-shared"), kNotFound);

  const std::size_t off = mine.insert("in-private", "p");
  ASSERT_NE(off, kNotFound);
  EXPECT_EQ(shared.look_up("in-private"), kNotFound);
  EXPECT_EQ(shared.stats().entries, 1u);
  ASSERT_TRUE(mine.finalize().ok());

  // Two private handles are independent of each other as well.
  WeightCache other = open_or_fail(po);
  ASSERT_TRUE(other);
  EXPECT_EQ(other.look_up("in-private"), kNotFound);

  ASSERT_TRUE(shared.finalize().ok());
  shared = WeightCache{};
  mine = WeightCache{};
  other = WeightCache{};
  WeightCache reopened = open_or_fail(file_options(path));
  ASSERT_TRUE(reopened);
  EXPECT_NE(reopened.look_up("in-shared"), kNotFound);
  EXPECT_EQ(reopened.look_up("in-private"), kNotFound) << "a private heap cache must not reach the file";
}

}  // namespace
}  // namespace weightcache::test

namespace weightcache::test {
namespace {

TEST(Registry, SecondOpenWithStricterAlignmentIsNotGivenAWeakerCache) {
  TempDir dir;
  Options o;
  o.path = dir.file("c.wc");
  o.alignment = 64;
  auto first = open_or_fail(o);
  Options strict = o;
  strict.alignment = 4096;
  strict.backing = Backing::file;
  auto refused = WeightCache::open(strict);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Errc::incompatible);
  strict.backing = Backing::automatic;
  auto second = open_or_fail(strict);
  EXPECT_EQ(second.stats().backing, Backing::heap);
  for (int i = 0; i < 8; ++i) {
    void* p = second.reserve(100 + i);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
  }
  Options weaker = o;
  weaker.alignment = 16;
  auto third = open_or_fail(weaker);
  EXPECT_EQ(third.stats().backing, Backing::file);
  ASSERT_NE(first.insert("k", "v"), kNotFound);
  EXPECT_NE(third.look_up("k"), kNotFound);  // shared
}

}  // namespace
}  // namespace weightcache::test
