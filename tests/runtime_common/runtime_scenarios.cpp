// The scenarios every runtime program must pass (runtime_harness.hpp), whatever runtime it embeds:
// the suites instantiate them with their program.
#include "runtime_harness.hpp"

#include <gguf.h>

#include "spawn.hpp"
#include "times_track_stores.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcache::test {

namespace fs = std::filesystem;

std::uint64_t served_layouts(const std::string& bufts) {
  std::uint64_t n = 0;
  for (std::size_t at = 0; at < bufts.size();) {
    const std::size_t comma = std::min(bufts.find(',', at), bufts.size()), eq = bufts.find('=', at);
    const std::string name = bufts.substr(at, eq - at);
    if (name == "AMX" || name == "CPU_REPACK" || name == "CPU_KLEIDIAI") n += std::stoull(bufts.substr(eq + 1, comma - eq - 1));
    at = comma + 1;
  }
  return n;
}

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

ToolRun RuntimeFixture::run(const char* tool, const std::vector<std::string>& args) const {
  return run_tool(dir_, installed(tool), args);
}

ToolRun RuntimeFixture::load(const std::string& model, const std::string& how,
                             const std::vector<std::string>& extra) const {
  std::vector<std::string> a{"--model", model};
  a.insert(a.end(), p_.load_args.begin(), p_.load_args.end());
  if (how == kNoRepack) a.push_back("--no-repack");
  else if (how != kStock) a.insert(a.end(), {"--cache", how});
  // Under qemu-user the emulator keeps books on every guest page of a reservation, and RssAnon
  // counts them (about 50 MB for the 8 GiB a cache gets there by default): a cache there asks for
  // 256 MiB, which every model of the suites fits, so the memory bounds are the native ones.
  if (how != kNoRepack && how != kStock && std::getenv("WEIGHTCACHE_EMULATED") != nullptr)
    a.insert(a.end(), {"--max-file-mib", "256"});
  a.insert(a.end(), extra.begin(), extra.end());
  return run(p_.program, a);
}

void RuntimeFixture::make_model(const std::string& out, const ModelShape& s) const {
  std::vector<std::string> a{"--out", out, "--type", s.type, "--seed", s.seed, "--layers", s.layers,
                             "--dim", s.dim, "--ffn", s.ffn};
  a.insert(a.end(), p_.gen_args.begin(), p_.gen_args.end());
  const ToolRun r = run("weightcache-gguf-gen", a);
  ASSERT_EQ(r.code, 0) << r.describe();
}

void RuntimeFixture::expect_same_outputs(const ToolRun& a, const ToolRun& b, const std::string& what) const {
  for (const std::string& key : p_.outputs)
    EXPECT_EQ(a.j[key], b.j[key]) << what << ": " << key << " differs\n" << a.out << "\n" << b.out;
}

void RuntimeFixture::expect_installed() const {
  ASSERT_TRUE(fs::is_regular_file(installed(p_.program))) << "did " << p_.install_test << " run?";
}

namespace {

struct stat stat_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st;
}

