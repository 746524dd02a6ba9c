// weightcache inspection: what a cache file holds and what is wrong with it, for tools (the
// `weightcache` command-line tool is built on it) and tests. A separate library,
// weightcache_inspect (CMake target weightcache::weightcache_inspect, pkg-config
// weightcache-inspect), so that applications that only use caches do not carry it.
//
// It is the library's own reader: a weightcache file is read by the same code a cache uses when
// it opens the file (header, both commit slots, the index and its footer, every entry's bounds),
// with the same rule for a file another process is committing to meanwhile (a commit that
// lands between the size read and the header read is read again, never reported as damage). It
// also reads ExecuTorch XNNPACK weight-cache files ("XPWC", which have no checksums) and writes
// weightcache files from them (convert_xpwc).
//
// Link: the static library, with the static libweightcache (weightcache::weightcache_static),
// whose internal reader it uses; the shared libweightcache does not export that reader.
//
// Errors: no function throws except through std::bad_alloc where noted; failures come back as a
// Result whose Error says what failed (Errc as in weight_cache.hpp). Damage found in a file is
// not an error: it is a Finding of the Inspection.
//
// Threads and processes: every function may run concurrently with any other on different File
// objects; one File may be read by several threads at once (the calls only pread, never move a
// file position) but inspect(), which updates the File's size, must not run concurrently with
// another call on the same File. Nothing here maps a file, so a file truncated under a reader
// gives an error or a finding, never SIGBUS. Nothing here takes a lock that a cache user waits
// for, except convert_xpwc, which takes OUT's writer lease like any writer.
#pragma once

#include <weightcache/weight_cache.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weightcache::inspect {

enum class FileFormat { unknown, weightcache, xpwc };

/// "weightcache", "xpwc" or "unknown"; never null.
const char* to_string(FileFormat format) noexcept;

/// How many problems of one kind are described one by one per check (one index read, the XPWC
/// index, the entry checksums): a hostile file of millions of overlapping entries costs a count,
/// not millions of findings. Beyond it, problems of that kind are only counted, and one more
/// finding of that kind says how many (its `unlisted`).
inline constexpr std::size_t kMaxFindingsPerKind = 100;

/// One problem found in a file. `kind` is one of "format", "header", "slot", "index", "footer",
/// "entry_bounds", "entry_alignment", "entry_overlap", "duplicate_key", "entry_checksum",
/// "compat_key"; `message` says what is wrong in words (naming offsets and sizes); `key` is set
/// when the problem belongs to one entry. `unlisted` is 0 for a finding about one problem; the
/// finding that closes a kind met more than kMaxFindingsPerKind times stands for that many more
/// problems of its kind, which are not described one by one (its message says how many).
struct Finding {
  std::string kind;
  std::string message;
  std::optional<std::string> key;
  std::uint64_t unlisted = 0;
};

/// The fixed part of a weightcache file's header.
struct Header {
  std::uint32_t format_version = 0;
  std::uint64_t alignment = 0;
  std::uint64_t size_alignment = 0;
  std::uint64_t compat_hash = 0;  // XXH3-64 of the compatibility key (see compat_hash())
};

/// A commit, as its header slot names it.
struct Commit {
  std::uint64_t sequence = 0;
  std::uint64_t index_offset = 0;
  std::uint64_t index_size = 0;
  std::uint64_t committed_size = 0;  // where the commit's index + footer end
  std::uint64_t entry_count = 0;
};

struct Entry {
  std::string key;  // weightcache: the key; XPWC: the name, plus "#seed=<n>" for version 2
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::optional<std::uint64_t> checksum;  // XXH3-64 of the bytes; XPWC files have none
  std::optional<std::uint32_t> seed;       // XPWC version 2 only
  bool in_bounds = true;                   // its bytes lie inside the data area

  /// XPWC only: the entry's name, which is its key without the "#seed=<n>" of version 2. Points
  /// into `key`: valid while `key` is unchanged. (Not a member of its own: an index may hold
  /// millions of entries.)
  std::string_view name() const noexcept;
};

