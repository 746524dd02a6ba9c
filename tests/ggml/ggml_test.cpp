// ggml's CPU repacking into the cache, as an application gets it: weightcache-ggml and
// weightcache-gguf-gen as `cmake --install` put them into a prefix, each load a new process on a
// generated llama-architecture GGUF, against ggml's stock CPU_REPACK on the same file; and, in
// this process, the buffer type (libweightcache_ggml) loading two models on two threads at once.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <weightcache/ggml.h>
#include <weightcache/weightcache.h>

#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>
#include <gguf.h>

#include "spawn.hpp"
#include "times_track_stores.hpp"
#include "temp_dir.hpp"
#include "tool_run.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using weightcache::test::TempDir;

std::string installed(const char* tool) { return std::string(WEIGHTCACHE_GGML_PREFIX) + "/bin/" + tool; }

using weightcache::test::ToolRun;

ToolRun finish(pid_t pid, const std::string& out, const std::string& err) {
  return weightcache::test::finish_tool(pid, out, err);
}

ToolRun run(const TempDir& dir, const std::string& tool, const std::vector<std::string>& args) {
  return weightcache::test::run_tool(dir, installed(tool.c_str()), args);
}

// weightcache-ggml on `model`: stock (cache ""), or with the cache; two steps of each batch.
ToolRun load(const TempDir& dir, const std::string& model, const std::string& cache, std::vector<std::string> extra = {}) {
  std::vector<std::string> a{"--model", model, "--json", "--steps", "2", "--threads", "2"};
  if (!cache.empty()) {
    a.push_back("--cache");
    a.push_back(cache);
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return run(dir, "weightcache-ggml", a);
}

void make_model(const TempDir& dir, const std::string& out, const std::string& type, const std::string& seed = "1",
                const std::string& layers = "2", const std::string& dim = "256", const std::string& ffn = "512") {
  const ToolRun r = run(dir, "weightcache-gguf-gen",
                    {"--out", out, "--type", type, "--seed", seed, "--layers", layers, "--dim", dim, "--ffn", ffn});
  ASSERT_EQ(r.code, 0) << r.describe();
}

std::uint64_t u64(const ToolRun& r, const char* k) { return r.u64(k); }

using weightcache::test::times_track_stores;

// The file offset of a tensor's data in a GGUF.
std::size_t tensor_offset(const std::string& gguf, const char* name) {
  gguf_init_params p{};
  p.no_alloc = true;
  gguf_context* g = gguf_init_from_file(gguf.c_str(), p);
  if (g == nullptr) return 0;
  const std::int64_t id = gguf_find_tensor(g, name);
  const std::size_t off = id < 0 ? 0 : gguf_get_data_offset(g) + gguf_get_tensor_offset(g, id);
  gguf_free(g);
  return off;
}

class Ggml : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_regular_file(installed("weightcache-ggml"))) << "did GgmlInstall run?";
  }
  TempDir dir_{"wc-ggml"};
  std::string f(const std::string& n) const { return dir_.file(n); }
};

// ---- outputs --------------------------------------------------------------------------------------

class GgmlTypes : public Ggml, public ::testing::WithParamInterface<const char*> {};

TEST_P(GgmlTypes, StockColdAndWarmAreBitIdenticalAndWarmRepacksNothing) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  make_model(dir_, model, GetParam());
  const ToolRun stock = load(dir_, model, "");
  ASSERT_EQ(stock.code, 0) << stock.describe();
  ASSERT_GT(u64(stock, "repacked"), 0u) << "ggml repacks none of this model's tensors on this CPU: " << stock.out;
  // The stock row is ggml's own order on this CPU, and says which buffer types it used.
  const std::string bufts = stock.j["stock_buffer_types"].get<std::string>();
  EXPECT_TRUE(bufts.find("CPU_REPACK=") != std::string::npos || bufts.find("AMX=") != std::string::npos) << bufts;
  EXPECT_FALSE(stock.j["cpu"].get<std::string>().empty());
  const ToolRun cold = load(dir_, model, cache);
  ASSERT_EQ(cold.code, 0) << cold.describe();
  EXPECT_EQ(u64(cold, "repacked"), u64(stock, "repacked")) << cold.out;
  EXPECT_EQ(u64(cold, "heap_fallbacks"), 0u) << cold.out;
  EXPECT_EQ(u64(cold, "not_served"), 0u) << "a layout the cache does not serve took weights here: " << cold.out;
  EXPECT_EQ(cold.j["stock_buffer_types"].get<std::string>(), bufts);
  EXPECT_EQ(cold.j["checksum"], stock.j["checksum"]) << "cold (repacked into the cache) != stock ggml\n" << cold.out;
  struct stat before {};
  ASSERT_EQ(::stat(cache.c_str(), &before), 0);
  const ToolRun warm = load(dir_, model, cache);
  ASSERT_EQ(warm.code, 0) << warm.describe();
  EXPECT_EQ(u64(warm, "repacked"), 0u) << warm.out;
  EXPECT_EQ(u64(warm, "served_from_cache"), u64(stock, "repacked")) << warm.out;
  EXPECT_EQ(warm.j["checksum"], stock.j["checksum"]) << "warm (served from the cache) != stock\n" << warm.out;
  EXPECT_LT(u64(warm, "rss_anon_load_bytes"), 5u << 20) << warm.out;
  struct stat after {};
  ASSERT_EQ(::stat(cache.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size) << "a warm load changed the cache file";
  EXPECT_EQ(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec) << "a warm load wrote the cache file";
}

