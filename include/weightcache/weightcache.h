/*
 * weightcache: a file-mapped, shareable cache for packed inference weights.
 *
 * C ABI. No function throws, and none aborts the host.
 *
 * Version 0.1 (see wc_version), not yet released: until 1.0 the API, the ABI and this header
 * may change incompatibly from one version to the next. The file format is versioned
 * separately (docs/FORMAT.md).
 *
 * Typical use by a backend that packs weights:
 *
 *   wc_options o; wc_options_init(&o); o.path = "/var/cache/app/model.wcache";
 *   o.compat_key = "model-sha256|packer-v7|avx512"; o.compat_key_size = strlen(o.compat_key);
 *   wc_cache* c; if (wc_open(&o, &c) != WC_OK) { ... wc_last_error() ... }
 *   size_t off = wc_look_up(c, key, key_size);
 *   if (off == WC_NOT_FOUND) {
 *     void* p = wc_reserve_space(c, packed_size);      // inside the file mapping
 *     pack_into(p);
 *     off = wc_look_up_or_insert(c, key, key_size, p, packed_size);
 *   }
 *   const void* packed = wc_offset_to_addr(c, off);
 *   ...
 *   wc_finalize(c);                                    // durable index + footer
 *   wc_close(c);
 *
 * ---------------------------------------------------------------------------------------------
 * Caveats (read these before deploying)
 * ---------------------------------------------------------------------------------------------
 * - Local filesystems only. The cache relies on MAP_SHARED coherence between processes and on
 *   flock(2)-style advisory locks on a sidecar file "<path>.lock". NFS, SMB and FUSE filesystems
 *   may provide neither; use a local cache directory.
 * - Advisory locks guard only against other weightcache users. A program that truncates or
 *   rewrites the cache file in place while it is mapped can still make the OS deliver SIGBUS to
 *   any process reading those pages; weightcache itself never truncates below committed data and
 *   replaces or deletes a file (rebuild, compaction, gc) only by writing a new file and renaming
 *   it into place, and only while no other process has it open: every process with the file open
 *   holds a shared "in use" lock on it (an open-file-description byte-range lock on the file
 *   itself, Linux 3.15+; LockFileEx on Windows), which replacing it needs exclusively.
 * - fork(): a child inherits mappings but not the writer lease semantics it expects. Do not use a
 *   wc_cache across fork(); open a new one in the child. (Looking entries up and closing in a
 *   child does work: the child checks entries itself, and its close leaves the parent's lease,
 *   file and reservations alone.) The child may open caches of its own and log, whatever the
 *   parent's other threads were doing in the library at the fork (opening or closing caches,
 *   logging, the first ones included): from its loading on, the library holds its process-wide locks
 *   across fork() (pthread_atfork handlers), so fork() waits until no other thread is inside one,
 *   at worst until a log callback in progress returns; never fork() from inside the log callback
 *   (it would wait for itself). A child's open of a file that a parent thread was opening at the
 *   fork waits for that file's writer lease as another process's would (lease_timeout). The locks
 *   of a cache are not held across fork(), and its writer lease and file lock stay the parent's:
 *   on a cache it inherited, a child's wc_reserve_space, wc_release_space, wc_look_up_or_insert
 *   with bytes, wc_finalize and wc_refresh fail with WC_ERR_INVALID_ARGUMENT and change nothing
 *   (wc_is_finalized included), so a child can never publish beside the parent nor let go of
 *   the parent's lock.
 * - Threads: wc_open may start one background thread (see wc_options.verify_ahead), which
 *   wc_close stops and waits for; with WC_DURABILITY_NONE or _ASYNC, wc_finalize may start one
 *   that starts the write-back of what it committed (see WC_DURABILITY_NONE), which wc_close
 *   waits for; with WC_VERIFY_ON_OPEN, wc_open and wc_refresh checksum on a few worker threads
 *   that end before they return. No other library code runs on its own threads. When the last
 *   wc_close of every cache has returned, none of these threads exists any more (each is
 *   joined), so a host may unload the library (dlclose, FreeLibrary) right after it.
 * - Entries are durable only after wc_finalize returns WC_OK, and WC_OK means every entry
 *   inserted so far is (with WC_DURABILITY_FULL: durable against power loss; otherwise against a
 *   crash of the process). Closing discards entries no finalize managed to persist.
 * - Keys are arbitrary bytes (NULs included), 1 to WC_MAX_KEY_SIZE of them. The empty key is
 *   never found and cannot be inserted (WC_ERR_INVALID_ARGUMENT), as in LMDB.
 *
 * ---------------------------------------------------------------------------------------------
 * Rules every call below follows
 * ---------------------------------------------------------------------------------------------
 * Errors.
 * - A call that fails says so (a status other than WC_OK, or NULL / WC_NOT_FOUND where it
 *   returns a pointer or an offset) and sets the calling thread's wc_last_error(). A call that
 *   succeeds leaves wc_last_error() as it was: it is not cleared, so read it only right after a
 *   call reported a failure. A look-up miss is not a failure, nor are the NULL, -1 and 0 that
 *   wc_offset_to_addr, wc_offset_to_addr_kept, wc_get_fd, wc_get_handle, wc_is_finalized and
 *   wc_is_finalized_through answer: they set no error.
 *   (One exception: the XNNPACK provider's look_up_or_insert, which succeeds by keeping bytes the
 *   cache refused in the adapter's own heap, leaves the cache's reason there; see xnnpack.h.)
 * - When memory runs out, any call that allocates may fail with WC_ERR_NO_MEMORY (in
 *   wc_last_error where it returns NULL or WC_NOT_FOUND), whatever its own list below says.
 * - Output parameters: each call says what it stores on failure (wc_open stores NULL; the
 *   *_get_stats and report structs are left untouched).
 *
 * Threads. Every call may be made from any thread, concurrently with any call on the same or
 * another handle, except: wc_close(c) must not run concurrently with, nor be followed by, any
 * other call on c (the same holds for wc_xnn_adapter_destroy). No call may be made from inside
 * the log callback (see wc_log_callback).
 *
 * Handles and caches.
 * - Every successful wc_open returns a new handle. In one process, handles opened on the same
 *   file (the same device and inode, whatever the spelling of the path) with the same compat_key
 *   and the same read_only share one cache: the same entries, offsets and addresses, counters,
 *   finalize state and descriptor. Any other open gets a cache of its own: a heap cache (empty
 *   path, WC_BACKING_HEAP, private_cache), a cache on a descriptor (fd, handle) or ":memory:",
 *   a file cache that fell back to heap memory at open or, read-only, was opened before its file
 *   existed, and an open this process cannot share its cache with (another compatibility key on
 *   the same file, or a stricter alignment: an error with WC_BACKING_FILE, a private heap cache
 *   otherwise). A second opener of a shared cache gets the first opener's options.
 * - A cache lives until the last handle sharing it is closed (wc_close, or the destructor of the
 *   last weightcache::WeightCache on it); closing any other handle changes nothing for the rest.
 *
 * Memory the cache returns (wc_reserve_space, wc_offset_to_addr, wc_offset_to_addr_kept).
 * - It belongs to the cache: never free it. It stays valid at the same address until the cache
 *   is closed (the last wc_close of the handles sharing it, whichever handle it came from); then
 *   it is unmapped and must not be touched.
 * - An entry's bytes (wc_offset_to_addr, or a reservation once inserted) may not be modified in
 *   any way. The library does not prevent it everywhere: a read-only cache (read_only, or a file
 *   this user cannot write) maps the file read-only, and a write there faults (SIGSEGV). A
 *   writable cache maps the file read-write and shared (MAP_SHARED), so a write changes the
 *   file under every process that maps it: the entry then fails its checksum (a miss) in any
 *   process that checks it later, while a process that checked it before (the writer itself,
 *   which checked it at insert) goes on serving the changed bytes. An entry in heap memory is
 *   private to this process, and a write changes what this process serves.
 *
 * Offsets.
 * - An offset names an entry of one cache. An entry in the file has its byte offset in the file
 *   as its offset: the same in every process that opens the file and in every later launch, as
 *   long as the file is not rebuilt or compacted. An entry in heap memory (a heap cache, or an
 *   entry the file could not take; see wc_stats.heap_bytes) has an offset that means something
 *   only to this cache in this process: it may name another entry, or none, anywhere else. A
 *   finalize that moves such an entry into the file gives it a file offset (what look-ups return
 *   from then on); its heap offset still resolves to the same bytes in this process.
 *
 * Strings the library returns: wc_status_string and wc_version return static strings, valid for
 * as long as the library is loaded; wc_last_error returns a per-thread string (see there). None
 * may be freed or modified.
 */
