// Writes the golden cache file of tests/windows/data: `wc_make_golden <path>`. Built for Linux
// and for Windows; the output of each is committed, and the tests on the other platform read it.
#include "windows_test_util.hpp"

#include <weightcache/weight_cache.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>

int main(int argc, char** argv) {
  using namespace weightcache;
  if (argc != 2) {
    std::fprintf(stderr, "usage: wc_make_golden <path>\n");
    return 2;
  }
  std::error_code ec;
  std::filesystem::remove(argv[1], ec);
  {
    auto cache = WeightCache::open(test::golden_options(argv[1]));
    if (!cache) {
      std::fprintf(stderr, "open: %s\n", cache.error().message.c_str());
      return 1;
    }
    for (const auto& e : test::golden_entries()) {
      const std::string bytes = test::pattern_bytes(e.seed, e.size);
      void* p = cache->reserve(bytes.size());
      if (p == nullptr) {
        std::fprintf(stderr, "reserve: %s\n", last_error().message.c_str());
        return 1;
      }
      std::memcpy(p, bytes.data(), bytes.size());
      if (cache->look_up_or_insert(e.key, p, bytes.size()) == kNotFound) {
        std::fprintf(stderr, "insert: %s\n", last_error().message.c_str());
        return 1;
      }
    }
    if (auto r = cache->finalize(); !r) {
      std::fprintf(stderr, "finalize: %s\n", r.error().message.c_str());
      return 1;
    }
  }
  std::error_code rc;
  std::filesystem::remove(std::string(argv[1]) + ".lock", rc);
  return 0;
}
