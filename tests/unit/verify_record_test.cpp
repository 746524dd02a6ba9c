// The record of what a process verified (src/verify_record.hpp): it reads back as written, and
// any damage to it, any bit anywhere or a cut, makes it no record at all rather than another one.
#include "verify_record.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace weightcache {
namespace {

VerifyRecord sample(std::uint64_t entries) {
  VerifyRecord r;
  for (int i = 0; i < 16; ++i) r.stamp.boot[i] = static_cast<std::uint8_t>(i * 7 + 1);
  r.stamp.device = 2049;
  r.stamp.inode = 1234567;
  r.stamp.size = 1 << 20;
  r.stamp.mtime_ns = 1700000000123456789;
  r.stamp.ctime_ns = 1700000000223456789;
  r.stamp.sequence = 42;
  r.stamp.committed_size = 1 << 19;
  r.stamp.index_checksum = 0x0123456789abcdefull;
  r.stamp.entries = entries;
  r.verified.resize(entries);
  for (std::uint64_t i = 0; i < entries; ++i) r.verified[i] = i % 3 != 1;
  return r;
}

TEST(VerifyRecord, ReadsBackAsWritten) {
  for (std::uint64_t n : {0u, 1u, 7u, 8u, 9u, 1000u}) {
    const VerifyRecord r = sample(n);
    const auto bytes = encode_record(r);
    auto back = decode_record(bytes.data(), bytes.size(), n);
    ASSERT_TRUE(back.has_value()) << n;
    EXPECT_TRUE(back->stamp == r.stamp);
    EXPECT_EQ(back->verified, r.verified);
    // Bytes after it (a longer record written there before) are not part of it.
    auto longer = bytes;
    longer.resize(bytes.size() + 100, std::byte{0x5a});
    EXPECT_TRUE(decode_record(longer.data(), longer.size(), n).has_value());
  }
}

TEST(VerifyRecord, EveryFlippedBitAndEveryCutIsNoRecord) {
  const auto bytes = encode_record(sample(37));
  for (std::size_t i = 0; i < bytes.size() * 8; ++i) {
    auto damaged = bytes;
    damaged[i / 8] ^= std::byte{1} << (i % 8);
    EXPECT_FALSE(decode_record(damaged.data(), damaged.size(), 1u << 20).has_value()) << "bit " << i;
  }
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_record(bytes.data(), n, 1u << 20).has_value()) << "cut to " << n;
}

TEST(VerifyRecord, MoreEntriesThanTheCommitHasIsNoRecord) {
  const auto bytes = encode_record(sample(100));
  EXPECT_FALSE(decode_record(bytes.data(), bytes.size(), 99).has_value());
  EXPECT_TRUE(decode_record(bytes.data(), bytes.size(), 100).has_value());
}

TEST(VerifyRecord, AStampDiffersInEveryField) {
  const StateStamp base = sample(4).stamp;
  auto differs = [&](auto edit) {
    StateStamp s = base;
    edit(s);
    return !(s == base);
  };
  EXPECT_TRUE(differs([](StateStamp& s) { s.boot[15] ^= 1; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.device; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.inode; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.size; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.mtime_ns; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.ctime_ns; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.sequence; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.committed_size; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.index_checksum; }));
  EXPECT_TRUE(differs([](StateStamp& s) { ++s.entries; }));
}

TEST(VerifyRecord, AChangeShowsOnlyWhenTheClockIsPastTheChangeTimeByTheWindow) {
  constexpr std::int64_t s = 1000000000;
  constexpr std::int64_t ms = 1000000;
  constexpr std::int64_t coarse = platform::kCoarseChangeWindowNs, fine = platform::kFineChangeWindowNs;
  // The coarse window (FAT, unknown file systems, whole-second times): nanosecond change times
  // get no less margin there, as a sub-second part alone does not prove a fine granularity.
  EXPECT_FALSE(change_would_show(100 * s + 5, 100 * s + 6, coarse));
  EXPECT_FALSE(change_would_show(100 * s + 5, 102 * s + 5, coarse));  // exactly 2 s: a change could hide
  EXPECT_TRUE(change_would_show(100 * s + 5, 102 * s + 6, coarse));
  EXPECT_FALSE(change_would_show(100 * s + 6, 100 * s + 5, coarse));  // a clock behind the file
  EXPECT_FALSE(change_would_show(100 * s, 101 * s, coarse));          // whole seconds: the same 2 s
  EXPECT_FALSE(change_would_show(100 * s, 102 * s, coarse));
  EXPECT_TRUE(change_would_show(100 * s, 102 * s + 1, coarse));
  // The fine window (nanosecond times from the coarse clock): one slow tick.
  EXPECT_FALSE(change_would_show(100 * s + 5, 100 * s + 6, fine));
  EXPECT_FALSE(change_would_show(100 * s + 5, 100 * s + 5 + 10 * ms, fine));  // exactly the window
  EXPECT_TRUE(change_would_show(100 * s + 5, 100 * s + 6 + 10 * ms, fine));
  EXPECT_TRUE(change_would_show(100 * s + 5, 100 * s + 5 + 50 * ms, fine));
  EXPECT_FALSE(change_would_show(100 * s + 50 * ms, 100 * s + 5, fine));  // a clock behind the file
  // Unknown times and a file system whose changes do not all show trust nothing.
  EXPECT_FALSE(change_would_show(0, 5 * s, fine));
  EXPECT_FALSE(change_would_show(5 * s + 1, 0, fine));
  EXPECT_FALSE(change_would_show(5 * s, 50 * s, 0));
}

}  // namespace
}  // namespace weightcache
