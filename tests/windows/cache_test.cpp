// The cache on the Win32 backend, through the public API: round trips through the file,
// alignment up to the 64 KiB allocation granularity, a second process mapping the same file
// while the first holds it (the "Access is denied" a narrower share mode gives), heap fallback
// when the file cannot be opened or mapped, files past 4 GiB, and the legacy mapping mode.
#include "core.hpp"
#include "forwarding_platform.hpp"
#include "temp_dir.hpp"
#include "windows_test_util.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace weightcache::test {
namespace {

const std::string kChild = win_child_exe();

using Item = PatternEntry;

std::vector<Item> items() {
  std::vector<Item> v;
  const std::size_t sizes[] = {1, 100, 4096, 65535, 65536, 65537, 300000, 2u << 20};
  std::uint64_t seed = 1000;
  for (std::size_t s : sizes) v.push_back({"entry/" + std::to_string(s), seed++, s});
  return v;
}

std::size_t put(WeightCache& cache, const Item& it) { return pack_entry(cache, it); }

::testing::AssertionResult serves(WeightCache& cache, const Item& it, std::size_t align = 1) {
  const std::string problem = entry_problem(cache, it, align);
  if (!problem.empty()) return ::testing::AssertionFailure() << problem;
  return ::testing::AssertionSuccess();
}

TEST(WindowsCache, RoundTripThroughTheFile) {
  TempDir dir("wc-win-cache");
  const std::string path = dir.file("cache.wcache");
  {
    auto cache = WeightCache::open(suite_options(path));
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_EQ(cache->stats().backing, Backing::file);
    for (const auto& it : items()) ASSERT_NE(put(*cache, it), kNotFound) << it.key << ": " << last_error().message;
    auto r = cache->finalize();
    ASSERT_TRUE(r) << r.error().message;
    for (const auto& it : items()) EXPECT_TRUE(serves(*cache, it));
  }
  auto cache = WeightCache::open(suite_options(path));
  ASSERT_TRUE(cache) << cache.error().message;
  const Stats s = cache->stats();
  EXPECT_EQ(s.backing, Backing::file);
  EXPECT_EQ(s.entries, items().size());
  EXPECT_EQ(s.heap_bytes, 0u);
  for (const auto& it : items()) EXPECT_TRUE(serves(*cache, it));
}

TEST(WindowsCache, EveryDurabilityLevelPersists) {
  for (Durability d : {Durability::none, Durability::async, Durability::full}) {
    SCOPED_TRACE(static_cast<int>(d));
    TempDir dir("wc-win-cache");
    Options o = suite_options(dir.file("cache.wcache"));
    o.durability = d;
    {
      auto cache = WeightCache::open(o);
      ASSERT_TRUE(cache) << cache.error().message;
      for (const auto& it : items()) ASSERT_NE(put(*cache, it), kNotFound) << last_error().message;
      auto r = cache->finalize();
      ASSERT_TRUE(r) << r.error().message;
    }
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    for (const auto& it : items()) EXPECT_TRUE(serves(*cache, it));
  }
}

TEST(WindowsCache, AlignmentUpToTheAllocationGranularity) {
  for (std::size_t align : {std::size_t{64}, std::size_t{4096}, std::size_t{65536}}) {
    SCOPED_TRACE(align);
    TempDir dir("wc-win-cache");
    Options o = suite_options(dir.file("cache.wcache"));
    o.alignment = align;
    {
      auto cache = WeightCache::open(o);
      ASSERT_TRUE(cache) << cache.error().message;
      for (const auto& it : items()) {
        ASSERT_NE(put(*cache, it), kNotFound) << last_error().message;
        EXPECT_TRUE(serves(*cache, it, align));
      }
      ASSERT_TRUE(cache->finalize());
    }
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    for (const auto& it : items()) EXPECT_TRUE(serves(*cache, it, align));
  }
}

TEST(WindowsCache, Utf8PathRoundTrip) {
  TempDir dir("wc-win-cache");
  const std::string name = "mod\xC3\xA8le-\xE6\xA8\xA1\xE5\x9E\x8B.wcache";  // modèle-模型
  const std::string path = dir.file(name);
  const Item it{"w", 5, 5000};
  {
    auto cache = WeightCache::open(suite_options(path));
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_EQ(cache->stats().backing, Backing::file);
    ASSERT_NE(put(*cache, it), kNotFound);
    ASSERT_TRUE(cache->finalize());
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() / std::filesystem::u8path(name)));
  auto cache = WeightCache::open(suite_options(path));
  ASSERT_TRUE(cache) << cache.error().message;
  EXPECT_TRUE(serves(*cache, it));
}

