// The commit protocol: inserting entries, merging what other processes committed, and persisting
// (data, then index, then the commit slot, each synced in order). (Core, see core.hpp.)
#include "core.hpp"
#include "core_internal.hpp"
#include "file_state.hpp"
#include "log.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace weightcache {

using namespace core_detail;

// ---------------------------------------------------------------------------------------------
// index
// ---------------------------------------------------------------------------------------------

void Core::merge_records_locked(std::vector<format::IndexRecord>& records, std::vector<Entry*>* placed) {
  // All or nothing: everything that allocates comes before the first publish, so running out of
  // memory (it propagates) leaves the index as it was. A partial merge would be worse than none:
  // this process's next commit writes an index of what it knows, and would drop the rest.
  // An empty index (an open) knows none of the keys: no look-up per record, and the durable
  // bytes are the merged ones (the index holds no key twice: decode_trailer refuses that).
  const bool first = index_.live_count() == 0 && heap_bytes_ == 0 && mapped_bytes_ == 0;
  if (first) {
    // The index's storage made at once for what the file holds (entry_index.hpp, size_hint).
    std::uint64_t key_bytes = 0;
    for (const auto& r : records) key_bytes += r.key.size();
    index_.size_hint(records.size(), key_bytes);
  }
  {
    // write_mu_ is held: no other writer changes the index meanwhile.
    std::vector<Entry*> fresh;
    fresh.reserve(records.size());
    if (placed != nullptr) {
      placed->clear();
      placed->reserve(records.size());
    }
    for (auto& r : records) {
      if (!first) {
        if (Entry* mine = find_entry(r.key); mine != nullptr && (mine->offset == r.offset || !mine->durable.load())) {
          // already known, or ours and not yet committed: ours wins
          if (placed != nullptr) placed->push_back(mine->offset == r.offset ? mine : nullptr);
          continue;
        }
      }
      Entry* e = index_.make(r.key);
      e->offset = r.offset;
      e->size = r.size;
      e->checksum = r.checksum;
      e->in_file = true;
      e->durable.store(true, std::memory_order_relaxed);
      fresh.push_back(e);
      if (placed != nullptr) placed->push_back(e);
    }
    if (opts_.verify == Verify::on_open) verify_all(fresh);
    index_.reserve_publishes(fresh.size());  // from here on nothing allocates
    for (Entry* e : fresh) {
      if (Entry* old = index_.publish(e); old != nullptr) {
        if (old->in_file) mapped_bytes_ -= old->size;
        else heap_bytes_ -= old->size;
      }
      mapped_bytes_ += e->size;
    }
    if (first) {
      std::uint64_t bytes = 0;
      for (const Entry* e : fresh)
        if (!e->replaced.load(std::memory_order_relaxed)) bytes += round_size(e->size);
      durable_live_.store(bytes, std::memory_order_relaxed);
      return;
    }
  }
  recount_durable_locked();
}

void Core::recount_durable_locked() {
  std::uint64_t bytes = 0;
  index_.for_each_live([&](const Entry& e) {
    if (e.durable.load(std::memory_order_relaxed)) bytes += round_size(e.size);
  });
  durable_live_.store(bytes, std::memory_order_relaxed);
}