#ifndef WEIGHTCACHE_WEIGHTCACHE_H
#define WEIGHTCACHE_WEIGHTCACHE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(WEIGHTCACHE_SHARED)
#if defined(WEIGHTCACHE_BUILDING)
#define WC_API __declspec(dllexport)
#else
#define WC_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define WC_API __attribute__((visibility("default")))
#else
#define WC_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Returned by look-ups that miss, and by inserts that fail. Never a valid offset. */
#define WC_NOT_FOUND SIZE_MAX
/** Longest key accepted, in bytes. Longer keys are rejected with WC_ERR_INVALID_ARGUMENT. */
#define WC_MAX_KEY_SIZE 4096
/** Largest supported alignment (start address of each region), in bytes. */
#define WC_MAX_ALIGNMENT (1u << 24)

/** Opaque cache handle, from wc_open, released by wc_close. Handles on the same file may share
 * one underlying cache: see "Handles and caches" above. */
typedef struct wc_cache wc_cache;

/** What a call returned. The values are fixed (weightcache::Errc has the same ones). */
typedef enum wc_status {
  WC_OK = 0,
  WC_ERR_INVALID_ARGUMENT = 1, /* a caller error: see wc_last_error() */
  WC_ERR_IO = 2,               /* the OS refused an I/O call; errno is in the message */
  WC_ERR_NO_SPACE = 3,         /* disk full, file size limit, or address space exhausted */
  WC_ERR_CORRUPT = 4,          /* the file fails a structural or checksum check */
  WC_ERR_INCOMPATIBLE = 5,     /* a sound file of another version, byte order or compat key */
  WC_ERR_BUSY = 6,             /* another process holds the writer lease past the timeout */
  WC_ERR_UNSUPPORTED = 7,      /* not available on this platform or filesystem, or left out of this
                                  build (WEIGHTCACHE_MOBILE: wc_gc, WC_COMPACT_CANONICAL) */
  WC_ERR_NO_MEMORY = 8,        /* heap or address space allocation failed */
  WC_ERR_READ_ONLY = 9         /* a write was asked of a read-only cache */
} wc_status;

typedef enum wc_backing {
  WC_BACKING_AUTO = 0, /* file if possible, else heap with one warning */
  WC_BACKING_FILE = 1, /* file or an error */
  WC_BACKING_HEAP = 2  /* private heap memory only; nothing persisted */
} wc_backing;

typedef enum wc_durability {
  WC_DURABILITY_NONE = 0,  /* no flushes: survives a process crash, not a power loss. A
                              finalize that commits has the committed bytes' write-back started
                              (Linux: sync_file_range without wait) on a thread of the cache's
                              and never waits for it, so the next process that verifies them
                              does not have to write them back itself. wc_close waits for that
                              thread to finish starting it (the writes themselves are never
                              waited for): right after a finalize of 1 GiB, about 0.5 s. See
                              docs/DESIGN.md, "Durable means durable" */
  WC_DURABILITY_ASYNC = 1, /* write-back is started at finalize but not waited for (as for
                              NONE, after an msync without wait) */
  WC_DURABILITY_FULL = 2   /* data, then index, then commit slot, each flushed to disk */
} wc_durability;

typedef enum wc_verify {
  WC_VERIFY_FIRST_USE = 0, /* checksum each entry the first time this process looks it up,
                              in every process */
  WC_VERIFY_ON_OPEN = 1,   /* checksum every entry during wc_open / wc_refresh */
  WC_VERIFY_NONE = 2,      /* trust the data region (the index is always verified) */
  WC_VERIFY_SHARED = 3     /* (default) as WC_VERIFY_FIRST_USE, but an entry that a process
                              of this boot already checksummed in exactly this committed state
                              of this file (same device, inode, size, change and modification
                              times, commit) is not hashed again: its first look-up checks with
                              an fstat that the file is still in that state, at most once per
                              10 ms for all entries: a change made after the record is seen by
                              the first look-up of any such entry that starts 10 ms or more
                              after the change; one within 10 ms of the last check may rely on
                              that check. The record of what was verified lives in the lock
                              file ("<path>.lock"); any change to the file, a replacement or a
                              reboot voids it. A process records only a state older, when it
                              opened, than its file system's change-time window: 10 ms on ext4,
                              xfs, btrfs and f2fs with nanosecond times, 2 s on every other. A
                              writer that committed (durability full) records its
                              final state at wc_close, after checksumming every committed entry
                              again (waiting out the 10 ms window first; never the 2 s one), so
                              the next process hashes nothing. Caches on
                              a descriptor or ":memory:", tmpfs, network and FUSE file systems,
                              and Windows verify per process, as WC_VERIFY_FIRST_USE. See
                              docs/DESIGN.md, "Verified once per file state". */
} wc_verify;

