// Sharing is real: N processes that read every entry of one cache share its page-cache pages.
// On Linux each one's Private_Dirty for the file stays near zero and the sum of their Pss is
// about the resident size of the file once, not N times it (/proc/<pid>/smaps). Windows has no
// Pss; there every resident page of the entries must be a shared (file) page in each reader,
// none a private copy (QueryWorkingSetEx). Prints the figures.
#include "mp_test_util.hpp"

#include <cstdio>

namespace weightcache::test::mp {
namespace {

// Writes own/smaps/0..entries-1, synced, and closes the cache: the test process maps nothing of
// the file while the readers measure.
void write_cache(const std::string& path, std::size_t entries, std::size_t size) {
  Options o = cache_options(path);
  o.durability = Durability::full;  // written back and synced: readers map clean pages
  auto opened = WeightCache::open(o);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  for (std::size_t j = 0; j < entries; ++j) {
    const std::string key = own_key("smaps", j);
    void* p = opened->reserve(size);
    ASSERT_NE(p, nullptr) << last_error().message;
    fill_for_key(key, p, size);
    ASSERT_NE(opened->look_up_or_insert(key, p, size), kNotFound) << last_error().message;
  }
  ASSERT_TRUE(opened->finalize().ok()) << last_error().message;
}

// Runs `readers` helpers in `mode` at once: each reads every entry, then all measure while every
// one of them still maps the file, then all exit. Returns each one's results.
std::vector<std::map<std::string, std::uint64_t>> measure(const TempDir& dir, const std::string& mode,
                                                          const std::string& path, std::size_t readers,
                                                          std::size_t entries, std::size_t size) {
  Children kids;
  Pipe gate(Pipe::Inherit::read_end);
  Pipe ready(Pipe::Inherit::write_end);
  Pipe done(Pipe::Inherit::write_end);
  Pipe exit_gate(Pipe::Inherit::read_end);
  std::vector<std::string> results;
  for (std::size_t r = 0; r < readers; ++r) {
    results.push_back(dir.file(mode + std::to_string(r)));
    kids.start(mode, {arg("path", path), arg("count", entries), arg("size", size), arg("ready_fd", ready.write_fd()),
                      arg("gate_fd", gate.read_fd()), arg("results", results.back()),
                      arg("done_fd", done.write_fd()), arg("exit_fd", exit_gate.read_fd())});
  }
  ready.close_write();
  done.close_write();
  gate.close_read();
  exit_gate.close_read();
  std::vector<std::map<std::string, std::uint64_t>> out;
  EXPECT_TRUE(ready.read_bytes(readers)) << "a reader failed before reading every entry";
  gate.close_write();  // all have read everything and are still alive: measure now
  EXPECT_TRUE(done.read_bytes(readers)) << "a reader failed to measure";
  exit_gate.close_write();  // all measured: now they may unmap and exit
  EXPECT_TRUE(kids.all_succeed());
  for (const auto& r : results) out.push_back(read_results(r));
  return out;
}

// What a sharing test measures: the cache it wrote and each reader's results.
struct Shared {
  FileIndex fi;
  std::vector<std::map<std::string, std::uint64_t>> res;
};

// Writes a cache of `entries` entries of `size` bytes in `dir`, checks that it decodes with
// every entry, and has `readers` helpers in `mode` read and measure it (see measure). The
// caller returns if HasFailure().
void write_and_measure(const TempDir& dir, const std::string& mode, std::size_t readers, std::size_t entries,
                       std::size_t size, Shared* out) {
  const std::string path = dir.file("cache.wcache");
  write_cache(path, entries, size);
  if (::testing::Test::HasFatalFailure()) return;
  out->fi = decode_file(path);
  ASSERT_EQ(out->fi.problem, "");
  ASSERT_EQ(out->fi.records.size(), entries);
  out->res = measure(dir, mode, path, readers, entries, size);
}

#ifndef _WIN32
TEST(MultiProcess, ReadersShareTheCachesPagesPssAndPrivateDirty) {
  constexpr std::size_t kReaders = 4, kEntries = 256, kSize = 256 * 1024;  // 64 MiB
  TempDir dir("wc-mp");
  Shared shared;
  write_and_measure(dir, "smaps", kReaders, kEntries, kSize, &shared);
  if (HasFailure()) return;
  const auto& [fi, res] = shared;

  const double mib = 1024.0 * 1024.0;
  std::uint64_t sum_pss = 0, max_rss = 0;
  std::printf("sharing: %zu processes, cache file %.1f MiB (%zu entries of %zu KiB)\n", kReaders,
              static_cast<double>(fi.file_size) / mib, kEntries, kSize / 1024);
  std::printf("  proc       Rss MiB    Pss MiB   Shared_Clean MiB   Private_Dirty KiB\n");
  for (std::size_t r = 0; r < kReaders; ++r) {
    auto u = res[r];
    std::printf("  %4zu  %10.2f %10.2f %18.2f %19.1f\n", r, static_cast<double>(u["rss"]) / mib,
                static_cast<double>(u["pss"]) / mib, static_cast<double>(u["shared_clean"]) / mib,
                static_cast<double>(u["private_dirty"]) / 1024.0);
    EXPECT_LT(u["private_dirty"], std::uint64_t{1} << 20) << "reader " << r << " holds private copies";
    // Each reader really touched (nearly) the whole file.
    EXPECT_GE(u["rss"], fi.payload() / 2) << "reader " << r;
    sum_pss += u["pss"];
    max_rss = std::max<std::uint64_t>(max_rss, u["rss"]);
  }
  std::printf("  sum of Pss %.2f MiB; resident %.2f MiB; %zu private copies would be %.2f MiB\n",
              static_cast<double>(sum_pss) / mib, static_cast<double>(max_rss) / mib, kReaders,
              static_cast<double>(kReaders * fi.file_size) / mib);
  EXPECT_LE(static_cast<double>(sum_pss), 1.3 * static_cast<double>(max_rss));
  EXPECT_GE(static_cast<double>(sum_pss), static_cast<double>(max_rss) / 1.3);
  EXPECT_LT(static_cast<double>(sum_pss), 0.5 * static_cast<double>(kReaders * fi.file_size));
}
#else
// Windows reports no Pss, and under Wine no per-page share count either: what holds everywhere
// is that the pages a reader is served are shared pages of the file's mapping, not private
// copies (the flag is per page, so 16 MiB shows it as well as 64 MiB would, in less time).
TEST(MultiProcess, ReadersAreServedSharedPagesNotPrivateCopies) {
  constexpr std::size_t kReaders = 4, kEntries = 64, kSize = 256 * 1024;  // 16 MiB
  TempDir dir("wc-mp");
  Shared shared;
  write_and_measure(dir, "pages", kReaders, kEntries, kSize, &shared);
  if (HasFailure()) return;
  const auto& [fi, res] = shared;

  std::printf("sharing: %zu processes, %zu entries of %zu KiB\n", kReaders, kEntries, kSize / 1024);
  std::printf("  proc   entry pages   resident   shared   private\n");
  for (std::size_t r = 0; r < kReaders; ++r) {
    auto u = res[r];
    std::printf("  %4zu  %12llu %10llu %8llu %9llu\n", r, static_cast<unsigned long long>(u["pages"]),
                static_cast<unsigned long long>(u["valid"]), static_cast<unsigned long long>(u["shared"]),
                static_cast<unsigned long long>(u["valid"] - u["shared"]));
    EXPECT_EQ(u["backing_file"], 1u) << "reader " << r;
    EXPECT_GE(u["pages"] * u["page_size"], fi.payload()) << "reader " << r;
    // Each reader really has (nearly) every page it read resident, and each of them shared.
    EXPECT_GE(u["valid"], u["pages"] / 2) << "reader " << r;
    EXPECT_EQ(u["shared"], u["valid"]) << "reader " << r << " holds private copies of cache pages";
  }
}
#endif

}  // namespace
}  // namespace weightcache::test::mp
