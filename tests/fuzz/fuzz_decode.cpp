// libFuzzer target: the format decoders on raw bytes, no file involved.
//
// Input: byte 0 picks the alignment (1 << (b % 25)), byte 1 holds flags, the rest is the payload.
//  * decode_header(payload): when it accepts, the fields obey the documented rules and encoding
//    them again reproduces the fixed part and every valid slot byte for byte.
//  * decode_trailer(payload as index block + footer): the slot is derived from the payload (index
//    size = payload size - 20, index offset from the footer, count from the index header or the
//    footer) and its index checksum computed from the payload, so the fuzzer gets past the
//    checksum to the parsing. When it accepts, every record obeys the bounds, alignment,
//    uniqueness and overlap rules, and encode_trailer reproduces the payload byte for byte.
//    Decoding again with diagnostics gives the same verdict, with diagnostics exactly when it is
//    a problem.
#include "format/format.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace weightcache::format;

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "fuzz_decode: %s\n", what);
  std::abort();
}

bool pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

constexpr std::uint8_t kFixBody = 1u << 0;       // recompute the body checksum in the payload
constexpr std::uint8_t kCountFromIndex = 1u << 1;  // slot count from the index header, else footer

void check_header(std::span<const std::byte> p) {
  DecodedHeader h;
  if (decode_header(p, &h) != Problem::none) return;
  const HeaderFixed& f = h.fixed;
  if (f.format_version != kFormatVersion || f.feature_flags != 0 || f.header_size != kHeaderSize)
    violated("header accepted with an unknown version, feature or size");
  if (!pow2(f.alignment) || !pow2(f.size_alignment) || f.alignment > (1u << 24) || f.size_alignment > (1u << 24))
    violated("header accepted with a bad alignment");
  CommitSlot none;
  const auto again = encode_header(f, h.slot_valid[0] ? h.slot[0] : none, h.slot_valid[1] ? h.slot[1] : none);
  if (std::memcmp(again.data(), p.data(), kSlotOffset[0]) != 0) violated("header fixed part does not round-trip");
  for (int i = 0; i < 2; ++i) {
    if (!h.slot_valid[i]) continue;
    if (h.slot[i].sequence == 0) violated("slot with sequence 0 marked valid");
    if (std::memcmp(again.data() + kSlotOffset[i], p.data() + kSlotOffset[i], kSlotSize) != 0)
      violated("valid slot does not round-trip");
    (void)slot_in_bounds(h.slot[i], p.size());
  }
  if (std::memcmp(again.data() + 256, p.data() + 256, kHeaderSize - 256) != 0) violated("padding not zero");
}

void check_trailer(std::span<const std::byte> payload, std::uint64_t alignment, std::uint8_t flags) {
  if (payload.size() < kIndexHeaderSize + kFooterSize) return;
  std::vector<std::byte> t(payload.begin(), payload.end());
  const std::uint64_t index_size = t.size() - kFooterSize;
  if (flags & kFixBody) put_u64(&t[24], hash_bytes(&t[kIndexHeaderSize], index_size - kIndexHeaderSize));
  const Footer footer = decode_footer(&t[index_size]);
  CommitSlot slot;
  slot.sequence = 1;
  slot.index_offset = footer.index_start;
  slot.index_size = index_size;
  slot.committed_size = slot.index_offset + index_size + kFooterSize;
  slot.entry_count = (flags & kCountFromIndex) ? get_u64(&t[8]) : footer.entry_count;
  slot.index_checksum = hash_bytes(t.data(), index_size);

  std::vector<IndexRecord> recs;
  std::string detail;
  const Problem problem = decode_trailer(t, slot, alignment, &recs, &detail);
  // Asked for diagnostics, the decoder reads on past what it can, and must reach the same verdict.
  std::vector<IndexRecord> salvaged;
  std::string diagnosed_detail;
  std::vector<Diagnostic> diagnostics;
  if (decode_trailer(t, slot, alignment, &salvaged, &diagnosed_detail, &diagnostics) != problem ||
      diagnosed_detail != detail)
    violated("diagnosing changed the verdict");
  if ((problem == Problem::none) != diagnostics.empty()) violated("problems and diagnostics disagree");
  if (problem != Problem::none) return;
  if (recs.size() != slot.entry_count) violated("record count differs from the slot");
  std::set<std::string> keys;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  for (const auto& r : recs) {
    if (r.key.empty() || r.key.size() > kMaxKeySize) violated("key size out of range");
    if (!keys.insert(r.key).second) violated("duplicate key accepted");
    if (r.offset < kHeaderSize || r.offset > slot.index_offset || r.size > slot.index_offset - r.offset)
      violated("entry outside the data area accepted");
    if (r.offset % alignment != 0) violated("misaligned entry accepted");
    spans.emplace_back(r.offset, r.size);
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i)
    if (spans[i - 1].first == spans[i].first || spans[i - 1].first + spans[i - 1].second > spans[i].first)
      violated("overlapping entries accepted");
  CommitSlot again;
  const auto bytes = encode_trailer(recs, slot.index_offset, &again);
  if (bytes.size() != t.size() || std::memcmp(bytes.data(), t.data(), t.size()) != 0)
    violated("accepted trailer does not round-trip");
  if (again.index_size != slot.index_size || again.entry_count != slot.entry_count ||
      again.index_checksum != slot.index_checksum)
    violated("re-encoded slot fields differ");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::uint64_t alignment = std::uint64_t{1} << (data[0] % 25);
  const std::uint8_t flags = data[1];
  std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(data + 2), size - 2);
  check_header(payload);
  check_trailer(payload, alignment, flags);
  return 0;
}
