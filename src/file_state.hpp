// Reading what a cache file has committed: the header, the commit slot in use and its index. One
// parser for every reader of the format (a Core opening or refreshing, compaction, and the
// inspection library behind the CLI, which asks it for a Diagnosis: every problem it meets, in
// words).
#pragma once

#include "format/format.hpp"
#include "platform/platform.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace weightcache {

struct CommittedState {
  format::HeaderFixed fixed;
  format::CommitSlot slot;             // the commit in use
  int slot_index = -1;                 // the header slot holding it
  bool newest_damaged = false;         // an older commit is in use: the newest does not verify
  bool unchanged = false;              // nothing newer than `newer_than` (records left empty)
  std::vector<format::IndexRecord> records;
};

/// What read_committed tells a caller that asks for it (inspection: the CLI's verify, info, ls) besides
/// its result: every problem it meets, in file order, including those it steps over (a damaged
/// older slot, a newest commit it falls back from); the header, when it decodes; and, when no
/// commit can be used, the records of the best index that parsed at all, so that their data can
/// still be checked.
struct Diagnosis {
  std::vector<format::Diagnostic> problems;
  std::optional<format::HeaderFixed> header;
  std::vector<format::IndexRecord> salvaged;
  std::uint64_t salvaged_data_end = 0;  // where their commit's data area ends (its index begins)
};

/// Reads the header of the file open at `fd` (named in messages by fd.path()), refuses a tie
/// between the two commit slots or an exhausted sequence (no writer of ours makes either: a
/// forged or damaged file), and loads the newest commit whose slot, bounds and index verify,
/// falling back to the older one. Never
/// allocates or reads more than the index a slot names, nor an index that could not lie within
/// `max_bytes`. Errors: corrupt, incompatible (version or byte order), io, no_memory.
/// With `diagnosis`, also reads the slot it does not use (and an index of at most 16 MiB whose
/// checksum fails, to say what else is wrong with it: a larger one is checked in pieces before
/// anything is allocated for it, as without a diagnosis) and fills `*diagnosis`, describing at
/// most format::kMaxDiagnosticsPerKind problems of a kind per index; the result is the same.
/// With `restat`, the file is fstat()ed again once its header is read, into `*restat`, and that
/// size bounds the slots instead of `file_size`: our writers grow the file before they write a
/// slot and never cut it below a commit, so a size taken after the header covers every commit
/// the header names, however long the reader was held up between the two.
Result<CommittedState> read_committed(platform::Platform& pf, const platform::File& fd, std::uint64_t file_size,
                                      std::uint64_t max_bytes, std::uint64_t newer_than,
                                      Diagnosis* diagnosis = nullptr, platform::FileInfo* restat = nullptr);

/// read_committed on the file's current size: reads against `*info` (an fstat of `fd` the caller
/// made), and when the result is corrupt, or falls back from the newest commit, or (with a
/// `diagnosis`) found any problem, but a new fstat shows another size, reads again. A writer in
/// another process, or on another name of the same file (a hard link, or a path renamed since),
/// may grow the file and commit between the fstat and the header read; the newest slot then
/// points past the size seen. Writers grow the file before they write a slot and never cut it
/// below a commit, so a moved size means a commit landed, not damage. On return `*info` is the
/// fstat the result was read against, and `*diagnosis` (when given) is the diagnosis of that
/// read. Every reader of a file that another process may be committing uses this: a Core
/// opening or refreshing, and the inspection library (weightcache/inspect.hpp).
Result<CommittedState> read_committed_current(platform::Platform& pf, const platform::File& fd,
                                              platform::FileInfo* info, std::uint64_t max_bytes,
                                              std::uint64_t newer_than, Diagnosis* diagnosis = nullptr);

/// Which header slot the next commit goes to: a slot that never verified, else the one holding
/// the lower sequence, so the newest commit is never overwritten.
int next_slot_index(const format::DecodedHeader& h) noexcept;

/// Reads and decodes the header of the file open at `fd` (the slot checksums only).
Result<format::DecodedHeader> read_header(platform::Platform& pf, const platform::File& fd);

}  // namespace weightcache
