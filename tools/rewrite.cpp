#include "rewrite.hpp"

#include "compact.hpp"
#include "format/format.hpp"
#include "inspect.hpp"
#include "output.hpp"
#include "platform/platform.hpp"

#include <weightcache/weight_cache.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <variant>

#if !defined(_WIN32)
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace weightcache::cli {
namespace {

namespace fmt_ = weightcache::format;

constexpr unsigned kDefaultMode = 0644;

struct Failure {
  int exit_code;
  std::string message;
};
using Outcome = std::optional<Failure>;  // nullopt = success

void say_error(const std::string& msg) { std::fprintf(stderr, "weightcache: %s\n", msg.c_str()); }

int report(const Failure& f) {
  say_error(f.message);
  return f.exit_code;
}

// Permission bits and owner of an existing file, so the replacement keeps them.
struct Ownership {
  unsigned mode = kDefaultMode;
  bool known = false;
#if !defined(_WIN32)
  uid_t uid = 0;
  gid_t gid = 0;
#endif
};

Ownership ownership_of(const std::string& path) {
  Ownership o;
#if !defined(_WIN32)
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    o.mode = static_cast<unsigned>(st.st_mode) & 07777;
    o.uid = st.st_uid;
    o.gid = st.st_gid;
    o.known = true;
  }
#else
  (void)path;
#endif
  return o;
}

void apply_ownership(const platform::File& f, const Ownership& o) {
#if !defined(_WIN32)
  // Only root can give a file away; for anyone else this is a no-op or fails harmlessly.
  if (o.known && (o.uid != ::geteuid() || o.gid != ::getegid()))
    (void)!::fchown(platform::os().native_descriptor(f), o.uid, o.gid);
#else
  (void)f;
  (void)o;
#endif
}

// The writer lease: the library's, on "<cache>.lock", the lock every weightcache writer takes.
// Holding it keeps them all from starting while we replace the file; it is given back when the
// returned Lease goes.
std::variant<platform::Lease, Failure> take_lease(const std::string& cache_path, unsigned mode) {
  const std::string lock_path = cache_path + ".lock";
  auto file = platform::os().open_file(lock_path, platform::OpenMode::lock_file, mode, false);
  if (!file) return Failure{kExitIo, "cannot open the lease file: " + file.error().message};
  auto lease = platform::Lease::try_take(std::move(file).value());
  if (!lease) return Failure{kExitIo, "cannot lock '" + lock_path + "': " + lease.error().message};
  if (!lease->held())
    return Failure{kExitBusy, "'" + cache_path + "' is busy: a writer holds its lease ('" + lock_path +
                                  "'). Run again once the process adding entries has finished."};
  return std::move(lease).value();
}

// For files a command replaces: a symlink would be replaced by the rename, not followed.
Outcome check_replaceable(const std::string& path, bool must_exist, bool* exists) {
  auto st = platform::os().stat_path(path, false);
  *exists = st.ok();
  if (!st) {
    if (!must_exist && st.error().sys_errno == ENOENT) return std::nullopt;
    return Failure{kExitCannotRead, st.error().message};
  }
  if (st->symlink)
    return Failure{kExitCannotRead, "'" + path + "' is a symbolic link; name the file it points to instead"};
  if (!st->regular) return Failure{kExitCannotRead, "'" + path + "' is not a regular file"};
  return std::nullopt;
}

void print_findings(const std::string& path, const Inspection& in) {
  for (const auto& f : in.findings) std::fprintf(stderr, "%s: %s\n", path.c_str(), f.message.c_str());
}

}  // namespace

int run_compact(const std::string& path, const CompactOptions& opt) {
  bool exists = false;
  if (auto f = check_replaceable(path, true, &exists)) return report(*f);
  // What kind of file it is decides the message, not the library's verdict alone: an XPWC file
  // wants convert, a damaged one wants verify's findings.
  {
    auto file = open_for_reading(path);
    if (!file) return report({kExitCannotRead, file.error().message});
    auto in = inspect(file.value());
    if (!in) return report({kExitCannotRead, "cannot read '" + path + "': " + in.error().message});
    if (in->format == FileFormat::xpwc)
      return report({kExitUsage, "'" + path + "' is an ExecuTorch XPWC file; use 'weightcache convert' to turn it "
                                 "into a weightcache file"});
    if (in->format != FileFormat::weightcache || !in->index_usable) {
      print_findings(path, in.value());
      return report({kExitCannotRead, "'" + path + "' has no valid index; nothing to compact (see 'weightcache verify')"});
    }
    if (!in->findings.empty()) {
      // Rewriting would discard whatever a damaged newer commit or slot still holds.
      print_findings(path, in.value());
      return report({kExitProblems, "'" + path + "' has problems (see 'weightcache verify'); not compacted"});
    }
  }
  // The library does the rest: the lease, the in-use lock, the copy, the read-back, the rename.
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  if (opt.compat_key) {
    o.compat_key = opt.compat_key->data();
    o.compat_key_size = opt.compat_key->size();
  }
  unsigned flags = opt.compat_key ? 0u : unsigned{WC_COMPACT_ANY_KEY};
  if (opt.drop_corrupt) flags |= WC_COMPACT_DROP_CORRUPT;
  if (opt.canonical) flags |= WC_COMPACT_CANONICAL;
  wc_compact_report r;
  wc_compact_report_init(&r);
  const wc_status st = wc_compact_ex(&o, flags, &r);
  if (st != WC_OK) {
    const std::string msg = wc_last_error();
    switch (st) {
      case WC_ERR_BUSY: return report({kExitBusy, msg});
      case WC_ERR_INCOMPATIBLE:
        return report({kExitUsage, "--compat-key does not match the compatibility key '" + path +
                                       "' was written for (" + msg + ")"});
      case WC_ERR_CORRUPT: {
        // Damaged entries: name them, as verify would.
        if (auto file = open_for_reading(path)) {
          if (auto in = inspect(file.value())) {
            Progress progress("checking entries", in->payload_bytes());
            if (check_checksums(file.value(), &in.value(), &progress))
              for (const auto& f : in->findings) std::fprintf(stderr, "%s: %s\n", path.c_str(), f.message.c_str());
          }
        }
        return report({kExitProblems, "not compacted: " + msg + ". Rerun with --drop-corrupt to leave damaged entries out."});
      }
      case WC_ERR_INVALID_ARGUMENT: return report({kExitCannotRead, msg});
      default: return report({kExitIo, msg});
    }
  }
  if (r.compacted == 0) {
    std::printf("%s is already compact: %llu bytes, %llu entries\n", path.c_str(),
                static_cast<unsigned long long>(r.bytes_before), static_cast<unsigned long long>(r.entries));
    return kExitOk;
  }
  std::printf("compacted %s: %llu -> %llu bytes, %llu entries", path.c_str(),
              static_cast<unsigned long long>(r.bytes_before), static_cast<unsigned long long>(r.bytes_after),
              static_cast<unsigned long long>(r.entries));
  if (r.dropped_entries != 0)
    std::printf(" (%llu damaged entries dropped)", static_cast<unsigned long long>(r.dropped_entries));
  std::printf("\n");
  return kExitOk;
}