// The same with allow_symlink, where the core resolves the path itself before opening it: the
// UTF-8 must survive that too (std::filesystem reads a narrow string in the ANSI code page).
TEST(WindowsCache, Utf8PathRoundTripWithAllowSymlink) {
  ::testing::Test::RecordProperty("ansi_code_page", std::to_string(::GetACP()));
  TempDir dir("wc-win-cache");
  const std::string name = "mod\xC3\xA8le-\xE6\xA8\xA1\xE5\x9E\x8B.wcache";  // modèle-模型
  const std::string path = dir.file(name);
  Options o = suite_options(path);
  o.allow_symlink = true;
  const Item it{"w", 5, 5000};
  {
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_EQ(cache->stats().backing, Backing::file);
    ASSERT_NE(put(*cache, it), kNotFound);
    ASSERT_TRUE(cache->finalize());
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() / std::filesystem::u8path(name)))
      << "code page " << ::GetACP();
  auto cache = WeightCache::open(o);
  ASSERT_TRUE(cache) << cache.error().message;
  EXPECT_TRUE(serves(*cache, it));
}

// LiteRT-LM#2572: a second consumer mapping the cache file while the first holds it open and
// mapped got "Access is denied". Here the second one is another process, read-write and
// read-only, and both sides keep writing.
TEST(WindowsCache, SecondProcessMapsTheFileWhileWeHoldIt) {
  TempDir dir("wc-win-cache");
  const std::string path = dir.file("shared.wcache");
  auto cache = WeightCache::open(suite_options(path));
  ASSERT_TRUE(cache) << cache.error().message;
  const Item mine{"parent", 11, 200000};
  ASSERT_NE(put(*cache, mine), kNotFound);
  ASSERT_TRUE(cache->finalize());

  EXPECT_EQ(run_child(kChild, {"expect", path, mine.key, "11", "200000"}), 0);
  EXPECT_EQ(run_child(kChild, {"expect", path, mine.key, "11", "200000", "ro"}), 0);
  EXPECT_EQ(run_child(kChild, {"add", path, "child", "12", "80000"}), 0);

  // The child's entry reaches us through refresh, while our own mapping stays valid.
  ASSERT_TRUE(cache->refresh());
  EXPECT_TRUE(serves(*cache, {"child", 12, 80000}));
  EXPECT_TRUE(serves(*cache, mine));

  // And ours reaches a new child after it grew the file.
  const Item more{"parent2", 13, 1500000};
  ASSERT_NE(put(*cache, more), kNotFound) << last_error().message;
  auto r = cache->finalize();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(run_child(kChild, {"expect", path, more.key, "13", "1500000", "ro"}), 0);
  EXPECT_EQ(run_child(kChild, {"expect", path, "child", "12", "80000"}), 0);
}

TEST(WindowsCache, LegacyMappingModeRoundTrip) {
  // WEIGHTCACHE_WIN32_MAPPING=legacy forces the fallback for systems without placeholders
  // (Windows before 10 1803); under Wine 8 it is the only mode anyway. The file it writes
  // then loads in the default mode.
  TempDir dir("wc-win-cache");
  const std::string path = dir.file("legacy.wcache");
  ASSERT_EQ(run_child(kChild, {"roundtrip", path}, "WEIGHTCACHE_WIN32_MAPPING", "legacy"), 0);
  auto cache = WeightCache::open(suite_options(path));
  ASSERT_TRUE(cache) << cache.error().message;
  for (int i = 0; i < 8; ++i)
    EXPECT_TRUE(serves(*cache, {"k" + std::to_string(i), static_cast<std::uint64_t>(100 + i),
                                static_cast<std::size_t>(1000 + 30000 * i)}));
}

