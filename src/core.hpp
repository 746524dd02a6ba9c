// The cache itself. One Core per (file, compatibility key) per process (see registry.cpp);
// WeightCache handles and wc_cache handles point at it.
#pragma once

#include "entry_index.hpp"
#include "file_state.hpp"
#include "verify_record.hpp"
#include "format/format.hpp"
#include "platform/address_space.hpp"
#include "platform/platform.hpp"
#include "thread_annotations.hpp"

#include <weightcache/weight_cache.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <initializer_list>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace weightcache {

/// Sets this thread's last error and returns it (for `return fail(...)`).
Error fail(Error e);

void set_last_error(const Error& e) noexcept;
/// Sets this thread's last error to `what`, followed by " '<path>'" when path is not NULL,
/// without allocating: for the out-of-memory paths, where building a std::string may be what
/// failed. Text beyond kLastErrorCapacity is cut and ends in "... [truncated]".
void set_last_error(Errc code, int sys_errno, const char* what, const char* path = nullptr) noexcept;
/// The same with the message made of `parts` (NULL parts are skipped), also without allocating.
void set_last_error(Errc code, int sys_errno, std::initializer_list<const char*> parts) noexcept;
/// This thread's last error message (what wc_last_error returns) and code.
const char* last_error_message() noexcept;
Errc last_error_code() noexcept;
/// Bytes of this thread's last-error message, its terminating NUL included.
inline constexpr std::size_t kLastErrorCapacity = 1024;
/// "WC_ERR_NO_SPACE" etc.: the C name of a code, for log lines users grep for.
const char* errc_name(Errc code) noexcept;
/// "corrupt cache file" etc.: what wc_status_string says.
const char* errc_text(Errc code) noexcept;

