// The CLI's verify reports problems through the library's own reader: decode_trailer and
// read_committed asked for diagnostics. Asking must never change the verdict. Every byte of a
// file's header slots, index and footer is damaged in turn (as is, and with the checksums
// resealed, so the deeper checks are reached); each time, the result with and without
// diagnostics is the same problem and the same error, and problems are reported exactly when
// there are any.
#include "file_image.hpp"
#include "file_state.hpp"
#include "log_capture.hpp"
#include "temp_dir.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace weightcache {
namespace {

using test::Bytes;

// A file with two commits (the newest replaces an entry) and keys of several lengths.
Bytes make_file(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = "diagnosis";
  o.alignment = 64;
  o.backing = Backing::file;
  o.durability = Durability::none;
  {
    auto c = WeightCache::open(o);
    EXPECT_TRUE(c.ok());
    EXPECT_NE(c->insert("layer1.weight", std::string(4096, 'a')), kNotFound);
    EXPECT_NE(c->insert("b", std::string(100, 'b')), kNotFound);
    EXPECT_TRUE(c->finalize().ok());
  }
  {
    auto c = WeightCache::open(o);
    EXPECT_TRUE(c.ok());
    EXPECT_NE(c->insert("b", std::string(300, 'B')), kNotFound);
    EXPECT_NE(c->insert(std::string("k\0\xff", 3), std::string(64, 'k')), kNotFound);
    EXPECT_TRUE(c->finalize().ok());
  }
  return test::read_file(path);
}

// decode_trailer on the newest slot's index, with and without diagnostics.
::testing::AssertionResult same_trailer_verdict(const Bytes& b) {
  format::DecodedHeader h;
  if (format::decode_header(b, &h) != format::Problem::none) return ::testing::AssertionSuccess();
  for (int i = 0; i < 2; ++i) {
    const auto& s = h.slot[i];
    if (!h.slot_valid[i] || !format::slot_in_bounds(s, b.size())) continue;
    const std::span<const std::byte> t(b.data() + s.index_offset, s.index_size + format::kFooterSize);
    std::vector<format::IndexRecord> plain, diagnosed;
    std::string plain_detail, diagnosed_detail;
    std::vector<format::Diagnostic> problems;
    const auto p = format::decode_trailer(t, s, h.fixed.alignment, &plain, &plain_detail);
    const auto q = format::decode_trailer(t, s, h.fixed.alignment, &diagnosed, &diagnosed_detail, &problems);
    if (p != q || plain_detail != diagnosed_detail)
      return ::testing::AssertionFailure() << "slot " << i << ": " << to_string(p) << " (" << plain_detail
                                           << ") without diagnostics, " << to_string(q) << " ("
                                           << diagnosed_detail << ") with";
    if ((p == format::Problem::none) != problems.empty())
      return ::testing::AssertionFailure() << "slot " << i << ": " << to_string(p) << " with " << problems.size()
                                           << " problems reported";
  }
  return ::testing::AssertionSuccess();
}

// read_committed on the file, with and without a Diagnosis.
::testing::AssertionResult same_committed_verdict(const std::string& path, const Bytes& b) {
  test::write_file(path, b);
  auto& pf = platform::os();
  auto fd = pf.open_file(path, platform::OpenMode::read, 0, false);
  if (!fd) return ::testing::AssertionFailure() << fd.error().message;
  Diagnosis d;
  auto plain = read_committed(pf, fd.value(), b.size(), UINT64_MAX, 0);
  auto diagnosed = read_committed(pf, fd.value(), b.size(), UINT64_MAX, 0, &d);
  fd.value().close();
  if (plain.ok() != diagnosed.ok())
    return ::testing::AssertionFailure() << "ok " << plain.ok() << " without a diagnosis, " << diagnosed.ok()
                                         << " with";
  if (!plain.ok()) {
    if (plain.error().code != diagnosed.error().code || plain.error().message != diagnosed.error().message)
      return ::testing::AssertionFailure() << "'" << plain.error().message << "' without a diagnosis, '"
                                           << diagnosed.error().message << "' with";
    if (d.problems.empty()) return ::testing::AssertionFailure() << "refused, but no problem reported";
    return ::testing::AssertionSuccess();
  }
  if (plain->slot.sequence != diagnosed->slot.sequence || plain->records.size() != diagnosed->records.size() ||
      plain->newest_damaged != diagnosed->newest_damaged)
    return ::testing::AssertionFailure() << "another commit with a diagnosis";
  if (plain->newest_damaged && d.problems.empty())
    return ::testing::AssertionFailure() << "fell back to an older commit, but no problem reported";
  return ::testing::AssertionSuccess();
}

TEST(Diagnosis, AskingForDiagnosticsNeverChangesTheVerdict) {
  test::TempDir dir;
  test::LogCapture quiet;  // falling back to an older commit warns, hundreds of times here
  const std::string path = dir.file("c.wc");
  const Bytes base = make_file(path);
  ASSERT_TRUE(same_committed_verdict(dir.file("copy.wc"), base));
  format::DecodedHeader h;
  ASSERT_EQ(format::decode_header(base, &h), format::Problem::none);
  const int newest = h.slot[1].sequence > h.slot[0].sequence ? 1 : 0;
  const auto& s = h.slot[newest];
  // The slots, then the newest index and footer (the records hold keys, offsets and sizes).
  std::vector<std::uint64_t> offsets;
  for (std::uint64_t at = format::kSlotOffset[0]; at < format::kSlotOffset[1] + format::kSlotSize; ++at)
    offsets.push_back(at);
  for (std::uint64_t at = s.index_offset; at < s.committed_size; ++at) offsets.push_back(at);
  int damaged = 0;
  for (const std::uint64_t at : offsets) {
    for (const bool reseal : {false, true}) {
      Bytes b = base;
      b[at] ^= std::byte{0x41};
      if (reseal) test::reseal_slot(b, at < format::kSlotOffset[1] ? 0 : 1);
      if (reseal && at >= s.index_offset) test::reseal_slot(b, newest);
      SCOPED_TRACE("byte " + std::to_string(at) + (reseal ? ", resealed" : ""));
      ASSERT_TRUE(same_trailer_verdict(b));
      ASSERT_TRUE(same_committed_verdict(dir.file("copy.wc"), b));
      ++damaged;
    }
  }
  EXPECT_GT(damaged, 500);
}

// Problems of one kind, per kind: how many a diagnosis describes, and what its closing
// diagnostic says it left out.
struct KindCount {
  std::uint64_t described = 0, unlisted = 0, closing = 0;
  bool operator==(const KindCount&) const = default;
};

std::map<std::string, KindCount> by_kind(const std::vector<format::Diagnostic>& problems) {
  std::map<std::string, KindCount> out;
  for (const auto& d : problems) {
    KindCount& k = out[d.kind];
    if (d.unlisted == 0) {
      ++k.described;
    } else {
      k.unlisted += d.unlisted;
      ++k.closing;
      EXPECT_NE(d.message.find(std::to_string(d.unlisted) + " more"), std::string::npos) << d.message;
    }
  }
  return out;
}

// An index of thousands of records on one spot under one key: each is a duplicate and an overlap.
// A diagnosis describes kMaxDiagnosticsPerKind of each kind and counts the rest in one closing
// diagnostic, whether the layout is checked alone or as part of an index; the verdict is the
// same as without a diagnosis.
TEST(Diagnosis, ProblemsOfAKindAreDescribedUpToTheLimitAndCountedBeyond) {
  constexpr std::size_t kRecords = 3000;
  const std::vector<format::IndexRecord> records(kRecords, format::IndexRecord{"same", 8192, 64, 0});
  const KindCount expected{format::kMaxDiagnosticsPerKind, kRecords - 1 - format::kMaxDiagnosticsPerKind, 1};
  const std::map<std::string, KindCount> both = {{"duplicate_key", expected}, {"entry_overlap", expected}};

  std::string plain_detail, detail;
  std::vector<format::Diagnostic> problems;
  const auto plain = format::check_layout(records, format::kHeaderSize, 1 << 20, 64, &plain_detail);
  EXPECT_EQ(format::check_layout(records, format::kHeaderSize, 1 << 20, 64, &detail, &problems), plain);
  EXPECT_EQ(detail, plain_detail);
  EXPECT_EQ(by_kind(problems), both);

  format::CommitSlot slot;
  slot.sequence = 1;
  const auto trailer = format::encode_trailer(records, 1 << 20, &slot);
  std::vector<format::IndexRecord> out;
  problems.clear();
  EXPECT_EQ(format::decode_trailer(trailer, slot, 64, &out, &detail, &problems), plain);
  EXPECT_EQ(out.size(), kRecords);
  EXPECT_EQ(by_kind(problems), both);
}

}  // namespace
}  // namespace weightcache
