// The same through the installed C++ API.
#include <weightcache/weight_cache.hpp>

#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  weightcache::Options o;
  o.path = argv[1];
  o.compat_key = "install-test-cxx";
  auto cache = weightcache::WeightCache::open(o);
  if (!cache) {
    std::fprintf(stderr, "open: %s\n", cache.error().message.c_str());
    return 1;
  }
  const std::string want(4096, 'q');
  std::size_t off = cache->look_up("bias");
  const bool hit = off != weightcache::kNotFound;
  if (!hit) {
    void* p = cache->reserve(want.size());
    if (p == nullptr) return 1;
    std::memcpy(p, want.data(), want.size());
    off = cache->look_up_or_insert("bias", p, want.size());
    if (off == weightcache::kNotFound || !cache->finalize()) return 1;
  }
  const void* p = cache->offset_to_addr(off);
  const bool same = p != nullptr && std::memcmp(p, want.data(), want.size()) == 0;
  std::printf("%s %s\n", hit ? "hit" : "miss", same ? "same-bytes" : "WRONG-BYTES");
  return same ? 0 : 1;
}
