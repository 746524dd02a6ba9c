// On-disk format of a weightcache file. docs/FORMAT.md is the prose version of this header;
// the golden-file test parses a hand-written hex image against these definitions.
//
// All integers are little-endian, whatever the host. Structs below are the in-memory mirror; the
// encode/decode functions move them to and from bytes field by field, so no host padding or byte
// order ever reaches the file.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weightcache::format {

// ---- constants -------------------------------------------------------------------------------
inline constexpr std::array<char, 8> kHeaderMagic = {'W', 'G', 'T', 'C', 'A', 'C', 'H', 'E'};
inline constexpr std::uint32_t kEndianMark = 0x01020304;      // reads 0x04030201 if swapped
inline constexpr std::uint32_t kFormatVersion = 1;
inline constexpr std::uint32_t kHeaderSize = 4096;            // header occupies the first page
inline constexpr std::uint32_t kFooterMagic = 0x58505743;     // "CWPX" in LE bytes, as ExecuTorch
inline constexpr std::uint32_t kFooterVersion = 0x57430001;   // ExecuTorch uses 1 and 2
inline constexpr std::uint32_t kIndexMagic = 0x58494357;      // "WCIX"
inline constexpr std::uint32_t kIndexVersion = 1;
inline constexpr std::uint32_t kMaxKeySize = 4096;
// An index block above this is refused by readers and never written: it bounds what a hostile
// (sparse) file can make a reader allocate. 1 GiB holds ~8 million records with 100-byte keys.
inline constexpr std::uint64_t kMaxIndexSize = std::uint64_t{1} << 30;

// ---- header (offset 0) ----------------------------------------------------------------------
// Byte layout of the fixed part:
//   0  magic[8]         "WGTCACHE"
//   8  endian_mark u32  0x01020304
//  12  format_version u32
//  16  feature_flags u32 (0; a reader refuses unknown bits)
//  20  header_size u32 (4096)
//  24  alignment u64    every entry offset is a multiple of it
//  32  size_alignment u64
//  40  compat_hash u64  XXH3-64 of the compatibility key
//  48  reserved[9] u64  zero, checked
// 120  fixed_checksum u64  XXH3-64 of bytes 0..119
// 128  slot[0] (64 bytes)
// 192  slot[1] (64 bytes)
// 256..4095 zero
inline constexpr std::size_t kFixedChecksumOffset = 120;
inline constexpr std::size_t kSlotOffset[2] = {128, 192};
inline constexpr std::size_t kSlotSize = 64;

struct HeaderFixed {
  std::uint32_t format_version = kFormatVersion;
  std::uint32_t feature_flags = 0;
  std::uint32_t header_size = kHeaderSize;
  std::uint64_t alignment = 0;
  std::uint64_t size_alignment = 0;
  std::uint64_t compat_hash = 0;
};

// A commit slot names the latest index. Slots are written alternately (slot = sequence % 2);
// a reader takes the highest sequence whose checksum, bounds and index all verify.
//   0 sequence u64        (0 = never written)
//   8 index_offset u64    where the index block starts
//  16 index_size u64      bytes of the index block (header + records), footer excluded
//  24 committed_size u64  index_offset + index_size + 20: end of the footer
//  32 entry_count u64
//  40 index_checksum u64  XXH3-64 of the whole index block
//  48 reserved u64        zero
//  56 slot_checksum u64   XXH3-64 of bytes 0..55 of the slot
// The sequence of a slot that holds no commit; a slot never written is all zero.
inline constexpr std::uint64_t kNoSequence = 0;

struct CommitSlot {
  std::uint64_t sequence = kNoSequence;
  std::uint64_t index_offset = 0;
  std::uint64_t index_size = 0;
  std::uint64_t committed_size = 0;
  std::uint64_t entry_count = 0;
  std::uint64_t index_checksum = 0;
};

