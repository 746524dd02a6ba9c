// Sharing (issue 4): look-up latency under concurrent reader threads, the time for the k-th
// process to open a warm cache that k-1 others hold open, and the memory of N processes reading
// one cache against N processes each packing its own heap copy.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <numeric>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench_util.hpp"
#include "demo_model.hpp"

namespace weightcache::bench {
namespace {

// ---- look-up latency under N reader threads ----------------------------------------------------

constexpr std::size_t kOpsPerThread = std::size_t{1} << 20;

// Every thread walks its own random permutation of the keys.
const std::vector<std::vector<std::uint32_t>>& key_orders() {
  static const auto orders = [] {
    std::vector<std::vector<std::uint32_t>> o(8, std::vector<std::uint32_t>(kWarmEntries));
    std::uint64_t s = 99;
    for (auto& v : o) {
      std::iota(v.begin(), v.end(), 0u);
      for (std::size_t i = v.size() - 1; i > 0; --i) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        std::swap(v[i], v[(s >> 33) % (i + 1)]);
      }
    }
    return o;
  }();
  return orders;
}

enum class Subject { cache, map, map_shared_mutex };

// Runs `threads` readers at once, each doing kOpsPerThread look-ups of hits; records the mean
// per-thread CPU and wall ns per look-up and the aggregate rate.
template <class LookUp>
bool run_readers(int threads, const std::string& name, LookUp&& look_up) {
  const auto& keys = warm_file().keys;
  std::vector<double> cpu(threads), wall(threads);
  std::vector<std::uint64_t> misses(threads);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const auto& order = key_orders()[t % 8];
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const double c0 = thread_cpu_seconds();
      const auto w0 = Clock::now();
      std::uint64_t miss = 0;
      for (std::size_t i = 0; i < kOpsPerThread; ++i) {
        const std::string& k = keys[order[i % order.size()]];
        miss += look_up(std::string_view(k)) == kNotFound;
      }
      wall[t] = seconds_since(w0);
      cpu[t] = thread_cpu_seconds() - c0;
      misses[t] = miss;
    });
  }
  while (ready.load() != threads) std::this_thread::yield();
  const auto w0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  const double total_wall = seconds_since(w0);
  const double ops = double(kOpsPerThread);
  record_sample(name + "/cpu_ns", std::accumulate(cpu.begin(), cpu.end(), 0.0) / threads / ops * 1e9);
  record_sample(name + "/wall_ns", std::accumulate(wall.begin(), wall.end(), 0.0) / threads / ops * 1e9);
  record_sample(name + "/mops", ops * threads / total_wall / 1e6);
  return std::accumulate(misses.begin(), misses.end(), std::uint64_t{0}) == 0;
}

void BM_lookup_threads(benchmark::State& state, Subject subject) {
  const WarmFile* warm = warm_file_or_skip(state);
  if (warm == nullptr) return;
  const WarmFile& f = *warm;
  const int threads = static_cast<int>(state.range(0));
  const char* tag = subject == Subject::cache ? "cache" : subject == Subject::map ? "map" : "map_shared_mutex";
  const std::string name = "threads/" + std::string(tag) + "/" + std::to_string(threads);
  Options o = bench_options(f.path, f.compat);
  o.verify = Verify::first_use;
  auto cache = WeightCache::open(o);
  if (!cache) {
    state.SkipWithError(cache.error().message.c_str());
    return;
  }
  // Baselines: the same keys in a plain hash map (the floor of any look-up), and the same map
  // behind a reader lock (what a thread-safe map costs before anything else).
  std::unordered_map<std::string_view, std::size_t> map;
  for (const auto& k : f.keys) map.emplace(k, cache->look_up(k));  // also verifies every entry
  std::shared_mutex mu;
  for (auto _ : state) {
    bool ok = false;
    const Stopwatch sw;
    switch (subject) {
      case Subject::cache:
        ok = run_readers(threads, name, [&](std::string_view k) { return cache->look_up(k); });
        break;
      case Subject::map:
        ok = run_readers(threads, name, [&](std::string_view k) {
          auto it = map.find(k);
          return it == map.end() ? kNotFound : it->second;
        });
        break;
      case Subject::map_shared_mutex:
        ok = run_readers(threads, name, [&](std::string_view k) {
          std::shared_lock<std::shared_mutex> lock(mu);
          auto it = map.find(k);
          return it == map.end() ? kNotFound : it->second;
        });
        break;
    }
    state.SetIterationTime(sw.lap().wall);
    if (!ok) state.SkipWithError("a look-up missed");
  }
  state.counters["ns_per_lookup_cpu"] = median_sample(name + "/cpu_ns");
  state.counters["Mlookups_per_s"] = median_sample(name + "/mops");
}

