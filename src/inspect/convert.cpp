// The writing side of inspection (weightcache/inspect.hpp): an ExecuTorch XPWC file written as a
// weightcache file by the library's own writer (the one compaction uses), under the writer lease
// of the new file, through a temporary file renamed into place.
//
// IN has no checksums, and ExecuTorch rewrites its cache file in place. A copy made while IN is
// rewritten would mix two versions of it, so IN must be shown to hold still from the inspection
// to the end of the copy, with the change times the library already trusts (docs/DESIGN.md, "How
// a change is known"), in four steps:
//   1. Before copying: read the change clock, then fstat IN; it must be as the inspection read it
//      (device, inode, size, mtime, ctime), and its ctime older than the clock's reading by the
//      file system's window (change_would_show), or the copy waits until it is. From then on any
//      change to IN gets another change time.
//   2. Write back IN's dirty pages (Platform::write_back): a store through a shared mapping to a
//      page that stayed dirty takes no fault and moves no change time; after this, every store
//      faults and does.
//   3. Copy.
//   4. Read IN's index and footer again and compare them with what the inspection parsed, then
//      fstat IN: same device, inode, size, mtime and ctime.
// A change after step 2 moves ctime, which step 4 sees. A change before it that the times do not
// show (within the tick of IN's last change, or a store to a dirty page) came before every byte
// the copy read, so the copy holds its result; if it touched the index, step 4 sees that. So OUT
// holds one version of IN. What remains: file systems whose change times do not show every
// change at once (window 0: tmpfs and ramfs for stores through a mapping, network and stacked
// file systems, Windows), a change clock stepped back by more than the window, and a platform
// that cannot write back (only Linux can): there step 4's times and index catch a rewrite that
// moves them, but not a same-size one within one timestamp tick or through a dirty page.
#include "inspect/file_impl.hpp"

#include "compact.hpp"
#include "format/format.hpp"
#include "verify_record.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <new>
#include <thread>

#if !defined(_WIN32)
#include <unistd.h>
#endif

