// Reading side of the command-line tool: recognises a weightcache file or an ExecuTorch XPWC
// file, checks every structure it can reach, and lists the entries. A weightcache file is read by
// the library's own reader (read_committed, with a Diagnosis); XPWC files, which the library does
// not read, are parsed here with the format's byte helpers. All reads go through pread
// (platform::read_at), never a mapping, so a file truncated under us yields an error instead of
// SIGBUS.
#pragma once

#include "format/format.hpp"
#include "platform/platform.hpp"

#include <weightcache/weight_cache.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace weightcache::cli {

class Progress;

/// A file the tool reads, and its size when it was opened.
struct InputFile {
  platform::File file;
  std::uint64_t size = 0;
  const std::string& path() const noexcept { return file.path(); }
};

/// Opens an existing regular file read-only (following symlinks).
Result<InputFile> open_for_reading(const std::string& path);

enum class FileFormat { unknown, weightcache, xpwc };

struct Entry {
  std::string key;  // weightcache: the key; XPWC: the name, plus "#seed=<n>" for version 2
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::optional<std::uint64_t> checksum;  // XPWC files have none
  std::string name;                        // XPWC only
  std::optional<std::uint32_t> seed;       // XPWC version 2 only
  bool in_bounds = true;                   // its bytes lie inside the data area
};

/// One problem found in a file: the library's diagnostics, plus the tool's own kinds
/// ("format", "entry_checksum", "compat_key").
using Finding = format::Diagnostic;

struct Inspection {
  FileFormat format = FileFormat::unknown;
  std::uint64_t file_size = 0;

  // weightcache files
  bool header_ok = false;
  format::HeaderFixed header;
  int slot_index = -1;  // slot of the commit in use, -1 if none verifies
  format::CommitSlot slot;
  bool newest_commit_damaged = false;  // the commit in use is not the newest one written

  // XPWC files
  std::uint32_t xpwc_version = 0;
  bool byte_swapped = false;  // written on a host of the other byte order
  std::uint64_t index_start = 0;

  /// Entries of the index in use, in index order. When no index verifies, the entries of the
  /// newest index that could be parsed at all (for diagnostics; index_usable is then false).
  std::vector<Entry> entries;
  /// True when `entries` come from an index the library would use (for XPWC files: one that
  /// passed the same checks): info, ls, cat, compact and convert work only then.
  bool index_usable = false;
  std::vector<Finding> findings;

  std::uint64_t payload_bytes() const noexcept;
  /// File bytes used by nothing live: not the header, not a live entry, not the index + footer
  /// in use. Replaced entries, old trailers, alignment padding and any uncommitted tail.
  std::uint64_t dead_bytes() const;
  /// Largest power of two (up to 2^24) dividing every entry offset; 0 without entries.
  std::uint64_t offset_alignment() const noexcept;
};

/// Recognises the format and checks every structure. Problems with the content are findings;
/// an Error means the file could not be read at all.
Result<Inspection> inspect(const InputFile& file);

/// Hashes `size` bytes at `offset` with XXH3-64 (the library's entry checksum), reading in
/// chunks. `sink`, if set, receives every chunk in order (used to copy while hashing).
/// `scratch`, if set, is the read buffer, kept by the caller across calls (a check of thousands
/// of entries reuses one); otherwise the call uses its own.
Result<std::uint64_t> hash_range(const InputFile& file, std::uint64_t offset, std::uint64_t size,
                                 Progress* progress,
                                 const std::function<Result<void>(const std::byte*, std::size_t)>& sink = {},
                                 std::vector<std::byte>* scratch = nullptr);

/// Checks the checksum of every in-bounds entry that has one; appends a finding per mismatch.
/// Returns the number of bytes hashed.
Result<std::uint64_t> check_checksums(const InputFile& file, Inspection* in, Progress* progress);

const char* format_name(const Inspection& in);

}  // namespace weightcache::cli
