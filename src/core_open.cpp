// Opening a cache: the file, a descriptor or the heap; the address space; rebuilding a damaged or
// incompatible file, and compaction at open. (Core, see core.hpp.)
#include "core.hpp"
#include "core_internal.hpp"
#include "compact.hpp"
#include "file_state.hpp"
#include "fork_guard.hpp"
#include "log.hpp"
#include "platform/errors.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <system_error>
#include <thread>

namespace weightcache {

using namespace core_detail;

// ---------------------------------------------------------------------------------------------
// open
// ---------------------------------------------------------------------------------------------

Result<std::shared_ptr<Core>> Core::open(const Options& options, platform::Platform& pf) {
  fork_guard::install();  // before the first use of the locks a forked child may need
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
    if (options.fd >= 0 && options.handle != nullptr)
      return fail({Errc::invalid_argument, 0, "set fd or handle, not both: each names the file to use"});
    const bool caller_file = options.fd >= 0 || options.handle != nullptr;
    if (options.path.empty() && !caller_file && options.backing == Backing::file)
      return fail({Errc::invalid_argument, 0, "backing=file needs a path; leave it empty only for a heap cache"});
    const bool want_file =
        (!options.path.empty() || caller_file) && options.backing != Backing::heap && !options.private_cache;
    if (want_file && !caller_file && options.path == kMemoryPath && options.read_only)
      return fail({Errc::invalid_argument, 0,
                   "a new ':memory:' cache cannot be read-only: it starts empty, and nobody else has it yet. A reader "
                   "joins an existing one through the descriptor (wc_options.fd) or handle (wc_options.handle) its "
                   "creator hands over, with read_only"});
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
    return fail(platform::no_memory_error("out of memory while opening the cache", options.path));
  } catch (...) {
    return fail({Errc::io, 0, "unexpected failure while opening the cache"});
  }
}