/**
 * What wc_open, wc_compact and wc_compact_ex are to do. Fill it with wc_options_init, then set
 * fields. The caller owns it and everything it points at: wc_open copies what it keeps (path,
 * compat_key), so all of it may be freed or reused once the call returns.
 * struct_size lets the struct grow: fields are only ever appended, and a caller whose
 * struct_size ends before a field (one built against an older header) gets that field's default.
 * It must cover at least the fields up to read_only (WC_ERR_INVALID_ARGUMENT otherwise).
 */
typedef struct wc_options {
  size_t struct_size; /* set by wc_options_init */
  const char* path;   /* NULL or "" = heap-only cache (unless fd or handle is set); ":memory:" = an
                         anonymous file (a memfd on Linux, a delete-on-close temporary file on
                         Windows) that behaves like a cache file: same format and checksums,
                         shareable with other processes through wc_get_fd (wc_get_handle on
                         Windows); it lives while any process has it open. durability is ignored
                         (nothing of it outlives its processes, so nothing is flushed), also by
                         the caches other processes open on its descriptor or handle. It cannot
                         be read_only (WC_ERR_INVALID_ARGUMENT: a new one is empty; a reader
                         joins one through fd or handle) nor compacted. Linux: its
                         size is sealed against shrinking (F_SEAL_SHRINK), so no holder of the
                         descriptor can cut pages from under a reader (no SIGBUS); writes are not
                         sealed (the writer keeps a writable mapping): give readers a read-only
                         descriptor (reopen /proc/self/fd/N with O_RDONLY) so they cannot write.
                         Windows: the file is in the temporary directory (GetTempPathW: TMP,
                         TEMP) under a name of its own, held in memory while memory allows;
                         when the last of this cache's handle (wc_get_handle) and its duplicates
                         closes, no other process can open it any more, and it is deleted once
                         the processes that opened it close it too: keep one while processes may
                         still join. Give readers a duplicate without write access
                         (DuplicateHandle with FILE_GENERIC_READ) and read_only. See
                         docs/PLATFORMS.md for what each OS enforces. */
  const void* compat_key;   /* compat_key_size bytes (any bytes) naming what the packed bytes
                               depend on; a file written under another key is not used */
  size_t compat_key_size;
  size_t alignment;      /* 0 = default 64; power of two up to WC_MAX_ALIGNMENT */
  size_t size_alignment; /* 0 = default 1; power of two: region sizes are rounded up to it */
  wc_backing backing;       /* WC_BACKING_FILE with an empty path is WC_ERR_INVALID_ARGUMENT */
  wc_durability durability; /* default WC_DURABILITY_FULL (set by wc_options_init) */
  int read_only;            /* nonzero: never write the file; new entries go to the heap */
  wc_verify verify;           /* default WC_VERIFY_SHARED */
  int private_cache;          /* nonzero: a private heap cache, not shared, path unused */
  int allow_symlink;          /* nonzero: follow a symlink at path (refused by default, but a
                                 link to a cache this process has open shares that cache) */
  unsigned file_mode;         /* permission bits (0777 at most) of a new cache file, under the
                                 umask; default 0644; setuid/setgid/sticky: INVALID_ARGUMENT */
  uint32_t lease_timeout_ms;  /* wait for the writer lease; default 120000 */
  int refresh_on_miss;        /* nonzero: a look-up miss first maps entries other processes
                                 committed since the last refresh (cheap when none) */
  uint64_t max_file_bytes;    /* address space reserved for the file; 0 (default) = 1/512 of
                                 what the process may reserve (1/8 in a 32-bit process;
                                 RLIMIT_AS, pointer width), 1 MiB to 256 GiB, rounded up to
                                 2 MiB; heap memory is reserved as it is used. Entries are
                                 placed so that the index always fits after them: a full file
                                 still commits what it holds */
  int verify_ahead;           /* default 1: with WC_VERIFY_FIRST_USE or _SHARED and a file of 16 MiB or
                                 more, a background thread checksums entries before their first
                                 look-up (two cores for a warm load); 0 = look-ups only */
  unsigned compact_dead_percent;   /* default 50 (0..100; 0 = never compact at open): a writable
                                      open that finds no other process using the file compacts it
                                      first when the bytes compaction would reclaim are at least
                                      this share of the file's data (all but the header and the
                                      index in use) ... */
  uint64_t compact_min_dead_bytes; /* ... and at least this many bytes (default 16 MiB). So a cache
                                      whose entries are replaced launch after launch stays within
                                      about twice its live bytes. See wc_compact. */
  int fd; /* default -1. When 0 or more: an open descriptor of the cache file (regular file or
             memfd, opened read-write, or read-only with read_only) to use instead of opening
             path, for sandboxes that cannot open paths. The library opens its own description of
             it (through /proc/self/fd, else dup), so the caller keeps, and may close, its own.
             path may then be NULL (messages say "fd N") or a label used in messages only: nothing
             is opened or created at it, no "<path>.lock" either; the writer lease and the in-use
             lock are taken on the file itself. Not a regular file (nor a memfd):
             WC_ERR_INVALID_ARGUMENT (a heap cache with WC_BACKING_AUTO). An empty file is
             initialised by a writable opener; a read-only opener of an empty file waits while
             another opener through this library (in any process) has it open, as a writer may
             be setting it up (WC_ERR_BUSY past lease_timeout), and fails with WC_ERR_CORRUPT at
             once when none has (a plain open() by a program that is not yet a cache user is not
             seen: give a reader its descriptor after the writer's wc_open returned). A corrupt or
             incompatible file is rebuilt in place only when no other process has it open; it is
             never compacted at open
             (it cannot be renamed). Such a cache is not shared through the process-wide registry:
             each wc_open gets a cache of its own; but when this process has the same file open
             (by path, descriptor or handle) under another compat_key, the open is refused as by
             path: WC_ERR_INCOMPATIBLE, or a private heap cache with WC_BACKING_AUTO. POSIX only: on Windows the open fails as for
             a file it cannot use (WC_ERR_UNSUPPORTED, or a heap cache with WC_BACKING_AUTO);
             use handle there. */
  void* handle; /* Windows: default NULL. When not NULL: an open HANDLE of the cache file (from
                   CreateFile, or a duplicate another process gave this one; read access, plus
                   write access unless read_only; FILE_SHARE_READ | FILE_SHARE_WRITE at least) to
                   use instead of opening path, as fd does on POSIX. The library reopens it
                   (ReOpenFile) as a file object of its own, so its locks are its own, and never
                   with more access than the handle has: a handle without write access gives a
                   read-only cache (WC_ERR_READ_ONLY with WC_BACKING_FILE). Where the file's ACL
                   refuses ReOpenFile although the handle grants access (a sandboxed process
                   given a brokered handle), it uses a duplicate of the handle, which shares the
                   caller's file object: the handle must then be synchronous (no
                   FILE_FLAG_OVERLAPPED, no FILE_FLAG_NO_BUFFERING; else WC_ERR_INVALID_ARGUMENT);
                   see docs/PLATFORMS.md. The caller keeps its handle and may close it as soon as
                   wc_open returns. A handle of anything but a regular disk file (a directory, a
                   pipe, a console, an event, a closed handle): WC_ERR_INVALID_ARGUMENT (a heap
                   cache with WC_BACKING_AUTO). path (a
                   label only, no "<path>.lock"), the lease and the in-use lock on the file
                   itself, rebuilding, the registry: as for fd. Setting both fd and handle is
                   WC_ERR_INVALID_ARGUMENT. On POSIX the open fails as for a file it cannot use
                   (WC_ERR_UNSUPPORTED, or a heap cache with WC_BACKING_AUTO), as fd does on
                   Windows. */
  int write_back_early; /* default 1: with durability ASYNC or FULL, each inserted entry's whole
                           pages start writing back to disk at once (Linux: sync_file_range), so
                           the finalize that makes them durable waits for less. 0: leave it all to
                           the finalize, for a host that must not wait on the disk while it
                           inserts (starting write-back can block on a busy device) and finalizes
                           on another thread. The first opener of a shared cache decides. */
  const char* prebuilt_dir; /* default NULL. A directory of prebuilt caches, read-only (a
                               read-only mount, a Kubernetes image volume, an unpacked artifact,
                               see docs/DEPLOY.md): wc_open looks at every "*.wcache" file in it
                               and in its immediate subdirectories, in name order, and opens the
                               first whose compatibility key (its hash in the header) and
                               alignment suit this open, read-only (read_only is implied; entries
                               it lacks go to the heap and are never written to it). The file at
                               path is never taken for one, nor a file that serves no entry (a
                               damaged newest commit over an empty one). If none suits or none
                               can be opened, it opens path as without this field and logs why
                               at info level. wc_stats.prebuilt says which happened;
                               wc_get_path names the file in use. Ignored with fd, handle,
                               private_cache, WC_BACKING_HEAP and ":memory:". */
  const char* record_dir; /* default NULL (or ""): "$XDG_RUNTIME_DIR/weightcache" for a user
                             other than root with that variable set, else "/run/weightcache".
                             Where a read-only opener of a file on a read-only mount keeps the
                             record of what it verified (WC_VERIFY_SHARED), since nothing can be
                             written beside the file: one file per cache file, named by its
                             device and inode; a record it may not write (root's, for another
                             user) is read and trusted, never written. Mounts that qualify: a
                             read-only mount (a read-only bind mount) of ext2/3/4, xfs, btrfs,
                             f2fs, zfs or bcachefs; elsewhere (overlayfs, image volumes included;
                             squashfs; tmpfs; network file systems) verification is per process.
                             The directory is
                             created (0755) if missing; it must belong to this user or root and
                             give no write permission to group or others, or no record is read or
                             written there. See docs/DESIGN.md, "Read-only mounts and prebuilt
                             caches". */
} wc_options;

