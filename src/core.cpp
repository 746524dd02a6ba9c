#include "core.hpp"

#include "compact.hpp"
#include "file_state.hpp"
#include "log.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <system_error>
#include <thread>

namespace weightcache {
namespace {

// Entry::state. kVerifying: one thread (a look-up or the verify-ahead thread) is hashing it;
// others wait for its verdict instead of hashing the same bytes again.
constexpr std::uint8_t kUnverified = 0, kGood = 1, kBad = 2, kVerifying = 3;
// Verify ahead only when there is enough to gain from a second core.
constexpr std::uint64_t kVerifyAheadMinBytes = 16ull << 20;
// Entries this big have their pages mapped in one call before they are hashed.
constexpr std::uint64_t kPopulateMinBytes = 256ull << 10;
// Entries are hashed in pieces of this size, each mapped in one call just before: the
// verify-ahead thread looks at its stop flag between pieces, so close waits for one piece at
// most (~0.5 ms warm, a few ms from disk), never for a whole multi-GiB entry.
constexpr std::uint64_t kHashChunk = 8ull << 20;
// File entries this big are looked up in the file system's allocation map before they are read:
// a range without disk blocks in one is corruption (the writer allocates every byte with
// posix_fallocate before it writes), and reading a hole costs as much as reading data (a hostile
// 100 GiB sparse entry took 67 s). Below it, hashing even a hole costs ~10 ms at most.
constexpr std::uint64_t kHoleCheckMinBytes = 16ull << 20;
constexpr std::uint64_t kMinChunk = 1ull << 20;       // first growth of the file
constexpr std::uint64_t kMapGranularity = 1ull << 16;  // Windows' allocation granularity; a
                                                       // multiple of every page size we know
// The largest default reservation for a file, and the share of the address space it may take:
// 1/512 leaves room for hundreds of caches (400 take 78% at most) and for the host.
constexpr std::uint64_t kMaxDefaultFileSpan = 256ull << 30;
constexpr std::uint64_t kDefaultSpanShare = 512;
// No entry or reservation is larger (the format allows more; no machine has that memory).
// In a 32-bit process, more than half the address space is as implausible as 2^48 is in a 64-bit
// one (and SIZE_MAX itself is below 2^48 there).
constexpr std::uint64_t kMaxEntrySize =
    sizeof(std::size_t) >= 8 ? 1ull << 48 : static_cast<std::uint64_t>(SIZE_MAX / 2);
constexpr const char* kMaxEntrySizeText =
    sizeof(std::size_t) >= 8 ? "2^48 bytes" : "2^31 - 1 bytes (half the address space)";

thread_local Error t_last_error;

// Seeds the index's key hash: a hostile file cannot pick keys that collide in this process's
// tables without knowing it.
std::uint64_t process_key_seed() noexcept {
  static const std::uint64_t seed = [] {
    std::uint64_t v = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    try {
      std::random_device rd;
      v ^= (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    } catch (...) {
      // No entropy source: the clock alone still differs from run to run.
    }
    return v;
  }();
  return seed;
}

// Which cache of this process holds the writer lease on a lock file (by the lock file's identity):
// a second cache of the same path, opened after the file there was replaced, must not wait for the
// lease its own process holds.
struct LeaseHolders {
  std::mutex mu;
  std::map<std::pair<std::uint64_t, std::uint64_t>, const Core*> by_lock_file;
};
LeaseHolders& lease_holders() {
  static LeaseHolders* h = new LeaseHolders();  // outlives static destructors of hosts
  return *h;
}

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }
bool is_pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
std::uint64_t floor_pow2(std::uint64_t v) { return v == 0 ? 0 : std::uint64_t{1} << (63 - std::countl_zero(v)); }

// max_file_bytes when the caller leaves it 0: a share of what this process may reserve. A
// 64-bit process has 128 TiB of user address space on every system we build for (47 bits); a
// 32-bit one 2 GiB for sure. RLIMIT_AS lowers it (reservations count against it).
std::uint64_t default_max_file_bytes(const platform::Platform& pf) noexcept {
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

const char* errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::ok: return "WC_OK";
    case Errc::invalid_argument: return "WC_ERR_INVALID_ARGUMENT";
    case Errc::io: return "WC_ERR_IO";
    case Errc::no_space: return "WC_ERR_NO_SPACE";
    case Errc::corrupt: return "WC_ERR_CORRUPT";
    case Errc::incompatible: return "WC_ERR_INCOMPATIBLE";
    case Errc::busy: return "WC_ERR_BUSY";
    case Errc::unsupported: return "WC_ERR_UNSUPPORTED";
    case Errc::no_memory: return "WC_ERR_NO_MEMORY";
    case Errc::read_only: return "WC_ERR_READ_ONLY";
  }
  return "WC_ERR_UNKNOWN";
}

void set_last_error(const Error& e) {
  try {
    t_last_error = e;
  } catch (...) {
  }
}

Error fail(Error e) {
  set_last_error(e);
  return e;
}

const Error& last_error() noexcept { return t_last_error; }

std::size_t StripedCounter::stripe() noexcept {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
  return mine;
}

Core::Core(const Options& options, platform::Platform& pf)
    : pf_(pf),
      opts_(options),
      index_(process_key_seed()),
      opener_forks_(platform::fork_generation()),
      opener_pid_(pf.process_id()) {
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
    // mappings and its descriptors (the parent's keep the lock).
    (void)verify_sync_.release();
    pf_.release_address_space(base_, va_size_);
    pf_.close_file(fd_);
    if (lock_fd_ != fd_) pf_.close_file(lock_fd_);
    return;
  }
  std::lock_guard<std::mutex> lock(write_mu_);
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
  pf_.release_address_space(base_, va_size_);
  // Where the OS refuses to shrink a mapped file (Windows), the trim above failed, and where
  // mapping itself extends a file (Windows' legacy mapping mode rounds it up to 64 KiB) the file
  // grew without our knowing: now that nothing of ours is mapped, cut the uncommitted tail if no
  // other writer is at work. The real size decides, not the size we last set.
  const auto grown = [&] {
    if (!file_backed_ || opts_.read_only || fd_ == platform::kInvalidHandle || lock_fd_ == platform::kInvalidHandle)
      return false;
    auto info = pf_.stat_file(fd_);
    return info && info->size > committed_.committed_size;
  };
  if (grown()) {
    // The whole lease (the data file's lock too): a writer on another name of this file (a
    // hard link) holds its own sidecar, and the tail we would cut is the one it is filling.
    if (auto got = try_lock_both_locked(); got && got.value()) {
      has_lease_ = true;
      if (auto info = pf_.stat_file(fd_); info) {
        std::vector<format::IndexRecord> records;
        if (auto slot = read_latest_slot(0, &records, info->size); slot && info->size > slot->committed_size)
          (void)pf_.truncate(fd_, slot->committed_size);
      }
      release_lease_locked();
    }
  }
  pf_.close_file(fd_);
  if (lock_fd_ != fd_) pf_.close_file(lock_fd_);  // a descriptor cache leases the file itself
}

std::uint64_t Core::round_size(std::uint64_t size) const noexcept {
  return align_up(std::max<std::uint64_t>(size, 1), opts_.size_alignment);
}

// ---------------------------------------------------------------------------------------------
// open
// ---------------------------------------------------------------------------------------------

Result<std::shared_ptr<Core>> Core::open(const Options& options, platform::Platform& pf) noexcept {
  try {
    if (!is_pow2(options.alignment) || options.alignment > kMaxAlignment)
      return fail({Errc::invalid_argument, 0,
                   "alignment must be a power of two between 1 and 16 MiB (got " +
                       std::to_string(options.alignment) + ")"});
    if (!is_pow2(options.size_alignment) || options.size_alignment > kMaxAlignment)
      return fail({Errc::invalid_argument, 0,
                   "size_alignment must be a power of two between 1 and 16 MiB (got " +
                       std::to_string(options.size_alignment) + ")"});
    if (options.max_file_bytes != 0 && options.max_file_bytes < (1u << 20))
      return fail({Errc::invalid_argument, 0, "max_file_bytes must be 0 (the default: sized to fit the process) or at "
                                              "least 1 MiB"});
    if ((options.file_mode & ~0777u) != 0)
      return fail({Errc::invalid_argument, 0,
                   "file_mode may hold permission bits only (0777 at most; no setuid, setgid or sticky bit)"});

    if (options.compact_dead_percent > 100)
      return fail({Errc::invalid_argument, 0, "compact_dead_percent is a percentage (0 to 100)"});
    if (options.path.empty() && options.fd < 0 && options.backing == Backing::file)
      return fail({Errc::invalid_argument, 0, "backing=file needs a path; leave it empty only for a heap cache"});
    const bool want_file =
        (!options.path.empty() || options.fd >= 0) && options.backing != Backing::heap && !options.private_cache;
    std::optional<Error> file_error;
    if (want_file) {
      auto core = std::make_shared<Core>(options, pf);
      auto r = core->init_file();
      if (r) {
        core->start_verify_ahead();
        return core;
      }
      if (options.backing == Backing::file) return fail(r.error());
      if (options.read_only && r.error().sys_errno == ENOENT) {
        // A reader that came before the writer: serve from memory until the file appears.
        log::warn("cache file '{}' does not exist yet; serving from memory until it does (wc_refresh, or a miss "
                  "with refresh_on_miss, picks it up)",
                  options.path);
        core->await_file(r.error());
        return core;
      }
      file_error = r.error();
    }
    Options heap_opts = options;
    auto core = std::make_shared<Core>(heap_opts, pf);
    if (auto r = core->init_heap_only(); !r) return fail(r.error());
    if (file_error) {
      // The file may have failed for want of memory (address space): promise a heap cache only
      // once its first chunk is there.
      if (auto r = core->ready_heap(); !r) {
        log::error("cannot use cache file '{}' ({}: {}), and no memory for a heap cache either ({})", options.path,
                   errc_name(file_error->code), file_error->message, r.error().message);
        return fail({r.error().code, r.error().sys_errno,
                     "cannot use cache file '" + options.path + "' (" + file_error->message +
                         "), and no memory for a heap cache either: " + r.error().message});
      }
      log::warn("cannot use cache file '{}' ({}: {}); falling back to a heap cache for this process",
                options.path, errc_name(file_error->code), file_error->message);
      core->set_heap_reason(*file_error);  // finalize reports inserted entries as not durable
    }
    return core;
  } catch (const std::bad_alloc&) {
    return fail({Errc::no_memory, 0, "out of memory while opening the cache"});
  } catch (...) {
    return fail({Errc::io, 0, "unexpected failure while opening the cache"});
  }
}

