// The demo's model (576 MiB of f32 by default): packing it, as a backend does on every launch
// without a cache, against loading it warm from a cache file.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "demo_model.hpp"

#ifdef WEIGHTCACHE_BENCH_XNNPACK
#include <xnnpack.h>
#endif

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
void model_load(benchmark::State& state, Verify verify, bool read, const std::string& name, bool ahead = true) {
  const Model& m = model();
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  Options o = bench_options(m.warm_path, demo::compat_key(m.cfg));
  o.verify = verify;
  o.verify_ahead = ahead;
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
// The same with every checksum computed inside the look-ups, on one core.
void BM_model_load_warm_one_thread(benchmark::State& state) {
  model_load(state, Verify::first_use, false, "model/load_warm_one_thread", false);
}
void BM_model_load_warm_read(benchmark::State& state) {
  model_load(state, Verify::first_use, true, "model/load_warm_read");
}
// Lazy: no byte is read or mapped in yet (first use during inference pays the page faults).
void BM_model_load_warm_lazy(benchmark::State& state) {
  model_load(state, Verify::none, false, "model/load_warm_lazy");
}

// Verify::shared (the default), as every launch after the first verified one sees it: an
// untimed open first verifies every matrix and records it in the lock file; each timed open
// then trusts that record (one fstat per matrix at its first look-up) instead of hashing. The
// record is written only once the file's change time is 2 s in the past: wait for that first.
void BM_model_load_warm_shared(benchmark::State& state) {
  const Model& m = model();
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  std::error_code ec;
  const auto changed = std::filesystem::last_write_time(m.warm_path, ec);
  if (!ec) {
    const auto age = std::filesystem::file_time_type::clock::now() - changed;
    if (age < std::chrono::seconds(3)) std::this_thread::sleep_for(std::chrono::seconds(3) - age);
  }
  Options o = bench_options(m.warm_path, demo::compat_key(m.cfg));
  o.verify = Verify::shared;
  {
    auto first = WeightCache::open(o);
    if (!first) {
      state.SkipWithError(first.error().message.c_str());
      return;
    }
    for (const auto& s : m.mats) (void)first->look_up(s.name);
  }
  std::uint64_t trusted = 0;
  {
    auto probe = WeightCache::open(o);
    if (probe) {
      for (const auto& s : m.mats) (void)probe->look_up(s.name);
      trusted = probe->stats().trusted_entries;
    }
  }
  if (trusted != m.mats.size()) {
    state.SkipWithError("the warm file's verification was not recorded (a file system that verifies per process?)");
    return;
  }
  model_load(state, Verify::shared, false, "model/load_warm_shared");
}

#ifdef WEIGHTCACHE_BENCH_XNNPACK
// Repacking with real XNNPACK (Debian's libxnnpack): creating a fully-connected f32 operator packs
// its weights (and a zero bias) into memory XNNPACK allocates. One operator per matrix of the
// model, all kept alive, as a runtime does at every launch without a weights cache.
void BM_model_pack_xnnpack(benchmark::State& state) {
  const Model& m = model();
  if (xnn_initialize(nullptr) != xnn_status_success) {
    state.SkipWithError("xnn_initialize failed (CPU not supported by this XNNPACK?)");
    return;
  }
  std::size_t max_rows = 0;
  for (const auto& s : m.mats) max_rows = std::max(max_rows, s.rows);
  const std::vector<float> bias(max_rows, 0.0f);
  std::vector<xnn_operator_t> ops;
  for (auto _ : state) {
    const Stopwatch sw;
    bool ok = true;
    for (std::size_t i = 0; i < m.mats.size() && ok; ++i) {
      const auto& s = m.mats[i];
      xnn_operator_t op = nullptr;
      // kernel [output_channels x input_channels] = [N x K], the model file's layout.
      ok = xnn_create_fully_connected_nc_f32(s.cols, s.rows, s.cols, s.rows, m.sources[i].data(), bias.data(),
                                             -INFINITY, INFINITY, 0, &op) == xnn_status_success;
      if (ok) ops.push_back(op);
    }
    const Lap lap = sw.lap();
    state.SetIterationTime(lap.wall);
    if (ok) record_time("model/pack_xnnpack", lap);
    for (xnn_operator_t op : ops) xnn_delete_operator(op);
    ops.clear();
    if (!ok) {
      state.SkipWithError("xnn_create_fully_connected_nc_f32 failed");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * m.payload));
}
#endif

// ---- cold page cache ---------------------------------------------------------------------------
// The warm file's pages are dropped (fdatasync + POSIX_FADV_DONTNEED) before every iteration, so
// the load reads from the disk. Variants: how the bytes are checked (first_use / on_open / not at
// all) and which read-ahead the benchmark adds on the addresses the cache returns.

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

enum class Cold {
  first_use,                  // open + look_up all; each look-up checksums its entry
  on_open,                    // Verify::on_open: open checksums everything (on several threads)
  first_use_willneed,         // first_use + madvise(WILLNEED) of the mapping after the first hit
  first_use_prefetch_thread,  // first_use + a thread populating the mapping ahead of the look-ups
  none_read,                  // Verify::none, look_up all, then read every byte
  none_willneed_read,         // same + madvise(WILLNEED) of every entry before reading
  none_populate_read,         // same + madvise(MADV_POPULATE_READ) (MAP_POPULATE for a live mapping)
  mmap_read_floor,            // plain mmap of the file + read every byte
  pread_heap,                 // malloc + pread of the whole file
};

constexpr std::size_t kPage = 4096;

// [p, p + n) widened to whole pages.
std::pair<void*, std::size_t> page_range(const void* p, std::size_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t lo = a / kPage * kPage;
  const std::uintptr_t hi = (a + n + kPage - 1) / kPage * kPage;
  return {reinterpret_cast<void*>(lo), hi - lo};
}

bool populate(const void* p, std::size_t n) {
  auto [q, len] = page_range(p, n);
  if (::madvise(q, len, MADV_POPULATE_READ) == 0) return true;
  if (errno != EINVAL) return false;
  volatile const char* c = static_cast<const char*>(q);  // kernels before 5.14: touch every page
  for (std::size_t i = 0; i < len; i += kPage) (void)c[i];
  return true;
}

// Everything after the first entry: the rest of the one file mapping (entries are laid out in
// order in it; file_bytes bounds it).
std::pair<const char*, std::size_t> rest_of_mapping(WeightCache& cache, std::size_t first_off, std::size_t first_size) {
  const auto* base = static_cast<const char*>(cache.offset_to_addr(first_off)) - first_off;
  const std::uint64_t end = cache.stats().file_bytes;
  const std::uint64_t from = first_off + first_size;
  return {base + from, end > from ? static_cast<std::size_t>(end - from) : 0};
}

bool cold_load(const Model& m, Cold how, std::uint64_t* sink, std::string* error) {
  if (how == Cold::mmap_read_floor || how == Cold::pread_heap) {
    const int fd = ::open(m.warm_path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      *error = "cannot open the model's cache file";
      return false;
    }
    const auto size = static_cast<std::size_t>(st.st_size);
    bool ok = true;
    if (how == Cold::mmap_read_floor) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      ok = p != MAP_FAILED;
      if (ok) {
        *sink += demo::word_sum(p, size);
        ::munmap(p, size);
      }
    } else {
      auto* buf = static_cast<char*>(std::malloc(size));
      std::size_t done = 0;
      while (buf != nullptr && done < size) {
        const ssize_t n = ::pread(fd, buf + done, std::min<std::size_t>(size - done, 1 << 30), off_t(done));
        if (n <= 0) break;
        done += std::size_t(n);
      }
      ok = done == size;
      if (ok) *sink += static_cast<unsigned char>(buf[size / 2]);
      std::free(buf);
    }
    ::close(fd);
    if (!ok) *error = "mmap or pread failed";
    return ok;
  }
  Options o = bench_options(m.warm_path, demo::compat_key(m.cfg));
  const bool checked = how == Cold::first_use || how == Cold::on_open || how == Cold::first_use_willneed ||
                       how == Cold::first_use_prefetch_thread;
  o.verify = how == Cold::on_open ? Verify::on_open : checked ? Verify::first_use : Verify::none;
  auto cache = WeightCache::open(o);
  if (!cache) {
    *error = cache.error().message;
    return false;
  }
  std::vector<const void*> ptrs;
  std::thread prefetcher;
  for (std::size_t i = 0; i < m.mats.size(); ++i) {
    const std::size_t off = cache->look_up(m.mats[i].name);
    const void* p = cache->offset_to_addr(off);
    if (p == nullptr) {
      *error = "a packed matrix was missing from the cache";
      if (prefetcher.joinable()) prefetcher.join();
      return false;
    }
    ptrs.push_back(p);
    if (i == 0 && how == Cold::first_use_willneed) {
      const auto [q, n] = rest_of_mapping(cache.value(), off, demo::packed_bytes(m.mats[0]));
      auto [a, len] = page_range(q, n);
      (void)::madvise(a, len, MADV_WILLNEED);
    } else if (i == 0 && how == Cold::first_use_prefetch_thread) {
      const auto [q, n] = rest_of_mapping(cache.value(), off, demo::packed_bytes(m.mats[0]));
      prefetcher = std::thread([q = q, n = n] {
        constexpr std::size_t kChunk = std::size_t{8} << 20;
        for (std::size_t done = 0; done < n; done += kChunk) populate(q + done, std::min(kChunk, n - done));
      });
    }
  }
  if (prefetcher.joinable()) prefetcher.join();
  if (!checked) {
    if (how == Cold::none_willneed_read) {
      for (std::size_t i = 0; i < ptrs.size(); ++i) {
        auto [a, len] = page_range(ptrs[i], demo::packed_bytes(m.mats[i]));
        (void)::madvise(a, len, MADV_WILLNEED);
      }
    } else if (how == Cold::none_populate_read) {
      for (std::size_t i = 0; i < ptrs.size(); ++i) (void)populate(ptrs[i], demo::packed_bytes(m.mats[i]));
    }
    for (std::size_t i = 0; i < ptrs.size(); ++i) *sink += demo::word_sum(ptrs[i], demo::packed_bytes(m.mats[i]));
  }
  if (cache->stats().verify_failures != 0) {
    *error = "checksum failures on a cold load";
    return false;
  }
  return true;
}

