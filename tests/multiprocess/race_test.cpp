// Many writer processes at once on one path: the cold-start race (everyone packs the same
// weights plus a few of their own on an empty path) and concurrent appends of different keys.
// The file must end with every key exactly once, no append lost, little waste, right bytes.
#include "mp_test_util.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

namespace weightcache::test::mp {
namespace {

// One race: `processes` racers each insert `shared` keys common to all and `own` keys of their
// own, `size` bytes each, in `rounds` finalizes. Every race names all five (designated).
struct Race {
  std::size_t processes;
  std::size_t shared;
  std::size_t own;
  std::size_t rounds;
  std::size_t size;
};

// Launches the racers held behind one gate and opens it once all are started. Racer i opens
// names[i % names.size()] (several names: hard links to one file).
void run_race(const TempDir& dir, const std::vector<std::string>& names, const Race& race) {
  Children kids;
  Pipe gate(Pipe::Inherit::read_end);
  std::vector<std::string> results;
  for (std::size_t i = 0; i < race.processes; ++i) {
    results.push_back(dir.file("results" + std::to_string(i)));
    kids.start("pack", {arg("path", names[i % names.size()]), arg("tag", "p" + std::to_string(i)), arg("shared", race.shared),
                        arg("own", race.own), arg("rounds", race.rounds), arg("size", race.size),
                        arg("rotate", i * 4), arg("gate_fd", gate.read_fd()), arg("results", results.back())});
  }
  gate.close_read();
  gate.close_write();  // every racer starts now
  // Each child verified every byte it was served and that it never fell back to the heap
  // (exit code 12 / 13 otherwise).
  ASSERT_TRUE(kids.all_succeed());
  for (std::size_t i = 0; i < race.processes; ++i) {
    auto res = read_results(results[i]);
    EXPECT_EQ(res["heap_fallbacks"], 0u) << "process " << i;
    EXPECT_EQ(res["backing_file"], 1u) << "process " << i;
  }
}

// Every expected key once, right bytes (decode_file checks those), through the file and the API.
void check_file(const std::string& path, const Race& race) {
  std::set<std::string> want;
  for (std::size_t i = 0; i < race.shared; ++i) want.insert(shared_key(i));
  for (std::size_t p = 0; p < race.processes; ++p)
    for (std::size_t j = 0; j < race.own; ++j) want.insert(own_key("p" + std::to_string(p), j));

  const FileIndex fi = decode_file(path);
  ASSERT_EQ(fi.problem, "");
  // decode_trailer rejects duplicate keys, so equal counts and equal sets mean "each key once".
  EXPECT_EQ(fi.records.size(), want.size());
  const auto got = fi.keys();
  std::set<std::string> missing, extra;
  std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::inserter(missing, missing.end()));
  std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::inserter(extra, extra.end()));
  EXPECT_TRUE(missing.empty()) << "lost: " << entries_to_string(missing);
  EXPECT_TRUE(extra.empty()) << "unexpected: " << entries_to_string(extra);
  const double ratio = static_cast<double>(fi.file_size) / static_cast<double>(fi.payload());
  std::printf("%zu processes: file %llu bytes for %llu bytes of entries (%.4fx)\n", race.processes,
              static_cast<unsigned long long>(fi.file_size), static_cast<unsigned long long>(fi.payload()), ratio);
  EXPECT_LE(ratio, 1.2) << "file " << fi.file_size << " bytes, payload " << fi.payload();

  auto opened = WeightCache::open(cache_options(path));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  EXPECT_EQ(opened->stats().entries, want.size());
  for (const auto& key : want) EXPECT_EQ(check_entry(opened.value(), key, race.size), "");
}

// The race on `names` (all one file), then the checks of that file.
void race_and_check(const TempDir& dir, const std::vector<std::string>& names, const Race& race) {
  run_race(dir, names, race);
  if (::testing::Test::HasFatalFailure()) return;
  check_file(names.front(), race);
}

// A cache at `path` holding one shared key and finalized, so that racers only append.
void create_with_one_entry(const std::string& path) {
  auto opened = WeightCache::open(cache_options(path));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  ASSERT_NE(opened->insert(shared_key(0), bytes_for_key(shared_key(0), 64 * 1024)), kNotFound);
  ASSERT_TRUE(opened->finalize().ok());
}

TEST(MultiProcess, ColdStartRaceOfEightProcessesLeavesEachKeyOnce) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("cache.wcache");  // does not exist: every racer may create it
  race_and_check(dir, {path}, {.processes = 8, .shared = 32, .own = 4, .rounds = 1, .size = 128 * 1024});
}

TEST(MultiProcess, ConcurrentAppendsOfDifferentKeysAreAllKept) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("cache.wcache");
  // An existing file with one entry, so the racers only append (no creation race here).
  create_with_one_entry(path);
  if (HasFatalFailure()) return;
  // Three finalizes per process: leases alternate between processes, and each commit must
  // keep what the others committed in between.
  race_and_check(dir, {path}, {.processes = 6, .shared = 1, .own = 12, .rounds = 3, .size = 64 * 1024});
}

// Hard links give one file several names, and so several sidecar lock files: the writer lease
// must still be one per file, or two processes append at the same offsets.
TEST(MultiProcess, AppendsThroughTwoHardLinksToOneFileAreAllKept) {
  TempDir dir("wc-mp");
  const std::string path = dir.file("cache.wcache"), link = dir.file("other-name.wcache");
  create_with_one_entry(path);
  if (HasFatalFailure()) return;
  std::error_code ec;
  std::filesystem::create_hard_link(path, link, ec);
  if (ec) GTEST_SKIP() << "no hard links here: " << ec.message();
  race_and_check(dir, {path, link}, {.processes = 6, .shared = 1, .own = 12, .rounds = 3, .size = 64 * 1024});
}

}  // namespace
}  // namespace weightcache::test::mp
