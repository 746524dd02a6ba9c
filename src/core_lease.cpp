// The writer lease: the lock file and the data file's lock, taken and released. (Core, see core.hpp.)
#include "core.hpp"
#include "core_internal.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace weightcache {

using namespace core_detail;

// ---------------------------------------------------------------------------------------------
// writer side
// ---------------------------------------------------------------------------------------------

void Core::sleep_unlocked(MutexLock* lk, std::chrono::microseconds d) {
  if (lk != nullptr) lk->unlock();
  std::this_thread::sleep_for(d);
  if (lk != nullptr) lk->lock();
}

Result<void> Core::acquire_lease_locked(MutexLock* lk, bool catch_up) {
  if (has_lease_) return {};
  if (!lease_file().is_open()) return Error{Errc::read_only, 0, "cache is open read-only"};
  // Another cache of this process holds the lease: on this lock file (the file at the path was
  // replaced, and this process opened the new one while still holding the old one's lease), or
  // on this data file (a cache of the same file opened by path and another on a descriptor or
  // handle: both lock the file itself). Waiting would be waiting for ourselves.
  Identity file_id;
  if (fd_.is_open())
    if (auto id = pf_.stat_file(fd_)) file_id = {id->device, id->inode};
  const Core* holder = lease_holder(lock_identity_);
  if (holder == nullptr || holder == this) holder = lease_holder(file_id);
  // A cache inherited across fork holds the parent's lease, which this process must wait for as
  // any other process's (its flock is on the parent's open file description, not ours).
  if (holder != nullptr && holder != this && !holder->in_forked_child())
    return Error{Errc::busy, 0,
                 "this process already holds the writer lease on '" + lease_file().path() +
                     "' through another cache open on the same file (by path, descriptor or handle, or a file "
                     "since replaced at that path); finalize or close that cache first"};
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
                   "another process held the writer lease on '" + lease_file().path() +
                       "' for longer than lease_timeout; raise lease_timeout, or finalize or close the cache "
                       "that process is writing"};
    }
    // Wait without the write mutex, so this process's readers can refresh and other threads
    // can commit their reservations meanwhile; callers re-read state after this returns.
    sleep_unlocked(lk, backoff);
    if (lk != nullptr && has_lease_) return {};  // another thread of ours took it meanwhile
    backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
  }
  has_lease_ = true;
  set_lease_holder(lock_identity_, this);
  set_lease_holder(file_id, this);
  leased_file_identity_ = file_id;
  lease_gave_up_ = false;
  if (!fd_.is_open() || !catch_up) return {};  // creating or replacing the file
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
  // reuse. Our own outstanding reservations always lie below it (see release_lease_if_safe_locked).
  cursor_ = align_up(committed_.committed_size, offset_align());
  flush_from_ = cursor_;
  prepared_end_ = cursor_;  // others may have written past it while we did not hold the lease
  allocated_end_ = cursor_;  // and the tail past it may have been grown, or made sparse, by anyone
  return {};
}

void Core::publish_sizes_locked() {
  seen_file_size_.store(file_size_, std::memory_order_relaxed);
  seen_committed_.store(committed_.committed_size, std::memory_order_relaxed);
  seen_trailer_.store(committed_.index_size + format::kFooterSize, std::memory_order_relaxed);
}

Result<bool> Core::try_lock_both_locked() {
  // The sidecar orders creation and rebuilds, which happen before there is a file to lock. The
  // data file's own lock makes appends exclusive per file, not per name: two processes that
  // open one file through two hard links hold different sidecars. Always sidecar first.
  // A cache on a descriptor leases the file itself: one lock (Windows refuses a second
  // exclusive lock of the same byte through the same handle).
  auto got = pf_.try_lock(lease_file());
  if (!got || !got.value() || !fd_.is_open() || &lease_file() == &fd_) return got;
  auto data = pf_.try_lock(fd_);
  if (!data || !data.value()) {
    pf_.unlock(lease_file());
    return data;
  }
  data_locked_ = true;
  return true;
}

void Core::release_lease_locked() noexcept {
  if (!has_lease_) return;
  if (data_locked_) {
    pf_.unlock(fd_);  // the file it was taken on: every path that closes fd_ gives the lease back first
    data_locked_ = false;
  }
  pf_.unlock(lease_file());
  has_lease_ = false;
  set_lease_holder(lock_identity_, nullptr);
  set_lease_holder(leased_file_identity_, nullptr);
  leased_file_identity_ = {};
}

void Core::release_lease_if_safe_locked() {
  // A reservation past the committed size would be handed to the next writer as free space:
  // keep the lease until a finalize writes a trailer after it (or until close).
  for (const auto& [off, r] : reservations_)
    if (!r.heap && off + r.capacity > committed_.committed_size) return;
  release_lease_locked();
}


}  // namespace weightcache
