// Garbage collection with a live user (issue 12, part C): a directory of 20 caches over a budget,
// one of them held open by a separate process that reads every entry of it, pass after pass,
// while the real `weightcache gc` runs. The file in use survives with its reader undisturbed,
// the most recently used caches survive, and nothing that is not a cache file is touched.
// POSIX only (the CLI is); built only with the tools (WEIGHTCACHE_CLI_PATH).
#include "cli_run.hpp"
#include "file_time.hpp"
#include "mp_test_util.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace weightcache::test::mp {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kCaches = 20;
constexpr std::size_t kEntries = 4;
constexpr std::size_t kEntrySize = 64 * 1024;
constexpr std::int64_t kSecond = 1000000000;
constexpr std::int64_t kBase = std::int64_t{1700000000} * kSecond;

std::string cache_name(std::size_t i) { return "model-" + std::string(i < 10 ? "0" : "") + std::to_string(i) + ".wcache"; }
std::string tag_of(std::size_t i) { return "m" + std::to_string(i); }

std::uint64_t allocated(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
}
bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

TEST(GcWithALiveReader, RemovesTheLeastRecentlyUsedAndNeverTheFileInUse) {
  TempDir dir("weightcache-gc"), aux("weightcache-gc-aux");
  // Twenty caches, each written by the library (entries derived from their keys).
  for (std::size_t i = 0; i < kCaches; ++i) {
    auto c = WeightCache::open(cache_options(dir.file(cache_name(i))));
    ASSERT_TRUE(c.ok()) << c.error().message;
    for (std::size_t j = 0; j < kEntries; ++j) {
      const std::string key = own_key(tag_of(i), j);
      ASSERT_NE(c->insert(key, bytes_for_key(key, kEntrySize)), kNotFound);
    }
    ASSERT_TRUE(c->finalize().ok());
  }
  // Things that are not caches, which gc must leave as they are.
  const std::string notes = "not a cache\n", fake = bytes_for_key("fake", 8192);
  { std::ofstream(dir.file("README.txt"), std::ios::binary) << notes; }
  { std::ofstream(dir.file("x.wcache"), std::ios::binary) << fake; }
  ASSERT_TRUE(fs::create_directory(dir.file("nested")));
  {
    auto c = WeightCache::open(cache_options(dir.file("nested") + "/inner.wcache"));
    ASSERT_TRUE(c.ok());
    ASSERT_NE(c->insert("k", "v"), kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  ASSERT_EQ(::symlink(dir.file(cache_name(3)).c_str(), dir.file("link.wcache").c_str()), 0);

  // The reader: model-00, the least recently used of all, open in another process throughout.
  Children children;
  Pipe ready(Pipe::Inherit::write_end);
  const std::string stop = aux.file("stop"), results = aux.file("results");
  children.start("keep_reading", {arg("path", dir.file(cache_name(0))), arg("tag", tag_of(0)), arg("count", kEntries),
                                  arg("size", kEntrySize), arg("ready_fd", std::to_string(ready.write_fd())),
                                  arg("stop", stop), arg("results", results)});
  ready.close_write();
  ASSERT_TRUE(ready.read_bytes(1)) << "the reader did not start";

  // Use order: model-i was last used i seconds after the base (its lock file's time; opening
  // touched model-00's, which is put back here). The files themselves were written before.
  std::uint64_t per_cache = 0, total = 0;
  for (std::size_t i = 0; i < kCaches; ++i) {
    const std::string f = dir.file(cache_name(i));
    ASSERT_TRUE(set_file_mtime(f, kBase - 1000 * kSecond));
    ASSERT_TRUE(set_file_mtime(f + ".lock", kBase + static_cast<std::int64_t>(i) * kSecond));
    const std::uint64_t bytes = allocated(f) + allocated(f + ".lock");
    if (i == 0) per_cache = bytes;
    ASSERT_EQ(bytes, per_cache) << "the caches are meant to take the same space";
    total += bytes;
  }
  // Room for five: the file in use and the four most recently used.
  const std::uint64_t budget = 5 * per_cache;
  const CliRun r = run_cli(aux, {"gc", dir.path().string(), "--max-size", std::to_string(budget), "--json"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["total_before"].get<std::uint64_t>(), total);
  EXPECT_EQ(j["total_after"].get<std::uint64_t>(), budget);
  EXPECT_EQ(j["removed_files"].get<std::uint64_t>(), kCaches - 5);
  EXPECT_EQ(j["kept_in_use"].get<std::uint64_t>(), 1u);
  const nlohmann::json* in_use = nullptr;
  for (const auto& f : j["files"])
    if (f["path"] == dir.file(cache_name(0))) in_use = &f;
  ASSERT_NE(in_use, nullptr) << r.out;
  EXPECT_EQ((*in_use)["bytes"].get<std::uint64_t>(), per_cache);
  EXPECT_EQ((*in_use)["action"], "kept");
  EXPECT_EQ((*in_use)["reason"], "in_use");

  std::uint64_t after = 0;
  for (std::size_t i = 0; i < kCaches; ++i) {
    const std::string f = dir.file(cache_name(i));
    const bool survives = i == 0 || i >= kCaches - 4;
    EXPECT_EQ(exists(f), survives) << cache_name(i);
    EXPECT_EQ(exists(f + ".lock"), survives) << cache_name(i);
    if (survives) after += allocated(f) + allocated(f + ".lock");
  }
  EXPECT_LE(after, budget);

  // The reader kept reading the right bytes all along, and still does; it ends on request.
  { std::ofstream(stop) << "stop\n"; }
  const ExitStatus st = children.wait(0);
  EXPECT_TRUE(st.ok()) << "the reader " << st.describe();
  EXPECT_GE(read_results(results)["passes"], 2u);

  EXPECT_EQ(read_file(dir.file("README.txt")), notes);
  EXPECT_EQ(read_file(dir.file("x.wcache")), fake);
  EXPECT_TRUE(exists(dir.file("nested") + "/inner.wcache"));
  EXPECT_TRUE(fs::is_symlink(dir.file("link.wcache")));

  // With the reader gone, nothing holds model-00: a budget of 1 KiB leaves no cache.
  const CliRun last = run_cli(aux, {"gc", dir.path().string(), "--max-size", "1K"});
  EXPECT_EQ(last.code, 0) << last.out << last.err;
  EXPECT_FALSE(exists(dir.file(cache_name(0))));
  EXPECT_TRUE(exists(dir.file("README.txt")));
}

TEST(GcWithALiveReader, ExitsBusyWhenTheFileInUseKeepsTheDirectoryOverBudget) {
  TempDir dir("weightcache-gc"), aux("weightcache-gc-aux");
  for (std::size_t i = 0; i < 2; ++i) {
    auto c = WeightCache::open(cache_options(dir.file(cache_name(i))));
    ASSERT_TRUE(c.ok()) << c.error().message;
    const std::string key = own_key(tag_of(i), 0);
    ASSERT_NE(c->insert(key, bytes_for_key(key, kEntrySize)), kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  Children children;
  Pipe ready(Pipe::Inherit::write_end);
  const std::string stop = aux.file("stop"), results = aux.file("results");
  children.start("keep_reading", {arg("path", dir.file(cache_name(0))), arg("tag", tag_of(0)), arg("count", 1),
                                  arg("size", kEntrySize), arg("ready_fd", std::to_string(ready.write_fd())),
                                  arg("stop", stop), arg("results", results)});
  ready.close_write();
  ASSERT_TRUE(ready.read_bytes(1)) << "the reader did not start";
  const CliRun r = run_cli(aux, {"gc", dir.path().string(), "--max-size", "0"});
  EXPECT_EQ(r.code, 4) << r.out << r.err;
  EXPECT_NE(r.out.find("in use"), std::string::npos) << r.out;
  EXPECT_TRUE(exists(dir.file(cache_name(0))));
  EXPECT_FALSE(exists(dir.file(cache_name(1))));
  { std::ofstream(stop) << "stop\n"; }
  const ExitStatus st = children.wait(0);
  EXPECT_TRUE(st.ok()) << "the reader " << st.describe();
}

}  // namespace
}  // namespace weightcache::test::mp
