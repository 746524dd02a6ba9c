// Verified once per file state (docs/DESIGN.md, "Verified once per file state"): a process that
// opens a file in exactly the committed state an earlier process of this boot verified trusts
// that verification instead of hashing the same bytes again; it leaves a record of what it
// verified itself for the next one. (Core, see core.hpp; the record, verify_record.hpp.)
#include "core.hpp"
#include "boundary.hpp"
#include "core_internal.hpp"
#include "log.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <optional>
#include <thread>

namespace weightcache {

using namespace core_detail;

namespace {

// Anyone who may write the record must be able to write the cache file itself, or the record
// would let them vouch for bytes they could not have put there: the lock file belongs to the
// cache file's owner (or root), gives no write permission the cache file does not, and gives
// its group's write permission only to the cache file's group.
bool record_as_trusted_as_file(const platform::FileInfo& lock, const platform::FileInfo& file) noexcept {
  if (lock.owner != file.owner && lock.owner != 0) return false;
  if ((lock.mode & 020u) != 0 && lock.group != file.group) return false;
  return (lock.mode & 022u & ~(file.mode & 022u)) == 0;
}

// A node record (a file on a read-only mount, whose record lives in the record directory) is
// written by whoever opened that file first in this boot: it must be this user or root, and
// nobody else may write it. Nobody can write the cache file through a read-only mount, so there
// is no writer of the file to compare with.
bool node_record_trusted(const platform::FileInfo& record, std::optional<std::uint32_t> user) noexcept {
  return user && (record.owner == *user || record.owner == 0) && (record.mode & 022u) == 0;
}

enum class LockFile { untrusted, other_content, ours };

// Whether the lock file open at `lock` may hold a record for the cache file `cache`, and be
// written with one. Asked at open and again just before every write: the lock file may have
// been given another name, a link or other content meanwhile. `node`: a node record (above).
LockFile examine_lock_file(platform::Platform& pf, const std::string& lock_path, const platform::File& lock,
                           const platform::FileInfo& cache, bool node = false) {
  auto info = pf.stat_file(lock);
  if (!info || !info->regular || pf.has_access_list(lock)) return LockFile::untrusted;
  if (node ? !node_record_trusted(info.value(), pf.effective_user()) : !record_as_trusted_as_file(info.value(), cache))
    return LockFile::untrusted;
  // The cache's own: one name, the one beside the cache, not a symlink. A record is written into
  // it, and a hard or symbolic link planted at "<path>.lock" would have the library overwrite
  // somebody else's file.
  auto named = pf.stat_path(lock_path, /*follow=*/false);
  if (info->links != 1 || !named || named->symlink || named->device != info->device || named->inode != info->inode)
    return LockFile::untrusted;
  // Never written over: a lock file holding something that is not a record (a file of another
  // program that happens to have this name). A damaged record of ours still has a record's header.
  if (info->size == 0) return LockFile::ours;
  std::byte head[kRecordFixedBytes];
  if (info->size < sizeof head || !pf.read_at(lock, head, sizeof head, 0) || !record_size_if_header(head, info->size))
    return LockFile::other_content;
  return LockFile::ours;
}

}  // namespace

void Core::describe_state(Trust& t, const format::CommitSlot& slot, const std::vector<format::IndexRecord>& records,
                          const platform::FileInfo& info, const std::vector<Entry*>* placed) const {
  StateStamp& s = t.stamp;
  s.device = info.device;
  s.inode = info.inode;
  s.size = info.size;
  s.mtime_ns = info.mtime_ns;
  s.ctime_ns = info.ctime_ns;
  s.sequence = slot.sequence;
  s.committed_size = slot.committed_size;
  s.index_checksum = slot.index_checksum;
  s.entries = records.size();
  t.entries.assign(records.size(), nullptr);
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    // What merged these records knows where each went; the key's entry now is the same one
    // (write_mu_ is held from the merge to here), so a look-up would only hash the key again.
    Entry* e = placed != nullptr && placed->size() == records.size() ? (*placed)[i] : find_entry(r.key);
    if (e != nullptr && !e->replaced.load(std::memory_order_relaxed) && e->in_file && e->offset == r.offset && e->size == r.size && e->checksum == r.checksum)
      t.entries[i] = e;
  }
}

