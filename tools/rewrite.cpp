#include "rewrite.hpp"

#include "format/format.hpp"
#include "inspect.hpp"
#include "output.hpp"
#include "platform/platform.hpp"

#include <weightcache/weight_cache.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <numeric>

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

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }

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

void apply_ownership(platform::Handle h, const Ownership& o) {
#if !defined(_WIN32)
  // Only root can give a file away; for anyone else this is a no-op or fails harmlessly.
  if (o.known && (o.uid != ::geteuid() || o.gid != ::getegid())) (void)!::fchown(static_cast<int>(h), o.uid, o.gid);
#else
  (void)h;
  (void)o;
#endif
}

// The writer lease: an exclusive flock on "<cache>.lock", the same lock library writers take.
// Holding it keeps every weightcache writer from starting while we replace the file.
class Lease {
 public:
  Lease() = default;
  ~Lease() {
    if (h_ != platform::kInvalidHandle) {
      platform::os().unlock(h_);
      platform::os().close_file(h_);
    }
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  Outcome acquire(const std::string& cache_path, unsigned mode) {
    const std::string lock_path = cache_path + ".lock";
    auto h = platform::os().open_file(lock_path, platform::OpenMode::lock_file, mode, false);
    if (!h) return Failure{kExitIo, "cannot open the lease file: " + h.error().message};
    h_ = h.value();
    auto got = platform::os().try_lock(h_);
    if (!got) return Failure{kExitIo, "cannot lock '" + lock_path + "': " + got.error().message};
    if (!got.value())
      return Failure{kExitBusy, "'" + cache_path + "' is busy: a writer holds its lease ('" + lock_path +
                                    "'). Run again once the process adding entries has finished."};
    return std::nullopt;
  }

 private:
  platform::Handle h_ = platform::kInvalidHandle;
};

struct SourceEntry {
  std::string key;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::optional<std::uint64_t> checksum;  // expected; nullopt: computed while copying
};

struct Written {
  std::vector<fmt_::IndexRecord> records;
  std::vector<std::string> corrupt_keys;  // left out: their bytes fail the stored checksum
  std::uint64_t file_size = 0;
};

struct Placement {
  std::uint64_t alignment = 64, size_alignment = 1;
  std::uint64_t region(std::uint64_t size) const { return align_up(std::max<std::uint64_t>(size, 1), size_alignment); }
};

// Same placement as the library's writer: each region starts on the alignment and spans its size
// rounded up to size_alignment (at least one byte, so no two entries share an offset); the index
// follows on an 8-byte boundary.
std::uint64_t planned_size(const std::vector<SourceEntry>& entries, const Placement& pl) {
  std::uint64_t cursor = fmt_::kHeaderSize;
  std::uint64_t index_bytes = fmt_::kIndexHeaderSize + fmt_::kFooterSize;
  for (const auto& e : entries) {
    cursor = align_up(cursor, pl.alignment) + pl.region(e.size);
    index_bytes += fmt_::kRecordFixedSize + e.key.size();
  }
  return align_up(cursor, 8) + index_bytes;
}

// Writes a complete cache file at `tmp`: header with one commit slot, the entries copied from
// `src` (checksummed on the way), the index and the footer; then syncs it.
Outcome write_cache_file(const File& src, const std::string& tmp, const fmt_::HeaderFixed& fixed,
                         std::uint64_t sequence, const std::vector<SourceEntry>& entries, const Ownership& own,
                         Progress* progress, Written* out) {
  auto& os = platform::os();
  os.remove(tmp);  // a leftover of an interrupted run with our pid
  auto created = os.open_file(tmp, platform::OpenMode::create_new, own.mode, false);
  if (!created) return Failure{kExitIo, "cannot create '" + tmp + "': " + created.error().message};
  File dst(created.value(), 0);
  auto fail = [&](int code, std::string msg) -> Outcome {
    dst.close();
    os.remove(tmp);
    return Failure{code, std::move(msg)};
  };
  apply_ownership(dst.handle(), own);

  const Placement pl{fixed.alignment, fixed.size_alignment};
  const std::uint64_t planned = planned_size(entries, pl);
  // Claim the space up front: a full disk fails here, before any copying.
  if (auto r = os.allocate(dst.handle(), 0, planned); !r)
    return fail(kExitIo, "cannot allocate " + std::to_string(planned) + " bytes for '" + tmp + "': " + r.error().message);

  std::uint64_t cursor = fmt_::kHeaderSize;
  for (const auto& e : entries) {
    const std::uint64_t at = align_up(cursor, pl.alignment);
    std::uint64_t pos = at;
    std::optional<Error> write_error;
    auto sink = [&](const std::byte* p, std::size_t n) -> Result<void> {
      if (auto r = os.write_at(dst.handle(), p, n, pos); !r) {
        write_error = r.error();
        return r.error();
      }
      pos += n;
      return {};
    };
    auto h = hash_range(src, e.offset, e.size, progress, sink);
    if (write_error) return fail(kExitIo, "cannot write '" + tmp + "': " + write_error->message);
    if (!h) return fail(kExitCannotRead, "cannot read entry " + display_key(e.key) + ": " + h.error().message);
    if (e.checksum && *e.checksum != h.value()) {
      out->corrupt_keys.push_back(e.key);
      continue;  // its region is reused by the next entry
    }
    out->records.push_back({e.key, at, e.size, h.value()});
    cursor = at + pl.region(e.size);
  }

  fmt_::CommitSlot slot;
  slot.sequence = sequence;
  std::vector<std::byte> trailer;
  std::vector<std::byte> header;
  try {
    trailer = fmt_::encode_trailer(out->records, align_up(cursor, 8), &slot);
    header = sequence % 2 == 0 ? fmt_::encode_header(fixed, slot, {}) : fmt_::encode_header(fixed, {}, slot);
  } catch (const std::bad_alloc&) {
    return fail(kExitIo, "out of memory while encoding the index");
  }
  if (auto r = os.write_at(dst.handle(), trailer.data(), trailer.size(), slot.index_offset); !r)
    return fail(kExitIo, "cannot write '" + tmp + "': " + r.error().message);
  if (auto r = os.write_at(dst.handle(), header.data(), header.size(), 0); !r)
    return fail(kExitIo, "cannot write '" + tmp + "': " + r.error().message);
  if (slot.committed_size < planned)  // entries were left out
    if (auto r = os.truncate(dst.handle(), slot.committed_size); !r)
      return fail(kExitIo, "cannot resize '" + tmp + "': " + r.error().message);
  if (auto r = os.sync(dst.handle()); !r) return fail(kExitIo, "cannot sync '" + tmp + "': " + r.error().message);
  out->file_size = slot.committed_size;
  return std::nullopt;
}

// Reads the new file back before it replaces anything: our own checks (which parse with the
// library's decoders and re-hash every entry) and, when the compatibility key is known, a
// read-only open by the library itself with every entry verified.
Outcome verify_written(const std::string& tmp, const Written& w, const fmt_::HeaderFixed& fixed,
                       const std::optional<std::string>& compat_key, Progress* progress) {
  auto fail = [&](std::string msg) -> Outcome {
    platform::os().remove(tmp);
    return Failure{kExitIo, "the new file '" + tmp + "' does not verify (" + msg + "); the original is untouched"};
  };
  {
    auto f = open_for_reading(tmp);
    if (!f) return fail(f.error().message);
    auto in = inspect(f.value());
    if (!in) return fail(in.error().message);
    auto hashed = check_checksums(f.value(), &in.value(), progress);
    if (!hashed) return fail(hashed.error().message);
    if (in->format != FileFormat::weightcache || !in->index_usable || !in->findings.empty())
      return fail(in->findings.empty() ? "no usable index" : in->findings.front().message);
    if (in->entries.size() != w.records.size() || in->file_size != w.file_size) return fail("unexpected contents");
    for (std::size_t i = 0; i < w.records.size(); ++i) {
      const auto& a = in->entries[i];
      const auto& b = w.records[i];
      if (a.key != b.key || a.offset != b.offset || a.size != b.size || a.checksum != b.checksum)
        return fail("entry " + display_key(b.key) + " differs");
    }
  }
  if (!compat_key) return std::nullopt;
  Options o;
  o.path = tmp;
  o.compat_key = *compat_key;
  o.alignment = static_cast<std::size_t>(fixed.alignment);
  o.size_alignment = static_cast<std::size_t>(fixed.size_alignment);
  o.backing = Backing::file;
  o.read_only = true;
  o.verify = Verify::on_open;
  o.max_file_bytes = std::max<std::uint64_t>(o.max_file_bytes, align_up(w.file_size, std::uint64_t{1} << 30));
  auto cache = WeightCache::open(o);
  if (!cache) return fail("the library cannot open it: " + cache.error().message);
  const Stats s = cache->stats();
  if (s.entries != w.records.size() || s.verify_failures != 0) return fail("the library sees other entries");
  for (const auto& r : w.records)
    if (cache->look_up(r.key) != r.offset) return fail("the library does not serve entry " + display_key(r.key));
  return std::nullopt;
}

Outcome install(const std::string& tmp, const std::string& path) {
  if (auto r = platform::os().rename(tmp, path); !r) {
    platform::os().remove(tmp);
    return Failure{kExitIo, r.error().message};
  }
  if (auto r = platform::os().sync_parent_dir(path); !r)
    return Failure{kExitIo, "'" + path + "' was replaced, but the directory could not be synced: " + r.error().message};
  return std::nullopt;
}

std::string temp_name(const std::string& path, const char* what) {
  return path + ".tmp." + std::to_string(platform::os().process_id()) + "." + what;
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
      return report({kExitProblems, "entry '" + display_key(e.key) + "' of '" + in_path +
                                        "' cannot be a weightcache key (keys are 1 to 4096 bytes); not converted"});

  bool exists = false;
  if (auto f = check_replaceable(out_path, false, &exists)) return report(*f);
  if (exists && !opt.force)
    return report({kExitUsage, "'" + out_path + "' exists; pass --force to replace it"});
  const Ownership own = exists ? ownership_of(out_path) : Ownership{};
  Lease lease;
  if (auto f = lease.acquire(out_path, own.mode)) return report(*f);

  std::vector<SourceEntry> entries;
  for (const auto& e : in->entries) entries.push_back({e.key, e.offset, e.size, std::nullopt});
  std::stable_sort(entries.begin(), entries.end(),
                   [](const SourceEntry& a, const SourceEntry& b) { return a.offset < b.offset; });
  fmt_::HeaderFixed fixed;
  fixed.alignment = opt.alignment;
  fixed.size_alignment = 1;
  fixed.compat_hash = fmt_::hash_bytes(opt.compat_key);

  const std::string tmp = temp_name(out_path, "convert");
  Written w;
  const std::uint64_t payload = in->payload_bytes();
  {
    Progress progress("converting", payload);
    if (auto f = write_cache_file(file.value(), tmp, fixed, 1, entries, own, &progress, &w)) return report(*f);
  }
  {
    Progress progress("verifying the converted file", payload);
    if (auto f = verify_written(tmp, w, fixed, opt.compat_key, &progress)) return report(*f);
  }
  if (auto f = install(tmp, out_path)) return report(*f);
  std::printf("converted %s (ExecuTorch XPWC version %u, %zu entries) to %s (weightcache, alignment %llu, "
              "compat key hash %s)\n",
              in_path.c_str(), in->xpwc_version, w.records.size(), out_path.c_str(),
              static_cast<unsigned long long>(opt.alignment), hex64(fixed.compat_hash).c_str());
  return kExitOk;
}

}  // namespace weightcache::cli