/**
 * Counters and sizes of a cache (of the cache, not of the handle: every handle sharing it reads
 * the same ones), filled by wc_get_stats: a snapshot, each field read without stopping other
 * threads. An entry's verification is counted (verify_failures, verified_ahead, trusted_entries)
 * before its verdict is visible to any look-up: stats read after a look-up returned include the
 * verdict it was given, whichever thread reached it. Set struct_size with wc_stats_init;
 * wc_get_stats writes no byte past it.
 */
typedef struct wc_stats {
  size_t struct_size;
  uint64_t entries;      /* live keys */
  uint64_t file_bytes;   /* size of the cache file on disk (0 when heap-only) */
  uint64_t mapped_bytes; /* bytes of entries that live in the file mapping */
  uint64_t heap_bytes;   /* bytes of entries that live in private heap memory */
  uint64_t mappings;     /* live OS file mappings held by this cache */
  uint64_t hits, misses; /* look-up outcomes (look_up and look_up_or_insert with ptr == NULL) */
  wc_backing backing;    /* FILE or HEAP: what is actually in use */
  uint64_t dead_bytes;       /* bytes in the file no live entry or trailer uses */
  uint64_t verify_failures;  /* entries whose checksum failed (served as misses) */
  uint64_t heap_fallbacks;   /* reservations that had to be served from the heap */
  uint64_t commits;          /* finalizes that wrote the file */
  uint64_t alignment;        /* start-address alignment of every region of this cache */
  uint64_t verified_ahead;   /* entries checksummed by the verify-ahead thread (see
                                wc_options.verify_ahead) before a look-up asked for them */
  uint64_t lease_timeouts;   /* waits for another process's writer lease that ran out
                                (lease_timeout_ms); after one, reservations try the lease once
                                without waiting until the next finalize or refresh */
  uint64_t unpersisted_entries; /* live entries held in heap memory that a finalize has not yet
                                   written to the file (it tries again each time); 0 when
                                   everything inserted is durable or the cache is heap-only */
  uint64_t unpersisted_bytes;   /* their bytes */
  uint64_t compactions;         /* compactions this cache made of its file when it was opened */
  uint64_t trusted_entries;     /* entries served on an earlier process's verification of this
                                   same state of the file, without hashing (WC_VERIFY_SHARED) */
  uint64_t prebuilt;            /* 1: the cache is a prebuilt file chosen from
                                   wc_options.prebuilt_dir; 0: it is path (or heap) */
} wc_stats;

typedef enum wc_log_level {
  WC_LOG_TRACE = 0,
  WC_LOG_DEBUG = 1,
  WC_LOG_INFO = 2,
  WC_LOG_WARN = 3,
  WC_LOG_ERROR = 4,
  WC_LOG_OFF = 6
} wc_log_level;

/**
 * Receives each log message at or above the level set (wc_set_log_level), with `level` one of
 * WC_LOG_TRACE .. WC_LOG_ERROR and `user` as given to wc_set_log_callback. `message` points at
 * `size` bytes of UTF-8 (escaped as wc_last_error's), not NUL-terminated, owned by the library
 * and valid only during the call.
 * It is called on whichever thread logs (the host's, or the library's verify-ahead thread),
 * under the library's log lock: one call at a time, process-wide, and every thread that logs
 * meanwhile waits for it to return. So it must return promptly, must not throw or longjmp, and
 * must not call any function of this library (wc_set_log_callback included), nor fork(): either
 * would wait for itself (see "Caveats", fork()).
 */
typedef void (*wc_log_callback)(void* user, wc_log_level level, const char* message, size_t size);

/** Fills *options with the defaults the field comments name (zero for the fields without one:
 * path and compat_key NULL, no flag set). Always call it before setting fields. NULL is ignored. */
WC_API void wc_options_init(wc_options* options);
/** Zeroes *stats and sets stats->struct_size; call before wc_get_stats. NULL is ignored. */
WC_API void wc_stats_init(wc_stats* stats);

