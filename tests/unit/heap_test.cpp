// Heap-only caches, and what happens when the cache file cannot be used: automatic backing falls
// back to the heap with exactly one warning; file backing fails with a message naming the path.
#include "unit_test_util.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

namespace weightcache::test {
namespace {

// `stands_in_for_file`: a heap cache standing in for a file cache that could not be used, whose
// finalize must say the entries are not durable (they are still served from memory).
void exercise_heap_cache(WeightCache& cache, bool stands_in_for_file = false) {
  std::uint64_t total = 0;
  std::vector<std::pair<std::string, std::string>> entries;
  for (std::size_t i = 0; i < 20; ++i) {
    const std::string key = "heap/" + std::to_string(i);
    const std::string bytes = random_bytes(i, i * 997);
    if (i % 2 == 0) {
      void* p = cache.reserve(bytes.size());
      ASSERT_NE(p, nullptr) << last_error().message;
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % cache.alignment(), 0u);
      std::memcpy(p, bytes.data(), bytes.size());
      const std::size_t off = cache.look_up_or_insert(key, p, bytes.size());
      ASSERT_NE(off, kNotFound) << last_error().message;
      EXPECT_EQ(cache.offset_to_addr(off), p);
    } else {
      ASSERT_NE(cache.insert(key, bytes), kNotFound) << last_error().message;
    }
    total += bytes.size();
    entries.emplace_back(key, bytes);
  }
  for (const auto& [key, bytes] : entries) EXPECT_EQ(verify_entry(cache, key, bytes, key), "");
  EXPECT_EQ(cache.look_up("absent"), kNotFound);

  Stats s = cache.stats();
  EXPECT_EQ(s.backing, Backing::heap);
  EXPECT_EQ(s.file_bytes, 0u);
  EXPECT_EQ(s.mapped_bytes, 0u);
  EXPECT_EQ(s.entries, entries.size());
  EXPECT_EQ(s.heap_bytes, total);

  // Replacing an entry with other bytes swaps its bytes in the count.
  const std::string replacement = random_bytes(999, 12345);
  ASSERT_NE(cache.insert(entries[3].first, replacement), kNotFound);
  s = cache.stats();
  EXPECT_EQ(s.entries, entries.size());
  EXPECT_EQ(s.heap_bytes, total - entries[3].second.size() + replacement.size());
  EXPECT_EQ(verify_entry(cache, entries[3].first, replacement, "replaced"), "");

  EXPECT_FALSE(cache.is_finalized());
  if (stands_in_for_file) {
    auto r = cache.finalize();
    EXPECT_FALSE(r.ok()) << "finalize said durable for entries that live only in memory";
    EXPECT_NE(r.error().message.find(std::to_string(entries.size()) + " entries"), std::string::npos)
        << r.error().message;
    EXPECT_EQ(cache.stats().unpersisted_entries, entries.size());
  } else {
    EXPECT_TRUE(cache.finalize().ok()) << last_error().message;
    EXPECT_EQ(cache.stats().unpersisted_entries, 0u);
  }
  EXPECT_TRUE(cache.is_finalized());
  EXPECT_EQ(cache.stats().file_bytes, 0u);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i == 3) continue;
    EXPECT_EQ(verify_entry(cache, entries[i].first, entries[i].second, entries[i].first), "");
  }
}

TEST(HeapOnly, EmptyPath) {
  WeightCache cache = open_or_fail(Options{});
  ASSERT_TRUE(cache);
  exercise_heap_cache(cache);
}

TEST(HeapOnly, BackingHeapNeverTouchesThePath) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  Options o = file_options(path);
  o.backing = Backing::heap;
  {
    WeightCache cache = open_or_fail(o);
    ASSERT_TRUE(cache);
    exercise_heap_cache(cache);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a heap cache created files next to " << path;
}

// Two ways a path cannot be created: a missing parent directory, and a parent that is a file.
std::vector<std::string> uncreatable_paths(const TempDir& dir) {
  const std::string regular = dir.file("regular-file");
  std::ofstream(regular) << "not a directory";
  return {dir.file("missing-dir/cache.wcache"), regular + "/cache.wcache"};
}

