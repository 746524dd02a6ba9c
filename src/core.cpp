#include "core.hpp"
#include "boundary.hpp"
#include "core_internal.hpp"
#include "compact.hpp"
#include "log.hpp"
#include "utf8.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <type_traits>

namespace weightcache {

using namespace core_detail;

namespace {

// This thread's last error. Plain data on purpose: a thread_local with a destructor makes the C++
// runtime register that destructor at the thread's first use, and glibc allocates for that
// registration and aborts the process when it cannot ("failed to register TLS destructor"), so
// a thread's first failure under memory pressure would kill the host. Zero-initialised, it needs
// no constructor either; the message is truncated (visibly) to the buffer.
struct LastError {
  Errc code;
  int sys_errno;
  char message[kLastErrorCapacity];  // NUL-terminated UTF-8
};
static_assert(std::is_trivially_destructible_v<LastError>, "a TLS destructor would allocate at first use");
thread_local LastError t_last_error{};

constexpr char kTruncated[] = "... [truncated]";

// Appends text to `out` (NUL-terminated, `used` bytes so far) within kLastErrorCapacity, each
// byte outside well-formed UTF-8 written as "\xHH" (a path's bytes: the message is promised as
// UTF-8); false when it did not fit (then `out` ends in kTruncated). Cuts fall between
// characters and escapes, never inside one.
bool append_message(char* out, std::size_t& used, const char* text, std::size_t size) noexcept {
  constexpr std::size_t cap = kLastErrorCapacity - 1;  // room for the NUL
  constexpr std::size_t mark = sizeof kTruncated - 1;
  const std::string_view part(text, size);
  std::size_t total = 0;
  utf8::for_each_piece(part, [&](const char*, std::size_t n) noexcept {
    total += n;
    return true;
  });
  const bool fits = used + total <= cap;
  const std::size_t limit = fits ? cap : cap - mark;
  if (used > limit) {  // an earlier part fills the room the mark needs: cut it back
    used = limit;
    while (used > 0 && (static_cast<unsigned char>(out[used]) & 0xC0) == 0x80) --used;
    // Nor leave the start of an escape ("\", "\x", "\xH") before the mark.
    for (std::size_t back = 1; back <= 3 && back <= used; ++back)
      if (out[used - back] == '\\') {
        used -= back;
        break;
      }
  }
  utf8::for_each_piece(part, [&](const char* p, std::size_t n) noexcept {
    if (used + n > limit) return false;
    std::memcpy(out + used, p, n);
    used += n;
    return true;
  });
  if (!fits) {
    std::memcpy(out + used, kTruncated, mark);
    used += mark;
  }
  out[used] = '\0';
  return fits;
}

// Which cache of this process holds the writer lease on a lock file (by the lock file's identity):
// a second cache of the same path, opened after the file there was replaced, must not wait for the
// lease its own process holds.
struct LeaseHolders {
  std::mutex mu;
  std::map<std::pair<std::uint64_t, std::uint64_t>, const Core*> by_lock_file;
};
LeaseHolders& lease_holders() {
  // Never destroyed (it outlives static destructors of hosts) and never allocated: constructing
  // an empty map and a mutex in place cannot fail, so the noexcept callers below may use it.
  alignas(LeaseHolders) static unsigned char storage[sizeof(LeaseHolders)];
  static LeaseHolders* h = new (storage) LeaseHolders();
  return *h;
}


// max_file_bytes when the caller leaves it 0: a share of what this process may reserve. A
// 64-bit process has 128 TiB of user address space on every system we build for (47 bits); a
// 32-bit one 2 GiB for sure. RLIMIT_AS lowers it (reservations count against it).
std::uint64_t default_max_file_bytes(const platform::Platform& pf) {
  std::uint64_t space = sizeof(void*) >= 8 ? std::uint64_t{1} << 47 : std::uint64_t{1} << 31;
  space = std::min(space, pf.address_space_limit());
  // A 32-bit process cannot hold hundreds of caches anyway; 1/512 of its 2 GiB (4 MiB) would be
  // too small for one model's weights. An eighth of its space (256 MiB) leaves room for a few
  // caches beside the host; the halving retries at open take less where that is not there.
  const std::uint64_t share = sizeof(void*) >= 8 ? kDefaultSpanShare : 8;
  return std::clamp<std::uint64_t>(floor_pow2(space / share), kMinChunk, kMaxDefaultFileSpan);
}

}  // namespace

const Core* Core::lease_holder(const Identity& lock) noexcept {
  if (lock.device == 0 && lock.inode == 0) return nullptr;
  auto& h = lease_holders();
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.by_lock_file.find({lock.device, lock.inode});
  return it == h.by_lock_file.end() ? nullptr : it->second;
}

void Core::lock_lease_holders_for_fork() noexcept { lease_holders().mu.lock(); }
void Core::unlock_lease_holders_after_fork() noexcept { lease_holders().mu.unlock(); }

void Core::set_lease_holder(const Identity& lock, const Core* holder) noexcept {
  if (lock.device == 0 && lock.inode == 0) return;
  auto& h = lease_holders();
  std::lock_guard<std::mutex> g(h.mu);
  try {
    if (holder != nullptr) h.by_lock_file[{lock.device, lock.inode}] = holder;
    else if (auto it = h.by_lock_file.find({lock.device, lock.inode}); it != h.by_lock_file.end() && it->second == this)
      h.by_lock_file.erase(it);
  } catch (...) {
    // Out of memory: the next cache of this path may wait for the lease instead of failing fast.
  }
}

namespace {
// Every name a status has, in one table (indexed by its value): the C enumerator, the text of
// wc_status_string, and a short text of at most 15 characters (assigning one to a std::string
// never allocates: every standard library we build with keeps that many in the string itself,
// so a last error can be recorded when memory has run out).
struct ErrcNames {
  Errc code;
  const char* c_name;
  const char* text;
  const char* brief;
};
constexpr ErrcNames kErrcNames[] = {
    {Errc::ok, "WC_OK", "ok", "ok"},
    {Errc::invalid_argument, "WC_ERR_INVALID_ARGUMENT", "invalid argument", "invalid arg"},
    {Errc::io, "WC_ERR_IO", "I/O error", "I/O error"},
    {Errc::no_space, "WC_ERR_NO_SPACE", "no space", "no space"},
    {Errc::corrupt, "WC_ERR_CORRUPT", "corrupt cache file", "corrupt file"},
    {Errc::incompatible, "WC_ERR_INCOMPATIBLE", "incompatible cache file", "incompatible"},
    {Errc::busy, "WC_ERR_BUSY", "busy", "busy"},
    {Errc::unsupported, "WC_ERR_UNSUPPORTED", "unsupported", "unsupported"},
    {Errc::no_memory, "WC_ERR_NO_MEMORY", "out of memory", "out of memory"},
    {Errc::read_only, "WC_ERR_READ_ONLY", "read-only", "read-only"},
};
constexpr bool table_in_order() {
  for (std::size_t i = 0; i < std::size(kErrcNames); ++i)
    if (static_cast<std::size_t>(kErrcNames[i].code) != i) return false;
  return true;
}
static_assert(table_in_order(), "kErrcNames is indexed by the status value");
static_assert(std::size(kErrcNames) == static_cast<std::size_t>(Errc::read_only) + 1, "a status without names");

const ErrcNames* names_of(Errc code) noexcept {
  const auto i = static_cast<std::size_t>(code);
  return i < std::size(kErrcNames) ? &kErrcNames[i] : nullptr;
}
}  // namespace

const char* errc_name(Errc code) noexcept {
  const ErrcNames* n = names_of(code);
  return n != nullptr ? n->c_name : "WC_ERR_UNKNOWN";
}

const char* errc_text(Errc code) noexcept {
  const ErrcNames* n = names_of(code);
  return n != nullptr ? n->text : "unknown status";
}


void set_last_error(const Error& e) noexcept {
  if (e.message.empty()) {  // no message (building it ran out of memory): say the kind of failure
    const ErrcNames* n = names_of(e.code);
    set_last_error(e.code, e.sys_errno, n != nullptr ? n->text : "error");
    return;
  }
  LastError& le = t_last_error;
  le.code = e.code;
  le.sys_errno = e.sys_errno;
  std::size_t used = 0;
  le.message[0] = '\0';
  append_message(le.message, used, e.message.data(), e.message.size());
}

void set_last_error(Errc code, int sys_errno, std::initializer_list<const char*> parts) noexcept {
  LastError& le = t_last_error;
  le.code = code;
  le.sys_errno = sys_errno;
  std::size_t used = 0;
  le.message[0] = '\0';
  for (const char* part : parts) {
    if (part != nullptr && !append_message(le.message, used, part, std::strlen(part))) return;
  }
}

void set_last_error(Errc code, int sys_errno, const char* what, const char* path) noexcept {
  if (what == nullptr) what = "error";
  if (path == nullptr) set_last_error(code, sys_errno, {what});
  else set_last_error(code, sys_errno, {what, " '", path, "'"});
}

const char* last_error_message() noexcept { return t_last_error.message; }
Errc last_error_code() noexcept { return t_last_error.code; }

wc_status refuse_argument(const char* what) noexcept {
  set_last_error(Errc::invalid_argument, 0, what);
  return WC_ERR_INVALID_ARGUMENT;
}

Errc absorb_exception(const char* call, const char* path) noexcept {
  Errc code = Errc::io;
  const char* what = "unexpected failure";
  try {
    throw;
  } catch (const std::bad_alloc&) {
    code = Errc::no_memory;
    what = "out of memory";
  } catch (const std::exception& e) {
    what = e.what();  // lives as long as the exception, which the caller's catch block holds
  } catch (...) {
  }
  // Composed in place: building a string is what may have failed.
  if (path != nullptr) set_last_error(code, 0, {call, ": ", what, " ('", path, "')"});
  else set_last_error(code, 0, {call, ": ", what});
  try {
    log::warn("{}", last_error_message());
  } catch (...) {
  }
  return code;
}

Error fail(Error e) {
  set_last_error(e);
  return e;
}

Error last_error() noexcept {
  const LastError& le = t_last_error;
  Error e{le.code, le.sys_errno, {}};
  try {
    e.message.assign(le.message);
  } catch (...) {
    // No memory for the copy: the code says what kind of failure; wc_last_error has the text.
  }
  return e;
}

std::size_t StripedCounter::stripe() noexcept {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
  return mine;
}

namespace {
// WEIGHTCACHE_COMMIT_WRITE_BACK=off leaves a commit that flushes nothing without its write-back
// start (finalize), as before it had one: only so that the benchmark measures both in one run.
bool commit_write_back_wanted() noexcept {
  const char* v = std::getenv("WEIGHTCACHE_COMMIT_WRITE_BACK");
  return v == nullptr || std::strcmp(v, "off") != 0;
}
}  // namespace

Core::Core(const Options& options, platform::Platform& pf)
    : pf_(pf),
      opts_(options),
      index_(format::process_hash_seed()),
      opener_forks_(platform::fork_generation()),
      opener_pid_(pf.process_id()),
      commit_write_back_(commit_write_back_wanted()) {
  compat_hash_ = format::hash_bytes(opts_.compat_key);
  if (opts_.max_file_bytes == 0) opts_.max_file_bytes = default_max_file_bytes(pf_);
  align_ = opts_.alignment;
  gran_ = std::max<std::size_t>(kMapGranularity, pf_.map_granularity());
}

Core::~Core() {
  stop_verify_ahead();
  if (in_forked_child()) {
    // The lease, the file's tail and every mutex belong to the parent, which goes on using them:
    // a flock is shared with it through the inherited descriptor (unlocking here would unlock
    // the parent), trimming the tail would cut pages under the parent's reservations (SIGBUS
    // there), and a mutex or condition variable held or waited on by a parent thread at the
    // fork stays so forever here. Drop only what is this process's own: its view of the
    // mappings and its descriptors (the parent's keep the lock): the members do that as they go.
    (void)verify_sync_.release();
    (void)trust_.release();  // its mutex too (the parent's verify-ahead thread may hold it)
    // And the parent's write-back thread's; where that thread ended before the fork, this orders
    // all it did (it read the descriptor) before the child closes the descriptor.
    (void)write_back_sync_->running.load(std::memory_order_acquire);
    (void)write_back_sync_.release();
    (void)write_back_thread_.release();  // the parent's thread: neither joinable nor destructible here
    return;
  }
  // The write-back thread uses the descriptor: done before it closes.
  wait_for_write_back();
  // What this process verified, for the next one (before the trim, which may change the file).
  publish_verification();
  MutexLock lock(write_mu_);
  // A destructor is a boundary: trimming is best effort (out of memory for a message or a
  // slot's index skips it); the mappings and files are given back by their members whatever
  // happens.
  try {
    trim_on_close_locked();
  } catch (...) {
    absorb_exception("wc_close");
  }
  // A writer's last state, verified and recorded by the writer itself: after the trim (which
  // changes the file), before the unmap (it hashes through the mapping).
  record_own_commits_locked();
  try {
    unmap_on_close_locked();
  } catch (...) {
    absorb_exception("wc_close");
  }
  release_lease_locked();
}

void Core::trim_on_close_locked() {
  if (has_lease_) {
    // Drop what was grown but never committed so the file ends at its footer again. Only this
    // process (holding the lease) may have touched bytes past the committed size.
    const std::uint64_t keep = std::max(committed_.committed_size, written_size_);
    if (file_size_ > keep && committed_.committed_size >= format::kHeaderSize) {
      if (auto r = pf_.truncate(fd_, keep); !r)
        log::debug("could not trim uncommitted tail of '{}': {}", opts_.path, r.error().message);
    }
    release_lease_locked();
  }
}

void Core::unmap_on_close_locked() {
  // Unmapped first: see below.
  space_.release();
  // Where the OS refuses to shrink a mapped file (Windows), the trim above failed, and where
  // mapping itself extends a file (Windows' legacy mapping mode rounds it up to 64 KiB) the file
  // grew without our knowing: now that nothing of ours is mapped, cut the uncommitted tail if no
  // other writer is at work. The real size decides, not the size we last set.
  bool grown = false;
  if (file_backed_ && !opts_.read_only && fd_.is_open() && lease_file().is_open()) {
    auto info = pf_.stat_file(fd_);
    grown = info && info->size > committed_.committed_size;
  }
  if (grown) {
    // The whole lease (the data file's lock too): a writer on another name of this file (a
    // hard link) holds its own sidecar, and the tail we would cut is the one it is filling.
    if (auto got = try_lock_both_locked(); got && got.value()) {
      has_lease_ = true;
      if (auto info = pf_.stat_file(fd_); info) {
        std::vector<format::IndexRecord> records;
        if (auto slot = read_latest_slot(0, &records, &info.value()); slot && info->size > slot->committed_size)
          (void)pf_.truncate(fd_, slot->committed_size);
      }
      release_lease_locked();
    }
  }
}

std::uint64_t Core::round_size(std::uint64_t size) const noexcept {
  return align_up(std::max<std::uint64_t>(size, 1), opts_.size_alignment);
}


// ---------------------------------------------------------------------------------------------
// reader API
// ---------------------------------------------------------------------------------------------

std::size_t Core::look_up(std::string_view key) {
  if (key.size() > kMaxKeySize) {  // cannot be in any cache; say why instead of a bare miss
    try {
      set_last_error({Errc::invalid_argument, 0,
                      "key size " + std::to_string(key.size()) + " is over the limit of " + std::to_string(kMaxKeySize)});
    } catch (...) {
      set_last_error({Errc::invalid_argument, 0, {}});  // no memory for the message: the code still says it
    }
    misses_.add();
    return kNotFound;
  }
  Entry* e = find_entry(key);
  if (e == nullptr && opts_.refresh_on_miss && (file_backed_ || awaiting_file_.load(std::memory_order_acquire))) {
    if (write_mu_.try_lock()) {
      bool refreshed = false;
      try {
        refreshed = bool(refresh_locked());
      } catch (...) {
        write_mu_.unlock();
        throw;
      }
      write_mu_.unlock();
      if (refreshed) e = find_entry(key);
    }
  }
  if (e == nullptr || !verify_entry(e)) {
    misses_.add();
    return kNotFound;
  }
  hits_.add();
  return static_cast<std::size_t>(e->offset);
}

void* Core::offset_to_addr(std::size_t offset, bool replaced_too) const {
  if (offset == kNotFound) return nullptr;
  const Entry* e = index_.find_offset(offset);
  // An entry whose checksum failed is never data, even for an offset learned some other way.
  if (e == nullptr || e->state.load(std::memory_order_acquire) == kBad) return nullptr;
  // Nor is one replaced under its key (here or, after a refresh, by another process): the key
  // names other bytes now, as it does for a process that opens the file afresh. An entry moved
  // from the heap into the file holds the same bytes: its file copy decides.
  if (!replaced_too) {
    const Entry* live = e;
    for (const Entry* m = live->moved.load(std::memory_order_acquire); m != nullptr;
         m = live->moved.load(std::memory_order_acquire))
      live = m;
    if (live->replaced.load(std::memory_order_acquire)) return nullptr;
  }
  return addr(offset);
}

Result<void> Core::refresh() {
  if (in_forked_child()) return fail(inherited_refusal("refresh"));
  if (!file_backed_ && !awaiting_file_.load(std::memory_order_acquire)) return {};
  MutexLock lock(write_mu_);
  lease_gave_up_ = false;  // the next allocation may wait for the lease again
  auto r = refresh_locked();
  if (!r) return fail(r.error());
  return {};
}

Result<void> Core::refresh_locked() {
  if (awaiting_file_.load(std::memory_order_relaxed)) return try_attach_locked();
  if (!file_backed_ || !fd_.is_open()) return {};
  auto info = pf_.stat_file(fd_);
  if (!info) return info.error();
  std::vector<format::IndexRecord> records;
  auto slot = read_latest_slot(committed_.sequence, &records, &info.value());
  if (!slot) {
    log::warn("'{}': cannot read entries committed by other processes: {}", opts_.path, slot.error().message);
    return slot.error();
  }
  if (slot->sequence <= committed_.sequence) return {};
  if (slot->committed_size > file_span_)
    return Error{Errc::no_space, 0, "file grew past max_file_bytes; reopen with a larger max_file_bytes"};
  file_size_ = std::max(file_size_, info->size);
  publish_sizes_locked();
  if (auto r = ensure_mapped_locked(slot->committed_size); !r) return r.error();
  committed_ = slot.value();
  publish_sizes_locked();
  merge_records_locked(records);
  return {};
}

Stats Core::stats() const {
  Stats s;
  // Never takes write_mu_: a writer may hold it while it waits for another process's lease.
  s.file_bytes = file_backed_ ? seen_file_size_.load(std::memory_order_relaxed) : 0;
  const std::uint64_t committed = seen_committed_.load(std::memory_order_relaxed);
  const std::uint64_t index_bytes = seen_trailer_.load(std::memory_order_relaxed);
  const std::uint64_t durable_live = durable_live_.load(std::memory_order_relaxed);
  s.entries = index_.live_count();
  s.mapped_bytes = mapped_bytes_.load();
  s.heap_bytes = heap_bytes_.load();
  s.mappings = mappings_.load();
  s.hits = hits_.load();
  s.misses = misses_.load();
  s.backing = file_backed_ ? Backing::file : Backing::heap;
  if (committed > format::kHeaderSize + index_bytes + durable_live)
    s.dead_bytes = committed - format::kHeaderSize - index_bytes - durable_live;
  s.verify_failures = verify_failures_.load();
  s.heap_fallbacks = heap_fallbacks_.load();
  s.commits = commits_.load();
  s.alignment = align_;
  s.verified_ahead = verified_ahead_.load(std::memory_order_relaxed);
  s.trusted_entries = trusted_entries_.load(std::memory_order_relaxed);
  s.prebuilt = prebuilt_.load(std::memory_order_relaxed) ? 1 : 0;
  s.lease_timeouts = lease_timeouts_.load(std::memory_order_relaxed);
  s.unpersisted_entries = unpersisted_entries_.load(std::memory_order_relaxed);
  s.unpersisted_bytes = unpersisted_bytes_.load(std::memory_order_relaxed);
  s.compactions = compactions_.load(std::memory_order_relaxed);
  return s;
}


}  // namespace weightcache
