// Allocation: the heap arena, the file's growth and mapping, reservations. (Core, see core.hpp.)
#include "core.hpp"
#include "core_internal.hpp"
#include "log.hpp"

#include <algorithm>
#include <cerrno>

namespace weightcache {

using namespace core_detail;

// ---------------------------------------------------------------------------------------------
// heap arena
// ---------------------------------------------------------------------------------------------

HeapArena::~HeapArena() {
  // In the order they were reserved (the array would release them the other way round).
  for (unsigned i = 0, n = count_.load(std::memory_order_acquire); i < n; ++i) chunks_[i].space.release();
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
  return chunks_[lo].space.base() + (off - chunks_[lo].start);
}

bool HeapArena::contains(const std::byte* p) const noexcept {
  for (unsigned i = 0, n = count_.load(std::memory_order_acquire); i < n; ++i)
    if (chunks_[i].space.contains(p)) return true;
  return false;
}

bool HeapArena::find(const std::byte* p, std::uint64_t* off, std::uint64_t* room) const noexcept {
  for (unsigned i = 0, n = count_.load(std::memory_order_acquire); i < n; ++i) {
    const Chunk& c = chunks_[i];
    if (!c.space.contains(p)) continue;
    const auto at = static_cast<std::uint64_t>(p - c.space.base());
    *off = c.start + at;
    *room = c.committed > at ? c.committed - at : 0;
    return true;
  }
  return false;
}

Result<void> HeapArena::commit(Chunk& c, std::uint64_t end, std::uint64_t gran) {
  if (end <= c.committed) return {};
  // Geometric, as the file grows, but settle for just what is needed when memory is short.
  const std::uint64_t size = c.space.size();
  std::uint64_t target = std::min(std::max({align_up(end, gran), c.committed * 2, kMinChunk}), size);
  auto r = pf_.commit_memory(c.space.base() + c.committed, static_cast<std::size_t>(target - c.committed));
  if (!r && target > align_up(end, gran)) {
    target = std::min(align_up(end, gran), size);
    r = pf_.commit_memory(c.space.base() + c.committed, static_cast<std::size_t>(target - c.committed));
  }
  if (!r) return r.error();
  c.committed = target;
  return {};
}

Result<std::uint64_t> HeapArena::place(std::uint64_t from, std::uint64_t size, std::uint64_t align,
                                       std::uint64_t gran) {
  const unsigned n = count_.load(std::memory_order_relaxed);
  if (n > 0) {  // the rest of the last chunk
    Chunk& c = chunks_[n - 1];
    const std::uint64_t off = align_up(std::max(from, c.start), align);
    if (off + size >= off && off + size <= c.start + c.space.size()) {
      auto r = commit(c, off - c.start + size, gran);
      if (r) return off;
      // The rest of this chunk cannot be committed. On Windows without placeholder support that
      // can be for good: another allocation took part of its address range while a mapping
      // released and reserved it again (src/platform/win32_segments.cpp). A new chunk after it
      // takes the entry if memory allows (else its own error says why); the rest stays unused.
    }
  }
  if (size > kMaxEntrySize) return Error{Errc::no_memory, 0, "heap arena exhausted"};
  if (n == kMaxChunks)
    return Error{Errc::no_memory, 0, "the heap arena is in too many pieces (address space short); reopen the cache"};
  // A new chunk after the last, aligned like the addresses it hands out. It doubles the arena
  // (so chunks stay few), or holds just this entry when the address space is short.
  const std::uint64_t chunk_align = std::max(align, gran);
  const std::uint64_t start = n == 0 ? 0 : align_up(chunks_[n - 1].start + chunks_[n - 1].space.size(), chunk_align);
  const std::uint64_t need = align_up(std::max<std::uint64_t>(size, 1), gran);
  std::uint64_t want = std::max({need, reserved_, kMinChunk});
  Result<platform::AddressReservation> r = Error{Errc::no_memory, 0, ""};
  for (;;) {
    r = want <= SIZE_MAX ? platform::AddressReservation::reserve(pf_, static_cast<std::size_t>(want),
                                                                 static_cast<std::size_t>(chunk_align))
                         : Result<platform::AddressReservation>(Error{Errc::no_memory, 0, "address space too small"});
    if (r || want == need) break;
    want = std::max(need, align_up(want / 2, gran));
  }
  if (!r)
    return Error{r.error().code, r.error().sys_errno,
                 "cannot reserve " + std::to_string(need >> 20) + " MiB of address space for heap memory: " +
                     r.error().message};
  // Readers see chunks_[n] only once count_ says so: until then it is the writer's alone.
  Chunk& c = chunks_[n];
  c.start = start;
  c.committed = 0;
  c.space = std::move(r).value();
  if (auto cr = commit(c, size, gran); !cr) {
    c = Chunk{};  // gives the range back
    return Error{cr.error().code, cr.error().sys_errno, "cannot commit heap memory: " + cr.error().message};
  }
  reserved_ += want;
  count_.store(n + 1, std::memory_order_release);
  return start;
}

std::string Core::source_problem(const void* ptr, std::uint64_t size) {
  const auto* p = static_cast<const std::byte*>(ptr);
  if (!space_.contains(p) && !heap_.contains(p))
    return {};  // the caller's own memory: its size is the caller's word
  MutexLock lock(write_mu_);
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
  if (space_.contains(p)) {
    *offset = static_cast<std::uint64_t>(p - space_.base());
    *room = mapped_end_ > *offset ? mapped_end_ - *offset : 0;
    return true;
  }
  std::uint64_t arena_off = 0;
  if (!heap_.find(p, &arena_off, room)) return false;
  *offset = file_span_ + arena_off;
  return true;
}


Result<void> Core::ensure_mapped_locked(std::uint64_t end) {
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

std::uint64_t Core::index_room_locked(std::uint64_t more, std::uint64_t more_key_bytes) const {
  const std::uint64_t reserved = file_reservations_;
  const std::uint64_t index = format::kIndexHeaderSize +
                              (index_.file_entries() + more + reserved) * format::kRecordFixedSize +
                              index_.file_key_bytes() + more_key_bytes + reserved * kReservedKeyBytes;
  // An index past the format's cap is never written: no room for it anywhere.
  if (index > format::kMaxIndexSize) return UINT64_MAX;
  return 8 + index + format::kFooterSize;
}

void Core::add_reservation_locked(std::uint64_t offset, const Reservation& r) {
  reservations_.emplace(offset, r);  // may throw, and then nothing changed
  if (!r.heap) ++file_reservations_;
}

void Core::erase_reservation_locked(std::map<std::uint64_t, Reservation>::iterator it) {
  if (!it->second.heap) --file_reservations_;
  reservations_.erase(it);
}

Result<void> Core::grow_file_locked(std::uint64_t end, std::uint64_t room) {
  // The span must also hold the index after the data: a file filled to the end of its span could
  // never be committed again, and every later session would pack everything anew.
  if (!span_fits(end, room)) return Error{Errc::no_space, 0, "max_file_bytes reached; raise it or compact the cache"};
  if (const std::uint64_t inside = std::min(end, file_size_); inside > allocated_end_) {
    // Inside the file, past what this lease allocated: a tail another writer grew, or one made
    // sparse since (a crash, then a sparse copy). A store through the mapping into a hole the
    // disk cannot back is SIGBUS: allocate it first, as growth does, and fail here instead.
    // Only what this allocation needs: the tail may claim far more than the disk has (a hostile
    // or damaged file: a 1 TiB hole), and a failed fallocate may keep what it got.
    const std::uint64_t from = std::max(allocated_end_, cursor_);
    if (from < inside)
      if (auto r = pf_.allocate(fd_, from, inside - from); !r) return r.error();
    allocated_end_ = inside;
  }
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
    allocated_end_ = target;
    publish_sizes_locked();
  }
  return ensure_mapped_locked(end);
}

Result<void> Core::prepare_locked(std::uint64_t off, std::uint64_t size) {
  // Space at or past the cursor (`off` is) holds no entry or index, and the lease keeps other
  // writers out. Space this process prepared since it took the lease is never written again, so
  // a released reservation there still holds its bytes for this process's next copy (when no
  // other writer took the lease meanwhile: released memory is not the caller's to read).
  constexpr std::uint64_t kAhead = 1 << 20;  // many small reservations, one write
  const std::uint64_t end = off + size;
  if (end <= prepared_end_) return {};
  const std::uint64_t from = std::max(off, prepared_end_);
  const std::uint64_t to = std::min(std::max(end, from + kAhead), file_size_);
  if (auto r = pf_.prepare_for_stores(fd_, from, to - from); !r) return r;
  prepared_end_ = to;
  return {};
}

Result<std::uint64_t> Core::allocate_heap_locked(std::uint64_t size) {
  auto r = heap_.place(heap_cursor_, size, align_, gran_);
  if (!r) return r.error();
  heap_cursor_ = r.value() + size;
  return file_span_ + r.value();
}

Result<Core::Region> Core::allocate_locked(std::uint64_t size, bool for_stores, std::uint64_t key_bytes,
                                           bool* fell_back, MutexLock& lk) {
  *fell_back = false;
  Error why{Errc::ok, 0, {}};
  if (file_backed_ && !file_disabled_ && !opts_.read_only) {
    auto lease = acquire_lease_locked(&lk);
    if (lease) {
      const std::uint64_t off = align_up(cursor_, offset_align());
      auto r = grow_file_locked(off + size, index_room_locked(1, key_bytes == kUnknownKey ? kReservedKeyBytes : key_bytes));
      // Not for a copy: its source may be a released reservation that this very space reuses.
      if (r && for_stores) r = prepare_locked(off, size);
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

void* Core::reserve(std::size_t size) {
  try {
    if (in_forked_child()) {
      set_last_error(inherited_refusal("reserve"));
      return nullptr;
    }
    if (size > kMaxEntrySize) {
      set_last_error({Errc::invalid_argument, 0,
                      "reserve: size " + std::to_string(size) + " is over " + kMaxEntrySizeText +
                          ", the largest entry a cache takes"});
      return nullptr;
    }
    MutexLock lock(write_mu_);
    const std::uint64_t cap = round_size(size);
    bool fell_back = false;
    auto region = allocate_locked(cap, /*for_stores=*/true, kUnknownKey, &fell_back, lock);
    if (!region) {
      set_last_error(region.error());
      return nullptr;
    }
    add_reservation_locked(region->offset, Reservation{cap, region->heap});
    return addr(region->offset);
  } catch (...) {
    set_last_error(Errc::no_memory, 0, "out of memory while reserving space in", opts_.path.c_str());
    return nullptr;
  }
}

Result<void> Core::release(void* ptr) {
  if (in_forked_child()) return fail(inherited_refusal("release"));
  MutexLock lock(write_mu_);
  std::uint64_t at = 0, room = 0;
  if (!offset_of(ptr, &at, &room))
    return fail({Errc::invalid_argument, 0, "release: pointer is not from this cache"});
  auto it = reservations_.find(at);
  if (it == reservations_.end())
    return fail({Errc::invalid_argument, 0, "release: pointer is not an outstanding reservation's start"});
  const auto [offset, r] = *it;
  erase_reservation_locked(it);
  release_reservation_locked(offset, r);
  return {};
}

void Core::release_reservation_locked(std::uint64_t offset, const Reservation& r) {
  // Give the space back when it is the last thing allocated (the common re-insert case), so
  // re-inserting identical bytes does not grow the file.
  if (r.heap) {
    if (offset - file_span_ + r.capacity == heap_cursor_) heap_cursor_ = offset - file_span_;
  } else if (has_lease_ && offset + r.capacity == cursor_) {
    cursor_ = offset;
  }
  // Nothing left for a finalize to commit (the reservation given back, or an insert that found
  // its bytes already committed by another process): the cache stays finalized, so a host that
  // finalizes only an unfinalized cache never calls finalize. Let go of the lease, or other
  // processes wait lease_timeout for it. The file keeps any tail grown for it (the next
  // finalize or close trims it): cutting it here would leave the given-back space past the end
  // of the file, where a read through the mapping faults.
  if (has_lease_ && pending_.empty() && unpersisted_entries_.load(std::memory_order_relaxed) == 0)
    release_lease_if_safe_locked();
}


}  // namespace weightcache
