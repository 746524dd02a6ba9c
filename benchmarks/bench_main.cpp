// weightcache-bench: Google Benchmark runner plus a closing summary that sets each measurement
// against the baseline measured in the same run, with the project's targets.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdio>
#include <string>
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
  slowdown_line(&lines, "warm open + look-ups + read all (first_use) vs mmap+read", "warm/lookup_read_first_use",
                "warm/mmap_read_floor", 2.0, false);
  slowdown_line(&lines, "  same with Verify::none vs mmap+read", "warm/lookup_read_none", "warm/mmap_read_floor", 0,
                true);
  ratio_line(&lines, "demo model 576 MiB: warm load vs pack to heap", "model/load_warm", "model/pack_heap", 0, 20,
             false);
  ratio_line(&lines, "  lazy warm load (Verify::none, nothing read) vs pack to heap", "model/load_warm_lazy",
             "model/pack_heap", 0, 0, true);
  ratio_line(&lines, "  warm load + read every byte again vs pack to heap", "model/load_warm_read", "model/pack_heap",
             0, 0, true);
  ratio_line(&lines, "  warm load vs pack into the cache (the cold run)", "model/load_warm", "model/pack_cache", 0, 0,
             true);
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
  benchmark::Shutdown();
  return 0;
}
