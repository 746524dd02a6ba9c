// The platform seam: every OS call the cache makes goes through this interface, so tests can
// wrap it (fault injection, crash simulation) and each OS has one small implementation.
// Nothing OS-specific leaks past this header: handles are opaque integers, held by a File that
// closes them (file.hpp) and names them in every error.
#pragma once

#include "platform/file.hpp"

#include <weightcache/weight_cache.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace weightcache::platform {

/// Change-time windows (Platform::change_window_ns). Fine: a file system that keeps nanoseconds
/// stamps change times from the kernel's coarse clock, one tick (1-10 ms) fine, the clock
/// change_clock_ns reads, so a change after a reading gets a time at or past it; 10 ms is a full
/// tick of the slowest tick rate on top. Coarse: the coarsest timestamps of any file system
/// (FAT keeps even seconds), which also covers a clock stepped back by less than that.
inline constexpr std::int64_t kFineChangeWindowNs = 10'000'000;
inline constexpr std::int64_t kCoarseChangeWindowNs = 2'000'000'000;

struct FileInfo {
  std::uint64_t size = 0;
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  bool regular = false;
  bool symlink = false;  // only from stat_path(follow = false)
  unsigned mode = 0644;  // permission bits (POSIX; Windows reports 0644)
  std::int64_t mtime_ns = 0;  // last modification, ns since the epoch (0 where unknown)
  std::int64_t ctime_ns = 0;  // last change of data or metadata (POSIX st_ctim; 0 where unknown)
  std::uint32_t owner = 0;    // owning user (POSIX st_uid; 0 on Windows)
  std::uint32_t group = 0;    // owning group (POSIX st_gid; 0 on Windows)
  std::uint64_t links = 0;    // names the file has (POSIX st_nlink; 0 where not asked)
  std::uint64_t allocated = 0;  // disk space the file takes (POSIX st_blocks; Windows: its size)
};

enum class OpenMode {
  read,        // existing file, read-only
  read_write,  // existing file
  create_new,  // fails with EEXIST if present
  lock_file,   // create if missing, read-write; used for the sidecar lease file
};

/// Abstract OS layer. All functions are thread-safe. None throws but std::bad_alloc (naming a
/// file, building a message), which travels to the boundary like any other (docs/DESIGN.md).
/// An error about an open file names it: what the File was opened as (File::path).
class Platform {
 public:
  virtual ~Platform() = default;