/// A statistics counter that many threads bump at once: one cache line per stripe, so
/// concurrent look-ups do not fight over a single line. Reads sum the stripes.
class StripedCounter {
 public:
  void add(std::uint64_t n = 1) noexcept { stripes_[stripe()].v.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t load() const noexcept {
    std::uint64_t sum = 0;
    for (const auto& s : stripes_) sum += s.v.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  static constexpr std::size_t kStripes = 16;
  struct alignas(64) Stripe {
    std::atomic<std::uint64_t> v{0};
  };
  static std::size_t stripe() noexcept;  // this thread's, fixed for its life
  Stripe stripes_[kStripes];
};

/// The heap arena of a cache: private memory for the entries that cannot live in the file (a
/// heap-only cache, a fallback), reserved chunk by chunk as it fills, so a cache reserves only
/// what it uses (docs/DESIGN.md, "Address space"). Arena offsets run on from chunk to chunk; a
/// chunk never moves and is released with the arena. Readers turn an offset into an address
/// without a lock; everything else is the writer's (under Core's write mutex).
class HeapArena {
 public:
  explicit HeapArena(platform::Platform& pf) noexcept : pf_(pf) {}
  ~HeapArena();
  HeapArena(const HeapArena&) = delete;
  HeapArena& operator=(const HeapArena&) = delete;

  /// The arena offset of `size` committed bytes at or after `from`, aligned to `align` (a power
  /// of two no larger than `gran`, the chunk alignment, or a multiple of it). Writer only.
  Result<std::uint64_t> place(std::uint64_t from, std::uint64_t size, std::uint64_t align, std::uint64_t gran);
  /// Address of an arena offset inside a chunk. Any thread.
  std::byte* addr(std::uint64_t off) const noexcept;
  /// Whether `p` lies in a chunk. Any thread.
  bool contains(const std::byte* p) const noexcept;
  /// The arena offset of `p`, and how many committed bytes follow it in its chunk. Writer only.
  bool find(const std::byte* p, std::uint64_t* off, std::uint64_t* room) const noexcept;

 private:
  struct Chunk {
    std::uint64_t start = 0;      // arena offset of space.base()[0]
    std::uint64_t committed = 0;  // [base, base + committed) is usable (writer only)
    platform::AddressReservation space;
  };
  // Chunks at least double, so 64 hold any arena an address space can; only retries that had
  // to settle for less (an address-space limit) add more.
  static constexpr unsigned kMaxChunks = 64;
  Result<void> commit(Chunk& c, std::uint64_t end, std::uint64_t gran);

  platform::Platform& pf_;
  Chunk chunks_[kMaxChunks];
  std::atomic<unsigned> count_{0};  // chunks_[0, count_) are filled in (release store)
  std::uint64_t reserved_ = 0;      // writer only
};

class Core {
 public:
  struct Identity {
    std::uint64_t device = 0, inode = 0;
  };

  /// Opens a cache per `options` (file-backed, or heap-only). Applies the fallback policy.
  static Result<std::shared_ptr<Core>> open(const Options& options, platform::Platform& pf);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  std::size_t look_up(std::string_view key);
  void* reserve(std::size_t size);
  Result<void> release(void* ptr);
  /// With `awaits` (the finalize ticket of wc_look_up_or_insert_ex): on success *awaits is the
  /// value finalizes_started() must reach for the entry returned to have been through a finalize
  /// that started after it was inserted (0: it already has); 0 on failure or for a look-up.
  std::size_t look_up_or_insert(std::string_view key, void* ptr, std::size_t size, std::uint64_t* awaits = nullptr);
  /// Address of the live entry at `offset`, or nullptr. With `replaced_too`, also of an entry
  /// since replaced under its key (its bytes stay mapped until close): for a caller that holds
  /// an offset it was given before the replacement and cannot take a null (wc_offset_to_addr_kept).
  void* offset_to_addr(std::size_t offset, bool replaced_too = false) const;
  Result<void> finalize();
  bool is_finalized() const noexcept { return finalized_.load(std::memory_order_acquire); }
  /// How many finalize calls have started (ended the packing phase) on this cache: counted under
  /// write_mu_, the mutex that orders inserts, where finalized_ turns true.
  std::uint64_t finalizes_started() const noexcept { return finalizes_started_.load(std::memory_order_acquire); }
  Result<void> refresh();
  Stats stats() const;
  /// Bytes of the in-memory index's storage in mappings of its own (index_memory.hpp): for tests.
  std::size_t index_mapped_bytes() const noexcept { return index_.mapped_bytes(); }
  std::size_t alignment() const noexcept { return align_; }
  /// The OS descriptor of a file-backed cache's file (wc_get_fd), or -1.
  int descriptor() const noexcept { return file_backed() && fd_.is_open() ? pf_.native_descriptor(fd_) : -1; }
  /// The OS handle of a file-backed cache's file (wc_get_handle: Windows), or nullptr.
  void* os_handle() const noexcept { return file_backed() && fd_.is_open() ? pf_.native_os_handle(fd_) : nullptr; }

  bool file_backed() const noexcept { return file_backed_.load(std::memory_order_acquire); }
  /// The file's path (or a descriptor's label); empty for a heap-only cache.
  std::string path() const { return file_backed() ? opts_.path : std::string(); }
  /// Marks a cache opened from Options::prebuilt_dir (wc_stats.prebuilt).
  void mark_prebuilt() noexcept { prebuilt_.store(true, std::memory_order_relaxed); }
  /// Opened before this process was forked from its opener: the registry hands it to no new
  /// open, and its writer lease is the parent's, never this process's.
  bool inherited_across_fork() const noexcept { return in_forked_child(); }
  /// Around fork() (fork_guard.cpp): the process-wide map of lease holders' mutex.
  static void lock_lease_holders_for_fork() noexcept;
  static void unlock_lease_holders_after_fork() noexcept;
  Identity identity() const noexcept { return identity_; }
  std::uint64_t compat_hash() const noexcept { return compat_hash_; }
  bool read_only() const noexcept { return opts_.read_only; }
  /// A heap cache standing in for a file cache that could not be used: finalize then reports
  /// entries inserted as not durable, with this reason.
  void set_heap_reason(const Error& why) noexcept {
    try {
      heap_why_ = why;
    } catch (...) {
      heap_why_.code = why.code;
    }
  }

  Core(const Options& options, platform::Platform& pf);  // use open()

 private:
  struct Trust;  // below, with the verification state
  struct Reservation {
    std::uint64_t capacity = 0;
    bool heap = false;
  };
  struct Region {
    std::uint64_t offset = 0;
    bool heap = false;
  };

  // set-up
  Result<void> init_heap_only();
  /// Commits the heap arena's first chunk now: a fallback must not promise memory it cannot get.
  Result<void> ready_heap();
  Result<void> reserve_address_space(std::uint64_t file_span);
  Result<void> init_file();
  /// Opens the file at the path into fd_ and takes its in-use lock: exclusive when no other
  /// process has it open (returns true), else shared; waits while another holds it exclusively,
  /// and checks the path still names the file it locked.
  Result<bool> open_in_use(std::chrono::steady_clock::time_point deadline);
  Result<CommittedState> read_state();  // header, slot and index of fd_ (checked)
  bool upgrade_in_use();  // shared -> exclusive: true when no other process has the file open
  Result<void> attach(CommittedState& st);  // map + index what read_state found
  Result<void> attach_locked(CommittedState& st, std::vector<Entry*>* placed = nullptr) WC_REQUIRES(write_mu_);
  void await_file(const Error& why);
  Result<void> try_attach_locked() WC_REQUIRES(write_mu_);  // a cache awaiting its file: attach it if it exists now
  Result<void> create_missing_file();  // under the lease
  Result<void> init_descriptor();      // options.fd, options.handle or ":memory:"
  Result<void> write_empty_cache(const platform::File& f);  // header + empty index, in order
  Result<void> write_empty_cache_in_place();
  Result<void> rebuild_file();         // holding fd_ alone; renames a new file over it
  Result<void> create_fresh_file();    // under the lease; renames a new file into place
  bool compaction_due(const CommittedState& st) const;
  // true: a new file took the path. `salvage`: the newest commit of `st` does not verify; write
  // the one in use into a fresh file (leaving damaged entries out) so that writers can commit.
  bool compact_in_place(const CommittedState& st, bool salvage = false);
  void make_read_only(std::string why);
  bool persist_wanted() const noexcept { return file_backed_ || heap_why_.code != Errc::ok; }
  /// What the writer lease locks: the lock file, or a descriptor cache's file itself.
  const platform::File& lease_file() const noexcept { return leases_own_file_ ? fd_ : lock_fd_; }
  static const Core* lease_holder(const Identity& lock) noexcept;
  void set_lease_holder(const Identity& lock, const Core* holder) noexcept;
  /// The newest commit past `newer_than`, read against `*info` (an fstat of fd_, updated when a
  /// commit by another writer moved the size meanwhile).
  Result<format::CommitSlot> read_latest_slot(std::uint64_t newer_than, std::vector<format::IndexRecord>* records,
                                              platform::FileInfo* info);

  // writer side (write_mu_ held)
  /// Takes the writer lease, waiting up to lease_timeout. While it waits it unlocks *lk (if
  /// given), so callers must re-read any state they computed before calling.
  /// With catch_up (appending), also checks the path still names our file and merges what
  /// others committed; without it (replacing the file), only takes the locks.
  Result<void> acquire_lease_locked(MutexLock* lk, bool catch_up = true) WC_REQUIRES(write_mu_);
  /// Sleeps with *lk (write_mu_) released, and takes it back (no lock when lk is null).
  static void sleep_unlocked(MutexLock* lk, std::chrono::microseconds d) WC_NO_THREAD_SAFETY_ANALYSIS;
  void release_lease_locked() noexcept WC_REQUIRES(write_mu_);
  void publish_sizes_locked() WC_REQUIRES(write_mu_);  // copies sizes for stats(), which takes no write lock
  void release_lease_if_safe_locked() WC_REQUIRES(write_mu_);
  Result<void> refresh_locked() WC_REQUIRES(write_mu_);
  Result<void> ensure_mapped_locked(std::uint64_t end) WC_REQUIRES(write_mu_);
  /// Grows the file to at least `end`, keeping `room` more bytes of the span free after it (for
  /// the index a finalize writes there: index_room_locked). no_space past the span.
  Result<void> grow_file_locked(std::uint64_t end, std::uint64_t room = 0) WC_REQUIRES(write_mu_);
  /// The span to keep free after the data for the next committed index: the file's live entries,
  /// `more` records with `more_key_bytes` of keys, and every outstanding file reservation at
  /// kReservedKeyBytes of key (their keys are not known yet).
  std::uint64_t index_room_locked(std::uint64_t more, std::uint64_t more_key_bytes) const WC_REQUIRES(write_mu_);
  /// Whether the span holds data up to `end` with `room` more bytes free after it.
  bool span_fits(std::uint64_t end, std::uint64_t room) const { return end <= file_span_ && file_span_ - end >= room; }
  /// Space for `size` bytes: in the file (grown as needed) under the lease, else in heap memory.
  /// `for_stores`: a reservation the caller fills through the mapping (see prepare_for_stores).
  /// prepare_for_stores over what of a reservation at `off` is not yet prepared, and ahead of it.
  Result<void> prepare_locked(std::uint64_t off, std::uint64_t size) WC_REQUIRES(write_mu_);
  /// `key_bytes`: the entry's key size when known (an insert), else kUnknownKey (a reservation).
  Result<Region> allocate_locked(std::uint64_t size, bool for_stores, std::uint64_t key_bytes, bool* fell_back,
                                 MutexLock& lk) WC_REQUIRES(write_mu_);
  static constexpr std::uint64_t kUnknownKey = UINT64_MAX;
  /// The key size a reservation's room in the index assumes; a longer key is checked at commit.
  static constexpr std::uint64_t kReservedKeyBytes = 256;
  Result<std::uint64_t> allocate_heap_locked(std::uint64_t size) WC_REQUIRES(write_mu_);
  void release_reservation_locked(std::uint64_t offset, const Reservation& r) WC_REQUIRES(write_mu_);
  /// reservations_ changed only through these, which keep file_reservations_.
  void add_reservation_locked(std::uint64_t offset, const Reservation& r) WC_REQUIRES(write_mu_);
  void erase_reservation_locked(std::map<std::uint64_t, Reservation>::iterator it) WC_REQUIRES(write_mu_);
  /// Publishes what `records` add to the index. With `placed`: the entry that holds each record
  /// after it (nullptr where this process's own uncommitted entry kept the key).
  void merge_records_locked(std::vector<format::IndexRecord>& records, std::vector<Entry*>* placed = nullptr)
      WC_REQUIRES(write_mu_);
  Result<void> persist_locked(MutexLock& lk) WC_REQUIRES(write_mu_);
  Result<void> persist_all_locked(MutexLock& lk) WC_REQUIRES(write_mu_);
  Result<void> migrate_heap_entries_locked() WC_REQUIRES(write_mu_);
  Result<bool> try_lock_both_locked() WC_REQUIRES(write_mu_);
  void maybe_trim_locked() WC_REQUIRES(write_mu_);
  /// At close, holding the lease: cuts what was grown but never committed, and lets go of the lease.
  void trim_on_close_locked() WC_REQUIRES(write_mu_);
  /// At close, after trim_on_close_locked: unmaps the cache's address space (space_), then, where
  /// mapping grew the file behind our back, cuts the uncommitted tail if no writer is at work.
  void unmap_on_close_locked() WC_REQUIRES(write_mu_);

  bool verify_entry(Entry* e);
  /// Who reaches a verdict: the verify-ahead thread's are counted in verified_ahead_.
  enum class Verifier { look_up, ahead };
  /// Hashes an entry this thread claimed (kVerifying) and records the verdict. With `stop` (the
  /// verify-ahead thread), gives up between chunks once it is set: the entry is unverified again.
  bool finish_verify(Entry* e, const std::atomic<bool>* stop = nullptr, Verifier by = Verifier::look_up);
  enum class Check { good, bad_checksum, past_end, hole, stopped };
  /// The entry's bytes against its checksum, hashed in chunks (docs/DESIGN.md, "Verification").
  Check check_bytes(const Entry* e, const std::atomic<bool>* stop) const;
  /// Stores the verdict `c` (not stopped) on an entry claimed by this thread, counted first (a
  /// look-up that sees the verdict must find it in the stats), wakes waiters, logs a failure.
  bool settle_verdict(Entry* e, Check c, Verifier by = Verifier::look_up);
  /// With verify first_use and a large cache, a thread checksums entries before their first
  /// look-up asks for them (docs/DESIGN.md, "Verification").
  void start_verify_ahead();
  void wake_verify_waiters() noexcept;  // after an entry leaves kVerifying
  // True in a child forked after open: the verify-ahead thread is not here, and the parent's
  // threads may have left verify_sync_ locked or waited on at the fork.
  bool in_forked_child() const noexcept;
  /// The error a write (reserve, release, insert, finalize, refresh) gets on a cache this process
  /// inherited across fork(): its lease, flock and reservations are the parent's, and a parent
  /// thread may have held its mutexes at the fork. Checked before any lock is taken.
  Error inherited_refusal(const char* call) const;
  void stop_verify_ahead() noexcept;
  void verify_all(const std::vector<Entry*>& entries);
  /// With Verify::shared: takes the file's state stamp after attaching `st` and trusts the
  /// entries a record of an earlier verification of exactly that state names (core_trust.cpp).
  /// `placed`: merge_records_locked's answer for st.records, if it has one.
  void adopt_verification(const CommittedState& st, const std::vector<Entry*>* placed) WC_REQUIRES(write_mu_);
  void adopt_verification_or_throw(const CommittedState& st, const std::vector<Entry*>* placed) WC_REQUIRES(write_mu_);
  /// A read-only opener of a file on a read-only mount: opens (creating it) the record of this
  /// file in the record directory (Options::record_dir) into t.own_record. false: none usable.
  bool open_node_record(Trust& t, const platform::FileInfo& file);
  /// Whether fd_ is on a read-only mount of a file system whose times the kernel keeps: where a
  /// read-only opener's record goes to the record directory.
  bool node_record_applies() noexcept;
  /// A kTrusted entry claimed (kVerifying) by this thread: kGood if the file is still in the
  /// state its record was made for, else hashed (finish_verify).
  bool confirm_trusted(Entry* e);
  /// Whether a check of the file's state in the last interval holds for a first use starting
  /// now (confirm_trusted's rule), without a system call beyond the clock. Any thread.
  bool trust_confirmed_now() const noexcept;
  /// Writes what this process verified of the adopted state into the lock file, if the file is
  /// still in that state. Best effort, never throws: called by the verify-ahead thread and close.
  void publish_verification() noexcept;
  /// The stamp of commit `slot` (whose index is `records`) in the file state `info`, and which of
  /// its entries this process holds (Trust::entries); the boot id and the rest are the caller's.
  /// `placed` (merge_records_locked's, for these records) spares a look-up per record.
  void describe_state(Trust& t, const format::CommitSlot& slot, const std::vector<format::IndexRecord>& records,
                      const platform::FileInfo& info, const std::vector<Entry*>* placed = nullptr) const;
  /// Writes `verified` (a bit per entry of t's commit) into the lock file, ORed into a record of
  /// the same stamp already there, if the file is still in t's state and the lock file still the
  /// cache's own and anything is new. t.mu held.
  void write_record(Trust& t, std::vector<bool> verified);
  /// At close, a process that committed in this session verifies the file's final state itself,
  /// as the next process would (hashing every committed entry again from the mapping), and
  /// records it (docs/DESIGN.md, "The writer's own record"). Best effort, never throws. Before
  /// the address space is released: it hashes through the mapping.
  void record_own_commits_locked() noexcept WC_REQUIRES(write_mu_);
  Entry* find_entry(std::string_view key) const noexcept { return index_.find_key(key); }
  /// Recomputes durable_live_ from the index (after a merge).
  void recount_durable_locked() WC_REQUIRES(write_mu_);
  std::byte* addr(std::uint64_t offset) const noexcept {
    return offset < file_span_ ? space_.base() + offset : heap_.addr(offset - file_span_);
  }
  /// Why `size` bytes at `ptr` cannot be the source of an insert, or "": where `ptr` lies in the
  /// cache's own memory they must stay inside the reservation or entry it points into (and inside
  /// what is mapped). Takes write_mu_ when `ptr` is in the cache's memory.
  std::string source_problem(const void* ptr, std::uint64_t size);
  /// The offset of an address in the cache's own memory (file mirror or heap arena), and how many
  /// mapped or committed bytes follow it there; false for any other address. write_mu_ held.
  bool offset_of(const void* p, std::uint64_t* offset, std::uint64_t* room) const noexcept WC_REQUIRES(write_mu_);
  std::uint64_t round_size(std::uint64_t size) const noexcept;
  /// Alignment of new file offsets: the file's own (from its header) when stricter than ours,
  /// so every entry keeps the invariant the header states.
  std::uint64_t offset_align() const noexcept { return std::max<std::uint64_t>(align_, file_align_); }

  platform::Platform& pf_;
  Options opts_;
  std::string lock_path_;
  std::uint64_t compat_hash_ = 0;
  std::size_t align_ = 64;
  std::uint64_t file_align_ = 1;
  std::size_t gran_ = 4096;
  std::atomic<bool> file_backed_{false};  // set once; after open only by try_attach_locked
  std::atomic<bool> awaiting_file_{false};  // a read-only cache opened before its file existed
  bool file_disabled_ = false;  // new entries go to the heap (replaced file, read-only, ...)
  Identity identity_;
  Identity lock_identity_;         // of the lock file (see lease_holder)
  Identity leased_file_identity_;  // of the data file, while this cache holds the lease
  std::string read_only_why_;      // set when the cache had to be used read-only
  bool from_descriptor_ = false;   // options.fd, .handle or ":memory:": no path, lease and lock on the file
  Error heap_why_;                 // set on a heap cache standing in for a file cache
  std::uint64_t state_size_ = 0;   // size of the file read_state read
  unsigned state_mode_ = 0644;     // and its permission bits
  format::HeaderFixed file_fixed_{};

  // Address space: [space_.base(), + file_span_) mirrors the file (address = base + offset);
  // offsets from file_span_ on are the heap arena's (offset - file_span_), in chunks of their own.
  std::uint64_t file_span_ = 0;
  // Given back in the reverse of this order when the cache goes, after the destructor's body:
  // the file's address space, the file, the lock file, then the heap arena's chunks.
  HeapArena heap_{pf_};
  platform::File lock_fd_;  // "<path>.lock", the writer lease's; not open read-only, nor for a descriptor
  platform::File fd_;       // the cache file
  platform::AddressReservation space_;  // the file's mirror (empty for a heap-only cache)
  bool leases_own_file_ = false;        // a writable descriptor cache: the lease is fd_'s own lock

  // The writer's state: guarded by write_mu_ (checked by clang's -Wthread-safety).
  mutable Mutex write_mu_;
  bool has_lease_ WC_GUARDED_BY(write_mu_) = false;
  bool lease_gave_up_ WC_GUARDED_BY(write_mu_) = false;  // a full lease wait timed out: only quick tries until finalize/refresh
  bool data_locked_ WC_GUARDED_BY(write_mu_) = false;  // fd_ locked with the lease (unlocked before fd_ closes)
  std::uint64_t file_size_ WC_GUARDED_BY(write_mu_) = 0;     // current size of the file
  std::uint64_t mapped_end_ WC_GUARDED_BY(write_mu_) = 0;    // file bytes [0, mapped_end_) are mapped
  std::uint64_t cursor_ WC_GUARDED_BY(write_mu_) = 0;        // next free file offset (valid with the lease)
  std::uint64_t prepared_end_ WC_GUARDED_BY(write_mu_) = 0;  // prepare_locked wrote up to here (this lease)
  std::uint64_t allocated_end_ WC_GUARDED_BY(write_mu_) = 0; // disk space allocated up to here (this lease)
  std::uint64_t flush_from_ WC_GUARDED_BY(write_mu_) = 0;    // start of data not yet flushed
  std::uint64_t heap_cursor_ WC_GUARDED_BY(write_mu_) = 0;   // arena offset
  format::CommitSlot committed_ WC_GUARDED_BY(write_mu_){};  // latest slot we wrote or read
  std::uint64_t written_size_ WC_GUARDED_BY(write_mu_) = 0;  // largest committed_size of any slot we wrote, synced or not
  // A commit that flushed nothing (durability none or async): the committed size whose
  // write-back finalize has started before it returns (start_write_back_behind); 0: none.
  std::uint64_t write_back_owed_ WC_GUARDED_BY(write_mu_) = 0;
  std::map<std::uint64_t, Reservation> reservations_ WC_GUARDED_BY(write_mu_);
  std::uint64_t file_reservations_ WC_GUARDED_BY(write_mu_) = 0;  // of them, in the file (index room)
  std::vector<Entry*> pending_ WC_GUARDED_BY(write_mu_);     // file entries not yet in a committed index
  bool warned_fallback_ WC_GUARDED_BY(write_mu_) = false;
  // Live heap entries of a cache meant to persist (a fallback): what finalize still owes.
  std::atomic<std::uint64_t> unpersisted_entries_{0}, unpersisted_bytes_{0};
  std::atomic<std::uint64_t> compactions_{0};

  // Readers search it without a lock; writers hold write_mu_ (see entry_index.hpp).
  EntryIndex index_;
  std::atomic<std::uint64_t> durable_live_{0};  // rounded bytes of live entries a committed index names

  std::atomic<std::uint64_t> seen_file_size_{0}, seen_committed_{0}, seen_trailer_{0};
  std::atomic<bool> finalized_{true};
  std::atomic<std::uint64_t> finalizes_started_{0};  // written under write_mu_ (finalize)
  StripedCounter hits_, misses_;
  const std::uint64_t opener_forks_;  // platform::fork_generation() at open (see in_forked_child)
  const int opener_pid_;               // the process that opened the cache (the fallback)
  const bool commit_write_back_;       // see finalize; off only for the benchmark (WEIGHTCACHE_COMMIT_WRITE_BACK=off)
  std::atomic<std::uint64_t> verified_ahead_{0};
  // Verified once per file state (core_trust.cpp): set once by adopt_verification, at open,
  // before any other thread runs; publish_verification serializes on `mu`.
  struct Trust {
    std::mutex mu;
    StateStamp stamp;
    std::vector<Entry*> entries;  // the stamp's commit in index order (null: not this process's)
    const platform::File* record = nullptr;  // the lock file (lock_fd_) of a writable opener
    platform::File own_record;    // opened for the record alone (a read-only opener; closed after adopt,
                                  // unless it is a node record, which it writes)
    std::string record_path;      // the record file's one name: lock_path_, or a node record's
    bool node_record = false;     // in the record directory (a read-only mount), not beside the file
    bool writable = false;        // this process may write the record
    bool publishable = false;     // a change after the stamp would show in the change time
    // One fstat per interval, not per trusted entry (confirm_trusted): an fstat that found the
    // file in the stamp's state holds for first uses until `confirmed_until` (Platform::monotonic_ns,
    // read before that fstat, plus `recheck_ns`); once one found it changed, `changed` stays set
    // and every trusted entry is hashed. Set at adopt: min(the file's change window, 10 ms).
    std::int64_t recheck_ns = 0;
    std::atomic<std::int64_t> confirmed_until{0};
    std::atomic<bool> changed{false};
  };
  std::unique_ptr<Trust> trust_;
  std::atomic<std::uint64_t> trusted_entries_{0};
  std::atomic<bool> prebuilt_{false};
  std::atomic<std::uint64_t> lease_timeouts_{0};
  // What look-ups waiting for another thread's verdict, and close waiting for the verify-ahead
  // thread, wait on. The thread says it is done, under `mu`, as its last act, and close then
  // joins it (verify_ahead_thread_): a thread still returning through this library's code when
  // close returns would crash a host that unloads the library next (dlclose). A forked child
  // can neither join nor detach a thread it never had: it leaves the handle behind. On the heap
  // so that a forked child can leave it behind untouched: the parent's threads may have held the
  // mutex or waited on the condition variable at the fork, and locking or destroying either then
  // hangs the child.
  struct VerifySync {
    std::mutex mu;
    std::condition_variable cv;  // an entry left kVerifying, or the verify-ahead thread ended
    std::atomic<bool> stop{false};
    std::atomic<bool> ahead_running{false};
  };
  std::unique_ptr<VerifySync> verify_sync_ = std::make_unique<VerifySync>();
  // Joined by stop_verify_ahead; a forked child releases the pointer (never joins or destroys it).
  std::unique_ptr<std::thread> verify_ahead_thread_;
  // The thread that starts a commit's write-back (finalize): `owed` is the committed size still
  // to start, `running` whether the thread lives; close waits for it (wait_for_write_back).
  struct WriteBackSync {
    std::mutex mu;
    std::condition_variable cv;
    std::uint64_t owed = 0;
    // Under `mu`, and atomic besides: a forked child that cannot lock `mu` (the parent's thread may
    // have held it) loads it with acquire, which orders what a thread that ended before the fork
    // did before the child's close (ThreadSanitizer checks it), as for the verify-ahead thread.
    std::atomic<bool> running{false};
  };
  std::unique_ptr<WriteBackSync> write_back_sync_ = std::make_unique<WriteBackSync>();
  // The write-back thread: joined before another starts (under write_mu_) and at close, as the
  // verify-ahead thread is.
  std::unique_ptr<std::thread> write_back_thread_;
  void start_write_back_behind(std::uint64_t committed_size) noexcept;
  void wait_for_write_back() noexcept;
  std::atomic<std::uint64_t> verify_failures_{0};
  std::atomic<std::uint64_t> mappings_{0}, heap_fallbacks_{0}, commits_{0};
  std::atomic<std::uint64_t> mapped_bytes_{0}, heap_bytes_{0};
};

}  // namespace weightcache