Result<void> Core::reserve_address_space(std::uint64_t file_span) {
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
    auto r = file_span <= SIZE_MAX
                 ? platform::AddressReservation::reserve(pf_, static_cast<std::size_t>(file_span), va_align)
                 : Result<platform::AddressReservation>(Error{Errc::no_memory, 0, "address space too small"});
    if (r) {
      space_ = std::move(r).value();
      file_span_ = file_span;
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

Result<void> Core::init_heap_only() {
  // Nothing to reserve up front: the heap arena takes address space chunk by chunk as it fills.
  file_backed_ = false;
  file_disabled_ = true;
  return {};
}

Result<void> Core::ready_heap() {
  // Room for a first megabyte (reserved and committed, the cursor left where it is): less would
  // be a heap cache in name only.
  MutexLock lock(write_mu_);
  auto r = heap_.place(heap_cursor_, kMinChunk, align_, gran_);
  if (!r) return r.error();
  return {};
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
void remove_stale_temporaries(platform::Platform& pf, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p = fs::u8path(path);
  const auto dir_u8 = (p.has_parent_path() ? p.parent_path() : fs::path(".")).u8string();
  const auto base_u8 = p.filename().u8string();
  const std::string dir(dir_u8.begin(), dir_u8.end()), prefix = std::string(base_u8.begin(), base_u8.end()) + ".tmp.";
  auto names = pf.list_directory(dir);
  if (!names) return;  // best effort: a later open tries again
  for (const auto& name : names.value()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const auto full = (fs::u8path(dir) / fs::u8path(name)).u8string();
    (void)pf.remove_file(std::string(full.begin(), full.end()));
  }
}

}  // namespace

Result<void> Core::init_file() {
  file_backed_ = true;
  if (opts_.fd >= 0 || opts_.handle != nullptr || opts_.path == kMemoryPath) return init_descriptor();
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
      lock_fd_ = std::move(lk).value();
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
      // The newest commit does not verify (the file was truncated below it, or a power loss kept
      // its slot but not its index): readers use the older one, but no writer can commit on top
      // of it, since a commit never overwrites a newer slot it could not read (persist_locked).
      // The file is damaged: alone with it, write the commit in use into a fresh file (as a
      // rebuild would, but keeping its entries); with others using it, use it as it is (this
      // process's finalize reports its entries as not durable) and the next open that finds it
      // unused repairs it.
      if (round < 2 && st->newest_damaged && !opts_.read_only && upgrade_in_use()) {
        if (auto again = read_state(); again && again->newest_damaged) {
          if (compact_in_place(again.value(), /*salvage=*/true)) continue;  // reopen the new file
          st = std::move(again);
        } else if (again) {
          st = std::move(again);
        }
        if (auto r = pf_.try_lock_in_use(fd_, false); !r || !r.value()) continue;  // lost it: start again
      } else if (round < 2 && compaction_due(st.value()) && upgrade_in_use()) {
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

bool Core::upgrade_in_use() {
  if (opts_.read_only) return false;
  auto ex = pf_.try_lock_in_use(fd_, true);
  return ex && ex.value();
}

// A cache on a descriptor (the caller's descriptor or Windows handle, or an anonymous file for
// ":memory:"): no path to open, rename or lock beside, so the lease and the in-use lock are the
// file's own, an empty file is initialised in place, and an unusable one is rebuilt in place,
// only while nobody else has it open.
Result<void> Core::init_descriptor() {
  from_descriptor_ = true;
  const bool memory = opts_.fd < 0 && opts_.handle == nullptr;
  // Nothing of an anonymous file outlives its last process, so there is nothing to flush for:
  // a flush would only write the pages out (to disk, for Windows' temporary file).
  if (memory) opts_.durability = Durability::none;
  try {
    if (opts_.path.empty()) {
      char label[40];
      if (opts_.handle != nullptr)
        std::snprintf(label, sizeof label, "handle 0x%llx",
                      static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(opts_.handle)));
      else
        std::snprintf(label, sizeof label, "fd %d", opts_.fd);
      opts_.path = label;
    }
  } catch (...) {
    return Error{Errc::no_memory, 0, "out of memory"};
  }
  if (auto r = reserve_address_space(opts_.max_file_bytes); !r) return r.error();
  auto reopen = [this](bool writable) {
    return opts_.handle != nullptr ? pf_.reopen_os_handle(opts_.handle, writable) : pf_.reopen(opts_.fd, writable);
  };
  auto h = memory ? pf_.create_anonymous("weightcache") : reopen(!opts_.read_only);
  if (!h && !memory && h.error().code == Errc::read_only && opts_.backing != Backing::file) {
    // A read-only descriptor or handle: serve its entries, add none (as for a read-only file).
    log::warn("'{}': {}; using the cache read-only", opts_.path, h.error().message);
    opts_.read_only = true;
    try {
      read_only_why_ = opts_.handle != nullptr ? "its handle was opened read-only" : "its descriptor was opened read-only";
    } catch (...) {
    }
    h = reopen(false);
  }
  if (!h) return h.error();
  fd_ = std::move(h).value();
  fd_.set_path(opts_.path);  // "fd N" or ":memory:" already, unless the caller gave it a label
  if (!memory && opts_.durability != Durability::none && pf_.vanishes_with_holders(fd_)) {
    // Another process's ":memory:" cache, joined through its descriptor or handle: as for its
    // creator, nothing of it outlives its processes.
    log::debug("'{}' is an anonymous file (a ':memory:' cache's): nothing is flushed for it", opts_.path);
    opts_.durability = Durability::none;
  }
  if (!opts_.read_only) {
    leases_own_file_ = true;  // the writer lease: the file's own flock
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
  bool seen_holder = false;  // a read-only opener of an empty file saw another holder
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
      if (opts_.read_only) {
        // As a path opener waits for the creator's rename: while another process (or handle)
        // has the file open, a writer may be setting it up, which it does only alone, so let go
        // of ours and wait. Nobody else when first asked: nobody will write it. Once somebody
        // was seen, a moment without a holder is a writer between its locks (Windows lets go of
        // a shared lock to take an exclusive one), so the wait goes on to lease_timeout.
        pf_.unlock_in_use(fd_);
        auto others = pf_.in_use_by_others(fd_);
        seen_holder = seen_holder || (others && others.value());
        if (!seen_holder)
          return Error{Errc::corrupt, 0, "'" + opts_.path + "' is empty: no cache was written to it"};
        if (auto r = wait("stayed empty while another process had it open"); !r) return r;
        continue;
      }
      if (!upgrade_in_use()) {  // another process is initialising it
        if (auto r = wait("stayed empty while another process had it open"); !r) return r;
        continue;
      }
      if (auto st = pf_.stat_file(fd_); st && st->size == 0)  // still empty now that we are alone
        if (auto r = write_empty_cache_in_place(); !r) return r;
      continue;  // downgraded by the next round's shared request
    }
    auto st = read_state();
    // A newest commit that does not verify keeps every writer from committing (see init_file):
    // with nobody else using the file, rebuild it as a damaged one. No rename here, so no fresh
    // file to copy the older commit into: its entries are repacked.
    const bool stuck = st && st->newest_damaged && !opts_.read_only && round < 2 && upgrade_in_use();
    if (st && !stuck) return attach(st.value());
    const Error why = st ? Error{Errc::corrupt, 0, "its newest commit does not verify"} : st.error();
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

Result<void> Core::write_empty_cache(const platform::File& f) {
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
    if (auto r = pf_.write_at(f, trailer.data(), trailer.size(), format::kHeaderSize); !r) return r.error();
    if (opts_.durability == Durability::full)
      if (auto r = pf_.sync(f); !r) return r.error();
    if (auto r = pf_.write_at(f, header.data(), header.size(), 0); !r) return r.error();
    if (opts_.durability == Durability::full)
      if (auto r = pf_.sync(f); !r) return r.error();
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while initialising '" + opts_.path + "'"};
  }
  return {};
}

Result<void> Core::write_empty_cache_in_place() {
  if (auto r = write_empty_cache(fd_); !r) return r;
  log::info("initialised cache file '{}'", opts_.path);
  return {};
}

void Core::make_read_only(std::string why) {
  opts_.read_only = true;
  try {
    read_only_why_ = std::move(why);
  } catch (...) {
  }
  lock_fd_.close();
}

Result<bool> Core::open_in_use(std::chrono::steady_clock::time_point deadline) {
  auto backoff = std::chrono::microseconds(200);
  for (;;) {
    fd_.close();
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
    fd_ = std::move(fd).value();
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

Result<void> Core::create_missing_file() {
  MutexLock lock(write_mu_);  // nobody else has this cache yet; the lease's state wants it
  // Build under the lease so concurrent openers build once; re-check first: another process may
  // have put a file in place while we waited.
  fd_.close();
  if (auto r = acquire_lease_locked(nullptr); !r) return r.error();
  Result<void> out;
  if (auto st = pf_.stat_path(opts_.path, opts_.allow_symlink); !st && st.error().sys_errno == ENOENT) {
    out = create_fresh_file();
  }
  release_lease_locked();
  return out;
}

Result<void> Core::rebuild_file() {
  MutexLock lock(write_mu_);  // nobody else has this cache yet; the lease's state wants it
  // We hold the file alone (exclusive in-use lock on fd_): no process has it open, and any that
  // tries waits until the new file has taken the name. The lease keeps a creator of a missing
  // file, or the CLI, from racing us.
  if (auto r = acquire_lease_locked(nullptr, false); !r) return r.error();
  if (!pf_.replaces_open_files()) {  // Windows: the rename needs our handle closed, lock and all
    release_lease_locked();
    fd_.close();
    if (auto r = acquire_lease_locked(nullptr, false); !r) return r.error();
  }
  auto out = create_fresh_file();
  release_lease_locked();
  // Let go of the unusable file only now (and before reopening: Windows refuses to replace, and
  // our caller reopens, a file this process still has open).
  fd_.close();
  return out;
}

Result<void> Core::create_fresh_file() {
  try {
    remove_stale_temporaries(pf_, opts_.path);
  } catch (...) {
  }
  auto tmp = TempFile::create(pf_, opts_.path, opts_.file_mode);
  if (!tmp) return tmp.error();
  if (auto r = write_empty_cache(tmp->file()); !r) return r;
  if (auto r = tmp->commit(opts_.durability != Durability::none); !r) return r.error();
  log::info("created cache file '{}'", opts_.path);
  return {};
}

bool Core::compaction_due(const CommittedState& st) const {
  if (opts_.compact_dead_percent == 0 || opts_.read_only) return false;
  // The share is of the file's data: everything but the header and the index in use. So a file
  // half of whose entries were replaced (a whole model repacked once) is due, which it would miss
  // by a header's worth if the header counted.
  const std::uint64_t dead = dead_bytes_of(st, state_size_);
  const std::uint64_t fixed = format::kHeaderSize + st.slot.index_size + format::kFooterSize;
  const std::uint64_t data = state_size_ > fixed ? state_size_ - fixed : 0;
  return dead > 0 && dead >= opts_.compact_min_dead_bytes && dead * 100 >= data * opts_.compact_dead_percent;
}

bool Core::compact_in_place(const CommittedState& st, bool salvage) {
  MutexLock lock(write_mu_);  // nobody else has this cache yet; the lease's state wants it
  // Under the lease too: a writer reaching the file through another name (a hard link) would
  // hold the in-use lock as well, but the CLI and creators of a missing file take only the lease.
  if (auto r = acquire_lease_locked(nullptr, false); !r) {
    log::debug("'{}': not {} at open: {}", opts_.path, salvage ? "repaired" : "compacted", r.error().message);
    return false;
  }
  CompactSettings settings;
  settings.durability = opts_.durability;
  settings.salvage = salvage;
  settings.drop_corrupt = salvage;  // a damaged entry is a miss anyway; it must not keep the file broken
  CompactResult out;
  auto r = rewrite_compacted(pf_, fd_, st, state_size_, state_mode_, settings, &out,
                             [this]() WC_NO_THREAD_SAFETY_ANALYSIS {  // called while this holds write_mu_
    if (has_lease_) release_lease_locked();  // its data-file lock goes with the handle
    fd_.close();
  });
  release_lease_locked();
  if (!r) {
    log::warn("'{}': could not {} the cache at open ({}: {}); using it as it is", opts_.path,
              salvage ? "repair" : "compact", errc_name(r.error().code), r.error().message);
    return false;
  }
  if (!out.rewritten) return false;
  if (salvage) {
    log::warn("'{}': its newest commit does not verify; rewrote the previous one ({} entries{}) into a fresh file",
              opts_.path, out.entries,
              out.dropped != 0 ? ", " + std::to_string(out.dropped) + " damaged ones left out" : std::string());
    fd_.close();  // the old file; its in-use lock goes with it
    return true;
  }
  log::info("'{}': compacted at open, {} -> {} bytes ({} entries)", opts_.path, out.bytes_before, out.bytes_after,
            out.entries);
  compactions_.fetch_add(1, std::memory_order_relaxed);
  fd_.close();  // the old file; its in-use lock goes with it
  return true;
}

Result<CommittedState> Core::read_state() {
  auto info = pf_.stat_file(fd_);
  if (!info) return info.error();
  auto st = read_committed_current(pf_, fd_, &info.value(), file_span_, 0);
  state_size_ = info->size;
  state_mode_ = info->mode;
  identity_ = {info->device, info->inode};
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

Result<void> Core::attach(CommittedState& st) {
  MutexLock lock(write_mu_);
  std::vector<Entry*> placed;
  if (auto r = attach_locked(st, &placed); !r) return r;
  adopt_verification(st, &placed);
  // When this cache was last used, for gc's least-recently-used order: the lock file's time, so
  // that opening never changes the cache file's.
  if (lock_fd_.is_open()) pf_.touch(lock_fd_);  // never open for a descriptor cache
  log::debug("opened '{}': {} entries, {} bytes committed", opts_.path, st.records.size(), committed_.committed_size);
  return {};
}

Result<void> Core::attach_locked(CommittedState& st, std::vector<Entry*>* placed) {
  if (st.slot.committed_size > file_span_)
    return Error{Errc::no_space, 0, "file is larger than max_file_bytes; raise max_file_bytes"};
  file_size_ = state_size_;
  publish_sizes_locked();
  if (auto r = ensure_mapped_locked(st.slot.committed_size); !r) return r.error();
  committed_ = st.slot;
  publish_sizes_locked();
  merge_records_locked(st.records, placed);
  return {};
}

void Core::await_file(const Error& why) {
  // The address space for the file is already reserved (init_file did that before it found no
  // file); refresh, or a miss with refresh_on_miss, attaches the file once it exists.
  file_backed_.store(false, std::memory_order_relaxed);
  file_disabled_ = true;
  set_heap_reason(why);
  awaiting_file_.store(true, std::memory_order_release);
}

Result<void> Core::try_attach_locked() {
  auto opened = open_in_use(std::chrono::steady_clock::now());  // no waiting: a later refresh tries again
  if (!opened) {
    fd_.close();
    return opened.error().sys_errno == ENOENT ? Result<void>() : Result<void>(opened.error());
  }
  auto st = read_state();
  Result<void> r = st ? attach_locked(st.value()) : Result<void>(st.error());
  if (!r) {
    fd_.close();
    return r;
  }
  awaiting_file_.store(false, std::memory_order_relaxed);
  file_backed_.store(true, std::memory_order_release);
  log::info("'{}': the cache file appeared; serving its {} entries", opts_.path, st->records.size());
  return {};
}

Result<format::CommitSlot> Core::read_latest_slot(std::uint64_t newer_than,
                                                  std::vector<format::IndexRecord>* records,
                                                  platform::FileInfo* info) {
  auto st = read_committed_current(pf_, fd_, info, file_span_, newer_than);
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


}  // namespace weightcache