std::size_t Core::look_up_or_insert(std::string_view key, void* ptr, std::size_t size, std::uint64_t* awaits) {
  if (awaits != nullptr) *awaits = 0;
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
    if (in_forked_child()) {
      set_last_error(inherited_refusal("look_up_or_insert"));
      return kNotFound;
    }
    if (std::string why = source_problem(ptr, size); !why.empty()) {
      set_last_error({Errc::invalid_argument, 0, "look_up_or_insert: " + why});
      return kNotFound;
    }
    const std::uint64_t checksum = format::hash_bytes(ptr, size);
    const auto* p = static_cast<std::byte*>(ptr);
    MutexLock lock(write_mu_);
    std::optional<std::pair<std::uint64_t, Reservation>> res;
    if (std::uint64_t at = 0, room = 0; offset_of(p, &at, &room)) {
      auto it = reservations_.find(at);
      if (it != reservations_.end() && size <= it->second.capacity) {
        res.emplace(it->first, it->second);
        erase_reservation_locked(it);
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
      else if (std::uint8_t trusted = kTrusted; old->state.compare_exchange_strong(trusted, kGood))
        wake_verify_waiters();
      // The caller gets that entry: it has been finalized when that entry has.
      if (awaits != nullptr) *awaits = old->awaits_finalize;
      return old;
    };
    if (Entry* old = same()) {
      if (res) release_reservation_locked(res->first, res->second);
      return static_cast<std::size_t>(old->offset);
    }
    Region region;
    if (res && !res->second.heap && !span_fits(cursor_, index_room_locked(1, key.size()))) {
      // The span cannot index it: its room assumed a key of at most kReservedKeyBytes, or a
      // finalize since it was reserved wrote an index into that room (the next index goes after
      // that one).
      if (opts_.backing == Backing::file) {
        add_reservation_locked(res->first, res->second);  // still the caller's, to release
        set_last_error({Errc::no_space, 0,
                        "max_file_bytes reached: no room left in the file for the index record of a " +
                            std::to_string(key.size()) + "-byte key; raise max_file_bytes"});
        return kNotFound;
      }
      // As for a reservation the file cannot take: heap memory (the write mutex is held
      // throughout, so nobody reuses the reservation's bytes before they are copied).
      auto h = allocate_heap_locked(round_size(size));
      if (!h) {
        add_reservation_locked(res->first, res->second);
        set_last_error(h.error());
        return kNotFound;
      }
      std::memcpy(addr(h.value()), ptr, size);
      release_reservation_locked(res->first, res->second);
      heap_fallbacks_.fetch_add(1, std::memory_order_relaxed);
      region = Region{h.value(), true};
    } else if (res) {
      region = Region{res->first, res->second.heap};
    } else {
      bool fell_back = false;
      const std::uint64_t cap = round_size(size);
      auto r = allocate_locked(cap, /*for_stores=*/false, key.size(), &fell_back, lock);
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
    // Only a finalize that starts from here on covers it (finalize counts under write_mu_).
    raw->awaits_finalize = finalizes_started_.load(std::memory_order_relaxed) + 1;
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
      // Its bytes are final: have the OS write them while the host packs the next ones, so the
      // finalize that makes them durable waits for less. Whole pages only: the next entry may
      // share a page with this one's ends, and storing to a page under write-back may wait.
      if (opts_.durability != Durability::none && opts_.write_back_early) {
        const std::uint64_t page = pf_.map_granularity();
        const std::uint64_t lo = align_up(region.offset, page), hi = (region.offset + size) / page * page;
        if (hi > lo) pf_.start_write_back(fd_, lo, hi - lo);
      }
    } else {
      heap_bytes_ += size;
      if (persist_wanted()) {
        unpersisted_entries_.fetch_add(1, std::memory_order_relaxed);
        unpersisted_bytes_.fetch_add(size, std::memory_order_relaxed);
      }
    }
    finalized_.store(false, std::memory_order_release);
    if (awaits != nullptr) *awaits = raw->awaits_finalize;
    return static_cast<std::size_t>(raw->offset);
  } catch (...) {
    set_last_error(Errc::no_memory, 0, "out of memory while inserting into", opts_.path.c_str());
    return kNotFound;
  }
}

Result<void> Core::migrate_heap_entries_locked() {
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
      if (auto r = grow_file_locked(off + round_size(e->size), index_room_locked(1, e->key.size())); !r)
        return r.error();  // the rest stay in memory; what moved is committed
      cursor_ = off + round_size(e->size);
      std::memcpy(addr(off), addr(e->offset), e->size);
      Entry* raw = index_.make(e->key);
      raw->offset = off;
      raw->size = e->size;
      raw->checksum = e->checksum;
      raw->in_file = true;
      raw->state.store(kGood, std::memory_order_relaxed);  // copied from our own private memory
      raw->awaits_finalize = e->awaits_finalize;  // the same insert, whichever finalize moved it
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

Result<void> Core::persist_locked(MutexLock& lk) {
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
                       ") than this cache loaded (" + std::to_string(committed_.sequence) +
                       "): one that does not verify (a truncated or damaged file; the next open that finds it "
                       "unused repairs it), or another writer's; reopen the cache"};
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
  // Nothing flushed these pages: the next process that verifies and records would have to write
  // them all back first (adopt_verification), about 5x its time after a durable writer for
  // 1 GiB. finalize has that write-back started on a thread (start_write_back_behind) and never
  // waits for it. A descriptor cache (":memory:" too) has no such reader: it keeps no record.
  if (!full && !from_descriptor_ && commit_write_back_) write_back_owed_ = slot.committed_size;
  maybe_trim_locked();
  release_lease_if_safe_locked();
  return migrated;
}

