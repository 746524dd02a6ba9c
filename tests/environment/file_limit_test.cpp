// RLIMIT_FSIZE: growing a file past the limit makes the kernel raise SIGXFSZ, which kills the
// host unless it ignores the signal. The library must check the limit before it grows or
// writes. Each case runs in a helper process that lowers its own limit and keeps SIGXFSZ at
// its default action, so a missed check shows up as the helper dying of SIGXFSZ.
#include "env_common.hpp"
#include "spawn.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <string>

namespace {

using namespace weightcache;
using namespace weightcache::env;

constexpr const char* kChild = WC_ENV_CHILD;

void expect_clean(const test::ExitStatus& st) {
  EXPECT_NE(st.signal, SIGXFSZ) << "the library grew the file past RLIMIT_FSIZE: the process died of SIGXFSZ";
  EXPECT_TRUE(st.ok()) << "env_child " << st.describe() << " (its stderr says why)";
}

TEST(FileSizeLimit, AutomaticBackingFallsBackToHeap) {
  test::TempDir dir("wc-fsize");
  expect_clean(test::run_process(kChild, {"fsize", dir.file("cache.wc"), std::to_string(4u << 20), "auto"}));
}

TEST(FileSizeLimit, FileBackingSaysNoSpace) {
  test::TempDir dir("wc-fsize");
  expect_clean(test::run_process(kChild, {"fsize", dir.file("cache.wc"), std::to_string(4u << 20), "file"}));
}

// A limit that is not a multiple of the page size (the file grows in whole pages, so the last
// partial page below the limit can never be allocated).
TEST(FileSizeLimit, UnalignedLimit) {
  test::TempDir dir("wc-fsize");
  expect_clean(
      test::run_process(kChild, {"fsize", dir.file("cache.wc"), std::to_string((3u << 20) + 1234), "auto"}));
}

TEST(FileSizeLimit, FailedFinalizeKeepsLastCommit) {
  test::TempDir dir("wc-fsize");
  const std::string path = dir.file("cache.wc");
  expect_clean(test::run_process(kChild, {"fsize-finalize", path}));
  // A fresh look from this process: the 4 entries committed before the failed finalize are all
  // there, and none of the 4 whose finalize failed is served with wrong bytes.
  Options o = cache_options(path, Backing::file);
  o.read_only = true;
  auto c = WeightCache::open(o);
  ASSERT_TRUE(c.ok()) << c.error().message;
  for (std::uint64_t i = 0; i < 4; ++i) EXPECT_EQ(check(c.value(), Packed{i, 4096 + 512 * i, 0, false}), "");
  for (std::uint64_t i = 10; i < 14; ++i)
    EXPECT_EQ(check_absent_or_right(c.value(), Packed{i, 10000, 0, false}), "");
  EXPECT_EQ(c.value().stats().entries, 4u);
}

}  // namespace