// ---- the k-th process opening a warm shared cache ----------------------------------------------

constexpr int kProcesses = 8;

bool parse_ok(const std::string& line, double* wall, double* cpu, double* count) {
  unsigned long long n = 0, sum = 0;
  if (std::sscanf(line.c_str(), "ok %lf %lf %llu %llu", wall, cpu, &n, &sum) != 4) return false;
  *count = double(n);
  return true;
}

// Processes 1..8 start one after another; each opens the warm 10,000-entry cache and looks up
// every key while the earlier ones still hold it open.
void BM_kth_process(benchmark::State& state, const std::string& verify) {
  const WarmFile* warm = warm_file_or_skip(state);
  if (warm == nullptr) return;
  const WarmFile& f = *warm;
  for (auto _ : state) {
    const Stopwatch sw;
    std::vector<Child> kids;
    bool ok = true;
    for (int k = 1; k <= kProcesses && ok; ++k) {
      const auto t0 = Clock::now();
      kids.push_back(spawn_child({"lookup", f.path, f.compat, verify, f.keys_path}));
      const std::string line = kids.back().pid < 0 ? "" : read_child_line(kids.back());
      const double ready = seconds_since(t0);
      double wall = 0, cpu = 0, hits = 0;
      if (!parse_ok(line, &wall, &cpu, &hits) || hits != double(kWarmEntries)) {
        state.SkipWithError(("child: " + line).c_str());
        ok = false;
        break;
      }
      const std::string name = "kth/" + verify + "/" + std::to_string(k);
      record_time(name, Lap{wall, cpu});
      record_sample(name + "/spawn_to_ready", ready);
    }
    for (auto& c : kids) ok = finish_child(c) && ok;
    state.SetIterationTime(sw.lap().wall);
    if (!ok) break;
  }
  for (int k : {1, kProcesses}) {
    const std::string name = "kth/" + verify + "/" + std::to_string(k);
    if (has_time(name)) state.counters["open_lookup_ms_k" + std::to_string(k)] = median_time(name) * 1e3;
  }
}

// ---- memory of N processes --------------------------------------------------------------------

// The demo's model shrunk to about 128 MiB: 11 layers of dim 512 (12 MiB per layer).
demo::ModelConfig mem_model_config() {
  demo::ModelConfig c;
  c.layers = 11;
  c.dim = 512;
  return c;
}

struct MemModel {
  std::string path;
  std::uint64_t payload = 0;
  std::uint64_t file_bytes = 0;
  std::string error;
};

const MemModel& mem_model() {
  static const MemModel m = [] {
    MemModel m;
    const auto cfg = mem_model_config();
    m.path = scratch_path("mem128");
    auto cache = WeightCache::open(bench_options(m.path, demo::compat_key(cfg)));
    if (!cache) {
      m.error = cache.error().message;
      return m;
    }
    for (const auto& s : demo::model_matrices(cfg)) {
      std::vector<float> src(s.rows * s.cols);
      demo::generate(cfg, s, src.data());
      void* p = cache->reserve(demo::packed_bytes(s));
      if (p == nullptr) {
        m.error = last_error().message;
        return m;
      }
      demo::pack_panels(src.data(), s.rows, s.cols, static_cast<float*>(p));
      if (cache->look_up_or_insert(s.name, p, demo::packed_bytes(s)) == kNotFound) {
        m.error = last_error().message;
        return m;
      }
      m.payload += demo::packed_bytes(s);
    }
    if (auto r = cache->finalize(); !r) m.error = r.error().message;
    m.file_bytes = cache->stats().file_bytes;
    // Written back, as the kernel would within half a minute: a dirty page that one process maps
    // shows as its Private_Dirty although the page is shared page cache.
    if (m.error.empty() && !sync_file(m.path)) m.error = "fdatasync of the cache file failed";
    return m;
  }();
  return m;
}

