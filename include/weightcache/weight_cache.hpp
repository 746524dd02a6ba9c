// weightcache C++ API, version 0.1 and not yet stable (see weightcache.h). Everything
// weightcache.h says applies here unchanged: the caveats (filesystems, fork, locks) and the rules
// every call follows (errors and last_error(), threads, handles and caches, the memory a cache
// returns, offsets). Each member of WeightCache is the C call it names, with the same statuses
// (Errc has wc_status's values). No function in this header throws: failures come back as
// Result / Error, and also set this thread's last_error().
//
// Language: C++17 or later (std::string_view, std::variant, inline variables). The installed CMake
// targets ask for it (cxx_std_17), so a find_package consumer is compiled as C++17 at least; with
// pkg-config or by hand, pass -std=c++17 (MSVC: /std:c++17). Below C++17 this header stops with
// the #error below rather than with errors from inside it. C and older C++ use weightcache.h.
#pragma once

// MSVC keeps __cplusplus at 199711L unless /Zc:__cplusplus is given; _MSVC_LANG is the standard it compiles.
#if (defined(_MSVC_LANG) && _MSVC_LANG < 201703L) || (!defined(_MSVC_LANG) && __cplusplus < 201703L)
#error "weightcache/weight_cache.hpp needs C++17 or later: compile with -std=c++17 (MSVC: /std:c++17), or link the CMake target weightcache::weightcache, which asks for it; from C or older C++, use weightcache/weightcache.h"
#endif

#include <weightcache/weightcache.h>

#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace weightcache {

inline constexpr std::size_t kNotFound = WC_NOT_FOUND;
inline constexpr std::size_t kMaxKeySize = WC_MAX_KEY_SIZE;
inline constexpr std::size_t kMaxAlignment = WC_MAX_ALIGNMENT;

/// Error codes; the numeric values equal the C ABI's wc_status.
enum class Errc : int {
  ok = 0,
  invalid_argument = 1,
  io = 2,
  no_space = 3,
  corrupt = 4,
  incompatible = 5,
  busy = 6,
  unsupported = 7,
  no_memory = 8,
  read_only = 9,
};

/// Static English name of a code, never null; the same text as wc_status_string.
WC_API const char* to_string(Errc code) noexcept;

/// What failed: a code, the OS errno (0 if none) and a message that says what to do next (UTF-8,
/// escaped as wc_last_error's, where the library's API returns it).
struct Error {
  Errc code = Errc::ok;
  int sys_errno = 0;
  std::string message;
};

/// expected-like result: a T, or the Error of a call that failed. Check with `ok()` /
/// `operator bool` before `value()`: calling value() (or * and ->) on an error, or error() on a
/// value, is a precondition violation, which stops at an assert in a debug build (NDEBUG not
/// defined) and is undefined behaviour otherwise.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  T& value() & noexcept {
    assert(ok() && "Result::value() called on an error: check ok() first");
    return *std::get_if<0>(&v_);
  }
  T&& value() && noexcept {
    assert(ok() && "Result::value() called on an error: check ok() first");
    return std::move(*std::get_if<0>(&v_));
  }
  const T& value() const& noexcept {
    assert(ok() && "Result::value() called on an error: check ok() first");
    return *std::get_if<0>(&v_);
  }
  T& operator*() & noexcept { return value(); }
  T* operator->() noexcept { return &value(); }
  const Error& error() const noexcept {
    assert(!ok() && "Result::error() called on a value: check ok() first");
    return *std::get_if<1>(&v_);
  }

 private:
  std::variant<T, Error> v_;
};

/// The result of a call that returns nothing but a status. error() of a success is an Error
/// with code ok and an empty message.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const noexcept { return error_.code == Errc::ok; }
  explicit operator bool() const noexcept { return ok(); }
  const Error& error() const noexcept { return error_; }

 private:
  Error error_;
};

enum class Backing : int { automatic = WC_BACKING_AUTO, file = WC_BACKING_FILE, heap = WC_BACKING_HEAP };
/// See wc_durability: none flushes nothing (a finalize has what it committed start writing back
/// on a thread of the cache's and never waits for it; close waits for that start, not for the
/// writes), async also starts write-back, full waits for the disk at every commit.
enum class Durability : int { none = WC_DURABILITY_NONE, async = WC_DURABILITY_ASYNC, full = WC_DURABILITY_FULL };
enum class Verify : int {
  first_use = WC_VERIFY_FIRST_USE,
  on_open = WC_VERIFY_ON_OPEN,
  none = WC_VERIFY_NONE,
  shared = WC_VERIFY_SHARED,
};

