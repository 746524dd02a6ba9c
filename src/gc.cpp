#include "gc.hpp"

#include "boundary.hpp"
#include "core.hpp"
#include "file_state.hpp"
#include "log.hpp"
#include "mobile.hpp"
#include "platform/errors.hpp"
#include "format/format.hpp"
#include "verify_record.hpp"

#include <weightcache/weightcache.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <system_error>
#include <vector>

namespace weightcache {
#if !WEIGHTCACHE_MOBILE
namespace {

using platform::FileInfo;

bool same_file(const FileInfo& a, const FileInfo& b) noexcept { return a.device == b.device && a.inode == b.inode; }

// Empty, or starting with a verification record (its magic, version and an entry count the
// file's size holds): what the library leaves in a lock file.
bool holds_nothing_but_a_record(platform::Platform& pf, const std::string& lock_path, const FileInfo& seen) {
  if (seen.size == 0) return true;
  if (seen.size < kRecordFixedBytes + 8) return false;
  auto f = pf.open_file(lock_path, platform::OpenMode::read, 0, false);
  if (!f) return false;
  std::byte head[kRecordFixedBytes];
  auto info = pf.stat_file(f.value());
  if (!info || !same_file(info.value(), seen) || !pf.read_at(f.value(), head, sizeof head, 0)) return false;
  return record_size_if_header(head, info->size).has_value();
}

bool refused(const Error& e) noexcept {
  return e.code == Errc::read_only || e.sys_errno == EACCES || e.sys_errno == EPERM || e.sys_errno == EROFS;
}

// A cache file found by the scan, as it was then.
struct Candidate {
  std::string name, path;
  FileInfo data;
  bool has_lock = false;  // a regular "<path>.lock" beside it
  bool foreign_lock = false;  // "<path>.lock" is there but holds another program's data
  FileInfo lock;
  std::uint64_t bytes = 0;
  std::int64_t last_used = 0;
  std::vector<std::string> temporaries;  // "<path>.tmp.<pid>.<...>" found beside it
};

struct Attempt {
  bool removed = false;
  GcReason reason = GcReason::least_recently_used;
  std::string detail;
  std::uint64_t freed = 0;
};

Attempt keep(GcReason reason, std::string detail) { return Attempt{false, reason, std::move(detail), 0}; }

// The file, if it is a cache file: a regular file (not a symlink) whose header decodes as ours,
// be it a version or byte order this build cannot read. A damaged header is not recognised:
// nothing proves such a file is ours (an open by the library rebuilds it).
Result<bool> scan(platform::Platform& pf, const std::string& path, Candidate* out) {
  auto st = pf.stat_path(path, false);
  if (!st || !st->regular || st->symlink || st->size < format::kHeaderSize) return false;
  auto fd = pf.open_file(path, platform::OpenMode::read, 0, false);
  if (!fd) return false;  // unreadable, or replaced by a symlink or a directory meanwhile
  auto info = pf.stat_file(fd.value());
  if (!info) return false;
  auto header = read_header(pf, fd.value());
  if (!header) {
    if (header.error().code == Errc::no_memory) return header.error();
    if (header.error().code != Errc::incompatible) return false;
  }
  out->path = path;
  out->data = info.value();
  out->bytes = info->allocated;
  out->last_used = info->mtime_ns;
  // A lock file holds nothing or a verification record (verify_record.hpp): "<name>.lock" with
  // anything else in it is somebody's file (maybe a cache of its own, scanned on its own), never
  // this cache's to remove with it.
  if (auto lk = pf.stat_path(path + ".lock", false); lk && lk->regular && !lk->symlink) {
    if (!holds_nothing_but_a_record(pf, path + ".lock", lk.value())) {
      out->foreign_lock = true;
      return true;
    }
    out->has_lock = true;
    out->lock = lk.value();
    out->bytes += lk->allocated;
    out->last_used = std::max(out->last_used, lk->mtime_ns);
  }
  return true;
}

// Removes the cache file only when it is provably unused, in the order every user of it
// takes its locks: the lease on the lock file, then the lease on the file itself (a writer
// reaching it through a hard link has another lock file), then the exclusive "in use" lock,
// which no process that has the file open lets anyone take. A process opening it meanwhile
// waits on that lock and, once the name is gone, creates a new file (core.cpp, open_in_use).
Attempt try_remove(platform::Platform& pf, const Candidate& c, GcReport* report) {
  auto fd = pf.open_file(c.path, platform::OpenMode::read_write, 0, false);
  if (!fd) {
    const Error& e = fd.error();
    if (e.sys_errno == ENOENT || e.sys_errno == ELOOP || e.code == Errc::invalid_argument)
      return keep(GcReason::changed, "removed or replaced by another process meanwhile");
    if (refused(e))
      return keep(GcReason::not_writable,
                  "cannot be opened for writing (" + e.message + "), so it cannot be proven unused");
    return keep(GcReason::failed, e.message);
  }
  auto now = pf.stat_file(fd.value());
  if (!now) return keep(GcReason::failed, now.error().message);
  if (!same_file(now.value(), c.data)) return keep(GcReason::changed, "replaced by another file meanwhile");

  const std::string lock_path = c.path + ".lock";
  // Not created when absent: a lock file made only to be deleted again would, if a lock below
  // were refused, stay behind with a fresh time and make the file look recently used. Without
  // one, no writer can hold the lease but through the file's own lock, taken next. Declared
  // after the file, so on every way out below it is closed (its lock with it) before the file.
  auto opened_lock = pf.open_file(lock_path, platform::OpenMode::read, 0, false);
  if (!opened_lock && opened_lock.error().sys_errno != ENOENT)
    return keep(GcReason::failed, "cannot open its lock file: " + opened_lock.error().message);
  const platform::File no_lock_file;
  const platform::File& lk = opened_lock ? opened_lock.value() : no_lock_file;
  std::string lock_note;
  if (!opened_lock && c.has_lock) lock_note = "its lock file was removed meanwhile";
  // A lock file that appeared since the scan is an opener's: it is about to use the file.
  if (lk.is_open() && !c.has_lock) {
    if (c.foreign_lock)
      return keep(GcReason::failed, "'" + lock_path + "' holds another program's data, not a weightcache lock file; "
                                    "remove or rename it if it is not needed");
    return keep(GcReason::changed, "being opened by another process");
  }
  if (lk.is_open()) {
    auto lease = pf.try_lock(lk);
    if (!lease) return keep(GcReason::failed, "cannot lock its lock file: " + lease.error().message);
    if (!lease.value()) return keep(GcReason::in_use, "a writer holds its lease");
  }
  auto data_lease = pf.try_lock(fd.value());
  if (!data_lease) return keep(GcReason::failed, "cannot lock it: " + data_lease.error().message);
  if (!data_lease.value()) return keep(GcReason::in_use, "a writer holds its lease");
  auto alone = pf.try_lock_in_use(fd.value(), true);
  if (!alone)
    return keep(GcReason::failed, "cannot take its in-use lock, so it cannot be proven unused: " + alone.error().message);
  if (!alone.value()) return keep(GcReason::in_use, "a process has it open");

  // Locked. The name must still be this file, and nobody may have used it since the scan (a
  // process that opened and closed it meanwhile made it the most recently used).
  auto at_path = pf.stat_path(c.path, false);
  if (!at_path || at_path->symlink || !same_file(at_path.value(), c.data))
    return keep(GcReason::changed, "replaced by another file meanwhile");
  std::int64_t used = now->mtime_ns;
  bool remove_lock = false;
  if (lk.is_open()) {
    auto ours = pf.stat_file(lk);
    if (!ours) return keep(GcReason::failed, "cannot examine its lock file: " + ours.error().message);
    if (!same_file(ours.value(), c.lock)) return keep(GcReason::changed, "its lock file was replaced meanwhile");
    used = std::max(used, ours->mtime_ns);
    // Delete the lock file only if it is the one we hold the lease on.
    auto named = pf.stat_path(lock_path, false);
    if (named && !named->symlink && same_file(ours.value(), named.value()))
      remove_lock = true;
    else if (named)
      lock_note = "a new lock file took its lock file's name meanwhile and stays";
    else if (named.error().sys_errno == ENOENT)
      lock_note = "its lock file was removed meanwhile";
    else
      return keep(GcReason::failed, "cannot examine its lock file: " + named.error().message);
  }
  if (used > c.last_used) return keep(GcReason::changed, "used while gc ran");

  if (auto r = pf.remove_file(c.path); !r) return keep(GcReason::failed, r.error().message);
  Attempt out;
  out.removed = true;
  out.freed = now->allocated;
  out.detail = std::move(lock_note);
  if (remove_lock) {
    if (auto r = pf.remove_file(lock_path); r)
      out.freed += c.has_lock ? c.lock.allocated : 0;
    else
      out.detail = "its lock file stays: " + r.error().message;
    // With the lease held no writer is building a temporary of this file: any there is a dead
    // writer's (the library removes them the same way before it builds one).
    for (const auto& t : c.temporaries) {
      auto st = pf.stat_path(t, false);
      if (!st || !st->regular || st->symlink) continue;
      if (pf.remove_file(t)) {
        ++report->removed_temporaries;
        report->removed_temporary_bytes += st->allocated;
      }
    }
  }
  return out;
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.back() == '/') return dir + name;
#ifdef _WIN32
  if (dir.back() == '\\') return dir + name;
#endif
  return dir + "/" + name;
}

Result<GcReport> collect(platform::Platform& pf, const std::string& dir, std::uint64_t max_bytes) {
  namespace fs = std::filesystem;
  if (dir.empty()) return Error{Errc::invalid_argument, 0, "gc: no directory given"};
  // The names first, then each file, all through the platform layer.
  auto listed = pf.list_directory(dir);
  if (!listed) return Error{listed.error().code, listed.error().sys_errno, "gc: " + listed.error().message};
  std::vector<std::string> names = std::move(listed.value());
  std::sort(names.begin(), names.end());

  std::map<std::string, std::vector<std::string>> temporaries;  // base name -> its temporaries
  std::vector<Candidate> caches;
  for (const auto& name : names) {
    if (std::string base; temporary_name(name, &base)) {
      temporaries[base].push_back(join(dir, name));
      continue;
    }
    Candidate c;
    auto found = scan(pf, join(dir, name), &c);
    if (!found) return found.error();
    if (!found.value()) continue;
    c.name = name;
    caches.push_back(std::move(c));
  }
  for (auto& c : caches)
    if (auto t = temporaries.find(c.name); t != temporaries.end()) c.temporaries = std::move(t->second);
  std::stable_sort(caches.begin(), caches.end(),
                   [](const Candidate& a, const Candidate& b) { return a.last_used < b.last_used; });

  GcReport report;
  report.max_bytes = max_bytes;
  for (const auto& c : caches) report.total_before += c.bytes;
  std::uint64_t total = report.total_before;
  report.files.reserve(caches.size());
  for (const auto& c : caches) {
    GcFile f;
    f.path = c.path;
    f.bytes = c.bytes;
    f.last_used_ns = c.last_used;
    Attempt a = total <= max_bytes ? keep(GcReason::within_budget, {}) : try_remove(pf, c, &report);
    f.removed = a.removed;
    f.reason = a.reason;
    f.detail = std::move(a.detail);
    if (a.removed) {
      total -= std::min(total, a.freed);
      ++report.removed_files;
      report.removed_bytes += a.freed;
      log::info("gc: removed '{}' ({} bytes)", c.path, a.freed);
    } else {
      ++report.kept_files;
      report.kept_bytes += c.bytes;
      if (a.reason == GcReason::in_use) {
        ++report.kept_in_use;
        report.kept_in_use_bytes += c.bytes;
      } else if (a.reason != GcReason::within_budget) {
        ++report.kept_unremovable;
        report.kept_unremovable_bytes += c.bytes;
      }
      if (a.reason != GcReason::within_budget) log::info("gc: kept '{}': {}", c.path, f.detail);
    }
    report.files.push_back(std::move(f));
  }
  report.total_after = total;
  return report;
}

}  // namespace
#endif  // !WEIGHTCACHE_MOBILE

