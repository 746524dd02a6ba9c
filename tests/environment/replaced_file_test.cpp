// Another program replaces the cache file while this process has it mapped, the safe way (a new
// file renamed over the path, as weightcache's own rebuilds do). The mapping keeps the old inode
// alive: no fault, the old bytes are still served, and nothing is ever written into the new file.
//
// Not tested, and documented as a caveat in docs/RELIABILITY.md: a program that truncates the
// mapped file in place. Reading a mapped page past the new end of file raises SIGBUS in every
// process that maps it; no mmap user can prevent that.
#include "env_common.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace weightcache;
using namespace weightcache::env;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Opens `path`, packs entries [first, first + count) and finalizes; the handle stays open.
Result<WeightCache> open_and_fill(const std::string& path, std::uint64_t first, std::uint64_t count,
                                  std::vector<Packed>* out) {
  auto c = WeightCache::open(cache_options(path, Backing::automatic));
  if (!c.ok()) return c;
  for (std::uint64_t i = first; i < first + count; ++i) {
    Packed e;
    if (!pack(c.value(), i, 20000 + 1000 * i, &e)) return last_error();
    out->push_back(e);
  }
  if (auto r = c.value().finalize(); !r) return r.error();
  return c;
}

enum class Replacement { foreign_bytes, another_cache };

void replace_while_mapped(Replacement how) {
  test::TempDir dir("wc-replaced");
  const std::string path = dir.file("cache.wc");
  std::vector<Packed> ours;
  auto c = open_and_fill(path, 0, 16, &ours);
  ASSERT_TRUE(c.ok()) << c.error().message;
  WeightCache& cache = c.value();
  ASSERT_EQ(cache.stats().backing, Backing::file);
  std::vector<const void*> addrs;
  for (const auto& e : ours) addrs.push_back(cache.offset_to_addr(cache.look_up(key_of(e.index))));

  // The other program writes its file under a temporary name and renames it over ours.
  const std::string staged = dir.file("staged.wc");
  std::vector<Packed> theirs;
  if (how == Replacement::another_cache) {
    auto other = open_and_fill(staged, 100, 4, &theirs);
    ASSERT_TRUE(other.ok()) << other.error().message;
  } else {
    std::ofstream(staged, std::ios::binary) << std::string(3 << 20, '\x7f');
  }
  fs::rename(staged, path);
  const std::string replaced = read_all(path);

  // Old bytes, through the addresses handed out before and through new look-ups.
  for (std::size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(check(cache, ours[i]), "");
    EXPECT_EQ(cache.offset_to_addr(cache.look_up(key_of(ours[i].index))), addrs[i]);
  }
  for (const auto& e : theirs) EXPECT_EQ(cache.look_up(key_of(e.index)), kNotFound);
  (void)cache.refresh();  // must not pick up the other file, nor fault
  for (const auto& e : ours) EXPECT_EQ(check(cache, e), "") << "after refresh";

  // New entries cannot go into a file nobody else will read: they stay in memory.
  Packed added;
  ASSERT_TRUE(pack(cache, 50, 30000, &added)) << last_error().message;
  EXPECT_TRUE(added.heap);
  EXPECT_EQ(check(cache, added), "");
  auto r = cache.finalize();
  if (!r.ok()) {
    EXPECT_NE(r.error().message, "");
  }
  EXPECT_EQ(read_all(path), replaced) << "the cache wrote into the file that replaced its own";
  for (const auto& e : ours) EXPECT_EQ(check(cache, e), "") << "after finalize";

  // The next open (all handles of the old cache closed) reads whatever is at the path now.
  c = Error{};
  auto next = WeightCache::open(cache_options(path, Backing::automatic));
  ASSERT_TRUE(next.ok()) << next.error().message;
  for (const auto& e : theirs) EXPECT_EQ(check(next.value(), e), "");
  for (const auto& e : ours) EXPECT_EQ(next.value().look_up(key_of(e.index)), kNotFound);
}

TEST(ReplacedFile, ByForeignBytesWhileMapped) { replace_while_mapped(Replacement::foreign_bytes); }

TEST(ReplacedFile, ByAnotherCacheWhileMapped) { replace_while_mapped(Replacement::another_cache); }

}  // namespace
