// Readers and writers in separate processes: readers never take the writer lease and never
// block on it, see what a writer commits (after refresh, or by themselves with refresh_on_miss),
// and every byte they are served is the right one.
#include "mp_test_util.hpp"

#include <weightcache/weightcache.h>

#include <cstdio>

namespace weightcache::test::mp {
namespace {

constexpr std::size_t kSize = 64 * 1024;

// Packs init/0..count-1 from this process and closes the cache again.
void write_init(const std::string& path, std::size_t count) {
  auto opened = WeightCache::open(cache_options(path));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  for (std::size_t j = 0; j < count; ++j) {
    const std::string key = "init/" + std::to_string(j);
    ASSERT_NE(opened->insert(key, bytes_for_key(key, kSize)), kNotFound) << last_error().message;
  }
  ASSERT_TRUE(opened->finalize().ok()) << last_error().message;
}

TEST(MultiProcess, ReadersKeepReadingWhileAWriterAppendsAndWhileTheLeaseIsHeld) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("cache.wcache");
  constexpr std::size_t kInit = 8, kWriterKeys = 40, kRounds = 5, kReaders = 3;
  write_init(path, kInit);
  if (HasFatalFailure()) return;

  // Hold the writer lease ourselves: readers must still open, look up and refresh, and the
  // writer must not commit anything until we let go.
  LeaseProbe lease(path);
  ASSERT_TRUE(lease.valid());
  ASSERT_TRUE(lease.try_take()) << "nobody should hold the lease yet";

  Children kids;
  // The writer starts first so that it does not inherit the progress pipe (it would keep it
  // open while it waits for the lease, hiding a reader's early death).
  const std::size_t writer = kids.start("pack", {arg("path", path), arg("tag", "w"), arg("own", kWriterKeys),
                                                 arg("rounds", kRounds), arg("size", kSize)});
  Pipe progress(Pipe::Inherit::write_end);
  std::vector<std::string> results;
  for (std::size_t r = 0; r < kReaders; ++r) {
    results.push_back(dir.file("reader" + std::to_string(r)));
    // The last reader relies on refresh_on_miss instead of calling refresh().
    kids.start("reader", {arg("path", path), arg("init", kInit), arg("size", kSize), arg("writer", "w"),
                          arg("count", kWriterKeys), arg("progress_fd", progress.write_fd()),
                          arg("on_miss", r + 1 == kReaders ? 1 : 0), arg("results", results.back())});
  }
  progress.close_write();

  // Every reader made three full passes (look-ups + refresh) while the lease was ours. A reader
  // that tried to take it would have failed at once (their lease_timeout is 0) and closed the pipe.
  ASSERT_TRUE(progress.read_bytes(kReaders)) << "a reader could not make progress while the lease was held";
  {
    const FileIndex held = decode_file(path);
    ASSERT_EQ(held.problem, "");
    EXPECT_EQ(held.records.size(), kInit) << "the writer committed while another process held the lease";
  }
  lease.release();

  const ExitStatus ws = kids.wait(writer);
  ASSERT_TRUE(ws.ok()) << "writer " << ws.describe();
  ASSERT_TRUE(kids.all_succeed());

  for (std::size_t r = 0; r < kReaders; ++r) {
    auto res = read_results(results[r]);
    EXPECT_EQ(res["heap_fallbacks"], 0u);
    EXPECT_EQ(res["entries"], kInit + kWriterKeys) << "reader " << r;
    std::printf("reader %zu (%s): %llu look-up passes, saw the file in %llu distinct states\n", r,
                r + 1 == kReaders ? "refresh_on_miss" : "explicit refresh",
                static_cast<unsigned long long>(res["passes"]), static_cast<unsigned long long>(res["views"]));
  }

