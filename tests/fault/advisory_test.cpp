// The advisory OS calls: madvise for huge pages and read-ahead may fail in any way without
// effect, and MADV_POPULATE_READ's failure means "these pages cannot be read" (a miss) only for
// EFAULT and EHWPOISON; any other error means "go on and read them". The fault sweep fails these
// calls too, but checks only that nothing goes wrong; here each errno's outcome is pinned.
#include "hooks.hpp"
#include "key_content.hpp"
#include "platform/platform.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <unistd.h>

namespace {

namespace platform = weightcache::platform;
using wctest::Call;
using wctest::Decision;

// Fails every madvise with `err` (only the first one when !persistent) and counts them.
struct FailMadvise {
  int calls = 0;
  wctest::Hooks hooks;
  FailMadvise(int err, bool persistent = true)
      : hooks([this, err, persistent](Call c, std::uint64_t) {
          if (c != Call::madvise) return Decision{};
          return ++calls == 1 || persistent ? Decision{Decision::fail, err} : Decision{};
        }) {}
};

#if defined(__linux__) || defined(SEEK_HOLE)
// The cache of these tests, in `dir`. Every open checks the entry again: with Verify::shared the
// first open's verdict would be recorded and trusted by the next, and no later one would ask
// the failing call.
weightcache::Options advisory_options(const weightcache::test::TempDir& dir) {
  weightcache::Options o;
  o.path = dir.file("cache.wc");
  o.compat_key = "advisory-v1";
  o.verify = weightcache::Verify::first_use;
  return o;
}

// A finalized cache at o.path holding `bytes` under `key`.
void write_entry(const weightcache::Options& o, const std::string& key, const std::string& bytes) {
  auto c = weightcache::WeightCache::open(o);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_NE(c->insert(key, bytes), weightcache::kNotFound);
  ASSERT_TRUE(c->finalize());
}

// An advisory call failing with `err`, and whether the entry must still be a hit then.
struct Case {
  int err;
  bool hit;
};

// What a look-up (`off`, in `c`) of the entry `bytes` gave while the call failed as k says: the
// right bytes when k.hit, else a miss counted as a failed verification.
void expect_outcome(weightcache::WeightCache& c, std::size_t off, const Case& k, const std::string& bytes) {
  if (!k.hit) {
    EXPECT_EQ(off, weightcache::kNotFound) << std::strerror(k.err);
    EXPECT_EQ(c.stats().verify_failures, 1u) << std::strerror(k.err);
    return;
  }
  ASSERT_NE(off, weightcache::kNotFound) << std::strerror(k.err);
  const auto* p = static_cast<const char*>(c.offset_to_addr(off));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(std::memcmp(p, bytes.data(), bytes.size()), 0) << std::strerror(k.err);
}
#endif

#ifdef __linux__
class PopulateRead : public ::testing::Test {
 protected:
  static constexpr std::size_t kLen = 1 << 20;

  void SetUp() override {
    auto& os = platform::os();
    auto h = os.open_file(dir_.file("data"), platform::OpenMode::create_new, 0600, false);
    ASSERT_TRUE(h.ok()) << h.error().message;
    file_ = std::move(h).value();
    ASSERT_TRUE(os.allocate(file_, 0, kLen).ok());
    auto at = os.reserve_address_space(kLen, os.map_granularity());
    ASSERT_TRUE(at.ok()) << at.error().message;
    at_ = at.value();
    FailMadvise fail(EINVAL);  // MADV_HUGEPAGE refused: the mapping is there all the same
    ASSERT_TRUE(os.map_file(file_, 0, kLen, at_, false).ok());
    EXPECT_EQ(fail.calls, 1);
    EXPECT_EQ(static_cast<const char*>(at_)[kLen - 1], 0);
  }
  void TearDown() override {
    if (at_ != nullptr) platform::os().release_address_space(at_, kLen);
    file_.close();
  }