INSTANTIATE_TEST_SUITE_P(Types, GgmlTypes, ::testing::Values("q4_0", "iq4_nl", "q4_k"));

// ---- a changed GGUF is seen ------------------------------------------------------------------------

void changed_gguf_is_seen(const TempDir& dir, bool past_the_window) {
  const std::string model = dir.file("m.gguf"), cache = dir.file("c.wcache");
  const std::vector<std::string> window{"--identity-window-ms", "2000"};
  make_model(dir, model, "q4_0");
  if (past_the_window) std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const ToolRun cold = load(dir, model, cache, window);
  ASSERT_EQ(cold.code, 0) << cold.describe();
  if (past_the_window) {
    // A second load finds the tensors through the file's identity: it reads none of their bytes.
    const ToolRun warm = load(dir, model, cache, window);
    ASSERT_EQ(warm.code, 0) << warm.describe();
    if (times_track_stores(model)) {
      EXPECT_EQ(u64(warm, "source_bytes_hashed"), 0u) << warm.out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // One block of one weight rewritten in place, the file's size kept (its mtime put back too).
  struct stat st {};
  ASSERT_EQ(::stat(model.c_str(), &st), 0);
  const std::size_t at = tensor_offset(model, "blk.1.ffn_down.weight");
  ASSERT_GT(at, 0u);
  const int fd = ::open(model.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char block[18];
  ASSERT_EQ(::pread(fd, block, sizeof block, static_cast<off_t>(at)), static_cast<ssize_t>(sizeof block));
  for (int i = 2; i < 18; ++i) block[i] = static_cast<unsigned char>(block[i] ^ 0x5A);  // the nibbles, not the scale
  ASSERT_EQ(::pwrite(fd, block, sizeof block, static_cast<off_t>(at)), static_cast<ssize_t>(sizeof block));
  ::close(fd);
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, model.c_str(), times, 0), 0);
  if (past_the_window) std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const ToolRun stock = load(dir, model, "");
  ASSERT_EQ(stock.code, 0) << stock.describe();
  EXPECT_NE(stock.j["checksum"], cold.j["checksum"]) << "the rewritten block did not change the outputs";
  const ToolRun after = load(dir, model, cache, window);
  ASSERT_EQ(after.code, 0) << after.describe();
  EXPECT_EQ(after.j["checksum"], stock.j["checksum"]) << "stale repacked weights served after an in-place write";
  EXPECT_EQ(u64(after, "repacked"), 1u) << "exactly the changed tensor repacks: " << after.out;

  // Then a new file renamed over the path (other weights, same shapes and size).
  make_model(dir, dir.file("new.gguf"), "q4_0", "7");
  ASSERT_EQ(std::rename(dir.file("new.gguf").c_str(), model.c_str()), 0);
  if (past_the_window) std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const ToolRun stock2 = load(dir, model, "");
  const ToolRun renamed = load(dir, model, cache, window);
  ASSERT_EQ(renamed.code, 0) << renamed.describe();
  EXPECT_EQ(renamed.j["checksum"], stock2.j["checksum"]) << "stale repacked weights served after a rename";
  EXPECT_EQ(u64(renamed, "repacked"), u64(stock2, "repacked")) << renamed.out;
}

TEST_F(Ggml, AChangedGgufIsSeenRightAfterTheWrite) { changed_gguf_is_seen(dir_, false); }
TEST_F(Ggml, AChangedGgufIsSeenThroughItsFileIdentity) { changed_gguf_is_seen(dir_, true); }

// ---- failures stay correct --------------------------------------------------------------------------

TEST_F(Ggml, ADamagedCacheFileStillGivesTheStockOutputs) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  make_model(dir_, model, "q4_0");
  const ToolRun stock = load(dir_, model, "");
  ASSERT_EQ(load(dir_, model, cache).code, 0);
  // Garbage over the middle of the file: the repacked entries there fail their checksums.
  struct stat st {};
  ASSERT_EQ(::stat(cache.c_str(), &st), 0);
  const int fd = ::open(cache.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::vector<char> junk(static_cast<std::size_t>(st.st_size / 3), '\x5c');
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), st.st_size / 3), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  const ToolRun damaged = load(dir_, model, cache);
  ASSERT_EQ(damaged.code, 0) << damaged.describe();
  EXPECT_EQ(damaged.j["checksum"], stock.j["checksum"]) << damaged.out;
  EXPECT_GT(u64(damaged, "repacked"), 0u) << "the damaged entries were served: " << damaged.out;
  const ToolRun again = load(dir_, model, cache);
  ASSERT_EQ(again.code, 0) << again.describe();
  EXPECT_EQ(again.j["checksum"], stock.j["checksum"]) << again.out;
}