void Core::maybe_trim_locked() {
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
    prepared_end_ = std::min(prepared_end_, keep);
    allocated_end_ = std::min(allocated_end_, keep);
  }
}

Result<void> Core::finalize() {
  try {
    if (in_forked_child()) return fail(inherited_refusal("finalize"));
    MutexLock lock(write_mu_);
    // A commit that flushed nothing has its write-back started when this finalize returns,
    // whatever the outcome: what was committed is final (committed bytes are never rewritten).
    struct StartWriteBack {
      Core& core;
      ~StartWriteBack() WC_NO_THREAD_SAFETY_ANALYSIS {
        const std::uint64_t owed = core.write_back_owed_;
        core.write_back_owed_ = 0;
        if (owed != 0) core.start_write_back_behind(owed);
      }
    } start_write_back{*this};
    lease_gave_up_ = false;  // a new packing phase may wait for the lease again
    // Finalize always ends the packing phase (runtimes refuse to run until it has), even when
    // persisting fails: the entries are still served from memory, and the error says why.
    finalized_.store(true, std::memory_order_release);
    // Every entry inserted before this point (awaits_finalize <= the new count) is finalized for
    // whoever inserted it (the finalize ticket, wc_is_finalized_through); an insert while the
    // lease wait below lets go of write_mu_ waits for the next finalize, as finalized_ does.
    finalizes_started_.store(finalizes_started_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
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

void Core::start_write_back_behind(std::uint64_t committed_size) noexcept {
  // Starting write-back is not waiting for it, but the OS submits the pages in the caller's
  // thread and blocks it while the disk's queue is full: for 1 GiB that took about as long as
  // writing it (docs/BENCHMARKS.md). So a thread of its own does it, and the finalize returns.
  // The whole committed range each time: the OS skips pages that are clean or already being
  // written, so what an earlier finalize started is not written twice.
  WriteBackSync& wb = *write_back_sync_;
  {
    std::lock_guard<std::mutex> lk(wb.mu);
    wb.owed = std::max(wb.owed, committed_size);
    if (wb.running.load(std::memory_order_relaxed)) return;  // it takes the new range when done with its own
    wb.running.store(true, std::memory_order_relaxed);
  }
  // The thread before this one (if any) has said it is done: it is at most returning, so the join
  // is short. Under write_mu_ (finalize), so no other caller starts or joins one meanwhile.
  join_thread(write_back_thread_);
  try {
    write_back_thread_ = std::make_unique<std::thread>([this, &wb] {
      for (;;) {
        std::uint64_t size = 0;
        {
          std::lock_guard<std::mutex> lk(wb.mu);
          size = wb.owed;
          wb.owed = 0;
          if (size == 0) {
            // The last touch of the cache: close may free it once the mutex is free.
            wb.running.store(false, std::memory_order_release);
            wb.cv.notify_all();
            return;
          }
        }
        pf_.start_write_back(fd_, 0, size);
      }
    });
  } catch (...) {
    // No thread: the next verifying process writes the pages back itself, as it always could.
    std::lock_guard<std::mutex> lk(wb.mu);
    wb.owed = 0;
    wb.running.store(false, std::memory_order_relaxed);
  }
}

void Core::wait_for_write_back() noexcept {
  WriteBackSync& wb = *write_back_sync_;
  {
    std::unique_lock<std::mutex> lk(wb.mu);
    wb.cv.wait(lk, [&] { return !wb.running.load(std::memory_order_acquire); });
  }
  // As stop_verify_ahead: joined, so that no thread runs this library's code after close.
  join_thread(write_back_thread_);
}

Result<void> Core::persist_all_locked(MutexLock& lk) {
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