namespace weightcache::inspect {
namespace {

namespace fmt_ = weightcache::format;

constexpr unsigned kDefaultMode = 0644;

// Permission bits and owner of an existing file, so that its replacement keeps them.
struct Ownership {
  unsigned mode = kDefaultMode;
  bool known = false;
  std::uint32_t owner = 0, group = 0;
};

Ownership ownership_of(const std::string& path) {
  Ownership o;
  if (auto st = platform::os().stat_path(path, true); st) {
    o.mode = st->mode & 07777;
    o.owner = st->owner;
    o.group = st->group;
    o.known = true;
  }
  return o;
}

// Only root can give a file away; for anyone else this is a no-op or fails harmlessly. The
// platform layer has no call for it: Windows files have no POSIX owner to keep.
void apply_ownership(const platform::File& f, const Ownership& o) {
#if !defined(_WIN32)
  if (o.known && (o.owner != ::geteuid() || o.group != ::getegid()))
    (void)!::fchown(platform::os().native_descriptor(f), o.owner, o.group);
#else
  (void)f;
  (void)o;
#endif
}

// The writer lease: the library's, on "<cache>.lock", the lock every weightcache writer takes.
// Holding it keeps them all from starting while the file is replaced; it is given back when the
// returned Lease goes.
Result<platform::Lease> take_lease(const std::string& cache_path, unsigned mode) {
  const std::string lock_path = cache_path + ".lock";
  auto file = platform::os().open_file(lock_path, platform::OpenMode::lock_file, mode, false);
  if (!file) return Error{Errc::io, file.error().sys_errno, "cannot open the lease file: " + file.error().message};
  auto lease = platform::Lease::try_take(std::move(file).value());
  if (!lease)
    return Error{Errc::io, lease.error().sys_errno, "cannot lock '" + lock_path + "': " + lease.error().message};
  if (!lease->held())
    return Error{Errc::busy, 0,
                 "'" + cache_path + "' is busy: a writer holds its lease ('" + lock_path +
                     "'). Run again once the process adding entries has finished."};
  return std::move(lease).value();
}

// ---- IN holds still ---------------------------------------------------------------------------

bool same_state(const platform::FileInfo& a, const platform::FileInfo& b) noexcept {
  return a.device == b.device && a.inode == b.inode && a.size == b.size && a.mtime_ns == b.mtime_ns &&
         a.ctime_ns == b.ctime_ns;
}

Error changed(const File& in, const std::string& how) {
  return Error{Errc::corrupt, 0,
               "'" + in.path() + "' changed while it was being converted (" + how +
                   "); nothing was written. Run again once nothing writes it."};
}

// Steps 1 and 2 (above): IN as inspected, its last change older than a reading of the change
// clock by the window (waited for: at most the window, 10 ms or 2 s, after IN's last change),
// and its pages clean.
Result<void> settle(const File& in) {
  platform::Platform& pf = platform::os();
  const File::Impl& f = in.impl();
  // One wait lets the clock pass the window, a second covers its tick; a file whose times are
  // ahead of the clock by more (a clock stepped back) is copied without the guarantee.
  constexpr int kWaits = 2;
  for (int waits = 0;; ++waits) {
    const std::int64_t clock = pf.change_clock_ns();
    auto now = pf.stat_file(f.file);
    if (!now) return now.error();
    if (!same_state(now.value(), f.info)) return changed(in, "its size or change time moved after it was inspected");
    const std::int64_t window = pf.change_window_ns(f.file, now.value());
    if (clock == 0 || window <= 0 || change_would_show(now->ctime_ns, clock, window) || waits == kWaits) break;
    const std::int64_t wait_ns = std::min(now->ctime_ns + window - clock, window);
    std::this_thread::sleep_for(std::chrono::nanoseconds(wait_ns) + std::chrono::milliseconds(1));
  }
  (void)pf.write_back(f.file, 0, f.info.size);  // false where it cannot: see above
  return {};
}

// Big-endian for a byte-swapped file, as its writer wrote it.
void put_int(std::string* s, std::uint64_t v, int bytes, bool big) {
  for (int i = 0; i < bytes; ++i) s->push_back(static_cast<char>(v >> (8 * (big ? bytes - 1 - i : i))));
}

// Step 4: IN's index and footer as the inspection parsed them, and its fstat as the inspection
// read against. The index is compared by hash: the inspection's entries encoded as the file
// writes them against the bytes read again, in 1 MiB pieces.
Result<void> still_as_inspected(const File& in, const Inspection& ins) {
  platform::Platform& pf = platform::os();
  const File::Impl& f = in.impl();
  const bool big = ins.byte_swapped;
  fmt_::StreamHash expected;
  std::string bytes;
  for (const auto& e : ins.entries) {
    bytes.clear();
    const std::string_view name = e.name();
    put_int(&bytes, name.size(), 4, big);
    bytes += name;
    put_int(&bytes, e.offset, 8, big);
    put_int(&bytes, e.size, 8, big);
    if (ins.xpwc_version >= 2) put_int(&bytes, e.seed.value_or(0), 4, big);
    expected.update(bytes.data(), bytes.size());
  }
  bytes.clear();
  put_int(&bytes, ins.index_start, 8, big);
  put_int(&bytes, ins.entries.size(), 4, big);
  put_int(&bytes, fmt_::kFooterMagic, 4, big);
  put_int(&bytes, ins.xpwc_version, 4, big);
  expected.update(bytes.data(), bytes.size());

  fmt_::StreamHash read;
  std::vector<std::byte> buf(std::size_t{1} << 20);
  for (std::uint64_t at = ins.index_start; at < ins.file_size;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), ins.file_size - at));
    if (auto r = pf.read_at(f.file, buf.data(), n, at); !r) {
      if (r.error().code == Errc::corrupt) return changed(in, "it was cut short");
      return r.error();
    }
    read.update(buf.data(), n);
    at += n;
  }
  if (read.digest() != expected.digest()) return changed(in, "its index differs from the one inspected");
  auto now = pf.stat_file(f.file);
  if (!now) return now.error();
  if (!same_state(now.value(), f.info)) return changed(in, "its size or change time moved while it was copied");
  return {};
}

