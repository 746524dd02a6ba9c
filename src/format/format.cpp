#include "format/format.hpp"
#include "format/layout.hpp"
#include "mobile.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <cstring>
#include <limits>

namespace weightcache::format {

#if WEIGHTCACHE_HAVE_AVX2_HASH
std::uint64_t hash_bytes_avx2(const void* data, std::size_t size) noexcept;
namespace {
const bool kUseAvx2 = __builtin_cpu_supports("avx2");
}
#endif

std::uint64_t process_hash_seed() noexcept {
  static const std::uint64_t seed = [] {
    std::uint64_t v = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    try {
      std::random_device rd;
      v ^= (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    } catch (...) {
      // No entropy source: the clock alone still differs from run to run.
    }
    return v;
  }();
  return seed;
}

namespace {
std::atomic<std::uint64_t> g_duplicate_probes{0};
}  // namespace

std::uint64_t duplicate_check_probes() noexcept { return g_duplicate_probes.load(std::memory_order_relaxed); }
void count_duplicate_check_probes(std::uint64_t n) noexcept { g_duplicate_probes.fetch_add(n, std::memory_order_relaxed); }

std::uint64_t hash_key_seeded(std::string_view key, std::uint64_t seed) noexcept {
  return XXH3_64bits_withSeed(key.data(), key.size(), seed);
}

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

namespace {
constexpr std::size_t kSlotReservedOffset = 48;
constexpr std::size_t kSlotChecksumOffset = 56;
// A commit slot's fields in their on-disk order: field i is the u64 at byte 8 * i of the slot.
// encode_slot and decode_header both walk it, so the two cannot disagree on the layout.
constexpr std::array<std::uint64_t CommitSlot::*, 6> kSlotFields = {
    &CommitSlot::sequence,       &CommitSlot::index_offset, &CommitSlot::index_size,
    &CommitSlot::committed_size, &CommitSlot::entry_count,  &CommitSlot::index_checksum,
};
static_assert(kSlotFields.size() * 8 == kSlotReservedOffset);
}  // namespace

std::array<std::byte, kSlotSize> encode_slot(const CommitSlot& s) {
  std::array<std::byte, kSlotSize> b{};
  for (std::size_t i = 0; i < kSlotFields.size(); ++i) put_u64(&b[8 * i], s.*kSlotFields[i]);
  put_u64(&b[kSlotReservedOffset], 0);
  put_u64(&b[kSlotChecksumOffset], hash_bytes(b.data(), kSlotChecksumOffset));
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
    if (slots[i]->sequence == kNoSequence) continue;  // an unwritten slot stays all-zero
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
    for (std::size_t f = 0; f < kSlotFields.size(); ++f) slot.*kSlotFields[f] = get_u64(s + 8 * f);
    SlotState& state = out->slot_state[i];
    if (std::all_of(s, s + kSlotSize, [](std::byte x) { return x == std::byte{0}; })) state = SlotState::empty;
    else if (slot.sequence == kNoSequence) state = SlotState::zero_sequence;
    else if (get_u64(s + kSlotReservedOffset) != 0) state = SlotState::reserved_not_zero;
    else if (get_u64(s + kSlotChecksumOffset) != hash_bytes(s, kSlotChecksumOffset)) state = SlotState::bad_checksum;
    else state = SlotState::valid;
    out->slot_valid[i] = state == SlotState::valid;
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

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string display_key(std::string_view key) {
  bool printable = key.substr(0, 2) != "0x" && !key.empty();
  for (char c : key) {
    if (c < 0x20 || c > 0x7E) {
      printable = false;
      break;
    }
  }
  if (printable) return std::string(key);
  std::string out = "0x";
  out.reserve(2 + 2 * key.size());
  for (char c : key) {
    const auto b = static_cast<unsigned char>(c);
    out.push_back(kHexDigits[b >> 4]);
    out.push_back(kHexDigits[b & 15]);
  }
  return out;
}

std::optional<std::string> parse_key(std::string_view text) {
  if (text.substr(0, 2) != "0x") return std::string(text);
  const std::string_view digits = text.substr(2);
  if (digits.size() % 2 != 0) return std::nullopt;
  std::string out;
  out.reserve(digits.size() / 2);
  for (std::size_t i = 0; i < digits.size(); i += 2) {
    const int hi = hex_value(digits[i]);
    const int lo = hex_value(digits[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

Problem check_layout(std::span<const IndexRecord> records, std::uint64_t begin, std::uint64_t end,
                     std::uint64_t alignment, std::string* detail, std::vector<Diagnostic>* diagnostics) {
  return check_layout_of(records, begin, end, alignment, detail, diagnostics);
}

namespace {

Problem decode_trailer(std::span<const std::byte> t, const CommitSlot& slot, std::uint64_t alignment,
                       std::vector<IndexRecord>* out, Findings& f) {
  // Allocation failures propagate (std::bad_alloc): running out of memory says nothing about the
  // file, and the caller must not take it for damage (it would rebuild a good cache).
  {
    out->clear();
    if (t.size() != slot.index_size + kFooterSize || slot.index_size < kIndexHeaderSize)
      return Problem::truncated;
    // Messages about the index block itself say which commit's index it is.
    const std::string where = f.diagnosing() ? "index of sequence " + std::to_string(slot.sequence) + ": " : "";
    auto index_problem = [&](Problem p, auto&& message) {
      return f.found(p, nullptr, "index", [&] { return where + message(); });
    };
    const std::byte* b = t.data();
    const std::uint64_t n = slot.index_size;
    const std::uint64_t body = n - kIndexHeaderSize;
    if (hash_bytes(b, n) != slot.index_checksum && index_problem(Problem::bad_checksum, [] {
          return std::string("the index does not match the checksum in its commit slot");
        }))
      return f.first();
    if (get_u32(b) != kIndexMagic) {
      index_problem(Problem::bad_magic,
                    [&] { return "no index magic ('WCIX') at offset " + std::to_string(slot.index_offset); });
      return f.first();  // not an index: nothing in it can be read
    }
    if (get_u32(b + 4) != kIndexVersion) {
      index_problem(Problem::version, [&] { return "unsupported index version " + std::to_string(get_u32(b + 4)); });
      return f.first();
    }
    const std::uint64_t count = get_u64(b + 8);
    if (count != slot.entry_count && index_problem(Problem::bad_value, [&] {
          return "the index counts " + std::to_string(count) + " entries, its commit slot " +
                 std::to_string(slot.entry_count);
        }))
      return f.first();
    if (get_u64(b + 16) != body && index_problem(Problem::bad_value, [&] {
          return "the index body size " + std::to_string(get_u64(b + 16)) + " disagrees with its commit slot (" +
                 std::to_string(body) + ")";
        }))
      return f.first();
    if (hash_bytes(b + kIndexHeaderSize, body) != get_u64(b + 24) &&
        index_problem(Problem::bad_checksum, [] { return std::string("index records fail their checksum"); }))
      return f.first();
    const Footer footer = decode_footer(b + n);
    if (footer.magic != kFooterMagic || footer.version != kFooterVersion) {
      if (f.found(Problem::bad_magic, nullptr, "footer", [&] { return where + "no XPWC footer after the index"; }))
        return f.first();
    } else if (footer.index_start != slot.index_offset ||
               footer.entry_count != std::min<std::uint64_t>(count, UINT32_MAX)) {
      if (f.found(Problem::bad_value, nullptr, "footer", [&] {
            return where + "the footer disagrees with the index (index_start " + std::to_string(footer.index_start) +
                   ", " + std::to_string(footer.entry_count) + " entries)";
          }))
        return f.first();
    }
    // Every record needs kRecordFixedSize bytes: a count beyond that cannot be right (and must
    // not decide what is allocated). Diagnosing, the walk below says which record is cut off.
    if (count > body / kRecordFixedSize) {
      f.note(Problem::bad_bounds);
      if (!f.diagnosing()) return f.first();
    }
    out->reserve(static_cast<std::size_t>(std::min<std::uint64_t>(count, body / kRecordFixedSize)));
    const std::byte* p = b + kIndexHeaderSize;
    const std::byte* end = p + body;
    bool complete = true;
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto record = [&] { return "index record " + std::to_string(i); };
      if (static_cast<std::size_t>(end - p) < kRecordFixedSize) {
        index_problem(Problem::truncated, [&] { return record() + " is cut off by the end of the index"; });
        complete = false;
        break;
      }
      const std::uint32_t key_size = get_u32(p);
      const std::uint32_t flags = get_u32(p + 4);
      if (flags != 0 &&  // unknown record flags
          index_problem(Problem::version, [&] { return record() + " has unknown flags " + std::to_string(flags); }))
        return f.first();
      if (key_size == 0 || key_size > kMaxKeySize) {
        index_problem(Problem::bad_value,
                      [&] { return record() + " has an invalid key size " + std::to_string(key_size); });
        complete = false;
        break;
      }
      if (static_cast<std::size_t>(end - p) - kRecordFixedSize < key_size) {
        index_problem(Problem::truncated, [&] { return record() + " is cut off by the end of the index"; });
        complete = false;
        break;
      }
      // Built in place: an open decodes every record, and assigning a key into a default string
      // cost twice as much as constructing it.
      out->push_back(IndexRecord{std::string(reinterpret_cast<const char*>(p + kRecordFixedSize), key_size),
                                 get_u64(p + 8), get_u64(p + 16), get_u64(p + 24)});
      p += kRecordFixedSize + key_size;
    }
    if (!complete && !f.diagnosing()) return f.first();
    if (complete && p != end && index_problem(Problem::bad_value, [&] {
          return std::to_string(end - p) + " bytes follow the last index record";
        }))
      return f.first();
    // Entries live between the header and this index; size 0 is allowed (an empty weight).
    return check_layout_of(std::span<const IndexRecord>(*out), kHeaderSize, slot.index_offset, alignment, f);
  }
}

}  // namespace

Problem decode_trailer(std::span<const std::byte> t, const CommitSlot& slot, std::uint64_t alignment,
                       std::vector<IndexRecord>* out, std::string* detail,
                       std::vector<Diagnostic>* diagnostics) {
  Findings f(detail, diagnostics);
  const Problem p = decode_trailer(t, slot, alignment, out, f);
  f.close();
  return p;
}

}  // namespace weightcache::format
