// ggml's CPU repacking into the cache, as an application gets it: weightcache-ggml and
// weightcache-gguf-gen as `cmake --install` put them into a prefix, each load a new process on a
// generated llama-architecture GGUF, against ggml's stock CPU_REPACK on the same file. The
// scenarios every runtime program passes are tests/runtime_common's; here, weightcache-ggml's and
// what only it reports.
#include <gtest/gtest.h>

#include "runtime_harness.hpp"
#include "times_track_stores.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace {

using weightcache::test::kStock;
using weightcache::test::RuntimeProgram;
using weightcache::test::ToolRun;

const RuntimeProgram kGgml{
    .name = "ggml",
    .prefix = WEIGHTCACHE_GGML_PREFIX,
    .program = "weightcache-ggml",
    .install_test = "GgmlInstall",
    .load_args = {"--json", "--steps", "2", "--threads", "2"},  // two steps of each batch
    .shared_load_args = {"--json", "--steps", "1", "--threads", "1"},
    .gen_args = {},
    .outputs = {"checksum"},  // of every step's outputs
    .to_cache = "repacked",
    .more_stock_cold_warm =
        [](const ToolRun& stock, const ToolRun& cold, const ToolRun& warm) {
          // The stock row is ggml's own order on this CPU: the cache takes what it repacks, all of it.
          const std::string bufts = stock.j["stock_buffer_types"].get<std::string>();
          EXPECT_TRUE(bufts.find("CPU_REPACK=") != std::string::npos || bufts.find("AMX=") != std::string::npos ||
                      bufts.find("CPU_KLEIDIAI=") != std::string::npos)
              << bufts;
          EXPECT_EQ(cold.u64("repacked"), stock.u64("repacked")) << cold.out;
          EXPECT_EQ(cold.u64("not_served"), 0u) << "a layout the cache does not serve took weights here: " << cold.out;
          // A warm load adds under 5 MiB of anonymous memory (under qemu-user too, where the
          // loads ask for a small cache: RuntimeFixture::load).
          EXPECT_LT(warm.u64("rss_anon_load_bytes"), 5u << 20) << warm.out;
        },
};

WEIGHTCACHE_RUNTIME_SCENARIOS(Ggml, kGgml);

class Ggml : public weightcache::test::RuntimeTest {
 protected:
  Ggml() : RuntimeTest(kGgml) {}
};

// ---- memory --------------------------------------------------------------------------------------

