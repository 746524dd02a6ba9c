// weightcache-xnn-bench: a real, current XNNPACK runtime launched in fresh processes
// (weightcache-xnn-run launch), with and without weightcache, side by side in one run:
//  - runtime creation: XNNPACK packing into private memory vs a cold launch packing into the
//    cache vs warm launches (the first verified one, then later ones on its verification, and for
//    comparison per-process first_use verification and no verification), in f32, qc8w and qc4w,
//    for 8 layers of 2048x5632 + 5632x2048 and for the 576 MiB demo model's shape;
//  - the k-th process after a change;
//  - memory of N processes: XNNPACK's private packed copies vs the shared cache (summed Pss);
//  - a second runtime in one process: XNNPACK's own in-memory weights cache vs weightcache.
// Medians over alternating rounds. Before each timed launch the file system is synced and left
// to settle, so that no launch pays for another's writeback (the previous cache file's deletion
// included); a real first launch does not start under 700 MiB of someone else's dirty pages.
// benchmarks/run runs it; docs/BENCHMARKS.md ("A current XNNPACK") records its figures.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Fields = std::map<std::string, std::string>;

std::string g_runner = WEIGHTCACHE_XNN_RUN;
std::string g_dir;
int g_failures = 0;

Fields parse_fields(const std::string& line) {
  Fields f;
  std::istringstream in(line);
  std::string kv;
  while (in >> kv)
    if (auto eq = kv.find('='); eq != std::string::npos) f[kv.substr(0, eq)] = kv.substr(eq + 1);
  return f;
}

double num(const Fields& f, const std::string& k) {
  auto it = f.find(k);
  return it == f.end() ? -1 : std::strtod(it->second.c_str(), nullptr);
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "weightcache-xnn-bench: %s\n", what.c_str());
  std::exit(2);
}

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "weightcache-xnn-bench: CHECK FAILED: %s\n", what.c_str());
  ++g_failures;
}

// A launch in a process of its own, its stdin and stdout piped to us.
struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;
  std::string buffered;

  void start(const std::vector<std::string>& args) {
    int to[2], from[2];
    if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0) die("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    std::vector<std::string> all = {g_runner};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : all) argv.push_back(s.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid, g_runner.c_str(), &fa, nullptr, argv.data(), environ) != 0)
      die("cannot start " + g_runner);
    posix_spawn_file_actions_destroy(&fa);
    ::close(to[0]);
    ::close(from[1]);
    in = to[1];
    out = from[0];
  }
  // The next line the child prints ("" at end of output).
  std::string line() {
    for (;;) {
      if (auto nl = buffered.find('\n'); nl != std::string::npos) {
        std::string l = buffered.substr(0, nl);
        buffered.erase(0, nl + 1);
        return l;
      }
      char buf[4096];
      const ssize_t n = ::read(out, buf, sizeof buf);
      if (n <= 0) {
        std::string l;
        l.swap(buffered);
        return l;
      }
      buffered.append(buf, static_cast<std::size_t>(n));
    }
  }
  void say(const char* s) {
    if (::write(in, s, std::strlen(s)) < 0) die("cannot write to a launch");
  }
  int finish() {
    if (in >= 0) ::close(in);
    while (!line().empty()) {
    }
    ::close(out);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }
};

