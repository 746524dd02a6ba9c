// Alignment: every region starts on the configured alignment in the process that packed it and
// in every later handle that maps the file; sizes are rounded up to size_alignment.
#include "unit_test_util.hpp"

#include <cstdint>

namespace weightcache::test {
namespace {

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

// Odd sizes on purpose: a bump allocator that forgot to align would drift off after the first.
constexpr std::size_t kSizes[] = {1, 3, 100, 4095, 4097, 70001, 0, 17};

class EveryAlignment : public ::testing::TestWithParam<int> {};

TEST_P(EveryAlignment, HonouredByReserveAndAfterReopen) {
  const std::size_t align = std::size_t{1} << GetParam();
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  Options o = file_options(path);
  o.alignment = align;

  std::vector<std::pair<std::string, std::string>> entries;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    EXPECT_EQ(cache.alignment(), align);
    for (std::size_t i = 0; i < std::size(kSizes); ++i) {
      const std::string key = "reserved/" + std::to_string(i);
      const std::string bytes = random_bytes(i + 100 * align, kSizes[i]);
      void* p = cache.reserve(bytes.size());
      ASSERT_NE(p, nullptr) << last_error().message;
      EXPECT_TRUE(aligned(p, align)) << "reserve(" << bytes.size() << ") returned " << p;
      std::memcpy(p, bytes.data(), bytes.size());
      const std::size_t off = cache.look_up_or_insert(key, p, bytes.size());
      ASSERT_NE(off, kNotFound) << last_error().message;
      EXPECT_EQ(off % align, 0u);
      entries.emplace_back(key, bytes);
    }
    // The copy path allocates too; it must align as well.
    for (std::size_t i = 0; i < std::size(kSizes); ++i) {
      const std::string key = "copied/" + std::to_string(i);
      const std::string bytes = random_bytes(i + 7 + 100 * align, kSizes[i]);
      const std::size_t off = cache.insert(key, bytes);
      ASSERT_NE(off, kNotFound) << last_error().message;
      EXPECT_TRUE(aligned(cache.offset_to_addr(off), align));
      entries.emplace_back(key, bytes);
    }
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
  }
  WeightCache cache = open_or_fail(o);  // the previous core is gone: a fresh mapping
  ASSERT_TRUE(cache);
  for (const auto& [key, bytes] : entries) {
    const std::size_t off = cache.look_up(key);
    ASSERT_NE(off, kNotFound) << key;
    EXPECT_EQ(off % align, 0u) << key;
    const void* p = cache.offset_to_addr(off);
    ASSERT_NE(p, nullptr) << key;
    EXPECT_TRUE(aligned(p, align)) << key << " at " << p;
    EXPECT_EQ(std::memcmp(p, bytes.data(), bytes.size()), 0) << key;
  }
}

INSTANTIATE_TEST_SUITE_P(PowersOfTwo, EveryAlignment, ::testing::Range(0, 17),
                         [](const auto& info) { return "align_" + std::to_string(std::size_t{1} << info.param); });

TEST(Alignment, HeapOnlyCacheHonoursAlignment) {
  for (int shift = 0; shift <= 24; shift += 4) {
    const std::size_t align = std::size_t{1} << shift;
    Options o;
    o.alignment = align;
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    for (std::size_t size : kSizes) {
      void* p = cache.reserve(size);
      ASSERT_NE(p, nullptr) << last_error().message;
      EXPECT_TRUE(aligned(p, align)) << "alignment " << align << ", reserve(" << size << ") = " << p;
    }
  }
}

// A file-backed cache whose new entries must go to the heap (here: read-only) still owes the
// alignment, also when it exceeds the mapping granularity and the file's address range is not
// a multiple of it.
TEST(Alignment, HeapEntriesOfFileBackedCacheHonourLargeAlignment) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  constexpr std::size_t kAlign = std::size_t{1} << 20;
  Options o = file_options(path);
  o.alignment = kAlign;
  o.max_file_bytes = (std::uint64_t{1} << 20) + (std::uint64_t{64} << 10);
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    ASSERT_NE(cache.insert("durable", "bytes"), kNotFound);
    ASSERT_TRUE(cache.finalize().ok());
  }
  o.read_only = true;
  WeightCache cache = open_or_fail(o);
  ASSERT_TRUE(cache);
  void* p = cache.reserve(100);
  ASSERT_NE(p, nullptr) << last_error().message;
  EXPECT_TRUE(aligned(p, kAlign)) << "heap reservation at " << p << " is not aligned to " << kAlign;
  const std::size_t off = cache.insert("heap", "entry");
  ASSERT_NE(off, kNotFound) << last_error().message;
  EXPECT_TRUE(aligned(cache.offset_to_addr(off), kAlign));
}

TEST(Alignment, SizeAlignmentRoundsRegionSizes) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  constexpr std::size_t kSizeAlign = 256;
  Options o = file_options(path);
  o.alignment = 1;  // so only size_alignment spaces the regions
  o.size_alignment = kSizeAlign;
  std::vector<std::pair<std::string, std::string>> entries;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    std::vector<std::pair<const char*, std::size_t>> regions;  // start, asked size
    for (std::size_t size : {1, 100, 255, 256, 257, 1000}) {
      auto* p = static_cast<char*>(cache.reserve(size));
      ASSERT_NE(p, nullptr) << last_error().message;
      regions.emplace_back(p, size);
      // The rounded-up tail belongs to the region: committing it in full is an in-place commit.
      const std::size_t rounded = (size + kSizeAlign - 1) / kSizeAlign * kSizeAlign;
      const std::string bytes = random_bytes(size, rounded);
      std::memcpy(p, bytes.data(), rounded);
      const std::string key = "rounded/" + std::to_string(size);
      const std::size_t off = cache.look_up_or_insert(key, p, rounded);
      ASSERT_NE(off, kNotFound) << last_error().message;
      EXPECT_EQ(cache.offset_to_addr(off), p) << "reserve(" << size << ") did not provide " << rounded << " bytes";
      entries.emplace_back(key, bytes);
    }
    std::sort(regions.begin(), regions.end());
    for (std::size_t i = 1; i < regions.size(); ++i) {
      const std::size_t rounded = (regions[i - 1].second + kSizeAlign - 1) / kSizeAlign * kSizeAlign;
      EXPECT_GE(regions[i].first - regions[i - 1].first, static_cast<std::ptrdiff_t>(rounded))
          << "a region of " << regions[i - 1].second << " bytes overlaps the next one";
    }
    ASSERT_TRUE(cache.finalize().ok());
  }
  WeightCache cache = open_or_fail(o);
  ASSERT_TRUE(cache);
  for (const auto& [key, bytes] : entries) EXPECT_EQ(verify_entry(cache, key, bytes, key), "");
}

TEST(Alignment, InvalidAlignmentsAreRejected) {
  for (std::size_t bad : {std::size_t{0}, std::size_t{3}, std::size_t{96}, kMaxAlignment * 2}) {
    Options o;
    o.alignment = bad;
    auto r = WeightCache::open(o);
    ASSERT_FALSE(r.ok()) << "alignment " << bad;
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    Options s;
    s.size_alignment = bad;
    auto rs = WeightCache::open(s);
    ASSERT_FALSE(rs.ok()) << "size_alignment " << bad;
    EXPECT_EQ(rs.error().code, Errc::invalid_argument);
  }
}

}  // namespace
}  // namespace weightcache::test
