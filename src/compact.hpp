// Writing whole cache files: a temporary file that deletes itself unless committed, the writer
// that copies live entries into a new file (compaction and the CLI's convert), and
// compaction of a cache file at a path (wc_compact).
#pragma once

#include "file_state.hpp"
#include "platform/platform.hpp"

#include <weightcache/weight_cache.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace weightcache {

/// A new file beside `path` under a temporary name ("<path>.tmp.<pid>.<n>"), deleted by the
/// destructor unless commit() renamed it over `path` (the shape of LLVM's FileOutputBuffer).
class TempFile {
 public:
  static Result<TempFile> create(platform::Platform& pf, const std::string& path, unsigned mode);
  TempFile(TempFile&& o) noexcept;
  TempFile& operator=(TempFile&&) = delete;
  TempFile(const TempFile&) = delete;
  ~TempFile();
  /// The new file, open for writing until commit().
  const platform::File& file() const noexcept { return file_; }
  /// Its temporary name.
  const std::string& name() const noexcept { return file_.path(); }
  /// Syncs the file (when `durable`), closes it, renames it over the path and syncs the
  /// directory (when `durable`). After a failure the temporary is still deleted by the destructor.
  Result<void> commit(bool durable);

 private:
  TempFile(platform::Platform& pf, std::string path, platform::File file) noexcept
      : pf_(&pf), path_(std::move(path)), file_(std::move(file)) {}
  platform::Platform* pf_;
  std::string path_;
  platform::File file_;  // named by its temporary name, which stays after it is closed
  bool committed_ = false;
};

/// One entry to copy into a new file: its bytes are `size` bytes at `offset` of the source.
struct SourceEntry {
  std::string key;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::optional<std::uint64_t> checksum;  // expected; nullopt: computed while copying
};

struct WrittenFile {
  std::vector<format::IndexRecord> records;  // what the new file holds, in file order
  std::vector<std::string> corrupt_keys;      // left out: their bytes fail the stored checksum
  std::uint64_t file_size = 0;
};

/// Bytes a file holding `entries` (in this order) takes with this placement.
std::uint64_t planned_file_size(const std::vector<SourceEntry>& entries, std::uint64_t alignment,
                                std::uint64_t size_alignment) noexcept;

/// Writes a complete cache file into `dst`: header with one commit slot of `sequence`, the
/// entries copied from `src` in the order given (checksummed on the way; one whose bytes fail
/// its expected checksum is left out and listed), the index and the footer, then reads the new
/// file back (header, index and every entry's checksum) before the caller commits it.
/// `progress`, if set, hears of every piece of entry bytes copied or read back (a CLI's progress
/// line: twice the entries' bytes in all).
Result<void> write_cache_file(platform::Platform& pf, const platform::File& src, TempFile& dst,
                              const format::HeaderFixed& fixed, std::uint64_t sequence,
                              const std::vector<SourceEntry>& entries, WrittenFile* out,
                              const std::function<void(std::uint64_t)>& progress = {});

struct CompactSettings {
  bool drop_corrupt = false;  // leave damaged entries out instead of refusing
  bool any_key = false;       // compact whatever compatibility key the file was written for
  // Entries in key order (bytewise), sequence 1, zero padding: two files holding the same
  // entries (same bytes under the same keys, same alignment and key) compact to identical bytes,
  // whatever order, processes or threads inserted them. Rewrites even an already compact file.
  bool canonical = false;
  // Repair at open: the newest commit does not verify (a truncated file, an index torn by a power
  // loss) and the one in use is the older. Writes that one into a fresh file even when nothing
  // would be reclaimed, so that writers can commit again (see Core::init_file). Without it a
  // file whose newest commit is damaged is refused.
  bool salvage = false;
  Durability durability = Durability::full;
};

struct CompactResult {
  bool rewritten = false;  // false: already compact (nothing to reclaim), file untouched
  std::uint64_t entries = 0, dropped = 0, bytes_before = 0, bytes_after = 0;
  std::vector<std::string> corrupt_keys;
};

/// Bytes compaction would reclaim from a committed file: its size minus the size of a file
/// holding just its live entries (alignment padding between entries is not reclaimable).
std::uint64_t dead_bytes_of(const CommittedState& st, std::uint64_t file_size) noexcept;

/// Rewrites the live entries of the cache file open at `fd` (committed state `st`) into a new
/// file renamed over the path it was opened as. The caller holds the writer lease and the
/// exclusive in-use lock on `fd`, so no process has the file open and none can commit meanwhile.
/// `let_go` closes `fd` (and so its locks): called just before the rename where the platform
/// cannot rename over a file this process holds open (Windows).
Result<void> rewrite_compacted(platform::Platform& pf, const platform::File& fd, const CommittedState& st,
                               std::uint64_t file_size, unsigned file_mode, const CompactSettings& settings,
                               CompactResult* out, const std::function<void()>& let_go);

/// wc_compact: opens options.path, takes the writer lease and the exclusive in-use lock (busy
/// when another process holds either), checks the compatibility key (unless settings.any_key),
/// and rewrites the file if anything can be reclaimed.
Result<CompactResult> compact_path(const Options& options, const CompactSettings& settings);

}  // namespace weightcache