/// Options of a cache; open() copies them. A second open of a file that is already open in this
/// process (same compatibility key, same read_only) shares the first cache and keeps the first
/// opener's options, except that an alignment the shared cache does not honour is refused
/// (backing file) or gets a private heap cache with a warning (backing automatic). The defaults
/// are wc_options_init's.
struct Options {
  /// Cache file. Empty: a heap-only cache (nothing persisted).
  std::string path;
  /// Bytes naming what the packed bytes depend on: model identity, packer version, CPU features.
  /// A file written under another key is not used (it is replaced).
  std::string compat_key;
  /// Start-address alignment of every region, in this process and every later one mapping the
  /// file. Power of two, 1 .. kMaxAlignment.
  std::size_t alignment = 64;
  /// Region sizes are rounded up to this power of two.
  std::size_t size_alignment = 1;
  Backing backing = Backing::automatic;
  Durability durability = Durability::full;
  /// Never write the file; entries inserted go to the heap.
  bool read_only = false;
  /// How entries are checksummed before they are served (see wc_verify); default shared.
  Verify verify = Verify::shared;
  /// Opt out of the process-wide registry: get a private heap cache of one's own (nothing is
  /// read from or written to `path`).
  bool private_cache = false;
  /// Follow a symlink at `path`. Refused by default, except a link to a file this process
  /// already has open as a cache, which is shared (nothing new is opened through the link).
  bool allow_symlink = false;
  /// Permission bits of a newly created cache file (filtered by the umask, as open(2) does);
  /// 0777 at most: setuid, setgid and sticky bits make open() fail with invalid_argument.
  unsigned file_mode = 0644;
  /// How long a would-be writer waits for another process's writer lease before packing to heap.
  std::chrono::milliseconds lease_timeout{120000};
  /// A look-up miss first checks for entries other processes committed since the last refresh.
  bool refresh_on_miss = false;
  /// Address space reserved for the file mapping (the file can never grow past it). 0 (the
  /// default): 1/512 of what the process may reserve (pointer width, RLIMIT_AS), between 1 MiB
  /// and 256 GiB: 256 GiB in a 64-bit process without a limit; in a 32-bit one an eighth (256 MiB). Heap
  /// memory (a heap-only cache, a fallback) is reserved as it is used, whatever this says.
  std::uint64_t max_file_bytes = 0;
  /// With Verify::first_use or shared: when the file holds 16 MiB or more and the machine has two or more
  /// CPUs, one background thread checksums entries (from the middle of the file on) before their
  /// first look-up, so a warm load verifies on two cores. Look-ups never hash an entry twice; the
  /// thread stops at close. The first opener of a shared cache decides.
  bool verify_ahead = true;
  /// With durability async or full: start writing each inserted entry's whole pages back to disk
  /// at once (sync_file_range), so the finalize that makes them durable waits for less. false:
  /// leave it all to the finalize, for a host that must not wait on the disk while it inserts
  /// (the write-back start can block on a busy device) and finalizes on another thread (the
  /// ggml buffer type's default). The first opener of a shared cache decides.
  bool write_back_early = true;
  /// Compaction at open: an open that finds no other process using the file rewrites it first
  /// when its dead bytes are at least this percentage of the file (0 = never) ...
  unsigned compact_dead_percent = 50;
  /// ... and at least this many bytes. See wc_options.
  std::uint64_t compact_min_dead_bytes = std::uint64_t{16} << 20;
  /// An open descriptor of the cache file to use instead of opening `path` (see wc_options.fd);
  /// -1: open `path`.
  int fd = -1;
  /// Windows: an open HANDLE of the cache file to use instead of opening `path` (see
  /// wc_options.handle); nullptr: open `path`.
  void* handle = nullptr;
  /// A directory of read-only prebuilt caches to serve from when one suits this open (see
  /// wc_options.prebuilt_dir); empty: none.
  std::string prebuilt_dir;
  /// Where a read-only opener of a file on a read-only mount keeps its verification record (see
  /// wc_options.record_dir); empty: the default.
  std::string record_dir;
};

/// The path that names an anonymous, shareable cache (see wc_options.path).
inline constexpr const char* kMemoryPath = ":memory:";