// Index block header, 32 bytes, at slot.index_offset:
//   0 magic u32 "WCIX"   4 version u32   8 entry_count u64   16 body_size u64
//  24 body_checksum u64 (XXH3-64 of the records that follow)
inline constexpr std::size_t kIndexHeaderSize = 32;
// Each record: key_size u32 | flags u32 (0) | offset u64 | size u64 | checksum u64 | key bytes
inline constexpr std::size_t kRecordFixedSize = 32;

// Footer, 20 bytes, right after the index block (at EOF after a finalize):
//   0 index_start u64   8 entry_count u32   12 magic u32 0x58505743   16 version u32
inline constexpr std::size_t kFooterSize = 20;

struct IndexRecord {
  std::string key;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;  // XXH3-64 of the entry's bytes
};

struct Footer {
  std::uint64_t index_start = 0;
  std::uint32_t entry_count = 0;
  std::uint32_t magic = kFooterMagic;
  std::uint32_t version = kFooterVersion;
};

// ExecuTorch's own XPWC files (the CLI reads and converts them) end in the same 20-byte footer,
// with version 1 or 2; the index before it is a run of records, native byte order:
//   name_len u32 | name bytes | offset u64 | size u64 | (version 2:) seed u32
inline constexpr std::uint32_t kXpwcFirstVersion = 1;
inline constexpr std::uint32_t kXpwcLastVersion = 2;
inline constexpr std::size_t xpwc_record_fixed_size(std::uint32_t version) { return version >= 2 ? 24 : 20; }

