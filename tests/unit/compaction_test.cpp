// Compaction in the library: wc_compact / wc_compact_ex, and compaction at open once dead bytes
// pass the thresholds, so a cache whose entries are replaced launch after launch stays bounded.
#include "unit_test_util.hpp"

#include <weightcache/weightcache.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

namespace weightcache::test {
namespace {

constexpr const char* kKey = "compaction-test";

std::string content(const std::string& key, std::uint64_t generation, std::size_t size) {
  std::string s(size, '\0');
  std::uint64_t x = std::hash<std::string>{}(key) ^ (generation * 0x9e3779b97f4a7c15ull);
  for (auto& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

Options options_for(const std::string& path) {
  Options o = file_options(path);
  o.compat_key = kKey;
  return o;
}

// Writes `n` entries of `size` bytes, generation `g`, replacing what the keys held.
void write_generation(const Options& o, std::size_t n, std::size_t size, std::uint64_t g) {
  WeightCache c = open_or_fail(o);
  ASSERT_TRUE(c);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string key = "w" + std::to_string(i);
    ASSERT_NE(c.insert(key, content(key, g, size)), kNotFound);
  }
  auto r = c.finalize();
  ASSERT_TRUE(r.ok()) << r.error().message;
}

void expect_generation(const Options& o, std::size_t n, std::size_t size, std::uint64_t g) {
  Options ro = o;
  ro.read_only = true;
  ro.verify = Verify::on_open;
  WeightCache c = open_or_fail(ro);
  ASSERT_TRUE(c);
  EXPECT_EQ(c.stats().entries, n);
  EXPECT_EQ(c.stats().verify_failures, 0u);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string key = "w" + std::to_string(i);
    const std::size_t off = c.look_up(key);
    ASSERT_NE(off, kNotFound) << key;
    EXPECT_EQ(std::memcmp(c.offset_to_addr(off), content(key, g, size).data(), size), 0) << key;
  }
}

// Flips one byte `at` bytes into the entry under `key`, behind the library's back.
void damage_entry(const Options& o, const std::string& key, std::size_t at) {
  std::size_t off = 0;
  {
    Options ro = o;
    ro.read_only = true;
    WeightCache c = open_or_fail(ro);
    off = c.look_up(key);
    ASSERT_NE(off, kNotFound) << key;
  }
  std::FILE* f = std::fopen(o.path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, static_cast<long>(off + at), SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, static_cast<long>(off + at), SEEK_SET);  // C requires a seek between a read and a write
  std::fputc(c ^ 0x40, f);
  std::fclose(f);
}

wc_options c_options(const std::string& path, const char* key = kKey) {
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.compat_key = key;
  o.compat_key_size = std::strlen(key);
  o.durability = WC_DURABILITY_NONE;
  return o;
}

TEST(Compaction, WcCompactReclaimsReplacedEntriesAndKeepsEveryLiveOne) {
  TempDir dir;
  const std::string path = dir.file("c.wcache");
  Options o = options_for(path);
  o.compact_dead_percent = 0;  // no compaction at open: this test calls it
  write_generation(o, 16, 40000, 1);
  write_generation(o, 16, 40000, 2);  // every entry replaced: half the file is dead
  const std::uint64_t before = file_size(path);

  wc_options co = c_options(path);
  wc_compact_report r;
  wc_compact_report_init(&r);
  ASSERT_EQ(wc_compact_ex(&co, 0, &r), WC_OK) << wc_last_error();
  EXPECT_EQ(r.compacted, 1);
  EXPECT_EQ(r.entries, 16u);
  EXPECT_EQ(r.dropped_entries, 0u);
  EXPECT_EQ(r.bytes_before, before);
  EXPECT_EQ(r.bytes_after, file_size(path));
  EXPECT_LT(r.bytes_after, before * 6 / 10);
  expect_generation(o, 16, 40000, 2);

  // Nothing left to reclaim: the file is not rewritten.
  const FileState st = file_state(path);
  wc_compact_report_init(&r);
  ASSERT_EQ(wc_compact_ex(&co, 0, &r), WC_OK) << wc_last_error();
  EXPECT_EQ(r.compacted, 0);
  EXPECT_EQ(file_state(path), st);
}

TEST(Compaction, WcCompactRefusesWhileThisProcessHasTheFileOpen) {
  TempDir dir;
  const std::string path = dir.file("c.wcache");
  Options o = options_for(path);
  o.compact_dead_percent = 0;
  write_generation(o, 4, 10000, 1);
  write_generation(o, 4, 10000, 2);
  WeightCache held = open_or_fail(o);
  ASSERT_TRUE(held);
  const FileState st = file_state(path);
  wc_options co = c_options(path);
  EXPECT_EQ(wc_compact(&co), WC_ERR_BUSY);
  EXPECT_NE(std::string(wc_last_error()).find("in use"), std::string::npos) << wc_last_error();
  EXPECT_EQ(file_state(path), st);
}

TEST(Compaction, WcCompactChecksTheCompatibilityKey) {
  TempDir dir;
  const std::string path = dir.file("c.wcache");
  Options o = options_for(path);
  o.compact_dead_percent = 0;
  write_generation(o, 4, 10000, 1);
  write_generation(o, 4, 10000, 2);
  const FileState st = file_state(path);
  wc_options wrong = c_options(path, "another key");
  EXPECT_EQ(wc_compact(&wrong), WC_ERR_INCOMPATIBLE);
  EXPECT_EQ(file_state(path), st);
  wc_compact_report r;
  wc_compact_report_init(&r);
  EXPECT_EQ(wc_compact_ex(&wrong, WC_COMPACT_ANY_KEY, &r), WC_OK) << wc_last_error();
  EXPECT_EQ(r.compacted, 1);
  expect_generation(o, 4, 10000, 2);
  EXPECT_EQ(wc_compact_ex(&wrong, 1u << 7, &r), WC_ERR_INVALID_ARGUMENT);
}

TEST(Compaction, WcCompactRefusesDamagedEntriesUnlessToldToDropThem) {
  TempDir dir;
  const std::string path = dir.file("c.wcache");
  Options o = options_for(path);
  o.compact_dead_percent = 0;
  write_generation(o, 4, 10000, 1);
  write_generation(o, 4, 10000, 2);
  ASSERT_NO_FATAL_FAILURE(damage_entry(o, "w2", 100));
  const FileState st = file_state(path);
  wc_options co = c_options(path);
  EXPECT_EQ(wc_compact(&co), WC_ERR_CORRUPT);
  EXPECT_EQ(file_state(path), st) << "a refused compaction changed the file";
  wc_compact_report r;
  wc_compact_report_init(&r);
  ASSERT_EQ(wc_compact_ex(&co, WC_COMPACT_DROP_CORRUPT, &r), WC_OK) << wc_last_error();
  EXPECT_EQ(r.dropped_entries, 1u);
  EXPECT_EQ(r.entries, 3u);
  Options ro = o;
  ro.read_only = true;
  WeightCache c = open_or_fail(ro);
  EXPECT_EQ(c.look_up("w2"), kNotFound);
  for (const char* k : {"w0", "w1", "w3"}) {
    const std::size_t at = c.look_up(k);
    ASSERT_NE(at, kNotFound) << k;
    EXPECT_EQ(std::memcmp(c.offset_to_addr(at), content(k, 2, 10000).data(), 10000), 0) << k;
  }
}

TEST(Compaction, OpenCompactsOnlyOverBothThresholds) {
  TempDir dir;
  const std::string path = dir.file("c.wcache");
  Options o = options_for(path);
  o.compact_dead_percent = 0;
  write_generation(o, 8, 50000, 1);
  write_generation(o, 8, 50000, 2);  // ~400 KB dead of ~800 KB
  const FileState st = file_state(path);

  o.compact_dead_percent = 50;
  o.compact_min_dead_bytes = 1 << 20;  // more than is dead: no compaction
  { WeightCache c = open_or_fail(o); EXPECT_EQ(c.stats().compactions, 0u); }
  EXPECT_EQ(file_state(path).size, st.size);

  o.compact_min_dead_bytes = 0;
  o.compact_dead_percent = 60;  // more than the dead share: no compaction
  { WeightCache c = open_or_fail(o); EXPECT_EQ(c.stats().compactions, 0u); }
  EXPECT_EQ(file_state(path).size, st.size);

  o.compact_dead_percent = 40;
  {
    WeightCache c = open_or_fail(o);
    EXPECT_EQ(c.stats().compactions, 1u);
    EXPECT_LT(c.stats().dead_bytes, 8u * 64u);  // alignment padding only
    EXPECT_LT(c.stats().file_bytes, st.size * 6 / 10);
  }
  expect_generation(o, 8, 50000, 2);
  // A read-only open never compacts.
  write_generation(o, 8, 50000, 3);
  Options ro = o;
  ro.read_only = true;
  { WeightCache c = open_or_fail(ro); EXPECT_EQ(c.stats().compactions, 0u); }
}

// A cache whose every entry is replaced at every launch (a packer upgrade each time, the worst
// case) stays within 2.5x its live bytes with compaction at open; without it, it grows with every
// launch. (benchmarks/growth measures the same at 64 MiB with the default thresholds.)
TEST(Compaction, ReplacingEveryEntryEveryLaunchStaysBounded) {
  TempDir dir;
  constexpr std::size_t kEntries = 32, kSize = 64 * 1024;
  constexpr std::uint64_t kLive = kEntries * kSize;
  std::map<bool, std::uint64_t> largest;
  for (bool compacting : {true, false}) {
    const std::string path = dir.file(compacting ? "on.wcache" : "off.wcache");
    Options o = options_for(path);
    o.compact_min_dead_bytes = 1 << 20;  // the default 16 MiB scaled to this 2 MiB cache
    o.compact_dead_percent = compacting ? 50 : 0;
    for (std::uint64_t launch = 1; launch <= 20; ++launch) {
      write_generation(o, kEntries, kSize, launch);
      largest[compacting] = std::max(largest[compacting], file_size(path));
    }
    expect_generation(o, kEntries, kSize, 20);
  }
  EXPECT_LE(largest[true], kLive * 5 / 2) << "with compaction at open";
  EXPECT_GT(largest[false], kLive * 10) << "without it the file should have grown with every launch";
}

// A cache whose max_file_bytes is smaller than the newest commit (an explicit small value, or
// the default under a lower address-space limit) must not fall back to the older commit: as a
// writer it would commit over the newer one (the same sequence again) and cut the file below the
// other writer's data. It says the file is too large instead, and the file stays as it was.
TEST(Review, ASmallerMaxFileBytesNeverCommitsOverANewerLargerCommit) {
  TempDir dir;
  const std::string path = dir.file("big.wcache");
  Options o = options_for(path);
  o.compact_dead_percent = 0;
  write_generation(o, 1, 100, 1);
  write_generation(o, 3, 1500000, 2);  // newest commit: ~4.5 MB
  const std::string before_size = std::to_string(file_size(path));
  Options small = o;
  small.max_file_bytes = 1 << 20;
  small.backing = Backing::file;
  auto refused = WeightCache::open(small);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Errc::no_space) << refused.error().message;
  small.backing = Backing::automatic;
  {
    auto heap = WeightCache::open(small);
    ASSERT_TRUE(heap.ok()) << heap.error().message;
    EXPECT_EQ(heap->stats().backing, Backing::heap);
    ASSERT_NE(heap->insert("late", "bytes"), kNotFound);
    EXPECT_FALSE(heap->finalize().ok());
  }
  EXPECT_EQ(std::to_string(file_size(path)), before_size) << "the file was cut";
  expect_generation(o, 3, 1500000, 2);
}

// A file with nothing to reclaim but a damaged entry is not "already compact": refused, or
// rewritten without it when told to drop damaged entries.
TEST(Review, AnAlreadyCompactFileWithADamagedEntryIsNotCalledCompact) {
  TempDir dir;
  const std::string path = dir.file("c.wcache");
  Options o = options_for(path);
  o.compact_dead_percent = 0;
  write_generation(o, 3, 64 * 100, 1);
  wc_options co = c_options(path);
  ASSERT_EQ(wc_compact(&co), WC_OK);  // compact now: nothing to reclaim from here on
  ASSERT_NO_FATAL_FAILURE(damage_entry(o, "w1", 10));
  EXPECT_EQ(wc_compact(&co), WC_ERR_CORRUPT) << wc_last_error();
  wc_compact_report r;
  wc_compact_report_init(&r);
  ASSERT_EQ(wc_compact_ex(&co, WC_COMPACT_DROP_CORRUPT, &r), WC_OK) << wc_last_error();
  EXPECT_EQ(r.compacted, 1);
  EXPECT_EQ(r.dropped_entries, 1u);
  EXPECT_EQ(r.entries, 2u);
}

#ifndef _WIN32
// gc goes by what files are, not by their names: a cache called "a.lock" that a reader holds is
// not "a"'s lock file, and neither a user's "data.tmp.2024.csv" nor a cache in use called
// "model.tmp.1.wc" is a dead writer's temporary.
TEST(Review, GcNeverRemovesAFileForItsName) {
  TempDir dir;
  write_generation(options_for(dir.file("a")), 2, 1000, 1);
  write_generation(options_for(dir.file("a.lock")), 2, 1000, 2);
  write_generation(options_for(dir.file("data")), 1, 1000, 3);
  write_generation(options_for(dir.file("model.tmp.1.wc")), 2, 1000, 4);
  { std::ofstream(dir.file("data.tmp.2024.csv")) << "precious"; }
  Options ro = options_for(dir.file("a.lock"));
  ro.read_only = true;
  WeightCache reader = open_or_fail(ro);
  WeightCache writer = open_or_fail(options_for(dir.file("model.tmp.1.wc")));
  ASSERT_TRUE(reader);
  ASSERT_TRUE(writer);
  auto r = gc(dir.path().string(), 1);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(std::filesystem::exists(dir.file("a.lock"))) << "a cache in use was removed as a lock file";
  EXPECT_TRUE(std::filesystem::exists(dir.file("model.tmp.1.wc"))) << "a cache in use was removed as a temporary";
  EXPECT_TRUE(std::filesystem::exists(dir.file("data.tmp.2024.csv"))) << "a user's file was removed as a temporary";
  EXPECT_FALSE(std::filesystem::exists(dir.file("data"))) << "the unused cache should have gone";
  const std::size_t off = reader.look_up("w0");
  ASSERT_NE(off, kNotFound);
  EXPECT_EQ(std::memcmp(reader.offset_to_addr(off), content("w0", 2, 1000).data(), 1000), 0);
  ASSERT_NE(writer.insert("late", "bytes"), kNotFound);
  EXPECT_TRUE(writer.finalize().ok());
}
#endif

}  // namespace
}  // namespace weightcache::test
