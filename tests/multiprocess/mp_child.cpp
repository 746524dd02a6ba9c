// Helper process of the multi-process suite: each instance is a fresh process (posix_spawn, or
// CreateProcessW on Windows: a fresh address space and a fresh registry) playing one role
// against a shared cache file. Arguments are name=value pairs after the mode; *_fd arguments
// are inherited pipe ends (descriptors, or handle values on Windows). Exit codes: child_exit.hpp.
//
//   pack     path tag shared own size [rounds=1] [gate_fd] [results] [lease_ms] [rotate]
//            Packs shared/0..shared-1 and own/<tag>/0..own-1 through look_up -> reserve -> fill ->
//            look_up_or_insert, finalizing after each round; verifies every entry.
//   reader   path init size writer count progress_fd [on_miss=0] [results]
//            Never writes. Checks init/0..init-1, signals progress, then refreshes and looks up
//            own/<writer>/0..count-1 until all hit, verifying each hit's bytes.
//   hold     path tag count size ready_fd go_fd
//            Packs and finalizes own/<tag>/0..count-1, reserves one more entry (taking the lease),
//            signals ready, and waits for a byte on go_fd (then inserts + finalizes) or EOF.
//   replace  path tag count size
//            Under the writer lease, builds a new file with own/<tag>/0..count-1 and renames it
//            over path, as compaction does. Exits kChildRefused when the OS refuses to replace the file.
//   keep_reading  path tag count size ready_fd stop results [read_only=0]
//            Opens the cache (as a writer would, unless read_only), then checks every own/<tag>/<j> by
//            look-up and byte compare, pass after pass, signalling ready after the first, until the
//            file `stop` exists; then one more pass, and its number of passes in results.
//   smaps    path count size ready_fd gate_fd results [done_fd exit_fd]    (Linux: reads /proc)
//            Reads every own/smaps/<i>, signals ready, waits for the gate to close, reports its
//            smaps figures for the cache file, signals done and waits for exit_fd to close.
//   verify   path tag count size results [mode=shared|first_use|on_open|none] [read_only=0] [missing=none]
//            Opens the cache, looks up own/<tag>/0..count-1 and compares their bytes (except
//            own/<tag>/<missing>, which must miss), and writes its stats to results.
//   pages    the same arguments and steps as smaps                          (Windows)
//            Reports how many pages of those entries are resident and how many of them are
//            shared (file) pages rather than private copies, from QueryWorkingSetEx.
#include "lease_probe.hpp"
#include "mp_util.hpp"

#include "platform/platform.hpp"

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#ifdef _WIN32
#include <psapi.h>  // after <windows.h>, which mp_util.hpp includes
#include <set>
#else
#include "smaps.hpp"

#include <cstring>

#include <sys/socket.h>
#include <unistd.h>
#endif

using namespace weightcache;
using namespace weightcache::test;
using namespace weightcache::test::mp;