Result<void> Core::reserve_address_space(std::uint64_t file_span) noexcept {
  // 2 MiB at least: the page cache holds ext4 files in large folios, and a mapping whose
  // addresses line up with file offsets modulo 2 MiB faults them in whole (a 256 MiB fill takes
  // ~10k faults instead of ~44k, 4-6x faster; docs/BENCHMARKS.md).
  const std::size_t va_align = std::max<std::size_t>({align_, gran_, std::size_t{2} << 20});
  // The heap arena is not in this range (it reserves chunks of its own as it fills), so heap
  // offsets start right after the file's: keep that start aligned like the base.
  file_span = align_up(std::max<std::uint64_t>(file_span, kMinChunk), va_align);
  const std::uint64_t asked = file_span;
  // The full range first; when the address space is short (RLIMIT_AS, 32-bit, hundreds of caches
  // open) halve it: a smaller file is better than no cache. Offsets past the span go to the heap.
  for (;;) {
    auto r = file_span <= SIZE_MAX ? pf_.reserve_address_space(static_cast<std::size_t>(file_span), va_align)
                                   : Result<void*>(Error{Errc::no_memory, 0, "address space too small"});
    if (r) {
      base_ = static_cast<std::byte*>(r.value());
      file_span_ = file_span;
      va_size_ = file_span;
      if (file_span < asked)
        log::warn("'{}': only {} MiB of address space could be reserved for the file (max_file_bytes asks {} MiB); "
                  "the file cannot grow past it",
                  opts_.path, file_span >> 20, asked >> 20);
      return {};
    }
    if (file_span <= va_align || file_span <= kMinChunk) return r.error();
    file_span = align_up(file_span / 2, va_align);
  }
}

Result<void> Core::init_heap_only() noexcept {
  // Nothing to reserve up front: the heap arena takes address space chunk by chunk as it fills.
  file_backed_ = false;
  file_disabled_ = true;
  return {};
}

Result<void> Core::ready_heap() noexcept {
  // Room for a first megabyte (reserved and committed, the cursor left where it is): less would
  // be a heap cache in name only.
  std::lock_guard<std::mutex> lock(write_mu_);
  auto r = heap_.place(heap_cursor_, kMinChunk, align_, gran_);
  if (!r) return r.error();
  return {};
}

// ---------------------------------------------------------------------------------------------
// heap arena
// ---------------------------------------------------------------------------------------------

HeapArena::~HeapArena() {
  for (unsigned i = 0, n = count_.load(std::memory_order_acquire); i < n; ++i)
    pf_.release_address_space(chunks_[i].base, static_cast<std::size_t>(chunks_[i].size));
}

std::byte* HeapArena::addr(std::uint64_t off) const noexcept {
  // Chunks are in arena-offset order: the last one starting at or before `off` holds it.
  unsigned lo = 0, hi = count_.load(std::memory_order_acquire);
  if (hi == 0) return nullptr;
  while (hi - lo > 1) {
    const unsigned mid = (lo + hi) / 2;
    if (chunks_[mid].start <= off) lo = mid;
    else hi = mid;
  }
  return chunks_[lo].base + (off - chunks_[lo].start);
}

bool HeapArena::contains(const std::byte* p) const noexcept {
  for (unsigned i = 0, n = count_.load(std::memory_order_acquire); i < n; ++i)
    if (p >= chunks_[i].base && p < chunks_[i].base + chunks_[i].size) return true;
  return false;
}

bool HeapArena::find(const std::byte* p, std::uint64_t* off, std::uint64_t* room) const noexcept {
  for (unsigned i = 0, n = count_.load(std::memory_order_acquire); i < n; ++i) {
    const Chunk& c = chunks_[i];
    if (p < c.base || p >= c.base + c.size) continue;
    const auto at = static_cast<std::uint64_t>(p - c.base);
    *off = c.start + at;
    *room = c.committed > at ? c.committed - at : 0;
    return true;
  }
  return false;
}

Result<void> HeapArena::commit(Chunk& c, std::uint64_t end, std::uint64_t gran) noexcept {
  if (end <= c.committed) return {};
  // Geometric, as the file grows, but settle for just what is needed when memory is short.
  std::uint64_t target = std::min(std::max({align_up(end, gran), c.committed * 2, kMinChunk}), c.size);
  auto r = pf_.commit_memory(c.base + c.committed, static_cast<std::size_t>(target - c.committed));
  if (!r && target > align_up(end, gran)) {
    target = std::min(align_up(end, gran), c.size);
    r = pf_.commit_memory(c.base + c.committed, static_cast<std::size_t>(target - c.committed));
  }
  if (!r) return r.error();
  c.committed = target;
  return {};
}

Result<std::uint64_t> HeapArena::place(std::uint64_t from, std::uint64_t size, std::uint64_t align,
                                       std::uint64_t gran) noexcept {
  const unsigned n = count_.load(std::memory_order_relaxed);
  if (n > 0) {  // the rest of the last chunk
    Chunk& c = chunks_[n - 1];
    const std::uint64_t off = align_up(std::max(from, c.start), align);
    if (off + size >= off && off + size <= c.start + c.size) {
      if (auto r = commit(c, off - c.start + size, gran); !r) return r.error();
      return off;
    }
  }
  if (size > kMaxEntrySize) return Error{Errc::no_memory, 0, "heap arena exhausted"};
  if (n == kMaxChunks)
    return Error{Errc::no_memory, 0, "the heap arena is in too many pieces (address space short); reopen the cache"};
  // A new chunk after the last, aligned like the addresses it hands out. It doubles the arena
  // (so chunks stay few), or holds just this entry when the address space is short.
  const std::uint64_t chunk_align = std::max(align, gran);
  const std::uint64_t start = n == 0 ? 0 : align_up(chunks_[n - 1].start + chunks_[n - 1].size, chunk_align);
  const std::uint64_t need = align_up(std::max<std::uint64_t>(size, 1), gran);
  std::uint64_t want = std::max({need, reserved_, kMinChunk});
  Result<void*> r = Error{Errc::no_memory, 0, ""};
  for (;;) {
    r = want <= SIZE_MAX ? pf_.reserve_address_space(static_cast<std::size_t>(want), static_cast<std::size_t>(chunk_align))
                         : Result<void*>(Error{Errc::no_memory, 0, "address space too small"});
    if (r || want == need) break;
    want = std::max(need, align_up(want / 2, gran));
  }
  if (!r)
    return Error{r.error().code, r.error().sys_errno,
                 "cannot reserve " + std::to_string(need >> 20) + " MiB of address space for heap memory: " +
                     r.error().message};
  Chunk& c = chunks_[n];
  c.start = start;
  c.size = want;
  c.committed = 0;
  c.base = static_cast<std::byte*>(r.value());
  if (auto cr = commit(c, size, gran); !cr) {
    pf_.release_address_space(c.base, static_cast<std::size_t>(c.size));
    c = Chunk{};
    return Error{cr.error().code, cr.error().sys_errno, "cannot commit heap memory: " + cr.error().message};
  }
  reserved_ += want;
  count_.store(n + 1, std::memory_order_release);
  return start;
}

std::string Core::source_problem(const void* ptr, std::uint64_t size) {
  const auto* p = static_cast<const std::byte*>(ptr);
  if (!(base_ != nullptr && p >= base_ && p < base_ + file_span_) && !heap_.contains(p))
    return {};  // the caller's own memory: its size is the caller's word
  std::lock_guard<std::mutex> lock(write_mu_);
  std::uint64_t at = 0, room = 0;
  if (!offset_of(p, &at, &room)) return {};
  const std::string n = std::to_string(size);
  if (auto it = reservations_.upper_bound(at); it != reservations_.begin()) {
    --it;
    const auto& [start, r] = *it;
    if (at - start < r.capacity) {
      if (at == start && size > r.capacity)
        return "size " + n + " is larger than the reservation at ptr (" + std::to_string(r.capacity) +
               " bytes reserved); reserve at least the size you insert";
      if (size > start + r.capacity - at)
        return "ptr lies " + std::to_string(at - start) + " bytes into a reservation of " +
               std::to_string(r.capacity) + " bytes, and size " + n + " runs past its end";
      return {};
    }
  }
  if (const Entry* e = index_.containing(at)) {
    if (size > e->offset + e->size - at)
      return "ptr lies " + std::to_string(at - e->offset) + " bytes into the entry at offset " +
             std::to_string(e->offset) + " (" + std::to_string(e->size) + " bytes), and size " + n +
             " runs past its end";
    return {};
  }
  // Elsewhere in the cache's memory (free space, an index): only as far as it can be read.
  if (at < file_span_) room = std::min(room, file_size_ > at ? file_size_ - at : 0);
  if (size > room)
    return "ptr lies in the cache's own memory with " + std::to_string(room) + " readable bytes after it, and size " +
           n + " runs past them";
  return {};
}

