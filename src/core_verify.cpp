// Verification: checksums of entries on first use or at open, the verify-ahead thread, and a forked
// child's share of them. (Core, see core.hpp.)
#include "core.hpp"
#include "boundary.hpp"
#include "core_internal.hpp"
#include "log.hpp"

#include <algorithm>
#include <thread>

namespace weightcache {

using namespace core_detail;

void Core::verify_all(const std::vector<Entry*>& entries) {
  // Checksumming is memory-bound per core: spread big loads over the cores (entries are never
  // split, so a single huge entry still takes one core).
  std::uint64_t total = 0;
  for (const auto& e : entries) total += e->size;
  const unsigned hw = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  const unsigned workers = total < (64ull << 20) ? 1 : hw;
  std::atomic<std::size_t> next{0};
  // Each worker thread's body is a boundary; an entry a failure left unverified is verified on
  // its first look-up instead.
  auto work = [&] {
    guard_void("verify worker", [&] {
      for (std::size_t i = next.fetch_add(1); i < entries.size(); i = next.fetch_add(1)) verify_entry(entries[i]);
    });
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

bool Core::verify_entry(Entry* e) {
  std::uint8_t s = e->state.load(std::memory_order_acquire);
  if (s == kGood) return true;
  if (s == kBad) return false;
  if (opts_.verify == Verify::none) return true;
  for (;;) {
    if (s == kTrusted && trust_confirmed_now()) {
      // A check this interval found the file unchanged: good without claiming it (nobody waits
      // on a trusted entry, so there is nobody to wake). Counted before it is published, as in
      // confirm_trusted; uncounted if another thread settled it first.
      trusted_entries_.fetch_add(1, std::memory_order_relaxed);
      if (e->state.compare_exchange_strong(s, kGood, std::memory_order_acq_rel)) return true;
      trusted_entries_.fetch_sub(1, std::memory_order_relaxed);
      continue;  // s now holds what another thread put there
    }
    if (s == kUnverified || s == kTrusted) {
      const bool trusted = s == kTrusted;
      if (e->state.compare_exchange_weak(s, kVerifying, std::memory_order_acq_rel))
        return trusted ? confirm_trusted(e) : finish_verify(e);
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

Core::Check Core::check_bytes(const Entry* e, const std::atomic<bool>* stop) const {
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

bool Core::finish_verify(Entry* e, const std::atomic<bool>* stop, Verifier by) {
  Check c;
  try {
    c = check_bytes(e, stop);
  } catch (...) {
    // No verdict (out of memory asking for holes): give the claim back, or every later look-up
    // of this entry would wait for a verdict that never comes.
    e->state.store(kUnverified, std::memory_order_release);
    wake_verify_waiters();
    throw;
  }
  if (c == Check::stopped) {  // closing: no verdict, as if never claimed
    e->state.store(kUnverified, std::memory_order_release);
    wake_verify_waiters();
    return false;
  }
  return settle_verdict(e, c, by);
}

bool Core::settle_verdict(Entry* e, Check c, Verifier by) {
  const bool ok = c == Check::good;
  // Counted before the verdict is published: a look-up that waited for this verdict (the
  // verify-ahead thread's) and then reads the stats must find the failure counted. Counting after
  // the store let such a reader see a miss and verify_failures 0 (the arm64 run caught it once);
  // the same for the verify-ahead thread's own count.
  if (!ok) ++verify_failures_;
  if (by == Verifier::ahead) verified_ahead_.fetch_add(1, std::memory_order_relaxed);
  e->state.store(ok ? kGood : kBad, std::memory_order_release);
  wake_verify_waiters();
  if (!ok) {
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

Error Core::inherited_refusal(const char* call) const {
  // A finalize here would publish under the parent's lease and, on close of the descriptor it
  // reopened, could let go of the parent's flock: a third process could then write beside the
  // parent. Refuse, and say what the child can do instead.
  return Error{Errc::invalid_argument, 0,
               std::string(call) + ": this cache was opened by the process this one was forked from; a forked child "
                                   "may look entries up in it and close it, never write to it: open a cache of its own "
                                   "with wc_open"};
}

void Core::start_verify_ahead() {
  const bool on_first_use = opts_.verify == Verify::first_use || opts_.verify == Verify::shared;
  if (!on_first_use || !opts_.verify_ahead || std::thread::hardware_concurrency() < 2) return;
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
      verify_ahead_thread_ = std::make_unique<std::thread>([this, sync, todo = std::move(todo)] {
        // A thread's body is a boundary: a failure ends the work ahead, and look-ups verify
        // what is left on first use.
        guard_void("verify-ahead thread", [&] {
          for (Entry* e : todo) {
            if (sync->stop.load(std::memory_order_relaxed)) break;
            std::uint8_t expected = kUnverified;
            // Counted with its verdict; stopped half-way, it leaves the entry unverified and
            // uncounted (close is waiting: nothing else runs).
            if (e->state.compare_exchange_strong(expected, kVerifying, std::memory_order_acq_rel))
              finish_verify(e, &sync->stop, Verifier::ahead);
          }
        });
        // All of it checked: the next process to find the file in this state need not hash it.
        if (!sync->stop.load(std::memory_order_relaxed)) publish_verification();
        // The last touch of the cache: close may free it (and `sync`) once the mutex is free.
        std::lock_guard<std::mutex> lk(sync->mu);
        sync->ahead_running.store(false, std::memory_order_release);
        sync->cv.notify_all();
      });
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
    (void)verify_ahead_thread_.release();  // the parent's: neither joinable nor destructible here
    return;
  }
  {
    std::unique_lock<std::mutex> lk(sync.mu);
    sync.cv.wait(lk, [&] { return !sync.ahead_running.load(std::memory_order_acquire); });
  }
  // Done with the cache, but still returning through this library's code: joined, so that a host
  // may unload the library (dlclose) as soon as close returns.
  join_thread(verify_ahead_thread_);
}


}  // namespace weightcache