void Core::adopt_verification(const CommittedState& st, const std::vector<Entry*>* placed) {
  // Only ever a saving: without memory for it, every entry is verified as in first_use.
  try {
    adopt_verification_or_throw(st, placed);
  } catch (const std::bad_alloc&) {
    log::debug("'{}': no memory to read its verification record; verifying per process", opts_.path);
  }
}

void Core::adopt_verification_or_throw(const CommittedState& st, const std::vector<Entry*>* placed) {
  if (opts_.verify != Verify::shared || from_descriptor_ || !file_backed_.load(std::memory_order_relaxed)) return;
  auto t = std::make_unique<Trust>();
  // The clock first, the file's state after: a change made after this reading gets a change
  // time at or past it (change_would_show), so it cannot hide behind the stamp's.
  const std::int64_t clock = pf_.change_clock_ns();
  if (clock == 0 || !pf_.boot_id(t->stamp.boot)) return;
  auto info = pf_.stat_file(fd_);
  if (!info) return;
  const std::int64_t window = pf_.change_window_ns(fd_, info.value());
  if (window <= 0) return;  // not every change moves its change time here: verification per process
  describe_state(*t, st.slot, st.records, info.value(), placed);
  const StateStamp& s = t->stamp;
  t->publishable = change_would_show(s.ctime_ns, clock, window);
  // A first use may rely on a check made less than this long before it (confirm_trusted).
  t->recheck_ns = std::min(window, platform::kFineChangeWindowNs);

  t->record_path = lock_path_;
  if (lock_fd_.is_open() && !leases_own_file_) {
    t->record = &lock_fd_;
    t->writable = true;
  } else if (opts_.read_only && node_record_applies() && open_node_record(*t, info.value())) {
    // Nothing can be written beside a file on a read-only mount: its record is the node's
    // (written by this process unless the record is another's it may only read).
    t->record = &t->own_record;
  } else if (!lock_path_.empty()) {
    // A read-only opener reads the record but never writes it (read_only changes nothing).
    auto f = pf_.open_file(lock_path_, platform::OpenMode::read, 0, /*follow=*/false);
    if (!f) return;
    t->own_record = std::move(f).value();
    t->record = &t->own_record;
  } else {
    return;
  }
  const LockFile lock = examine_lock_file(pf_, t->record_path, *t->record, info.value(), t->node_record);
  if (lock == LockFile::untrusted) {
    log::debug("'{}': its lock file may be written by others than the cache file's writers, or has other names; "
               "verifying per process",
               opts_.path);
    return;
  }
  if (lock == LockFile::other_content) {
    log::debug("'{}': its lock file holds something else than a verification record; not writing one", opts_.path);
    t->writable = false;
  }

  auto rec = read_record(pf_, *t->record, st.records.size());
  // A record of this state that vouches for every entry leaves nothing to add: no write-back.
  if (rec && rec->stamp == s && std::find(rec->verified.begin(), rec->verified.end(), false) == rec->verified.end())
    t->publishable = false;
  // A store through a shared mapping to a page that is already dirty moves no change time; only
  // the fault a clean page takes does. So before this process hashes anything it may record,
  // every page of the committed bytes is written back (clean in every process's mapping): any
  // store after this faults and moves the change time past the stamp's.
  if (t->writable && t->publishable) {
    if (!pf_.write_back(fd_, 0, s.committed_size)) {
      log::debug("'{}': cannot write back its pages; its verification is not recorded", opts_.path);
      t->publishable = false;
    }
  }
  // A read-only opener is done with the lock file: it never writes the record.
  if (!t->writable) {
    t->own_record = platform::File();
    t->record = nullptr;
  }
  // Nothing below allocates: the Trust is in place before any entry names it.
  Trust* trust = t.get();
  trust_ = std::move(t);
  std::size_t vouched = 0;
  if (rec && rec->stamp == s) {
    for (std::size_t i = 0; i < trust->entries.size(); ++i) {
      if (!rec->verified[i] || trust->entries[i] == nullptr) continue;
      // Trusted, not good: first use checks that the file is still in this state (verify_entry).
      std::uint8_t unverified = kUnverified;
      if (trust->entries[i]->state.compare_exchange_strong(unverified, kTrusted, std::memory_order_acq_rel))
        ++vouched;
    }
  }
  if (vouched != 0)
    log::debug("'{}': {} of {} entries verified by an earlier process in this state of the file; not hashed again "
               "while the file stays in it", opts_.path, vouched, st.records.size());
}

