// llama.cpp with its repacked weights from the cache, as an application gets it: weightcache-llama
// and weightcache-gguf-gen as `cmake --install` put them into a prefix, on a real libllama, each
// load a new process on a generated llama GGUF with a byte vocabulary, against llama.cpp's stock
// repacking and against use_extra_bufts=false on the same file.
#include <gtest/gtest.h>

#include "temp_dir.hpp"
#include "times_track_stores.hpp"
#include "tool_run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using weightcache::test::TempDir;
using weightcache::test::ToolRun;

std::string installed(const char* tool) { return std::string(WEIGHTCACHE_LLAMA_PREFIX) + "/bin/" + tool; }

ToolRun run(const TempDir& dir, const char* tool, const std::vector<std::string>& args) {
  return weightcache::test::run_tool(dir, installed(tool), args);
}

// weightcache-llama on `model`: "stock", "no-repack", or a cache path.
ToolRun llama(const TempDir& dir, const std::string& model, const std::string& how, std::vector<std::string> extra = {}) {
  std::vector<std::string> a{"--model", model, "--json", "--threads", "2", "--n-predict", "6", "--prompt",
                             "the quick brown fox"};
  if (how == "no-repack") a.push_back("--no-repack");
  else if (how != "stock") a.insert(a.end(), {"--cache", how});
  a.insert(a.end(), extra.begin(), extra.end());
  return run(dir, "weightcache-llama", a);
}

void make_model(const TempDir& dir, const std::string& out, const std::string& type, const std::string& seed = "1",
                const std::string& dim = "256", const std::string& ffn = "512", const std::string& layers = "2") {
  const ToolRun r = run(dir, "weightcache-gguf-gen", {"--out", out, "--type", type, "--seed", seed, "--layers", layers,
                                                      "--dim", dim, "--ffn", ffn, "--vocab", "264"});
  ASSERT_EQ(r.code, 0) << r.describe();
}

using weightcache::test::times_track_stores;

class Llama : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(fs::is_regular_file(installed("weightcache-llama"))) << "did LlamaInstall run?"; }
  TempDir dir_{"wc-llama"};
  std::string f(const std::string& n) const { return dir_.file(n); }
};

void expect_same_outputs(const ToolRun& a, const ToolRun& b, const char* what) {
  EXPECT_EQ(a.j["checksum"], b.j["checksum"]) << what << ": the first decode step's logits differ\n" << a.out << "\n" << b.out;
  EXPECT_EQ(a.j["checksum_all"], b.j["checksum_all"]) << what << ": later steps' logits differ";
  EXPECT_EQ(a.j["tokens"], b.j["tokens"]) << what << ": other tokens";
}

// ---- outputs --------------------------------------------------------------------------------------

class LlamaTypes : public Llama, public ::testing::WithParamInterface<const char*> {};

TEST_P(LlamaTypes, StockColdAndWarmGiveBitIdenticalLogitsAndWarmRepacksNothing) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  make_model(dir_, model, GetParam());
  const ToolRun stock = llama(dir_, model, "stock");
  ASSERT_EQ(stock.code, 0) << stock.describe();
  const ToolRun cold = llama(dir_, model, cache);
  ASSERT_EQ(cold.code, 0) << cold.describe();
  ASSERT_GT(cold.u64("routed"), 0u) << "llama.cpp repacks none of this model's tensors on this CPU: " << cold.out;
  // Which buffer types stock llama.cpp used on this CPU, said by stock and cache runs alike; every
  // weight it put in a layout the cache serves was routed.
  const std::string bufts = stock.j["stock_buffer_types"].get<std::string>();
  EXPECT_EQ(cold.j["stock_buffer_types"].get<std::string>(), bufts);
  EXPECT_FALSE(stock.j["cpu"].get<std::string>().empty());
  std::uint64_t served_layouts = 0;
  for (std::size_t at = 0; at < bufts.size();) {
    const std::size_t comma = std::min(bufts.find(',', at), bufts.size()), eq = bufts.find('=', at);
    const std::string name = bufts.substr(at, eq - at);
    if (name == "AMX" || name == "CPU_REPACK") served_layouts += std::stoull(bufts.substr(eq + 1, comma - eq - 1));
    at = comma + 1;
  }
  EXPECT_EQ(cold.u64("routed"), served_layouts) << bufts;
  EXPECT_EQ(cold.u64("repacked"), cold.u64("routed")) << cold.out;
  EXPECT_EQ(cold.u64("heap_fallbacks"), 0u) << cold.out;
  expect_same_outputs(cold, stock, "cold cache vs stock");
  // Stock llama.cpp repacks them: its private memory holds them, the cache's does not.
  EXPECT_GT(stock.u64("rss_anon_bytes"), cold.u64("rss_anon_bytes")) << stock.out << "\n" << cold.out;
  struct stat before {};
  ASSERT_EQ(::stat(cache.c_str(), &before), 0);
  const ToolRun warm = llama(dir_, model, cache);
  ASSERT_EQ(warm.code, 0) << warm.describe();
  EXPECT_EQ(warm.u64("repacked"), 0u) << warm.out;
  EXPECT_EQ(warm.u64("served_from_cache"), cold.u64("routed")) << warm.out;
  expect_same_outputs(warm, stock, "warm cache vs stock");
  struct stat after {};
  ASSERT_EQ(::stat(cache.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size) << "a warm load changed the cache file";
  EXPECT_EQ(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec) << "a warm load wrote the cache file";
}