  weightcache::test::TempDir dir_{"wc-advisory"};
  platform::File file_;
  void* at_ = nullptr;
};

TEST_F(PopulateRead, UnreadableOnlyForEfaultAndEhwpoison) {
  for (int err : {EFAULT, EHWPOISON}) {
    FailMadvise fail(err);
    EXPECT_FALSE(platform::os().populate_read(at_, kLen)) << std::strerror(err);
    EXPECT_EQ(fail.calls, 1);
  }
  for (int err : {EINVAL, ENOMEM, EIO, EPERM}) {
    FailMadvise fail(err);
    EXPECT_TRUE(platform::os().populate_read(at_, kLen)) << std::strerror(err);
    EXPECT_EQ(fail.calls, 1) << std::strerror(err);
  }
}

TEST_F(PopulateRead, RetriesInterruptionsAndGivesUpOnEagainAfterAFewTries) {
  {
    FailMadvise fail(EINTR, /*persistent=*/false);
    EXPECT_TRUE(platform::os().populate_read(at_, kLen));
    EXPECT_EQ(fail.calls, 2);  // retried, and the retry went through
  }
  {
    FailMadvise fail(EAGAIN, /*persistent=*/false);
    EXPECT_TRUE(platform::os().populate_read(at_, kLen));
    EXPECT_EQ(fail.calls, 2);
  }
  {
    FailMadvise fail(EAGAIN);  // never stops: must not spin forever, and the pages are still readable
    EXPECT_TRUE(platform::os().populate_read(at_, kLen));
    EXPECT_GT(fail.calls, 1);
    EXPECT_LE(fail.calls, 4);
  }
}

TEST_F(PopulateRead, PrefetchFailureIsHarmless) {
  for (int err : {EINVAL, ENOMEM, EAGAIN, EIO, EBADF}) {
    FailMadvise fail(err);
    platform::os().prefetch(static_cast<char*>(at_) + 100, kLen - 100);
    EXPECT_EQ(fail.calls, 1);  // it went through the call table
  }
  EXPECT_EQ(static_cast<const char*>(at_)[0], 0);
}

// End to end: an entry big enough to be populated before its check (256 KiB and more).
TEST(AdvisoryCalls, PopulateFailureIsAMissOnlyWhenThePagesCannotBeRead) {
  weightcache::set_log_level(weightcache::LogLevel::off);
  weightcache::test::TempDir dir("wc-advisory");
  const weightcache::Options o = advisory_options(dir);
  const std::string key = "big";
  const std::string bytes = weightcache::test::bytes_for_key(key, 1 << 20);
  ASSERT_NO_FATAL_FAILURE(write_entry(o, key, bytes));
  for (const Case& k : {Case{EFAULT, false}, Case{EHWPOISON, false}, Case{EINVAL, true}, Case{ENOMEM, true},
                        Case{EAGAIN, true}, Case{EIO, true}}) {
    FailMadvise fail(k.err);  // MADV_HUGEPAGE at open fails too, to no effect
    auto c = weightcache::WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << std::strerror(k.err) << ": " << c.error().message;
    const std::size_t off = c->look_up(key);
    EXPECT_GE(fail.calls, 2) << std::strerror(k.err);  // the map's advice and the populate
    ASSERT_NO_FATAL_FAILURE(expect_outcome(c.value(), off, k, bytes));
  }
  {  // Without faults the entry is there: the misses above were verdicts of one open, not damage.
    auto c = weightcache::WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_NE(c->look_up(key), weightcache::kNotFound);
  }
  weightcache::set_log_level(weightcache::LogLevel::warn);
}
#endif

#ifdef SEEK_HOLE
// The hole check of a big entry (lseek SEEK_HOLE, through the call table) is advice too: a
// failure or "not supported" means "assume allocated", and the checksum decides; only ENXIO
// ("the range starts past the end of the file") is an answer, and a miss.
TEST(AdvisoryCalls, HoleCheckFailureLeavesTheVerdictToTheChecksum) {
  weightcache::set_log_level(weightcache::LogLevel::off);
  weightcache::test::TempDir dir("wc-advisory");
  weightcache::Options o = advisory_options(dir);
  o.verify_ahead = false;  // the look-up does the checking, so the outcome is its own
  const std::string key = "big";
  const std::string bytes = weightcache::test::bytes_for_key(key, 24 << 20);  // over the 16 MiB threshold
  ASSERT_NO_FATAL_FAILURE(write_entry(o, key, bytes));
  for (const Case& k : {Case{EIO, true}, Case{EINVAL, true}, Case{EOPNOTSUPP, true}, Case{EBADF, true},
                        Case{ENXIO, false}}) {
    int seeks = 0;
    wctest::Hooks hooks([&](Call c, std::uint64_t) {
      if (c != Call::lseek) return Decision{};
      ++seeks;
      return Decision{Decision::fail, k.err};
    });
    auto c = weightcache::WeightCache::open(o);
    ASSERT_TRUE(c.ok()) << std::strerror(k.err) << ": " << c.error().message;
    const std::size_t off = c->look_up(key);
    EXPECT_EQ(seeks, 1) << std::strerror(k.err);
    ASSERT_NO_FATAL_FAILURE(expect_outcome(c.value(), off, k, bytes));
  }
  weightcache::set_log_level(weightcache::LogLevel::warn);
}
#endif

}  // namespace