/**
 * Opens (creating if needed) the cache described by *options and stores a new handle in *out,
 * to be released with wc_close. It may join a cache this process already has open (see
 * "Handles and caches").
 * A missing file is created. A corrupt or incompatible file is replaced by a fresh one (written
 * under a new name and renamed into place, never truncated in place) only when no other process
 * has it open; otherwise this open cannot use it (BUSY, or the heap fallback below) and the next
 * open that finds it unused rebuilds it. Likewise a writable open that finds the file unused and
 * over the compaction thresholds (compact_dead_percent, compact_min_dead_bytes) compacts it
 * first. With WC_BACKING_AUTO any failure to use the file falls back to a heap cache with one
 * warning (its finalize then reports inserted entries as not durable); with WC_BACKING_FILE it is
 * an error. A read-write open whose file or lock file cannot be written is READ_ONLY with
 * WC_BACKING_FILE, and a read-only cache with one warning with WC_BACKING_AUTO.
 * May wait up to lease_timeout_ms for another process's writer lease or in-use lock (while it
 * creates, rebuilds or compacts the file).
 * On failure *out is NULL (when out is not NULL). Statuses, with any backing:
 *   WC_OK
 *   WC_ERR_INVALID_ARGUMENT  options or out NULL; struct_size not set; compat_key NULL with a
 *                            nonzero size; an enum field out of range; alignment or
 *                            size_alignment not a power of two up to WC_MAX_ALIGNMENT;
 *                            max_file_bytes below 1 MiB (but not 0); file_mode over 0777;
 *                            compact_dead_percent over 100; WC_BACKING_FILE without path, fd
 *                            or handle; both fd and handle set
 *   WC_ERR_NO_MEMORY         out of memory (with WC_BACKING_AUTO: neither the file nor heap
 *                            memory could be had)
 * and with WC_BACKING_FILE only (WC_BACKING_AUTO falls back to a heap cache instead):
 *   WC_ERR_IO, WC_ERR_NO_SPACE, WC_ERR_UNSUPPORTED
 *                            the OS refused to open, create, read, lock or map the file
 *   WC_ERR_INVALID_ARGUMENT  the path names a directory, a FIFO or another file that is not a
 *                            regular one, or a symlink (without allow_symlink); a path too long
 *   WC_ERR_CORRUPT, WC_ERR_INCOMPATIBLE
 *                            a file to rebuild that may not be (read_only), or a file this
 *                            process has open under another compatibility key or a weaker
 *                            alignment
 *   WC_ERR_BUSY              a file to rebuild that another process has open; the lease or the
 *                            in-use lock held by another process past lease_timeout
 *   WC_ERR_READ_ONLY         the file or its lock file cannot be written
 */
WC_API wc_status wc_open(const wc_options* options, wc_cache** out);

/** Releases the handle. The last handle of a cache closes the cache: stops and joins its
 * verify-ahead thread (at most one 8 MiB piece of hashing) and joins its write-back thread
 * (see WC_DURABILITY_NONE), unmaps it (every pointer it returned
 * becomes invalid), gives up its locks and descriptors. Entries inserted since the last
 * successful wc_finalize are not persisted. Other handles sharing the cache are unaffected.
 * It may run at process exit (an atexit handler, a static destructor), also after the
 * library's own static destructors (a handler registered before the library was loaded).
 * NULL is ignored. No other call on this handle may run concurrently or follow. */
WC_API void wc_close(wc_cache* cache);

/**
 * Returns the offset of the entry stored under the key, or WC_NOT_FOUND. The key (key_size
 * bytes at key; key may be NULL when key_size is 0) is only read during the call. The first
 * look-up of an entry in this process checksums it (WC_VERIFY_FIRST_USE; with WC_VERIFY_SHARED,
 * unless a process of this boot checksummed it in this same state of the file); an entry whose checksum
 * fails is a miss (logged, counted in wc_stats.verify_failures). A miss, the empty key included,
 * is not an error: wc_last_error is left alone. Fails (WC_NOT_FOUND, WC_ERR_INVALID_ARGUMENT in
 * wc_last_error) only for a NULL cache, a NULL key with a nonzero key_size, or a key over
 * WC_MAX_KEY_SIZE. Never waits for a writer (not even one waiting for the lease); the first
 * look-up of an entry may wait while another thread finishes checksumming that same entry.
 */
WC_API size_t wc_look_up(wc_cache* cache, const void* key, size_t key_size);

/**
 * Returns at least `size` writable bytes aligned to the cache's alignment, or NULL on failure.
 * They are inside the file mapping when the file can take them, else in heap memory: in a heap
 * cache, in a read-only cache (new entries go to the heap), and with WC_BACKING_AUTO when the
 * lease stays busy or the disk is full (counted in wc_stats.heap_fallbacks, but for a heap cache).
 * The memory belongs to the cache (see "Memory the
 * cache returns") and is the caller's to write until it is inserted (wc_look_up_or_insert) or
 * given back (wc_release_space). Several reservations may be outstanding; one never inserted nor
 * released is wasted space. May wait up to lease_timeout_ms for another process's writer lease.
 * Failures (NULL; the status in wc_last_error's message and in weightcache::last_error().code):
 * INVALID_ARGUMENT (NULL cache, size over 2^48), NO_MEMORY; with WC_BACKING_FILE also the reason
 * the file cannot take the bytes: BUSY (lease), NO_SPACE (disk full, file size limit,
 * max_file_bytes), IO.
 */
WC_API void* wc_reserve_space(wc_cache* cache, size_t size);

/** Gives back a reservation that will not be inserted (e.g. packing failed), so it does not
 * become dead space; the memory must not be used afterwards. `ptr` must be a start address
 * returned by wc_reserve_space on this cache and neither inserted nor released yet. Statuses:
 * WC_OK, WC_ERR_INVALID_ARGUMENT (NULL cache or ptr, or any other pointer: nothing happens). */
WC_API wc_status wc_release_space(wc_cache* cache, void* ptr);