  // ---- files ----
  /// The File it returns is owned by this platform, which closes it (close_file).
  virtual Result<File> open_file(const std::string& path, OpenMode mode, unsigned perm, bool follow_symlink) = 0;
  /// Closes a handle this platform opened: what File::close calls, and nothing else.
  virtual void close_file(Handle h) noexcept = 0;
  virtual Result<FileInfo> stat_file(const File& f) = 0;
  virtual Result<FileInfo> stat_path(const std::string& path, bool follow_symlink) = 0;
  /// Reads exactly `size` bytes or fails (a short read past EOF is Errc::corrupt).
  virtual Result<void> read_at(const File& f, void* buf, std::size_t size, std::uint64_t offset) = 0;
  /// Writes exactly `size` bytes (retrying short writes and EINTR) or fails.
  virtual Result<void> write_at(const File& f, const void* buf, std::size_t size, std::uint64_t offset) = 0;
  /// Allocates disk blocks for [offset, offset+len) and extends the file to cover it, so later
  /// stores through a mapping can never fault for lack of space. ENOSPC/EFBIG -> Errc::no_space.
  virtual Result<void> allocate(const File& f, std::uint64_t offset, std::uint64_t len) = 0;
  virtual Result<void> truncate(const File& f, std::uint64_t size) = 0;
  /// Makes the file's data and size durable (fdatasync / FlushFileBuffers).
  virtual Result<void> sync(const File& f) = 0;
  virtual Result<void> rename(const std::string& from, const std::string& to) = 0;
  /// Makes a rename in the directory of `path` durable (no-op where the OS has no such call).
  virtual Result<void> sync_parent_dir(const std::string& path) = 0;
  virtual void remove(const std::string& path) noexcept = 0;
  /// Deletes the name `path` (a symlink there, not its target), saying why when it cannot.
  virtual Result<void> remove_file(const std::string& path) = 0;
  /// The names in a directory (not "." or ".."), in no particular order. Not std::filesystem:
  /// libstdc++ 12's directory_iterator calls std::terminate when it runs out of memory.
  virtual Result<std::vector<std::string>> list_directory(const std::string& dir) = 0;
  /// Sets the file's modification time to now (advisory bookkeeping; errors ignored).
  virtual void touch(const File& f) noexcept = 0;
  /// A new handle of our own on the regular file a caller's descriptor refers to: a new open file
  /// description where the OS allows (/proc/self/fd on Linux), so that locks taken through it are
  /// ours alone, else a duplicate. Close-on-exec. Not a regular file: invalid_argument. The File
  /// is named "fd <descriptor>".
  virtual Result<File> reopen(int descriptor, bool writable) = 0;
  /// An anonymous file for ":memory:" caches, named ":memory:": a memfd sealed against shrinking
  /// on Linux, a delete-on-close temporary file on Windows (docs/DESIGN.md says why not a section).
  virtual Result<File> create_anonymous(const char* name) = 0;
  /// The OS descriptor behind a file (-1 where handles are not descriptors: Windows).
  virtual int native_descriptor(const File& f) const noexcept = 0;
  /// reopen for a caller's OS handle (wc_options.handle, a HANDLE on Windows): a new file object
  /// of our own (locks taken through it are ours alone), never with more access than the
  /// caller's handle has (read_only when asked to write through a handle that cannot). Where the
  /// OS has no such handles (POSIX): unsupported.
  virtual Result<File> reopen_os_handle(void* /*os_handle*/, bool /*writable*/) {
    return Error{Errc::unsupported, 0, "wc_options.handle is a Windows HANDLE; on this system pass a descriptor (fd)"};
  }
  /// Whether nothing of the file can outlive the processes holding it open, so that flushing it
  /// is pointless: a Linux memfd created sealable (what ":memory:" makes); on Windows a file
  /// already pending deletion, or a ":memory:" file of this library (by its name). What a cache
  /// opened on a descriptor or handle asks, to treat a ":memory:" file as its creator does.
  /// False when it cannot tell.
  virtual bool vanishes_with_holders(const File& /*f*/) noexcept { return false; }
  /// The OS handle behind a file (wc_get_handle): a HANDLE on Windows, nullptr elsewhere.
  virtual void* native_os_handle(const File& /*f*/) const noexcept { return nullptr; }
  /// Whether a file this process holds open can be renamed over (POSIX: yes; Windows: not
  /// everywhere, so the replacer lets go of its handle, and its in-use lock, just before).
  virtual bool replaces_open_files() const noexcept { return true; }

  // ---- address space ----
  /// Reserves (does not commit) `size` bytes of address space aligned to `align`. Callers hold
  /// what it returns in an AddressReservation (address_space.hpp), which releases it.
  virtual Result<void*> reserve_address_space(std::size_t size, std::size_t align) = 0;
  /// Releases a reservation and everything mapped or committed inside it.
  virtual void release_address_space(void* base, std::size_t size) noexcept = 0;
  /// Maps [offset, offset+len) of the file at exactly `at` (inside a reservation). `offset`,
  /// `len` and `at` are multiples of map_granularity().
  virtual Result<void> map_file(const File& f, std::uint64_t offset, std::size_t len, void* at,
                                bool writable) = 0;
  /// Makes [at, at+len) of a reservation usable as private zeroed memory (the heap arena).
  virtual Result<void> commit_memory(void* at, std::size_t len) = 0;
  /// Writes back mapped pages of [addr, addr+len); waits for completion when `wait`.
  virtual Result<void> flush_mapping(void* addr, std::size_t len, bool wait) = 0;
  /// Asks the OS to read ahead [addr, addr+len) of a mapping (advisory; errors ignored).
  virtual void prefetch(void* addr, std::size_t len) noexcept = 0;
  /// Maps the pages of [addr, addr+len) of a file mapping now, in one call, because they are
  /// about to be read: far cheaper than one fault per 64 KiB when the page cache holds the file
  /// in large folios. Returns false only when the OS says reading them would fault (the file
  /// was cut short underneath the mapping); "not supported" and other errors return true.
  virtual bool populate_read(void* /*addr*/, std::size_t /*len*/) noexcept { return true; }
  /// Offset of the first byte of [offset, offset + len) of the file that no allocated disk block
  /// backs (a hole; blocks allocated but never written are not one), or offset + len when there
  /// is none; `offset` itself when the range starts at or past the end of the file. Asks the
  /// file system's allocation map (SEEK_HOLE and FIEMAP, FSCTL_QUERY_ALLOCATED_RANGES) and reads
  /// no data. Where the OS or the file system cannot tell,
  /// the range counts as allocated ("unsupported" is never a hole). Errors are I/O errors only.
  virtual Result<std::uint64_t> first_hole(const File& /*f*/, std::uint64_t offset, std::uint64_t len) {
    return offset + len;
  }

