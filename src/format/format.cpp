#include "format/format.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace weightcache::format {

#if WEIGHTCACHE_HAVE_AVX2_HASH
std::uint64_t hash_bytes_avx2(const void* data, std::size_t size) noexcept;
namespace {
const bool kUseAvx2 = __builtin_cpu_supports("avx2");
}
#endif

std::uint64_t hash_bytes(const void* data, std::size_t size) noexcept {
#if WEIGHTCACHE_HAVE_AVX2_HASH
  // Small inputs (keys, slots) stay on the inlined path; the call only pays off for data.
  if (size >= 1024 && kUseAvx2) return hash_bytes_avx2(data, size);
#endif
  return XXH3_64bits(data, size);
}

static_assert(sizeof(XXH3_state_t) <= StreamHash::kStateSize, "StreamHash::kStateSize is too small");
static_assert(alignof(XXH3_state_t) <= 64, "StreamHash's state is aligned to 64");

StreamHash::StreamHash() noexcept {
  std::memset(state_, 0, sizeof state_);  // what XXH3_INITSTATE asks of a state not from createState
  XXH3_64bits_reset(reinterpret_cast<XXH3_state_t*>(state_));
}
void StreamHash::update(const void* data, std::size_t size) noexcept {
  XXH3_64bits_update(reinterpret_cast<XXH3_state_t*>(state_), data, size);
}
std::uint64_t StreamHash::digest() const noexcept {
  return XXH3_64bits_digest(reinterpret_cast<const XXH3_state_t*>(state_));
}

const char* to_string(Problem p) noexcept {
  switch (p) {
    case Problem::none: return "ok";
    case Problem::truncated: return "truncated";
    case Problem::bad_magic: return "bad magic";
    case Problem::byte_order: return "written with the other byte order";
    case Problem::version: return "unsupported version or feature";
    case Problem::bad_checksum: return "checksum mismatch";
    case Problem::bad_bounds: return "out of bounds";
    case Problem::bad_value: return "invalid field value";
  }
  return "unknown";
}

std::array<std::byte, kSlotSize> encode_slot(const CommitSlot& s) {
  std::array<std::byte, kSlotSize> b{};
  put_u64(&b[0], s.sequence);
  put_u64(&b[8], s.index_offset);
  put_u64(&b[16], s.index_size);
  put_u64(&b[24], s.committed_size);
  put_u64(&b[32], s.entry_count);
  put_u64(&b[40], s.index_checksum);
  put_u64(&b[48], 0);
  put_u64(&b[56], hash_bytes(b.data(), 56));
  return b;
}

std::vector<std::byte> encode_header(const HeaderFixed& f, const CommitSlot& slot0,
                                     const CommitSlot& slot1) {
  std::vector<std::byte> b(kHeaderSize, std::byte{0});
  std::memcpy(b.data(), kHeaderMagic.data(), kHeaderMagic.size());
  put_u32(&b[8], kEndianMark);
  put_u32(&b[12], f.format_version);
  put_u32(&b[16], f.feature_flags);
  put_u32(&b[20], f.header_size);
  put_u64(&b[24], f.alignment);
  put_u64(&b[32], f.size_alignment);
  put_u64(&b[40], f.compat_hash);
  put_u64(&b[kFixedChecksumOffset], hash_bytes(b.data(), kFixedChecksumOffset));
  const CommitSlot* slots[2] = {&slot0, &slot1};
  for (int i = 0; i < 2; ++i) {
    if (slots[i]->sequence == 0) continue;  // an unwritten slot stays all-zero
    auto s = encode_slot(*slots[i]);
    std::memcpy(&b[kSlotOffset[i]], s.data(), s.size());
  }
  return b;
}

