// Our chunked mappings against the strategy of ExecuTorch's XNNWeightsCache in file mode: one
// ftruncate plus one mmap(MAP_SHARED) per reserve, regions page-aligned in the file. The
// baseline is a few lines here, written from that description, not ExecuTorch's code.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "bench_util.hpp"

namespace weightcache::bench {
namespace {

constexpr std::size_t kWeights = 10000;

// 16 B .. 256 KiB, log-uniform: the same mix as reserve/10k_mixed (about 256 MiB).
const std::vector<std::size_t>& weight_sizes() {
  static const auto sizes = mixed_sizes_n(kWeights, 16, std::size_t{256} << 10, 7);
  return sizes;
}

class PerReserveMmap {
 public:
  explicit PerReserveMmap(const std::string& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)),
        page_(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))) {}
  ~PerReserveMmap() { close(); }
  PerReserveMmap(const PerReserveMmap&) = delete;
  PerReserveMmap& operator=(const PerReserveMmap&) = delete;

  bool ok() const { return fd_ >= 0; }
  std::uint64_t file_bytes() const { return size_; }

  void* reserve(std::size_t n) {
    const std::uint64_t off = (size_ + page_ - 1) / page_ * page_;
    if (::ftruncate(fd_, static_cast<off_t>(off + n)) != 0) return nullptr;
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(off));
    if (p == MAP_FAILED) return nullptr;
    size_ = off + n;
    maps_.emplace_back(p, n);
    return p;
  }

  void close() {
    for (auto [p, n] : maps_) ::munmap(p, n);
    maps_.clear();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  std::size_t page_;
  std::uint64_t size_ = 0;
  std::vector<std::pair<void*, std::size_t>> maps_;
};

// fill: also write every byte of every weight (the packing's stores); insert: commit each with
// look_up_or_insert (ours only; it checksums the bytes, which the baseline does not do).
void BM_strategy_executorch(benchmark::State& state, bool fill) {
  const auto& sizes = weight_sizes();
  const std::string name = fill ? "strategy/executorch/fill" : "strategy/executorch/reserve";
  for (auto _ : state) {
    const std::string path = scratch_path("perreserve");
    double close_s = 0;
    {
      PerReserveMmap cache(path);
      if (!cache.ok()) {
        state.SkipWithError("cannot create the baseline's file");
        break;
      }
      const Stopwatch sw;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        void* p = cache.reserve(sizes[i]);
        if (p == nullptr) {
          state.SkipWithError("ftruncate or mmap failed");
          break;
        }
        if (fill) fill_pattern(p, sizes[i], i);
      }
      benchmark::ClobberMemory();
      const Lap lap = sw.lap();
      state.SetIterationTime(lap.wall);
      record_time(name, lap);
      record_sample("strategy/executorch/vmas", double(file_vmas(path)));
      record_sample("strategy/executorch/file_bytes", double(cache.file_bytes()));
      const auto t1 = Clock::now();
      cache.close();
      close_s = seconds_since(t1);
    }
    record_sample(name + "/close_s", close_s);
    remove_cache_file(path);
  }
  state.counters["vmas"] = median_sample("strategy/executorch/vmas");
  state.counters["close_ms"] = median_sample(name + "/close_s") * 1e3;
}

void BM_strategy_ours(benchmark::State& state, bool fill, bool insert) {
  const auto& sizes = weight_sizes();
  const std::string name = std::string("strategy/ours/") + (insert ? "fill_insert" : fill ? "fill" : "reserve");
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < sizes.size(); ++i) keys.push_back("w." + std::to_string(i));
  for (auto _ : state) {
    const std::string path = scratch_path("chunked");
    double close_s = 0;
    {
      auto cache = WeightCache::open(bench_options(path, "bench-strategy"));
      if (!cache) {
        state.SkipWithError(cache.error().message.c_str());
        break;
      }
      const Stopwatch sw;
      if (!reserve_fill_insert(*cache, sizes, keys, fill, insert)) state.SkipWithError(last_error().message.c_str());
      benchmark::ClobberMemory();
      const Lap lap = sw.lap();
      state.SetIterationTime(lap.wall);
      record_time(name, lap);
      const Stats st = cache->stats();
      if (st.backing != Backing::file || st.heap_fallbacks != 0) state.SkipWithError("cache fell back to heap");
      record_sample("strategy/ours/vmas", double(file_vmas(path)));
      record_sample("strategy/ours/mappings", double(st.mappings));
      record_sample("strategy/ours/file_bytes", double(st.file_bytes));
      const auto t1 = Clock::now();
      cache.value() = WeightCache();
      close_s = seconds_since(t1);
    }
    record_sample(name + "/close_s", close_s);
    remove_cache_file(path);
  }
  state.counters["vmas"] = median_sample("strategy/ours/vmas");
  state.counters["close_ms"] = median_sample(name + "/close_s") * 1e3;
}

}  // namespace

BENCHMARK_CAPTURE(BM_strategy_executorch, reserve, false)
    ->Name("strategy/executorch_mmap_per_reserve/reserve_10k")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_strategy_ours, reserve, false, false)
    ->Name("strategy/ours_chunked/reserve_10k")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_strategy_executorch, fill, true)
    ->Name("strategy/executorch_mmap_per_reserve/reserve_fill_10k")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_strategy_ours, fill, true, false)
    ->Name("strategy/ours_chunked/reserve_fill_10k")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_strategy_ours, fill_insert, true, true)
    ->Name("strategy/ours_chunked/reserve_fill_insert_10k")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace weightcache::bench
