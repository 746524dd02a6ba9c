// The reference execution provider end to end (examples/reference_ep): a small model run with
// and without the cache, cold and warm, in several sessions and several processes. Every run
// must compute bit-identical outputs, and warm runs must pack nothing. "Without the cache" is
// --no-cache: weightcache is not used at all (same packer, private memory), so the reference
// output owes nothing to the library under test.
#include "ep_report.hpp"
#include "spawn.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using weightcache::test::TempDir;
using weightcache::test::read_ep_report;
using weightcache::test::report_number;
using Line = weightcache::test::ReportLine;

// About 3 MiB of weights: 4 blocks of 160 -> 640 -> 160.
const std::vector<std::string> kModel = {"--layers", "4", "--dim", "160", "--hidden", "640", "--tokens", "3"};
constexpr std::uint64_t kOperators = 8;
// Whatever backend computes (xnnpack when the build has XNNPACK, else gemm), the promises below
// hold for it; the C-ABI test pins the gemm backend, the only one that packs through that ABI.
#if WEIGHTCACHE_REF_EP_XNNPACK
constexpr const char* kDefaultBackend = "xnnpack";
#else
constexpr const char* kDefaultBackend = "gemm";
#endif

class RefEpTest : public ::testing::Test {
 protected:
  // Runs the provider with the model arguments plus `extra`; returns its exit code and the
  // report lines it appended.
  int run(const std::vector<std::string>& extra, std::vector<Line>* sessions, std::vector<Line>* summaries = nullptr) {
    std::vector<std::string> args = kModel;
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--report");
    args.push_back(report_);
    const auto st = weightcache::test::run_process(WEIGHTCACHE_REF_EP, args);
    sessions->clear();
    if (summaries != nullptr) summaries->clear();
    read_ep_report(report_, &consumed_, sessions, summaries);
    return st.exited ? st.code : -1;
  }

  static std::uint64_t num(const Line& l, const std::string& k) { return report_number(l, k); }

  TempDir dir_{"weightcache-ref-ep"};
  std::string cache_ = dir_.file("ref-ep.wcache");
  std::string report_ = dir_.file("report.txt");
  std::size_t consumed_ = 0;
};

TEST_F(RefEpTest, OutputsAreBitIdenticalWithAndWithoutTheCacheColdAndWarm) {
  std::vector<Line> s;
  ASSERT_EQ(run({"--no-cache"}, &s), 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["backend"], kDefaultBackend);
  EXPECT_EQ(s[0]["mode"], "direct");
  const std::string reference = s[0]["hash"];
  ASSERT_EQ(reference.size(), 16u);
  EXPECT_EQ(num(s[0], "packed"), kOperators);
  EXPECT_EQ(num(s[0], "mapped_bytes"), 0u);
  EXPECT_EQ(num(s[0], "rss"), 0u);  // no cache file mapped
  const std::uint64_t weights = num(s[0], "weights");
  EXPECT_GT(weights, 3u << 20);
  // The baseline's weights are private memory, and the kernel says so: every packed page is
  // resident and dirty in this process alone.
  EXPECT_EQ(num(s[0], "heap_bytes"), weights);
  EXPECT_GE(num(s[0], "heap_private_dirty"), weights);
  EXPECT_GE(num(s[0], "heap_pss"), weights);

  // Cold: everything packed, straight into the cache file; nothing in private memory.
  ASSERT_EQ(run({"--cache", cache_, "--fresh"}, &s), 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["backend"], kDefaultBackend);
  EXPECT_EQ(s[0]["mode"], "adapter");
  EXPECT_EQ(s[0]["hash"], reference);
  EXPECT_EQ(num(s[0], "packed"), kOperators);
  EXPECT_EQ(num(s[0], "reserves"), kOperators);
  EXPECT_EQ(num(s[0], "mapped_bytes"), weights);
  EXPECT_EQ(num(s[0], "heap_bytes"), 0u);
  EXPECT_EQ(num(s[0], "heap_rss"), 0u);

  // Warm, in a new process: nothing packed, the same bytes mapped, the same output.
  ASSERT_EQ(run({"--cache", cache_}, &s), 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["hash"], reference);
  EXPECT_EQ(num(s[0], "reserves"), 0u);
  EXPECT_EQ(num(s[0], "hits"), kOperators);
  EXPECT_EQ(num(s[0], "mapped_bytes"), weights);
  EXPECT_EQ(num(s[0], "heap_bytes"), 0u);
  EXPECT_EQ(num(s[0], "heap_rss"), 0u);
  EXPECT_GE(num(s[0], "rss"), weights);  // the GEMM read every packed byte from the file mapping
  // Reading never copies a page: at most the file's last page may still be dirty in the page
  // cache from the previous run's close.
  EXPECT_LE(num(s[0], "private_dirty"), 64u << 10);

  // Several sessions in one process: the first one's cache serves them all.
  ASSERT_EQ(run({"--cache", cache_, "--sessions", "3"}, &s), 0);
  ASSERT_EQ(s.size(), 3u);
  for (auto& l : s) {
    EXPECT_EQ(l["hash"], reference);
    EXPECT_EQ(num(l, "reserves"), 0u);
  }

  // Without the cache, several sessions each pack again into memory of their own, and agree.
  std::vector<Line> sum;
  ASSERT_EQ(run({"--no-cache", "--sessions", "2"}, &s, &sum), 0);
  ASSERT_EQ(s.size(), 2u);
  for (auto& l : s) {
    EXPECT_EQ(l["hash"], reference);
    EXPECT_EQ(num(l, "packed"), kOperators);
    EXPECT_GE(num(l, "heap_private_dirty"), weights);
  }
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_GE(num(sum[0], "heap_private_dirty"), 2 * weights);
}