std::vector<std::byte> encode_trailer(std::span<const IndexRecord> records, std::uint64_t index_offset,
                                      CommitSlot* slot) {
  std::size_t body = 0;
  for (const auto& r : records) body += kRecordFixedSize + r.key.size();
  std::vector<std::byte> b(kIndexHeaderSize + body + kFooterSize, std::byte{0});
  std::byte* p = b.data() + kIndexHeaderSize;
  for (const auto& r : records) {
    put_u32(p, static_cast<std::uint32_t>(r.key.size()));
    put_u32(p + 4, 0);
    put_u64(p + 8, r.offset);
    put_u64(p + 16, r.size);
    put_u64(p + 24, r.checksum);
    std::memcpy(p + kRecordFixedSize, r.key.data(), r.key.size());
    p += kRecordFixedSize + r.key.size();
  }
  put_u32(&b[0], kIndexMagic);
  put_u32(&b[4], kIndexVersion);
  put_u64(&b[8], records.size());
  put_u64(&b[16], body);
  put_u64(&b[24], hash_bytes(b.data() + kIndexHeaderSize, body));
  const std::size_t index_size = kIndexHeaderSize + body;
  std::byte* f = b.data() + index_size;
  put_u64(f, index_offset);
  // The footer's count is 32-bit (ExecuTorch's layout); the slot carries the full count.
  put_u32(f + 8, static_cast<std::uint32_t>(std::min<std::uint64_t>(records.size(), UINT32_MAX)));
  put_u32(f + 12, kFooterMagic);
  put_u32(f + 16, kFooterVersion);
  slot->index_offset = index_offset;
  slot->index_size = index_size;
  slot->committed_size = index_offset + index_size + kFooterSize;
  slot->entry_count = records.size();
  slot->index_checksum = hash_bytes(b.data(), index_size);
  return b;
}

Footer decode_footer(const std::byte* p) noexcept {
  Footer f;
  f.index_start = get_u64(p);
  f.entry_count = get_u32(p + 8);
  f.magic = get_u32(p + 12);
  f.version = get_u32(p + 16);
  return f;
}

Problem decode_header(std::span<const std::byte> b, DecodedHeader* out) noexcept {
  if (b.size() < kHeaderSize) return Problem::truncated;
  if (std::memcmp(b.data(), kHeaderMagic.data(), kHeaderMagic.size()) != 0) return Problem::bad_magic;
  const std::uint32_t mark = get_u32(&b[8]);
  if (mark == 0x04030201u) return Problem::byte_order;
  if (mark != kEndianMark) return Problem::bad_magic;
  if (get_u64(&b[kFixedChecksumOffset]) != hash_bytes(b.data(), kFixedChecksumOffset))
    return Problem::bad_checksum;
  HeaderFixed& f = out->fixed;
  f.format_version = get_u32(&b[12]);
  f.feature_flags = get_u32(&b[16]);
  f.header_size = get_u32(&b[20]);
  f.alignment = get_u64(&b[24]);
  f.size_alignment = get_u64(&b[32]);
  f.compat_hash = get_u64(&b[40]);
  if (f.format_version != kFormatVersion || f.feature_flags != 0) return Problem::version;
  if (f.header_size != kHeaderSize) return Problem::bad_value;
  auto pow2 = [](std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!pow2(f.alignment) || f.alignment > (1u << 24) || !pow2(f.size_alignment) ||
      f.size_alignment > (1u << 24))
    return Problem::bad_value;
  for (std::size_t off = 48; off < kFixedChecksumOffset; off += 8)
    if (get_u64(&b[off]) != 0) return Problem::bad_value;
  for (std::size_t off = kSlotOffset[1] + kSlotSize; off < kHeaderSize; off += 8)
    if (get_u64(&b[off]) != 0) return Problem::bad_value;
  for (int i = 0; i < 2; ++i) {
    const std::byte* s = &b[kSlotOffset[i]];
    CommitSlot& slot = out->slot[i];
    slot.sequence = get_u64(s);
    slot.index_offset = get_u64(s + 8);
    slot.index_size = get_u64(s + 16);
    slot.committed_size = get_u64(s + 24);
    slot.entry_count = get_u64(s + 32);
    slot.index_checksum = get_u64(s + 40);
    out->slot_valid[i] = slot.sequence != 0 && get_u64(s + 48) == 0 &&
                         get_u64(s + 56) == hash_bytes(s, 56);
  }
  return Problem::none;
}

