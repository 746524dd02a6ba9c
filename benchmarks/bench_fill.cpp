// Writing side: filling reservations in the file mapping against filling fresh heap memory, and
// how many mappings many reservations cost.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace weightcache::bench {
namespace {

constexpr std::uint64_t kFillTotal = std::uint64_t{256} << 20;

// 1-4 MiB regions, the size of a typical packed matrix of a small model.
const std::vector<std::size_t>& fill_sizes() {
  static const auto sizes = mixed_sizes(kFillTotal, std::size_t{1} << 20, std::size_t{4} << 20, 42, false);
  return sizes;
}

const std::vector<std::string>& fill_keys() {
  static const auto keys = [] {
    std::vector<std::string> k;
    for (std::size_t i = 0; i < fill_sizes().size(); ++i) k.push_back("fill." + std::to_string(i));
    return k;
  }();
  return keys;
}

// Baseline: what a packer without a cache does (main() makes every large malloc a fresh mmap, so
// each page is faulted in and zeroed by the kernel, as on a first pack).
void BM_fill_malloc(benchmark::State& state) {
  const auto& sizes = fill_sizes();
  std::vector<void*> ptrs;
  ptrs.reserve(sizes.size());
  for (auto _ : state) {
    const Stopwatch sw;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      void* p = std::malloc(sizes[i]);
      if (p == nullptr) {
        state.SkipWithError("malloc failed");
        break;
      }
      fill_pattern(p, sizes[i], i);
      ptrs.push_back(p);
    }
    benchmark::ClobberMemory();
    const Lap lap = sw.lap();
    const double t = lap.wall;
    state.SetIterationTime(t);
    record_time("fill/malloc", lap);
    for (void* p : ptrs) std::free(p);
    ptrs.clear();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kFillTotal));
  state.counters["regions"] = double(sizes.size());
}

// reserve + fill in a fresh cache file (optionally + look_up_or_insert, which checksums the bytes).
void fill_cache(benchmark::State& state, bool insert) {
  const std::string name = insert ? "fill/cache_reserve_insert" : "fill/cache_reserve";
  const auto& sizes = fill_sizes();
  const auto& keys = fill_keys();
  std::uint64_t mappings = 0;
  for (auto _ : state) {
    const std::string path = scratch_path("fill");
    {
      auto cache = WeightCache::open(bench_options(path, "bench-fill"));
      if (!cache) {
        state.SkipWithError(cache.error().message.c_str());
        break;
      }
      const Stopwatch sw;
      if (!reserve_fill_insert(*cache, sizes, keys, true, insert)) state.SkipWithError(last_error().message.c_str());
      benchmark::ClobberMemory();
      const Lap lap = sw.lap();
      const double t = lap.wall;
      state.SetIterationTime(t);
      record_time(name, lap);
      const Stats s = cache->stats();
      mappings = s.mappings;
      if (s.backing != Backing::file || s.heap_fallbacks != 0) state.SkipWithError("cache fell back to heap");
    }
    remove_cache_file(path);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kFillTotal));
  state.counters["mappings"] = double(mappings);
}

void BM_fill_cache_reserve(benchmark::State& state) { fill_cache(state, false); }
void BM_fill_cache_reserve_insert(benchmark::State& state) { fill_cache(state, true); }

// 10,000 reservations of 16 B .. 256 KiB (log-uniform), never touched: what the address-space
// and mapping bookkeeping costs, and how many mappings it leaves.
void BM_reserve_10k_mixed(benchmark::State& state) {
  static const auto sizes = mixed_sizes_n(10000, 16, std::size_t{256} << 10, 7);
  for (auto _ : state) {
    const std::string path = scratch_path("reserve");
    {
      auto cache = WeightCache::open(bench_options(path, "bench-reserve"));
      if (!cache) {
        state.SkipWithError(cache.error().message.c_str());
        break;
      }
      const Stopwatch sw;
      for (std::size_t s : sizes) {
        if (cache->reserve(s) == nullptr) {
          state.SkipWithError(last_error().message.c_str());
          break;
        }
      }
      const Lap lap = sw.lap();
      const double t = lap.wall;
      state.SetIterationTime(t);
      record_time("reserve10k", lap);
      const Stats st = cache->stats();
      const std::size_t vmas = file_vmas(path);
      record_value("reserve10k/mappings", double(st.mappings));
      record_value("reserve10k/vmas", double(vmas));
      record_value("reserve10k/file_bytes", double(st.file_bytes));
      state.counters["mappings"] = double(st.mappings);
      state.counters["vmas"] = double(vmas);
      state.counters["file_MiB"] = double(st.file_bytes) / (1 << 20);
      state.counters["ns_per_reserve"] = t * 1e9 / double(sizes.size());
    }
    remove_cache_file(path);
  }
}

}  // namespace

BENCHMARK(BM_fill_malloc)->Name("fill/malloc_256MiB")->UseManualTime()->Iterations(6)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fill_cache_reserve)
    ->Name("fill/cache_reserve_256MiB")
    ->UseManualTime()
    ->Iterations(6)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fill_cache_reserve_insert)
    ->Name("fill/cache_reserve_insert_256MiB")
    ->UseManualTime()
    ->Iterations(4)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_reserve_10k_mixed)
    ->Name("reserve/10k_mixed")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace weightcache::bench
