// The reference execution provider on its xnnpack backend (examples/reference_ep/xnn_backend.hpp):
// XNNPACK's own operators pack the weights through the adapter's provider into the cache file,
// and a later process maps them. Cold, warm in a new process and without any weights cache
// (XNNPACK packing into private memory), the outputs must be bit-identical, the warm process
// must pack nothing, and every run must say that XNNPACK computed it.
#include "ep_report.hpp"
#include "spawn.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
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

// About 2 MiB of weights in shapes that are not multiples of XNNPACK's tiles: 3 blocks of
// 136 -> 520 -> 136, 5 tokens.
const std::vector<std::string> kModel = {"--layers", "3", "--dim", "136", "--hidden", "520", "--tokens", "5"};
constexpr std::uint64_t kOperators = 6;

struct EpRun {
  int code = -1;
  std::string out;  // stdout and stderr
  std::vector<Line> sessions, summaries;
};

class RefEpXnnpackTest : public ::testing::Test {
 protected:
  EpRun run(const std::vector<std::string>& extra) {
    std::string cmd = quote(WEIGHTCACHE_REF_EP);
#ifdef WEIGHTCACHE_TEST_EMULATOR
    cmd = quote(WEIGHTCACHE_TEST_EMULATOR) + " " + cmd;  // qemu-user without binfmt_misc (spawn.hpp)
#endif
    std::vector<std::string> args = kModel;
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--report");
    args.push_back(report_);
    for (const auto& a : args) cmd += " " + quote(a);
    cmd += " 2>&1";
    EpRun r;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return r;
    char buf[4096];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = ::pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    read_ep_report(report_, &consumed_, &r.sessions, &r.summaries);
    return r;
  }

  static std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  }
  static std::uint64_t num(const Line& l, const std::string& k) { return report_number(l, k); }
  static std::string str(const Line& l, const std::string& k) {
    auto it = l.find(k);
    return it == l.end() ? "<missing>" : it->second;
  }

  TempDir dir_{"weightcache-ref-ep-xnnpack"};
  std::string cache_ = dir_.file("ref-ep.wcache");
  std::string report_ = dir_.file("report.txt");
  std::size_t consumed_ = 0;
};

TEST_F(RefEpXnnpackTest, ColdWarmAndUncachedXnnpackRunsAgreeAndTheWarmOnePacksNothing) {
  // Cold: XNNPACK packs every layer, through the adapter, into the cache file.
  EpRun cold = run({"--cache", cache_, "--fresh"});
  ASSERT_EQ(cold.code, 0) << cold.out;
  ASSERT_EQ(cold.sessions.size(), 1u) << cold.out;
  const Line& c = cold.sessions[0];
  EXPECT_EQ(str(c, "backend"), "xnnpack") << "the default backend of a build with XNNPACK";
  EXPECT_NE(cold.out.find("backend xnnpack"), std::string::npos) << cold.out;
  EXPECT_EQ(str(c, "mode"), "adapter");
  EXPECT_EQ(num(c, "packed"), kOperators);
  EXPECT_EQ(num(c, "reserves"), kOperators);
  EXPECT_EQ(num(c, "look_ups"), kOperators);
  EXPECT_EQ(num(c, "adapter_hits"), 0u);
  const std::uint64_t weights = num(c, "weights");
  EXPECT_GE(weights, 2 * 3 * 136 * 520 * sizeof(float));  // XNNPACK's packing, padding included
  EXPECT_EQ(num(c, "mapped_bytes"), weights);
  EXPECT_EQ(num(c, "heap_bytes"), 0u);
  EXPECT_EQ(num(c, "heap_rss"), 0u);
  const std::string reference = str(c, "hash");
  ASSERT_EQ(reference.size(), 16u);

  // Warm, in a new process: every look-up hits, nothing is reserved or packed, the same output.
  EpRun warm = run({"--cache", cache_});
  ASSERT_EQ(warm.code, 0) << warm.out;
  ASSERT_EQ(warm.sessions.size(), 1u) << warm.out;
  const Line& w = warm.sessions[0];
  EXPECT_EQ(str(w, "backend"), "xnnpack");
  EXPECT_EQ(str(w, "hash"), reference);
  EXPECT_EQ(num(w, "packed"), 0u);
  EXPECT_EQ(num(w, "hits"), kOperators);
  EXPECT_EQ(num(w, "reserves"), 0u);
  EXPECT_EQ(num(w, "look_ups"), kOperators);
  EXPECT_EQ(num(w, "adapter_hits"), kOperators);
  EXPECT_EQ(num(w, "weights"), weights);
  EXPECT_EQ(num(w, "mapped_bytes"), weights);
  EXPECT_EQ(num(w, "heap_rss"), 0u);
  EXPECT_GE(num(w, "rss"), weights);  // XNNPACK read every packed byte from the file mapping
  EXPECT_NE(warm.out.find("0 reservations (nothing packed: every look-up hit)"), std::string::npos) << warm.out;

  // No weights cache at all: XNNPACK packs into private memory of its own, and agrees.
  EpRun bare = run({"--no-cache"});
  ASSERT_EQ(bare.code, 0) << bare.out;
  ASSERT_EQ(bare.sessions.size(), 1u) << bare.out;
  const Line& b = bare.sessions[0];
  EXPECT_EQ(str(b, "backend"), "xnnpack");
  EXPECT_EQ(str(b, "mode"), "direct");
  EXPECT_EQ(str(b, "hash"), reference);
  EXPECT_EQ(num(b, "packed"), kOperators);
  EXPECT_EQ(num(b, "weights"), weights);
  EXPECT_EQ(num(b, "mapped_bytes"), 0u);
  EXPECT_EQ(num(b, "heap_bytes"), weights);
  EXPECT_GE(num(b, "heap_private_dirty"), weights) << "XNNPACK's private packed weights were not found";
}

