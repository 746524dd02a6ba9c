// Entries survive close and reopen in another process, both directions: what one launch packs,
// the next launch (a separate process with its own mapping and registry) serves byte for byte.
#include "unit_test_util.hpp"

namespace weightcache::test {
namespace {

constexpr std::size_t kCount = 320;
constexpr std::size_t kMaxSize = 256 * 1024;

std::vector<std::string> set_args(const char* mode, const std::string& path, const EntrySetSpec& spec) {
  return {mode, path, std::to_string(spec.seed), std::to_string(spec.count), std::to_string(spec.max_size)};
}

TEST(RoundTrip, ChildVerifiesWhatParentWrote) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const EntrySetSpec spec{.seed = 11, .count = kCount, .min_size = 0, .max_size = kMaxSize};
  {
    WeightCache cache = open_or_fail(file_options(path, Durability::full));
    ASSERT_TRUE(cache);
    ASSERT_EQ(write_entry_set(cache, spec), "");
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
    EXPECT_EQ(cache.stats().entries, kCount);
  }
  EXPECT_TRUE(child_succeeds(set_args("verify", path, spec)));
  // The verifier must really discriminate: the same keys with other bytes have to fail it.
  EntrySetSpec other = spec;
  other.seed = 12;
  const ExitStatus wrong = run_process(kChildExe, set_args("verify", path, other));
  EXPECT_TRUE(wrong.exited && wrong.code == kChildMismatch) << wrong.describe();
}

TEST(RoundTrip, ParentVerifiesWhatChildWrote) {
  TempDir dir;
  const std::string path = dir.file("cache.wcache");
  const EntrySetSpec spec{.seed = 21, .count = kCount, .min_size = 0, .max_size = kMaxSize};
  ASSERT_TRUE(child_succeeds(set_args("write", path, spec)));

  WeightCache cache = open_or_fail(file_options(path));
  ASSERT_TRUE(cache);
  EXPECT_EQ(verify_entry_set(cache, spec), "");
  const Stats s = cache.stats();
  EXPECT_EQ(s.backing, Backing::file);
  EXPECT_EQ(s.hits, kCount);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.heap_bytes, 0u);
  EXPECT_EQ(s.verify_failures, 0u);
  EXPECT_TRUE(cache.is_finalized());
  // Served from the file mapping, not from copies: the entries' bytes are all mapped bytes.
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < spec.count; ++i) total += entry_size(spec, i);
  EXPECT_EQ(s.mapped_bytes, total);
}

}  // namespace
}  // namespace weightcache::test