bool Core::offset_of(const void* ptr, std::uint64_t* offset, std::uint64_t* room) const noexcept {
  const auto* p = static_cast<const std::byte*>(ptr);
  if (base_ != nullptr && p >= base_ && p < base_ + file_span_) {
    *offset = static_cast<std::uint64_t>(p - base_);
    *room = mapped_end_ > *offset ? mapped_end_ - *offset : 0;
    return true;
  }
  std::uint64_t arena_off = 0;
  if (!heap_.find(p, &arena_off, room)) return false;
  *offset = file_span_ + arena_off;
  return true;
}

namespace {

// With allow_symlink, everything (the lease's lock file, temporary files, the rename of a rebuilt
// file) must be about the file the link names, not the link: two processes opening the cache
// through a link and through its target must share one lease.
std::string resolve_symlinks(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p = fs::u8path(path);  // UTF-8 on every platform (Windows would read the ANSI code page)
  std::error_code ec;
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  const auto u8 = p.lexically_normal().u8string();
  return std::string(u8.begin(), u8.end());
}

// Temporary files of a process that died while building a cache file. Called under the lease,
// when no other process can be writing one.
void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::u8path(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const auto prefix = p.filename().u8string() + u8".tmp.";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().u8string();
    if (name.compare(0, prefix.size(), prefix) == 0) fs::remove(it->path(), ec);
  }
}

}  // namespace

Result<void> Core::init_file() noexcept {
  file_backed_ = true;
  if (opts_.fd >= 0 || opts_.path == kMemoryPath) return init_descriptor();
  try {
    if (opts_.allow_symlink) opts_.path = resolve_symlinks(opts_.path);
  } catch (...) {
    return Error{Errc::no_memory, 0, "out of memory while resolving the cache path"};
  }
  lock_path_ = opts_.path + ".lock";
  if (auto r = reserve_address_space(opts_.max_file_bytes); !r) return r.error();

  if (!opts_.read_only) {
    auto lk = pf_.open_file(lock_path_, platform::OpenMode::lock_file, opts_.file_mode, opts_.allow_symlink);
    if (!lk) {
      const int err = lk.error().sys_errno;
      if (err != EACCES && err != EROFS && err != EPERM) return lk.error();
      // A cache shipped in a read-only place (a system image, another user's directory) is still
      // worth mapping; but a caller who asked for a writable file cache must hear it cannot be.
      if (opts_.backing == Backing::file)
        return Error{Errc::read_only, err,
                     "cannot create the lock file '" + lock_path_ + "' (" + lk.error().message +
                         "); a writable cache needs it beside the file. Make the directory writable, or open "
                         "with read_only to use the cache without adding entries"};
      log::warn("cannot create the lock file '{}' ({}); using the cache read-only", lock_path_, lk.error().message);
      make_read_only("its lock file '" + lock_path_ + "' cannot be created");
    } else {
      lock_fd_ = lk.value();
      if (auto id = pf_.stat_file(lock_fd_)) lock_identity_ = {id->device, id->inode};
    }
  }

  const auto deadline = std::chrono::steady_clock::now() + opts_.lease_timeout;
  for (int round = 0;; ++round) {
    auto opened = open_in_use(deadline);
    if (!opened) {
      if (opened.error().sys_errno != ENOENT || opts_.read_only) return opened.error();
      if (auto r = create_missing_file(); !r) return r;
      continue;
    }
    // Opened shared, as every user: an exclusive lock is asked for only when this open wants to
    // replace the file (a rebuild, a compaction), so that ordinary opens never keep each other
    // out, not even for a moment. The upgrade succeeds only if no other process has it open.
    auto st = read_state();
    if (st) {
      if (round < 2 && compaction_due(st.value()) && upgrade_in_use()) {
        // Alone now; what others committed before we were alone is read again before copying.
        if (auto again = read_state(); again && compaction_due(again.value())) {
          if (compact_in_place(again.value())) continue;  // reopen the new file
          st = std::move(again);
        }
        if (auto r = pf_.try_lock_in_use(fd_, false); !r || !r.value()) continue;  // lost it: start again
      }
      return attach(st.value());
    }
    const Error& why = st.error();
    const bool rebuildable = why.code == Errc::corrupt || why.code == Errc::incompatible;
    if (!rebuildable || opts_.read_only) return why;
    if (!upgrade_in_use())
      return Error{Errc::busy, 0,
                   "cache file '" + opts_.path + "' is not usable (" + why.message +
                       ") and another process has it open, so it cannot be replaced now; the next open that finds "
                       "it unused rebuilds it"};
    if (round >= 2) return why;  // rebuilt, and still not usable: say why rather than loop
    log::warn("cache file '{}' is not usable ({}); building a fresh one", opts_.path, why.message);
    if (auto r = rebuild_file(); !r) return r;
  }
}

bool Core::upgrade_in_use() noexcept {
  if (opts_.read_only) return false;
  auto ex = pf_.try_lock_in_use(fd_, true);
  return ex && ex.value();
}

// A cache on a descriptor (the caller's, or a memfd for ":memory:"): no path to open, rename or
// lock beside, so the lease and the in-use lock are the file's own, an empty file is initialised
// in place, and an unusable one is rebuilt in place, only while nobody else has it open.
Result<void> Core::init_descriptor() noexcept {
  from_descriptor_ = true;
  const bool memory = opts_.fd < 0;
  try {
    if (opts_.path.empty()) opts_.path = "fd " + std::to_string(opts_.fd);
  } catch (...) {
    return Error{Errc::no_memory, 0, "out of memory"};
  }
  if (auto r = reserve_address_space(opts_.max_file_bytes); !r) return r.error();
  auto h = memory ? pf_.create_anonymous("weightcache") : pf_.reopen(opts_.fd, !opts_.read_only);
  if (!h && !memory && h.error().code == Errc::read_only && opts_.backing != Backing::file) {
    // A read-only descriptor: serve its entries, add none (as for a read-only file).
    log::warn("'{}': {}; using the cache read-only", opts_.path, h.error().message);
    opts_.read_only = true;
    try {
      read_only_why_ = "its descriptor was opened read-only";
    } catch (...) {
    }
    h = pf_.reopen(opts_.fd, false);
  }
  if (!h) return h.error();
  fd_ = h.value();
  if (!opts_.read_only) {
    lock_fd_ = fd_;  // the writer lease: the file's own flock
    if (auto id = pf_.stat_file(fd_)) lock_identity_ = {id->device, id->inode};
  }
  const auto deadline = std::chrono::steady_clock::now() + opts_.lease_timeout;
  auto backoff = std::chrono::microseconds(200);
  auto wait = [&](const char* why) -> Result<void> {
    if (std::chrono::steady_clock::now() >= deadline)
      return Error{Errc::busy, 0, "'" + opts_.path + "' " + why + " for longer than lease_timeout"};
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
    return {};
  };
  for (int round = 0;; ++round) {
    // Shared, as every user; exclusive only to initialise or rebuild the file (see init_file).
    auto sh = pf_.try_lock_in_use(fd_, false);
    if (sh && !sh.value()) {
      if (auto r = wait("was being rebuilt by another process"); !r) return r;
      continue;
    }
    auto info = pf_.stat_file(fd_);
    if (!info) return info.error();
    if (info->size == 0) {
      if (opts_.read_only) return Error{Errc::corrupt, 0, "'" + opts_.path + "' is empty: no cache was written to it"};
      if (!upgrade_in_use()) {  // another process is initialising it
        if (auto r = wait("stayed empty while another process had it open"); !r) return r;
        continue;
      }
      if (auto st = pf_.stat_file(fd_); st && st->size == 0)  // still empty now that we are alone
        if (auto r = write_empty_cache_in_place(); !r) return r;
      continue;  // downgraded by the next round's shared request
    }
    auto st = read_state();
    if (st) return attach(st.value());
    const Error& why = st.error();
    const bool rebuildable = why.code == Errc::corrupt || why.code == Errc::incompatible;
    if (!rebuildable || opts_.read_only || round >= 2) return why;
    if (!upgrade_in_use())
      return Error{Errc::busy, 0,
                   "'" + opts_.path + "' is not usable (" + why.message +
                       ") and another process has it open, so it cannot be rebuilt now"};
    log::warn("'{}' is not usable ({}); rebuilding it in place", opts_.path, why.message);
    if (auto r = pf_.truncate(fd_, 0); !r) return r.error();
    if (auto r = write_empty_cache_in_place(); !r) return r;
  }
}

Result<void> Core::write_empty_cache(platform::Handle h) noexcept {
  format::HeaderFixed fixed;
  fixed.alignment = align_;
  fixed.size_alignment = opts_.size_alignment;
  fixed.compat_hash = compat_hash_;
  format::CommitSlot slot;
  slot.sequence = 1;
  try {
    const auto trailer = format::encode_trailer({}, format::kHeaderSize, &slot);
    const auto header = format::encode_header(fixed, {}, slot);
    // Index first, header last: a reader never sees a header naming an index not yet written.
    if (auto r = pf_.write_at(h, trailer.data(), trailer.size(), format::kHeaderSize); !r) return r.error();
    if (opts_.durability == Durability::full)
      if (auto r = pf_.sync(h); !r) return r.error();
    if (auto r = pf_.write_at(h, header.data(), header.size(), 0); !r) return r.error();
    if (opts_.durability == Durability::full)
      if (auto r = pf_.sync(h); !r) return r.error();
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while initialising '" + opts_.path + "'"};
  }
  return {};
}