TEST_F(Ggml, AnImpossibleCachePathStillGivesTheStockOutputs) {
  const std::string model = f("m.gguf");
  make_model(dir_, model, "q4_0");
  const ToolRun stock = load(dir_, model, "");
  std::ofstream(f("file")) << "a regular file";
  const ToolRun r = load(dir_, model, f("file") + "/c.wcache");
  ASSERT_EQ(r.code, 0) << r.describe();
  EXPECT_EQ(r.j["checksum"], stock.j["checksum"]) << r.out;
  EXPECT_FALSE(fs::exists(f("file") + "/c.wcache"));
}

// ---- memory --------------------------------------------------------------------------------------

TEST_F(Ggml, AWarmLoadLeavesTheRepackedTensorsSourcePagesUnread) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  if (!times_track_stores(dir_.path().string()))
    GTEST_SKIP() << "the temporary directory's file system is not one whose times follow every store (ext4, xfs, "
                    "btrfs, f2fs): every load hashes there";
  make_model(dir_, model, "q4_0", "1", "2", "512", "1024");
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const std::vector<std::string> window{"--identity-window-ms", "2000"};
  ASSERT_EQ(load(dir_, model, cache, window).code, 0);
  // Evict the GGUF from the page cache (its pages are clean), then load warm.
  const int fd = ::open(model.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fdatasync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
  const ToolRun warm = load(dir_, model, cache, window);
  ASSERT_EQ(warm.code, 0) << warm.describe();
  EXPECT_EQ(u64(warm, "repacked"), 0u) << warm.out;
  EXPECT_EQ(u64(warm, "source_bytes_hashed"), 0u) << warm.out;
  const std::uint64_t pages = u64(warm, "source_pages"), resident = u64(warm, "source_pages_resident");
  ASSERT_GT(pages, 0u);
  // Only readahead around the small tensors the runtime does read (norms) may bring some in.
  EXPECT_LE(resident * 20, pages) << resident << " of " << pages << " source pages resident after a warm load";
  // The stock load reads them all.
  const int fd2 = ::open(model.c_str(), O_RDONLY);
  ASSERT_EQ(::posix_fadvise(fd2, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd2);
  const ToolRun stock = load(dir_, model, "");
  EXPECT_EQ(u64(stock, "source_pages_resident"), u64(stock, "source_pages")) << stock.out;
}

TEST_F(Ggml, FourProcessesShareOneCopyOfTheRepackedWeights) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  make_model(dir_, model, "q4_0", "1", "2", "512", "1024");
  ASSERT_EQ(load(dir_, model, cache).code, 0);
  std::vector<pid_t> pids;
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 4; ++i) {
    files.emplace_back(f("p" + std::to_string(i) + ".out"), f("p" + std::to_string(i) + ".err"));
    pids.push_back(weightcache::test::spawn_to_files(installed("weightcache-ggml"),
                         {"--model", model, "--cache", cache, "--json", "--steps", "1", "--threads", "1", "--hold-ms",
                          "2000"},
                         files.back().first, files.back().second));
  }
  std::uint64_t pss = 0, rss = 0, dirty = 0;
  for (int i = 0; i < 4; ++i) {
    const ToolRun r = finish(pids[i], files[i].first, files[i].second);
    ASSERT_EQ(r.code, 0) << r.describe();
    EXPECT_EQ(u64(r, "repacked"), 0u) << r.out;
    pss += u64(r, "cache_pss_bytes");
    rss = std::max(rss, u64(r, "cache_rss_bytes"));
    dirty += u64(r, "cache_private_dirty_bytes");
  }
  ASSERT_GT(rss, 0u);
  EXPECT_LE(static_cast<double>(pss), 1.05 * static_cast<double>(rss)) << "summed Pss " << pss << " vs one copy " << rss;
  EXPECT_LE(dirty, 4u * 4096u * 4u) << "the processes hold private copies of the cache";
}

}  // namespace