bool temporary_name(const std::string& name, std::string* base) {
  // Exactly what the library and the CLI name them: "<base>.tmp.<pid>.<n>" (n a number) or
  // "<base>.tmp.<pid>.compact" / ".convert"; nothing else that merely looks alike.
  constexpr std::string_view kTmp = ".tmp.";
  auto digits_only = [](std::string_view v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  for (auto p = name.find(kTmp, 1); p != std::string::npos; p = name.find(kTmp, p + 1)) {
    const std::string_view rest = std::string_view(name).substr(p + kTmp.size());
    const auto dot = rest.find('.');
    if (dot == std::string_view::npos) continue;
    const std::string_view pid = rest.substr(0, dot), tail = rest.substr(dot + 1);
    if (digits_only(pid) && (digits_only(tail) || tail == "compact" || tail == "convert")) {
      *base = name.substr(0, p);
      return true;
    }
  }
  return false;
}

Result<GcReport> collect_garbage(platform::Platform& pf, const std::string& dir, std::uint64_t max_bytes) {
#if WEIGHTCACHE_MOBILE
  (void)pf, (void)dir, (void)max_bytes;
  return left_out_of_mobile_build("garbage collection of a cache directory (wc_gc)",
                                  "remove old caches with the weightcache command-line tool ('weightcache gc DIR "
                                  "--max-size SIZE') where the app is not running");
#else
  try {
    return collect(pf, dir, max_bytes);
  } catch (const std::bad_alloc&) {
    return platform::no_memory_error("out of memory while collecting garbage in", dir);
  } catch (...) {
    return Error{Errc::io, 0, "gc: unexpected failure while reading '" + dir + "'"};
  }
#endif
}

const char* to_string(GcReason reason) noexcept {
  switch (reason) {
    case GcReason::least_recently_used: return "least_recently_used";
    case GcReason::within_budget: return "within_budget";
    case GcReason::in_use: return "in_use";
    case GcReason::not_writable: return "not_writable";
    case GcReason::changed: return "changed";
    case GcReason::failed: return "failed";
  }
  return "unknown";
}

Result<GcReport> gc(const std::string& dir, std::uint64_t max_bytes) noexcept {
  return guard_result("weightcache::gc", [&] {  // its error's message is UTF-8, as last_error's
    auto r = collect_garbage(platform::os(), dir, max_bytes);
    if (!r) set_last_error(r.error());
    return r;
  });
}

}  // namespace weightcache