// Puts back a file's access and modification times, as `touch -r` does.
void restore_times(const std::string& path, const struct stat& st) {
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

// One block of one weight rewritten in place (its nibbles, not its scale), the file's size kept
// and its times put back as `touch -r` does.
void rewrite_one_block(const std::string& model) {
  const struct stat st = stat_of(model);
  const std::size_t at = tensor_offset(model, "blk.1.ffn_down.weight");
  ASSERT_GT(at, 0u);
  const int fd = ::open(model.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char block[18];
  ASSERT_EQ(::pread(fd, block, sizeof block, static_cast<off_t>(at)), static_cast<ssize_t>(sizeof block));
  for (int i = 2; i < 18; ++i) block[i] = static_cast<unsigned char>(block[i] ^ 0x5A);
  ASSERT_EQ(::pwrite(fd, block, sizeof block, static_cast<off_t>(at)), static_cast<ssize_t>(sizeof block));
  ::close(fd);
  ASSERT_NO_FATAL_FAILURE(restore_times(model, st));
}

void past_the_window(bool wait) {
  if (wait) std::this_thread::sleep_for(std::chrono::milliseconds(2100));
}

}  // namespace

// ---- outputs --------------------------------------------------------------------------------------

// Stock, cold (repacked into the cache) and warm (served from it, in a new process) give
// bit-identical outputs; every weight stock ggml put in a layout the cache serves went to the
// cache; the warm load repacks nothing and leaves the cache file as it was.
TEST_P(RuntimeTypes, StockColdAndWarmAreBitIdenticalAndWarmRepacksNothing) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model, {std::get<1>(GetParam())}));
  const ToolRun stock = load(model, kStock);
  ASSERT_EQ(stock.code, 0) << stock.describe();
  const ToolRun cold = load(model, cache);
  ASSERT_EQ(cold.code, 0) << cold.describe();
  const std::uint64_t to_cache = cold.u64(p_.to_cache);
  ASSERT_GT(to_cache, 0u) << "the runtime repacks none of this model's tensors on this CPU: " << stock.out;
  // Which buffer types the stock runtime used on this CPU, said by stock and cache runs alike.
  const std::string bufts = stock.j["stock_buffer_types"].get<std::string>();
  EXPECT_EQ(cold.j["stock_buffer_types"].get<std::string>(), bufts);
  EXPECT_FALSE(stock.j["cpu"].get<std::string>().empty());
  EXPECT_EQ(to_cache, served_layouts(bufts)) << bufts;
  EXPECT_EQ(cold.u64("repacked"), to_cache) << cold.out;
  EXPECT_EQ(cold.u64("heap_fallbacks"), 0u) << cold.out;
  expect_same_outputs(cold, stock, "cold cache vs stock");
  const struct stat before = stat_of(cache);
  const ToolRun warm = load(model, cache);
  ASSERT_EQ(warm.code, 0) << warm.describe();
  EXPECT_EQ(warm.u64("repacked"), 0u) << warm.out;
  EXPECT_EQ(warm.u64("served_from_cache"), to_cache) << warm.out;
  expect_same_outputs(warm, stock, "warm cache vs stock");
  const struct stat after = stat_of(cache);
  EXPECT_EQ(after.st_size, before.st_size) << "a warm load changed the cache file";
  EXPECT_EQ(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec) << "a warm load wrote the cache file";
  p_.more_stock_cold_warm(stock, cold, warm);
}

// ---- a changed GGUF is seen ------------------------------------------------------------------------

