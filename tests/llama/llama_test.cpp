// llama.cpp with its repacked weights from the cache, as an application gets it: weightcache-llama
// and weightcache-gguf-gen as `cmake --install` put them into a prefix, on a real libllama, each
// load a new process on a generated llama GGUF with a byte vocabulary, against llama.cpp's stock
// repacking and against use_extra_bufts=false on the same file. The scenarios every runtime
// program passes are tests/runtime_common's; here, weightcache-llama's and what only llama.cpp has.
#include <gtest/gtest.h>

#include "runtime_harness.hpp"
#include "times_track_stores.hpp"

#include <cstdint>
#include <filesystem>
#include <set>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using weightcache::test::kNoRepack;
using weightcache::test::kStock;
using weightcache::test::RuntimeProgram;
using weightcache::test::ToolRun;

const RuntimeProgram kLlama{
    .name = "llama",
    .prefix = WEIGHTCACHE_LLAMA_PREFIX,
    .program = "weightcache-llama",
    .install_test = "LlamaInstall",
    .load_args = {"--json", "--threads", "2", "--n-predict", "6", "--prompt", "the quick brown fox"},
    .shared_load_args = {"--json", "--threads", "1", "--n-predict", "2"},
    .gen_args = {"--vocab", "264"},
    // The first decode step's logits, every later step's, and the tokens chosen.
    .outputs = {"checksum", "checksum_all", "tokens"},
    .to_cache = "routed",
    .more_stock_cold_warm =
        [](const ToolRun& stock, const ToolRun& cold, const ToolRun&) {
          // Stock llama.cpp repacks them: its private memory holds them, the cache's does not. (Not
          // under qemu-user, where RssAnon also counts the emulator's translated code and its
          // bookkeeping, which differ between runs by more than these small models' weights.)
          if (std::getenv("WEIGHTCACHE_EMULATED") == nullptr) {
            EXPECT_GT(stock.u64("rss_anon_bytes"), cold.u64("rss_anon_bytes")) << stock.out << "\n" << cold.out;
          }
        },
};

WEIGHTCACHE_RUNTIME_SCENARIOS(Llama, kLlama);

class Llama : public weightcache::test::RuntimeTest {
 protected:
  Llama() : RuntimeTest(kLlama) {}
};

// ---- outputs --------------------------------------------------------------------------------------

// The AMX path, where this CPU takes it (an x86-64 CPU with AMX and a ggml built for it: the
// stock run names AMX among its buffer types): a model of 2048-wide layers puts its attention and
// gate/up matrices in AMX and ffn_down (rows of 2560) in CPU_REPACK; stock, cold and a warm new
// process give the same logits and tokens, for Q4_0, Q4_K and Q8_0. Elsewhere it says why it skips.
TEST_F(Llama, OnAnAmxCpuStockColdAndWarmAgreeOnBothLayouts) {
  const std::string probe = f("probe.gguf");
  ASSERT_NO_FATAL_FAILURE(make_model(probe, {"q4_0", "1", "2048", "2560", "1"}));
  const ToolRun first = load(probe, kStock);
  ASSERT_EQ(first.code, 0) << first.describe();
  const std::string cpu = first.j["cpu"].get<std::string>();
  if (first.j["stock_buffer_types"].get<std::string>().find("AMX=") == std::string::npos)
    GTEST_SKIP() << "skipped: this CPU has no AMX (" << cpu << "; stock llama.cpp repacks into "
                 << first.j["stock_buffer_types"].get<std::string>() << ")";
  for (const char* type : {"q4_0", "q4_k", "q8_0"}) {
    const std::string model = f(std::string("amx-") + type + ".gguf"), cache = f(std::string("amx-") + type + ".wcache");
    ASSERT_NO_FATAL_FAILURE(make_model(model, {type, "2", "2048", "2560", "1"}));
    const ToolRun stock = load(model, kStock);
    const ToolRun cold = load(model, cache);
    const ToolRun warm = load(model, cache);
    for (const ToolRun* r : {&stock, &cold, &warm}) ASSERT_EQ(r->code, 0) << r->describe();
    EXPECT_NE(stock.j["stock_buffer_types"].get<std::string>().find("AMX="), std::string::npos) << type << stock.out;
    EXPECT_EQ(cold.u64("routed"), stock.u64("stock_repacked")) << type << cold.out;
    EXPECT_EQ(warm.u64("repacked"), 0u) << type << warm.out;
    EXPECT_EQ(warm.u64("served_from_cache"), cold.u64("routed")) << type << warm.out;
    expect_same_outputs(cold, stock, type);
    expect_same_outputs(warm, stock, type);
  }
}

// ---- what only llama.cpp has ------------------------------------------------------------------------