bool Core::node_record_applies() noexcept {
  const platform::Platform::Mount mount = pf_.mount_of(fd_);
  return mount.read_only && mount.kernel_times;
}

bool Core::open_node_record(Trust& t, const platform::FileInfo& file) {
  std::string dir = opts_.record_dir;
  const auto user = pf_.effective_user();
  if (dir.empty() && user) {
    // A user's own runtime directory; else the node's, whose root-written records any user reads.
    const char* run = *user != 0 ? std::getenv("XDG_RUNTIME_DIR") : nullptr;
    dir = run != nullptr && run[0] == '/' ? std::string(run) + "/weightcache" : std::string("/run/weightcache");
  }
  if (dir.empty()) return false;
  (void)pf_.make_directory(dir, 0755);
  // Whoever may add or replace a file in it could vouch for bytes: this user or root only.
  auto d = pf_.stat_path(dir, /*follow=*/false);
  if (!d || d->symlink || d->regular || !node_record_trusted(d.value(), user)) {
    log::debug("'{}': the record directory '{}' is missing or may be written by other users; verifying per process",
               opts_.path, dir);
    return false;
  }
  auto hex16 = [](std::uint64_t v) {
    std::string h(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) h[static_cast<std::size_t>(i)] = "0123456789abcdef"[v & 15u];
    return h;
  };
  const std::string path = dir + "/" + hex16(file.device) + "-" + hex16(file.inode) + ".wcvr";
  auto f = pf_.open_file(path, platform::OpenMode::lock_file, 0644, /*follow=*/false);
  t.writable = f.ok();
  // Another's record in a directory this process may not write (root's, for a service user):
  // read, never written.
  if (!f) f = pf_.open_file(path, platform::OpenMode::read, 0, /*follow=*/false);
  if (!f) {
    log::debug("'{}': cannot open its record '{}' ({}); verifying per process", opts_.path, path, f.error().message);
    return false;
  }
  t.own_record = std::move(f).value();
  t.record_path = path;
  t.node_record = true;
  return true;
}

bool Core::trust_confirmed_now() const noexcept {
  const Trust* t = trust_.get();
  if (t == nullptr || t->changed.load(std::memory_order_acquire)) return false;
  const std::int64_t now = pf_.monotonic_ns();
  return now != 0 && now < t->confirmed_until.load(std::memory_order_acquire);
}

