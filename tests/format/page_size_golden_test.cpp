// Files written under one page size and pointer width open under every other (issue 15): the
// header is 4096 bytes whatever the page size, entry offsets follow the file's alignment only,
// and a finalized file ends at its footer, so the bytes a writer leaves do not depend on the
// page size or on the process being 32- or 64-bit. Mappings, msync and madvise ranges and the
// address-space reservation do (docs/PLATFORMS.md, "Architectures and page sizes").
//
// data/page-size/<system>-<processor>-<page>k.wcache were each written by this suite (the
// scenario below) in the build and page size its name gives, and committed; every run reads
// all of them back, reopens each to append, and checks that it writes the same bytes itself.
// To add or refresh one: run this suite with WEIGHTCACHE_UPDATE_GOLDEN=<the data/page-size
// directory of the source tree>, then commit the file it names.
#include "file_image.hpp"
#include "key_content.hpp"
#include "platform/platform.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#ifndef _WIN32
#include <unistd.h>
#endif

#ifndef WEIGHTCACHE_TEST_PLATFORM
#error "WEIGHTCACHE_TEST_PLATFORM must name the build's system and processor (see tests/format/CMakeLists.txt)"
#endif

namespace weightcache {
namespace {

namespace fs = std::filesystem;
using test::Bytes;

// Relative to the test's working directory (its build folder), where CMake copies the files:
// a cross build's tests run under Wine or qemu, which see the build tree, not always by the
// same absolute path.
constexpr char kGoldenDir[] = "data/page-size";

struct GoldenEntry {
  const char* key;
  std::size_t size;
  int session;  // which open wrote it
};

// Offsets (alignment 64) put entries across the 16 KiB and 64 KiB boundaries, and the second
// session appends after a footer that ends inside a page of every size: the mapping of the
// reopened file starts below its end, on a granule the writer's page size decides.
const GoldenEntry kEntries[] = {
    {"head", 100, 1},                // 4160
    {"across-16k", 20000, 1},        // 4288 .. 24288
    {"across-64k", 50000, 1},        // 24320 .. 74320
    {"after-reopen", 3000, 2},       // past the first session's footer
};

Options golden_options(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = "page-size golden";
  o.alignment = 64;
  o.size_alignment = 1;
  o.backing = Backing::file;
  return o;
}

std::size_t page_size_seen() { return platform::os().map_granularity(); }

std::string own_file_name() {
  return std::string(WEIGHTCACHE_TEST_PLATFORM) + "-" + std::to_string(page_size_seen() / 1024) + "k.wcache";
}

std::vector<fs::path> committed_files() {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(kGoldenDir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".wcache") out.push_back(it->path());
  std::sort(out.begin(), out.end());
  return out;
}

// Writes the scenario's file at `path`: two sessions, each inserting and finalizing.
::testing::AssertionResult write_scenario(const std::string& path) {
  for (const int session : {1, 2}) {
    auto cache = WeightCache::open(golden_options(path));
    if (!cache) return ::testing::AssertionFailure() << "open: " << cache.error().message;
    for (const auto& e : kEntries) {
      if (e.session != session) continue;
      if (cache->insert(e.key, test::bytes_for_key(e.key, e.size)) == kNotFound)
        return ::testing::AssertionFailure() << "insert " << e.key << ": " << last_error().message;
    }
    if (auto r = cache->finalize(); !r) return ::testing::AssertionFailure() << "finalize: " << r.error().message;
    if (cache->stats().backing != Backing::file) return ::testing::AssertionFailure() << "not file-backed";
  }
  return ::testing::AssertionSuccess();
}

// Every entry of `entries` (and nothing else) is served from the file, aligned, with its bytes.
void expect_entries(WeightCache& cache, const std::vector<GoldenEntry>& entries) {
  EXPECT_EQ(cache.stats().backing, Backing::file);
  EXPECT_EQ(cache.stats().entries, entries.size());
  for (const auto& e : entries) {
    SCOPED_TRACE(e.key);
    const std::size_t off = cache.look_up(e.key);
    ASSERT_NE(off, kNotFound);
    EXPECT_EQ(off % 64, 0u);
    const void* p = cache.offset_to_addr(off);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
    EXPECT_EQ(std::string(static_cast<const char*>(p), e.size), test::bytes_for_key(e.key, e.size));
  }
  EXPECT_EQ(cache.stats().verify_failures, 0u);
}

TEST(PageSize, TheLibrarySeesTheSystemsPageSize) {
  const std::size_t page = page_size_seen();
  std::printf("page size (mapping granularity) seen by the library: %zu bytes; pointers: %zu bits\n", page,
              sizeof(void*) * 8);
#ifndef _WIN32
  // Unless tests/support/page_size_shim.cpp stands in for a kernel with other pages.
  const char* shim = std::getenv("WEIGHTCACHE_TEST_PAGE_SIZE");
  if (shim == nullptr || *shim == '\0') {
    EXPECT_EQ(page, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
  }
#endif
  // scripts/test-arch says which page size the emulator was told to report.
  if (const char* want = std::getenv("WEIGHTCACHE_EXPECT_PAGE_SIZE"); want != nullptr && *want != '\0') {
    EXPECT_EQ(page, static_cast<std::size_t>(std::strtoull(want, nullptr, 10)));
  }
}

TEST(PageSizeGolden, WritesTheBytesOfEveryCommittedFile) {
  test::TempDir dir("wc-page-golden");
  const std::string path = dir.file("written.wcache");
  ASSERT_TRUE(write_scenario(path));
  const Bytes written = test::read_file(path);

  if (const char* update = std::getenv("WEIGHTCACHE_UPDATE_GOLDEN"); update != nullptr && *update != '\0') {
    const fs::path out = fs::path(update) / own_file_name();
    fs::copy_file(path, out, fs::copy_options::overwrite_existing);
    std::printf("wrote %s (%zu bytes)\n", out.string().c_str(), written.size());
  }

  const auto files = committed_files();
  ASSERT_FALSE(files.empty()) << "no golden files in " << kGoldenDir;
  bool own = false;
  for (const auto& f : files) {
    SCOPED_TRACE(f.filename().string());
    own = own || f.filename() == own_file_name();
    EXPECT_EQ(test::read_file(f.string()), written);
  }
  if (!own) std::printf("no committed file for this build and page size (%s)\n", own_file_name().c_str());
}

TEST(PageSizeGolden, EveryCommittedFileOpensAndTakesNewEntries) {
  const auto files = committed_files();
  ASSERT_FALSE(files.empty()) << "no golden files in " << kGoldenDir;
  const std::vector<GoldenEntry> golden(std::begin(kEntries), std::end(kEntries));
  std::vector<GoldenEntry> grown = golden;
  grown.push_back({"added-here", 70000, 3});
  for (const auto& f : files) {
    SCOPED_TRACE(f.filename().string());
    test::TempDir dir("wc-page-golden");
    const std::string path = dir.file("golden.wcache");
    const Bytes original = test::read_file(f.string());
    test::write_file(path, original);
    {
      Options o = golden_options(path);
      o.read_only = true;
      o.verify = Verify::on_open;
      auto cache = WeightCache::open(o);
      ASSERT_TRUE(cache) << cache.error().message;
      expect_entries(*cache, golden);
    }
    EXPECT_EQ(test::read_file(path), original);  // reading changed nothing
    {
      // A writer under this page size appends to a file another one left: past its footer,
      // inside a page (of any size) the file's last bytes share.
      auto cache = WeightCache::open(golden_options(path));
      ASSERT_TRUE(cache) << cache.error().message;
      const auto& e = grown.back();
      ASSERT_NE(cache->insert(e.key, test::bytes_for_key(e.key, e.size)), kNotFound) << last_error().message;
      auto r = cache->finalize();
      ASSERT_TRUE(r) << r.error().message;
      expect_entries(*cache, grown);
    }
    Options o = golden_options(path);
    o.read_only = true;
    o.verify = Verify::on_open;
    auto cache = WeightCache::open(o);
    ASSERT_TRUE(cache) << cache.error().message;
    expect_entries(*cache, grown);
    const Bytes now = test::read_file(path);
    ASSERT_GT(now.size(), original.size());
    EXPECT_TRUE(std::equal(original.begin() + 256, original.end(), now.begin() + 256))
        << "the append rewrote bytes past the header";
  }
}

}  // namespace
}  // namespace weightcache