Result<void> Core::write_empty_cache_in_place() noexcept {
  if (auto r = write_empty_cache(fd_); !r) return r;
  log::info("initialised cache file '{}'", opts_.path);
  return {};
}

void Core::make_read_only(std::string why) noexcept {
  opts_.read_only = true;
  try {
    read_only_why_ = std::move(why);
  } catch (...) {
  }
  if (lock_fd_ != platform::kInvalidHandle) {
    pf_.close_file(lock_fd_);
    lock_fd_ = platform::kInvalidHandle;
  }
}

Result<bool> Core::open_in_use(std::chrono::steady_clock::time_point deadline) noexcept {
  auto backoff = std::chrono::microseconds(200);
  for (;;) {
    pf_.close_file(fd_);
    fd_ = platform::kInvalidHandle;
    auto fd = pf_.open_file(opts_.path, opts_.read_only ? platform::OpenMode::read : platform::OpenMode::read_write,
                            opts_.file_mode, opts_.allow_symlink);
    if (!fd && !opts_.read_only && (fd.error().sys_errno == EACCES || fd.error().sys_errno == EROFS ||
                                    fd.error().sys_errno == EPERM)) {
      // A file we may read but not write (mode 0444, a read-only mount): its entries are still
      // worth serving. A caller who asked for a writable file cache hears that it cannot be.
      if (opts_.backing == Backing::file)
        return Error{Errc::read_only, fd.error().sys_errno,
                     fd.error().message + " Open it with read_only to use its entries without adding new ones."};
      log::warn("cannot open '{}' for writing ({}); using the cache read-only", opts_.path, fd.error().message);
      make_read_only("the file '" + opts_.path + "' is not writable");
      continue;
    }
    if (!fd) return fd.error();
    fd_ = fd.value();
    // Shared, as every user holds it. An exclusive holder is rebuilding, compacting or deleting
    // the file: wait.
    {
      auto sh = pf_.try_lock_in_use(fd_, false);
      if (!sh) {
        // No such lock here (a filesystem without byte-range locks): use the file all the same;
        // nothing of ours replaces it then, because nothing can prove it unused.
        log::debug("'{}': no in-use lock ({}); the file is never replaced or compacted from here", opts_.path,
                   sh.error().message);
      } else if (!sh.value()) {
        if (std::chrono::steady_clock::now() >= deadline)
          return Error{Errc::busy, 0,
                       "'" + opts_.path + "' was being rebuilt, compacted or removed by another process for longer "
                       "than lease_timeout"};
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
        continue;
      }
    }
    // Locked: the path must still name this file (it may have been replaced or removed while we
    // waited), or we would hold a file no one else will ever open.
    auto at_path = pf_.stat_path(opts_.path, opts_.allow_symlink);
    auto ours = pf_.stat_file(fd_);
    if (!ours) return ours.error();
    if (!at_path && at_path.error().sys_errno != ENOENT) return at_path.error();
    if (!at_path || at_path->inode != ours->inode || at_path->device != ours->device) {
      if (std::chrono::steady_clock::now() >= deadline)
        return Error{Errc::busy, 0, "'" + opts_.path + "' kept being replaced for longer than lease_timeout"};
      continue;
    }
    return false;
  }
}

Result<void> Core::create_missing_file() noexcept {
  // Build under the lease so concurrent openers build once; re-check first: another process may
  // have put a file in place while we waited.
  pf_.close_file(fd_);
  fd_ = platform::kInvalidHandle;
  if (auto r = acquire_lease_locked(nullptr); !r) return r.error();
  Result<void> out;
  if (auto st = pf_.stat_path(opts_.path, opts_.allow_symlink); !st && st.error().sys_errno == ENOENT) {
    out = create_fresh_file();
  }
  release_lease_locked();
  return out;
}

Result<void> Core::rebuild_file() noexcept {
  // We hold the file alone (exclusive in-use lock on fd_): no process has it open, and any that
  // tries waits until the new file has taken the name. The lease keeps a creator of a missing
  // file, or the CLI, from racing us.
  if (auto r = acquire_lease_locked(nullptr, false); !r) return r.error();
  if (!pf_.replaces_open_files()) {  // Windows: the rename needs our handle closed, lock and all
    release_lease_locked();
    pf_.close_file(fd_);
    fd_ = platform::kInvalidHandle;
    if (auto r = acquire_lease_locked(nullptr, false); !r) return r.error();
  }
  auto out = create_fresh_file();
  release_lease_locked();
  // Let go of the unusable file only now (and before reopening: Windows refuses to replace, and
  // our caller reopens, a file this process still has open).
  pf_.close_file(fd_);
  fd_ = platform::kInvalidHandle;
  return out;
}

Result<void> Core::create_fresh_file() noexcept {
  try {
    remove_stale_temporaries(opts_.path);
  } catch (...) {
  }
  auto tmp = TempFile::create(pf_, opts_.path, opts_.file_mode);
  if (!tmp) return tmp.error();
  if (auto r = write_empty_cache(tmp->handle()); !r) return r;
  if (auto r = tmp->commit(opts_.durability != Durability::none); !r) return r.error();
  log::info("created cache file '{}'", opts_.path);
  return {};
}

bool Core::compaction_due(const CommittedState& st) const noexcept {
  if (opts_.compact_dead_percent == 0 || opts_.read_only) return false;
  // The share is of the file's data: everything but the header and the index in use. So a file
  // half of whose entries were replaced (a whole model repacked once) is due, which it would miss
  // by a header's worth if the header counted.
  const std::uint64_t dead = dead_bytes_of(st, state_size_);
  const std::uint64_t fixed = format::kHeaderSize + st.slot.index_size + format::kFooterSize;
  const std::uint64_t data = state_size_ > fixed ? state_size_ - fixed : 0;
  return dead > 0 && dead >= opts_.compact_min_dead_bytes && dead * 100 >= data * opts_.compact_dead_percent;
}

bool Core::compact_in_place(const CommittedState& st) noexcept {
  // Under the lease too: a writer reaching the file through another name (a hard link) would
  // hold the in-use lock as well, but the CLI and creators of a missing file take only the lease.
  if (auto r = acquire_lease_locked(nullptr, false); !r) {
    log::debug("'{}': not compacted at open: {}", opts_.path, r.error().message);
    return false;
  }
  CompactSettings settings;
  settings.durability = opts_.durability;
  CompactResult out;
  auto r = rewrite_compacted(pf_, fd_, opts_.path, st, state_size_, state_mode_, settings, &out, [this] {
    if (has_lease_) release_lease_locked();  // its data-file lock goes with the handle
    pf_.close_file(fd_);
    fd_ = platform::kInvalidHandle;
  });
  release_lease_locked();
  if (!r) {
    log::warn("'{}': could not compact the cache at open ({}: {}); using it as it is", opts_.path,
              errc_name(r.error().code), r.error().message);
    return false;
  }
  if (!out.rewritten) return false;
  log::info("'{}': compacted at open, {} -> {} bytes ({} entries)", opts_.path, out.bytes_before, out.bytes_after,
            out.entries);
  compactions_.fetch_add(1, std::memory_order_relaxed);
  pf_.close_file(fd_);  // the old file; its in-use lock goes with it
  fd_ = platform::kInvalidHandle;
  return true;
}

Result<CommittedState> Core::read_state() noexcept {
  auto info = pf_.stat_file(fd_);
  if (!info) return info.error();
  if (info->size < format::kHeaderSize)
    return Error{Errc::corrupt, 0, "file is shorter than its header (" + std::to_string(info->size) + " bytes)"};
  state_size_ = info->size;
  state_mode_ = info->mode;
  identity_ = {info->device, info->inode};
  auto st = read_committed(pf_, fd_, opts_.path, info->size, file_span_, 0);
  if (!st) return st.error();
  if (st->fixed.compat_hash != compat_hash_)
    return Error{Errc::incompatible, 0, "written for another compatibility key"};
  if (st->fixed.alignment % align_ != 0)
    return Error{Errc::incompatible, 0,
                 "written with alignment " + std::to_string(st->fixed.alignment) + ", below the " +
                     std::to_string(align_) + " asked for"};
  file_align_ = st->fixed.alignment;
  file_fixed_ = st->fixed;
  return st;
}

Result<void> Core::attach(CommittedState& st) noexcept {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (auto r = attach_locked(st); !r) return r;
  // When this cache was last used, for gc's least-recently-used order: the lock file's time, so
  // that opening never changes the cache file's.
  if (lock_fd_ != platform::kInvalidHandle && !from_descriptor_) pf_.touch(lock_fd_);
  log::debug("opened '{}': {} entries, {} bytes committed", opts_.path, st.records.size(), committed_.committed_size);
  return {};
}

Result<void> Core::attach_locked(CommittedState& st) noexcept {
  if (st.slot.committed_size > file_span_)
    return Error{Errc::no_space, 0, "file is larger than max_file_bytes; raise max_file_bytes"};
  file_size_ = state_size_;
  publish_sizes_locked();
  if (auto r = ensure_mapped_locked(st.slot.committed_size); !r) return r.error();
  committed_ = st.slot;
  publish_sizes_locked();
  merge_records_locked(st.records);
  return {};
}

void Core::await_file(const Error& why) noexcept {
  // The address space for the file is already reserved (init_file did that before it found no
  // file); refresh, or a miss with refresh_on_miss, attaches the file once it exists.
  file_backed_.store(false, std::memory_order_relaxed);
  file_disabled_ = true;
  set_heap_reason(why);
  awaiting_file_.store(true, std::memory_order_release);
}