bool Core::confirm_trusted(Entry* e) {
  // Claimed (kVerifying) by this thread. An fstat says whether the file is still in the state
  // the record was made for; any change since (a write, even with the modification time put
  // back, a truncation, a replacement under this descriptor's inode) moved its change time. One
  // fstat per interval, not per entry (10,000 entries took 5 ms of them): a check that found the
  // file unchanged holds for the first uses that start within recheck_ns of the clock reading
  // taken before it. So a change is seen by every first use that starts one interval after it:
  // such a use either checks again, or relies on a check whose fstat came after the change.
  Trust* t = trust_.get();
  bool same = false;
  try {
    std::optional<std::uint64_t> size;  // of the file now, where an fstat said
    if (t != nullptr && !t->changed.load(std::memory_order_acquire)) {
      const std::int64_t now = pf_.monotonic_ns();
      if (now != 0 && now < t->confirmed_until.load(std::memory_order_acquire)) {
        // The file's size is the stamp's, which covers every entry of the stamp's commit: no
        // entry trusted at open lies past its end.
        same = true;
      } else if (auto info = pf_.stat_file(fd_)) {
        size = info->size;
        same = t->stamp.same_file(info.value());
        if (!same) {
          t->changed.store(true, std::memory_order_release);  // for good: no later check may rely on one
        } else if (now != 0) {
          // A check only ever extends the time checks hold (another thread's may be later).
          std::int64_t until = t->confirmed_until.load(std::memory_order_relaxed);
          while (until < now + t->recheck_ns &&
                 !t->confirmed_until.compare_exchange_weak(until, now + t->recheck_ns, std::memory_order_acq_rel)) {
          }
        }
      }
    }
    if (!same && !size) {
      if (auto info = pf_.stat_file(fd_)) size = info->size;
    }
    // Cut short since open: reading its bytes would fault, so it is a miss unread.
    if (!same && size && e->in_file && *size < e->offset + e->size) return settle_verdict(e, Check::past_end);
  } catch (const std::bad_alloc&) {
    // No answer: hash it.
    same = false;
  }
  if (!same) {
    log::debug("'{}' changed since it was opened; hashing an entry an earlier process verified", opts_.path);
    return finish_verify(e);
  }
  trusted_entries_.fetch_add(1, std::memory_order_relaxed);  // counted before it is published (settle_verdict)
  e->state.store(kGood, std::memory_order_release);
  wake_verify_waiters();
  return true;
}

void Core::publish_verification() noexcept {
  Trust* t = trust_.get();
  if (t == nullptr || !t->writable || !t->publishable || in_forked_child()) return;
  guard_void("recording verification", [&] {
    std::lock_guard<std::mutex> lock(t->mu);
    std::vector<bool> verified(t->entries.size(), false);
    for (std::size_t i = 0; i < t->entries.size(); ++i) {
      // kGood from a hash of the bytes, from an earlier record of this same state, or from an
      // insert whose bytes matched these (the same checksum over the same bytes); kTrusted from
      // an earlier record of this same state (which the stat in write_record still finds).
      const Entry* e = t->entries[i];
      const std::uint8_t state = e != nullptr ? e->state.load(std::memory_order_acquire) : kBad;
      verified[i] = state == kGood || state == kTrusted;
    }
    write_record(*t, std::move(verified));
  });
}

void Core::write_record(Trust& t, std::vector<bool> verified) {
  if (std::find(verified.begin(), verified.end(), true) == verified.end()) return;
  VerifyRecord rec;
  rec.stamp = t.stamp;
  rec.verified = std::move(verified);
  // Still that state: nothing changed the file while it was hashed (a change would have moved
  // its change time past the stamp's, see adopt_verification).
  auto now = pf_.stat_file(fd_);
  if (!now || !t.stamp.same_file(now.value())) {
    log::debug("'{}' changed since its state was taken; its verification is not recorded", opts_.path);
    return;
  }
  if (auto old = read_record(pf_, *t.record, t.entries.size()); old && old->stamp == t.stamp) {
    bool news = false;
    for (std::size_t i = 0; i < rec.verified.size(); ++i) {
      news = news || (rec.verified[i] && !old->verified[i]);
      rec.verified[i] = rec.verified[i] || old->verified[i];
    }
    if (!news) return;  // nothing new: leave the lock file alone
  }
  // Still the cache's own lock file, with nothing but a record in it (see examine_lock_file).
  if (examine_lock_file(pf_, t.record_path, *t.record, now.value(), t.node_record) != LockFile::ours) {
    log::debug("'{}': its lock file changed since open (another name, a link or other content); its verification "
               "is not recorded",
               opts_.path);
    return;
  }
  const auto bytes = encode_record(rec);
  if (auto r = pf_.write_at(*t.record, bytes.data(), bytes.size(), 0); !r)
    log::debug("'{}': could not record its verification: {}", opts_.path, r.error().message);
}

