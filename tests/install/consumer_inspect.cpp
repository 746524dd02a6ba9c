// A consumer of the installed inspection library (weightcache/inspect.hpp): writes a cache with
// one entry through the C++ API, then inspects it and checks its entry's checksum. Prints
// "entries=1 findings=0 checksummed=5" for a sound file.
#include <weightcache/inspect.hpp>
#include <weightcache/weight_cache.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  {
    weightcache::Options o;
    o.path = argv[1];
    o.backing = weightcache::Backing::file;
    auto c = weightcache::WeightCache::open(o);
    if (!c || c->insert("key", "bytes") == weightcache::kNotFound || !c->finalize()) return 1;
  }
  auto f = weightcache::inspect::File::open(argv[1]);
  if (!f) return 1;
  auto in = weightcache::inspect::inspect(f.value());
  if (!in) return 1;
  auto hashed = weightcache::inspect::check_checksums(f.value(), &in.value());
  if (!hashed) return 1;
  std::printf("entries=%zu findings=%zu checksummed=%llu\n", in->entries.size(), in->findings.size(),
              static_cast<unsigned long long>(hashed.value()));
  return 0;
}