TEST(HeapFallback, UncreatablePathFallsBackWithOneWarning) {
  TempDir dir;
  for (const std::string& path : uncreatable_paths(dir)) {
    SCOPED_TRACE(path);
    LogCapture log;
    Options o = file_options(path);
    o.backing = Backing::automatic;
    auto r = WeightCache::open(o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    WeightCache& cache = r.value();
    EXPECT_EQ(cache.stats().backing, Backing::heap);
    // Using the cache must not warn again: one warning per open, not per entry (and finalize's
    // one error saying the entries are not durable).
    exercise_heap_cache(cache, true);
    // Where the address space is short (qemu-user's 16 GiB guest in scripts/test-arch) the open
    // also says it reserved less than max_file_bytes, before it finds the path unusable.
    std::vector<LogCapture::Message> warnings;
    for (auto& m : log.at_least(WC_LOG_WARN))
      if (m.text.find("of address space could be reserved") == std::string::npos) warnings.push_back(m);
    ASSERT_EQ(warnings.size(), 2u) << log.all();
    EXPECT_EQ(warnings[1].level, WC_LOG_ERROR);
    EXPECT_EQ(warnings[0].level, WC_LOG_WARN);
    EXPECT_NE(warnings[0].text.find(path), std::string::npos) << warnings[0].text;
  }
}

TEST(HeapFallback, BackingFileOnUncreatablePathFails) {
  TempDir dir;
  for (const std::string& path : uncreatable_paths(dir)) {
    SCOPED_TRACE(path);
    Options o = file_options(path);
    o.backing = Backing::file;
    auto r = WeightCache::open(o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().code, Errc::ok);
    EXPECT_NE(r.error().message.find(path), std::string::npos) << r.error().message;
    EXPECT_NE(last_error().code, Errc::ok);
    EXPECT_NE(last_error().message.find(path), std::string::npos) << last_error().message;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "missing-dir"));
}

// A read-only reader that starts before the writer has created the file: served from memory
// at first, and the file's entries once it exists (it used to stay heap-only for good).
TEST(HeapFallback, AReadOnlyOpenBeforeTheFileExistsPicksItUpLater) {
  TempDir dir;
  const std::string path = dir.file("later.wcache");
  for (bool on_miss : {false, true}) {
    SCOPED_TRACE(on_miss ? "refresh_on_miss" : "wc_refresh");
    std::filesystem::remove(path);
    std::filesystem::remove(path + ".lock");
    Options ro = file_options(path);
    ro.read_only = true;
    ro.refresh_on_miss = on_miss;
    ro.backing = Backing::automatic;
    auto reader = WeightCache::open(ro);
    ASSERT_TRUE(reader.ok()) << reader.error().message;
    EXPECT_EQ(reader->stats().backing, Backing::heap);
    EXPECT_EQ(reader->look_up("w"), kNotFound);
    EXPECT_FALSE(std::filesystem::exists(path)) << "a read-only open created the file";
    const std::string bytes = random_bytes(5000, 7);
    {
      WeightCache writer = open_or_fail(file_options(path));
      ASSERT_NE(writer.insert("w", bytes), kNotFound);
      ASSERT_TRUE(writer.finalize().ok());
    }
    if (!on_miss) {
      ASSERT_TRUE(reader->refresh().ok()) << last_error().message;
    }
    const std::size_t off = reader->look_up("w");
    ASSERT_NE(off, kNotFound) << "the file that appeared is not served";
    EXPECT_EQ(std::memcmp(reader->offset_to_addr(off), bytes.data(), bytes.size()), 0);
    EXPECT_EQ(reader->stats().backing, Backing::file);
  }
}

// A read-only cache keeps what is inserted in memory: every such entry counts as a heap
// fallback (it counted none), and finalize says none of them is durable (it said OK).
TEST(HeapFallback, ReadOnlyCacheCountsEveryEntryAndFinalizeSaysTheyAreNotDurable) {
  TempDir dir;
  const std::string path = dir.file("ro.wcache");
  {
    WeightCache writer = open_or_fail(file_options(path));
    ASSERT_NE(writer.insert("existing", "bytes"), kNotFound);
    ASSERT_TRUE(writer.finalize().ok());
  }
  Options ro = file_options(path);
  ro.read_only = true;
  WeightCache c = open_or_fail(ro);
  ASSERT_TRUE(c);
  std::uint64_t bytes = 0;
  for (int i = 0; i < 150; ++i) {
    const std::string v = random_bytes(100 + i, i);
    if (i % 2 == 0) {
      void* p = c.reserve(v.size());
      ASSERT_NE(p, nullptr);
      std::memcpy(p, v.data(), v.size());
      ASSERT_NE(c.look_up_or_insert("k" + std::to_string(i), p, v.size()), kNotFound);
    } else {
      ASSERT_NE(c.insert("k" + std::to_string(i), v), kNotFound);
    }
    bytes += v.size();
  }
  const Stats s = c.stats();
  EXPECT_EQ(s.heap_fallbacks, 150u);
  EXPECT_EQ(s.unpersisted_entries, 150u);
  EXPECT_EQ(s.unpersisted_bytes, bytes);
  auto r = c.finalize();
  ASSERT_FALSE(r.ok()) << "finalize of a read-only cache said 150 heap entries are durable";
  EXPECT_EQ(r.error().code, Errc::read_only);
  EXPECT_NE(r.error().message.find("150 entries (" + std::to_string(bytes) + " bytes)"), std::string::npos)
      << r.error().message;
  EXPECT_TRUE(c.is_finalized());
}

}  // namespace
}  // namespace weightcache::test