void Core::record_own_commits_locked() noexcept {
  // Only a writer of this session whose verification a later process may trust: one with
  // durability full (with none or async it never waits for the disk, and the write-back below
  // would make it; full has flushed these pages at finalize, so the write-back finds them clean),
  // on a file with a lock file it may write, not a forked child (whose close returned earlier).
  if (commits_.load(std::memory_order_relaxed) == 0 || opts_.verify != Verify::shared ||
      opts_.durability != Durability::full || from_descriptor_ || !file_backed_.load(std::memory_order_relaxed) ||
      !fd_.is_open() || !lock_fd_.is_open() || leases_own_file_ || space_.base() == nullptr || in_forked_child())
    return;
  const std::uint64_t mapped = mapped_end_;  // what the hashing below may read
  guard_void("recording the writer's verification", [&] {
    // Its entries are good in memory from its own checksums, but that is no verification of the
    // file: a foreign write to committed bytes before the last commit hides behind the commit's
    // own change time. So it verifies the final state as the next process would: the clock,
    // then the stamp, old enough for any later change to show; the bytes written back (clean
    // pages: a store through a mapping after this faults and moves the change time); every
    // committed entry hashed from the mapping; and the stamp checked again before the record
    // is written (docs/DESIGN.md, "The writer's own record").
    auto t = std::make_unique<Trust>();
    if (!pf_.boot_id(t->stamp.boot)) return;
    std::int64_t clock = pf_.change_clock_ns();
    auto info = pf_.stat_file(fd_);
    if (clock == 0 || !info) return;
    const std::int64_t window = pf_.change_window_ns(fd_, info.value());
    if (window <= 0) return;
    // Just committed: a change within the window of the last one could keep its change time.
    // Where that is a clock tick (10 ms), wait it out (the change clock moves a tick at a time,
    // so the wait is bounded, not one sleep); a coarse file system's 2 s is too long to hold a
    // close for, so nothing is recorded there.
    std::int64_t waited = 0;
    while (!change_would_show(info->ctime_ns, clock, window)) {
      const std::int64_t rest = info->ctime_ns + window - clock;
      if (window > platform::kFineChangeWindowNs || rest > 2 * window || waited > 3 * window) {
        log::debug("'{}': its last commit is too recent for a change to show; its verification is not recorded",
                   opts_.path);
        return;
      }
      const std::int64_t pause = std::max<std::int64_t>(rest, 0) + 1000000;
      std::this_thread::sleep_for(std::chrono::nanoseconds(pause));
      waited += pause;
      clock = pf_.change_clock_ns();
      info = pf_.stat_file(fd_);
      if (clock == 0 || !info) return;
    }
    // The commit in the file now, read as open reads it; the stamp is the fstat above.
    platform::FileInfo seen = info.value();
    std::vector<format::IndexRecord> records;
    auto slot = read_latest_slot(0, &records, &seen);
    if (!slot || slot->committed_size > mapped) return;
    describe_state(*t, slot.value(), records, info.value());
    t->record = &lock_fd_;
    t->record_path = lock_path_;
    t->writable = true;
    if (examine_lock_file(pf_, lock_path_, lock_fd_, info.value()) != LockFile::ours) return;
    if (!pf_.write_back(fd_, 0, slot->committed_size)) return;
    // Hashed, never taken from the entries' states: that is the whole point.
    std::vector<bool> verified(t->entries.size(), false);
    for (std::size_t i = 0; i < t->entries.size(); ++i) {
      const Entry* e = t->entries[i];
      if (e != nullptr && e->offset + e->size <= info->size && e->offset + e->size <= mapped)
        verified[i] = check_bytes(e, nullptr) == Check::good;
    }
    std::lock_guard<std::mutex> lock(t->mu);
    write_record(*t, std::move(verified));
  });
}

}  // namespace weightcache
