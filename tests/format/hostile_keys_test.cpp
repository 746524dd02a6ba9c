// Keys a hostile file chooses to collide in the index checks' hash table: the duplicate-key
// check of check_layout (every open runs it) hashes with a seed random per process, so keys
// picked against the unseeded hash (all in one probe run) cost it no more than any other keys.
// Counted in slots visited, not time: format::duplicate_check_probes().
#include "format/format.hpp"

#include <gtest/gtest.h>
#define XXH_INLINE_ALL  // as the library uses it: header-only
#include <xxhash.h>

#include <cstring>
#include <string>
#include <vector>

namespace weightcache::format {
namespace {

TEST(HostileKeys, KeysCollidingInTheUnseededHashDoNotMakeTheDuplicateCheckQuadratic) {
  constexpr std::size_t kRecords = 2048;
  constexpr std::size_t kSlots = 4096;  // check_layout's table for kRecords: the power of two >= 2n
  // 8-byte keys whose unseeded hash lands in slot 0 of that table: one probe run of kRecords.
  std::vector<IndexRecord> records;
  for (std::uint64_t k = 0; records.size() < kRecords; ++k) {
    char key[8];
    std::memcpy(key, &k, sizeof key);
    if ((XXH3_64bits(key, sizeof key) & (kSlots - 1)) != 0) continue;
    IndexRecord r;
    r.key.assign(key, sizeof key);
    r.offset = kHeaderSize + 64 * records.size();
    r.size = 0;
    records.push_back(r);
  }
  const std::uint64_t before = duplicate_check_probes();
  std::string detail;
  EXPECT_EQ(check_layout(records, kHeaderSize, kHeaderSize + 64 * kRecords + 64, 64, &detail), Problem::none)
      << detail;
  const std::uint64_t probes = duplicate_check_probes() - before;
  // Linear probing at half load visits about 1.5 slots per record; unseeded, these keys would
  // visit n^2 / 2 (about 2.1 million).
  EXPECT_GE(probes, kRecords);
  EXPECT_LE(probes, 8 * kRecords) << "the duplicate check probed as if the file chose its slots";

  // And a real duplicate among them is still found.
  records.back().key = records.front().key;
  EXPECT_EQ(check_layout(records, kHeaderSize, kHeaderSize + 64 * kRecords + 64, 64, &detail), Problem::bad_value);
}

}  // namespace
}  // namespace weightcache::format
