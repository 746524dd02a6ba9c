// The Windows suite's second process (started with CreateProcess). Commands:
//   expect <path> <key> <seed> <size> [ro]  open (read-only with "ro") and check one entry's bytes
//   add <path> <key> <seed> <size>          insert one entry and finalize
//   roundtrip <path>                        write, close, reopen and check a few entries
// Exit codes: 0 ok, 2 open failed, 3 miss, 4 wrong bytes, 5 insert or finalize failed, 9 usage.
#include "windows_test_util.hpp"

#include <weightcache/weight_cache.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using namespace weightcache;

int check(WeightCache& cache, const std::string& key, std::uint64_t seed, std::size_t size) {
  const std::size_t off = cache.look_up(key);
  if (off == kNotFound) return 3;
  const void* p = cache.offset_to_addr(off);
  const std::string want = test::pattern_bytes(seed, size);
  if (p == nullptr || std::memcmp(p, want.data(), size) != 0) return 4;
  return 0;
}

int add(WeightCache& cache, const std::string& key, std::uint64_t seed, std::size_t size) {
  const std::string bytes = test::pattern_bytes(seed, size);
  void* p = cache.reserve(size);
  if (p == nullptr) return 5;
  std::memcpy(p, bytes.data(), size);
  if (cache.look_up_or_insert(key, p, size) == kNotFound) return 5;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 9;
  const std::string cmd = argv[1];
  const std::string path = argv[2];
  Options o = test::suite_options(path);
  if (cmd == "expect" && (argc == 6 || argc == 7)) {
    o.read_only = argc == 7 && std::strcmp(argv[6], "ro") == 0;
    auto cache = WeightCache::open(o);
    if (!cache || cache->stats().backing != Backing::file) {
      std::fprintf(stderr, "open: %s\n", cache ? "fell back to heap" : cache.error().message.c_str());
      return 2;
    }
    return check(*cache, argv[3], std::strtoull(argv[4], nullptr, 10), std::strtoull(argv[5], nullptr, 10));
  }
  if (cmd == "add" && argc == 6) {
    auto cache = WeightCache::open(o);
    if (!cache || cache->stats().backing != Backing::file) return 2;
    if (int rc = add(*cache, argv[3], std::strtoull(argv[4], nullptr, 10), std::strtoull(argv[5], nullptr, 10)); rc != 0)
      return rc;
    if (auto r = cache->finalize(); !r) {
      std::fprintf(stderr, "finalize: %s\n", r.error().message.c_str());
      return 5;
    }
    return 0;
  }
  if (cmd == "roundtrip" && argc == 3) {
    {
      auto cache = WeightCache::open(o);
      if (!cache || cache->stats().backing != Backing::file) return 2;
      for (int i = 0; i < 8; ++i)
        if (int rc = add(*cache, "k" + std::to_string(i), 100 + i, 1000 + 30000 * i); rc != 0) return rc;
      if (!cache->finalize()) return 5;
    }
    auto cache = WeightCache::open(o);
    if (!cache || cache->stats().backing != Backing::file) return 2;
    for (int i = 0; i < 8; ++i)
      if (int rc = check(*cache, "k" + std::to_string(i), 100 + i, 1000 + 30000 * i); rc != 0) return rc;
    return 0;
  }
  return 9;
}
