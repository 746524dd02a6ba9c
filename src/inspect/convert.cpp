// The writing side of inspection (weightcache/inspect.hpp): an ExecuTorch XPWC file written as a
// weightcache file by the library's own writer (the one compaction uses), under the writer lease
// of the new file, through a temporary file renamed into place.
#include "inspect/file_impl.hpp"

#include "compact.hpp"
#include "format/format.hpp"

#include <algorithm>
#include <cerrno>
#include <new>

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
