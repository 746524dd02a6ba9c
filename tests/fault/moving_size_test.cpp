// A reader fstat()s the cache file, then reads its header. A writer on another name of the same
// file (a hard link has its own lock file) or in another process may grow the file and commit
// twice in between: both commit slots then name commits that end past the size the reader saw.
// That is a file that moved, not a damaged one: opening and refreshing must read it again, never
// call it corrupt (which sends an opener to a heap cache, or has a lone opener rebuild the file).
//
// The interleaving is made deterministic here: the fstat of the cache file reports the size it
// had before the two commits until its header has been read, as a reader that lost the race sees.
#include "key_content.hpp"
#include "platform/posix_calls.hpp"
#include "temp_dir.hpp"

#include <weightcache/inspect.hpp>
#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace {

using weightcache::Backing;
using weightcache::kNotFound;
using weightcache::Options;
using weightcache::WeightCache;
namespace platform = weightcache::platform;

constexpr std::size_t kEntrySize = 256 << 10;
constexpr int kPerBatch = 3;

std::string key_of(int batch, int i) { return "batch" + std::to_string(batch) + "/w" + std::to_string(i); }

void insert_batch(WeightCache& c, int batch) {
  for (int i = 0; i < kPerBatch; ++i) {
    const std::string k = key_of(batch, i);
    void* p = c.reserve(kEntrySize);
    ASSERT_NE(p, nullptr);
    weightcache::test::fill_for_key(k, p, kEntrySize);
    ASSERT_NE(c.look_up_or_insert(k, p, kEntrySize), kNotFound);
  }
}

std::uint64_t size_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<std::uint64_t>(st.st_size);
}

// Until the cache file's header is read, its fstat reports `stale_size`.
struct StaleSizeUntilHeaderRead {
  static inline std::atomic<ino_t> inode{0};
  static inline std::atomic<std::uint64_t> stale_size{0};
  static inline std::atomic<bool> header_read{false};
  static inline std::atomic<int> stale_reports{0};

  static bool is_cache_file(int fd) {
    struct stat st {};
    return platform::default_posix_calls().fstat(fd, &st) == 0 && st.st_ino == inode.load();
  }
  static int fstat(int fd, struct stat* st) {
    const int r = platform::default_posix_calls().fstat(fd, st);
    if (r == 0 && st->st_ino == inode.load() && !header_read.load()) {
      st->st_size = static_cast<off_t>(stale_size.load());
      stale_reports.fetch_add(1);
    }
    return r;
  }
  static ssize_t pread(int fd, void* buf, size_t n, off_t off) {
    const ssize_t r = platform::default_posix_calls().pread(fd, buf, n, off);
    if (off == 0 && r > 0 && is_cache_file(fd)) header_read = true;
    return r;
  }

  StaleSizeUntilHeaderRead(const std::string& path, std::uint64_t size) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    inode = st.st_ino;
    stale_size = size;
    header_read = false;
    stale_reports = 0;
    platform::posix_calls().fstat = &fstat;
    platform::posix_calls().pread = &pread;
  }
  ~StaleSizeUntilHeaderRead() {
    platform::posix_calls().fstat = platform::default_posix_calls().fstat;
    platform::posix_calls().pread = platform::default_posix_calls().pread;
  }
};

Options options_for(const std::string& path) {
  Options o;
  o.path = path;
  o.backing = Backing::file;
  o.verify_ahead = false;
  return o;
}

void expect_all_batches(WeightCache& c, int batches) {
  for (int b = 0; b < batches; ++b)
    for (int i = 0; i < kPerBatch; ++i) {
      const std::string k = key_of(b, i);
      const std::size_t off = c.look_up(k);
      ASSERT_NE(off, kNotFound) << k;
      EXPECT_EQ(std::string(static_cast<const char*>(c.offset_to_addr(off)), kEntrySize),
                weightcache::test::bytes_for_key(k, kEntrySize))
          << k;
    }
}

// Writes batch 0, finalizes, and returns the file's size then; batches 1 .. batches-1 follow,
// each with its own finalize: with three batches both commit slots end past that size, with two
// the newest does and the older one still fits.
std::uint64_t commits_after(const std::string& path, int batches, WeightCache* reader_between = nullptr,
                            Options* reader_options = nullptr) {
  auto w = WeightCache::open(options_for(path));
  EXPECT_TRUE(w) << w.error().message;
  if (!w) return 0;
  insert_batch(*w, 0);
  EXPECT_TRUE(w->finalize());
  const std::uint64_t first = size_of(path);
  if (reader_between != nullptr) {
    auto r = WeightCache::open(*reader_options);
    EXPECT_TRUE(r) << r.error().message;
    if (r) *reader_between = std::move(r.value());
  }
  for (int b = 1; b < batches; ++b) {
    insert_batch(*w, b);
    EXPECT_TRUE(w->finalize());
  }
  EXPECT_GT(size_of(path), first) << "the later commits did not grow the file";
  return first;
}

std::uint64_t three_commits(const std::string& path, WeightCache* reader_between = nullptr,
                            Options* reader_options = nullptr) {
  return commits_after(path, 3, reader_between, reader_options);
}

