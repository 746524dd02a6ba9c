// Reading side: a warm cache file of 10,000 entries (about 256 MiB, already in the page cache),
// opened by a fresh cache object each iteration as a new process would.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "demo_model.hpp"

namespace weightcache::bench {
namespace {

constexpr std::size_t kEntries = kWarmEntries;

Options warm_options(Verify verify, bool ahead) {
  Options o = bench_options(warm_file().path, warm_file().compat);
  o.verify = verify;
  o.verify_ahead = ahead;
  return o;
}

// open + look_up of every key; with `read`, also every byte of every entry.
void warm_open(benchmark::State& state, Verify verify, bool read, const std::string& name, bool ahead = true) {
  const WarmFile* warm = warm_file_or_skip(state);
  if (warm == nullptr) return;
  const WarmFile& f = *warm;
  std::uint64_t sink = 0;
  double close_s = 0;
  for (auto _ : state) {
    const Stopwatch sw;
    auto cache = WeightCache::open(warm_options(verify, ahead));
    if (!cache) {
      state.SkipWithError(cache.error().message.c_str());
      break;
    }
    for (std::size_t i = 0; i < kEntries; ++i) {
      const std::size_t off = cache->look_up(f.keys[i]);
      if (off == kNotFound) {
        state.SkipWithError("a warm entry was missing");
        break;
      }
      if (read) sink += demo::word_sum(cache->offset_to_addr(off), f.sizes[i]);
    }
    const Lap lap = sw.lap();
    const double t = lap.wall;
    state.SetIterationTime(t);
    record_time(name, lap);
    const auto t1 = Clock::now();
    cache.value() = WeightCache();  // close: unmaps everything, so the next open starts cold
    close_s += seconds_since(t1);
  }
  benchmark::DoNotOptimize(sink);
  if (read) state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * f.payload));
  state.counters["entries"] = double(kEntries);
  state.counters["close_ms"] = state.iterations() ? close_s * 1e3 / double(state.iterations()) : 0;
}

void BM_warm_lookup_verify_none(benchmark::State& state) { warm_open(state, Verify::none, false, "warm/lookup_none"); }
void BM_warm_lookup_first_use(benchmark::State& state) {
  warm_open(state, Verify::first_use, false, "warm/lookup_first_use");
}
void BM_warm_lookup_read_first_use(benchmark::State& state) {
  warm_open(state, Verify::first_use, true, "warm/lookup_read_first_use");
}
void BM_warm_lookup_read_first_use_one_thread(benchmark::State& state) {
  warm_open(state, Verify::first_use, true, "warm/lookup_read_first_use_one_thread", false);
}
void BM_warm_lookup_read_verify_none(benchmark::State& state) {
  warm_open(state, Verify::none, true, "warm/lookup_read_none");
}

// Opens `path` read-only and gives its size; -1 on failure, with `state` marked skipped. Inside
// the timed sections below: a loader without the cache pays for it too.
int open_for_reading(benchmark::State& state, const std::string& path, std::uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0) {
    *size = static_cast<std::uint64_t>(st.st_size);
    return fd;
  }
  if (fd >= 0) ::close(fd);
  state.SkipWithError("cannot open the warm file");
  return -1;
}

// The floor: map the same file with plain mmap and read every byte of it.
void BM_warm_mmap_read_floor(benchmark::State& state) {
  const WarmFile* warm = warm_file_or_skip(state);
  if (warm == nullptr) return;
  const WarmFile& f = *warm;
  std::uint64_t sink = 0, size = 0;
  for (auto _ : state) {
    const Stopwatch sw;
    const int fd = open_for_reading(state, f.path, &size);
    if (fd < 0) break;
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      state.SkipWithError("mmap failed");
      ::close(fd);
      break;
    }
    sink += demo::word_sum(p, size);
    const Lap lap = sw.lap();
    const double t = lap.wall;
    state.SetIterationTime(t);
    record_time("warm/mmap_read_floor", lap);
    ::munmap(p, size);
    ::close(fd);
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}

// The other limit: read the same file into one fresh heap buffer with pread (what a loader
// without mmap does; the kernel copies every byte out of the page cache).
void BM_warm_pread_heap(benchmark::State& state) {
  const WarmFile* warm = warm_file_or_skip(state);
  if (warm == nullptr) return;
  const WarmFile& f = *warm;
  std::uint64_t size = 0;
  for (auto _ : state) {
    const Stopwatch sw;
    const int fd = open_for_reading(state, f.path, &size);
    if (fd < 0) break;
    auto* buf = static_cast<char*>(std::malloc(size));  // a fresh mmap: first-touch faults included
    std::uint64_t done = 0;
    while (buf != nullptr && done < size) {
      const ssize_t n = ::pread(fd, buf + done, std::min<std::uint64_t>(size - done, 1 << 30), off_t(done));
      if (n <= 0) break;
      done += std::uint64_t(n);
    }
    benchmark::DoNotOptimize(buf);
    benchmark::ClobberMemory();
    const Lap lap = sw.lap();
    state.SetIterationTime(lap.wall);
    record_time("warm/pread_heap", lap);
    std::free(buf);
    ::close(fd);
    if (done != size) {
      state.SkipWithError("pread failed");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}

}  // namespace

BENCHMARK(BM_warm_pread_heap)
    ->Name("warm/pread_heap")
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_warm_lookup_verify_none)
    ->Name("warm/open_lookup_10k_verify_none")
    ->UseManualTime()
    ->Iterations(40)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_warm_mmap_read_floor)
    ->Name("warm/mmap_read_floor")
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_warm_lookup_read_first_use)
    ->Name("warm/open_lookup_read_10k_first_use")
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_warm_lookup_read_first_use_one_thread)
    ->Name("warm/open_lookup_read_10k_first_use_no_verify_ahead")
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_warm_lookup_first_use)
    ->Name("warm/open_lookup_10k_first_use")
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_warm_lookup_read_verify_none)
    ->Name("warm/open_lookup_read_10k_verify_none")
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);

}  // namespace weightcache::bench