namespace {

int fail(int code, const std::string& what) {
  std::fprintf(stderr, "mp_child[%d]: %s\n", weightcache::platform::os().process_id(), what.c_str());
  return code;
}

std::uint64_t num(const KeyValues& kv, const std::string& name, std::uint64_t dflt) {
  auto it = kv.find(name);
  return it == kv.end() ? dflt : std::strtoull(it->second.c_str(), nullptr, 10);
}
PipeEnd fd_arg(const KeyValues& kv, const std::string& name) {
  auto it = kv.find(name);
  return it == kv.end() ? kNoPipe : parse_pipe_end(it->second);
}
std::string str(const KeyValues& kv, const std::string& name) {
  auto it = kv.find(name);
  return it == kv.end() ? std::string() : it->second;
}

void wait_gate(PipeEnd fd) {
  if (fd == kNoPipe) return;
  (void)read_byte(fd);  // a byte or EOF: both mean "go"
  close_pipe_end(fd);
}

std::map<std::string, std::uint64_t> stats_results(const Stats& s) {
  return {{"entries", s.entries},
          {"heap_fallbacks", s.heap_fallbacks},
          {"backing_file", s.backing == Backing::file ? 1u : 0u},
          {"commits", s.commits},
          {"file_bytes", s.file_bytes},
          {"hits", s.hits},
          {"misses", s.misses},
          {"verify_failures", s.verify_failures},
          {"trusted_entries", s.trusted_entries},
          {"prebuilt", s.prebuilt}};
}

// Packs one key the way XNNPACK does; "" on success.
int run_pack(const KeyValues& kv) {
  const std::string path = str(kv, "path"), tag = str(kv, "tag"), results = str(kv, "results");
  const std::size_t shared = num(kv, "shared", 0), own = num(kv, "own", 0), size = num(kv, "size", 0);
  const std::size_t rounds = std::max<std::uint64_t>(1, num(kv, "rounds", 1));
  const std::size_t rotate = num(kv, "rotate", 0);
  if (path.empty() || tag.empty() || size == 0) return fail(kChildUsage, "pack: path, tag and size are required");
  wait_gate(fd_arg(kv, "gate_fd"));

  Options o = cache_options(path);
  if (kv.count("lease_ms") != 0) o.lease_timeout = std::chrono::milliseconds(num(kv, "lease_ms", 0));
  auto opened = WeightCache::open(o);
  if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();

  for (std::size_t r = 0; r < rounds; ++r) {
    // Shared keys in round 0, starting at a per-process rotation so racers collide on
    // different keys; own keys spread over the rounds.
    std::vector<std::string> keys;
    if (r == 0)
      for (std::size_t i = 0; i < shared; ++i) keys.push_back(shared_key((i + rotate) % shared));
    for (std::size_t j = r; j < own; j += rounds) keys.push_back(own_key(tag, j));
    for (const auto& key : keys)
      if (auto err = pack_key(cache, key, size); !err.empty()) return fail(kChildMismatch, err);
    if (auto f = cache.finalize(); !f) return fail(kChildCacheError, "finalize: " + f.error().message);
  }

  // Everything this process packed (or found packed) still reads right after its finalizes.
  for (std::size_t i = 0; i < shared; ++i)
    if (auto err = check_entry(cache, shared_key(i), size); !err.empty()) return fail(kChildMismatch, err);
  for (std::size_t j = 0; j < own; ++j)
    if (auto err = check_entry(cache, own_key(tag, j), size); !err.empty()) return fail(kChildMismatch, err);
  const Stats s = cache.stats();
  if (!results.empty() && !write_results(results, stats_results(s))) return fail(kChildUsage, "cannot write results");
  if (s.heap_fallbacks != 0) return fail(kChildFellBack, std::to_string(s.heap_fallbacks) + " heap fallbacks");
  return kChildOk;
}

int run_reader(const KeyValues& kv) {
  const std::string path = str(kv, "path"), writer = str(kv, "writer"), results = str(kv, "results");
  const std::size_t init = num(kv, "init", 0), count = num(kv, "count", 0), size = num(kv, "size", 0);
  const bool on_miss = num(kv, "on_miss", 0) != 0;
  PipeEnd progress_fd = fd_arg(kv, "progress_fd");
  if (path.empty() || writer.empty() || size == 0) return fail(kChildUsage, "reader: path, writer and size are required");

  Options o = cache_options(path);
  // A reader that tried to take the writer lease would fail at once instead of waiting: the
  // test holds the lease while readers must make progress.
  o.lease_timeout = std::chrono::milliseconds(0);
  o.refresh_on_miss = on_miss;
  auto opened = WeightCache::open(o);
  if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();

  for (int pass = 0; pass < 3; ++pass) {
    for (std::size_t j = 0; j < init; ++j)
      if (auto err = check_entry(cache, "init/" + std::to_string(j), size); !err.empty()) return fail(kChildMismatch, err);
    if (auto r = cache.refresh(); !r) return fail(kChildCacheError, "refresh: " + r.error().message);
  }
  if (progress_fd != kNoPipe) {
    if (!write_byte(progress_fd)) return fail(kChildUsage, "cannot signal progress");
    close_pipe_end(progress_fd);
    progress_fd = kNoPipe;
  }

  std::vector<std::size_t> seen(count, kNotFound);
  std::size_t hits = 0, last_hits = 0;
  std::uint64_t passes = 0, views = 0;
  while (hits < count) {
    ++passes;
    if (!on_miss)
      if (auto r = cache.refresh(); !r) return fail(kChildCacheError, "refresh: " + r.error().message);
    for (std::size_t j = 0; j < count; ++j) {
      const std::string key = own_key(writer, j);
      const std::size_t off = cache.look_up(key);
      if (seen[j] != kNotFound) {
        // Committed entries never move or vanish for a reader.
        if (off != seen[j]) return fail(kChildMismatch, "'" + key + "' moved or vanished after it was seen");
        continue;
      }
      if (off == kNotFound) continue;
      if (auto err = check_entry(cache, key, size); !err.empty()) return fail(kChildMismatch, err);
      seen[j] = off;
      ++hits;
    }
    if (hits != last_hits) ++views;  // a distinct state of the file this reader observed
    last_hits = hits;
    std::this_thread::yield();
  }
  for (std::size_t j = 0; j < count; ++j)
    if (auto err = check_entry(cache, own_key(writer, j), size); !err.empty()) return fail(kChildMismatch, err);
  auto out = stats_results(cache.stats());
  out["passes"] = passes;
  out["views"] = views;
  if (!results.empty() && !write_results(results, out)) return fail(kChildUsage, "cannot write results");
  if (out["heap_fallbacks"] != 0) return fail(kChildFellBack, "a reader fell back to heap");
  return kChildOk;
}

int run_verify(const KeyValues& kv) {
  const std::string path = str(kv, "path"), tag = str(kv, "tag"), results = str(kv, "results");
  const std::string mode = str(kv, "mode"), missing = str(kv, "missing");
  const std::size_t count = num(kv, "count", 0), size = num(kv, "size", 0);
  if (path.empty() || tag.empty() || results.empty() || size == 0)
    return fail(kChildUsage, "verify: path, tag, size and results are required");
  Options o = cache_options(path);
  o.verify = mode == "first_use" ? Verify::first_use
             : mode == "on_open"  ? Verify::on_open
             : mode == "none"     ? Verify::none
                                  : Verify::shared;
  o.read_only = num(kv, "read_only", 0) != 0;
  // Prebuilt caches (optional): the key to open with, the set, where records go, the file that
  // must be the one served ("" for path itself).
  if (const std::string compat = str(kv, "compat"); !compat.empty()) o.compat_key = compat;
  o.prebuilt_dir = str(kv, "prebuilt_dir");
  o.record_dir = str(kv, "record_dir");
  auto opened = WeightCache::open(o);
  if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();
  if (!str(kv, "expect_path").empty() && cache.path() != str(kv, "expect_path"))
    return fail(kChildMismatch, "serves '" + cache.path() + "', not '" + str(kv, "expect_path") + "'");
  for (std::size_t j = 0; j < count; ++j) {
    const std::string key = own_key(tag, j);
    if (std::to_string(j) == missing || missing == "all") {
      if (cache.look_up(key) != kNotFound) return fail(kChildMismatch, "'" + key + "' was served; it must miss");
      continue;
    }
    if (auto err = check_entry(cache, key, size); !err.empty()) return fail(kChildMismatch, err);
  }
  if (!write_results(results, stats_results(cache.stats()))) return fail(kChildUsage, "cannot write results");
  return kChildOk;
}

// Commits one small entry at a time, each under one of a few keys with new bytes (so the index
// stays small while the file keeps growing), until the file `stop` exists or `rounds` commits are
// made: a writer committing in a tight loop for readers that race it. Reports the commits made.
int run_commit_loop(const KeyValues& kv) {
  const std::string path = str(kv, "path"), stop = str(kv, "stop"), results = str(kv, "results");
  const std::size_t rounds = num(kv, "rounds", 0), size = num(kv, "size", 0);
  if (path.empty() || stop.empty() || rounds == 0 || size == 0)
    return fail(kChildUsage, "commit_loop: path, stop, rounds and size are required");
  auto opened = WeightCache::open(cache_options(path));
  if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();
  std::uint64_t commits = 0;
  std::error_code ec;
  for (std::size_t r = 0; r < rounds && !std::filesystem::exists(stop, ec); ++r) {
    const std::string key = "loop/" + std::to_string(r % 8);
    if (cache.insert(key, bytes_for_key(key + "#" + std::to_string(r), size)) == kNotFound)
      return fail(kChildCacheError, "insert: " + last_error().message);
    if (auto f = cache.finalize(); !f) return fail(kChildCacheError, "finalize: " + f.error().message);
    ++commits;
  }
  if (!results.empty() && !write_results(results, {{"commits", commits}})) return fail(kChildUsage, "cannot write results");
  return kChildOk;
}

int run_hold(const KeyValues& kv) {
  const std::string path = str(kv, "path"), tag = str(kv, "tag");
  const std::size_t count = num(kv, "count", 0), size = num(kv, "size", 0);
  const PipeEnd ready_fd = fd_arg(kv, "ready_fd");
  const PipeEnd go_fd = fd_arg(kv, "go_fd");
  if (path.empty() || tag.empty() || size == 0 || ready_fd == kNoPipe || go_fd == kNoPipe)
    return fail(kChildUsage, "hold: path, tag, size, ready_fd and go_fd are required");
  auto opened = WeightCache::open(cache_options(path));
  if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();
  for (std::size_t j = 0; j < count; ++j)
    if (auto err = pack_key(cache, own_key(tag, j), size); !err.empty()) return fail(kChildMismatch, err);
  if (auto f = cache.finalize(); !f) return fail(kChildCacheError, "finalize: " + f.error().message);

  // This reservation takes the writer lease and keeps it until the finalize below.
  const std::string pending = own_key(tag, count);
  void* p = cache.reserve(size);
  if (p == nullptr) return fail(kChildCacheError, "reserve: " + last_error().message);
  if (cache.stats().heap_fallbacks != 0) return fail(kChildFellBack, "the held reservation is not in the file");
  fill_for_key(pending, p, size);
  if (!write_byte(ready_fd)) return fail(kChildUsage, "cannot signal ready");
  close_pipe_end(ready_fd);

  if (!read_byte(go_fd)) return kChildOk;  // told to just close
  if (cache.look_up_or_insert(pending, p, size) == kNotFound)
    return fail(kChildCacheError, "look_up_or_insert: " + last_error().message);
  if (auto f = cache.finalize(); !f) return fail(kChildCacheError, "finalize: " + f.error().message);
  for (std::size_t j = 0; j <= count; ++j)
    if (auto err = check_entry(cache, own_key(tag, j), size); !err.empty()) return fail(kChildMismatch, err);
  return kChildOk;
}

int run_replace(const KeyValues& kv) {
  const std::string path = str(kv, "path"), tag = str(kv, "tag");
  const std::size_t count = num(kv, "count", 0), size = num(kv, "size", 0);
  if (path.empty() || tag.empty() || size == 0) return fail(kChildUsage, "replace: path, tag and size are required");
  // The lease every writer of `path` takes (the CLI's compact does the same).
  LeaseProbe lease(path);
  if (!lease.valid() || !lease.take()) return fail(kChildCacheError, "cannot take the lease");
  const std::string rebuilt = path + ".rebuild";
  {
    auto opened = WeightCache::open(cache_options(rebuilt));
    if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
    WeightCache& cache = opened.value();
    for (std::size_t j = 0; j < count; ++j)
      if (auto err = pack_key(cache, own_key(tag, j), size); !err.empty()) return fail(kChildMismatch, err);
    if (auto f = cache.finalize(); !f) return fail(kChildCacheError, "finalize: " + f.error().message);
  }
  // The library's rename, as the CLI's compact uses: rename(2), or on Windows MoveFileExW and
  // then a POSIX-semantics rename over a file others hold open, which not every system allows.
  if (auto r = weightcache::platform::os().rename(rebuilt, path); !r) return fail(kChildRefused, r.error().message);
  weightcache::platform::os().remove(rebuilt + ".lock");
  return kChildOk;
}

int run_keep_reading(const KeyValues& kv) {
  const std::string path = str(kv, "path"), tag = str(kv, "tag"), stop = str(kv, "stop"), results = str(kv, "results");
  const std::size_t count = num(kv, "count", 0), size = num(kv, "size", 0);
  PipeEnd ready_fd = fd_arg(kv, "ready_fd");
  if (path.empty() || tag.empty() || stop.empty() || results.empty() || count == 0 || size == 0 || ready_fd == kNoPipe)
    return fail(kChildUsage, "keep_reading: path, tag, count, size, ready_fd, stop and results are required");
  Options o = cache_options(path);
  o.read_only = num(kv, "read_only", 0) != 0;
  auto opened = WeightCache::open(o);
  if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();
  std::uint64_t passes = 0;
  for (bool last = false;;) {
    std::error_code ec;
    last = std::filesystem::exists(stop, ec);  // before the pass, so one whole pass follows the stop
    for (std::size_t j = 0; j < count; ++j)
      if (auto err = check_entry(cache, own_key(tag, j), size); !err.empty())
        return fail(kChildMismatch, "pass " + std::to_string(passes) + ": " + err);
    ++passes;
    if (ready_fd != kNoPipe) {
      if (!write_byte(ready_fd)) return fail(kChildUsage, "cannot signal ready");
      close_pipe_end(ready_fd);
      ready_fd = kNoPipe;
    }
    if (last) break;
    std::this_thread::yield();
  }
  if (!write_results(results, {{"passes", passes}})) return fail(kChildUsage, "cannot write results");
  return kChildOk;
}

// The end of a measuring reader (pages, smaps): writes its results, tells the parent it has
// measured, and stays mapped until the parent opens the exit gate: an early exit would change
// the others' figures (on Linux, raise their Pss).
int report_measured(const KeyValues& kv, const std::string& results,
                    const std::map<std::string, std::uint64_t>& out) {
  if (!write_results(results, out)) return fail(kChildUsage, "cannot write results");
  if (const PipeEnd done_fd = fd_arg(kv, "done_fd"); done_fd != kNoPipe) {
    if (!write_byte(done_fd)) return fail(kChildUsage, "cannot signal done");
    close_pipe_end(done_fd);
  }
  wait_gate(fd_arg(kv, "exit_fd"));
  return kChildOk;
}

#ifdef _WIN32
int run_pages(const KeyValues& kv) {
  const std::string path = str(kv, "path"), results = str(kv, "results");
  const std::size_t count = num(kv, "count", 0), size = num(kv, "size", 0);
  const PipeEnd ready_fd = fd_arg(kv, "ready_fd");
  if (path.empty() || results.empty() || size == 0 || ready_fd == kNoPipe)
    return fail(kChildUsage, "pages: path, size, ready_fd and results are required");
  auto opened = WeightCache::open(cache_options(path));
  if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();
  SYSTEM_INFO si{};
  ::GetSystemInfo(&si);
  const std::uintptr_t page = si.dwPageSize;
  std::set<std::uintptr_t> pages;  // every page holding bytes of an entry
  for (std::size_t j = 0; j < count; ++j) {
    const std::string key = own_key("smaps", j);
    if (auto err = check_entry(cache, key, size); !err.empty()) return fail(kChildMismatch, err);
    const auto begin = reinterpret_cast<std::uintptr_t>(cache.offset_to_addr(cache.look_up(key)));
    for (std::uintptr_t p = begin / page * page; p < begin + size; p += page) pages.insert(p);
  }
  if (!write_byte(ready_fd)) return fail(kChildUsage, "cannot signal ready");
  close_pipe_end(ready_fd);
  wait_gate(fd_arg(kv, "gate_fd"));  // every reader has read everything and still maps it
  std::vector<PSAPI_WORKING_SET_EX_INFORMATION> ws;
  for (std::uintptr_t p : pages) {
    PSAPI_WORKING_SET_EX_INFORMATION e{};
    e.VirtualAddress = reinterpret_cast<void*>(p);
    ws.push_back(e);
  }
  if (!::QueryWorkingSetEx(::GetCurrentProcess(), ws.data(), static_cast<DWORD>(ws.size() * sizeof ws[0])))
    return fail(kChildCacheError, "QueryWorkingSetEx failed: Windows error " + std::to_string(::GetLastError()));
  std::uint64_t valid = 0, shared = 0;
  for (const auto& e : ws) {
    if (!e.VirtualAttributes.Valid) continue;
    ++valid;
    if (e.VirtualAttributes.Shared) ++shared;
  }
  auto out = stats_results(cache.stats());
  out["pages"] = ws.size();
  out["page_size"] = page;
  out["valid"] = valid;
  out["shared"] = shared;
  return report_measured(kv, results, out);
}
#else
int run_smaps(const KeyValues& kv) {
  const std::string path = str(kv, "path"), results = str(kv, "results");
  const std::size_t count = num(kv, "count", 0), size = num(kv, "size", 0);
  const PipeEnd ready_fd = fd_arg(kv, "ready_fd");
  if (path.empty() || results.empty() || size == 0 || ready_fd == kNoPipe)
    return fail(kChildUsage, "smaps: path, size, ready_fd and results are required");
  Options o = cache_options(path);
  auto opened = WeightCache::open(o);
  if (!opened) return fail(kChildCacheError, "open: " + opened.error().message);
  WeightCache& cache = opened.value();
  for (std::size_t j = 0; j < count; ++j)
    if (auto err = check_entry(cache, own_key("smaps", j), size); !err.empty()) return fail(kChildMismatch, err);
  if (!write_byte(ready_fd)) return fail(kChildUsage, "cannot signal ready");
  close_pipe_end(ready_fd);
  // Measure only once every reader has touched every page, so each page is shared by all.
  wait_gate(fd_arg(kv, "gate_fd"));
  const SmapsUsage u = smaps_usage(path);
  auto out = stats_results(cache.stats());
  out["rss"] = u.rss;
  out["pss"] = u.pss;
  out["private_dirty"] = u.private_dirty;
  out["private_clean"] = u.private_clean;
  out["shared_clean"] = u.shared_clean;
  out["shared_dirty"] = u.shared_dirty;
  out["vmas"] = u.mappings;
  return report_measured(kv, results, out);
}

// Receives a cache's descriptor over a UNIX socket (SCM_RIGHTS), opens the cache from it
// read-only, checks every entry without packing any, and reports its memory of the file.
int run_fd_reader(const KeyValues& kv) {
  const std::string results = str(kv, "results");
  const std::size_t count = num(kv, "count", 0), size = num(kv, "size", 0);
  const int sock = static_cast<int>(num(kv, "sock", 0));
  if (results.empty() || size == 0 || sock <= 0) return fail(kChildUsage, "fd_reader: results, size and sock are required");
  char byte = 0;
  iovec io{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(sock, &msg, 0) != 1) return fail(kChildUsage, "no descriptor arrived");
  const cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return fail(kChildUsage, "no descriptor in the message");
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  Options o;
  o.fd = fd;
  o.read_only = true;
  o.backing = Backing::file;
  o.compat_key = "multiprocess-test";
  o.durability = Durability::none;
  auto opened = WeightCache::open(o);
  if (!opened) return fail(kChildCacheError, "open from the descriptor: " + opened.error().message);
  WeightCache& cache = opened.value();
  ::close(fd);  // the cache holds its own description of the file
  for (std::size_t j = 0; j < count; ++j)
    if (auto err = check_entry(cache, own_key("mem", j), size); !err.empty()) return fail(kChildMismatch, err);
  if (cache.stats().heap_bytes != 0 || cache.stats().entries != count) return fail(kChildMismatch, "packed or missed");
  if (::write(sock, "r", 1) != 1) return fail(kChildUsage, "cannot signal ready");
  if (::read(sock, &byte, 1) != 1) return fail(kChildUsage, "no gate");  // every page touched by both
  const SmapsUsage u = smaps_usage("/proc/self/fd/" + std::to_string(cache.descriptor()));
  auto out = stats_results(cache.stats());
  out["pss"] = u.pss;
  out["rss"] = u.rss;
  out["private_dirty"] = u.private_dirty;
  if (!write_results(results, out)) return fail(kChildUsage, "cannot write results");
  if (::write(sock, "d", 1) != 1) return fail(kChildUsage, "cannot signal done");
  (void)::read(sock, &byte, 1);  // stay mapped until the parent has measured
  return kChildOk;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return fail(kChildUsage, "usage: mp_child pack|reader|hold|replace|keep_reading|smaps|pages name=value...");
  const std::string mode = argv[1];
  const KeyValues kv = parse_args(argc, argv, 2);
  if (mode == "pack") return run_pack(kv);
  if (mode == "reader") return run_reader(kv);
  if (mode == "hold") return run_hold(kv);
  if (mode == "commit_loop") return run_commit_loop(kv);
  if (mode == "verify") return run_verify(kv);
  if (mode == "replace") return run_replace(kv);
  if (mode == "keep_reading") return run_keep_reading(kv);
#ifdef _WIN32
  if (mode == "pages") return run_pages(kv);  // QueryWorkingSetEx
#else
  if (mode == "smaps") return run_smaps(kv);  // reads /proc/self/smaps
  if (mode == "fd_reader") return run_fd_reader(kv);
#endif
  return fail(kChildUsage, "unknown mode '" + mode + "'");
}