bool slot_in_bounds(const CommitSlot& s, std::uint64_t file_size) noexcept {
  if (s.index_offset < kHeaderSize || s.index_offset % 8 != 0) return false;
  if (s.index_size < kIndexHeaderSize || s.index_size > kMaxIndexSize) return false;
  if (s.index_size > file_size || s.index_offset > file_size - s.index_size) return false;
  const std::uint64_t end = s.index_offset + s.index_size;
  if (end > file_size - kFooterSize || s.committed_size != end + kFooterSize) return false;
  // Every record needs at least kRecordFixedSize bytes: caps what a hostile count can make us
  // allocate.
  if (s.entry_count > (s.index_size - kIndexHeaderSize) / kRecordFixedSize) return false;
  return true;
}

Problem decode_trailer(std::span<const std::byte> t, const CommitSlot& slot, std::uint64_t alignment,
                       std::vector<IndexRecord>* out, std::string* detail) {
  // Allocation failures propagate (std::bad_alloc): running out of memory says nothing about the
  // file, and the caller must not take it for damage (it would rebuild a good cache).
  {
    out->clear();
    if (t.size() != slot.index_size + kFooterSize || slot.index_size < kIndexHeaderSize)
      return Problem::truncated;
    const std::byte* b = t.data();
    if (hash_bytes(b, slot.index_size) != slot.index_checksum) return Problem::bad_checksum;
    if (get_u32(b) != kIndexMagic) return Problem::bad_magic;
    if (get_u32(b + 4) != kIndexVersion) return Problem::version;
    const std::uint64_t count = get_u64(b + 8);
    const std::uint64_t body = get_u64(b + 16);
    if (count != slot.entry_count || body != slot.index_size - kIndexHeaderSize) return Problem::bad_value;
    if (hash_bytes(b + kIndexHeaderSize, body) != get_u64(b + 24)) return Problem::bad_checksum;
    const Footer f = decode_footer(b + slot.index_size);
    if (f.magic != kFooterMagic || f.version != kFooterVersion) return Problem::bad_magic;
    if (f.index_start != slot.index_offset ||
        f.entry_count != std::min<std::uint64_t>(count, UINT32_MAX))
      return Problem::bad_value;
    if (count > body / kRecordFixedSize) return Problem::bad_bounds;
    out->reserve(count);
    const std::byte* p = b + kIndexHeaderSize;
    const std::byte* end = p + body;
    std::unordered_set<std::string_view> keys;
    keys.reserve(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      if (static_cast<std::size_t>(end - p) < kRecordFixedSize) return Problem::truncated;
      IndexRecord r;
      const std::uint32_t key_size = get_u32(p);
      if (get_u32(p + 4) != 0) return Problem::version;  // unknown record flags
      r.offset = get_u64(p + 8);
      r.size = get_u64(p + 16);
      r.checksum = get_u64(p + 24);
      if (key_size == 0 || key_size > kMaxKeySize) return Problem::bad_value;
      if (static_cast<std::size_t>(end - p) - kRecordFixedSize < key_size) return Problem::truncated;
      r.key.assign(reinterpret_cast<const char*>(p + kRecordFixedSize), key_size);
      p += kRecordFixedSize + key_size;
      // Entries live between the header and this index; size 0 is allowed (an empty weight).
      if (r.offset < kHeaderSize || r.offset > slot.index_offset ||
          r.size > slot.index_offset - r.offset) {
        if (detail) *detail = "entry " + std::to_string(i) + " lies outside the data area";
        return Problem::bad_bounds;
      }
      if (r.offset % alignment != 0) {
        if (detail) *detail = "entry " + std::to_string(i) + " is misaligned";
        return Problem::bad_value;
      }
      out->push_back(std::move(r));
    }
    if (p != end) return Problem::bad_value;
    for (const auto& r : *out) {
      if (!keys.insert(r.key).second) {
        if (detail) *detail = "duplicate key in index";
        return Problem::bad_value;
      }
    }
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
    spans.reserve(out->size());
    for (const auto& r : *out) spans.emplace_back(r.offset, r.size);
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) {
      if (spans[i - 1].first + spans[i - 1].second > spans[i].first ||
          (spans[i - 1].first == spans[i].first)) {
        if (detail) *detail = "entries overlap";
        return Problem::bad_bounds;
      }
    }
    return Problem::none;
  }
}

}  // namespace weightcache::format