/**
 * Commits `size` bytes at `ptr` under the key and returns the entry's offset. The key is copied.
 * - ptr == NULL: behaves as wc_look_up.
 * - key present with the same bytes: returns the existing offset; a reservation passed in is
 *   released.
 * - key present with different bytes: the new bytes replace the old (a stale entry is never
 *   served again).
 * - ptr is the start of a reservation (size <= reserved size): committed in place, no copy; the
 *   reservation becomes the entry, whose bytes may no longer be modified.
 * - otherwise the bytes are copied into the cache (the caller keeps its memory).
 * `size` over 2^48 (over 2^31 - 1, half the address space, in a 32-bit process), over the
 * reserved size when ptr starts a reservation, or running past the end of the reservation or
 * entry ptr points into (or of what the cache has mapped there), is WC_ERR_INVALID_ARGUMENT (see
 * wc_last_error) and nothing is read; a size past the end of the caller's own memory cannot be
 * checked.
 * Returns WC_NOT_FOUND and sets wc_last_error only on invalid arguments (also: NULL cache, NULL
 * key with a nonzero size, a key empty or over WC_MAX_KEY_SIZE), when no memory at all can be
 * had (NO_MEMORY), or, with WC_BACKING_FILE and bytes copied from the caller's memory, when the
 * file cannot take them (BUSY, NO_SPACE, IO, as wc_reserve_space), or, with WC_BACKING_FILE, when
 * a key over 256 bytes commits a reservation and the file's span (max_file_bytes) has no room
 * left to index it (NO_SPACE; with automatic backing the entry goes to heap memory instead).
 * Nothing is inserted then; a reservation passed in stays outstanding after INVALID_ARGUMENT and
 * NO_SPACE (the caller releases it).
 * Not durable until wc_finalize. A key raced by two threads ends with one entry.
 */
WC_API size_t wc_look_up_or_insert(wc_cache* cache, const void* key, size_t key_size, void* ptr,
                                   size_t size);

/**
 * wc_look_up_or_insert, which also says which finalize the entry it returns waits for: on
 * success *finalize_ticket is its ticket for wc_is_finalized_through (0: nothing to wait for, an
 * entry loaded from the file, or a look-up, ptr NULL; the ticket of an entry that a finalize has
 * covered since is already through); on failure, 0. finalize_ticket may be NULL. Same
 * preconditions, threads and statuses as wc_look_up_or_insert. A ticket means something only to
 * this cache in this process (every handle sharing it): another process's finalize is not seen.
 * For an integration that answers "finalized?" for its own inserts only (XNNPACK's is_finalized):
 * wc_is_finalized answers for the whole cache, which another runtime may still be filling.
 */
WC_API size_t wc_look_up_or_insert_ex(wc_cache* cache, const void* key, size_t key_size, void* ptr,
                                      size_t size, uint64_t* finalize_ticket);

/** Nonzero when `ticket` (from wc_look_up_or_insert_ex on this cache) is 0, or a wc_finalize call
 * on the cache (through any handle sharing it) has started since the insert that gave it,
 * whatever that finalize returned, as for wc_is_finalized. An insert that runs while a finalize
 * waits for the writer lease waits for the next finalize. To cover several inserts, keep their
 * largest ticket: tickets only grow. 0 for a NULL cache. Sets no error, takes no lock. */
WC_API int wc_is_finalized_through(wc_cache* cache, uint64_t ticket);

/**
 * Address of the entry at `offset` (from look_up / look_up_or_insert on this cache), or NULL for
 * an offset that is not a live entry's: WC_NOT_FOUND, an entry whose checksum failed, or one
 * since replaced under its key (here, or by another process and seen through wc_refresh), so
 * stale bytes are never reached through an old offset. The memory is the cache's, read-only by
 * contract (`void*` only because XNNPACK's provider returns one), and valid until the cache is
 * closed, a replaced entry's included (see "Memory the cache returns"). It does not checksum the
 * entry: look its key up first (wc_look_up does) before trusting an offset learned elsewhere.
 * Sets no error. O(1), takes no lock. (wc_offset_to_addr_kept also resolves a replaced entry's
 * offset: XNNPACK keeps offsets and cannot take a NULL.)
 */
WC_API void* wc_offset_to_addr(wc_cache* cache, size_t offset);

/** wc_offset_to_addr, except that the offset of an entry since replaced under its key (here, or
 * by another process and seen through wc_refresh) still gives that entry's bytes: for a caller
 * that was handed the offset by this cache before the replacement, keeps it, and cannot take a
 * NULL (XNNPACK). The bytes are the ones inserted then, read-only, valid until the cache is
 * closed. NULL for WC_NOT_FOUND, an offset that never named an entry of this cache, and an entry
 * whose checksum failed. Like wc_offset_to_addr it does not checksum the entry, sets no error,
 * and takes no lock. */
WC_API void* wc_offset_to_addr_kept(wc_cache* cache, size_t offset);

/**
 * Makes every entry inserted so far durable: flushes the new data, appends the index and the
 * "XPWC" footer, then publishes them through a commit slot in the header (see docs/FORMAT.md).
 * Entries that went to heap memory earlier (the writer lease was busy, the disk was full, the file
 * was not writable) are first copied into the file. Returns WC_OK only when every entry inserted
 * in this cache is in the committed file (with WC_DURABILITY_FULL, flushed to the device). With
 * nothing new since the last finalize it does not touch the file. May wait up to
 * lease_timeout_ms for another process's writer lease.
 * On failure the previous committed state stays loadable, the entries not yet durable stay
 * served from memory in this process, the message says how many entries and bytes are not
 * durable and why (see also wc_stats.unpersisted_entries), and every later wc_finalize tries
 * again. Statuses:
 *   WC_OK                   everything inserted is durable (a heap-only cache: always)
 *   WC_ERR_INVALID_ARGUMENT cache is NULL
 *   WC_ERR_BUSY             another process kept the writer lease past lease_timeout, or the file
 *                           at the path was replaced by another program, or holds a commit this
 *                           cache could not load (reopen the cache)
 *   WC_ERR_NO_SPACE         disk full, file size limit, or max_file_bytes reached
 *   WC_ERR_READ_ONLY        the cache is read-only (read_only, or the file or its lock file is
 *                           not writable)
 *   WC_ERR_IO               the OS refused a write or flush (errno in the message)
 *   WC_ERR_CORRUPT          the header's commit slots are damaged (the file is rebuilt by the
 *                           next open that finds it unused)
 *   WC_ERR_NO_MEMORY        out of memory
 *   any open error          the cache is a heap cache standing in for a file that could not be
 *                           used at open (reopen once it can be)
 * Whatever it returns, wc_is_finalized is nonzero afterwards (a runtime can set up), except in
 * a forked child on a cache it inherited, which is refused and changes nothing (see "Caveats").
 */
WC_API wc_status wc_finalize(wc_cache* cache);

/** Nonzero when nothing was inserted in the cache (through any handle sharing it) since the last
 * wc_finalize call on it, or since it was opened, whatever that finalize returned. 0 for a NULL
 * cache. The XNNPACK adapter's provider does not forward to it: its is_finalized answers for that
 * adapter's own inserts only (see weightcache/xnnpack.h), and is false only while this is. */
WC_API int wc_is_finalized(wc_cache* cache);

/**
 * Maps entries other processes finalized since this cache was opened or last refreshed (a
 * read-only cache opened before its file existed picks the file up). Entries this process has
 * are kept. With nothing new, and for a heap cache, it returns WC_OK without changing anything.
 * On failure the cache goes on serving what it had. Statuses: WC_OK, WC_ERR_INVALID_ARGUMENT
 * (NULL cache), WC_ERR_IO, WC_ERR_CORRUPT (the newest commit fails its checks),
 * WC_ERR_INCOMPATIBLE (the file was rewritten under another compatibility key, alignment,
 * version or byte order), WC_ERR_NO_SPACE (the file grew past max_file_bytes),
 * WC_ERR_NO_MEMORY; for a read-only cache opened before its file existed, also those of wc_open
 * with WC_BACKING_FILE.
 */
