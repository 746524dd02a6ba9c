// Cache files written on one platform load on the other (issue 7): the format is little-endian
// and page-size independent. data/linux-made.wcache comes from wc_make_golden built for Linux,
// data/windows-made.wcache from the same program built with mingw-w64 and run under Wine. This
// test is built on both platforms, so each side reads the other's file (and its own).
#include "temp_dir.hpp"
#include "windows_test_util.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace weightcache::test {
namespace {

#ifndef WEIGHTCACHE_GOLDEN_DIR
#error "WEIGHTCACHE_GOLDEN_DIR must name the directory of the golden files (see tests/windows/CMakeLists.txt)"
#endif

std::string read_all(const std::string& path) {
  std::ifstream in(std::filesystem::u8path(path), std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class GoldenFiles : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string source = std::string(WEIGHTCACHE_GOLDEN_DIR) + "/" + GetParam();
    original_ = read_all(source);
    ASSERT_FALSE(original_.empty()) << "missing golden file " << source;
    path_ = dir_.file("golden.wcache");
    std::ofstream(std::filesystem::u8path(path_), std::ios::binary) << original_;
  }

  // Every golden entry is served, aligned as the file says, with the generator's bytes.
  void expect_all_entries(WeightCache& cache) {
    for (const auto& e : golden_entries()) {
      SCOPED_TRACE(e.key);
      const std::size_t off = cache.look_up(e.key);
      ASSERT_NE(off, kNotFound);
      EXPECT_EQ(off % 4096, 0u);
      const void* p = cache.offset_to_addr(off);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
      const std::string want = pattern_bytes(e.seed, e.size);
      EXPECT_EQ(std::memcmp(p, want.data(), e.size), 0);
    }
  }

  TempDir dir_{"wc-golden-files"};
  std::string path_;
  std::string original_;
};

TEST_P(GoldenFiles, ServesEveryEntryFromTheFile) {
  auto cache = WeightCache::open(golden_options(path_));
  ASSERT_TRUE(cache) << cache.error().message;
  EXPECT_EQ(cache->stats().backing, Backing::file);
  EXPECT_EQ(cache->stats().entries, golden_entries().size());
  expect_all_entries(*cache);
  EXPECT_EQ(cache->stats().verify_failures, 0u);
}

TEST_P(GoldenFiles, ReadOnlyOpenServesAndLeavesTheFileAlone) {
  {
    Options o = golden_options(path_);
    o.read_only = true;
    o.verify = Verify::on_open;
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    EXPECT_EQ(cache->stats().backing, Backing::file);
    expect_all_entries(*cache);
    EXPECT_EQ(cache->stats().verify_failures, 0u);
  }
  EXPECT_TRUE(read_all(path_) == original_) << "a read-only open changed the file";
}

TEST_P(GoldenFiles, TakesNewEntriesAndKeepsTheOldOnes) {
  // Growing a file made elsewhere: its size need not be a multiple of the 64 KiB Windows maps by.
  const std::string added = pattern_bytes(99, 150000);
  {
    auto cache = WeightCache::open(golden_options(path_));
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_NE(cache->insert("added", added), kNotFound) << last_error().message;
    auto r = cache->finalize();
    ASSERT_TRUE(r) << r.error().message;
  }
  Options o = golden_options(path_);
  o.read_only = true;
  auto cache = WeightCache::open(o);
  ASSERT_TRUE(cache) << cache.error().message;
  expect_all_entries(*cache);
  const std::size_t off = cache->look_up("added");
  ASSERT_NE(off, kNotFound);
  EXPECT_EQ(std::memcmp(cache->offset_to_addr(off), added.data(), added.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(BothPlatforms, GoldenFiles, ::testing::Values("linux-made.wcache", "windows-made.wcache"),
                         [](const auto& info) {
                           return std::string(info.param).find("linux") == 0 ? "MadeOnLinux" : "MadeOnWindows";
                         });

}  // namespace
}  // namespace weightcache::test
