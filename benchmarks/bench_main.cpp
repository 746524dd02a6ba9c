// weightcache-bench: Google Benchmark runner plus a closing summary that sets each measurement
// against the baseline measured in the same run, with the project's targets.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"

namespace {

using namespace weightcache::bench;

struct Line {
  std::string what;
  std::string wall;  // figures from wall time
  std::string cpu;   // the same from process CPU time
  std::string target;
  int pass_wall = -1;  // 1 pass, 0 miss, -1 no target
  int pass_cpu = -1;
};

std::string f(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
}

const char* verdict(int v) { return v < 0 ? "" : v ? "PASS" : "MISS"; }

// Throughput-style ratio "subject vs baseline": baseline time / subject time, >= target passes.
void ratio_line(std::vector<Line>* out, const std::string& what, const char* subject, const char* baseline, double mib,
                double target, bool info) {
  if (!has_time(subject) || !has_time(baseline)) return;
  Line l{what, "", "", info ? "(info)" : f(">= %.2fx", target)};
  for (bool cpu : {false, true}) {
    const double b = median_time(baseline, cpu), t = median_time(subject, cpu);
    const double r = b / t;
    const std::string text = mib > 0 ? f("%.2f vs %.2f GiB/s = %.2fx", mib / 1024 / t, mib / 1024 / b, r)
                                     : f("%.1f vs %.1f ms = %.2fx", t * 1e3, b * 1e3, r);
    (cpu ? l.cpu : l.wall) = text;
    if (!info) (cpu ? l.pass_cpu : l.pass_wall) = r >= target;
  }
  out->push_back(l);
}

// Cost-style ratio "subject vs baseline": subject time / baseline time, <= target passes.
void slowdown_line(std::vector<Line>* out, const std::string& what, const char* subject, const char* baseline,
                   double target, bool info) {
  if (!has_time(subject) || !has_time(baseline)) return;
  Line l{what, "", "", info ? "(info)" : f("<= %.2fx", target)};
  for (bool cpu : {false, true}) {
    const double b = median_time(baseline, cpu), t = median_time(subject, cpu);
    (cpu ? l.cpu : l.wall) = f("%.1f vs %.1f ms = %.2fx", t * 1e3, b * 1e3, t / b);
    if (!info) (cpu ? l.pass_cpu : l.pass_wall) = t / b <= target;
  }
  out->push_back(l);
}

constexpr int kThreadCounts[] = {1, 2, 8};
constexpr int kProcessCounts[] = {1, 2, 4, 8};
constexpr long kScaleCounts[] = {100, 1000, 10000, 100000, 1000000};
constexpr double kMiB = 1 << 20;

double ms(const std::string& name, bool cpu = false) { return median_time(name, cpu) * 1e3; }

// The tables behind issue 4 and issue 6.5/6.6 (several figures per row, no single ratio).
void print_tables(std::FILE* out) {
  if (has_sample("threads/cache/1/cpu_ns")) {
    std::fprintf(out, "\n  look_up of a verified hit, 10,000 entries, N reader threads at once (%u cores):\n",
                 std::thread::hardware_concurrency());
    std::fprintf(out, "  %-8s %-34s %-34s %-34s\n", "threads", "weightcache look_up", "unordered_map::find",
                 "unordered_map + shared_mutex");
    std::fprintf(out, "  %-8s %-34s %-34s %-34s\n", "", "CPU ns/op | wall ns/op | Mop/s", "CPU ns/op | Mop/s",
                 "CPU ns/op | Mop/s");
    for (int t : kThreadCounts) {
      const std::string c = "threads/cache/" + std::to_string(t), m = "threads/map/" + std::to_string(t),
                        x = "threads/map_shared_mutex/" + std::to_string(t);
      if (!has_sample(c + "/cpu_ns")) continue;
      std::fprintf(out, "  %-8d %-34s %-34s %-34s\n", t,
                   f("%.0f | %.0f | %.1f", median_sample(c + "/cpu_ns"), median_sample(c + "/wall_ns"),
                     median_sample(c + "/mops")).c_str(),
                   f("%.0f | %.1f", median_sample(m + "/cpu_ns"), median_sample(m + "/mops")).c_str(),
                   f("%.0f | %.1f", median_sample(x + "/cpu_ns"), median_sample(x + "/mops")).c_str());
    }
    if (has_sample("threads/cache/2/mops") && has_sample("threads/map/2/mops"))
      std::fprintf(out, "  2 threads vs 1, look-ups per second in all: weightcache %.2fx, map + shared_mutex %.2fx, map %.2fx (info)\n",
                   median_sample("threads/cache/2/mops") / median_sample("threads/cache/1/mops"),
                   median_sample("threads/map_shared_mutex/2/mops") / median_sample("threads/map_shared_mutex/1/mops"),
                   median_sample("threads/map/2/mops") / median_sample("threads/map/1/mops"));
  }
  if (has_time("kth/none/1") || has_time("kth/first_use/1")) {
    std::fprintf(out, "\n  k-th process opening the warm 10,000-entry cache (k-1 others hold it open); in-process\n"
                      "  open + look_up of every key, wall / CPU ms; spawn-to-ready adds exec and start-up:\n");
    std::fprintf(out, "  %-4s %-26s %-26s %-24s\n", "k", "Verify::none", "Verify::first_use", "spawn-to-ready (none)");
    for (int k = 1; k <= 8; ++k) {
      const std::string a = "kth/none/" + std::to_string(k), b = "kth/first_use/" + std::to_string(k);
      std::fprintf(out, "  %-4d %-26s %-26s %-24s\n", k, f("%.2f / %.2f", ms(a), ms(a, true)).c_str(),
                   f("%.2f / %.2f", ms(b), ms(b, true)).c_str(),
                   f("%.2f ms", median_sample(a + "/spawn_to_ready") * 1e3).c_str());
    }
    if (has_time("kth/none/8") && has_time("kth/first_use/8"))
      std::fprintf(out, "  k = 8 vs k = 1 (CPU): Verify::none %.2fx, first_use %.2fx (info: later processes pay no more)\n",
                   median_time("kth/none/8", true) / median_time("kth/none/1", true),
                   median_time("kth/first_use/8", true) / median_time("kth/first_use/1", true));
  }
  if (has_sample("mem/cache/1/pss")) {
    const double file = value("mem/file_bytes") / kMiB;
    const double idle = median_sample("mem/idle/1/pss") / kMiB, idle_pd = median_sample("mem/idle/1/private_dirty") / kMiB;
    std::fprintf(out,
                 "\n  memory of N processes holding the %.0f MiB model (sums over the processes, /proc/<pid>/smaps_rollup;\n"
                 "  an idle helper process: Pss %.2f MiB, Private_Dirty %.2f MiB):\n",
                 file, idle, idle_pd);
    std::fprintf(out, "  %-4s %-40s %-30s %-26s %s\n", "N", "shared cache: Pss | Private_Dirty",
                 "  (cache file's mappings)", "heap repack: Pss | P_Dirty", "target");
    for (int n : kProcessCounts) {
      const std::string c = "mem/cache/" + std::to_string(n), h = "mem/heap/" + std::to_string(n);
      if (!has_sample(c + "/pss")) continue;
      const double pss = median_sample(c + "/pss") / kMiB, pd = median_sample(c + "/private_dirty") / kMiB;
      const double fpss = median_sample(c + "/file_pss") / kMiB, fpd = median_sample(c + "/file_private_dirty") / kMiB;
      // Sharing is real when the file's pages are counted once in all, and nobody dirties them.
      const bool pass = fpss <= 1.05 * file && fpd <= 1.0;
      std::fprintf(out, "  %-4d %-40s %-30s %-26s %s\n", n, f("%.1f | %.2f MiB", pss, pd).c_str(),
                   f("  %.1f | %.2f MiB", fpss, fpd).c_str(),
                   f("%.1f | %.1f MiB", median_sample(h + "/pss") / kMiB, median_sample(h + "/private_dirty") / kMiB)
                       .c_str(),
                   pass ? "PASS (file Pss <= 1.05x file, its Private_Dirty <= 1 MiB)" : "MISS");
    }
  }
  if (has_time("scale/100/lookup")) {
    std::fprintf(out, "\n  cost per entry vs entry count (64-byte entries; CPU time; look-ups: 2^20 random hits):\n");
    std::fprintf(out, "  %-9s %-14s %-12s %-12s %-12s %-14s %-12s %-12s\n", "entries", "reserve+fill+", "look_up",
                 "map::find", "first look", "warm open", "finalize", "");
    std::fprintf(out, "  %-9s %-14s %-12s %-12s %-12s %-14s %-12s\n", "", "insert ns", "ns", "ns", "up ns", "ns/entry",
                 "ns/entry");
    for (long n : kScaleCounts) {
      const std::string t = "scale/" + std::to_string(n);
      if (!has_time(t + "/lookup")) continue;
      const double dn = double(n), lk = double(1 << 20);
      std::fprintf(out, "  %-9ld %-14.0f %-12.0f %-12.0f %-12.0f %-14.0f %-12.0f\n", n,
                   median_time(t + "/insert", true) * 1e9 / dn, median_time(t + "/lookup", true) * 1e9 / lk,
                   median_time(t + "/map_find", true) * 1e9 / lk, median_time(t + "/first_lookup", true) * 1e9 / dn,
                   median_time(t + "/open", true) * 1e9 / dn, median_time(t + "/finalize", true) * 1e9 / dn);
    }
    // "Flat": per-entry costs do not grow with the entry count beyond what the memory hierarchy
    // does to any hash table (the plain map's growth is the yardstick for look-ups).
    if (has_time("scale/10000/lookup") && has_time("scale/1000000/lookup")) {
      auto growth = [](const char* what) {
        return median_time(std::string("scale/1000000/") + what, true) /
               median_time(std::string("scale/10000/") + what, true);
      };
      // insert and open are totals over all entries (100x more at 1e6); look-ups are 2^20 either way.
      const double ins = growth("insert") / 100, lk = growth("lookup"), map = growth("map_find"),
                   open = growth("open") / 100;
      std::fprintf(out, "  growth 1e4 -> 1e6 entries: reserve+fill+insert x%.2f (target <= 2x: %s); look_up x%.2f vs\n"
                        "  unordered_map::find x%.2f (target <= 1.5 x the map's growth: %s); warm open per entry x%.2f (info)\n",
                   ins, ins <= 2.0 ? "PASS" : "MISS", lk, map, lk <= 1.5 * map ? "PASS" : "MISS", open);
    }
  }
}

// Data files for benchmarks/plots.gp, written to $WEIGHTCACHE_BENCH_DATA when it is set.
void write_plot_data() {
  const char* dir = std::getenv("WEIGHTCACHE_BENCH_DATA");
  if (dir == nullptr || dir[0] == '\0') return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto open = [&](const char* name) { return std::fopen((std::string(dir) + "/" + name).c_str(), "w"); };
  if (std::FILE* o = has_time("scale/100/lookup") ? open("scale.dat") : nullptr) {
    std::fprintf(o, "# entries insert_ns lookup_ns map_find_ns open_ns_per_entry finalize_ns_per_entry\n");
    for (long n : kScaleCounts) {
      const std::string t = "scale/" + std::to_string(n);
      if (!has_time(t + "/lookup")) continue;
      const double dn = double(n), lk = double(1 << 20);
      std::fprintf(o, "%ld %.1f %.1f %.1f %.1f %.1f\n", n, median_time(t + "/insert", true) * 1e9 / dn,
                   median_time(t + "/lookup", true) * 1e9 / lk, median_time(t + "/map_find", true) * 1e9 / lk,
                   median_time(t + "/open", true) * 1e9 / dn, median_time(t + "/finalize", true) * 1e9 / dn);
    }
    std::fclose(o);
  }
  if (std::FILE* o = has_sample("threads/cache/1/cpu_ns") ? open("threads.dat") : nullptr) {
    std::fprintf(o, "# threads cache_cpu_ns cache_wall_ns map_cpu_ns map_mutex_cpu_ns cache_mops map_mops map_mutex_mops\n");
    for (int t : kThreadCounts) {
      const std::string c = "threads/cache/" + std::to_string(t), m = "threads/map/" + std::to_string(t),
                        x = "threads/map_shared_mutex/" + std::to_string(t);
      std::fprintf(o, "%d %.1f %.1f %.1f %.1f %.2f %.2f %.2f\n", t, median_sample(c + "/cpu_ns"),
                   median_sample(c + "/wall_ns"), median_sample(m + "/cpu_ns"), median_sample(x + "/cpu_ns"),
                   median_sample(c + "/mops"), median_sample(m + "/mops"), median_sample(x + "/mops"));
    }
    std::fclose(o);
  }
  if (std::FILE* o = has_time("kth/none/1") ? open("kth.dat") : nullptr) {
    std::fprintf(o, "# k none_wall_ms none_cpu_ms first_use_wall_ms first_use_cpu_ms none_spawn_to_ready_ms\n");
    for (int k = 1; k <= 8; ++k) {
      const std::string a = "kth/none/" + std::to_string(k), b = "kth/first_use/" + std::to_string(k);
      std::fprintf(o, "%d %.3f %.3f %.3f %.3f %.3f\n", k, ms(a), ms(a, true), ms(b), ms(b, true),
                   median_sample(a + "/spawn_to_ready") * 1e3);
    }
    std::fclose(o);
  }
  if (std::FILE* o = has_sample("mem/cache/1/pss") ? open("memory.dat") : nullptr) {
    std::fprintf(o, "# N shared_pss_MiB shared_private_dirty_MiB heap_pss_MiB heap_private_dirty_MiB file_MiB\n");
    for (int n : kProcessCounts) {
      const std::string c = "mem/cache/" + std::to_string(n), h = "mem/heap/" + std::to_string(n);
      std::fprintf(o, "%d %.2f %.2f %.2f %.2f %.2f\n", n, median_sample(c + "/pss") / kMiB,
                   median_sample(c + "/private_dirty") / kMiB, median_sample(h + "/pss") / kMiB,
                   median_sample(h + "/private_dirty") / kMiB, value("mem/file_bytes") / kMiB);
    }
    std::fclose(o);
  }
  if (std::FILE* o = has_time("model/pack_heap") ? open("load.dat") : nullptr) {
    // Bars: label, wall ms, CPU ms. Group 0 = baselines, 1 = warm, 2 = cold.
    std::fprintf(o, "# label wall_ms cpu_ms group\n");
    const struct {
      const char* label;
      const char* name;
      int group;
    } bars[] = {
        {"repack to heap", "model/pack_heap", 0},
        {"XNNPACK creates FC ops", "model/pack_xnnpack", 0},
        {"warm, first_use", "model/load_warm", 1},
        {"warm + read all", "model/load_warm_read", 1},
        {"cold, first_use", "cold/first_use", 2},
        {"cold, on_open", "cold/on_open", 2},
        {"cold, first_use + WILLNEED", "cold/first_use_willneed", 2},
        {"cold, first_use + prefetch thread", "cold/first_use_prefetch_thread", 2},
        {"cold, none + read", "cold/none_read", 2},
        {"cold, none + WILLNEED + read", "cold/none_willneed_read", 2},
        {"cold, none + POPULATE + read", "cold/none_populate_read", 2},
        {"cold, mmap + read (floor)", "cold/mmap_read_floor", 2},
        {"cold, pread to heap", "cold/pread_heap", 2},
    };
    for (const auto& b : bars)
      if (has_time(b.name)) std::fprintf(o, "\"%s\" %.2f %.2f %d\n", b.label, ms(b.name), ms(b.name, true), b.group);
    std::fclose(o);
  }
  if (std::FILE* o = has_time("strategy/ours/reserve") ? open("strategy.dat") : nullptr) {
    std::fprintf(o, "# what chunked_ms per_reserve_mmap_ms (wall)\n");
    std::fprintf(o, "\"10,000 reserves\" %.3f %.3f\n", ms("strategy/ours/reserve"), ms("strategy/executorch/reserve"));
    std::fprintf(o, "\"reserve + fill\" %.3f %.3f\n", ms("strategy/ours/fill"), ms("strategy/executorch/fill"));
    std::fprintf(o, "\"close (unmap)\" %.3f %.3f\n", median_sample("strategy/ours/fill/close_s") * 1e3,
                 median_sample("strategy/executorch/fill/close_s") * 1e3);
    std::fclose(o);
  }
}

void print_summary(std::FILE* out) {
  std::vector<Line> lines;
  ratio_line(&lines, "reserve+fill 256 MiB in 1-4 MiB regions vs malloc+fill", "fill/cache_reserve", "fill/malloc", 256,
             0.9, false);
  ratio_line(&lines, "  same + look_up_or_insert (checksums the bytes)", "fill/cache_reserve_insert", "fill/malloc",
             256, 0, true);
  if (has_value("reserve10k/mappings")) {
    const double m = value("reserve10k/mappings");
    const std::string text = f("%.0f mappings (%.0f kernel VMA(s), %.0f MiB file)", m, value("reserve10k/vmas"),
                               value("reserve10k/file_bytes") / (1 << 20));
    lines.push_back({"mappings after 10,000 reserves of 16 B..256 KiB", text, "(a count)", "<= 40", m <= 40, -1});
  }
  if (has_time("warm/lookup_none")) {
    const double w = median_time("warm/lookup_none"), c = median_time("warm/lookup_none", true);
    lines.push_back({"warm open + 10,000 look-ups, Verify::none", f("%.2f ms", w * 1e3), f("%.2f ms", c * 1e3),
                     "< 5 ms", w < 5e-3, c < 5e-3});
  }
  // The same open taken apart (bench_open.cpp): informational rows, no target of their own.
  auto info_line = [&](const char* label, const char* name, double scale, const char* unit) {
    if (!has_time(name)) return;
    lines.push_back({label, f("%.2f ", median_time(name) * scale) + unit,
                     f("%.2f ", median_time(name, true) * scale) + unit, "(info)", -1, -1});
  };
  info_line("  of which: open, index of 10,000 (none)", "open/index_10k_none", 1e3, "ms");
  info_line("  of which: 10,000 look-ups", "open/look_ups_10k_none", 1e3, "ms");
  info_line("  open, index of 10,000 (Verify::shared)", "open/index_10k_shared", 1e3, "ms");
  info_line("  fixed: fstatfs of the cache file", "open/fixed/statfs", 1e6, "us");
  info_line("  fixed: the boot id", "open/fixed/boot_id", 1e6, "us");
  info_line("  fixed: lock file opened and locked", "open/fixed/lock_file", 1e6, "us");
  info_line("  fixed: verification record read", "open/fixed/record_read", 1e6, "us");
  info_line("  fixed: verify-ahead thread start", "open/fixed/thread_start", 1e6, "us");
  slowdown_line(&lines, "warm open + look-ups + read all (first_use) vs mmap+read", "warm/lookup_read_first_use",
                "warm/mmap_read_floor", 2.0, false);
  slowdown_line(&lines, "  same without verify-ahead (checksums on one core)", "warm/lookup_read_first_use_one_thread",
                "warm/mmap_read_floor", 0, true);
  slowdown_line(&lines, "  same with Verify::none vs mmap+read", "warm/lookup_read_none", "warm/mmap_read_floor", 0,
                true);
  // A NONE writer's pages (bench_none_pages.cpp): the first Verify::shared reader writes them back.
  slowdown_line(&lines, "first shared reader of 1 GiB after a none writer vs a full one", "none_pages/none_no_start/reader",
                "none_pages/full/reader", 0, true);
  slowdown_line(&lines, "  same, write-back started at the none writer's finalize", "none_pages/none/reader",
                "none_pages/full/reader", 0, true);
  slowdown_line(&lines, "  none writer's finalize: write-back started vs not", "none_pages/none/writer_finalize",
                "none_pages/none_no_start/writer_finalize", 0, true);
  slowdown_line(&lines, "  none writer's close (after finalize): write-back started vs not", "none_pages/none/writer_close",
                "none_pages/none_no_start/writer_close", 0, true);
  slowdown_line(&lines, "  full writer's finalize vs none's with write-back started", "none_pages/full/writer_finalize",
                "none_pages/none/writer_finalize", 0, true);
  ratio_line(&lines, "demo model 576 MiB: warm load vs pack to heap", "model/load_warm", "model/pack_heap", 0, 20,
             false);
  ratio_line(&lines, "  same without verify-ahead (checksums on one core)", "model/load_warm_one_thread",
             "model/pack_heap", 0, 0, true);
  ratio_line(&lines, "  Verify::shared (default), after one verified launch, vs pack to heap", "model/load_warm_shared",
             "model/pack_heap", 0, 0, true);
  ratio_line(&lines, "  lazy warm load (Verify::none, nothing read) vs pack to heap", "model/load_warm_lazy",
             "model/pack_heap", 0, 0, true);
  ratio_line(&lines, "  warm load + read every byte again vs pack to heap", "model/load_warm_read", "model/pack_heap",
             0, 0, true);
  ratio_line(&lines, "  warm load vs XNNPACK creating its FC operators (packing)", "model/load_warm",
             "model/pack_xnnpack", 0, 20, false);
  ratio_line(&lines, "  warm load vs pack into the cache (the cold run)", "model/load_warm", "model/pack_cache", 0, 0,
             true);
  slowdown_line(&lines, "warm open + look-ups + read all (first_use) vs pread to heap", "warm/lookup_read_first_use",
                "warm/pread_heap", 1.0, false);
  // Issue 6.2: our chunked mappings vs one ftruncate + mmap per reserve.
  ratio_line(&lines, "10,000 reserves: chunked vs ftruncate+mmap per reserve", "strategy/ours/reserve",
             "strategy/executorch/reserve", 0, 1.0, false);
  ratio_line(&lines, "  10,000 weights reserve+fill: chunked vs per-reserve mmap", "strategy/ours/fill",
             "strategy/executorch/fill", 0, 1.0, false);
  ratio_line(&lines, "  same + look_up_or_insert (ours only) vs per-reserve mmap", "strategy/ours/fill_insert",
             "strategy/executorch/fill", 0, 0, true);
  if (has_sample("strategy/ours/vmas") && has_sample("strategy/executorch/vmas")) {
    const double o = median_sample("strategy/ours/vmas"), e = median_sample("strategy/executorch/vmas");
    lines.push_back({"  file mappings (/proc/self/maps): chunked vs per-reserve",
                     f("%.0f vs %.0f lines", o, e),
                     f("file %.0f vs %.0f MiB", median_sample("strategy/ours/file_bytes") / (1 << 20),
                       median_sample("strategy/executorch/file_bytes") / (1 << 20)),
                     "<= 40", o <= 40, -1});
  }
  // Issue 6.4: a cold page cache; a hit must still beat repacking.
  ratio_line(&lines, "cold page cache: load (first_use) vs pack to heap", "cold/first_use", "model/pack_heap", 0, 1.0,
             false);
  for (const char* v : {"on_open", "first_use_willneed", "first_use_prefetch_thread", "none_read", "none_willneed_read",
                        "none_populate_read", "mmap_read_floor", "pread_heap"}) {
    ratio_line(&lines, std::string("  cold ") + v + " vs pack to heap", ("cold/" + std::string(v)).c_str(),
               "model/pack_heap", 0, 0, true);
  }
  if (lines.empty()) return;
  std::fprintf(out,
               "\nweightcache benchmark summary: medians; every ratio is against a baseline measured in this run\n");
  std::fprintf(out, "scratch files: %s (%s)\n\n", scratch_dir().c_str(), scratch_fs_type().c_str());
  std::fprintf(out, "  %-62s %-44s %-44s %-9s %s\n", "", "wall time", "process CPU time", "target", "wall / cpu");
  for (const auto& l : lines) {
    std::string v;
    if (l.pass_wall >= 0)
      v = std::string(verdict(l.pass_wall)) + (l.pass_cpu >= 0 ? std::string(" / ") + verdict(l.pass_cpu) : "");
    std::fprintf(out, "  %-62s %-44s %-44s %-9s %s\n", l.what.c_str(), l.wall.c_str(), l.cpu.c_str(), l.target.c_str(),
                 v.c_str());
  }
  print_tables(out);
  std::fflush(out);
}

}  // namespace

int main(int argc, char** argv) {
  // A fixed threshold (which also turns off glibc's adaptive one) makes every large malloc a
  // fresh mmap, so the heap baselines pay for first-touch page faults as a first pack does.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  // Machine-readable output on stdout keeps stdout clean: the summary goes to stderr then.
  std::FILE* summary_out = stdout;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--benchmark_format=", 0) == 0 && a != "--benchmark_format=console") summary_out = stderr;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (scratch_fs_type() == "tmpfs")
    std::fprintf(stderr, "weightcache-bench: warning: %s is on tmpfs; set WEIGHTCACHE_BENCH_DIR to a disk directory\n",
                 scratch_dir().c_str());
  benchmark::RunSpecifiedBenchmarks();
  print_summary(summary_out);
  write_plot_data();
  benchmark::Shutdown();
  return 0;
}
