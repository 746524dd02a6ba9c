// The Windows suite's second process (started with CreateProcess). Commands:
//   expect <path> <key> <seed> <size> [ro]  open (read-only with "ro") and check one entry's bytes
//   add <path> <key> <seed> <size>          insert one entry and finalize
//   roundtrip <path>                        write, close, reopen and check a few entries
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
  const std::size_t off = cache.look_up(key);
  if (off == kNotFound) return child_failed(kChildMismatch, "no entry " + key);
  const void* p = cache.offset_to_addr(off);
  const std::string want = test::pattern_bytes(seed, size);
  if (p == nullptr || std::memcmp(p, want.data(), size) != 0)
    return child_failed(kChildMismatch, "wrong bytes for " + key);
  return kChildOk;
}

int add(WeightCache& cache, const std::string& key, std::uint64_t seed, std::size_t size) {
  const std::string bytes = test::pattern_bytes(seed, size);
  void* p = cache.reserve(size);
  if (p == nullptr) return child_failed(kChildCacheError, "reserve for " + key);
  std::memcpy(p, bytes.data(), size);
  if (cache.look_up_or_insert(key, p, size) == kNotFound) return child_failed(kChildCacheError, "insert of " + key);
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
