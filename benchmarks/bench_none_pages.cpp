// A NONE writer's pages (issue 32, item 4): a 1 GiB cache written with durability none, then at
// once a new process that opens it with Verify::shared and looks up every key. That reader is the
// first to verify this state of the file, so before it may record what it hashed it writes back
// every dirty page of the committed range and waits for it (adopt_verification). A none writer's
// finalize now starts that write-back, never waiting for it; WEIGHTCACHE_COMMIT_WRITE_BACK=off
// measures the writer without it in the same run, and a durability full writer is the reference.
// A full writer with Verify::shared leaves the verification record at close (issue 32, item 2:
// "The writer's own record" in docs/DESIGN.md); one with Verify::first_use does not, which
// measures what that record costs the writer's close and saves the first reader.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"

namespace weightcache::bench {
namespace {

constexpr std::size_t kEntrySize = std::size_t{4} << 20;
constexpr std::size_t kEntries = 256;  // 1 GiB
const char* const kCompat = "bench-none-pages";

enum class Writer { none, none_no_start, full, full_no_record };

const char* tag(Writer w) {
  return w == Writer::none            ? "none"
         : w == Writer::none_no_start ? "none_no_start"
         : w == Writer::full          ? "full"
                                      : "full_no_record";
}

// Writes the cache as a packer would (reserve, fill, insert), then finalize and close; returns
// the finalize's time and sets `close` to the close's, or sets `error` with the reason.
Lap write_cache(const std::string& path, const std::vector<std::string>& keys, Writer w, Lap* close, std::string* error) {
  if (w == Writer::none_no_start) ::setenv("WEIGHTCACHE_COMMIT_WRITE_BACK", "off", 1);
  else ::unsetenv("WEIGHTCACHE_COMMIT_WRITE_BACK");
  Options o = bench_options(path, kCompat);
  const bool full = w == Writer::full || w == Writer::full_no_record;
  o.durability = full ? Durability::full : Durability::none;
  // first_use: the writer keeps no trust state, so its close records nothing.
  if (w == Writer::full_no_record) o.verify = Verify::first_use;
  o.verify_ahead = false;  // a writer: nothing to verify
  auto cache = WeightCache::open(o);
  ::unsetenv("WEIGHTCACHE_COMMIT_WRITE_BACK");
  if (!cache) {
    *error = cache.error().message;
    return {};
  }
  const std::vector<std::size_t> sizes(kEntries, kEntrySize);
  if (!reserve_fill_insert(*cache, sizes, keys, true, true)) {
    *error = last_error().message;
    return {};
  }
  const Stopwatch sw;
  if (auto r = cache->finalize(); !r) {
    *error = r.error().message;
    return {};
  }
  const Lap lap = sw.lap();
  const Stopwatch close_sw;
  cache = WeightCache();  // close: it waits for the write-back start, if still under way
  *close = close_sw.lap();
  return lap;
}

bool parse_ok(const std::string& line, double* wall, double* cpu, double* count) {
  unsigned long long n = 0, sum = 0;
  if (std::sscanf(line.c_str(), "ok %lf %lf %llu %llu", wall, cpu, &n, &sum) != 4) return false;
  *count = double(n);
  return true;
}

void BM_first_reader(benchmark::State& state, Writer w) {
  const std::string name = std::string("none_pages/") + tag(w);
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < kEntries; ++i) keys.push_back("layer." + std::to_string(i) + ".weight");
  const std::string keys_path = scratch_path("none-pages-keys");
  {
    std::ofstream out(keys_path);
    for (const auto& k : keys) out << k << '\n';
  }
  for (auto _ : state) {
    const std::string path = scratch_path("none-pages");
    std::string error;
    Lap close;
    const Lap fin = write_cache(path, keys, w, &close, &error);
    if (!error.empty()) {
      state.SkipWithError(error.c_str());
      break;
    }
    // A reader may record (and so writes back first) only once the file's change time is more
    // than the change window (10 ms on ext4) before its open: any launch after the writer but the
    // very fastest. Wait that long, so that every run measures that reader.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const Stopwatch sw;
    Child c = spawn_child({"lookup", path, kCompat, "shared", keys_path});
    const std::string line = c.pid < 0 ? "" : read_child_line(c);
    const double spawn_to_ready = sw.lap().wall;
    double wall = 0, cpu = 0, hits = 0;
    const bool ok = parse_ok(line, &wall, &cpu, &hits) && hits == double(kEntries);
    const bool exited = finish_child(c);
    // Clean and gone before the next run: its write-back must not overlap the next one's.
    (void)sync_file(path);
    remove_cache_file(path);
    if (!ok || !exited) {
      state.SkipWithError(("child: " + line).c_str());
      break;
    }
    state.SetIterationTime(wall);
    record_time(name + "/reader", Lap{wall, cpu});
    record_time(name + "/writer_finalize", fin);
    record_time(name + "/writer_close", close);
    record_sample(name + "/spawn_to_ready", spawn_to_ready);
  }
  std::remove(keys_path.c_str());
  if (has_time(name + "/reader")) {
    state.counters["reader_ms"] = median_time(name + "/reader") * 1e3;
    state.counters["finalize_ms"] = median_time(name + "/writer_finalize") * 1e3;
    state.counters["close_ms"] = median_time(name + "/writer_close") * 1e3;
  }
}

}  // namespace

BENCHMARK_CAPTURE(BM_first_reader, full, Writer::full)
    ->Name("first_minute/first_shared_reader_1GiB_after_full_writer")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_first_reader, full_no_record, Writer::full_no_record)
    ->Name("first_minute/first_shared_reader_1GiB_after_full_writer_no_record")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_first_reader, none_no_start, Writer::none_no_start)
    ->Name("first_minute/first_shared_reader_1GiB_after_none_writer_no_write_back")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_first_reader, none, Writer::none)
    ->Name("first_minute/first_shared_reader_1GiB_after_none_writer")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace weightcache::bench
