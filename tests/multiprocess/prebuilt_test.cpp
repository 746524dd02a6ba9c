// Prebuilt caches (Options::prebuilt_dir, issue 34): a read-only set of caches of one model,
// one per compatibility key, beside each process's own writable cache. Each process serves the
// file written for its key, exactly; with none, its own cache, where it packs once; a damaged
// prebuilt file never serves a changed byte; nothing outside the set is followed into it.
#include "mp_test_util.hpp"

#include <filesystem>
#include <fstream>

namespace weightcache::test::mp {
namespace {

constexpr std::size_t kSize = 16 * 1024;
constexpr std::size_t kCount = 8;

void build(const std::string& path, const std::string& compat, const std::string& tag) {
  Options o = cache_options(path);
  o.compat_key = compat;
  auto opened = WeightCache::open(o);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  for (std::size_t j = 0; j < kCount; ++j) {
    const std::string key = own_key(tag, j);
    ASSERT_NE(opened->insert(key, bytes_for_key(key, kSize)), kNotFound) << last_error().message;
  }
  ASSERT_TRUE(opened->finalize().ok()) << last_error().message;
}

void flip_byte(const std::string& path, std::uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x20));
}

class Prebuilt : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(set + "/avx512");
    build(set + "/x86-avx2.wcache", "k-avx2", "a");
    build(set + "/avx512/x86-avx512.wcache", "k-avx512", "b");  // one level down: an image volume per profile
    std::filesystem::remove(set + "/x86-avx2.wcache.lock");
    std::filesystem::remove(set + "/avx512/x86-avx512.wcache.lock");
  }

  // One fresh process opening `local` under `compat` with the set; it checks the `tag` entries
  // (all must miss with missing "all") and that it serves `expect`.
  std::map<std::string, std::uint64_t> serve(const std::string& compat, const std::string& tag,
                                             const std::string& expect, const std::string& missing = "none") {
    const std::string results = dir.file("r" + std::to_string(runs++));
    Children kids;
    kids.start("verify", {arg("path", local), arg("tag", tag), arg("count", kCount), arg("size", kSize),
                          arg("results", results), arg("mode", "shared"), arg("missing", missing), arg("compat", compat),
                          arg("prebuilt_dir", set), arg("record_dir", records), arg("expect_path", expect)});
    EXPECT_TRUE(kids.all_succeed());
    return read_results(results);
  }

  TempDir dir{"wc-prebuilt"};
  const std::string set = dir.file("set"), local = dir.file("local.wcache"), records = dir.file("records");
  int runs = 0;
};

TEST_F(Prebuilt, EachProcessServesTheFileWrittenForItsKey) {
  auto a = serve("k-avx2", "a", set + "/x86-avx2.wcache");
  EXPECT_EQ(a["hits"], kCount);
  EXPECT_EQ(a["prebuilt"], 1u);
  auto b = serve("k-avx512", "b", set + "/avx512/x86-avx512.wcache");
  EXPECT_EQ(b["hits"], kCount);
  EXPECT_EQ(b["prebuilt"], 1u);
  EXPECT_FALSE(std::filesystem::exists(local)) << "a process with a prebuilt file opened its own cache too";
  EXPECT_FALSE(std::filesystem::exists(set + "/x86-avx2.wcache.lock")) << "something was written into the set";
}

// No file of the set was written for this key: the process's own cache, where what it packs
// is kept, and the next process serves it from there.
TEST_F(Prebuilt, WithNoMatchTheProcessUsesItsOwnCacheAndPacksOnce) {
  {
    Options o = cache_options(local);
    o.compat_key = "k-amx";
    o.prebuilt_dir = set;
    auto opened = WeightCache::open(o);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    EXPECT_EQ(opened->stats().prebuilt, 0u);
    EXPECT_EQ(opened->path(), local);
    for (std::size_t j = 0; j < kCount; ++j) {
      const std::string key = own_key("c", j);
      ASSERT_EQ(opened->look_up(key), kNotFound);
      ASSERT_NE(opened->insert(key, bytes_for_key(key, kSize)), kNotFound);
    }
    ASSERT_TRUE(opened->finalize().ok());
  }
  auto r = serve("k-amx", "c", local);
  EXPECT_EQ(r["hits"], kCount);
  EXPECT_EQ(r["prebuilt"], 0u);
}

// A byte of an entry changed in the prebuilt file: that entry misses (the checksum), the rest
// are served, and no changed byte ever is.
TEST_F(Prebuilt, AChangedEntryInAPrebuiltFileIsNeverServed) {
  const std::string file = set + "/x86-avx2.wcache";
  std::uint64_t at = 0;
  for (const auto& r : decode_file(file).records)
    if (r.key == own_key("a", 2)) at = r.offset + 1000;
  ASSERT_NE(at, 0u);
  flip_byte(file, at);
  auto r = serve("k-avx2", "a", file, "2");
  EXPECT_EQ(r["prebuilt"], 1u);
  EXPECT_EQ(r["verify_failures"], 1u);
  EXPECT_EQ(r["hits"], kCount - 1);
}

// A damaged index: the commit before it, never an entry it may misplace; here that commit is the
// empty one, and a prebuilt file without entries is passed over for the process's own cache.
// A damaged header: the file cannot be used, and the process falls back to its own cache.
TEST_F(Prebuilt, ADamagedPrebuiltFileServesNoChangedByte) {
  const std::string file = set + "/x86-avx2.wcache";
  const auto size = std::filesystem::file_size(file);
  flip_byte(file, size - 40);  // in the index trailer
  auto r = serve("k-avx2", "a", local, "all");
  EXPECT_EQ(r["hits"], 0u);
  EXPECT_EQ(r["prebuilt"], 0u) << "a prebuilt file left with no entries was taken over the process's own cache";
  flip_byte(file, size - 40);
  flip_byte(file, 44);  // the compatibility key's hash in the header
  EXPECT_EQ(serve("k-avx2", "a", local, "all")["prebuilt"], 0u);
}

// A host may keep its own cache inside the set: it is never taken for a prebuilt one (which
// would make it read-only from its second launch on).
TEST_F(Prebuilt, TheProcesssOwnCacheInsideTheSetIsNotAPrebuiltOne) {
  const std::string own = set + "/own.wcache";
  for (int launch = 0; launch < 2; ++launch) {
    Options o = cache_options(own);
    o.compat_key = "k-own";
    o.prebuilt_dir = set;
    auto opened = WeightCache::open(o);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    EXPECT_EQ(opened->stats().prebuilt, 0u) << "launch " << launch;
    const std::string key = own_key("e", static_cast<std::size_t>(launch));
    ASSERT_NE(opened->insert(key, bytes_for_key(key, kSize)), kNotFound);
    EXPECT_TRUE(opened->finalize().ok()) << "launch " << launch << ": " << last_error().message;
  }
}

// A symlink in the set is not followed (it could point anywhere), nor is a missing set an error.
TEST_F(Prebuilt, ALinkInTheSetIsNotFollowedAndAMissingSetIsNoError) {
#ifndef _WIN32  // a symlink there needs a privilege
  const std::string elsewhere = dir.file("elsewhere.wcache");
  build(elsewhere, "k-arm64", "d");
  std::filesystem::create_symlink(elsewhere, set + "/arm64.wcache");
  EXPECT_EQ(serve("k-arm64", "d", local, "all")["prebuilt"], 0u);
#endif
  std::filesystem::remove_all(set);
  EXPECT_EQ(serve("k-avx2", "a", local, "all")["prebuilt"], 0u);
}

}  // namespace
}  // namespace weightcache::test::mp