  // ---- locks ----
  /// Exclusive lock on an open file, owned by this handle (not the process). Non-blocking:
  /// returns false when someone else holds it. Released by unlock, close or process death.
  virtual Result<bool> try_lock(const File& f) = 0;
  virtual void unlock(const File& f) noexcept = 0;
  /// The "in use" lock on a cache file (docs/DESIGN.md, "Who may replace a file"): every
  /// process that has the file open holds it shared; rebuilding, compacting or deleting the file
  /// needs it exclusive. A byte-range lock far past any data, owned by the handle's open file
  /// description like the lease (so a forked child shares it, and closing another descriptor of
  /// the same file does not drop it), released by unlock_in_use, close or process death, and
  /// independent of try_lock's lease. Non-blocking: false when another holder conflicts. Asking
  /// for the other mode while holding one converts it (atomically on POSIX; on Windows the
  /// shared lock is let go for a moment, so a failed upgrade may come back without it, in which
  /// case it returns false and the caller must take it again). Exclusive needs a handle opened
  /// for writing on POSIX.
  virtual Result<bool> try_lock_in_use(const File& f, bool exclusive) = 0;
  virtual void unlock_in_use(const File& f) noexcept = 0;
  /// Whether another holder (another process, or another handle of this one) has the in-use
  /// lock on the file, in either mode; `f` should hold none itself. Works on a handle opened
  /// read-only. Unsupported where there are no such locks.
  virtual Result<bool> in_use_by_others(const File& /*f*/) {
    return Error{Errc::unsupported, 0, "no in-use lock to ask on this system"};
  }

  // ---- facts ----
  /// Granularity of file-mapping offsets and addresses (page size, 64 KiB on Windows).
  virtual std::size_t map_granularity() const noexcept = 0;
  virtual int process_id() const noexcept = 0;
  /// Current limit on file size for this process (RLIMIT_FSIZE), UINT64_MAX if none. Growing
  /// past it would raise SIGXFSZ in the host, so the cache checks before it grows.
  virtual std::uint64_t file_size_limit() const noexcept = 0;
  /// Current limit on this process's address space (RLIMIT_AS), UINT64_MAX if none. Reserved
  /// ranges count against it, so the cache sizes its default reservation from it.
  virtual std::uint64_t address_space_limit() const noexcept { return UINT64_MAX; }