struct Inspection {
  FileFormat format = FileFormat::unknown;
  std::uint64_t file_size = 0;  // the size the file was read against

  // weightcache files
  bool header_ok = false;  // `header` decoded
  Header header;
  int slot_index = -1;  // header slot of the commit in use, -1 if none verifies
  Commit commit;        // the commit in use (when slot_index >= 0)
  bool newest_commit_damaged = false;  // the commit in use is not the newest one written

  // XPWC files
  std::uint32_t xpwc_version = 0;
  bool byte_swapped = false;  // written on a host of the other byte order
  std::uint64_t index_start = 0;

  /// Entries of the index in use, in index order. When no index verifies, the entries of the
  /// newest index that could be parsed at all (for diagnostics; index_usable is then false).
  std::vector<Entry> entries;
  /// True when `entries` come from an index the library would use (for XPWC files: one that
  /// passed the same checks). Listing, extracting, compacting and converting need it.
  bool index_usable = false;
  /// Every problem found, in file order, at most kMaxFindingsPerKind of a kind per check (then
  /// one finding counting the rest). Empty for a sound file.
  std::vector<Finding> findings;

  /// Problems found: one per finding, plus what closing findings count as unlisted.
  std::uint64_t problem_count() const noexcept;

  /// Sum of the entries' sizes.
  std::uint64_t payload_bytes() const noexcept;
  /// File bytes used by nothing live: not the header, not a live entry, not the index + footer
  /// in use. Replaced entries, old trailers, alignment padding and any uncommitted tail.
  /// Allocates: may throw std::bad_alloc.
  std::uint64_t dead_bytes() const;
  /// Largest power of two (up to 2^24) dividing every entry offset; 0 without entries.
  std::uint64_t offset_alignment() const noexcept;
};

/// A file opened for reading, and its size. Movable, not copyable; closed when it goes.
class File {
 public:
  /// Opens an existing file read-only (following symlinks) and reads its size. Errors: what
  /// the platform's open and fstat report (io for a missing or unreadable file, with the OS's
  /// errno and a message naming the path), no_memory.
  static Result<File> open(const std::string& path) noexcept;
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const noexcept;
  /// The size read at open, or the one the last inspect() read against.
  std::uint64_t size() const noexcept;

  /// The library's side of the file (defined in its sources, not installed).
  struct Impl;
  const Impl& impl() const noexcept { return *impl_; }
  Impl& impl() noexcept { return *impl_; }