INSTANTIATE_TEST_SUITE_P(Types, LlamaTypes, ::testing::Values("q4_0", "q4_k", "iq4_nl"));

// The AMX path, where this CPU takes it (an x86-64 CPU with AMX and a ggml built for it: the
// stock run names AMX among its buffer types): a model of 2048-wide layers puts its attention and
// gate/up matrices in AMX and ffn_down (rows of 2560) in CPU_REPACK; stock, cold and a warm new
// process give the same logits and tokens, for Q4_0, Q4_K and Q8_0. Elsewhere it says why it skips.
TEST_F(Llama, OnAnAmxCpuStockColdAndWarmAgreeOnBothLayouts) {
  const std::string probe = f("probe.gguf");
  make_model(dir_, probe, "q4_0", "1", "2048", "2560", "1");
  const ToolRun first = llama(dir_, probe, "stock");
  ASSERT_EQ(first.code, 0) << first.describe();
  const std::string cpu = first.j["cpu"].get<std::string>();
  if (first.j["stock_buffer_types"].get<std::string>().find("AMX=") == std::string::npos)
    GTEST_SKIP() << "skipped: this CPU has no AMX (" << cpu << "; stock llama.cpp repacks into "
                 << first.j["stock_buffer_types"].get<std::string>() << ")";
  for (const char* type : {"q4_0", "q4_k", "q8_0"}) {
    const std::string model = f(std::string("amx-") + type + ".gguf"), cache = f(std::string("amx-") + type + ".wcache");
    make_model(dir_, model, type, "2", "2048", "2560", "1");
    const ToolRun stock = llama(dir_, model, "stock");
    const ToolRun cold = llama(dir_, model, cache);
    const ToolRun warm = llama(dir_, model, cache);
    for (const ToolRun* r : {&stock, &cold, &warm}) ASSERT_EQ(r->code, 0) << r->describe();
    EXPECT_NE(stock.j["stock_buffer_types"].get<std::string>().find("AMX="), std::string::npos) << type << stock.out;
    EXPECT_EQ(cold.u64("routed"), stock.u64("stock_repacked")) << type << cold.out;
    EXPECT_EQ(warm.u64("repacked"), 0u) << type << warm.out;
    EXPECT_EQ(warm.u64("served_from_cache"), cold.u64("routed")) << type << warm.out;
    expect_same_outputs(cold, stock, type);
    expect_same_outputs(warm, stock, type);
  }
}

// ---- a changed GGUF is seen ------------------------------------------------------------------------