// ---- little-endian byte helpers ---------------------------------------------------------------
inline void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void put_u64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint32_t>(p[i]);
  return v;
}
inline std::uint64_t get_u64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}
// Big-endian readers: an ExecuTorch XPWC file written on a big-endian host (the CLI reads those).
inline std::uint32_t get_u32_be(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<std::uint32_t>(p[i]);
  return v;
}
inline std::uint64_t get_u64_be(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

std::uint64_t hash_bytes(const void* data, std::size_t size) noexcept;
/// A seed for hash tables keyed by what a file says (keys), random per process: a hostile file
/// cannot pick keys that collide in this process's tables without knowing it.
std::uint64_t process_hash_seed() noexcept;
/// Slots visited by check_layout's duplicate-key table since the process started (every record
/// visits at least one): what tests read to see that a file's keys cannot make the check
/// quadratic.
std::uint64_t duplicate_check_probes() noexcept;
inline std::uint64_t hash_bytes(std::string_view s) noexcept { return hash_bytes(s.data(), s.size()); }

/// XXH3-64 over data that arrives in pieces; equals hash_bytes() of the concatenation. The
/// state lives inside the object, not on the heap: the verify-ahead thread hashes big entries
/// with it, and an allocation there could be in progress when the host forks, leaving the
/// child's allocator locked (seen with ASan's allocator).
class StreamHash {
 public:
  StreamHash() noexcept;
  ~StreamHash() = default;
  StreamHash(const StreamHash&) = delete;
  StreamHash& operator=(const StreamHash&) = delete;
  bool ok() const noexcept { return true; }
  void update(const void* data, std::size_t size) noexcept;
  std::uint64_t digest() const noexcept;

  static constexpr std::size_t kStateSize = 640;  // >= sizeof(XXH3_state_t), checked in format.cpp

 private:
  alignas(64) unsigned char state_[kStateSize];
};

// ---- encode ---------------------------------------------------------------------------------
/// A whole kHeaderSize header with both slots (either may be zero).
std::vector<std::byte> encode_header(const HeaderFixed& fixed, const CommitSlot& slot0,
                                     const CommitSlot& slot1);
/// The 64 bytes of one slot, checksum included.
std::array<std::byte, kSlotSize> encode_slot(const CommitSlot& slot);
/// Index block followed by the footer. Fills index_size / checksum / count into *slot (the
/// caller sets sequence, index_offset; committed_size is computed from them).
std::vector<std::byte> encode_trailer(std::span<const IndexRecord> records, std::uint64_t index_offset,
                                      CommitSlot* slot);

// ---- decode ---------------------------------------------------------------------------------
enum class Problem { none, truncated, bad_magic, byte_order, version, bad_checksum, bad_bounds, bad_value };
const char* to_string(Problem p) noexcept;

/// One problem a diagnosing reader found (the CLI's verify prints them). `kind` names what is
/// damaged: "header", "slot", "index", "footer", "entry_bounds", "entry_alignment",
/// "duplicate_key" or "entry_overlap"; `key` is set when the problem belongs to one entry.
/// `unlisted` is 0, except in the one diagnostic that closes a kind met more than
/// kMaxDiagnosticsPerKind times in one decode: there it counts the problems of that kind found
/// but not described one by one (and its message says how many).
struct Diagnostic {
  std::string kind;
  std::string message;
  std::optional<std::string> key;
  std::uint64_t unlisted = 0;
};

/// How many problems of one kind one decode (check_layout, decode_trailer) describes before it
/// only counts them: a hostile index of millions of overlapping records costs a count, not
/// millions of messages.
inline constexpr std::size_t kMaxDiagnosticsPerKind = 100;

/// A key as people read it: as-is when every byte is printable ASCII and it does not itself
/// start with "0x"; otherwise "0x" followed by lowercase hex. parse_key(display_key(k)) == k.
std::string display_key(std::string_view key);
/// The inverse of display_key: "0x" + hex digits (either case) is hex, anything else the text
/// itself. nullopt for "0x..." with a non-hex digit or an odd number of digits.
std::optional<std::string> parse_key(std::string_view text);

/// What one commit slot of a header holds.
enum class SlotState { empty, valid, zero_sequence, reserved_not_zero, bad_checksum };

struct DecodedHeader {
  HeaderFixed fixed;
  CommitSlot slot[2];
  bool slot_valid[2] = {false, false};  // checksum verified and sequence != 0
  SlotState slot_state[2] = {SlotState::empty, SlotState::empty};  // why a slot is not valid
};

/// Parses the first kHeaderSize bytes. Slot validity is checked only by checksum here; bounds
/// against the file size are the caller's (see read_committed in file_state.hpp).
Problem decode_header(std::span<const std::byte> bytes, DecodedHeader* out) noexcept;

/// Slot self-consistency against the file size and alignment rules.
bool slot_in_bounds(const CommitSlot& s, std::uint64_t file_size) noexcept;

/// Whether [offset, offset + size) lies inside [begin, end).
inline bool lies_within(std::uint64_t offset, std::uint64_t size, std::uint64_t begin, std::uint64_t end) noexcept {
  return offset >= begin && offset <= end && size <= end - offset;
}

/// Where entries lie: each inside [begin, end) and on the alignment (1: any offset), each under
/// a key no other entry has, no two overlapping (nor sharing an offset, even when empty). Returns
/// the first violation, with `detail`; with `diagnostics`, goes on and appends one per violation,
/// naming the keys involved.
Problem check_layout(std::span<const IndexRecord> records, std::uint64_t begin, std::uint64_t end,
                     std::uint64_t alignment, std::string* detail,
                     std::vector<Diagnostic>* diagnostics = nullptr);

/// Verifies and parses an index block of exactly slot.index_size bytes followed by the footer.
/// Bounds-checks every record against [kHeaderSize, slot.index_offset), the alignment, overlaps
/// and duplicate keys (check_layout). `trailer` holds index block + footer (index_size + 20
/// bytes). Returns the first problem. With `diagnostics`, decoding goes on past every problem it
/// can read beyond, appends one Diagnostic per problem, and leaves in `out` every record that
/// parsed (so their data can still be checked); the result is the same problem either way.
Problem decode_trailer(std::span<const std::byte> trailer, const CommitSlot& slot,
                       std::uint64_t alignment, std::vector<IndexRecord>* out,
                       std::string* detail, std::vector<Diagnostic>* diagnostics = nullptr);

/// Parses the 20 footer bytes.
Footer decode_footer(const std::byte* p) noexcept;

}  // namespace weightcache::format
