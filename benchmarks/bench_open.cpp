// The open path of the warm 10,000-entry cache, taken apart: what "warm open + 10,000 look-ups"
// (bench_warm.cpp) spends where. The fixed costs are the system calls every open makes whatever
// the file holds, made here the way the library makes them (fstatfs of the cache file, the boot
// id, the lock file opened and locked, the verification record read, the verify-ahead thread
// started); the rest is the index (read, checked, published: grows with the entries) and the
// look-ups. The summary prints them side by side (bench_main.cpp).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "bench_util.hpp"

namespace weightcache::bench {
namespace {

// One fixed cost, `iterations` times per benchmark iteration; records the time of one.
template <class Step>
void fixed_cost(benchmark::State& state, const std::string& name, Step&& step) {
  const WarmFile* warm = warm_file_or_skip(state);
  if (warm == nullptr) return;
  constexpr int kRepeat = 100;
  for (auto _ : state) {
    const Stopwatch sw;
    for (int i = 0; i < kRepeat; ++i)
      if (!step(*warm)) {
        state.SkipWithError(("the step of " + name + " failed").c_str());
        return;
      }
    Lap lap = sw.lap();
    lap.wall /= kRepeat;
    lap.cpu /= kRepeat;
    state.SetIterationTime(lap.wall);
    record_time(name, lap);
  }
}

void BM_fixed_statfs(benchmark::State& state) {
  const int fd = ::open(warm_file().path.c_str(), O_RDONLY | O_CLOEXEC);
  fixed_cost(state, "open/fixed/statfs", [fd](const WarmFile&) {
    struct statfs fs {};
    return ::fstatfs(fd, &fs) == 0;
  });
  if (fd >= 0) ::close(fd);
}

void BM_fixed_boot_id(benchmark::State& state) {
  fixed_cost(state, "open/fixed/boot_id", [](const WarmFile&) {
    const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char text[37];
    const bool ok = ::pread(fd, text, 36, 0) == 36;
    ::close(fd);
    return ok;
  });
}

void BM_fixed_lock_file(benchmark::State& state) {
  fixed_cost(state, "open/fixed/lock_file", [](const WarmFile& w) {
    const int fd = ::open((w.path + ".lock").c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    struct flock l {};
    l.l_type = F_RDLCK;
    l.l_whence = SEEK_SET;
    l.l_start = 1ll << 62;
    l.l_len = 1;
    const bool ok = ::fcntl(fd, F_OFD_SETLK, &l) == 0;
    ::close(fd);
    return ok;
  });
}

void BM_fixed_record_read(benchmark::State& state) {
  const int fd = ::open((warm_file().path + ".lock").c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  fixed_cost(state, "open/fixed/record_read", [fd](const WarmFile&) {
    // The record's fixed part, then all of it: one bit per entry and its checksum.
    char buf[96 + kWarmEntries / 8 + 8];
    return fd >= 0 && ::pread(fd, buf, 96, 0) >= 0 && ::pread(fd, buf, sizeof buf, 0) >= 0;
  });
  if (fd >= 0) ::close(fd);
}

void BM_fixed_thread_start(benchmark::State& state) {
  fixed_cost(state, "open/fixed/thread_start", [](const WarmFile&) {
    std::thread t([] {});
    t.join();
    return true;
  });
}

// The open alone (no look-up) and the look-ups alone (on a cache opened untimed).
void open_apart(benchmark::State& state, Verify verify, bool look_ups, const std::string& name) {
  const WarmFile* warm = warm_file_or_skip(state);
  if (warm == nullptr) return;
  for (auto _ : state) {
    Options o = bench_options(warm->path, warm->compat);
    o.verify = verify;
    Stopwatch sw;
    auto cache = WeightCache::open(o);
    if (!cache) {
      state.SkipWithError(cache.error().message.c_str());
      return;
    }
    if (look_ups) {
      sw = Stopwatch();
      for (const auto& k : warm->keys)
        if (cache->look_up(k) == kNotFound) {
          state.SkipWithError("a warm entry was missing");
          return;
        }
    }
    const Lap lap = sw.lap();
    state.SetIterationTime(lap.wall);
    record_time(name, lap);
  }
}

void BM_open_only_none(benchmark::State& state) { open_apart(state, Verify::none, false, "open/index_10k_none"); }
void BM_open_only_shared(benchmark::State& state) { open_apart(state, Verify::shared, false, "open/index_10k_shared"); }
void BM_look_ups_only(benchmark::State& state) { open_apart(state, Verify::none, true, "open/look_ups_10k_none"); }

// Issue 32, "warm in the first minute": open + 10,000 look-ups in a new process (the child
// times both), with Verify::shared and a record present (every entry trusted), against
// Verify::none in the same run (no check at all: the floor).
void new_process_look_ups(benchmark::State& state, const char* verify, const std::string& name) {
  const WarmFile* warm = warm_file_or_skip(state);
  if (warm == nullptr) return;
  // One untimed shared process first: it verifies and leaves the record the others trust (the
  // warm file's last change is older than any window by then).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (int i = 0; i < 2; ++i) {
    Child c = spawn_child({"lookup", warm->path, warm->compat, "shared", warm->keys_path});
    (void)read_child_line(c);
    (void)finish_child(c);
  }
  for (auto _ : state) {
    Child c = spawn_child({"lookup", warm->path, warm->compat, verify, warm->keys_path});
    const std::string line = read_child_line(c);
    double wall = 0, cpu = 0;
    if (c.pid < 0 || std::sscanf(line.c_str(), "ok %lf %lf", &wall, &cpu) != 2) {
      (void)finish_child(c);
      state.SkipWithError(("child: " + line).c_str());
      return;
    }
    (void)finish_child(c);
    state.SetIterationTime(wall);
    record_time(name, Lap{wall, cpu});
  }
}

void BM_new_process_shared(benchmark::State& state) {
  new_process_look_ups(state, "shared", "open/new_process_10k_shared");
}
void BM_new_process_none(benchmark::State& state) { new_process_look_ups(state, "none", "open/new_process_10k_none"); }

}  // namespace

#define WC_FIXED(fn, name) BENCHMARK(fn)->Name(name)->UseManualTime()->Iterations(50)->Unit(benchmark::kMicrosecond)
WC_FIXED(BM_fixed_statfs, "open/fixed/statfs");
WC_FIXED(BM_fixed_boot_id, "open/fixed/boot_id");
WC_FIXED(BM_fixed_lock_file, "open/fixed/lock_file");
WC_FIXED(BM_fixed_record_read, "open/fixed/record_read");
WC_FIXED(BM_fixed_thread_start, "open/fixed/thread_start");
#undef WC_FIXED
BENCHMARK(BM_open_only_none)->Name("open/index_10k_verify_none")->UseManualTime()->Iterations(40)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_open_only_shared)->Name("open/index_10k_shared")->UseManualTime()->Iterations(40)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_new_process_shared)->Name("open/new_process_10k_shared")->UseManualTime()->Iterations(30)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_new_process_none)->Name("open/new_process_10k_verify_none")->UseManualTime()->Iterations(30)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_look_ups_only)->Name("open/look_ups_10k_verify_none")->UseManualTime()->Iterations(40)->Unit(benchmark::kMillisecond);

}  // namespace weightcache::bench