 private:
  explicit File(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

/// Recognises the format and checks every structure the file holds, as the library reads it
/// when it opens the file. A weightcache file that another process commits to meanwhile is read
/// again when a commit moved its size under the read (the library's rule), so it yields the
/// state of one commit, never a finding. Problems with the content are findings; an Error means
/// the file could not be read at all (io, no_memory). Entry checksums are not checked here (see
/// check_checksums).
/// What a hostile file can cost is bounded: nothing is allocated for a size the file claims
/// before what claims it verifies (an index over 16 MiB is checked against its slot's checksum
/// in 1 MiB pieces first, and one that fails is not read further; an XPWC footer's count is
/// capped by its index's bytes), findings are capped per kind (kMaxFindingsPerKind), and the
/// checks of keys and places are linear after one sort. Memory grows with the entries the index
/// really holds (about 100 bytes each, and its key where it is longer than 15 bytes); no_memory
/// when even that is not there.
Result<Inspection> inspect(File& file) noexcept;

/// Hears of every piece of bytes read (for a progress display).
using Progress = std::function<void(std::uint64_t bytes)>;
/// Receives the bytes read, in order; an error stops the read and is returned.
using Sink = std::function<Result<void>(const std::byte* data, std::size_t size)>;

/// XXH3-64 (the entry checksum) of `size` bytes at `offset`, read in chunks of at most 8 MiB.
/// `sink`, if set, receives every chunk (to copy while hashing). `scratch`, if set, is the read
/// buffer, kept by the caller across calls; otherwise the call uses its own. Errors: io
/// (corrupt: the file ends before offset + size), no_memory, or the sink's.
Result<std::uint64_t> hash_range(const File& file, std::uint64_t offset, std::uint64_t size,
                                 const Progress& progress = {}, const Sink& sink = {},
                                 std::vector<std::byte>* scratch = nullptr) noexcept;

/// Checks the checksum of every in-bounds entry of `*inspection` that has one, and appends an
/// "entry_checksum" finding per mismatch. Returns the number of bytes hashed. Errors as
/// hash_range.
Result<std::uint64_t> check_checksums(const File& file, Inspection* inspection,
                                      const Progress& progress = {}) noexcept;

/// Appends a "compat_key" finding unless the file was written for `compat_key` (an XPWC file
/// records no key, so it never was). May throw std::bad_alloc.
void check_compat_key(Inspection* inspection, std::string_view compat_key);

/// XXH3-64 of a compatibility key, as the header records it.
std::uint64_t compat_hash(std::string_view compat_key) noexcept;

/// A key as people read it: as-is when every byte is printable ASCII and it does not itself
/// start with "0x"; otherwise "0x" followed by lowercase hex. May throw std::bad_alloc.
std::string display_key(std::string_view key);
/// The inverse of display_key: "0x" + hex digits (either case) is hex, anything else the text
/// itself. nullopt for "0x..." with a non-hex digit or an odd number of digits. May throw
/// std::bad_alloc.
std::optional<std::string> parse_key(std::string_view text);

/// Whether `path` names a file that a rewrite may replace by renaming a new file over it:
/// true for a regular file, false when nothing is there (an error instead with `must_exist`).
/// Errors: invalid_argument for a symbolic link (the rename would replace the link, not its
/// target) or anything but a regular file; the OS's error when it cannot be looked at.
Result<bool> replaceable(const std::string& path, bool must_exist) noexcept;

struct ConvertOptions {
  std::string compat_key;         // the compatibility key OUT is written for
  std::uint64_t alignment = 64;   // entry alignment of OUT: a power of two up to kMaxAlignment
};

struct ConvertReport {
  std::uint64_t entries = 0;
  std::uint64_t compat_hash = 0;
};

/// Writes the entries of the XPWC file `in` (inspected as `inspection`, which must have a usable
/// index and no findings) as the weightcache file `out_path`: under OUT's writer lease
/// (OUT.lock, as every writer of OUT takes it), into a temporary file beside OUT that keeps an
/// existing OUT's permission bits (and owner, where the platform has one), read back whole by
/// the library's reader, synced and renamed over OUT. Replaces an existing OUT: check with
/// replaceable() first. `progress` hears of the bytes copied and then read back (twice the
/// payload).
/// IN must hold still from the inspection to the end of the copy (an XPWC file has no checksums,
/// and ExecuTorch rewrites it in place): before copying, IN's fstat must be the one the
/// inspection read against (device, inode, size, mtime, ctime) and its last change older than
/// the file system's change-time window (10 ms where times are kept to the nanosecond, else
/// 2 s: the call waits for that when IN changed just before), and IN's dirty pages are written
/// back; after copying, IN's index and footer are read again and must be what the inspection
/// parsed, and its fstat unchanged. Any change then moves IN's change time or its index, and
/// one that neither shows came before every byte the copy read, so OUT holds one version of IN,
/// never two (the argument, and what it does not cover, are in src/inspect/convert.cpp: file
/// systems whose times do not show every change at once, such as tmpfs or network file
/// systems, and platforms without a write-back call, where a same-size rewrite within one
/// timestamp tick can still go unseen).
/// Errors: invalid_argument (not an XPWC inspection, an unusable index, findings, a key the
/// format cannot hold, a bad alignment), busy (another process holds OUT's writer lease; nothing
/// changed), corrupt (IN changed after it was inspected or while it was copied, or was cut
/// short), io (the lease file, creating, writing, reading back, syncing or renaming), no_space,
/// no_memory. OUT is untouched and no temporary is left after any error.
Result<ConvertReport> convert_xpwc(const File& in, const Inspection& inspection, const std::string& out_path,
                                   const ConvertOptions& options, const Progress& progress = {}) noexcept;

}  // namespace weightcache::inspect