TEST_F(RefEpTest, TheCAbiPathComputesTheSameOutputColdAndWarm) {
  // The C ABI is the gemm backend's (XNNPACK packs through a provider only): --c-abi implies it,
  // and the gemm backend's outputs are compared with each other.
  std::vector<Line> s;
  ASSERT_EQ(run({"--no-cache", "--backend", "gemm"}, &s), 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["backend"], "gemm");
  const std::string reference = s[0]["hash"];

  ASSERT_EQ(run({"--cache", cache_, "--fresh", "--c-abi"}, &s), 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["backend"], "gemm");
  EXPECT_EQ(s[0]["mode"], "c-abi");
  EXPECT_EQ(s[0]["hash"], reference);
  EXPECT_EQ(num(s[0], "packed"), kOperators);
  EXPECT_EQ(num(s[0], "heap_bytes"), 0u);

  ASSERT_EQ(run({"--cache", cache_, "--c-abi"}, &s), 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["hash"], reference);
  EXPECT_EQ(num(s[0], "packed"), 0u);
  EXPECT_EQ(num(s[0], "hits"), kOperators);
  EXPECT_EQ(num(s[0], "heap_rss"), 0u);

  // Its keys are its own: the adapter finds nothing of it in the same file, packs, and agrees.
  ASSERT_EQ(run({"--cache", cache_, "--backend", "gemm"}, &s), 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["hash"], reference);
  EXPECT_EQ(num(s[0], "packed"), kOperators);
}

TEST_F(RefEpTest, ProcessesShareOneCacheColdAndWarm) {
  if (!weightcache::test::programs_start_programs()) GTEST_SKIP() << weightcache::test::kNoSelfStart;
  std::vector<Line> s, sum;
  ASSERT_EQ(run({"--no-cache"}, &s), 0);
  ASSERT_EQ(s.size(), 1u);
  const std::string reference = s[0]["hash"];

  // Two processes start cold at once: whoever packs, both compute the same output.
  ASSERT_EQ(run({"--cache", cache_, "--fresh", "--processes", "2"}, &s, &sum), 0);
  ASSERT_EQ(s.size(), 2u);
  for (auto& l : s) EXPECT_EQ(l["hash"], reference);

  // Warm: neither packs, and while both are alive they share the file's pages.
  ASSERT_EQ(run({"--cache", cache_, "--processes", "2", "--sessions", "2"}, &s, &sum), 0);
  ASSERT_EQ(s.size(), 4u);
  for (auto& l : s) {
    EXPECT_EQ(l["hash"], reference);
    EXPECT_EQ(num(l, "reserves"), 0u);
    EXPECT_EQ(num(l, "hits"), kOperators);
  }
  ASSERT_EQ(sum.size(), 2u);
  for (auto& l : sum) {
    EXPECT_GT(num(l, "rss"), 0u);
    EXPECT_LT(num(l, "pss"), num(l, "rss")) << "the two processes' pages of the cache file are not shared";
  }
}

TEST_F(RefEpTest, TheOutputHashDependsOnTheWeights) {
  // Guards the comparisons above: other weights give another output.
  std::vector<Line> a, b;
  ASSERT_EQ(run({"--no-cache"}, &a), 0);
  ASSERT_EQ(run({"--no-cache", "--seed", "12345"}, &b), 0);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(a[0]["hash"], b[0]["hash"]);
}

TEST_F(RefEpTest, BadBackendArgumentsAreRefused) {
  std::vector<Line> s;
  EXPECT_EQ(run({"--no-cache", "--backend", "cuda"}, &s), 2);
  // The C ABI is the gemm backend's (and a build without XNNPACK has no xnnpack backend at all).
  EXPECT_EQ(run({"--cache", cache_, "--c-abi", "--backend", "xnnpack"}, &s), 2);
  EXPECT_TRUE(s.empty());
}

}  // namespace