Result<void> Core::try_attach_locked() noexcept {
  auto opened = open_in_use(std::chrono::steady_clock::now());  // no waiting: a later refresh tries again
  if (!opened) {
    pf_.close_file(fd_);
    fd_ = platform::kInvalidHandle;
    return opened.error().sys_errno == ENOENT ? Result<void>() : Result<void>(opened.error());
  }
  auto st = read_state();
  Result<void> r = st ? attach_locked(st.value()) : Result<void>(st.error());
  if (!r) {
    pf_.close_file(fd_);
    fd_ = platform::kInvalidHandle;
    return r;
  }
  awaiting_file_.store(false, std::memory_order_relaxed);
  file_backed_.store(true, std::memory_order_release);
  log::info("'{}': the cache file appeared; serving its {} entries", opts_.path, st->records.size());
  return {};
}

Result<format::CommitSlot> Core::read_latest_slot(std::uint64_t newer_than,
                                                  std::vector<format::IndexRecord>* records,
                                                  std::uint64_t file_size) noexcept {
  auto st = read_committed(pf_, fd_, opts_.path, file_size, file_span_, newer_than);
  if (!st) return st.error();
  if (st->fixed.compat_hash != compat_hash_)
    return Error{Errc::incompatible, 0, "written for another compatibility key"};
  file_align_ = st->fixed.alignment;
  file_fixed_ = st->fixed;
  if (st->fixed.alignment % align_ != 0)
    return Error{Errc::incompatible, 0,
                 "written with alignment " + std::to_string(st->fixed.alignment) + ", below the " +
                     std::to_string(align_) + " asked for"};
  *records = std::move(st->records);
  return st->slot;
}

// ---------------------------------------------------------------------------------------------
// index
// ---------------------------------------------------------------------------------------------

void Core::merge_records_locked(std::vector<format::IndexRecord>& records) noexcept {
  try {
    // write_mu_ is held: no other writer changes the index meanwhile.
    std::vector<Entry*> fresh;
    fresh.reserve(records.size());
    for (auto& r : records) {
      if (Entry* mine = find_entry(r.key); mine != nullptr && (mine->offset == r.offset || !mine->durable.load()))
        continue;  // already known, or ours and not yet committed: ours wins
      Entry* e = index_.make(r.key);
      e->offset = r.offset;
      e->size = r.size;
      e->checksum = r.checksum;
      e->in_file = true;
      e->durable.store(true, std::memory_order_relaxed);
      fresh.push_back(e);
    }
    if (opts_.verify == Verify::on_open) verify_all(fresh);
    index_.reserve(index_.live_count() + fresh.size(), index_.live_count() + fresh.size());
    for (Entry* e : fresh) {
      if (Entry* old = index_.publish(e); old != nullptr) {
        if (old->in_file) mapped_bytes_ -= old->size;
        else heap_bytes_ -= old->size;
      }
      mapped_bytes_ += e->size;
    }
  } catch (...) {
    log::error("out of memory while loading the index of '{}'", opts_.path);
  }
  recount_durable_locked();
}

void Core::recount_durable_locked() noexcept {
  std::uint64_t bytes = 0;
  index_.for_each_live([&](const Entry& e) {
    if (e.durable.load(std::memory_order_relaxed)) bytes += round_size(e.size);
  });
  durable_live_.store(bytes, std::memory_order_relaxed);
}

void Core::verify_all(const std::vector<Entry*>& entries) noexcept {
  // Checksumming is memory-bound per core: spread big loads over the cores (entries are never
  // split, so a single huge entry still takes one core).
  std::uint64_t total = 0;
  for (const auto& e : entries) total += e->size;
  const unsigned hw = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  const unsigned workers = total < (64ull << 20) ? 1 : hw;
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < entries.size(); i = next.fetch_add(1)) verify_entry(entries[i]);
  };
  std::vector<std::thread> threads;
  try {
    for (unsigned t = 1; t < workers; ++t) threads.emplace_back(work);
  } catch (...) {
    // No thread: the calling thread does all of it.
  }
  work();
  for (auto& t : threads) t.join();
}

bool Core::verify_entry(Entry* e) noexcept {
  std::uint8_t s = e->state.load(std::memory_order_acquire);
  if (s == kGood) return true;
  if (s == kBad) return false;
  if (opts_.verify == Verify::none) return true;
  for (;;) {
    if (s == kUnverified) {
      if (e->state.compare_exchange_weak(s, kVerifying, std::memory_order_acq_rel)) return finish_verify(e);
      continue;  // s now holds what another thread put there
    }
    if (s == kVerifying) {
      // Being hashed by another thread of this process: wait for its verdict. After a fork the
      // verify-ahead thread is gone in the child, and its claims with it: hash it ourselves.
      if (in_forked_child()) return check_bytes(e, nullptr) == Check::good;
      // A condition variable, not std::atomic::wait: libstdc++ 12's portable fallback (used on
      // Windows) can lose a wake-up, and this must never hang a look-up.
      std::unique_lock<std::mutex> lk(verify_sync_->mu);
      verify_sync_->cv.wait(lk, [&] { return e->state.load(std::memory_order_acquire) != kVerifying; });
      s = e->state.load(std::memory_order_acquire);
      continue;
    }
    return s == kGood;
  }
}

Core::Check Core::check_bytes(const Entry* e, const std::atomic<bool>* stop) const noexcept {
  if (e->in_file && e->size >= kHoleCheckMinBytes) {
    // A query the OS cannot answer, or fails, says nothing: the checksum still decides.
    if (auto hole = pf_.first_hole(fd_, e->offset, e->size); hole && hole.value() < e->offset + e->size)
      return Check::hole;
  }
  // Map each piece's pages in one call before hashing it (one fault per 64 KiB otherwise; 2-3x
  // slower for a warm file in large folios). It also asks the OS, without touching them, whether
  // the pages can be read at all: a file cut short under the mapping would SIGBUS the hash.
  const bool populate = e->in_file && e->size >= kPopulateMinBytes;
  const std::byte* p = addr(e->offset);
  if (e->size <= kHashChunk) {
    if (populate && !pf_.populate_read(const_cast<std::byte*>(p), e->size)) return Check::past_end;
    return format::hash_bytes(p, e->size) == e->checksum ? Check::good : Check::bad_checksum;
  }
  format::StreamHash h;
  if (!h.ok()) {  // no memory for the hash state: one piece, which no stop flag interrupts
    if (populate && !pf_.populate_read(const_cast<std::byte*>(p), e->size)) return Check::past_end;
    return format::hash_bytes(p, e->size) == e->checksum ? Check::good : Check::bad_checksum;
  }
  for (std::uint64_t done = 0; done < e->size;) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) return Check::stopped;
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kHashChunk, e->size - done));
    if (populate && !pf_.populate_read(const_cast<std::byte*>(p + done), n)) return Check::past_end;
    h.update(p + done, n);
    done += n;
  }
  return h.digest() == e->checksum ? Check::good : Check::bad_checksum;
}

bool Core::finish_verify(Entry* e, const std::atomic<bool>* stop) noexcept {
  const Check c = check_bytes(e, stop);
  if (c == Check::stopped) {  // closing: no verdict, as if never claimed
    e->state.store(kUnverified, std::memory_order_release);
    wake_verify_waiters();
    return false;
  }
  const bool ok = c == Check::good;
  e->state.store(ok ? kGood : kBad, std::memory_order_release);
  wake_verify_waiters();
  if (!ok) {
    ++verify_failures_;
    if (c == Check::past_end)
      log::warn("'{}': entry at offset {} ({} bytes) lies past the end of the file (was it truncated by another "
                "program?); serving a miss. Delete the file to rebuild it.",
                opts_.path, e->offset, e->size);
    else if (c == Check::hole)
      log::warn("'{}': entry at offset {} ({} bytes) has a hole (a range with no disk blocks, which no weightcache "
                "writer leaves: a damaged, forged or sparsely copied file); serving a miss without reading it. Delete "
                "the file to rebuild it.",
                opts_.path, e->offset, e->size);
    else
      log::warn("'{}': entry at offset {} ({} bytes) fails its checksum; serving a miss", opts_.path, e->offset,
                e->size);
  }
  return ok;
}

void Core::wake_verify_waiters() noexcept {
  // In a forked child nobody waits (a claimed entry is hashed by whoever finds it), and the
  // mutex may be held forever by a thread that did not survive the fork.
  if (in_forked_child()) return;
  // Taking the mutex orders the state store before any waiter's predicate check: no lost wake-up.
  { std::lock_guard<std::mutex> lk(verify_sync_->mu); }
  verify_sync_->cv.notify_all();
}

bool Core::in_forked_child() const noexcept {
  // Asked once per entry checked: one atomic load, not a getpid system call each time.
  if (opener_forks_ != platform::kForkGenerationUnknown) return platform::fork_generation() != opener_forks_;
  return pf_.process_id() != opener_pid_;
}

