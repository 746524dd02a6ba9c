// Sharing is real: N processes that read every entry of one cache share its page-cache pages.
// Each one's Private_Dirty for the file stays near zero and the sum of their Pss is about the
// resident size of the file once, not N times it. Prints the figures.
#include "mp_test_util.hpp"

#include <cstdio>

namespace weightcache::test::mp {
namespace {

// Linux only: the figures come from /proc/<pid>/smaps, which Windows does not have.
#ifndef _WIN32
TEST(MultiProcess, ReadersShareTheCachesPagesPssAndPrivateDirty) {
  constexpr std::size_t kReaders = 4, kEntries = 256, kSize = 256 * 1024;  // 64 MiB
  TempDir dir("wc-mp");
  const std::string path = dir.file("cache.wcache");
  {
    Options o = cache_options(path);
    o.durability = Durability::full;  // written back and synced: readers map clean pages
    auto opened = WeightCache::open(o);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    for (std::size_t j = 0; j < kEntries; ++j) {
      const std::string key = own_key("smaps", j);
      void* p = opened->reserve(kSize);
      ASSERT_NE(p, nullptr) << last_error().message;
      fill_for_key(key, p, kSize);
      ASSERT_NE(opened->look_up_or_insert(key, p, kSize), kNotFound) << last_error().message;
    }
    ASSERT_TRUE(opened->finalize().ok()) << last_error().message;
  }  // closed: this process maps nothing of the file while the readers measure
  const FileIndex fi = decode_file(path);
  ASSERT_EQ(fi.problem, "");
  ASSERT_EQ(fi.records.size(), kEntries);

  Children kids;
  Pipe gate(Pipe::Inherit::read_end);
  Pipe ready(Pipe::Inherit::write_end);
  Pipe done(Pipe::Inherit::write_end);
  Pipe exit_gate(Pipe::Inherit::read_end);
  std::vector<std::string> results;
  for (std::size_t r = 0; r < kReaders; ++r) {
    results.push_back(dir.file("smaps" + std::to_string(r)));
    kids.start("smaps", {arg("path", path), arg("count", kEntries), arg("size", kSize),
                         arg("ready_fd", ready.write_fd()), arg("gate_fd", gate.read_fd()),
                         arg("results", results.back()), arg("done_fd", done.write_fd()),
                         arg("exit_fd", exit_gate.read_fd())});
  }
  ready.close_write();
  done.close_write();
  gate.close_read();
  exit_gate.close_read();
  ASSERT_TRUE(ready.read_bytes(kReaders)) << "a reader failed before reading every entry";
  gate.close_write();  // all have read everything and are still alive: measure now
  ASSERT_TRUE(done.read_bytes(kReaders)) << "a reader failed to measure";
  exit_gate.close_write();  // all measured: now they may unmap and exit
  ASSERT_TRUE(kids.all_succeed());

  const double mib = 1024.0 * 1024.0;
  std::uint64_t sum_pss = 0, max_rss = 0;
  std::printf("sharing: %zu processes, cache file %.1f MiB (%zu entries of %zu KiB)\n", kReaders,
              static_cast<double>(fi.file_size) / mib, kEntries, kSize / 1024);
  std::printf("  proc       Rss MiB    Pss MiB   Shared_Clean MiB   Private_Dirty KiB\n");
  for (std::size_t r = 0; r < kReaders; ++r) {
    auto res = read_results(results[r]);
    std::printf("  %4zu  %10.2f %10.2f %18.2f %19.1f\n", r, static_cast<double>(res["rss"]) / mib,
                static_cast<double>(res["pss"]) / mib, static_cast<double>(res["shared_clean"]) / mib,
                static_cast<double>(res["private_dirty"]) / 1024.0);
    EXPECT_LT(res["private_dirty"], std::uint64_t{1} << 20) << "reader " << r << " holds private copies";
    // Each reader really touched (nearly) the whole file.
    EXPECT_GE(res["rss"], fi.payload() / 2) << "reader " << r;
    sum_pss += res["pss"];
    max_rss = std::max<std::uint64_t>(max_rss, res["rss"]);
  }
  std::printf("  sum of Pss %.2f MiB; resident %.2f MiB; %zu private copies would be %.2f MiB\n",
              static_cast<double>(sum_pss) / mib, static_cast<double>(max_rss) / mib, kReaders,
              static_cast<double>(kReaders * fi.file_size) / mib);
  EXPECT_LE(static_cast<double>(sum_pss), 1.3 * static_cast<double>(max_rss));
  EXPECT_GE(static_cast<double>(sum_pss), static_cast<double>(max_rss) / 1.3);
  EXPECT_LT(static_cast<double>(sum_pss), 0.5 * static_cast<double>(kReaders * fi.file_size));
}
#endif  // !_WIN32

}  // namespace
}  // namespace weightcache::test::mp
