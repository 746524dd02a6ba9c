// The number of OS mappings stays logarithmic in the file size (the file grows by doubling
// chunks mapped into one reserved range), and mappings live exactly as long as the cache.
#include "unit_test_util.hpp"

#ifdef __linux__
#include "smaps.hpp"

#include <fcntl.h>
#include <unistd.h>
#endif

namespace weightcache::test {
namespace {

// Mostly small regions with a sprinkling of large ones, like a model's weights; 10,000 of
// them total ~100 MiB, which keeps the test fast while forcing many growths.
std::size_t mixed_size(Rng& rng) {
  if (rng.uniform(0, 99) == 0) return static_cast<std::size_t>(rng.uniform(256 * 1024, 1024 * 1024));
  const int bits = static_cast<int>(rng.uniform(6, 13));  // 64 B .. 16 KiB, log-uniform
  return static_cast<std::size_t>(rng.uniform(std::uint64_t{1} << bits, (std::uint64_t{2} << bits) - 1));
}

TEST(Mappings, StaySmallOverTenThousandReserves) {
  constexpr std::size_t kReserves = 10000;
  constexpr std::uint64_t kMaxMappings = 40;
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  Rng rng(77);
  std::uint64_t total = 0;
  {
    WeightCache cache = open_or_fail(file_options(path));
    ASSERT_TRUE(cache);
    for (std::size_t i = 0; i < kReserves; ++i) {
      const std::size_t size = mixed_size(rng);
      auto* p = static_cast<unsigned char*>(cache.reserve(size));
      ASSERT_NE(p, nullptr) << "reserve #" << i << " (" << size << " bytes): " << last_error().message;
      // Touch both ends: every reserved byte must be backed (no SIGBUS past EOF).
      p[0] = static_cast<unsigned char>(i);
      p[size - 1] = static_cast<unsigned char>(i >> 8);
      ASSERT_NE(cache.look_up_or_insert("m/" + std::to_string(i), p, size), kNotFound) << last_error().message;
      total += size;
      if (i % 100 == 99) {
        ASSERT_LE(cache.stats().mappings, kMaxMappings) << "after " << i + 1 << " reserves";
      }
    }
    const Stats s = cache.stats();
    EXPECT_EQ(s.entries, kReserves);
    EXPECT_EQ(s.mapped_bytes, total);
    EXPECT_EQ(s.heap_bytes, 0u);
    EXPECT_EQ(s.heap_fallbacks, 0u);
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
    EXPECT_LE(cache.stats().mappings, kMaxMappings);
  }
  WeightCache cache = open_or_fail(file_options(path));
  ASSERT_TRUE(cache);
  const Stats s = cache.stats();
  EXPECT_EQ(s.entries, kReserves);
  EXPECT_LE(s.mappings, 2u) << "a reopened file should be mapped in one piece";
}

// Reads the kernel's own account of the mappings: /proc/self/smaps exists on Linux only.
#ifdef __linux__
TEST(Mappings, SmapsShowsFileMappedUntilLastClose) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  constexpr std::size_t kSize = 1 << 20;
  const std::string bytes = random_bytes(3, kSize);
  {
    WeightCache cache = open_or_fail(file_options(path, Durability::full));
    ASSERT_TRUE(cache);
    void* p = cache.reserve(kSize);
    ASSERT_NE(p, nullptr);
    std::memcpy(p, bytes.data(), kSize);
    ASSERT_NE(cache.look_up_or_insert("big", p, kSize), kNotFound);
    const SmapsUsage u = smaps_usage(path);
    EXPECT_GE(u.mappings, 1u);
    EXPECT_GE(u.rss, kSize) << "the packed bytes live in the file mapping";
    ASSERT_TRUE(cache.finalize().ok());  // durability full: written back, pages now clean
  }
  EXPECT_EQ(smaps_usage(path).mappings, 0u) << "closing the last handle must unmap the file";
  // Write back whatever the writer left dirty (finalize trims the file after its last flush, and
  // a trim dirties the partial last page), so dirty pages below can only come from the reader.
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(::fsync(fd), 0);
    ::close(fd);
  }

  WeightCache cache = open_or_fail(file_options(path));
  ASSERT_TRUE(cache);
  ASSERT_EQ(verify_entry(cache, "big", bytes, "big"), "");
  const SmapsUsage u = smaps_usage(path);
  EXPECT_GE(u.mappings, 1u);
  EXPECT_GE(u.rss, kSize) << "reading an entry maps the file's pages, no copy";
  EXPECT_EQ(u.private_dirty + u.shared_dirty, 0u) << "look-ups must not dirty the mapped pages";
  cache = WeightCache{};
  EXPECT_EQ(smaps_usage(path).mappings, 0u);
}
#endif  // __linux__

}  // namespace
}  // namespace weightcache::test