/// The counters of a cache (shared by every handle on it); each field as in wc_stats.
struct Stats {
  std::uint64_t entries = 0;
  std::uint64_t file_bytes = 0;
  std::uint64_t mapped_bytes = 0;
  std::uint64_t heap_bytes = 0;
  std::uint64_t mappings = 0;
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  Backing backing = Backing::heap;
  std::uint64_t dead_bytes = 0;
  std::uint64_t verify_failures = 0;
  std::uint64_t heap_fallbacks = 0;
  std::uint64_t commits = 0;
  std::uint64_t alignment = 0;
  /// Entries the verify-ahead thread checksummed before a look-up asked for them.
  std::uint64_t verified_ahead = 0;
  /// Waits for another process's writer lease that ran out (Options::lease_timeout). After one,
  /// allocations only try the lease once, without waiting, until the next finalize or refresh.
  std::uint64_t lease_timeouts = 0;
  /// Live entries in heap memory that a finalize still has to write to the file, and their bytes.
  std::uint64_t unpersisted_entries = 0;
  std::uint64_t unpersisted_bytes = 0;
  /// Compactions of the file made when this cache was opened.
  std::uint64_t compactions = 0;
  /// Entries served on an earlier process's verification of this same state of the file,
  /// without hashing them (Verify::shared).
  std::uint64_t trusted_entries = 0;
  std::uint64_t prebuilt = 0;
};

class Core;

/// A handle on a cache (a wc_cache). Movable, not copyable; open the same path again for another
/// handle on the same underlying cache (see "Handles and caches" in weightcache.h). Every member
/// function may run concurrently with any other on the same or another handle, except the
/// destructor and the assignments, which, like wc_close, must not run concurrently with any
/// other use of this handle.
class WC_API WeightCache {
 public:
  /// Opens or creates the cache: wc_open, with its policy on bad files and fallback and its
  /// statuses.
  static Result<WeightCache> open(const Options& options) noexcept;

  /// An empty handle (operator bool is false). On it, look_up, reserve, release,
  /// look_up_or_insert, insert, finalize and refresh fail with invalid_argument (kNotFound,
  /// nullptr, or the error); offset_to_addr gives nullptr, is_finalized false, stats all zero
  /// (backing heap), alignment 0, descriptor -1 and file_handle nullptr, without an error.
  WeightCache() noexcept;
  /// Drops this handle. The last handle on a cache in this process closes it (see wc_close):
  /// entries inserted since the last successful finalize are not persisted, and every pointer
  /// the cache returned becomes invalid.
  ~WeightCache();
  /// Moves the handle; the source becomes empty. Pointers and offsets are unaffected.
  WeightCache(WeightCache&&) noexcept;
  /// Drops this handle (as the destructor does), then takes the other's.
  WeightCache& operator=(WeightCache&&) noexcept;
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;

  /// True for a handle returned by open (not moved-from, not default-constructed).
  explicit operator bool() const noexcept { return core_ != nullptr; }

  /// Offset of the entry under `key`, or kNotFound (a miss, not an error); see wc_look_up. Keys
  /// are arbitrary bytes.
  std::size_t look_up(std::string_view key) noexcept;
  /// Writable, aligned memory of at least `size` bytes, the cache's (never free it), valid until
  /// the cache is closed; nullptr on failure (last_error() says why). See wc_reserve_space.
  void* reserve(std::size_t size) noexcept;
  /// Gives back a reservation that will not be inserted; see wc_release_space.
  Result<void> release(void* ptr) noexcept;
  /// Commits bytes under `key`; see wc_look_up_or_insert for the exact semantics.
  std::size_t look_up_or_insert(std::string_view key, void* ptr, std::size_t size) noexcept;
  /// The same, storing in *finalize_ticket (when not null) the ticket of the entry returned, for
  /// is_finalized_through: wc_look_up_or_insert_ex.
  std::size_t look_up_or_insert(std::string_view key, void* ptr, std::size_t size,
                                std::uint64_t* finalize_ticket) noexcept;
  /// Copies `bytes` in under `key` (look_up_or_insert with the bytes copied; an empty
  /// `bytes` inserts an entry of 0 bytes).
  std::size_t insert(std::string_view key, std::string_view bytes) noexcept;
  /// Entry address for an offset, or nullptr when the offset is not a live entry's: the offset
  /// of an entry since replaced under its key gives nullptr, as in a process that opens the file
  /// afresh (a pointer obtained before the replacement stays readable until close). The bytes
  /// may not be modified; see wc_offset_to_addr.
  void* offset_to_addr(std::size_t offset) const noexcept;
  /// offset_to_addr that also resolves the offset of an entry since replaced under its key, for a
  /// caller that keeps offsets and cannot take a nullptr; see wc_offset_to_addr_kept.
  void* offset_to_addr_kept(std::size_t offset) const noexcept;
  /// Makes inserted entries durable; see wc_finalize.
  Result<void> finalize() noexcept;
  /// True when nothing was inserted since the last finalize or open (see wc_is_finalized).
  bool is_finalized() const noexcept;
  /// True once a finalize started after the insert that gave `ticket` (or for ticket 0); see
  /// wc_is_finalized_through.
  bool is_finalized_through(std::uint64_t ticket) const noexcept;
  /// Maps entries other processes finalized since open or the last refresh; see wc_refresh.
  Result<void> refresh() noexcept;
  /// A snapshot of the counters and where the entries live; see wc_get_stats.
  Stats stats() const noexcept;
  /// The file in use: Options::path, the prebuilt file chosen from prebuilt_dir, or a
  /// descriptor's label; empty for a heap-only cache or a moved-from one (see wc_get_path).
  std::string path() const;
  /// Effective alignment of region start addresses.
  std::size_t alignment() const noexcept;
  /// The descriptor of a file-backed cache's file, or -1; owned by the cache, see wc_get_fd.
  int descriptor() const noexcept;
  /// The Windows HANDLE of a file-backed cache's file, or nullptr; owned by the cache, see
  /// wc_get_handle.
  void* file_handle() const noexcept;

