// Files the library writes must obey docs/FORMAT.md in every writer scenario, not just the
// simple one: after each session the file is decoded with the format functions and checked
// (footer at EOF, every record aligned to the header's alignment and inside the data area, the
// previous commit's index intact) and then reopened to check every entry is served.
#include "file_image.hpp"
#include "random_bytes.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <map>

namespace weightcache {
namespace {

using test::Bytes;

// Checks the structural rules on the file at `path`; returns the newest commit's records.
std::vector<format::IndexRecord> check_file(const std::string& path, bool expect_trimmed = true) {
  const Bytes b = test::read_file(path);
  format::DecodedHeader h;
  EXPECT_EQ(format::decode_header(b, &h), format::Problem::none);
  std::vector<format::IndexRecord> newest;
  std::uint64_t best = 0, committed = 0;
  for (int i = 0; i < 2; ++i) {
    if (!h.slot_valid[i]) continue;
    const auto& s = h.slot[i];
    EXPECT_EQ(s.sequence % 2, static_cast<std::uint64_t>(i)) << "sequence in the wrong slot";
    EXPECT_TRUE(format::slot_in_bounds(s, b.size())) << "slot " << i;
    if (!format::slot_in_bounds(s, b.size())) continue;
    std::vector<format::IndexRecord> recs;
    std::string detail;
    const auto p = format::decode_trailer(std::span(b).subspan(s.index_offset, s.index_size + format::kFooterSize), s,
                                          h.fixed.alignment, &recs, &detail);
    EXPECT_EQ(p, format::Problem::none) << "slot " << i << " (sequence " << s.sequence << "): " << to_string(p) << " "
                                        << detail;
    if (s.sequence > best) {
      best = s.sequence;
      newest = recs;
      committed = s.committed_size;
    }
  }
  EXPECT_GT(best, 0u) << "no valid slot";
  if (expect_trimmed) {
    EXPECT_EQ(committed, b.size()) << "footer not at EOF";
  }
  return newest;
}

Options opts(const std::string& path, std::size_t alignment, std::size_t size_alignment = 1) {
  Options o;
  o.path = path;
  o.compat_key = "writer-invariants";
  o.alignment = alignment;
  o.size_alignment = size_alignment;
  o.backing = Backing::file;
  o.durability = Durability::none;
  return o;
}

void expect_served(const std::string& path, std::size_t alignment, const std::map<std::string, std::string>& want) {
  Options o = opts(path, alignment);
  o.read_only = true;
  auto cache = WeightCache::open(o);
  ASSERT_TRUE(cache) << cache.error().message;
  for (const auto& [k, v] : want) {
    const std::size_t off = cache->look_up(k);
    ASSERT_NE(off, kNotFound) << "key " << k << " lost";
    EXPECT_EQ(off % alignment, 0u);
    const void* p = cache->offset_to_addr(off);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(std::string(static_cast<const char*>(p), v.size()), v) << "key " << k;
  }
}

TEST(WriterInvariants, SeveralSessionsZeroSizeAndReplacedEntries) {
  test::TempDir dir("wc-format-writer");
  const std::string path = dir.file("c.wc");
  std::map<std::string, std::string> want;
  for (int session = 0; session < 4; ++session) {
    auto cache = WeightCache::open(opts(path, 64, 16));
    ASSERT_TRUE(cache) << cache.error().message;
    for (int i = 0; i < 5; ++i) {
      const std::string k = "s" + std::to_string(session) + "/" + std::to_string(i);
      const std::string v = test::random_bytes(session * 10 + i, static_cast<std::size_t>(i * 97 % 300));
      ASSERT_NE(cache->insert(k, v), kNotFound);
      want[k] = v;
    }
    // A key from the previous session stored again with other bytes replaces the old entry.
    if (session > 0) {
      const std::string k = "s" + std::to_string(session - 1) + "/1";
      want[k] = test::random_bytes(1000 + session, 77);
      ASSERT_NE(cache->insert(k, want[k]), kNotFound);
    }
    ASSERT_TRUE(cache->finalize());
  }
  const auto recs = check_file(path);
  EXPECT_EQ(recs.size(), want.size());
  expect_served(path, 64, want);
}

TEST(WriterInvariants, ReservationOutstandingAtFinalize) {
  test::TempDir dir("wc-format-writer");
  const std::string path = dir.file("c.wc");
  std::map<std::string, std::string> want;
  {
    auto cache = WeightCache::open(opts(path, 64));
    ASSERT_TRUE(cache) << cache.error().message;
    void* r = cache->reserve(5000);
    ASSERT_NE(r, nullptr);
    want["early"] = test::random_bytes(1, 100);
    ASSERT_NE(cache->insert("early", want["early"]), kNotFound);
    ASSERT_TRUE(cache->finalize());
    check_file(path, /*expect_trimmed=*/false);  // the reservation keeps the tail
    want["late"] = test::random_bytes(2, 5000);
    std::memcpy(r, want["late"].data(), 5000);
    ASSERT_NE(cache->look_up_or_insert("late", r, 5000), kNotFound);
    ASSERT_TRUE(cache->finalize());
  }
  check_file(path);
  expect_served(path, 64, want);
}

// A cache created with alignment 128 may be opened by a process asking for 64 (128 is a
// multiple of 64). Whatever that process appends must still satisfy the file's alignment, or
// the next reader rejects the index it wrote (and, one commit later, the whole file).
TEST(WriterInvariants, WriterWithSmallerAlignmentKeepsFileAlignment) {
  test::TempDir dir("wc-format-writer");
  const std::string path = dir.file("c.wc");
  std::map<std::string, std::string> want;
  {
    auto cache = WeightCache::open(opts(path, 128));
    ASSERT_TRUE(cache) << cache.error().message;
    want["a"] = test::random_bytes(1, 64);
    ASSERT_NE(cache->insert("a", want["a"]), kNotFound);
    ASSERT_TRUE(cache->finalize());
  }
  for (int session = 0; session < 2; ++session) {
    auto cache = WeightCache::open(opts(path, 64));
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_EQ(cache->stats().backing, Backing::file);
    for (int i = 0; i < 4; ++i) {
      const std::string k = "b" + std::to_string(session) + std::to_string(i);
      want[k] = test::random_bytes(10 + session * 4 + i, 64);
      ASSERT_NE(cache->insert(k, want[k]), kNotFound);
    }
    ASSERT_TRUE(cache->finalize());
  }
  check_file(path);
  expect_served(path, 128, want);
}

// A (hostile or very old) file whose newest slot holds the largest sequence. The next commit
// cannot take sequence 0 ("never written"): a finalize that reports success must leave its
// entries visible to the next open.
TEST(WriterInvariants, CommitAfterTheLargestSequence) {
  test::TempDir dir("wc-format-writer");
  const std::string path = dir.file("c.wc");
  {
    auto cache = WeightCache::open(opts(path, 64));
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_NE(cache->insert("a", "first"), kNotFound);
    ASSERT_TRUE(cache->finalize());
  }
  Bytes b = test::read_file(path);
  format::DecodedHeader h;
  ASSERT_EQ(format::decode_header(b, &h), format::Problem::none);
  const int newest = h.slot[1].sequence > h.slot[0].sequence ? 1 : 0;
  std::byte* s = b.data() + format::kSlotOffset[newest];
  format::put_u64(s, UINT64_MAX);
  format::put_u64(s + 56, format::hash_bytes(s, 56));
  test::write_file(path, b);
  // No writer of ours gets there: a forged header. The file is rebuilt (it used to be served and
  // then refuse every finalize forever), and the new file takes commits again.
  {
    auto cache = WeightCache::open(opts(path, 64));
    ASSERT_TRUE(cache) << cache.error().message;
    EXPECT_EQ(cache->stats().backing, Backing::file);
    EXPECT_EQ(cache->look_up("a"), kNotFound);
    ASSERT_NE(cache->insert("b", "second"), kNotFound);
    auto r = cache->finalize();
    ASSERT_TRUE(r.ok()) << r.error().message;
  }
  expect_served(path, 64, {{"b", "second"}});
}

// The next commit goes to the slot holding the lower sequence, never over the newest: a file
// whose slots hold [3, 2] (slot 0 newest) gets 4 in slot 1, and both older commits' indexes
// stay what they were until overwritten in turn.
TEST(WriterInvariants, CommitGoesToTheSlotWithTheLowerSequence) {
  test::TempDir dir("wc-format-writer");
  const std::string path = dir.file("c.wc");
  {
    auto cache = WeightCache::open(opts(path, 64));
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_NE(cache->insert("a", "first"), kNotFound);
    ASSERT_TRUE(cache->finalize());  // sequence 2, in slot 0; slot 1 holds 1
  }
  Bytes b = test::read_file(path);
  format::DecodedHeader h;
  ASSERT_EQ(format::decode_header(b, &h), format::Problem::none);
  ASSERT_EQ(h.slot[0].sequence, 2u);
  ASSERT_EQ(h.slot[1].sequence, 1u);
  // Make slot 0 say 3 and slot 1 say 2: slot 0 is still the newest.
  for (int i : {0, 1}) {
    std::byte* s = b.data() + format::kSlotOffset[i];
    format::put_u64(s, h.slot[i].sequence + 1);
    format::put_u64(s + 56, format::hash_bytes(s, 56));
  }
  test::write_file(path, b);
  {
    auto cache = WeightCache::open(opts(path, 64));
    ASSERT_TRUE(cache) << cache.error().message;
    ASSERT_NE(cache->look_up("a"), kNotFound);
    ASSERT_NE(cache->insert("b", "second"), kNotFound);
    ASSERT_TRUE(cache->finalize());
  }
  Bytes after = test::read_file(path);
  ASSERT_EQ(format::decode_header(after, &h), format::Problem::none);
  EXPECT_EQ(h.slot[0].sequence, 3u) << "the newest commit was overwritten";
  EXPECT_EQ(h.slot[1].sequence, 4u);
  expect_served(path, 64, {{"a", "first"}, {"b", "second"}});
}

}  // namespace
}  // namespace weightcache