WC_API wc_status wc_refresh(wc_cache* cache);

/** The descriptor of a file-backed cache (a regular file or a ":memory:" cache), for handing
 * the cache to another process (SCM_RIGHTS, or inheritance across fork/exec: it is opened
 * close-on-exec, clear that flag on a dup to pass it on). Owned by the cache: do not close it;
 * valid until the cache is closed (the last wc_close of the handles sharing it). -1 for a heap
 * cache, a NULL cache, and on Windows (see wc_get_handle). Sets no error. */
WC_API int wc_get_fd(wc_cache* cache);

/** Windows: the HANDLE of a file-backed cache (a regular file or a ":memory:" cache), for handing
 * the cache to another process, which opens it with wc_options.handle: DuplicateHandle it into
 * that process, or duplicate it inheritable and start the process with bInheritHandles (the
 * library's own handles are not inheritable). For a reader that must not write, duplicate it
 * with FILE_GENERIC_READ rather than DUPLICATE_SAME_ACCESS. Owned by the cache: do not close it
 * (a duplicate is the caller's); valid until the cache is closed (the last wc_close of the
 * handles sharing it). NULL for a heap cache, a NULL cache, and on POSIX (see wc_get_fd). Sets
 * no error. Thread-safe, takes no lock. */
WC_API void* wc_get_handle(wc_cache* cache);

/** Flags of wc_compact_ex. */
#define WC_COMPACT_DROP_CORRUPT 1u /* leave out entries whose checksum fails, instead of refusing */
#define WC_COMPACT_ANY_KEY 2u      /* compact whatever compatibility key the file was written for */
#define WC_COMPACT_CANONICAL 4u    /* entries in key order, commit sequence 1, zero padding: files
                                      holding the same entries (same keys and bytes, alignment,
                                      size alignment and compatibility key) become byte-identical
                                      whatever order, threads or processes inserted them; the file
                                      is rewritten even when already compact. For shipping
                                      prebuilt caches (docs/INTEGRATION.md). */

/** What wc_compact_ex did. Set struct_size with wc_compact_report_init; no byte past it is
 * written, and nothing at all when the call fails. */
typedef struct wc_compact_report {
  size_t struct_size;       /* set by wc_compact_report_init */
  int compacted;            /* 1: the file was rewritten; 0: nothing to reclaim, file untouched */
  uint64_t entries;         /* entries in the file afterwards */
  uint64_t dropped_entries; /* damaged entries left out (WC_COMPACT_DROP_CORRUPT) */
  uint64_t bytes_before, bytes_after;
} wc_compact_report;

/** Zeroes *report and sets report->struct_size; call before wc_compact_ex. NULL is ignored. */
WC_API void wc_compact_report_init(wc_compact_report* report);

/**
 * Rewrites the live, verified entries of the cache file at options->path into a new file and
 * renames it into place, so that replaced entries, old indexes and uncommitted tails no longer
 * take space. Only while no other process has the file open (every user holds a shared "in use"
 * lock on it) and no writer holds its lease; the file's compatibility key must be
 * options->compat_key. Pointers into the old file are unaffected (no process can hold one). Uses
 * options->path, compat_key, allow_symlink, durability. The file's permission bits are kept.
 * Statuses: WC_OK (also when there was nothing to reclaim), WC_ERR_BUSY (in use or leased: run
 * again later; the next open that finds the file unused compacts it if it is over the
 * thresholds), WC_ERR_INCOMPATIBLE (another compatibility key, version or byte order),
 * WC_ERR_CORRUPT (no usable commit, a damaged newest commit, or damaged entries without
 * WC_COMPACT_DROP_CORRUPT: the file is untouched), WC_ERR_IO / WC_ERR_NO_SPACE /
 * WC_ERR_READ_ONLY (the OS refused to open, read or write a file, no file at the path included;
 * when writing the new file, the original is untouched unless the message says the rename
 * happened), WC_ERR_INVALID_ARGUMENT (options NULL or not initialised, no path, a path that is
 * not a regular file), WC_ERR_NO_MEMORY. A cache this process has open counts as a user (close
 * it first).
 */
WC_API wc_status wc_compact(const wc_options* options);
/** wc_compact with flags (WC_COMPACT_*; another bit is WC_ERR_INVALID_ARGUMENT) and an optional
 * report (NULL, or initialised with wc_compact_report_init, else WC_ERR_INVALID_ARGUMENT). A library
 * built with WEIGHTCACHE_MOBILE has no canonical compaction: WC_COMPACT_CANONICAL is then
 * WC_ERR_UNSUPPORTED, the file untouched (docs/INTEGRATION.md, "Mobile builds"). */
WC_API wc_status wc_compact_ex(const wc_options* options, unsigned flags, wc_compact_report* report);

/* ---- garbage collection of a cache directory ---- */

/** What wc_gc did. Bytes are the disk space a cache takes: its file plus its lock file
 * "<file>.lock", as allocated on disk. Set struct_size with wc_gc_report_init; no byte past it
 * is written, and nothing at all when the call fails. */
typedef struct wc_gc_report {
  size_t struct_size;        /* set by wc_gc_report_init */
  uint64_t max_bytes;        /* the budget asked for */
  uint64_t caches;           /* cache files found in the directory */
  uint64_t total_before;     /* their bytes before */
  uint64_t total_after;      /* and after (a kept file counts as it was measured) */
  uint64_t removed_files;    /* caches removed, with their lock files */
  uint64_t removed_bytes;
  uint64_t kept_files;       /* caches kept, for any reason */
  uint64_t kept_bytes;
  uint64_t kept_in_use;      /* kept because a process had them open or a writer held their lease */
  uint64_t kept_in_use_bytes;
  uint64_t kept_unremovable; /* kept because they could not be proven unused or could not be deleted:
                                not writable by this user, changed meanwhile, or an OS error */
  uint64_t kept_unremovable_bytes;
  uint64_t removed_temporaries;     /* "<file>.tmp.*" files of dead writers removed with a cache */
  uint64_t removed_temporary_bytes;
  int within_budget;         /* 1 when total_after <= max_bytes */
} wc_gc_report;

/** Zeroes *report and sets report->struct_size; call before wc_gc. NULL is ignored. */
WC_API void wc_gc_report_init(wc_gc_report* report);

