// Reading what a cache file has committed: the header, the commit slot in use and its index. One
// parser for every reader of the format inside the library (a Core opening or refreshing, and
// compaction); the CLI's inspector reports the same checks as findings.
#pragma once

#include "format/format.hpp"
#include "platform/platform.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace weightcache {

struct CommittedState {
  format::HeaderFixed fixed;
  format::CommitSlot slot;             // the commit in use
  bool newest_damaged = false;         // an older commit is in use: the newest does not verify
  bool unchanged = false;              // nothing newer than `newer_than` (records left empty)
  std::vector<format::IndexRecord> records;
};

/// Reads the header of the file open at `fd`, refuses a tie between the two commit slots or an
/// exhausted sequence (no writer of ours makes either: a forged or damaged file), and loads the
/// newest commit whose slot, bounds and index verify, falling back to the older one. Never
/// allocates or reads more than the index a slot names, nor an index that could not lie within
/// `max_bytes`. Errors: corrupt, incompatible (version or byte order), io, no_memory.
Result<CommittedState> read_committed(platform::Platform& pf, platform::Handle fd, const std::string& path,
                                      std::uint64_t file_size, std::uint64_t max_bytes,
                                      std::uint64_t newer_than);

/// Which header slot the next commit goes to: a slot that never verified, else the one holding
/// the lower sequence, so the newest commit is never overwritten.
int next_slot_index(const format::DecodedHeader& h) noexcept;

/// Reads and decodes the header of the file open at `fd` (the slot checksums only).
Result<format::DecodedHeader> read_header(platform::Platform& pf, platform::Handle fd);

}  // namespace weightcache