// N processes start together; once all have their weights ready, their smaps are summed.
// mode: "cache" (map the shared cache, read every byte), "heap" (pack onto the heap), "idle".
void BM_memory_processes(benchmark::State& state, const std::string& mode) {
  const MemModel& m = mem_model();
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  const int n = static_cast<int>(state.range(0));
  const auto cfg = mem_model_config();
  const std::string layers = std::to_string(cfg.layers), dim = std::to_string(cfg.dim);
  const std::string name = "mem/" + mode + "/" + std::to_string(n);
  for (auto _ : state) {
    const Stopwatch sw;
    std::vector<Child> kids;
    for (int i = 0; i < n; ++i) {
      if (mode == "cache") kids.push_back(spawn_child({"model-cache", m.path, layers, dim}));
      else if (mode == "heap") kids.push_back(spawn_child({"model-heap", layers, dim}));
      else kids.push_back(spawn_child({"idle"}));
    }
    bool ok = true;
    double ready_wall = 0, ready_cpu = 0;
    for (auto& c : kids) {
      const std::string line = c.pid < 0 ? "" : read_child_line(c);
      double wall = 0, cpu = 0, count = 0;
      if (!parse_ok(line, &wall, &cpu, &count)) {
        state.SkipWithError(("child: " + line).c_str());
        ok = false;
        break;
      }
      ready_wall = std::max(ready_wall, wall);
      ready_cpu += cpu;
    }
    MemFigures all, file;
    for (auto& c : kids) {
      if (!ok) break;
      const MemFigures p = process_memory(c.pid);
      const MemFigures q = file_memory(c.pid, m.path);
      all.rss += p.rss;
      all.pss += p.pss;
      all.private_dirty += p.private_dirty;
      file.rss += q.rss;
      file.pss += q.pss;
      file.private_dirty += q.private_dirty;
      ok = ok && p.readable;
    }
    for (auto& c : kids) ok = finish_child(c) && ok;
    state.SetIterationTime(sw.lap().wall);
    if (!ok) {
      if (!state.error_occurred()) state.SkipWithError("a child failed or /proc/<pid>/smaps_rollup is unreadable");
      break;
    }
    record_sample(name + "/pss", double(all.pss));
    record_sample(name + "/private_dirty", double(all.private_dirty));
    record_sample(name + "/rss", double(all.rss));
    record_sample(name + "/file_pss", double(file.pss));
    record_sample(name + "/file_private_dirty", double(file.private_dirty));
    record_sample(name + "/slowest_ready", ready_wall);
    record_sample(name + "/cpu_sum", ready_cpu);
  }
  record_value("mem/payload", double(m.payload));
  record_value("mem/file_bytes", double(m.file_bytes));
  state.counters["Pss_MiB"] = median_sample(name + "/pss") / (1 << 20);
  state.counters["Private_Dirty_MiB"] = median_sample(name + "/private_dirty") / (1 << 20);
}

}  // namespace

BENCHMARK_CAPTURE(BM_lookup_threads, cache, Subject::cache)
    ->Name("threads/look_up_hit")
    ->Arg(1)->Arg(2)->Arg(8)
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_lookup_threads, map, Subject::map)
    ->Name("threads/unordered_map_find")
    ->Arg(1)->Arg(2)->Arg(8)
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_lookup_threads, map_shared_mutex, Subject::map_shared_mutex)
    ->Name("threads/unordered_map_find_shared_mutex")
    ->Arg(1)->Arg(2)->Arg(8)
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_kth_process, none, std::string("none"))
    ->Name("procs/kth_open_lookup_10k_verify_none")
    ->UseManualTime()
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_kth_process, first_use, std::string("first_use"))
    ->Name("procs/kth_open_lookup_10k_first_use")
    ->UseManualTime()
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_processes, idle, std::string("idle"))
    ->Name("procs/memory_idle")
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(1)
    ->Repetitions(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_processes, cache, std::string("cache"))
    ->Name("procs/memory_shared_cache_128MiB")
    ->Arg(1)->Arg(2)->Arg(4)->Arg(8)
    ->UseManualTime()
    ->Iterations(1)
    ->Repetitions(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_memory_processes, heap, std::string("heap"))
    ->Name("procs/memory_heap_repack_128MiB")
    ->Arg(1)->Arg(2)->Arg(4)->Arg(8)
    ->UseManualTime()
    ->Iterations(1)
    ->Repetitions(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace weightcache::bench