TEST(WindowsCache, ADirectoryAtThePathFallsBackToHeap) {
  TempDir dir("wc-win-cache");
  const std::string path = dir.file("dir.wcache");
  std::filesystem::create_directory(std::filesystem::u8path(path));
  Options o = suite_options(path);
  o.backing = Backing::automatic;
  {
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    EXPECT_EQ(cache->stats().backing, Backing::heap);
    const Item it{"h", 1, 70000};
    ASSERT_NE(put(*cache, it), kNotFound);
    EXPECT_TRUE(serves(*cache, it));
  }
  o.backing = Backing::file;
  auto strict = WeightCache::open(o);
  ASSERT_FALSE(strict);
  EXPECT_NE(strict.error().message.find("dir.wcache"), std::string::npos) << strict.error().message;
}

// Every call goes to the real backend, except map_file, which fails from the `fail_from`th
// call on: what a mapping refused by the OS (address space, quota, a file system without
// mappings) looks like to the core.
class RefusingMaps final : public ForwardingPlatform {
 public:
  explicit RefusingMaps(int fail_from) : fail_from_(fail_from) {}
  int fail_from_;
  int calls_ = 0;

  Result<void> map_file(const platform::File& h, std::uint64_t o, std::size_t n, void* at, bool w) noexcept override {
    if (++calls_ >= fail_from_) return Error{Errc::no_memory, ENOMEM, "mapping refused by the test"};
    return os_.map_file(h, o, n, at, w);
  }
};

TEST(WindowsCache, UnmappableFileFallsBackToHeap) {
  TempDir dir("wc-win-cache");
  Options o = suite_options(dir.file("cache.wcache"));
  o.backing = Backing::automatic;
  RefusingMaps pf(1);
  auto core = Core::open(o, pf);
  ASSERT_TRUE(core) << core.error().message;
  EXPECT_EQ(core.value()->stats().backing, Backing::heap);
  const std::string bytes = pattern_bytes(1, 100000);
  void* p = core.value()->reserve(bytes.size());
  ASSERT_NE(p, nullptr);
  std::memcpy(p, bytes.data(), bytes.size());
  const std::size_t off = core.value()->look_up_or_insert("k", p, bytes.size());
  ASSERT_NE(off, kNotFound);
  EXPECT_EQ(std::memcmp(core.value()->offset_to_addr(off), bytes.data(), bytes.size()), 0);

  o.backing = Backing::file;
  RefusingMaps strict(1);
  auto refused = Core::open(o, strict);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().message, "mapping refused by the test");
}

TEST(WindowsCache, GrowthThatCannotBeMappedPacksToHeap) {
  TempDir dir("wc-win-cache");
  Options o = suite_options(dir.file("cache.wcache"));
  o.backing = Backing::automatic;
  RefusingMaps pf(2);  // the first chunk maps; growth past it does not
  const Item small{"small", 1, 1000}, big{"big", 2, 3u << 20};
  {
    auto core = Core::open(o, pf);
    ASSERT_TRUE(core) << core.error().message;
    Core& c = *core.value();
    for (const Item& it : {small, big}) {
      const std::string bytes = pattern_bytes(it.seed, it.size);
      void* p = c.reserve(bytes.size());
      ASSERT_NE(p, nullptr) << last_error().message;
      std::memcpy(p, bytes.data(), bytes.size());
      const std::size_t off = c.look_up_or_insert(it.key, p, bytes.size());
      ASSERT_NE(off, kNotFound);
      EXPECT_EQ(std::memcmp(c.offset_to_addr(off), bytes.data(), bytes.size()), 0);
    }
    EXPECT_GE(c.stats().heap_fallbacks, 1u);
    EXPECT_EQ(c.stats().heap_bytes, big.size);
    // The big entry cannot be moved into the file either (growth still cannot be mapped):
    // finalize commits the small one and says the big one is not durable.
    auto fin = c.finalize();
    EXPECT_FALSE(fin.ok()) << "finalize said durable for an entry only in heap memory";
    EXPECT_EQ(c.stats().unpersisted_entries, 1u);
    EXPECT_TRUE(c.is_finalized());
  }
  // The entry that fit the mapped chunk persisted; the heap one did not.
  auto cache = WeightCache::open(suite_options(o.path));
  ASSERT_TRUE(cache) << cache.error().message;
  EXPECT_TRUE(serves(*cache, small));
  EXPECT_EQ(cache->look_up(big.key), kNotFound);
}

