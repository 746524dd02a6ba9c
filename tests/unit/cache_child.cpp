// Helper process for the unit tests: writes or verifies a cache from a fresh address space
// and a fresh process-wide registry, as a second launch of an application would.
//
//   cache_child write  <cache> <seed> <count> <max_size>   pack an entry set, finalize
//   cache_child verify <cache> <seed> <count> <max_size>   every entry hits with its bytes
//   cache_child verify-manifest <cache> <manifest>         every (key, bytes) of the manifest hits
#include "cache_test_util.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace weightcache;
using namespace weightcache::test;

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: cache_child write|verify <cache> <seed> <count> <max_size>\n"
               "       cache_child verify-manifest <cache> <manifest>\n");
  return kChildUsage;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string mode = argv[1];
  auto opened = WeightCache::open(file_options(argv[2], Durability::full));
  if (!opened) return child_failed(kChildCacheError, "open failed: " + opened.error().message);
  WeightCache& cache = opened.value();

  if (mode == "verify-manifest") {
    if (argc != 4) return usage();
    Manifest m;
    if (!read_manifest(argv[3], &m)) return child_failed(kChildUsage, "cannot read the manifest");
    for (std::size_t i = 0; i < m.size(); ++i) {
      auto err = verify_entry(cache, m[i].first, m[i].second, "manifest entry " + std::to_string(i));
      if (!err.empty()) return child_failed(kChildMismatch, err);
    }
    return kChildOk;
  }

  if (argc != 6) return usage();
  EntrySetSpec spec;
  spec.seed = std::strtoull(argv[3], nullptr, 10);
  spec.count = std::strtoull(argv[4], nullptr, 10);
  spec.max_size = std::strtoull(argv[5], nullptr, 10);
  if (mode == "write") {
    if (auto err = write_entry_set(cache, spec); !err.empty()) return child_failed(kChildCacheError, err);
    if (auto r = cache.finalize(); !r) return child_failed(kChildCacheError, "finalize failed: " + r.error().message);
    return kChildOk;
  }
  if (mode == "verify") {
    if (auto err = verify_entry_set(cache, spec); !err.empty()) return child_failed(kChildMismatch, err);
    return kChildOk;
  }
  return usage();
}