/**
 * Removes the least recently used cache files of the directory `dir` (not its subdirectories)
 * until the caches there take at most `max_bytes`. A cache file is recognised by its header
 * (never by its name); other files, directories and symlinks are never touched, and symlinks are
 * not followed. "Last used" is the later of the modification times of the file and of its lock
 * file, which every writable open touches (read-only opens leave no trace). A file is removed
 * only when it is provably unused: opened for writing, with its writer lease and its exclusive
 * "in use" lock taken (see wc_compact), so a file any process has open -- this one included --
 * is kept, as is one this user cannot open for writing. The lock file goes with it, and so do
 * its temporaries "<file>.tmp.*", which only a dead writer can have left behind once the lease
 * is held. A file in use is not an error: check report->within_budget.
 * `report` may be NULL, or initialised with wc_gc_report_init. Statuses: WC_OK (the directory was
 * read; see the report), WC_ERR_INVALID_ARGUMENT (NULL or empty dir, uninitialised report),
 * WC_ERR_IO (the directory cannot be read), WC_ERR_NO_MEMORY. Several processes may collect one
 * directory at once (each file is removed by at most one of them). A library built with
 * WEIGHTCACHE_MOBILE has no gc: WC_ERR_UNSUPPORTED, nothing touched (docs/INTEGRATION.md,
 * "Mobile builds").
 */
WC_API wc_status wc_gc(const char* dir, uint64_t max_bytes, wc_gc_report* report);

/** Fills *out (struct_size set by wc_stats_init; no byte past it is written) with the cache's
 * counters: see wc_stats. Takes no lock a writer holds, so it never waits for the lease.
 * Statuses: WC_OK, WC_ERR_INVALID_ARGUMENT (NULL cache or out, struct_size not set: *out is left
 * untouched). */
WC_API wc_status wc_get_stats(wc_cache* cache, wc_stats* out);

/**
 * The path of the file the cache uses, as snprintf does it: up to out_capacity - 1 bytes and a
 * NUL are written to `out` (NULL with out_capacity 0: nothing written), and the full length is
 * returned. It is wc_options.path, or the prebuilt file wc_open chose from prebuilt_dir, or
 * the label of a descriptor cache; "" for a heap-only cache. cache NULL: 0, nothing written.
 */
WC_API size_t wc_get_path(wc_cache* cache, char* out, size_t out_capacity);

/**
 * The instruction-set features of this process's CPU that packed layouts follow, as text for a
 * compatibility key (wc_options.compat_key): "x86_64:" and the features among sse4.1, avx, avx2,
 * fma, f16c, avx512f, avx512bw, avx512vl, avx512dq and avx512vnni it has, comma-separated
 * ("i386:" likewise); "aarch64:hwcap=H,H2" (the auxiliary vector's HWCAP and HWCAP2 in hex) on
 * Linux arm64; "other" elsewhere. The same in every process on one CPU; caches built for a fleet
 * (wc_options.prebuilt_dir, docs/DEPLOY.md) are told apart by it. As snprintf does it: up to
 * out_capacity - 1 bytes and a NUL are written to `out` (NULL with 0: nothing), and the full
 * length is returned.
 */
WC_API size_t wc_cpu_features(char* out, size_t out_capacity);

/** Static English name of a status ("unknown status" for a value that is none). Never NULL. */
WC_API const char* wc_status_string(wc_status status);

/**
 * The calling thread's message for its last failure: what failed and what to do (UTF-8,
 * NUL-terminated: the bytes of a path that are not UTF-8, as POSIX paths may be, appear as
 * "\xHH", two lowercase hex digits each); "" on a thread where nothing failed yet. Never NULL. The string belongs to
 * the thread: the pointer and the text stay valid and unchanged until the next call of this
 * library that fails on the same thread (calls that succeed, and failures on other threads,
 * leave it alone), or until the thread exits. Copy it to keep it longer. The text lives in a
 * fixed per-thread buffer (recording it never allocates, so it is there after an out-of-memory
 * failure too): a message longer than about 1000 bytes is cut and ends in "... [truncated]".
 */
WC_API const char* wc_last_error(void);

/** Sets the process-wide log level (one of wc_log_level's values) of the "weightcache" logger,
 * for every message logged after it returns. A value that is not one of wc_log_level's (5, a
 * negative one, 7 and up) is refused: the level stays as it was, and a warning says so. The
 * default is WC_LOG_WARN, or the level named by the environment variable WEIGHTCACHE_LOG_LEVEL
 * (trace, debug, info, warn, error, critical or off; any other value, the empty one included,
 * keeps WC_LOG_WARN and says so once, naming these, before the first message logged while
 * warnings pass), read once per process, before the first message or the first call to
 * wc_set_log_level or wc_set_log_callback. */
WC_API void wc_set_log_level(wc_log_level level);

/** Routes log messages to `callback`, with `user` (NULL restores the default: formatted lines
 * on stderr). The library keeps `user` without reading it. When this returns, no call of the
 * previous callback is still running (it waits for one in progress) and none will start, so the
 * previous `user` may be freed. Must not be called from inside a callback. */
WC_API void wc_set_log_callback(wc_log_callback callback, void* user);

/* ---- for integrations built on this API (docs/INTEGRATION.md, "Writing an integration") ---- */

/** Logs `message` (NUL-terminated) on the library's logger, as the library logs its own: only if
 * `level` (WC_LOG_TRACE .. WC_LOG_ERROR) is at or above the level set, to the log callback or as
 * one line on stderr, under the same lock (one message at a time). For an integration (a runtime
 * adapter) so that its host routes and filters one log. The text is taken as it is (no
 * formatting, no newline added); bytes that are not UTF-8 are escaped as in wc_last_error. A
 * NULL message logs nothing; a level outside WC_LOG_TRACE .. WC_LOG_ERROR (WC_LOG_OFF included)
 * logs nothing but a warning that says so. Any thread; not from inside the log callback (it
 * would wait for itself). Sets no error. */
WC_API void wc_log_message(wc_log_level level, const char* message);

/** Records `status` and `message` as the calling thread's last error, as a call of this library
 * that fails does: wc_last_error (and C++ last_error) return them until the thread's next
 * failure. Returns `status`. For an integration whose entry point fails where it has no status
 * to return (XNNPACK's look_up_or_insert returns an offset), so its host reads the reason where
 * it reads the library's. The message is copied, cut and escaped as wc_last_error says; NULL
 * means wc_status_string(status). `status` must be an error (WC_ERR_INVALID_ARGUMENT ..
 * WC_ERR_READ_ONLY): WC_OK or another value records WC_ERR_INVALID_ARGUMENT with a message that
 * says so, and returns it. Never allocates, so it works when memory has run out. Any thread;
 * other threads' errors are untouched. */
WC_API wc_status wc_set_last_error(wc_status status, const char* message);

/** Library version as "MAJOR.MINOR.PATCH": a static string, never NULL. */
WC_API const char* wc_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTCACHE_WEIGHTCACHE_H */