TEST_F(Ggml, AWarmLoadLeavesTheRepackedTensorsSourcePagesUnread) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  if (const std::string why = weightcache::test::gguf_identity_unusable_because(dir_.path().string()); !why.empty())
    GTEST_SKIP() << why;
  ASSERT_NO_FATAL_FAILURE(make_model(model, {"q4_0", "1", "512", "1024", "2"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const std::vector<std::string> window{"--identity-window-ms", "2000"};
  ASSERT_EQ(load(model, cache, window).code, 0);
  // Evict the GGUF from the page cache (its pages are clean), then load warm.
  const int fd = ::open(model.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fdatasync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
  const ToolRun warm = load(model, cache, window);
  ASSERT_EQ(warm.code, 0) << warm.describe();
  EXPECT_EQ(warm.u64("repacked"), 0u) << warm.out;
  EXPECT_EQ(warm.u64("source_bytes_hashed"), 0u) << warm.out;
  const std::uint64_t pages = warm.u64("source_pages"), resident = warm.u64("source_pages_resident");
  ASSERT_GT(pages, 0u);
  // Only readahead around the small tensors the runtime does read (norms) may bring some in.
  EXPECT_LE(resident * 20, pages) << resident << " of " << pages << " source pages resident after a warm load";
  // The stock load reads them all.
  const int fd2 = ::open(model.c_str(), O_RDONLY);
  ASSERT_EQ(::posix_fadvise(fd2, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd2);
  const ToolRun stock = load(model, kStock);
  EXPECT_EQ(stock.u64("source_pages_resident"), stock.u64("source_pages")) << stock.out;
}

// ---- options ---------------------------------------------------------------------------------

// --max-file-mib caps the cache file (wc_options::max_file_bytes, rounded up to 2 MiB; the emulated
// benchmarks ask for a small reservation with it). The weights that fit are kept and served warm,
// the rest are repacked into the process's memory at every load, and the outputs stay stock's.
TEST_F(Ggml, MaxFileMibCapsTheCacheAndKeepsWhatFits) {
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model, {"q4_0", "1", "512", "1024", "2"}));  // 2.8 MiB repacked
  const ToolRun stock = load(model, kStock);
  ASSERT_EQ(stock.code, 0) << stock.describe();
  const ToolRun cold = load(model, cache, {"--max-file-mib", "1"});
  ASSERT_EQ(cold.code, 0) << cold.describe();
  expect_same_outputs(stock, cold, "stock and a cold load through a 2 MiB cache");
  EXPECT_EQ(cold.j["finish_status"], "no space") << cold.out;  // not all of it could be kept, and it says so
  std::error_code ec;
  EXPECT_LE(std::filesystem::file_size(cache, ec), 2u << 20);
  const ToolRun warm = load(model, cache, {"--max-file-mib", "1"});
  ASSERT_EQ(warm.code, 0) << warm.describe();
  expect_same_outputs(stock, warm, "stock and a warm load through a 2 MiB cache");
  EXPECT_GT(warm.u64("served_from_cache"), 0u) << "nothing was kept: " << warm.out;
  EXPECT_GT(warm.u64("repacked"), 0u) << "more than the cap was kept: " << warm.out;
  const ToolRun roomy = load(model, f("d.wcache"), {"--max-file-mib", "64"});
  ASSERT_EQ(roomy.code, 0) << roomy.describe();
  EXPECT_EQ(roomy.j["finish_status"], "ok") << roomy.out;
}

// ---- an unprivileged user ---------------------------------------------------------------------

// A process without privilege (nobody: it may not follow /proc/self/map_files) still verifies
// that the bytes it is handed are the GGUF's own pages, so its warm load trusts the GGUF's identity
// and hashes nothing (before, every such load hashed every tensor).
TEST_F(Ggml, AnUnprivilegedWarmLoadTrustsTheGgufIdentity) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the loads as another user";
  if (const std::string why = weightcache::test::gguf_identity_unusable_because(dir_.path().string()); !why.empty())
    GTEST_SKIP() << why;
  const std::string model = f("m.gguf"), cache = f("c.wcache");
  ASSERT_NO_FATAL_FAILURE(make_model(model, {"q4_0", "1", "256", "512", "2"}));
  // nobody owns the GGUF (so it may take the read lease that says no one writes it) and the
  // directory (so it may create the cache).
  ASSERT_EQ(::chown(model.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chown(dir_.path().c_str(), 65534, 65534), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // past the file system's change window
  const auto as_nobody = [&](const std::string& how) {
    std::vector<std::string> a{"--model", model};
    a.insert(a.end(), kGgml.load_args.begin(), kGgml.load_args.end());
    a.insert(a.end(), {"--cache", how});
    static int runs = 0;
    const std::string out = f("nobody" + std::to_string(runs) + ".out"), err = f("nobody" + std::to_string(runs++) + ".err");
    return weightcache::test::finish_tool(
        weightcache::test::spawn_to_files_as(65534, 65534, installed(kGgml.program), a, out, err), out, err);
  };
  const ToolRun cold = as_nobody(cache);
  ASSERT_EQ(cold.code, 0) << cold.describe();
  ASSERT_GT(cold.u64("repacked"), 0u) << cold.out;
  const ToolRun warm = as_nobody(cache);
  ASSERT_EQ(warm.code, 0) << warm.describe();
  EXPECT_EQ(warm.u64("repacked"), 0u) << warm.out;
  EXPECT_EQ(warm.u64("source_bytes_hashed"), 0u) << "an unprivileged warm load hashed its tensors: " << warm.out;
  expect_same_outputs(cold, warm, "an unprivileged cold and warm load");
}

}  // namespace
