// The demo's model (576 MiB of f32 by default): packing it, as a backend does on every launch
// without a cache, against loading it warm from a cache file.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "demo_model.hpp"

namespace weightcache::bench {
namespace {

struct Model {
  demo::ModelConfig cfg;
  std::vector<demo::MatrixSpec> mats;
  std::vector<std::vector<float>> sources;  // the "model file", generated once
  std::uint64_t payload = 0;
  std::string warm_path;  // the model packed into a finalized cache file
  std::string error;
};

const Model& model() {
  static const Model m = [] {
    Model m;
    m.mats = demo::model_matrices(m.cfg);
    for (const auto& s : m.mats) {
      m.sources.emplace_back(s.rows * s.cols);
      demo::generate(m.cfg, s, m.sources.back().data());
      m.payload += demo::packed_bytes(s);
    }
    m.warm_path = scratch_path("model");
    auto cache = WeightCache::open(bench_options(m.warm_path, demo::compat_key(m.cfg)));
    if (!cache) {
      m.error = cache.error().message;
      return m;
    }
    for (std::size_t i = 0; i < m.mats.size(); ++i) {
      const auto& s = m.mats[i];
      void* p = cache->reserve(demo::packed_bytes(s));
      if (p == nullptr) {
        m.error = last_error().message;
        return m;
      }
      demo::pack_panels(m.sources[i].data(), s.rows, s.cols, static_cast<float*>(p));
      if (cache->look_up_or_insert(s.name, p, demo::packed_bytes(s)) == kNotFound) {
        m.error = last_error().message;
        return m;
      }
    }
    if (auto r = cache->finalize(); !r) m.error = r.error().message;
    return m;
  }();
  return m;
}

// Baseline: pack every matrix into its own fresh heap buffer, all kept alive (as a backend does).
void BM_model_pack_heap(benchmark::State& state) {
  const Model& m = model();
  std::vector<std::unique_ptr<float[]>> packed;
  for (auto _ : state) {
    const Stopwatch sw;
    for (std::size_t i = 0; i < m.mats.size(); ++i) {
      const auto& s = m.mats[i];
      packed.emplace_back(new float[demo::packed_bytes(s) / sizeof(float)]);
      demo::pack_panels(m.sources[i].data(), s.rows, s.cols, packed.back().get());
    }
    benchmark::ClobberMemory();
    const Lap lap = sw.lap();
    const double t = lap.wall;
    state.SetIterationTime(t);
    record_time("model/pack_heap", lap);
    packed.clear();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * m.payload));
  record_value("model/payload", double(m.payload));
}

// The cold run with a cache: reserve, pack into the file mapping, insert (checksums the bytes).
void BM_model_pack_cache(benchmark::State& state) {
  const Model& m = model();
  double finalize_s = 0;
  for (auto _ : state) {
    const std::string path = scratch_path("model-cold");
    {
      auto cache = WeightCache::open(bench_options(path, demo::compat_key(m.cfg)));
      if (!cache) {
        state.SkipWithError(cache.error().message.c_str());
        break;
      }
      const Stopwatch sw;
      for (std::size_t i = 0; i < m.mats.size(); ++i) {
        const auto& s = m.mats[i];
        void* p = cache->reserve(demo::packed_bytes(s));
        if (p == nullptr) {
          state.SkipWithError(last_error().message.c_str());
          break;
        }
        demo::pack_panels(m.sources[i].data(), s.rows, s.cols, static_cast<float*>(p));
        (void)cache->look_up_or_insert(s.name, p, demo::packed_bytes(s));
      }
      const Lap lap = sw.lap();
      const double t = lap.wall;
      state.SetIterationTime(t);
      record_time("model/pack_cache", lap);
      const auto t1 = Clock::now();
      (void)cache->finalize();  // durability none here: the index and footer only
      finalize_s += seconds_since(t1);
    }
    remove_cache_file(path);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * m.payload));
  state.counters["finalize_ms"] = state.iterations() ? finalize_s * 1e3 / double(state.iterations()) : 0;
}

// The warm run: open, look up every matrix (with Verify::first_use each checksum is verified,
// which reads every byte and maps every page), optionally read everything once more.
void model_load(benchmark::State& state, Verify verify, bool read, const std::string& name) {
  const Model& m = model();
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  Options o = bench_options(m.warm_path, demo::compat_key(m.cfg));
  o.verify = verify;
  std::uint64_t sink = 0;
  for (auto _ : state) {
    const Stopwatch sw;
    auto cache = WeightCache::open(o);
    if (!cache) {
      state.SkipWithError(cache.error().message.c_str());
      break;
    }
    for (const auto& s : m.mats) {
      const void* p = cache->offset_to_addr(cache->look_up(s.name));
      if (p == nullptr) {
        state.SkipWithError("a packed matrix was missing from the warm cache");
        break;
      }
      if (read) sink += demo::word_sum(p, demo::packed_bytes(s));
    }
    const Lap lap = sw.lap();
    const double t = lap.wall;
    state.SetIterationTime(t);
    record_time(name, lap);
    cache.value() = WeightCache();
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * m.payload));
}

void BM_model_load_warm(benchmark::State& state) { model_load(state, Verify::first_use, false, "model/load_warm"); }
void BM_model_load_warm_read(benchmark::State& state) {
  model_load(state, Verify::first_use, true, "model/load_warm_read");
}
// Lazy: no byte is read or mapped in yet (first use during inference pays the page faults).
void BM_model_load_warm_lazy(benchmark::State& state) {
  model_load(state, Verify::none, false, "model/load_warm_lazy");
}

}  // namespace

BENCHMARK(BM_model_pack_heap)
    ->Name("model/pack_heap_576MiB")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_model_pack_cache)
    ->Name("model/pack_cache_576MiB")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_model_load_warm)
    ->Name("model/load_warm_576MiB")
    ->UseManualTime()
    ->Iterations(8)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_model_load_warm_lazy)
    ->Name("model/load_warm_lazy_verify_none_576MiB")
    ->UseManualTime()
    ->Iterations(8)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_model_load_warm_read)
    ->Name("model/load_warm_read_576MiB")
    ->UseManualTime()
    ->Iterations(8)
    ->Unit(benchmark::kMillisecond);

}  // namespace weightcache::bench