TEST(MovingSize, AnOpenerThatSawTheSizeBeforeTwoCommitsReadsTheFileAgain) {
  weightcache::test::TempDir dir("wc-fault-moving");
  const std::string path = dir.file("cache.wc");
  const std::uint64_t stale = three_commits(path);
  ASSERT_FALSE(testing::Test::HasFailure());

  for (bool read_only : {true, false}) {
    SCOPED_TRACE(read_only ? "read-only opener" : "writing opener");
    Options o = options_for(path);
    o.read_only = read_only;
    StaleSizeUntilHeaderRead race(path, stale);
    auto c = WeightCache::open(o);
    ASSERT_TRUE(c) << c.error().message;
    ASSERT_GT(race.stale_reports.load(), 0) << "the stale size was never reported: the race was not made";
    EXPECT_EQ(c->stats().backing, Backing::file) << "the file was taken for damaged; the cache fell back to the heap";
    expect_all_batches(*c, 3);
  }
  EXPECT_GE(size_of(path), stale) << "the file was rebuilt";
}

TEST(MovingSize, ARefreshThatSawTheSizeBeforeTwoCommitsReadsTheFileAgain) {
  weightcache::test::TempDir dir("wc-fault-moving");
  const std::string path = dir.file("cache.wc");
  Options ro = options_for(path);
  ro.read_only = true;
  WeightCache reader;
  const std::uint64_t stale = three_commits(path, &reader, &ro);
  ASSERT_FALSE(testing::Test::HasFailure());
  ASSERT_EQ(reader.look_up(key_of(2, 0)), kNotFound) << "the reader opened after the later commits";

  StaleSizeUntilHeaderRead race(path, stale);
  const auto refreshed = reader.refresh();
  ASSERT_TRUE(refreshed) << refreshed.error().message;
  ASSERT_GT(race.stale_reports.load(), 0) << "the stale size was never reported: the race was not made";
  expect_all_batches(reader, 3);
}

// One commit past the size seen: the newest slot points past it while the older one still fits.
// That is no more damage than two commits are: a read-only opener, which cannot repair anything,
// must read again and serve the newest commit, not fall back to the older one.
TEST(MovingSize, AnOpenerThatSawTheSizeBeforeOneCommitReadsTheFileAgain) {
  weightcache::test::TempDir dir("wc-fault-moving");
  const std::string path = dir.file("cache.wc");
  const std::uint64_t stale = commits_after(path, 2);
  ASSERT_FALSE(testing::Test::HasFailure());

  for (bool read_only : {true, false}) {
    SCOPED_TRACE(read_only ? "read-only opener" : "writing opener");
    Options o = options_for(path);
    o.read_only = read_only;
    StaleSizeUntilHeaderRead race(path, stale);
    auto c = WeightCache::open(o);
    ASSERT_TRUE(c) << c.error().message;
    ASSERT_GT(race.stale_reports.load(), 0) << "the stale size was never reported: the race was not made";
    EXPECT_EQ(c->stats().backing, Backing::file);
    expect_all_batches(*c, 2);
  }
}

TEST(MovingSize, ARefreshThatSawTheSizeBeforeOneCommitReadsTheFileAgain) {
  weightcache::test::TempDir dir("wc-fault-moving");
  const std::string path = dir.file("cache.wc");
  Options ro = options_for(path);
  ro.read_only = true;
  WeightCache reader;
  const std::uint64_t stale = commits_after(path, 2, &reader, &ro);
  ASSERT_FALSE(testing::Test::HasFailure());
  ASSERT_EQ(reader.look_up(key_of(1, 0)), kNotFound) << "the reader opened after the later commit";

  StaleSizeUntilHeaderRead race(path, stale);
  const auto refreshed = reader.refresh();
  ASSERT_TRUE(refreshed) << refreshed.error().message;
  ASSERT_GT(race.stale_reports.load(), 0) << "the stale size was never reported: the race was not made";
  expect_all_batches(reader, 2);
}

// Inspection (weightcache/inspect.hpp, what `weightcache verify` and `info` print) reads with the
// same rule: a file that moved under the read is read again, and reported sound, whether one or
// both commit slots end past the size first seen.
TEST(MovingSize, AnInspectionThatSawTheSizeBeforeACommitReadsTheFileAgain) {
  for (int batches : {2, 3}) {
    SCOPED_TRACE(std::to_string(batches - 1) + " commits past the size seen");
    weightcache::test::TempDir dir("wc-fault-moving");
    const std::string path = dir.file("cache.wc");
    const std::uint64_t stale = commits_after(path, batches);
    ASSERT_FALSE(testing::Test::HasFailure());
    std::uint64_t newest = 0;  // the sequence of the last commit, read without a race
    {
      auto f = weightcache::inspect::File::open(path);
      ASSERT_TRUE(f) << f.error().message;
      auto in = weightcache::inspect::inspect(f.value());
      ASSERT_TRUE(in && in->findings.empty() && in->slot_index >= 0);
      newest = in->commit.sequence;
    }

    StaleSizeUntilHeaderRead race(path, stale);
    auto f = weightcache::inspect::File::open(path);
    ASSERT_TRUE(f) << f.error().message;
    ASSERT_EQ(f->size(), stale) << "the stale size was not reported at open: the race was not made";
    auto in = weightcache::inspect::inspect(f.value());
    ASSERT_TRUE(in) << in.error().message;
    for (const auto& finding : in->findings) ADD_FAILURE() << finding.kind << ": " << finding.message;
    EXPECT_TRUE(in->index_usable);
    EXPECT_FALSE(in->newest_commit_damaged);
    EXPECT_EQ(in->commit.sequence, newest);
    EXPECT_EQ(in->entries.size(), static_cast<std::size_t>(batches * kPerBatch));
    EXPECT_EQ(in->file_size, size_of(path)) << "the inspection did not read against the size that moved";
    EXPECT_EQ(f->size(), in->file_size);
  }
}

}  // namespace