Result<ConvertReport> convert(const File& in, const Inspection& ins, const std::string& out_path,
                              const ConvertOptions& opt, const Progress& progress) {
  if (ins.format != FileFormat::xpwc || !ins.index_usable || !ins.findings.empty())
    return Error{Errc::invalid_argument, 0, "'" + in.path() + "' is not a sound ExecuTorch XPWC file"};
  if (opt.alignment == 0 || (opt.alignment & (opt.alignment - 1)) != 0 || opt.alignment > kMaxAlignment)
    return Error{Errc::invalid_argument, 0, "the alignment must be a power of two from 1 to 16777216"};
  for (const auto& e : ins.entries)
    if (e.name().empty() || e.key.empty() || e.key.size() > fmt_::kMaxKeySize)
      return Error{Errc::invalid_argument, 0,
                   "entry '" + fmt_::display_key(e.key) + "' cannot be a weightcache key (keys are 1 to 4096 bytes)"};

  const bool exists = platform::os().stat_path(out_path, false).ok();
  const Ownership own = exists ? ownership_of(out_path) : Ownership{};
  auto lease = take_lease(out_path, own.mode);
  if (!lease) return lease.error();

  std::vector<SourceEntry> entries;
  entries.reserve(ins.entries.size());
  for (const auto& e : ins.entries) entries.push_back({e.key, e.offset, e.size, std::nullopt});
  std::stable_sort(entries.begin(), entries.end(),
                   [](const SourceEntry& a, const SourceEntry& b) { return a.offset < b.offset; });
  fmt_::HeaderFixed fixed;
  fixed.alignment = opt.alignment;
  fixed.size_alignment = 1;
  fixed.compat_hash = fmt_::hash_bytes(opt.compat_key);

  if (auto r = settle(in); !r) return r.error();

  // The library's writer: the new file under a temporary name, read back whole before it is
  // renamed into place (and removed if anything fails).
  auto tmp = TempFile::create(platform::os(), out_path, own.mode);
  if (!tmp)
    return Error{tmp.error().code == Errc::no_memory ? Errc::no_memory : Errc::io, tmp.error().sys_errno,
                 "cannot create a new file beside '" + out_path + "': " + tmp.error().message};
  apply_ownership(tmp->file(), own);
  WrittenFile w;
  auto r = write_cache_file(platform::os(), in.impl().file, tmp.value(), fixed, 1, entries, &w,
                            [&progress](std::uint64_t n) {
                              if (progress) progress(n);
                            });
  if (!r) {
    // An input cut short under us reads as corrupt; anything else is writing or reading back.
    const Errc code = r.error().code == Errc::corrupt || r.error().code == Errc::no_space ||
                              r.error().code == Errc::no_memory
                          ? r.error().code
                          : Errc::io;
    return Error{code, r.error().sys_errno, "cannot write '" + tmp->name() + "': " + r.error().message};
  }
  if (auto r = still_as_inspected(in, ins); !r) return r.error();
  if (auto c = tmp->commit(true); !c)
    return Error{c.error().code == Errc::no_memory ? Errc::no_memory : Errc::io, c.error().sys_errno,
                 c.error().message};
  return ConvertReport{w.records.size(), fixed.compat_hash};
}

}  // namespace

Result<bool> replaceable(const std::string& path, bool must_exist) noexcept {
  try {
    auto st = platform::os().stat_path(path, false);
    if (!st) {
      if (!must_exist && st.error().sys_errno == ENOENT) return false;
      return st.error();
    }
    if (st->symlink)
      return Error{Errc::invalid_argument, 0,
                   "'" + path + "' is a symbolic link; name the file it points to instead"};
    if (!st->regular) return Error{Errc::invalid_argument, 0, "'" + path + "' is not a regular file"};
    return true;
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory"};
  }
}

Result<ConvertReport> convert_xpwc(const File& in, const Inspection& inspection, const std::string& out_path,
                                   const ConvertOptions& options, const Progress& progress) noexcept {
  try {
    return convert(in, inspection, out_path, options, progress);
  } catch (const std::bad_alloc&) {
    return Error{Errc::no_memory, 0, "out of memory while converting '" + in.path() + "'"};
  }
}

}  // namespace weightcache::inspect