namespace {

const std::vector<std::string> kWindow{"--identity-window-ms", "2000"};

// After `change` to the GGUF (and past the identity window when `wait`): a stock load, whose
// outputs differ from `before`'s, and a load with the cache that gives them too, repacking
// `repacks` weights. `stock` receives the stock load.
void outputs_follow(const RuntimeFixture& t, const std::string& model, const std::string& cache, bool wait,
                    const std::string& change, const ToolRun& before, std::uint64_t repacks, ToolRun& stock) {
  past_the_window(wait);
  stock = t.load(model, kStock);
  ASSERT_EQ(stock.code, 0) << stock.describe();
  EXPECT_NE(stock.j["checksum"], before.j["checksum"]) << change << " did not change the outputs";
  const ToolRun cached = t.load(model, cache, kWindow);
  ASSERT_EQ(cached.code, 0) << cached.describe();
  t.expect_same_outputs(cached, stock, "stale repacked weights served after " + change);
  EXPECT_EQ(cached.u64("repacked"), repacks) << change << ": " << cached.out;
}

// The GGUF changed under the cache, its size kept and its times put back as `touch -r` does: one
// block of one weight rewritten in place (exactly that weight repacks), then every weight (another
// model's bytes written over it), then another model renamed over the path. The outputs follow the
// new weights each time, right after the write and, past the identity window, when a warm load has
// trusted the file's identity.
void changed_gguf_is_seen(const RuntimeFixture& t, bool wait) {
  const std::string model = t.f("m.gguf"), cache = t.f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(t.make_model(model));
  past_the_window(wait);
  const ToolRun cold = t.load(model, cache, kWindow);
  ASSERT_EQ(cold.code, 0) << cold.describe();
  const std::uint64_t all = cold.u64("repacked");
  if (wait) {
    // A second load finds the tensors through the file's identity: it reads none of their bytes.
    const ToolRun warm = t.load(model, cache, kWindow);
    ASSERT_EQ(warm.code, 0) << warm.describe();
    EXPECT_EQ(warm.u64("repacked"), 0u) << warm.out;
    if (gguf_identity_usable(model)) {
      EXPECT_EQ(warm.u64("source_bytes_hashed"), 0u) << warm.out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  const struct stat st = stat_of(model);
  ASSERT_NO_FATAL_FAILURE(rewrite_one_block(model));
  ToolRun one_block, every_weight, renamed;
  ASSERT_NO_FATAL_FAILURE(outputs_follow(t, model, cache, wait, "an in-place write of one block", cold, 1, one_block));

  // Every weight: another model of the same shapes (so the same size), its bytes written over.
  const std::string other = t.f("other.gguf");
  ASSERT_NO_FATAL_FAILURE(t.make_model(other, {"q4_0", "9"}));
  {
    const std::string bytes = slurp(other);
    ASSERT_EQ(bytes.size(), static_cast<std::size_t>(st.st_size));
    std::fstream out(model, std::ios::in | std::ios::out | std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
  }
  ASSERT_NO_FATAL_FAILURE(restore_times(model, st));
  ASSERT_NO_FATAL_FAILURE(
      outputs_follow(t, model, cache, wait, "an in-place rewrite of the file", one_block, all, every_weight));

  // Then a third model renamed over the path.
  ASSERT_NO_FATAL_FAILURE(t.make_model(t.f("new.gguf"), {"q4_0", "7"}));
  ASSERT_EQ(std::rename(t.f("new.gguf").c_str(), model.c_str()), 0);
  ASSERT_NO_FATAL_FAILURE(outputs_follow(t, model, cache, wait, "a rename over the path", every_weight, all, renamed));
}

}  // namespace

// Issue 32: a GGUF is trusted by its file system's change window (10 ms where change times have
// nanoseconds), not a flat minute. Written, then 50 ms later a cold load records the file
// identities while it repacks, and every load after it reads none of the tensors' bytes. One block
// rewritten in place (its times put back) 20 ms after that is seen by the next load.
TEST_P(RuntimeSuite, AGgufWritten50msBeforeTheColdLoadIsTrustedFromTheNextLoadOn) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model));
  const struct stat st = stat_of(model);
  if (!times_track_stores(model) || st.st_ctim.tv_nsec == 0)
    GTEST_SKIP() << "the temporary directory is not on ext4, xfs, btrfs or f2fs with nanosecond change times";
  if (!mappings_verifiable())
    GTEST_SKIP() << "this process cannot verify its file mappings (no PROCMAP_QUERY and no /proc/self/maps): "
                    "no GGUF identity is trusted here, every load hashes";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const ToolRun cold = load(model, cache);
  ASSERT_EQ(cold.code, 0) << cold.describe();
  EXPECT_GT(cold.u64("repacked"), 0u) << cold.out;
  for (int i = 0; i < 2; ++i) {
    const ToolRun warm = load(model, cache);
    ASSERT_EQ(warm.code, 0) << warm.describe();
    EXPECT_EQ(warm.u64("repacked"), 0u) << warm.out;
    EXPECT_EQ(warm.u64("source_bytes_hashed"), 0u) << "the cold load left no file identity, load " << i << ": "
                                                    << warm.out;
    expect_same_outputs(warm, cold, "warm vs cold");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_NO_FATAL_FAILURE(rewrite_one_block(model));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const ToolRun stock = load(model, kStock);
  ASSERT_EQ(stock.code, 0) << stock.describe();
  EXPECT_NE(stock.j["checksum"], cold.j["checksum"]) << "the in-place write did not change the outputs";
  const ToolRun after = load(model, cache);
  ASSERT_EQ(after.code, 0) << after.describe();
  expect_same_outputs(after, stock, "stale repacked weights served after an in-place write");
  EXPECT_EQ(after.u64("repacked"), 1u) << after.out;
}

TEST_P(RuntimeSuite, AChangedGgufIsSeenRightAfterTheWrite) { changed_gguf_is_seen(*this, false); }
TEST_P(RuntimeSuite, AChangedGgufIsSeenThroughItsFileIdentity) { changed_gguf_is_seen(*this, true); }

// ---- failures keep the outputs ---------------------------------------------------------------------

TEST_P(RuntimeSuite, ADamagedCacheFileStillGivesTheStockOutputs) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model));
  const ToolRun stock = load(model, kStock);
  ASSERT_EQ(stock.code, 0) << stock.describe();
  ASSERT_EQ(load(model, cache).code, 0);
  // Garbage over the middle of the file: the repacked entries there fail their checksums.
  const struct stat st = stat_of(cache);
  const int fd = ::open(cache.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::vector<char> junk(static_cast<std::size_t>(st.st_size / 3), '\x5c');
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), st.st_size / 3), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  const ToolRun damaged = load(model, cache);
  ASSERT_EQ(damaged.code, 0) << damaged.describe();
  expect_same_outputs(damaged, stock, "a damaged cache");
  EXPECT_GT(damaged.u64("repacked"), 0u) << "the damaged entries were served: " << damaged.out;
  const ToolRun again = load(model, cache);
  ASSERT_EQ(again.code, 0) << again.describe();
  expect_same_outputs(again, stock, "the load after the damaged one");
}