// The GGUF rewritten in place (its size kept, its times put back as `touch -r` does), then replaced
// by rename: the outputs follow the new weights.
void changed_gguf_is_seen(const TempDir& dir, bool past_the_window) {
  const std::string model = dir.file("m.gguf"), cache = dir.file("c.wcache");
  const std::vector<std::string> window{"--identity-window-ms", "2000"};
  make_model(dir, model, "q4_0");
  if (past_the_window) std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const ToolRun cold = llama(dir, model, cache, window);
  ASSERT_EQ(cold.code, 0) << cold.describe();
  if (past_the_window) {
    const ToolRun warm = llama(dir, model, cache, window);
    ASSERT_EQ(warm.code, 0) << warm.describe();
    EXPECT_EQ(warm.u64("repacked"), 0u) << warm.out;
    if (times_track_stores(model)) {
      EXPECT_EQ(warm.u64("source_bytes_hashed"), 0u) << warm.out;
    }
  }
  // Another model of the same shapes (so the same size), its bytes written over the old ones.
  const std::string other = dir.file("other.gguf");
  make_model(dir, other, "q4_0", "9");
  struct stat st {};
  ASSERT_EQ(::stat(model.c_str(), &st), 0);
  {
    const std::string bytes = weightcache::test::slurp(other);
    ASSERT_EQ(bytes.size(), static_cast<std::size_t>(st.st_size));
    std::fstream out(model, std::ios::in | std::ios::out | std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
  }
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, model.c_str(), times, 0), 0);
  if (past_the_window) std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const ToolRun stock = llama(dir, model, "stock");
  ASSERT_EQ(stock.code, 0) << stock.describe();
  EXPECT_NE(stock.j["checksum"], cold.j["checksum"]) << "the new weights did not change the outputs";
  const ToolRun after = llama(dir, model, cache, window);
  ASSERT_EQ(after.code, 0) << after.describe();
  expect_same_outputs(after, stock, "after an in-place rewrite with its times restored");
  EXPECT_GT(after.u64("repacked"), 0u) << after.out;

  // Then a third model renamed over the path.
  make_model(dir, dir.file("new.gguf"), "q4_0", "7");
  ASSERT_EQ(std::rename(dir.file("new.gguf").c_str(), model.c_str()), 0);
  if (past_the_window) std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const ToolRun stock2 = llama(dir, model, "stock");
  const ToolRun renamed = llama(dir, model, cache, window);
  ASSERT_EQ(renamed.code, 0) << renamed.describe();
  expect_same_outputs(renamed, stock2, "after a rename over the path");
}

TEST_F(Llama, AChangedGgufIsSeenRightAfterTheWrite) { changed_gguf_is_seen(dir_, false); }
TEST_F(Llama, AChangedGgufIsSeenThroughItsFileIdentity) { changed_gguf_is_seen(dir_, true); }

// ---- failures keep the outputs ---------------------------------------------------------------------

TEST_F(Llama, ADamagedCacheFileStillGivesTheStockOutputs) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  make_model(dir_, model, "q4_0");
  const ToolRun stock = llama(dir_, model, "stock");
  ASSERT_EQ(stock.code, 0) << stock.describe();
  ASSERT_EQ(llama(dir_, model, cache).code, 0);
  struct stat st {};
  ASSERT_EQ(::stat(cache.c_str(), &st), 0);
  const int fd = ::open(cache.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::vector<char> junk(static_cast<std::size_t>(st.st_size / 3), '\x5c');
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), st.st_size / 3), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  const ToolRun damaged = llama(dir_, model, cache);
  ASSERT_EQ(damaged.code, 0) << damaged.describe();
  expect_same_outputs(damaged, stock, "a damaged cache");
  EXPECT_GT(damaged.u64("repacked"), 0u) << "the damaged entries were served: " << damaged.out;
  const ToolRun again = llama(dir_, model, cache);
  ASSERT_EQ(again.code, 0) << again.describe();
  expect_same_outputs(again, stock, "the load after the damaged one");
}

TEST_F(Llama, AnImpossibleCachePathStillGivesTheStockOutputs) {
  const std::string model = f("m.gguf");
  make_model(dir_, model, "q4_0");
  const ToolRun stock = llama(dir_, model, "stock");
  std::ofstream(f("file")) << "a regular file";
  const ToolRun r = llama(dir_, model, f("file") + "/c.wcache");
  ASSERT_EQ(r.code, 0) << r.describe();
  expect_same_outputs(r, stock, "an impossible cache path");
  EXPECT_FALSE(fs::exists(f("file") + "/c.wcache"));
}