TEST_F(RefEpXnnpackTest, ProcessesShareTheXnnpackPackedWeights) {
  if (!weightcache::test::programs_start_programs()) GTEST_SKIP() << weightcache::test::kNoSelfStart;
  EpRun bare = run({"--no-cache"});
  ASSERT_EQ(bare.code, 0) << bare.out;
  ASSERT_EQ(bare.sessions.size(), 1u);
  const std::string reference = str(bare.sessions[0], "hash");

  EpRun cold = run({"--cache", cache_, "--fresh", "--processes", "2"});
  ASSERT_EQ(cold.code, 0) << cold.out;
  ASSERT_EQ(cold.sessions.size(), 2u);
  for (const auto& l : cold.sessions) EXPECT_EQ(str(l, "hash"), reference);

  EpRun warm = run({"--cache", cache_, "--processes", "2", "--sessions", "2"});
  ASSERT_EQ(warm.code, 0) << warm.out;
  ASSERT_EQ(warm.sessions.size(), 4u);
  for (const auto& l : warm.sessions) {
    EXPECT_EQ(str(l, "backend"), "xnnpack");
    EXPECT_EQ(str(l, "hash"), reference);
    EXPECT_EQ(num(l, "reserves"), 0u);
    EXPECT_EQ(num(l, "adapter_hits"), num(l, "look_ups"));
  }
  ASSERT_EQ(warm.summaries.size(), 2u);
  for (const auto& l : warm.summaries) {
    EXPECT_GT(num(l, "rss"), 0u);
    EXPECT_LT(num(l, "pss"), num(l, "rss")) << "the two processes' pages of the cache file are not shared";
  }
}

TEST_F(RefEpXnnpackTest, XnnpackComputedTheOutputNotTheGemmBackend) {
  // Guards the comparisons above: the gemm backend (another summation order, another GELU)
  // computes another output of the same model, so equal hashes came from XNNPACK each time.
  EpRun xnn = run({"--no-cache"});
  EpRun gemm = run({"--no-cache", "--backend", "gemm"});
  ASSERT_EQ(xnn.code, 0) << xnn.out;
  ASSERT_EQ(gemm.code, 0) << gemm.out;
  ASSERT_EQ(xnn.sessions.size(), 1u);
  ASSERT_EQ(gemm.sessions.size(), 1u);
  EXPECT_EQ(str(gemm.sessions[0], "backend"), "gemm");
  EXPECT_NE(str(xnn.sessions[0], "hash"), str(gemm.sessions[0], "hash"));

  // --c-abi is the gemm backend's; asking XNNPACK to use it is refused.
  EpRun both = run({"--cache", cache_, "--c-abi", "--backend", "xnnpack"});
  EXPECT_EQ(both.code, 2) << both.out;
}

}  // namespace