void BM_model_cold(benchmark::State& state, Cold how, const std::string& name) {
  const Model& m = model();
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  std::uint64_t sink = 0;
  for (auto _ : state) {
    const double resident = drop_file_cache(m.warm_path);
    if (resident < 0) {
      state.SkipWithError("cannot drop the file's pages (fdatasync / posix_fadvise / mincore)");
      break;
    }
    record_sample("cold/resident_after_drop", resident);
    std::string error;
    const Stopwatch sw;
    const bool ok = cold_load(m, how, &sink, &error);
    const Lap lap = sw.lap();
    if (!ok) {
      state.SkipWithError(error.c_str());
      break;
    }
    state.SetIterationTime(lap.wall);
    record_time(name, lap);
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * m.payload));
  state.counters["resident_after_drop"] = median_sample("cold/resident_after_drop");
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
BENCHMARK(BM_model_load_warm_one_thread)
    ->Name("model/load_warm_no_verify_ahead_576MiB")
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_model_load_warm_lazy)
    ->Name("model/load_warm_lazy_verify_none_576MiB")
    ->UseManualTime()
    ->Iterations(8)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_model_load_warm_shared)
    ->Name("model/load_warm_shared_576MiB")
    ->UseManualTime()
    ->Iterations(8)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_model_load_warm_read)
    ->Name("model/load_warm_read_576MiB")
    ->UseManualTime()
    ->Iterations(8)
    ->Unit(benchmark::kMillisecond);

#ifdef WEIGHTCACHE_BENCH_XNNPACK
BENCHMARK(BM_model_pack_xnnpack)
    ->Name("model/pack_xnnpack_fully_connected_f32_576MiB")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
#endif

#define WEIGHTCACHE_COLD(tag)                                            \
  BENCHMARK_CAPTURE(BM_model_cold, tag, Cold::tag, std::string("cold/" #tag)) \
      ->Name("cold/" #tag "_576MiB")                                     \
      ->UseManualTime()                                                  \
      ->Iterations(3)                                                    \
      ->Unit(benchmark::kMillisecond)
WEIGHTCACHE_COLD(first_use);
WEIGHTCACHE_COLD(on_open);
WEIGHTCACHE_COLD(first_use_willneed);
WEIGHTCACHE_COLD(first_use_prefetch_thread);
WEIGHTCACHE_COLD(none_read);
WEIGHTCACHE_COLD(none_willneed_read);
WEIGHTCACHE_COLD(none_populate_read);
WEIGHTCACHE_COLD(mmap_read_floor);
WEIGHTCACHE_COLD(pread_heap);
#undef WEIGHTCACHE_COLD

}  // namespace weightcache::bench