// A cache written by another ggml (the standalone ggml build's weightcache-ggml, another version and
// repacking code) on the same GGUF is never served to llama.cpp's ggml: its keys name that ggml.
// And the keys name the repacking code's fingerprint and the CPU's features, not a build commit.
TEST_F(Llama, ACacheWrittenByAnotherGgmlIsNeverServed) {
  if (!fs::is_regular_file(installed("weightcache-ggml"))) GTEST_SKIP() << "this build has no standalone ggml";
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  make_model(dir_, model, "q4_0");
  const ToolRun other = run(dir_, "weightcache-ggml", {"--model", model, "--cache", cache, "--json", "--steps", "1"});
  ASSERT_EQ(other.code, 0) << other.describe();
  ASSERT_GT(other.u64("repacked"), 0u) << other.out;
  const ToolRun stock = llama(dir_, model, "stock");
  const ToolRun mine = llama(dir_, model, cache);
  ASSERT_EQ(mine.code, 0) << mine.describe();
  EXPECT_EQ(mine.u64("served_from_cache"), 0u) << mine.out;
  EXPECT_EQ(mine.u64("repacked"), mine.u64("routed")) << mine.out;
  expect_same_outputs(mine, stock, "a cache another ggml wrote");
  const ToolRun ls = run(dir_, "weightcache", {"ls", cache});
  ASSERT_EQ(ls.code, 0) << ls.describe();
  // Both sets of entries side by side, each under its own build: ggml's version, the fingerprint of
  // its repacking code, the CPU's features.
  std::size_t repack_keys = 0;
  std::set<std::string> builds;
  for (std::size_t at = ls.out.find("ggml-repack/1|"); at != std::string::npos; at = ls.out.find("ggml-repack/1|", at + 1)) {
    const std::string line = ls.out.substr(at, ls.out.find('\n', at) - at);
    EXPECT_NE(line.find(" repack "), std::string::npos) << line;
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
  make_model(dir_, model, "f32", "4", "64", "128", "1");
  const ToolRun stock = llama(dir_, model, "stock");
  const ToolRun mine = llama(dir_, model, cache);
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
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  make_model(dir_, model, "q4_0", "1", "1024", "2816", "4");  // 29 MiB repacked
  ASSERT_EQ(llama(dir_, model, cache).code, 0);
  constexpr std::uint64_t kSlack = 5u << 20;
  for (int round = 0; round < 2; ++round) {
    const ToolRun plain = llama(dir_, model, "no-repack");
    const ToolRun warm = llama(dir_, model, cache);
    ASSERT_EQ(plain.code, 0) << plain.describe();
    ASSERT_EQ(warm.code, 0) << warm.describe();
    ASSERT_EQ(warm.u64("repacked"), 0u) << warm.out;
    EXPECT_LE(warm.u64("rss_anon_bytes"), plain.u64("rss_anon_bytes") + kSlack) << warm.out << "\n" << plain.out;
    EXPECT_LE(warm.u64("rss_file_bytes"), plain.u64("rss_file_bytes") + kSlack) << warm.out << "\n" << plain.out;
    EXPECT_LE(warm.u64("rss_anon_end_bytes"), plain.u64("rss_anon_end_bytes") + kSlack) << warm.out << "\n" << plain.out;
    EXPECT_LE(warm.u64("rss_file_end_bytes"), plain.u64("rss_file_end_bytes") + kSlack) << warm.out << "\n" << plain.out;
  }
  // Stock llama.cpp holds a second, private copy: the test above can tell.
  const ToolRun stock = llama(dir_, model, "stock");
  const ToolRun plain = llama(dir_, model, "no-repack");
  EXPECT_GT(stock.u64("rss_anon_bytes"), plain.u64("rss_anon_bytes") + kSlack) << stock.out;
}

TEST_F(Llama, FourProcessesShareOneCopyOfTheRepackedWeights) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  make_model(dir_, model, "q4_0", "1", "512", "1408");
  ASSERT_EQ(llama(dir_, model, cache).code, 0);
  std::vector<weightcache::test::Process> pids;
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 4; ++i) {
    files.emplace_back(f("p" + std::to_string(i) + ".out"), f("p" + std::to_string(i) + ".err"));
    pids.push_back(weightcache::test::spawn_to_files(
        installed("weightcache-llama"),
        {"--model", model, "--cache", cache, "--json", "--threads", "1", "--n-predict", "2", "--hold-ms", "2000"},
        files.back().first, files.back().second));
  }
  std::uint64_t pss = 0, rss = 0;
  for (int i = 0; i < 4; ++i) {
    const ToolRun r = weightcache::test::finish_tool(pids[i], files[i].first, files[i].second);
    ASSERT_EQ(r.code, 0) << r.describe();
    EXPECT_EQ(r.u64("repacked"), 0u) << r.out;
    pss += r.u64("cache_pss_bytes");
    rss = std::max(rss, r.u64("cache_rss_bytes"));
  }
  ASSERT_GT(rss, 0u);
  EXPECT_LE(static_cast<double>(pss), 1.05 * static_cast<double>(rss)) << "summed Pss " << pss << " vs one copy " << rss;
}

}  // namespace