// An incompatible file at the path is rebuilt by renaming a fresh file over it. On Windows 10
// (NTFS) that works even while another cache in this process still maps the old file (a
// POSIX-semantics rename); Wine 8 refuses, and the cache must then fall back to heap cleanly.
TEST(WindowsCache, RebuildWhileTheOldFileIsStillMapped) {
  TempDir dir("wc-win-cache");
  const std::string path = dir.file("cache.wcache");
  auto old = WeightCache::open(suite_options(path));
  ASSERT_TRUE(old) << old.error().message;
  const Item it{"old", 1, 70000};
  ASSERT_NE(put(*old, it), kNotFound);
  ASSERT_TRUE(old->finalize());

  Options o = suite_options(path);
  o.compat_key = "another-key";
  o.backing = Backing::automatic;
  auto fresh = WeightCache::open(o);
  ASSERT_TRUE(fresh) << fresh.error().message;
  if (under_wine()) {
    EXPECT_EQ(fresh->stats().backing, Backing::heap) << "Wine 8 learnt to replace open files: update PLATFORMS.md";
  } else {
    EXPECT_EQ(fresh->stats().backing, Backing::file);
  }
  const Item n{"new", 2, 5000};
  ASSERT_NE(put(*fresh, n), kNotFound);
  EXPECT_TRUE(serves(*fresh, n));
  EXPECT_TRUE(serves(*old, it)) << "the old mapping must stay valid";
}

// A cache file past 4 GiB: one reservation that is never inserted pushes the next entry's
// offset past 2^32. Sparse under Wine; on NTFS it takes 4 GiB of disk, so a real Windows
// machine runs it only with WEIGHTCACHE_FULL=1.
TEST(WindowsCache, EntriesPastFourGiB) {
  if (!under_wine() && std::getenv("WEIGHTCACHE_FULL") == nullptr) GTEST_SKIP() << "set WEIGHTCACHE_FULL=1";
  TempDir dir("wc-win-cache");
  Options o = suite_options(dir.file("big.wcache"));
  o.max_file_bytes = std::uint64_t{8} << 30;
  o.verify = Verify::none;
  const Item distant{"far", 3, 1000};
  std::size_t far_off = 0;
  {
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    // Ends off a 64 KiB boundary, so the next small entry fits the same growth of the file.
    void* gap = cache->reserve((std::size_t{4} << 30) + 1000);
    ASSERT_NE(gap, nullptr) << last_error().message;
    far_off = put(*cache, distant);
    ASSERT_NE(far_off, kNotFound) << last_error().message;
    EXPECT_GT(far_off, std::uint64_t{1} << 32);
    auto r = cache->finalize();
    ASSERT_TRUE(r) << r.error().message;
  }
  o.read_only = true;
  auto cache = WeightCache::open(o);
  ASSERT_TRUE(cache) << cache.error().message;
  EXPECT_EQ(cache->look_up(distant.key), far_off);
  EXPECT_TRUE(serves(*cache, distant));
  EXPECT_GT(cache->stats().file_bytes, std::uint64_t{4} << 30);
}

}  // namespace
}  // namespace weightcache::test