void Core::start_verify_ahead() noexcept {
  if (opts_.verify != Verify::first_use || !opts_.verify_ahead || std::thread::hardware_concurrency() < 2) return;
  try {
    std::vector<Entry*> todo;
    std::uint64_t bytes = 0;
    index_.for_each_live([&](Entry& e) {
      if (!e.in_file || e.state.load(std::memory_order_relaxed) != kUnverified) return;
      todo.push_back(&e);
      bytes += e.size;
    });
    if (bytes < kVerifyAheadMinBytes) return;
    // File order, starting from the middle byte: a host usually looks its weights up in the
    // order it packed them, so look-ups take the first half while this thread takes the second,
    // then wraps around for what is left. Both read forwards: on a cold page cache that keeps
    // two sequential streams with working read-ahead (reading backwards halved cold-load speed).
    std::sort(todo.begin(), todo.end(), [](const Entry* a, const Entry* b) { return a->offset < b->offset; });
    std::uint64_t half = 0;
    auto mid = todo.begin();
    while (mid != todo.end() && half < bytes / 2) half += (*mid++)->size;
    std::rotate(todo.begin(), mid, todo.end());
    const std::size_t count = todo.size();
    VerifySync* sync = verify_sync_.get();
    sync->ahead_running.store(true, std::memory_order_relaxed);
    try {
      std::thread([this, sync, todo = std::move(todo)] {
        for (Entry* e : todo) {
          if (sync->stop.load(std::memory_order_relaxed)) break;
          std::uint8_t expected = kUnverified;
          if (e->state.compare_exchange_strong(expected, kVerifying, std::memory_order_acq_rel)) {
            finish_verify(e, &sync->stop);
            // Stopped half-way, it left the entry unverified (close is waiting: nothing else runs).
            if (!sync->stop.load(std::memory_order_relaxed)) verified_ahead_.fetch_add(1, std::memory_order_relaxed);
          }
        }
        // The last touch of the cache: close may free it (and `sync`) once the mutex is free.
        std::lock_guard<std::mutex> lk(sync->mu);
        sync->ahead_running.store(false, std::memory_order_release);
        sync->cv.notify_all();
      }).detach();
    } catch (...) {
      sync->ahead_running.store(false, std::memory_order_relaxed);
      throw;
    }
    log::debug("'{}': verifying {} entries ({} bytes) ahead of their first look-up", opts_.path, count, bytes);
  } catch (...) {
    // No thread (or no memory for the list): look-ups verify on first use, as without it.
  }
}

void Core::stop_verify_ahead() noexcept {
  VerifySync& sync = *verify_sync_;
  sync.stop.store(true, std::memory_order_relaxed);
  if (in_forked_child()) {
    // The thread is not here. Where it had ended before the fork, this orders all it did before
    // what the child's close does next (ThreadSanitizer checks it); where it was running, the
    // entry it held is checked by whoever looks it up (verify_entry).
    (void)sync.ahead_running.load(std::memory_order_acquire);
    return;
  }
  std::unique_lock<std::mutex> lk(sync.mu);
  sync.cv.wait(lk, [&] { return !sync.ahead_running.load(std::memory_order_acquire); });
}

// ---------------------------------------------------------------------------------------------
// reader API
// ---------------------------------------------------------------------------------------------

std::size_t Core::look_up(std::string_view key) noexcept {
  if (key.size() > kMaxKeySize) {  // cannot be in any cache; say why instead of a bare miss
    try {
      set_last_error({Errc::invalid_argument, 0,
                      "key size " + std::to_string(key.size()) + " is over the limit of " + std::to_string(kMaxKeySize)});
    } catch (...) {
    }
    misses_.add();
    return kNotFound;
  }
  Entry* e = find_entry(key);
  if (e == nullptr && opts_.refresh_on_miss && (file_backed_ || awaiting_file_.load(std::memory_order_acquire))) {
    std::unique_lock<std::mutex> lock(write_mu_, std::try_to_lock);
    if (lock.owns_lock() && refresh_locked()) e = find_entry(key);
  }
  if (e == nullptr || !verify_entry(e)) {
    misses_.add();
    return kNotFound;
  }
  hits_.add();
  return static_cast<std::size_t>(e->offset);
}

