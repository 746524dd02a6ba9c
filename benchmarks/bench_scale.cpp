// Cost per entry as the cache grows from 1e2 to 1e6 entries: reserve + fill + look_up_or_insert,
// finalize, warm open, and the latency of a look-up of a (verified) hit. Each should stay flat.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bench_util.hpp"

namespace weightcache::bench {
namespace {

constexpr std::size_t kMaxEntries = 1000000;
constexpr std::size_t kEntryBytes = 64;  // a bias vector: the per-entry overhead dominates
constexpr std::size_t kLookUps = std::size_t{1} << 20;

const std::vector<std::string>& scale_keys() {
  static const auto keys = [] {
    std::vector<std::string> k(kMaxEntries);
    char buf[32];
    for (std::size_t i = 0; i < kMaxEntries; ++i) {
      std::snprintf(buf, sizeof buf, "l.%07zu.b", i);  // 11 bytes: no heap block per key
      k[i] = buf;
    }
    return k;
  }();
  return keys;
}

// A transparent hasher over std::hash, like the library's StringHash. libstdc++ caches hash codes
// in the nodes only for hashers it does not consider "fast" (std::hash<string_view> is not fast;
// any user-defined hasher is), so with this one every step along a bucket chain re-hashes the
// next node's key, which means loading its bytes.
struct UncachedHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// kLookUps indices in [0, n), uniformly random.
std::vector<std::uint32_t> random_indices(std::size_t n) {
  std::vector<std::uint32_t> v(kLookUps);
  std::uint64_t s = 0x1234567 + n;
  for (auto& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<std::uint32_t>((s >> 33) % n);
  }
  return v;
}

void BM_scale(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  const auto& keys = scale_keys();
  const auto order = random_indices(n);
  const std::string tag = "scale/" + std::to_string(n);
  std::uint64_t sink = 0;
  for (auto _ : state) {
    const std::string path = scratch_path("scale");
    bool ok = true;
    {
      auto cache = WeightCache::open(bench_options(path, "bench-scale"));
      if (!cache) {
        state.SkipWithError(cache.error().message.c_str());
        break;
      }
      const Stopwatch sw;
      for (std::size_t i = 0; i < n && ok; ++i) {
        void* p = cache->reserve(kEntryBytes);
        ok = p != nullptr;
        if (ok) {
          fill_pattern(p, kEntryBytes, i);
          ok = cache->look_up_or_insert(keys[i], p, kEntryBytes) != kNotFound;
        }
      }
      const Lap ins = sw.lap();
      record_time(tag + "/insert", ins);
      const Stopwatch fs;
      ok = ok && cache->finalize().ok();
      record_time(tag + "/finalize", fs.lap());
      state.SetIterationTime(ins.wall);
    }
    if (!ok) {
      state.SkipWithError(last_error().message.c_str());
      remove_cache_file(path);
      break;
    }
    {
      Options o = bench_options(path, "bench-scale");
      o.verify = Verify::first_use;
      const Stopwatch os;
      auto cache = WeightCache::open(o);
      if (!cache) {
        state.SkipWithError(cache.error().message.c_str());
        remove_cache_file(path);
        break;
      }
      record_time(tag + "/open", os.lap());
      // First look-up of every key: verifies each entry (its checksum) once.
      const Stopwatch vs;
      for (std::size_t i = 0; i < n; ++i) ok = cache->look_up(keys[i]) != kNotFound && ok;
      record_time(tag + "/first_lookup", vs.lap());
      const Stopwatch ls;
      for (std::uint32_t i : order) sink += cache->look_up(keys[i]);
      record_time(tag + "/lookup", ls.lap());
      if (cache->stats().entries != n) ok = false;
    }
    // Baseline: the same keys and order in a plain hash map.
    {
      std::unordered_map<std::string_view, std::size_t> map;
      map.reserve(n);
      for (std::size_t i = 0; i < n; ++i) map.emplace(keys[i], i);
      const Stopwatch ms;
      for (std::uint32_t i : order) sink += map.find(keys[i])->second;
      record_time(tag + "/map_find", ms.lap());
    }
    {
      std::unordered_map<std::string_view, std::size_t, UncachedHash> map;
      map.reserve(n);
      for (std::size_t i = 0; i < n; ++i) map.emplace(keys[i], i);
      const Stopwatch ms;
      for (std::uint32_t i : order) sink += map.find(keys[i])->second;
      record_time(tag + "/map_find_uncached", ms.lap());
    }
    remove_cache_file(path);
    if (!ok) {
      state.SkipWithError("entries missing after reopening");
      break;
    }
  }
  benchmark::DoNotOptimize(sink);
  state.counters["insert_ns"] = median_time(tag + "/insert", true) * 1e9 / double(n);
  state.counters["lookup_ns"] = median_time(tag + "/lookup", true) * 1e9 / double(kLookUps);
  state.counters["open_ms"] = median_time(tag + "/open", true) * 1e3;
  state.counters["map_find_ns"] = median_time(tag + "/map_find", true) * 1e9 / double(kLookUps);
  state.counters["map_uncached_ns"] = median_time(tag + "/map_find_uncached", true) * 1e9 / double(kLookUps);
  state.counters["first_lookup_ns"] = median_time(tag + "/first_lookup", true) * 1e9 / double(n);
  state.counters["finalize_ms"] = median_time(tag + "/finalize", true) * 1e3;
}

}  // namespace

BENCHMARK(BM_scale)
    ->Name("scale/entries")
    ->Arg(100)->Arg(1000)->Arg(10000)->Arg(100000)->Arg(1000000)
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace weightcache::bench