// A cache written by another ggml (the standalone ggml build's weightcache-ggml, another version and
// repacking code) on the same GGUF is never served to llama.cpp's ggml: its keys name that ggml.
// And the keys name the repacking code's fingerprint and the CPU's features, not a build commit.
TEST_F(Llama, ACacheWrittenByAnotherGgmlIsNeverServed) {
  if (!fs::is_regular_file(installed("weightcache-ggml"))) GTEST_SKIP() << "this build has no standalone ggml";
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model));
  const ToolRun other = run("weightcache-ggml", {"--model", model, "--cache", cache, "--json", "--steps", "1"});
  ASSERT_EQ(other.code, 0) << other.describe();
  ASSERT_GT(other.u64("repacked"), 0u) << other.out;
  const ToolRun stock = load(model, kStock);
  const ToolRun mine = load(model, cache);
  ASSERT_EQ(mine.code, 0) << mine.describe();
  EXPECT_EQ(mine.u64("served_from_cache"), 0u) << mine.out;
  EXPECT_EQ(mine.u64("repacked"), mine.u64("routed")) << mine.out;
  expect_same_outputs(mine, stock, "a cache another ggml wrote");
  const ToolRun ls = run("weightcache", {"ls", cache});
  ASSERT_EQ(ls.code, 0) << ls.describe();
  // Both sets of entries side by side, each under its own build: ggml's version, the fingerprint of
  // its repacking code, the CPU's features.
  std::size_t repack_keys = 0;
  std::set<std::string> builds;
  for (std::size_t at = ls.out.find("ggml-repack/1|"); at != std::string::npos; at = ls.out.find("ggml-repack/1|", at + 1)) {
    const std::string line = ls.out.substr(at, ls.out.find('\n', at) - at);
    // The layout word: CPU_REPACK's, or another layout each ggml serves on this CPU (KleidiAI's
    // for the standalone ggml on arm64, AMX's on a CPU with AMX).
    EXPECT_TRUE(line.find(" repack ") != std::string::npos || line.find(" kleidiai ") != std::string::npos ||
                line.find(" amx ") != std::string::npos)
        << line;
    EXPECT_NE(line.find("|cpu "), std::string::npos) << line;
    builds.insert(line.substr(0, line.find("|xxh3|")));
    ++repack_keys;
  }
  EXPECT_EQ(repack_keys, mine.u64("routed") + other.u64("repacked")) << ls.out;
  EXPECT_EQ(builds.size(), 2u) << ls.out;
}

// A model none of whose weights llama.cpp repacks on this CPU (f32 matrices): the run with a cache
// succeeds with stock outputs, and says why nothing went to the cache (in its JSON, and one warn
// line on llama.cpp's log).
TEST_F(Llama, NothingCacheableIsSaidAndTheRunStillSucceeds) {
  const std::string model = f("f32.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model, {"f32", "4", "64", "128", "1"}));
  const ToolRun stock = load(model, kStock);
  const ToolRun mine = load(model, cache);
  ASSERT_EQ(stock.code, 0) << stock.describe();
  ASSERT_EQ(mine.code, 0) << mine.describe();
  EXPECT_EQ(mine.u64("routed"), 0u);
  EXPECT_EQ(mine.j["stock_buffer_types"].get<std::string>(), "");
  EXPECT_NE(mine.j["why_none"].get<std::string>().find("repacks none"), std::string::npos) << mine.out;
  EXPECT_NE(mine.err.find("weightcache: no weights of"), std::string::npos) << "no warning on stderr:\n" << mine.err;
  expect_same_outputs(mine, stock, "nothing routed");
}

// ---- memory --------------------------------------------------------------------------------------

// After a warm load, this process holds what use_extra_bufts=false gives (within 5 MiB): no private
// copy of the repacked weights (RssAnon) and not their GGUF source pages (RssFile), after the load
// and after decoding (when the repacked weights' pages in the cache file are mapped instead).
TEST_F(Llama, AWarmLoadHoldsWhatNoRepackingHolds) {
  if (std::getenv("WEIGHTCACHE_EMULATED") != nullptr)
    GTEST_SKIP() << "qemu-user 7.2 ignores madvise, so the GGUF pages a warm load gives back stay resident "
                    "(RssFile 10.3 MiB over no-repack's), and RssAnon also counts its translated code (6.2 MiB over "
                    "at the end): measured natively";
  if (!weightcache::test::mappings_verifiable())
    GTEST_SKIP() << "this process cannot verify its file mappings (every warm load hashes the GGUF, so its pages "
                    "are resident)";
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model, {"q4_0", "1", "1024", "2816", "4"}));  // 29 MiB repacked
  ASSERT_EQ(load(model, cache).code, 0);
  constexpr std::uint64_t kSlack = 5u << 20;
  for (int round = 0; round < 2; ++round) {
    const ToolRun plain = load(model, kNoRepack);
    const ToolRun warm = load(model, cache);
    ASSERT_EQ(plain.code, 0) << plain.describe();
    ASSERT_EQ(warm.code, 0) << warm.describe();
    ASSERT_EQ(warm.u64("repacked"), 0u) << warm.out;
    EXPECT_LE(warm.u64("rss_anon_bytes"), plain.u64("rss_anon_bytes") + kSlack) << warm.out << "\n" << plain.out;
    EXPECT_LE(warm.u64("rss_file_bytes"), plain.u64("rss_file_bytes") + kSlack) << warm.out << "\n" << plain.out;
    EXPECT_LE(warm.u64("rss_anon_end_bytes"), plain.u64("rss_anon_end_bytes") + kSlack) << warm.out << "\n" << plain.out;
    EXPECT_LE(warm.u64("rss_file_end_bytes"), plain.u64("rss_file_end_bytes") + kSlack) << warm.out << "\n" << plain.out;
  }
  // Stock llama.cpp holds a second, private copy: the test above can tell.
  const ToolRun stock = load(model, kStock);
  const ToolRun plain = load(model, kNoRepack);
  EXPECT_GT(stock.u64("rss_anon_bytes"), plain.u64("rss_anon_bytes") + kSlack) << stock.out;
}

}  // namespace