int run_convert(const std::string& in_path, const std::string& out_path, const ConvertOptions& opt) {
  auto file = open_for_reading(in_path);
  if (!file) return report({kExitCannotRead, file.error().message});
  auto in = inspect(file.value());
  if (!in) return report({kExitCannotRead, "cannot read '" + in_path + "': " + in.error().message});
  if (in->format == FileFormat::weightcache)
    return report({kExitUsage, "'" + in_path + "' is already a weightcache file"});
  if (in->format != FileFormat::xpwc) {
    print_findings(in_path, in.value());
    return report({kExitCannotRead, "'" + in_path + "' is not an ExecuTorch XPWC file"});
  }
  if (!in->index_usable || !in->findings.empty()) {
    print_findings(in_path, in.value());
    return report({kExitProblems, "'" + in_path + "' has problems; not converted"});
  }
  // A version 2 key is never empty ("#seed=N" is appended), so the name is checked on its own:
  // an entry without a name cannot be told from another entry without a name but the same seed.
  for (std::size_t i = 0; i < in->entries.size(); ++i)
    if (in->entries[i].name.empty())
      return report({kExitProblems, "entry " + std::to_string(i) + " of '" + in_path +
                                        "' has an empty name, which cannot make a weightcache key; not converted"});
  for (const auto& e : in->entries)
    if (e.key.empty() || e.key.size() > fmt_::kMaxKeySize)
      return report({kExitProblems, "entry '" + fmt_::display_key(e.key) + "' of '" + in_path +
                                        "' cannot be a weightcache key (keys are 1 to 4096 bytes); not converted"});

  bool exists = false;
  if (auto f = check_replaceable(out_path, false, &exists)) return report(*f);
  if (exists && !opt.force)
    return report({kExitUsage, "'" + out_path + "' exists; pass --force to replace it"});
  const Ownership own = exists ? ownership_of(out_path) : Ownership{};
  auto lease = take_lease(out_path, own.mode);
  if (auto* f = std::get_if<Failure>(&lease)) return report(*f);

  std::vector<SourceEntry> entries;
  for (const auto& e : in->entries) entries.push_back({e.key, e.offset, e.size, std::nullopt});
  std::stable_sort(entries.begin(), entries.end(),
                   [](const SourceEntry& a, const SourceEntry& b) { return a.offset < b.offset; });
  fmt_::HeaderFixed fixed;
  fixed.alignment = opt.alignment;
  fixed.size_alignment = 1;
  fixed.compat_hash = fmt_::hash_bytes(opt.compat_key);

  // The library's writer: the new file under a temporary name, read back whole before it is
  // renamed into place (and removed if anything fails).
  auto tmp = TempFile::create(platform::os(), out_path, own.mode);
  if (!tmp) return report({kExitIo, "cannot create a new file beside '" + out_path + "': " + tmp.error().message});
  apply_ownership(tmp->file(), own);
  WrittenFile w;
  {
    Progress progress("converting", 2 * in->payload_bytes());  // the copy, then the read-back
    auto r = write_cache_file(platform::os(), file.value().file, tmp.value(), fixed, 1, entries, &w,
                              [&progress](std::uint64_t n) { progress.add(n); });
    if (!r) {
      // An input cut short under us reads as corrupt; anything else is writing or reading back.
      const int code = r.error().code == Errc::corrupt ? kExitCannotRead : kExitIo;
      return report({code, "cannot write '" + tmp->name() + "': " + r.error().message});
    }
  }
  if (auto r = tmp->commit(true); !r) return report({kExitIo, r.error().message});
  std::printf("converted %s (ExecuTorch XPWC version %u, %zu entries) to %s (weightcache, alignment %llu, "
              "compat key hash %s)\n",
              in_path.c_str(), in->xpwc_version, w.records.size(), out_path.c_str(),
              static_cast<unsigned long long>(opt.alignment), hex64(fixed.compat_hash).c_str());
  return kExitOk;
}

}  // namespace weightcache::cli
