// The in-memory index's storage (src/index_memory.hpp; docs/DESIGN.md, "The index's memory"): an
// open sizes it from the file's index at once, in a mapping of the library's own on Linux, and the
// index it builds there finds every entry as a heap-built one did.
#include "core.hpp"
#include "entry_index.hpp"
#include "forwarding_platform.hpp"
#include "key_content.hpp"
#include "cache_test_util.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace weightcache::test {
namespace {

std::string key_of(std::uint64_t i) { return "blk." + std::to_string(i / 8) + ".ffn_" + std::to_string(i % 8) + ".weight"; }

// Every key finds its entry, every offset its entry, every byte inside an entry that entry.
void expect_finds_all(EntryIndex& index, std::uint64_t n, std::uint64_t stride) {
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::string k = key_of(i);
    const Entry* e = index.find_key(k);
    ASSERT_NE(e, nullptr) << k;
    EXPECT_EQ(e->key, k);
    EXPECT_EQ(e->offset, i * stride);
    EXPECT_EQ(index.find_offset(i * stride), e) << k;
    EXPECT_EQ(index.containing(i * stride + stride / 2), e) << k;
  }
  EXPECT_EQ(index.find_key("not.a.key"), nullptr);
  EXPECT_EQ(index.live_count(), n);
}

void add(EntryIndex& index, std::uint64_t from, std::uint64_t to, std::uint64_t stride) {
  for (std::uint64_t i = from; i < to; ++i) {
    Entry* e = index.make(key_of(i));
    e->offset = i * stride;
    e->size = stride;
    index.reserve_publishes(1);
    ASSERT_EQ(index.publish(e), nullptr);
  }
}

// As an open does: the index sized for `n` entries, every entry made, then room for all, then all
// published.
void open_like(EntryIndex& index, std::uint64_t n, std::uint64_t stride) {
  std::uint64_t key_bytes = 0;
  for (std::uint64_t i = 0; i < n; ++i) key_bytes += key_of(i).size();
  index.size_hint(n, key_bytes);
  std::vector<Entry*> made;
  for (std::uint64_t i = 0; i < n; ++i) {
    Entry* e = index.make(key_of(i));
    e->offset = i * stride;
    e->size = stride;
    made.push_back(e);
  }
  index.reserve_publishes(n);
  for (Entry* e : made) ASSERT_EQ(index.publish(e), nullptr);
}

TEST(IndexMemory, AnIndexSizedByItsOpenTakesOneMappedChunkAndFindsEveryEntry) {
  constexpr std::uint64_t kEntries = 10000;
  EntryIndex index(0x1234);
  open_like(index, kEntries, 4096);
  expect_finds_all(index, kEntries, 4096);
#ifdef __linux__
  // 10,000 entries of 64 bytes in blocks, two tables of 32,768 slots, the keys and the offset
  // list: under 2 MiB, so the hint made one huge-page chunk and nothing grew past it.
  EXPECT_EQ(index.mapped_bytes(), IndexMemory::kHugeBytes);
#else
  EXPECT_EQ(index.mapped_bytes(), 0u);
#endif
}

TEST(IndexMemory, AnIndexThatGrowsOneEntryAtATimeKeepsItsStorageNearItsNeed) {
  // A writer that starts empty (no hint) and commits 100,000 entries one by one: the arena grows
  // geometrically, and a buffer it outgrew (a table, the offset list) is not given back, so the
  // bound is on the sum.
  constexpr std::uint64_t kEntries = 100000;
  EntryIndex index(7);
  add(index, 0, kEntries, 64);
  expect_finds_all(index, kEntries, 64);
#ifdef __linux__
  // Need: 64 B per entry in blocks of up to 2x, 2 tables of 262,144 slots, the keys, 16 B offsets.
  // (entries in blocks of up to twice what they hold).
  const std::size_t need = 2 * kEntries * sizeof(Entry) + 2 * (std::size_t{262144} * 8) + kEntries * (24 + 16);
  EXPECT_GT(index.mapped_bytes(), 0u) << "a 100,000-entry index never used a mapped chunk";
  EXPECT_LE(index.mapped_bytes(), 3 * need) << "the arena kept far more than the index needs";
#endif
}

TEST(IndexMemory, TheFirstInsertAfterALargeOpenAddsLittleStorage) {
  // A hostile review's finding: the arena grew each chunk from the last, so the first insert after
  // opening a 100,000-entry index added a chunk half again the size of the whole index (22 MB).
  constexpr std::uint64_t kEntries = 100000;
  EntryIndex index(3);
  open_like(index, kEntries, 64);
  const std::size_t opened = index.storage_bytes();
  // The open's storage is one chunk made for exactly this index (no block tail, no second chunk).
  EXPECT_LE(opened, kEntries * (sizeof(Entry) + 16 + 24) + 2 * (std::size_t{262144} * 8) + 8192);
  add(index, kEntries, kEntries + 1, 64);
  expect_finds_all(index, kEntries + 1, 64);
  // What one more entry may cost: the offset list grown to twice (16 bytes per entry) and a small
  // chunk for the entry and its key.
  EXPECT_LE(index.storage_bytes() - opened, 2 * kEntries * 16 + 64 * 1024)
      << "one insert after the open took " << (index.storage_bytes() - opened) << " bytes";
}

TEST(IndexMemory, ManySmallMergesDoNotLeaveACopyOfTheOffsetListEach) {
  // A refresh merges a few entries at a time (reserve_publishes with a small n): the offset list
  // must grow geometrically, not by n each time, or each merge would strand a full copy of it.
  EntryIndex index(9);
  constexpr std::uint64_t kEntries = 20000;
  add(index, 0, kEntries, 256);
  expect_finds_all(index, kEntries, 256);
#ifdef __linux__
  // 20,000 merges each stranding a copy (16 B per entry so far) would be about 3 GiB.
  EXPECT_LE(index.mapped_bytes(), std::size_t{16} << 20);
#endif
}

TEST(IndexMemory, AFileOf10000EntriesIsIndexedInOneMappedChunkByANewOpen) {
  TempDir dir;
  Options o = file_options(dir.file("big.wcache"));
  constexpr int kEntries = 10000;
  {
    auto w = WeightCache::open(o);
    ASSERT_TRUE(w.ok()) << w.error().message;
    std::string bytes(64, '\0');
    for (int i = 0; i < kEntries; ++i) {
      const std::string k = key_of(static_cast<std::uint64_t>(i));
      fill_for_key(k, bytes.data(), bytes.size());
      ASSERT_NE(w.value().look_up_or_insert(k, bytes.data(), bytes.size()), kNotFound) << k;
    }
    auto f = w.value().finalize();
    ASSERT_TRUE(f.ok()) << f.error().message;
  }
  ForwardingPlatform pf;
  auto opened = Core::open(o, pf);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  Core& core = *opened.value();
#ifdef __linux__
  EXPECT_EQ(core.index_mapped_bytes(), IndexMemory::kHugeBytes);
#endif
  for (int i = 0; i < kEntries; ++i) {
    const std::string k = key_of(static_cast<std::uint64_t>(i));
    const std::size_t off = core.look_up(k);
    ASSERT_NE(off, kNotFound) << k;
    const auto* p = static_cast<const unsigned char*>(core.offset_to_addr(off));
    ASSERT_NE(p, nullptr) << k;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(p), 64), bytes_for_key(k, 64)) << k;
  }
}

}  // namespace
}  // namespace weightcache::test