using namespace weightcache;

extern "C" {

void wc_gc_report_init(wc_gc_report* report) {
  if (report == nullptr) return;
  std::memset(report, 0, sizeof(*report));
  report->struct_size = sizeof(wc_gc_report);
}

wc_status wc_gc(const char* dir, uint64_t max_bytes, wc_gc_report* report) {
  try {
    if (dir == nullptr || *dir == '\0')
      return static_cast<wc_status>(fail({Errc::invalid_argument, 0, "wc_gc: dir must be a non-empty path"}).code);
    if (report != nullptr && (report->struct_size < offsetof(wc_gc_report, total_after) + sizeof(uint64_t) ||
                              report->struct_size > (1u << 16)))
      return static_cast<wc_status>(
          fail({Errc::invalid_argument, 0, "wc_gc: report.struct_size is not set; call wc_gc_report_init first"}).code);
    auto r = collect_garbage(platform::os(), dir, max_bytes);
    if (!r) return static_cast<wc_status>(fail(r.error()).code);
    if (report != nullptr) {
      wc_gc_report full{};
      full.struct_size = report->struct_size;
      full.caches = r->files.size();
#define WC_COPY_FIELD(field) full.field = r->field;
      WC_COPY_FIELD(max_bytes) WC_COPY_FIELD(total_before) WC_COPY_FIELD(total_after)
      WC_COPY_FIELD(removed_files) WC_COPY_FIELD(removed_bytes) WC_COPY_FIELD(kept_files)
      WC_COPY_FIELD(kept_bytes) WC_COPY_FIELD(kept_in_use) WC_COPY_FIELD(kept_in_use_bytes)
      WC_COPY_FIELD(kept_unremovable) WC_COPY_FIELD(kept_unremovable_bytes)
      WC_COPY_FIELD(removed_temporaries) WC_COPY_FIELD(removed_temporary_bytes)
#undef WC_COPY_FIELD
      full.within_budget = r->within_budget() ? 1 : 0;
      std::memcpy(report, &full, std::min(report->struct_size, sizeof(full)));
    }
    return WC_OK;
  } catch (...) {
    set_last_error(Errc::no_memory, 0, "wc_gc: out of memory while collecting garbage in", dir);
    return WC_ERR_NO_MEMORY;
  }
}

}  // extern "C"