// No writeback in flight when a timed launch starts.
void settle() {
  ::sync();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

// A launch right after the previous one ended: no sync, no pause (`settle_first` false).
Fields launch(const std::vector<std::string>& args, bool settle_first = true) {
  if (settle_first) settle();
  Child c;
  c.start(args);
  const std::string l = c.line();
  const int status = c.finish();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || l.rfind("launch ", 0) != 0) {
    std::string cmd;
    for (const auto& a : args) cmd += " " + a;
    die("launch failed:" + cmd);
  }
  return parse_fields(l);
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct ModelCase {
  std::string label;   // in tables and data files
  std::string dtype;
  std::vector<std::string> shape;  // model options
};

std::string model_path(const ModelCase& m) { return g_dir + "/" + m.label + ".model"; }
std::string cache_path(const ModelCase& m) { return g_dir + "/" + m.label + ".wcache"; }

std::vector<std::string> base_args(const ModelCase& m) {
  std::vector<std::string> a = {"launch", "--model", model_path(m), "--dtype", m.dtype};
  a.insert(a.end(), m.shape.begin(), m.shape.end());
  return a;
}

std::vector<std::string> with(std::vector<std::string> a, std::initializer_list<std::string> extra) {
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

void remove_cache(const ModelCase& m) {
  std::error_code ec;
  std::filesystem::remove(cache_path(m), ec);
  std::filesystem::remove(cache_path(m) + ".lock", ec);
}

struct Series {
  std::vector<double> pack, cold, cold_finalize, first_verified, trusted, first_use, none;
  std::vector<std::vector<double>> kth;  // [k-1][round]
  std::vector<std::vector<double>> kth_no_pause;  // the same, each launched right after the last
  double weights = 0, cache_bytes = 0;
};

constexpr int kProcesses = 6;  // k = 1 (cold) .. 6

Series measure_launches(const ModelCase& m, int rounds) {
  Series s;
  s.kth.resize(kProcesses);
  s.kth_no_pause.resize(kProcesses);
  const auto args = base_args(m);
  std::string output;
  auto same_output = [&](const Fields& f, const char* what) {
    if (output.empty()) output = f.at("output");
    check(f.at("output") == output, m.label + ": " + what + " output differs from XNNPACK's without a cache");
  };
  // The k-th process (k >= 2) after a change, checked: it packs nothing and hits every look-up;
  // the second verifies everything, every later one trusts all of it.
  auto warm_launch = [&](int k, bool settle_first, const char* what) {
    const Fields w = launch(with(args, {"--cache", cache_path(m)}), settle_first);
    same_output(w, what);
    check(num(w, "reservations") == 0 && num(w, "hits") == num(w, "look_ups"),
          m.label + ": a warm launch packed something");
    check(num(w, "verify_failures") == 0, m.label + ": verification failed");
    if (k == 2)
      check(num(w, "trusted_entries") == 0, m.label + ": the first process after a change must verify everything");
    else
      check(num(w, "trusted_entries") == num(w, "look_ups"),
            m.label + ": " + what + ", process " + std::to_string(k) +
                " re-hashed entries the process before it had verified");
    return w;
  };
  for (int r = 0; r < rounds; ++r) {
    const Fields pack = launch(with(args, {"--no-cache"}));
    same_output(pack, "no-cache");
    s.pack.push_back(num(pack, "create1_ms"));
    s.weights = num(pack, "weights");

    remove_cache(m);
    const Fields cold = launch(with(args, {"--cache", cache_path(m)}));
    same_output(cold, "cold");
    check(num(cold, "reservations") == num(cold, "look_ups") && num(cold, "hits") == 0,
          m.label + ": a cold launch should pack every node");
    s.cold.push_back(num(cold, "create1_ms"));
    s.cold_finalize.push_back(num(cold, "create1_ms") + num(cold, "finalize_ms"));
    s.cache_bytes = num(cold, "cache_bytes");
    s.kth[0].push_back(num(cold, "create1_ms"));
    // Past every file system's change-time window (2 s at most), as a later launch would be.
    std::this_thread::sleep_for(std::chrono::milliseconds(2200));

    for (int k = 2; k <= kProcesses; ++k) {
      const Fields w = warm_launch(k, true, "warm");
      s.kth[k - 1].push_back(num(w, "create1_ms"));
      (k == 2 ? s.first_verified : s.trusted).push_back(num(w, "create1_ms"));
    }
    // Back to back: a cold launch, then fresh processes each started the moment the last one
    // ended, as a pool of workers after a deployment. The first warm one verifies; on a file
    // system with nanosecond change times its state is then past the window (10 ms), so it
    // records what it verified and every later one trusts it.
    remove_cache(m);
    const Fields cold2 = launch(with(args, {"--cache", cache_path(m)}));
    same_output(cold2, "cold");
    s.kth_no_pause[0].push_back(num(cold2, "create1_ms"));
    for (int k = 2; k <= kProcesses; ++k) {
      const Fields w = warm_launch(k, false, "warm, no pause");
      s.kth_no_pause[k - 1].push_back(num(w, "create1_ms"));
    }
    const Fields fu = launch(with(args, {"--cache", cache_path(m), "--verify", "first_use"}));
    same_output(fu, "first_use");
    s.first_use.push_back(num(fu, "create1_ms"));
    const Fields nv = launch(with(args, {"--cache", cache_path(m), "--verify", "none"}));
    same_output(nv, "verify none");
    s.none.push_back(num(nv, "create1_ms"));
  }
  return s;
}

// N processes at once, each with its runtime alive after one inference: summed Pss.
struct Memory {
  double cached = 0, private_copies = 0, one_copy = 0;
};

Memory measure_memory(const ModelCase& m, int n) {
  Memory out;
  for (bool cached : {true, false}) {
    std::vector<Child> kids(n);
    auto args = base_args(m);
    if (cached) args = with(args, {"--cache", cache_path(m), "--hold"});
    else args = with(args, {"--no-cache", "--hold"});
    settle();
    for (auto& k : kids) k.start(args);
    for (auto& k : kids) {
      const Fields f = parse_fields(k.line());
      if (cached) out.one_copy = num(f, "cache_bytes");
    }
    for (auto& k : kids) k.say("measure\n");
    double sum = 0;
    for (auto& k : kids) {
      const Fields f = parse_fields(k.line());
      sum += num(f, "anon_pss_delta") + (cached ? num(f, "cache_pss") : 0);
    }
    for (auto& k : kids)
      if (const int st = k.finish(); !WIFEXITED(st) || WEXITSTATUS(st) != 0) die("a memory launch failed");
    (cached ? out.cached : out.private_copies) = sum;
  }
  return out;
}

struct SecondRuntime {
  std::vector<double> xnn_first, xnn_second, wc_second;
};

SecondRuntime measure_second_runtime(const ModelCase& m, int rounds) {
  SecondRuntime s;
  const auto args = base_args(m);
  for (int r = 0; r < rounds; ++r) {
    const Fields x = launch(with(args, {"--xnn-cache", "--runtimes", "2"}));
    s.xnn_first.push_back(num(x, "create1_ms"));
    s.xnn_second.push_back(num(x, "create2_ms"));
    const Fields w = launch(with(args, {"--cache", cache_path(m), "--runtimes", "2"}));
    check(num(w, "reservations") == 0, m.label + ": the second runtime packed");
    s.wc_second.push_back(num(w, "create2_ms"));
  }
  return s;
}

std::string verdict(bool ok) { return ok ? "met" : "MISSED"; }

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string data, only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--dir" && i + 1 < argc) g_dir = argv[++i];
    else if (a == "--data" && i + 1 < argc) data = argv[++i];
    else if (a == "--runner" && i + 1 < argc) g_runner = argv[++i];
    else if (a == "--models" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: weightcache-xnn-bench [--rounds N (5)] [--dir DIR (scratch: models and caches)]\n"
                   "                             [--data DIR (plot data)] [--runner PATH]\n"
                   "                             [--models A,B (only the models whose label contains one)]\n");
      return 2;
    }
  }
  if (g_dir.empty()) g_dir = WEIGHTCACHE_XNN_BENCH_DEFAULT_DIR;
  std::filesystem::create_directories(g_dir);
  if (!data.empty()) std::filesystem::create_directories(data);

  const std::vector<std::string> big = {"--layers", "8", "--dim", "2048", "--hidden", "5632"};
  const std::vector<std::string> demo = {"--layers", "12", "--dim", "1024", "--hidden", "4096", "--attention"};
  std::vector<ModelCase> cases = {{"8x2048x5632-f32", "f32", big},
                                  {"8x2048x5632-qc8w", "qc8w", big},
                                  {"8x2048x5632-qc4w", "qc4w", big},
                                  {"demo576-f32", "f32", demo}};
  if (!only.empty()) {
    std::vector<ModelCase> kept;
    std::istringstream names(only);
    std::vector<std::string> wanted;
    for (std::string n; std::getline(names, n, ',');) wanted.push_back(n);
    for (const auto& m : cases)
      if (std::any_of(wanted.begin(), wanted.end(), [&](const std::string& n) { return m.label.find(n) != std::string::npos; }))
        kept.push_back(m);
    if (kept.empty()) die("--models " + only + " names no model");
    cases = kept;
  }
  std::printf("weightcache-xnn-bench: %d rounds, medians; scratch in %s\n", rounds, g_dir.c_str());
  for (const auto& m : cases) launch(with(base_args(m), {"--no-cache"}));  // writes the model files

  std::printf("\n## Runtime creation, fresh processes (ms; ratio = XNNPACK packing / this)\n\n");
  std::printf("| model | weights MiB | XNNPACK packs | cold: create | cold + finalize | warm, 1st verified | "
              "warm, later (shared) | warm, first_use | warm, no verify |\n|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::pair<ModelCase, Series>> all;
  for (const auto& m : cases) {
    Series s = measure_launches(m, rounds);
    const double p = median(s.pack);
    auto cell = [p](const std::vector<double>& v) {
      char b[64];
      std::snprintf(b, sizeof b, "%.2f (%.3gx)", median(v), p / median(v));
      return std::string(b);
    };
    std::printf("| %s | %.0f | %.1f | %s | %s | %s | **%s** | %s | %s |\n", m.label.c_str(), s.weights / (1 << 20), p,
                cell(s.cold).c_str(), cell(s.cold_finalize).c_str(), cell(s.first_verified).c_str(),
                cell(s.trusted).c_str(), cell(s.first_use).c_str(), cell(s.none).c_str());
    std::fflush(stdout);
    all.emplace_back(m, std::move(s));
  }

  std::printf("\n## The k-th process after a change (create, ms; k = 1 packs, k = 2 verifies, later ones trust it)\n\n|"
              " model |");
  for (int k = 1; k <= kProcesses; ++k) std::printf(" k=%d |", k);
  std::printf("\n|---|");
  for (int k = 1; k <= kProcesses; ++k) std::printf("---|");
  std::printf("\n");
  for (const auto& [m, s] : all) {
    std::printf("| %s |", m.label.c_str());
    for (int k = 1; k <= kProcesses; ++k) std::printf(" %.2f |", median(s.kth[k - 1]));
    std::printf("\n| %s, no pause |", m.label.c_str());
    for (int k = 1; k <= kProcesses; ++k) std::printf(" %.2f |", median(s.kth_no_pause[k - 1]));
    std::printf("\n");
  }
  std::printf("\nNo pause, from the second warm process on (k >= 3), against XNNPACK packing:\n");
  for (const auto& [m, s] : all) {
    std::vector<double> later;
    for (int k = 3; k <= kProcesses; ++k) later.insert(later.end(), s.kth_no_pause[k - 1].begin(), s.kth_no_pause[k - 1].end());
    const double ratio = median(s.pack) / median(later);
    const double target = m.dtype == "qc4w" ? 50 : m.dtype == "f32" ? 300 : 0;
    if (target > 0)
      std::printf("- %s: %.2f ms, %.0fx (target >= %.0fx): %s\n", m.label.c_str(), median(later), ratio, target,
                  ratio >= target ? "met" : "MISSED");
    else
      std::printf("- %s: %.2f ms, %.0fx\n", m.label.c_str(), median(later), ratio);
  }

  std::printf("\n## Memory of 4 processes running the model at once (summed Pss of the packed weights)\n\n"
              "| model | one copy MiB | 4 x XNNPACK private MiB | 4 x weightcache MiB | weightcache / one copy |\n"
              "|---|---|---|---|---|\n");
  std::vector<std::pair<std::string, Memory>> mems;
  for (const auto& m : cases) {
    if (m.dtype == "qc8w") continue;
    const Memory mem = measure_memory(m, 4);
    std::printf("| %s | %.1f | %.1f | %.1f | %.3fx |\n", m.label.c_str(), mem.one_copy / (1 << 20),
                mem.private_copies / (1 << 20), mem.cached / (1 << 20), mem.cached / mem.one_copy);
    mems.emplace_back(m.label, mem);
  }

  std::printf("\n## A second runtime of the same model in one process (create, ms)\n\n"
              "| model | XNNPACK packs (1st runtime) | 2nd runtime, XNNPACK's in-memory weights cache | "
              "2nd runtime, weightcache (warm) |\n|---|---|---|---|\n");
  for (const auto& m : cases) {
    if (m.dtype == "qc8w") continue;
    const SecondRuntime s = measure_second_runtime(m, rounds);
    std::printf("| %s | %.1f | %.2f | %.2f |\n", m.label.c_str(), median(s.xnn_first), median(s.xnn_second),
                median(s.wc_second));
  }

  std::printf("\n## Targets\n\n");
  for (const auto& [m, s] : all) {
    const double p = median(s.pack), warm = p / median(s.trusted), cold = median(s.cold) / p;
    if (m.label == "8x2048x5632-f32" || m.label == "8x2048x5632-qc4w") {
      const double target = m.dtype == "f32" ? 300 : 50;
      std::printf("- %s warm (later processes) %.0fx faster than XNNPACK packing, target %.0fx: %s\n", m.label.c_str(),
                  warm, target, verdict(warm >= target).c_str());
    }
    std::printf("- %s cold launch %.2fx XNNPACK packing (create), target <= 1.25x: %s; with finalize %.2fx\n",
                m.label.c_str(), cold, verdict(cold <= 1.25).c_str(), median(s.cold_finalize) / p);
  }
  for (const auto& [label, mem] : mems)
    if (label == "8x2048x5632-f32")
      std::printf("- %s: 4 processes hold %.3fx one copy, target <= 1.05x: %s (without the cache: %.2fx)\n",
                  label.c_str(), mem.cached / mem.one_copy, verdict(mem.cached / mem.one_copy <= 1.05).c_str(),
                  mem.private_copies / mem.one_copy);

  if (!data.empty()) {
    std::ofstream d(data + "/xnn_launch.dat");
    d << "# model pack cold first_verified trusted first_use none (ms)\n";
    for (const auto& [m, s] : all)
      d << m.label << " " << median(s.pack) << " " << median(s.cold) << " " << median(s.first_verified) << " "
        << median(s.trusted) << " " << median(s.first_use) << " " << median(s.none) << "\n";
    std::ofstream k(data + "/xnn_kth.dat");
    k << "k";
    for (const auto& [m, s] : all) k << " " << m.label;
    k << "\n";
    for (int i = 1; i <= kProcesses; ++i) {
      k << i;
      for (const auto& [m, s] : all) k << " " << median(s.kth[i - 1]);
      k << "\n";
    }
  }
  for (const auto& m : cases) remove_cache(m);
  if (g_failures) std::printf("\n%d CHECKS FAILED (see stderr)\n", g_failures);
  return g_failures ? 1 : 0;
}
