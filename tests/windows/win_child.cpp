// The Windows suite's second process (started with CreateProcess). Commands:
//   expect <path> <key> <seed> <size> [ro]  open (read-only with "ro") and check one entry's bytes
//   add <path> <key> <seed> <size>          insert one entry and finalize
//   roundtrip <path>                        write, close, reopen and check a few entries
//   handle-writer <handle> <count>          open on an inherited handle (closed once open), find
//                                           shared_entries(count) in the file's mapping, then add
//                                           "child/added" and finalize
//   handle-reader <handle> <count>          the same on a handle without write access: refused
//                                           as writable, then read_only: finds every entry in
//                                           read-only pages, and no insert or finalize writes
// Exit codes: child_exit.hpp (stderr says what failed).
#include "child_exit.hpp"
#include "windows_test_util.hpp"

#include <weightcache/weight_cache.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using namespace weightcache;
using namespace weightcache::test;

int check(WeightCache& cache, const std::string& key, std::uint64_t seed, std::size_t size) {
  const std::string problem = entry_problem(cache, {key, seed, size});
  return problem.empty() ? kChildOk : child_failed(kChildMismatch, problem);
}

int add(WeightCache& cache, const std::string& key, std::uint64_t seed, std::size_t size) {
  if (pack_entry(cache, {key, seed, size}) == kNotFound)
    return child_failed(kChildCacheError, "insert of " + key + ": " + last_error().message);
  return kChildOk;
}

// Every entry of shared_entries(count), in pages of the file's mapping (not copies) with the
// protection `protect`.
int check_shared(WeightCache& cache, std::size_t count, DWORD protect) {
  for (const auto& e : shared_entries(count)) {
    if (int rc = check(cache, e.key, e.seed, e.size); rc != kChildOk) return rc;
    MEMORY_BASIC_INFORMATION mbi{};
    const void* p = cache.offset_to_addr(cache.look_up(e.key));
    if (::VirtualQuery(p, &mbi, sizeof mbi) != sizeof mbi || mbi.Type != MEM_MAPPED)
      return child_failed(kChildFellBack, e.key + " is not in a file mapping");
    if (mbi.Protect != protect)
      return child_failed(kChildUnexpected, e.key + "'s pages have protection " + std::to_string(mbi.Protect));
  }
  const Stats s = cache.stats();
  if (s.backing != Backing::file || s.entries != count || s.heap_bytes != 0 || s.heap_fallbacks != 0)
    return child_failed(kChildUnexpected, "stats: " + std::to_string(s.entries) + " entries, " +
                                              std::to_string(s.heap_bytes) + " heap bytes");
  return kChildOk;
}

// The cache on an inherited handle, which the child then closes (the cache keeps its own).
Result<WeightCache> open_on(HANDLE h, bool read_only) {
  Options o = suite_options("");
  o.handle = h;
  o.read_only = read_only;
  auto cache = WeightCache::open(o);
  ::CloseHandle(h);
  return cache;
}

int handle_writer(HANDLE h, std::size_t count) {
  auto cache = open_on(h, false);
  if (!cache) return child_failed(kChildCacheError, "open: " + cache.error().message);
  if (int rc = check_shared(*cache, count, PAGE_READWRITE); rc != kChildOk) return rc;
  if (int rc = add(*cache, "child/added", 99, 100000); rc != kChildOk) return rc;
  if (auto r = cache->finalize(); !r) return child_failed(kChildCacheError, "finalize: " + r.error().message);
  return kChildOk;
}

int handle_reader(HANDLE h, std::size_t count) {
  DWORD put = 0;
  OVERLAPPED at{};
  if (::WriteFile(h, "x", 1, &put, &at) || ::GetLastError() != ERROR_ACCESS_DENIED)
    return child_failed(kChildUnexpected, "the handle given to the reader can write");
  {
    Options o = suite_options("");
    o.handle = h;
    auto writable = WeightCache::open(o);
    if (writable || writable.error().code != Errc::read_only)
      return child_failed(kChildUnexpected, "a handle without write access opened as a writable cache");
  }
  auto cache = open_on(h, true);
  if (!cache) return child_failed(kChildCacheError, "open: " + cache.error().message);
  if (int rc = check_shared(*cache, count, PAGE_READONLY); rc != kChildOk) return rc;
  if (cache->insert("reader/added", "bytes") == kNotFound) return child_failed(kChildCacheError, "insert");
  if (cache->stats().heap_bytes == 0) return child_failed(kChildUnexpected, "a read-only cache put an entry in the file");
  auto f = cache->finalize();
  if (f || f.error().code != Errc::read_only)
    return child_failed(kChildUnexpected, "finalize of a read-only cache did not say read_only");
  return kChildOk;
}

// The open of every command: a file-backed cache, or why not.
int opened_on_file(Result<WeightCache>& cache) {
  if (!cache) return child_failed(kChildCacheError, "open: " + cache.error().message);
  if (cache->stats().backing != Backing::file) return child_failed(kChildFellBack, "open fell back to the heap");
  return kChildOk;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return child_failed(kChildUsage, "win_child COMMAND PATH ...");
  const std::string cmd = argv[1];
  if (cmd == "handle-writer" && argc == 4) return handle_writer(handle_of(argv[2]), std::strtoull(argv[3], nullptr, 10));
  if (cmd == "handle-reader" && argc == 4) return handle_reader(handle_of(argv[2]), std::strtoull(argv[3], nullptr, 10));
  const std::string path = argv[2];
  Options o = test::suite_options(path);
  if (cmd == "expect" && (argc == 6 || argc == 7)) {
    o.read_only = argc == 7 && std::strcmp(argv[6], "ro") == 0;
    auto cache = WeightCache::open(o);
    if (int rc = opened_on_file(cache); rc != kChildOk) return rc;
    return check(*cache, argv[3], std::strtoull(argv[4], nullptr, 10), std::strtoull(argv[5], nullptr, 10));
  }
  if (cmd == "add" && argc == 6) {
    auto cache = WeightCache::open(o);
    if (int rc = opened_on_file(cache); rc != kChildOk) return rc;
    if (int rc = add(*cache, argv[3], std::strtoull(argv[4], nullptr, 10), std::strtoull(argv[5], nullptr, 10)); rc != 0)
      return rc;
    if (auto r = cache->finalize(); !r) return child_failed(kChildCacheError, "finalize: " + r.error().message);
    return kChildOk;
  }
  if (cmd == "roundtrip" && argc == 3) {
    {
      auto cache = WeightCache::open(o);
      if (int rc = opened_on_file(cache); rc != kChildOk) return rc;
      for (int i = 0; i < 8; ++i)
        if (int rc = add(*cache, "k" + std::to_string(i), 100 + i, 1000 + 30000 * i); rc != 0) return rc;
      if (!cache->finalize()) return child_failed(kChildCacheError, "finalize");
    }
    auto cache = WeightCache::open(o);
    if (int rc = opened_on_file(cache); rc != kChildOk) return rc;
    for (int i = 0; i < 8; ++i)
      if (int rc = check(*cache, "k" + std::to_string(i), 100 + i, 1000 + 30000 * i); rc != 0) return rc;
    return kChildOk;
  }
  return child_failed(kChildUsage, "unknown command or arguments: " + cmd);
}