 private:
  explicit WeightCache(std::shared_ptr<Core> core) noexcept;
  std::shared_ptr<Core> core_;
};

// ---- garbage collection of a cache directory (see wc_gc) ----

/// Why gc removed or kept one cache file.
enum class GcReason : int {
  least_recently_used = 0,  ///< removed: among the least recently used while over budget
  within_budget = 1,        ///< kept: the directory is within budget without removing it
  in_use = 2,               ///< kept: a process has it open, or a writer holds its lease
  not_writable = 3,         ///< kept: this user cannot open it for writing, so it cannot be proven unused
  changed = 4,              ///< kept: replaced, removed or used by another process while gc looked at it
  failed = 5,               ///< kept: locking or deleting it failed (GcFile::detail says how)
};

/// Static English name of a reason ("least_recently_used", "in_use", ...), never null.
WC_API const char* to_string(GcReason reason) noexcept;

/// One cache file gc found.
struct GcFile {
  std::string path;                 ///< directory + "/" + name
  std::uint64_t bytes = 0;          ///< disk space of the file and its lock file
  std::int64_t last_used_ns = 0;    ///< later mtime of file and lock file, ns since the Unix epoch
  bool removed = false;             ///< the file is gone, and its lock file unless `detail` says why not
  GcReason reason = GcReason::within_budget;
  std::string detail;               ///< why it was kept (every reason but within_budget), or what stayed
};

/// What gc did; the counters are those of wc_gc_report.
struct GcReport {
  std::uint64_t max_bytes = 0;
  std::uint64_t total_before = 0, total_after = 0;
  std::uint64_t removed_files = 0, removed_bytes = 0;
  std::uint64_t kept_files = 0, kept_bytes = 0;
  std::uint64_t kept_in_use = 0, kept_in_use_bytes = 0;
  std::uint64_t kept_unremovable = 0, kept_unremovable_bytes = 0;
  std::uint64_t removed_temporaries = 0, removed_temporary_bytes = 0;
  /// Every cache file found, least recently used first.
  std::vector<GcFile> files;
  bool within_budget() const noexcept { return total_after <= max_bytes; }
};

/// Removes the least recently used cache files of `dir` until the caches there take at most
/// `max_bytes`; never one that is in use. See wc_gc for the rules. Errors: invalid_argument
/// (empty dir), io (the directory cannot be read), no_memory.
WC_API Result<GcReport> gc(const std::string& dir, std::uint64_t max_bytes) noexcept;

enum class LogLevel : int {
  trace = WC_LOG_TRACE,
  debug = WC_LOG_DEBUG,
  info = WC_LOG_INFO,
  warn = WC_LOG_WARN,
  error = WC_LOG_ERROR,
  off = WC_LOG_OFF,
};
/// Process-wide level of the "weightcache" logger (default warn, or $WEIGHTCACHE_LOG_LEVEL); see
/// wc_set_log_level. A value that is not one of LogLevel's is refused: the level stays as it was.
WC_API void set_log_level(LogLevel level) noexcept;
/// Routes messages to a callback (nullptr restores stderr). The callback runs under the
/// library's log lock and must not call into the library; when this returns the previous one
/// is not running. See wc_log_callback and wc_set_log_callback.
WC_API void set_log_callback(wc_log_callback callback, void* user) noexcept;

/// A copy of this thread's last error: what the last call that failed on this thread said (code
/// ok and an empty message before any). It changes only when a call fails on this thread (calls
/// that succeed leave it alone), as wc_last_error, whose text it holds. A copy, not a reference:
/// the per-thread state is plain data, so a thread's first failure never allocates (a
/// thread_local with a destructor would, and glibc aborts when that allocation fails). Without
/// memory for the copy, the message is empty and the code still says what failed.
WC_API Error last_error() noexcept;
/// Logs `message` as it is on the library's logger, at `level` (trace .. error); see
/// wc_log_message, whose rules (level filter, callback, escaping, refusals) apply unchanged.
WC_API void log_message(LogLevel level, std::string_view message) noexcept;

}  // namespace weightcache
