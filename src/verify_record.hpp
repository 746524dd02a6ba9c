// Verified once per file state (docs/DESIGN.md, "Verified once per file state"): the record a
// process leaves in a cache's lock file ("<cache>.lock") saying which entries of one committed
// state of one file it checksummed, so that later processes that find the file in exactly that
// state, in the same boot, trust those entries instead of hashing them again.
//
// The record (little-endian), at offset 0 of the lock file, which holds nothing else:
//    0 magic u32 "WCVR"   4 version u32 (1)
//    8 boot id, 16 bytes (changes at every boot)
//   24 device u64   32 inode u64   40 size u64   48 mtime ns i64   56 ctime ns i64
//   64 commit sequence u64   72 committed size u64   80 index checksum u64   88 entry count u64
//   96 one bit per entry of that commit's index, in index order (1: its bytes were checksummed
//      and matched), ceil(count / 8) bytes
//    then XXH3-64 of everything before it, u64.
// A record that does not decode, or whose checksum fails (two processes writing at once), is
// no record: nothing is trusted, everything is verified as without one.
#pragma once

#include "platform/platform.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace weightcache {

/// One committed state of one file in one boot: every field must match for a record to count.
struct StateStamp {
  std::uint8_t boot[16] = {};
  std::uint64_t device = 0, inode = 0, size = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  std::uint64_t sequence = 0, committed_size = 0, index_checksum = 0, entries = 0;

  /// The file's part of the stamp (what fstat says) is the same.
  bool same_file(const platform::FileInfo& now) const noexcept {
    return now.device == device && now.inode == inode && now.size == size && now.mtime_ns == mtime_ns &&
           now.ctime_ns == ctime_ns;
  }
  bool operator==(const StateStamp& o) const noexcept;
};

struct VerifyRecord {
  StateStamp stamp;
  std::vector<bool> verified;  // stamp.entries bits
};

inline constexpr std::size_t kRecordFixedBytes = 96;
inline constexpr std::uint32_t kRecordMagic = 0x52564357;  // "WCVR"
inline constexpr std::uint32_t kRecordVersion = 1;

/// The record's bytes.
std::vector<std::byte> encode_record(const VerifyRecord& r);
/// The record in `bytes` (which may run on past it), or nullopt when it does not decode, its
/// checksum fails, or it names more than `max_entries` entries.
std::optional<VerifyRecord> decode_record(const std::byte* bytes, std::size_t size, std::uint64_t max_entries);

/// The size of the record whose first kRecordFixedBytes bytes are `head`, if they are a record's
/// (its magic, its version, an entry count whose bits fit `file_size`); nullopt otherwise. What
/// gc asks of a lock file before it takes it for the cache's own.
std::optional<std::uint64_t> record_size_if_header(const std::byte* head, std::uint64_t file_size) noexcept;

/// Reads the record of the lock file open at `h`; nullopt when there is none that decodes (an
/// empty lock file, a torn or foreign record, a read error). Allocates at most for
/// `max_entries` bits.
std::optional<VerifyRecord> read_record(platform::Platform& pf, const platform::File& f, std::uint64_t max_entries);

/// Whether a change to a file whose change time is `ctime_ns`, made at or after `clock_ns` (the
/// change clock read before), is certain to get another change time: `ctime_ns` is before the
/// clock's reading by more than `window_ns`, the file system's change-time window
/// (Platform::change_window_ns: its timestamps' granularity with a margin; 0: never).
bool change_would_show(std::int64_t ctime_ns, std::int64_t clock_ns, std::int64_t window_ns) noexcept;

}  // namespace weightcache