TEST_P(RuntimeSuite, AnImpossibleCachePathStillGivesTheStockOutputs) {
  const std::string model = f("m.gguf");
  ASSERT_NO_FATAL_FAILURE(make_model(model));
  const ToolRun stock = load(model, kStock);
  ASSERT_EQ(stock.code, 0) << stock.describe();
  std::ofstream(f("file")) << "a regular file";
  const ToolRun r = load(model, f("file") + "/c.wcache");
  ASSERT_EQ(r.code, 0) << r.describe();
  expect_same_outputs(r, stock, "an impossible cache path");
  EXPECT_FALSE(fs::exists(f("file") + "/c.wcache"));
}

// The examples' one command line: an argument it cannot take ends the program with exit 1 and a
// line that names the program and the argument, before any model is read; never a crash. Threads
// past ggml's own limit (GGML_MAX_N_THREADS, 512) crashed both programs inside ggml's thread pool.
TEST_P(RuntimeSuite, ArgumentsItCannotTakeExitOneWithTheirReason) {
  const std::string model = f("m.gguf");
  ASSERT_NO_FATAL_FAILURE(make_model(model));
  const std::vector<std::vector<std::string>> bad = {
      {"--threads", "100000"}, {"--threads", "513"},  {"--threads", "0"},  {"--threads", "-1"},
      {"--threads", "x"},      {"--threads", "99999999999999999999"},     {"--threads"},
      {"--no-such-option"}};
  for (const auto& extra : bad) {
    std::vector<std::string> args = {"--model", model};
    args.insert(args.end(), extra.begin(), extra.end());
    const ToolRun r = run(p_.program, args);
    std::string what;
    for (const auto& a : extra) what += " " + a;
    EXPECT_EQ(r.code, 1) << what << ": " << r.describe();
    EXPECT_EQ(r.err.rfind(std::string(p_.program) + ": ", 0), 0u) << what << ": " << r.describe();
    EXPECT_NE(r.err.find(extra[0]), std::string::npos) << what << ": the reason does not name it: " << r.err;
  }
}

// ---- memory --------------------------------------------------------------------------------------

// Four processes started together on a warm cache, each holding it mapped while all of them
// measure: their summed Pss of the cache file is one copy's Rss, and none holds a private one.
TEST_P(RuntimeSuite, FourProcessesShareOneCopyOfTheRepackedWeights) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model, {"q4_0", "1", "512", "1408"}));
  ASSERT_EQ(load(model, cache).code, 0);
  std::vector<std::string> args{"--model", model, "--cache", cache, "--hold-ms", "2000"};
  args.insert(args.end(), p_.shared_load_args.begin(), p_.shared_load_args.end());
  std::vector<Process> pids;
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 4; ++i) {
    files.emplace_back(f("p" + std::to_string(i) + ".out"), f("p" + std::to_string(i) + ".err"));
    pids.push_back(spawn_to_files(installed(p_.program), args, files.back().first, files.back().second));
  }
  std::uint64_t pss = 0, rss = 0, dirty = 0;
  for (int i = 0; i < 4; ++i) {
    const ToolRun r = finish_tool(pids[i], files[i].first, files[i].second);
    ASSERT_EQ(r.code, 0) << r.describe();
    EXPECT_EQ(r.u64("repacked"), 0u) << r.out;
    pss += r.u64("cache_pss_bytes");
    rss = std::max(rss, r.u64("cache_rss_bytes"));
    dirty += r.u64("cache_private_dirty_bytes");
  }
  ASSERT_GT(rss, 0u);
  EXPECT_LE(static_cast<double>(pss), 1.05 * static_cast<double>(rss)) << "summed Pss " << pss << " vs one copy " << rss;
  EXPECT_LE(dirty, 4u * 4096u * 4u) << "the processes hold private copies of the cache";
}

}  // namespace weightcache::test