  const FileIndex fi = decode_file(path);
  ASSERT_EQ(fi.problem, "");
  EXPECT_EQ(fi.records.size(), kInit + kWriterKeys);
  for (std::size_t j = 0; j < kWriterKeys; ++j) EXPECT_EQ(fi.keys().count(own_key("w", j)), 1u) << j;
}

TEST(MultiProcess, ALookUpMissesAnotherProcessesEntriesUntilRefresh) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("cache.wcache");
  auto opened = WeightCache::open(cache_options(path));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  WeightCache& a = opened.value();
  ASSERT_NE(a.insert("init/0", bytes_for_key("init/0", kSize)), kNotFound);
  ASSERT_TRUE(a.finalize().ok()) << last_error().message;

  Children kids;
  kids.start("pack", {arg("path", path), arg("tag", "b"), arg("own", 3), arg("size", kSize)});
  ASSERT_TRUE(kids.all_succeed());

  // B's entries are committed in the file, but this process has not looked.
  EXPECT_EQ(decode_file(path).records.size(), 4u);
  EXPECT_EQ(a.look_up(own_key("b", 0)), kNotFound);
  EXPECT_EQ(a.look_up(own_key("b", 2)), kNotFound);
  EXPECT_EQ(a.stats().entries, 1u);

  ASSERT_TRUE(a.refresh().ok()) << last_error().message;
  EXPECT_EQ(a.stats().entries, 4u);
  for (std::size_t j = 0; j < 3; ++j) EXPECT_EQ(check_entry(a, own_key("b", j), kSize), "");
  EXPECT_EQ(check_entry(a, "init/0", kSize), "");
  // Nothing new: a second refresh is a no-op.
  ASSERT_TRUE(a.refresh().ok());
  EXPECT_EQ(a.stats().entries, 4u);

  // The C ABI's wc_refresh, on a C handle that joins the same cache.
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.compat_key = "multiprocess-test";
  o.compat_key_size = 17;
  o.durability = WC_DURABILITY_NONE;
  wc_cache* h = nullptr;
  ASSERT_EQ(wc_open(&o, &h), WC_OK) << wc_last_error();
  kids.start("pack", {arg("path", path), arg("tag", "c"), arg("own", 2), arg("size", kSize)});
  ASSERT_TRUE(kids.all_succeed());
  const std::string c0 = own_key("c", 0);
  EXPECT_EQ(wc_look_up(h, c0.data(), c0.size()), WC_NOT_FOUND);
  ASSERT_EQ(wc_refresh(h), WC_OK) << wc_last_error();
  const std::size_t off = wc_look_up(h, c0.data(), c0.size());
  ASSERT_NE(off, WC_NOT_FOUND);
  const std::string want = bytes_for_key(c0, kSize);
  EXPECT_EQ(std::memcmp(wc_offset_to_addr(h, off), want.data(), kSize), 0);
  EXPECT_EQ(a.look_up(c0), off) << "the C handle and the C++ handle share one cache";
  wc_close(h);
}

TEST(MultiProcess, RefreshOnMissSeesAnotherProcessesEntriesWithoutARefreshCall) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("cache.wcache");
  Options o = cache_options(path);
  o.refresh_on_miss = true;
  auto opened = WeightCache::open(o);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  WeightCache& a = opened.value();
  ASSERT_NE(a.insert("init/0", bytes_for_key("init/0", kSize)), kNotFound);
  ASSERT_TRUE(a.finalize().ok()) << last_error().message;
  EXPECT_EQ(a.look_up(own_key("b", 0)), kNotFound);  // not there yet: a plain miss

  Children kids;
  kids.start("pack", {arg("path", path), arg("tag", "b"), arg("own", 3), arg("size", kSize)});
  ASSERT_TRUE(kids.all_succeed());

  for (std::size_t j = 0; j < 3; ++j) EXPECT_EQ(check_entry(a, own_key("b", j), kSize), "");
  EXPECT_EQ(a.stats().entries, 4u);
  EXPECT_EQ(a.look_up("never-written"), kNotFound);
}

}  // namespace
}  // namespace weightcache::test::mp
