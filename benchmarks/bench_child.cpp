// weightcache-bench-child: the "other process" of the process benchmarks. The benchmark starts it
// with posix_spawn; it does one job, prints one result line on stdout, then stays alive (holding
// whatever it mapped or allocated) until its stdin reaches EOF, so the parent can read its
// /proc/<pid>/smaps and start the next process while this one still holds the cache open.
//
//   lookup PATH COMPAT VERIFY KEYS_FILE   open the cache, look up every key of KEYS_FILE (VERIFY:
//                                         none, on_open, shared, else first_use)
//   model-cache PATH LAYERS DIM           open the demo model's cache, look up every matrix and
//                                         read every byte
//   model-heap LAYERS DIM                 pack the demo model onto the heap (what a backend
//                                         without a cache does at every launch)
//   idle                                  nothing (the baseline memory of this binary)
//
// Result line: "ok <wall s> <cpu s> <count> <checksum>" or "error <message>".
#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
#include <weightcache/weight_cache.hpp>

#include "demo_model.hpp"

namespace {

using weightcache::Options;
using weightcache::Verify;
using weightcache::WeightCache;

double cpu_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void say(const std::string& line) {
  const std::string l = line + "\n";
  std::size_t done = 0;
  while (done < l.size()) {
    const ssize_t n = ::write(1, l.data() + done, l.size() - done);
    if (n <= 0) return;
    done += std::size_t(n);
  }
}

int fail(const std::string& why) {
  say("error " + why);
  return 1;
}

void wait_for_eof() {
  char buf[64];
  while (::read(0, buf, sizeof buf) > 0) {
  }
}

Options cache_options(const std::string& path, const std::string& compat, Verify verify) {
  Options o;
  o.path = path;
  o.compat_key = compat;
  o.durability = weightcache::Durability::none;
  o.backing = weightcache::Backing::file;
  // Read-write, as a backend opens it (it would pack its misses into the file); every key hits.
  o.verify = verify;
  return o;
}

std::string result(double wall, double cpu, std::uint64_t count, std::uint64_t sum) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "ok %.9f %.9f %llu %llu", wall, cpu, static_cast<unsigned long long>(count),
                static_cast<unsigned long long>(sum));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  // As in the benchmark: large blocks are fresh mmaps, and freed ones go back to the system, so
  // the heap mode's memory is its packed weights and nothing left over from the sources.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.empty()) return fail("no mode");
  const std::string& mode = a[0];
  std::string line;

  // Kept alive until EOF on stdin.
  WeightCache cache;
  std::vector<std::unique_ptr<float[]>> heap;

  if (mode == "lookup" && a.size() == 5) {
    const Verify verify = a[3] == "none"      ? Verify::none
                          : a[3] == "on_open" ? Verify::on_open
                          : a[3] == "shared"  ? Verify::shared
                                              : Verify::first_use;
    std::vector<std::string> keys;
    std::ifstream in(a[4]);
    for (std::string k; std::getline(in, k);) keys.push_back(k);
    if (keys.empty()) return fail("no keys in " + a[4]);
    const double w0 = wall_now(), c0 = cpu_now();
    auto c = WeightCache::open(cache_options(a[1], a[2], verify));
    if (!c) return fail(c.error().message);
    std::uint64_t hits = 0, sum = 0;
    for (const auto& k : keys) {
      const std::size_t off = c->look_up(k);
      hits += off != weightcache::kNotFound;
      sum += off;
    }
    line = result(wall_now() - w0, cpu_now() - c0, hits, sum);
    cache = std::move(c.value());
  } else if ((mode == "model-cache" && a.size() == 4) || (mode == "model-heap" && a.size() == 3)) {
    const bool from_cache = mode == "model-cache";
    weightcache::demo::ModelConfig cfg;
    cfg.layers = std::stoul(a[from_cache ? 2 : 1]);
    cfg.dim = std::stoul(a[from_cache ? 3 : 2]);
    const auto mats = weightcache::demo::model_matrices(cfg);
    std::uint64_t sum = 0;
    double wall = 0, cpu = 0;
    if (from_cache) {
      const double w0 = wall_now(), c0 = cpu_now();
      auto c = WeightCache::open(cache_options(a[1], weightcache::demo::compat_key(cfg), Verify::first_use));
      if (!c) return fail(c.error().message);
      for (const auto& m : mats) {
        const void* p = c->offset_to_addr(c->look_up(m.name));
        if (p == nullptr) return fail("missing " + m.name);
        sum += weightcache::demo::word_sum(p, weightcache::demo::packed_bytes(m));
      }
      wall = wall_now() - w0;
      cpu = cpu_now() - c0;
      cache = std::move(c.value());
    } else {
      // Only the packing is timed; generating the source stands in for reading the model file.
      for (const auto& m : mats) {
        std::vector<float> src(m.rows * m.cols);
        weightcache::demo::generate(cfg, m, src.data());
        const double w0 = wall_now(), c0 = cpu_now();
        heap.emplace_back(new float[weightcache::demo::packed_bytes(m) / sizeof(float)]);
        weightcache::demo::pack_panels(src.data(), m.rows, m.cols, heap.back().get());
        wall += wall_now() - w0;
        cpu += cpu_now() - c0;
        sum += weightcache::demo::word_sum(heap.back().get(), weightcache::demo::packed_bytes(m));
      }
    }
    line = result(wall, cpu, mats.size(), sum);
  } else if (mode == "idle") {
    line = result(0, 0, 0, 0);
  } else {
    return fail("usage: lookup PATH COMPAT VERIFY KEYS | model-cache PATH LAYERS DIM | model-heap LAYERS DIM | idle");
  }
  say(line);
  wait_for_eof();
  return 0;
}