void* Core::offset_to_addr(std::size_t offset, bool replaced_too) const noexcept {
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

Result<void> Core::refresh() noexcept {
  if (!file_backed_ && !awaiting_file_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> lock(write_mu_);
  lease_gave_up_ = false;  // the next allocation may wait for the lease again
  auto r = refresh_locked();
  if (!r) return fail(r.error());
  return {};
}

Result<void> Core::refresh_locked() noexcept {
  if (awaiting_file_.load(std::memory_order_relaxed)) return try_attach_locked();
  if (!file_backed_ || fd_ == platform::kInvalidHandle) return {};
  auto info = pf_.stat_file(fd_);
  if (!info) return info.error();
  std::vector<format::IndexRecord> records;
  auto slot = read_latest_slot(committed_.sequence, &records, info->size);
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

Stats Core::stats() const noexcept {
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
  s.lease_timeouts = lease_timeouts_.load(std::memory_order_relaxed);
  s.unpersisted_entries = unpersisted_entries_.load(std::memory_order_relaxed);
  s.unpersisted_bytes = unpersisted_bytes_.load(std::memory_order_relaxed);
  s.compactions = compactions_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------------------------------------
// writer side
// ---------------------------------------------------------------------------------------------

Result<void> Core::acquire_lease_locked(std::unique_lock<std::mutex>* lk, bool catch_up) noexcept {
  if (has_lease_) return {};
  if (lock_fd_ == platform::kInvalidHandle)
    return Error{Errc::read_only, 0, "cache is open read-only"};
  // Another cache of this process holds the lease on this lock file (the file at the path was
  // replaced, and this process opened the new one while still holding the old one's lease):
  // waiting would be waiting for ourselves.
  if (const Core* holder = lease_holder(lock_identity_); holder != nullptr && holder != this)
    return Error{Errc::busy, 0,
                 "this process already holds the writer lease on '" + lock_path_ +
                     "' through another open cache of that path (of a file since replaced); finalize or close "
                     "that cache first"};
  // After one full wait timed out, later allocations only try once until the next finalize or
  // refresh: a packer with hundreds of weights must not wait lease_timeout for each of them.
  const auto wait = lease_gave_up_ ? std::chrono::milliseconds(0) : opts_.lease_timeout;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  auto backoff = std::chrono::microseconds(200);
  for (;;) {
    auto got = try_lock_both_locked();
    if (!got) return got.error();
    if (got.value()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      if (!lease_gave_up_) lease_timeouts_.fetch_add(1, std::memory_order_relaxed);
      lease_gave_up_ = true;
      return Error{Errc::busy, 0,
                   "another process held the writer lease on '" + lock_path_ + "' for longer than lease_timeout"};
    }
    // Wait without the write mutex, so this process's readers can refresh and other threads
    // can commit their reservations meanwhile; callers re-read state after this returns.
    if (lk != nullptr) lk->unlock();
    std::this_thread::sleep_for(backoff);
    if (lk != nullptr) {
      lk->lock();
      if (has_lease_) return {};  // another thread of ours took it meanwhile
    }
    backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
  }
  has_lease_ = true;
  set_lease_holder(lock_identity_, this);
  lease_gave_up_ = false;
  if (fd_ == platform::kInvalidHandle || !catch_up) return {};  // creating or replacing the file
  // The path may now name another file (a rebuild or compaction elsewhere): never append to an
  // inode others no longer read. (A descriptor cache has no path: its file is its file.)
  auto ours = pf_.stat_file(fd_);
  auto at_path = from_descriptor_ ? ours : pf_.stat_path(opts_.path, opts_.allow_symlink);
  if (!at_path || !ours || at_path->inode != ours->inode || at_path->device != ours->device) {
    release_lease_locked();
    file_disabled_ = true;
    return Error{Errc::busy, 0,
                 "'" + opts_.path + "' was replaced by another process; " +
                     (opts_.backing == Backing::file ? std::string("reopen the cache to write to the new file")
                                                     : std::string("new entries stay in heap memory until reopened"))};
  }
  if (auto r = refresh_locked(); !r) {
    release_lease_locked();
    return r.error();
  }
  file_size_ = ours->size;
  publish_sizes_locked();
  // Bytes past the committed size are either free or garbage of a writer that died: ours to
  // reuse. Our own outstanding reservations always lie below it (see release_lease_if_safe).
  cursor_ = align_up(committed_.committed_size, offset_align());
  flush_from_ = cursor_;
  return {};
}

void Core::publish_sizes_locked() noexcept {
  seen_file_size_.store(file_size_, std::memory_order_relaxed);
  seen_committed_.store(committed_.committed_size, std::memory_order_relaxed);
  seen_trailer_.store(committed_.index_size + format::kFooterSize, std::memory_order_relaxed);
}

Result<bool> Core::try_lock_both_locked() noexcept {
  // The sidecar orders creation and rebuilds, which happen before there is a file to lock. The
  // data file's own lock makes appends exclusive per file, not per name: two processes that
  // open one file through two hard links hold different sidecars. Always sidecar first.
  auto got = pf_.try_lock(lock_fd_);
  if (!got || !got.value() || fd_ == platform::kInvalidHandle) return got;
  auto data = pf_.try_lock(fd_);
  if (!data || !data.value()) {
    pf_.unlock(lock_fd_);
    return data;
  }
  data_locked_ = fd_;
  return true;
}

void Core::release_lease_locked() noexcept {
  if (!has_lease_) return;
  if (data_locked_ != platform::kInvalidHandle) {
    pf_.unlock(data_locked_);
    data_locked_ = platform::kInvalidHandle;
  }
  pf_.unlock(lock_fd_);
  has_lease_ = false;
  set_lease_holder(lock_identity_, nullptr);
}

void Core::release_lease_if_safe_locked() noexcept {
  // A reservation past the committed size would be handed to the next writer as free space:
  // keep the lease until a finalize writes a trailer after it (or until close).
  for (const auto& [off, r] : reservations_)
    if (!r.heap && off + r.capacity > committed_.committed_size) return;
  release_lease_locked();
}

Result<void> Core::ensure_mapped_locked(std::uint64_t end) noexcept {
  if (end <= mapped_end_) return {};
  const std::uint64_t new_end = std::min(align_up(std::max(end, file_size_), gran_), file_span_);
  if (new_end < end) return Error{Errc::no_space, 0, "max_file_bytes reached; raise it"};
  auto r = pf_.map_file(fd_, mapped_end_, static_cast<std::size_t>(new_end - mapped_end_), addr(mapped_end_),
                        !opts_.read_only);
  if (!r) return r.error();
  mapped_end_ = new_end;
  mappings_.fetch_add(1, std::memory_order_relaxed);
  return {};
}

Result<void> Core::grow_file_locked(std::uint64_t end) noexcept {
  if (end > file_span_) return Error{Errc::no_space, 0, "max_file_bytes reached; raise it or compact the cache"};
  if (end > file_size_) {
    // Geometric growth keeps the number of mappings logarithmic; on a full disk retry with just
    // what is needed before giving up.
    const std::uint64_t doubled = std::max({align_up(end, gran_), file_size_ * 2, kMinChunk});
    std::uint64_t target = std::min(doubled, file_span_);
    auto r = pf_.allocate(fd_, file_size_, target - file_size_);
    if (!r && target > align_up(end, gran_)) {
      target = std::min(align_up(end, gran_), file_span_);
      r = pf_.allocate(fd_, file_size_, target - file_size_);
    }
    if (!r) return r.error();
    file_size_ = target;
    publish_sizes_locked();
  }
  return ensure_mapped_locked(end);
}

Result<std::uint64_t> Core::allocate_heap_locked(std::uint64_t size) noexcept {
  auto r = heap_.place(heap_cursor_, size, align_, gran_);
  if (!r) return r.error();
  heap_cursor_ = r.value() + size;
  return file_span_ + r.value();
}

Result<Core::Region> Core::allocate_locked(std::uint64_t size, bool* fell_back,
                                           std::unique_lock<std::mutex>& lk) noexcept {
  *fell_back = false;
  Error why{Errc::ok, 0, {}};
  if (file_backed_ && !file_disabled_ && !opts_.read_only) {
    auto lease = acquire_lease_locked(&lk);
    if (lease) {
      const std::uint64_t off = align_up(cursor_, offset_align());
      auto r = grow_file_locked(off + size);
      if (r) {
        cursor_ = off + size;
        return Region{off, false};
      }
      lease = r.error();
    }
    if (opts_.backing == Backing::file) {
      log::warn("'{}': cannot place a new entry in the file ({}: {})", opts_.path, errc_name(lease.error().code),
                lease.error().message);
      return lease.error();
    }
    why = lease.error();
  }
  if (persist_wanted()) {
    // Served from memory, and persisted by a later finalize once the file can take it.
    *fell_back = true;
    heap_fallbacks_.fetch_add(1, std::memory_order_relaxed);
    if (!warned_fallback_ && why.code != Errc::ok) {
      warned_fallback_ = true;
      log::warn("'{}': cannot place new entries in the file ({}: {}); packing to heap memory until a finalize can "
                "persist them",
                opts_.path, errc_name(why.code), why.message);
    }
  }
  auto h = allocate_heap_locked(size);
  if (!h) return h.error();
  return Region{h.value(), true};
}

void* Core::reserve(std::size_t size) noexcept {
  try {
    if (size > kMaxEntrySize) {
      set_last_error({Errc::invalid_argument, 0,
                      "reserve: size " + std::to_string(size) + " is over " + kMaxEntrySizeText +
                          ", the largest entry a cache takes"});
      return nullptr;
    }
    std::unique_lock<std::mutex> lock(write_mu_);
    const std::uint64_t cap = round_size(size);
    bool fell_back = false;
    auto region = allocate_locked(cap, &fell_back, lock);
    if (!region) {
      set_last_error(region.error());
      return nullptr;
    }
    reservations_[region->offset] = Reservation{cap, region->heap};
    return addr(region->offset);
  } catch (...) {
    set_last_error({Errc::no_memory, 0, "out of memory while reserving"});
    return nullptr;
  }
}

Result<void> Core::release(void* ptr) noexcept {
  std::lock_guard<std::mutex> lock(write_mu_);
  std::uint64_t at = 0, room = 0;
  if (!offset_of(ptr, &at, &room))
    return fail({Errc::invalid_argument, 0, "release: pointer is not from this cache"});
  auto it = reservations_.find(at);
  if (it == reservations_.end())
    return fail({Errc::invalid_argument, 0, "release: pointer is not an outstanding reservation's start"});
  const auto [offset, r] = *it;
  reservations_.erase(it);
  release_reservation_locked(offset, r);
  return {};
}

void Core::release_reservation_locked(std::uint64_t offset, const Reservation& r) noexcept {
  // Give the space back when it is the last thing allocated (the common re-insert case), so
  // re-inserting identical bytes does not grow the file.
  if (r.heap) {
    if (offset - file_span_ + r.capacity == heap_cursor_) heap_cursor_ = offset - file_span_;
  } else if (has_lease_ && offset + r.capacity == cursor_) {
    cursor_ = offset;
  }
}

std::size_t Core::look_up_or_insert(std::string_view key, void* ptr, std::size_t size) noexcept {
  if (ptr == nullptr) return look_up(key);
  if (key.empty() || key.size() > kMaxKeySize) {
    set_last_error({Errc::invalid_argument, 0,
                    "key size " + std::to_string(key.size()) + " is outside 1.." + std::to_string(kMaxKeySize)});
    return kNotFound;
  }
  if (size > kMaxEntrySize) {  // never hashed: a wild size (SIZE_MAX) would read until it faults
    set_last_error({Errc::invalid_argument, 0,
                    "look_up_or_insert: size " + std::to_string(size) + " is over " + kMaxEntrySizeText +
                        ", the largest entry a cache takes"});
    return kNotFound;
  }
  try {
    if (std::string why = source_problem(ptr, size); !why.empty()) {
      set_last_error({Errc::invalid_argument, 0, "look_up_or_insert: " + why});
      return kNotFound;
    }
    const std::uint64_t checksum = format::hash_bytes(ptr, size);
    const auto* p = static_cast<std::byte*>(ptr);
    std::unique_lock<std::mutex> lock(write_mu_);
    std::optional<std::pair<std::uint64_t, Reservation>> res;
    if (std::uint64_t at = 0, room = 0; offset_of(p, &at, &room)) {
      auto it = reservations_.find(at);
      if (it != reservations_.end() && size <= it->second.capacity) {
        res.emplace(it->first, it->second);
        reservations_.erase(it);
      }
    }
    // The key already holds exactly these bytes: keep that entry.
    auto same = [&]() -> Entry* {
      Entry* old = find_entry(key);
      if (old == nullptr || old->size != size || old->checksum != checksum || old->state.load() == kBad ||
          std::memcmp(addr(old->offset), ptr, size) != 0)
        return nullptr;
      // Its bytes match fresh packer output. A thread hashing it right now reaches the same verdict.
      if (std::uint8_t unverified = kUnverified; old->state.compare_exchange_strong(unverified, kGood))
        wake_verify_waiters();
      return old;
    };
    if (Entry* old = same()) {
      if (res) release_reservation_locked(res->first, res->second);
      return static_cast<std::size_t>(old->offset);
    }
    Region region;
    if (res) {
      region = Region{res->first, res->second.heap};
    } else {
      bool fell_back = false;
      const std::uint64_t cap = round_size(size);
      auto r = allocate_locked(cap, &fell_back, lock);
      if (!r) {
        set_last_error(r.error());
        return kNotFound;
      }
      region = r.value();
      // Waiting for the lease let go of the write mutex, and taking it merged other processes'
      // commits: the same bytes may have arrived meanwhile.
      if (Entry* old = same()) {
        release_reservation_locked(region.offset, Reservation{cap, region.heap});
        return static_cast<std::size_t>(old->offset);
      }
      // The source may be this very space: a reservation released and handed out again.
      std::memmove(addr(region.offset), ptr, size);
    }
    Entry* raw = index_.make(key);
    raw->offset = region.offset;
    raw->size = size;
    raw->checksum = checksum;
    raw->in_file = !region.heap;
    raw->state.store(kGood);
    // Nothing may fail once the entry is published: make room first (geometrically; reserving
    // one more each time would copy the whole vector on every insert).
    if (pending_.size() == pending_.capacity()) pending_.reserve(std::max<std::size_t>(64, 2 * pending_.capacity()));
    if (Entry* old = index_.publish(raw); old != nullptr) {
      if (old->in_file) mapped_bytes_ -= old->size;
      else heap_bytes_ -= old->size;
      if (!old->in_file && persist_wanted()) {
        unpersisted_entries_.fetch_sub(1, std::memory_order_relaxed);
        unpersisted_bytes_.fetch_sub(old->size, std::memory_order_relaxed);
      }
      if (old->durable.load(std::memory_order_relaxed))
        durable_live_.fetch_sub(round_size(old->size), std::memory_order_relaxed);
      log::debug("'{}': replacing a stale entry", opts_.path);
    }
    if (raw->in_file) {
      mapped_bytes_ += size;
      pending_.push_back(raw);
    } else {
      heap_bytes_ += size;
      if (persist_wanted()) {
        unpersisted_entries_.fetch_add(1, std::memory_order_relaxed);
        unpersisted_bytes_.fetch_add(size, std::memory_order_relaxed);
      }
    }
    finalized_.store(false, std::memory_order_release);
    return static_cast<std::size_t>(raw->offset);
  } catch (...) {
    set_last_error({Errc::no_memory, 0, "out of memory while inserting"});
    return kNotFound;
  }
}

Result<void> Core::migrate_heap_entries_locked() noexcept {
  std::vector<Entry*> heap;
  try {
    index_.for_each_live([&](Entry& e) {
      if (!e.in_file) heap.push_back(&e);
    });
    // Insertion order: the file then holds them as the host packed them.
    std::sort(heap.begin(), heap.end(), [](const Entry* a, const Entry* b) { return a->number < b->number; });
    pending_.reserve(pending_.size() + heap.size());
    for (Entry* e : heap) {
      const std::uint64_t off = align_up(cursor_, offset_align());
      if (auto r = grow_file_locked(off + round_size(e->size)); !r) return r.error();
      cursor_ = off + round_size(e->size);
      std::memcpy(addr(off), addr(e->offset), e->size);
      Entry* raw = index_.make(e->key);
      raw->offset = off;
      raw->size = e->size;
      raw->checksum = e->checksum;
      raw->in_file = true;
      raw->state.store(kGood, std::memory_order_relaxed);  // copied from our own private memory
      // Before publishing: a reader holding the heap entry's offset follows it to the file copy,
      // which decides whether that offset is still live (same key, same bytes).
      e->moved.store(raw, std::memory_order_release);
      index_.publish(raw);
      heap_bytes_ -= e->size;
      mapped_bytes_ += e->size;
      unpersisted_entries_.fetch_sub(1, std::memory_order_relaxed);
      unpersisted_bytes_.fetch_sub(e->size, std::memory_order_relaxed);
      pending_.push_back(raw);
    }
    return {};
  } catch (...) {
    return Error{Errc::no_memory, 0, "out of memory while moving entries from heap memory into the file"};
  }
}

Result<void> Core::persist_locked(std::unique_lock<std::mutex>& lk) noexcept {
  if (auto r = acquire_lease_locked(&lk); !r) return r.error();
  // Entries that went to the heap (no lease, no space, no file at the time) go into the file
  // first; as many as fit are committed with the rest even when not all of them do.
  Result<void> migrated = unpersisted_entries_.load(std::memory_order_relaxed) != 0
                              ? migrate_heap_entries_locked()
                              : Result<void>();
  if (pending_.empty()) {  // another thread committed everything while we waited
    release_lease_if_safe_locked();
    return migrated;
  }
  std::vector<format::IndexRecord> records;
  std::uint64_t live_bytes = 0;
  try {
    records.reserve(index_.live_count());
    index_.for_each_live([&](const Entry& e) {
      if (!e.in_file) return;
      records.push_back({std::string(e.key), e.offset, e.size, e.checksum});
      live_bytes += round_size(e.size);
    });
  } catch (...) {
    return Error{Errc::no_memory, 0, "out of memory while building the index"};
  }
  std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });

  // The next commit goes to the slot not holding the newest one (docs/FORMAT.md): read the
  // header as it is now, whatever we last believed. A tie or an exhausted sequence is a damaged
  // header (read_committed refuses it at open, where the file is rebuilt).
  auto header = read_header(pf_, fd_);
  if (!header) return header.error();
  // Never the last sequence (2^64-1 makes a file corrupt to every reader), never a tie.
  if (committed_.sequence >= UINT64_MAX - 1 ||
      (header->slot_valid[0] && header->slot_valid[1] && header->slot[0].sequence == header->slot[1].sequence))
    return Error{Errc::corrupt, 0,
                 "the commit slots of '" + opts_.path +
                     "' are damaged or exhausted (a tie, or no sequence left); the file is rebuilt by the next open "
                     "that finds it unused"};
  // Only on top of the newest commit: one this cache did not load (another writer's, or one it
  // could not read) must never be overwritten by a commit that does not name its entries.
  for (int i : {0, 1})
    if (header->slot_valid[i] && header->slot[i].sequence > committed_.sequence)
      return Error{Errc::busy, 0,
                   "'" + opts_.path + "' holds a newer commit (sequence " + std::to_string(header->slot[i].sequence) +
                       ") than this cache loaded (" + std::to_string(committed_.sequence) + "); reopen the cache"};
  // And only into the file at the path: another program may have renamed a new file over it
  // while we held the lease, and a commit into the old inode would be lost to every later opener.
  if (!from_descriptor_) {
    auto at_path = pf_.stat_path(opts_.path, opts_.allow_symlink);
    auto ours = pf_.stat_file(fd_);
    if (!at_path || !ours || at_path->inode != ours->inode || at_path->device != ours->device) {
      file_disabled_ = true;
      return Error{Errc::busy, 0, "the file at '" + opts_.path + "' was replaced by another program; reopen the cache"};
    }
  }
  const int target_slot = next_slot_index(header.value());
  // Commit protocol (docs/FORMAT.md): data, flush, index + footer, flush, slot, flush. A
  // reservation taken before an earlier finalize may be committed now: flush from the lowest
  // pending entry, not just from where this lease began.
  const bool full = opts_.durability == Durability::full;
  std::uint64_t flush_lo = flush_from_;
  for (const Entry* e : pending_) flush_lo = std::min(flush_lo, e->offset);
  if (opts_.durability != Durability::none && cursor_ > flush_lo) {
    if (auto r = pf_.flush_mapping(addr(flush_lo), static_cast<std::size_t>(cursor_ - flush_lo), full); !r)
      return r.error();
  }
  format::CommitSlot slot;
  slot.sequence = committed_.sequence + 1;
  const std::uint64_t index_offset = align_up(cursor_, 8);
  std::vector<std::byte> trailer;
  try {
    trailer = format::encode_trailer(records, index_offset, &slot);
  } catch (...) {
    return Error{Errc::no_memory, 0, "out of memory while encoding the index"};
  }
  if (slot.index_size > format::kMaxIndexSize)
    return Error{Errc::no_space, 0,
                 "the index of '" + opts_.path + "' would exceed " + std::to_string(format::kMaxIndexSize >> 20) +
                     " MiB (" + std::to_string(records.size()) + " entries); use fewer, larger entries or shorter keys"};
  if (auto r = grow_file_locked(slot.committed_size); !r) return r.error();
  if (auto r = pf_.write_at(fd_, trailer.data(), trailer.size(), index_offset); !r) return r.error();
  if (full)
    if (auto r = pf_.sync(fd_); !r) return r.error();
  const auto sb = format::encode_slot(slot);
  // From here on other processes may read this slot even if we report failure: never cut the
  // file below what it names (maybe_trim_locked, ~Core).
  written_size_ = std::max(written_size_, slot.committed_size);
  if (auto r = pf_.write_at(fd_, sb.data(), sb.size(), format::kSlotOffset[target_slot]); !r) return r.error();
  if (full)
    if (auto r = pf_.sync(fd_); !r) return r.error();

  committed_ = slot;
  publish_sizes_locked();
  for (Entry* e : pending_) e->durable.store(true, std::memory_order_relaxed);
  pending_.clear();
  durable_live_.store(live_bytes, std::memory_order_relaxed);
  cursor_ = slot.committed_size;
  flush_from_ = cursor_;
  commits_.fetch_add(1, std::memory_order_relaxed);
  maybe_trim_locked();
  release_lease_if_safe_locked();
  return migrated;
}

void Core::maybe_trim_locked() noexcept {
  // Put the footer back at EOF: cut the preallocated tail, unless a reservation still lives there.
  // Never below a commit slot we wrote: one whose sync failed may still be read (from the page
  // cache) by another process, which then maps up to its committed size.
  const std::uint64_t keep = std::max(committed_.committed_size, written_size_);
  if (!has_lease_ || file_size_ <= keep) return;
  for (const auto& [off, r] : reservations_)
    if (!r.heap && off + r.capacity > keep) return;
  if (auto r = pf_.truncate(fd_, keep); r) {
    file_size_ = keep;
    publish_sizes_locked();
    cursor_ = committed_.committed_size;
  }
}

Result<void> Core::finalize() noexcept {
  try {
    std::unique_lock<std::mutex> lock(write_mu_);
    lease_gave_up_ = false;  // a new packing phase may wait for the lease again
    // Finalize always ends the packing phase (runtimes refuse to run until it has), even when
    // persisting fails: the entries are still served from memory, and the error says why.
    finalized_.store(true, std::memory_order_release);
    auto r = persist_all_locked(lock);
    if (r) return {};
    std::uint64_t entries = unpersisted_entries_.load(std::memory_order_relaxed) + pending_.size();
    std::uint64_t bytes = unpersisted_bytes_.load(std::memory_order_relaxed);
    for (const Entry* e : pending_) bytes += e->size;
    Error e = r.error();
    std::string why = e.message;
    while (!why.empty() && (why.back() == '.' || why.back() == ' ')) why.pop_back();
    e.message = std::to_string(entries) + " entries (" + std::to_string(bytes) + " bytes) of '" + opts_.path +
                "' are not durable: " + why +
                ". They stay in memory in this process, and every later finalize tries again.";
    log::error("finalize: {} ({})", e.message, errc_name(e.code));
    return fail(std::move(e));
  } catch (...) {
    return fail({Errc::no_memory, 0, "out of memory during finalize of '" + opts_.path + "'"});
  }
}

Result<void> Core::persist_all_locked(std::unique_lock<std::mutex>& lk) noexcept {
  const bool heap_left = unpersisted_entries_.load(std::memory_order_relaxed) != 0;
  if (!file_backed_) {
    if (!heap_left) return {};
    return Error{heap_why_.code == Errc::ok ? Errc::io : heap_why_.code, heap_why_.sys_errno,
                 "the cache file could not be used when the cache was opened (" + heap_why_.message +
                     "); reopen the cache once it can be"};
  }
  if (pending_.empty() && !heap_left) {
    // Nothing new: leave the file's bytes and mtime alone (only undo growth we made ourselves).
    maybe_trim_locked();
    release_lease_if_safe_locked();
    return {};
  }
  if (opts_.read_only)
    return Error{Errc::read_only, 0,
                 read_only_why_.empty() ? std::string("the cache is open read-only (open it read-write to persist them)")
                                        : "the cache is used read-only: " + read_only_why_};
  if (file_disabled_)
    return Error{Errc::busy, 0, "the file at the path was replaced by another program; reopen the cache"};
  return persist_locked(lk);
}

}  // namespace weightcache