  // ---- what an earlier verification of a file may be trusted on (docs/DESIGN.md, "Verified
  // once per file state"); the defaults say "nothing", which keeps verification per process ----
  /// 16 bytes that change at every boot of the OS (Linux: /proc/sys/kernel/random/boot_id);
  /// false where there is no such thing.
  virtual bool boot_id(std::uint8_t (&/*out*/)[16]) noexcept { return false; }
  /// Now, on the clock the file system stamps change times from, in ns since the epoch, no finer
  /// than the file system sees it (Linux: CLOCK_REALTIME_COARSE); 0 where unknown.
  virtual std::int64_t change_clock_ns() noexcept { return 0; }
  /// Now, on a clock that never goes back (it does not follow the wall clock), in ns from any
  /// fixed point; 0 where unknown. How long a check that a file is still in a state holds for
  /// this process (core_trust.cpp: one fstat per interval, not per entry). POSIX reads
  /// CLOCK_MONOTONIC through its call table, so that tests can pin it.
  virtual std::int64_t monotonic_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  /// The change-time window of the file open at `f`, whose fstat is `info`: how much earlier than
  /// a change_clock_ns() reading its change time must be for every change made after the reading
  /// to be certain to give it another change time (docs/DESIGN.md, "How a change is known"). It
  /// is the granularity of the file system's timestamps with a margin: 10 ms where they keep
  /// nanoseconds for this file, a flat 2 s for every other and every unknown file system.
  /// 0 when not every change (a write, through a mapping too, a truncation, a fallocate) moves
  /// the change time as this process sees it at once: tmpfs, stacked and network file systems,
  /// or when it cannot tell. Then nothing is trusted from an earlier process.
  virtual std::int64_t change_window_ns(const File& /*f*/, const FileInfo& /*info*/) noexcept { return 0; }
  /// Writes back the dirty pages of [offset, offset + size) of the file and waits for them, so
  /// that every page of it is clean: a later store through any process's shared mapping of it
  /// then faults, and the fault moves the file's change time (a store to a page that stays
  /// dirty would not). No flush to the device. False where it cannot (nothing is then trusted).
  virtual bool write_back(const File& /*f*/, std::uint64_t /*offset*/, std::uint64_t /*size*/) noexcept { return false; }
  /// Readies [offset, offset + len) of the file, space just handed out for a caller to fill with
  /// stores through its mapping: POSIX writes zeros there with write(), so the page cache holds
  /// the pages before the stores come and each store takes a minor fault. A store into a page
  /// the file system must first read or zero is far slower: on Linux's ext4 in fallocated space,
  /// packing 700 MiB took 4x as long (docs/BENCHMARKS.md). Only for space no entry, index or
  /// other writer uses. Errors are write errors (a full disk: the space is not there after all).
  virtual Result<void> prepare_for_stores(const File& /*f*/, std::uint64_t /*offset*/, std::uint64_t /*len*/) {
    return {};
  }
  /// Starts writing back the dirty pages of [offset, offset + size) of the file, without waiting
  /// (advisory: the finalize that follows then has less to wait for). Errors are ignored.
  virtual void start_write_back(const File& /*f*/, std::uint64_t /*offset*/, std::uint64_t /*size*/) noexcept {}
  /// Where a file is mounted, as far as verification records care: a read-only mount (nothing
  /// can write the file through it); `kernel_times`: a file system on which every change to a
  /// file's bytes through it moves a change time the kernel sets (ext2/3/4, xfs, btrfs, f2fs,
  /// zfs, bcachefs); not image file systems (squashfs, erofs, iso9660: times come from the
  /// image), tmpfs, network, user-space or stacked ones (overlayfs: its times, pages and layers
  /// are other files').
  struct Mount {
    bool read_only = false;
    bool kernel_times = false;
  };
  virtual Mount mount_of(const File& /*f*/) noexcept { return {}; }
  /// Creates a directory (mode under the umask); an existing one is not an error.
  virtual Result<void> make_directory(const std::string& path, unsigned /*mode*/) {
    return Error{Errc::unsupported, 0, "no directories made here: " + path};
  }
  /// This process's effective user; nullopt where there is none to compare owners with.
  virtual std::optional<std::uint32_t> effective_user() noexcept { return std::nullopt; }
  /// Whether the file's access may go beyond its owner, group and mode bits (a POSIX access
  /// control list); true when it cannot tell.
  virtual bool has_access_list(const File& /*f*/) noexcept { return true; }
};

/// The real OS implementation (POSIX or Win32, chosen at build time). Lives forever.
Platform& os() noexcept;

/// Counts the forks this process descends from since the first call (a pthread_atfork child
/// handler bumps it), so a cache tells it is in a forked child with one atomic load instead of a
/// getpid per call. 0 forever where there is no fork (Windows); kForkGenerationUnknown if the
/// handler could not be registered (the caller then compares process ids).
inline constexpr std::uint64_t kForkGenerationUnknown = ~std::uint64_t{0};
std::uint64_t fork_generation() noexcept;

/// Around fork() (fork_guard.cpp; POSIX only): holds the OS layer's process-wide mutexes (the
/// mappings it names in errors, the boot id), then lets go of them on both sides.
void lock_for_fork() noexcept;
void unlock_after_fork() noexcept;

/// Builds an Error from an errno-style code with the message "<what> '<path>': <strerror>. <hint>".
Error os_error(int err, const std::string& what, const std::string& path, const char* hint = nullptr);

}  // namespace weightcache::platform
