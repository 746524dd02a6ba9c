// weightcache-xnn-run: launches of a real XNNPACK runtime over a transformer-shaped model, with
// and without weightcache, as a runtime built on XNNPACK would do them (see --help).
//   launch  one launch in this process: map the model, create the XNNPACK runtime (through
//           weightcache, through XNNPACK's own in-memory weights cache, or packing into private
//           memory), run it once, print one line of key=value figures;
//   demo    for f32 and qc4w: a launch without weightcache, a cold one and a warm one, each in a
//           new process, side by side (scripts/demo runs it).
#include "../common/cache_info.hpp"
#include "../common/self_exe.hpp"
#include "proc_smaps.hpp"
#include "xnn_mlp.hpp"

#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>
#include <xnnpack.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

const char kUsage[] =
    "usage: weightcache-xnn-run launch --model FILE [model options] [--cache FILE | --no-cache | --xnn-cache]\n"
    "                                  [--fresh] [--verify shared|first_use|none] [--threads N] [--batch N]\n"
    "                                  [--runtimes K] [--hold]\n"
    "       weightcache-xnn-run demo [--dir DIR] [model options]\n"
    "model options: --dtype f32|qc8w|qc4w (default f32) --layers N (8) --dim N (2048) --hidden N (5632)\n"
    "               --attention (four dim x dim projections per layer too) --seed N; the model file\n"
    "               is written first when it is missing or of another shape\n"
    "\n"
    "launch: one launch of an XNNPACK runtime over the model (its weights mapped from the model file):\n"
    "  --prebuilt-dir DIR  serve a prebuilt cache from DIR written for this key, else --cache\n"
    "  --cache FILE   pack through weightcache's XNNPACK adapter into FILE (finalized after the first\n"
    "                 runtime); a warm launch maps the packed weights instead of packing\n"
    "  --no-cache     XNNPACK packs into private memory (the baseline)\n"
    "  --xnn-cache    XNNPACK's own in-memory weights cache (xnn_create_weights_cache): only later\n"
    "                 runtimes of this process (--runtimes) reuse what the first packed\n"
    "  --fresh        delete the cache file first (a cold launch)\n"
    "  --runtimes K   create K runtimes one after another, the earlier ones kept alive (default 1)\n"
    "  --hold         after the line, wait for a line on stdin, print a memory line, wait for end of input\n"
    "Prints: launch key=value ... (times in ms, memory in bytes). Exit 0, or 2 with a message.\n"
    "\n"
    "demo: for f32 and qc4w, three launches in new processes: without weightcache, cold, warm;\n"
    "their runtime-creation time and memory side by side. --dir holds the models and caches\n"
    "(default $XDG_CACHE_HOME/weightcache/xnn-demo, else ~/.cache/weightcache/xnn-demo).\n";

enum class CacheMode { weightcache, none, xnn };

struct Args {
  std::string command;
  std::string model, cache, dir, prebuilt_dir;
  xnnmlp::DType dtype = xnnmlp::DType::f32;
  xnnmlp::Shape shape;
  std::uint64_t seed = 1;
  CacheMode mode = CacheMode::weightcache;
  bool fresh = false, hold = false;
  wc_verify verify = WC_VERIFY_SHARED;
  std::size_t threads = 2, batch = 1, runtimes = 1;
};

bool number(const char* s, std::size_t* out) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v == 0 || v > (1ull << 20)) return false;
  *out = static_cast<std::size_t>(v);
  return true;
}

int parse(int argc, char** argv, Args* a) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  a->command = argv[1];
  if (a->command != "launch" && a->command != "demo") {
    std::fprintf(stderr, "weightcache-xnn-run: unknown command '%s'\n%s", argv[1], kUsage);
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string o = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto bad = [&](const char* what) {
      std::fprintf(stderr, "weightcache-xnn-run: %s needs %s\n", o.c_str(), what);
      return 2;
    };
    std::size_t n = 0;
    if (o == "--model" && v) a->model = argv[++i];
    else if (o == "--cache" && v) a->cache = argv[++i], a->mode = CacheMode::weightcache;
    else if (o == "--dir" && v) a->dir = argv[++i];
    else if (o == "--prebuilt-dir" && v) a->prebuilt_dir = argv[++i];
    else if (o == "--no-cache") a->mode = CacheMode::none;
    else if (o == "--xnn-cache") a->mode = CacheMode::xnn;
    else if (o == "--fresh") a->fresh = true;
    else if (o == "--hold") a->hold = true;
    else if (o == "--attention") a->shape.attention = true;
    else if (o == "--dtype") {
      if (!v || !xnnmlp::dtype_from_name(argv[++i], &a->dtype)) return bad("f32, qc8w or qc4w");
    } else if (o == "--verify") {
      const std::string m = v ? argv[++i] : "";
      if (m == "shared") a->verify = WC_VERIFY_SHARED;
      else if (m == "first_use") a->verify = WC_VERIFY_FIRST_USE;
      else if (m == "none") a->verify = WC_VERIFY_NONE;
      else return bad("shared, first_use or none");
    } else if (o == "--layers" || o == "--dim" || o == "--hidden" || o == "--threads" || o == "--batch" ||
               o == "--runtimes" || o == "--seed") {
      if (!number(v, &n)) return bad("a positive number");
      ++i;
      if (o == "--layers") a->shape.layers = n;
      else if (o == "--dim") a->shape.dim = n;
      else if (o == "--hidden") a->shape.hidden = n;
      else if (o == "--threads") a->threads = n;
      else if (o == "--batch") a->batch = n;
      else if (o == "--runtimes") a->runtimes = n;
      else a->seed = n;
    } else {
      std::fprintf(stderr, "weightcache-xnn-run: unknown or incomplete option '%s'\n", o.c_str());
      return 2;
    }
  }
  if (a->command == "launch" && a->model.empty()) {
    std::fputs("weightcache-xnn-run: launch needs --model FILE\n", stderr);
    return 2;
  }
  if (a->command == "launch" && a->mode == CacheMode::weightcache && a->cache.empty()) {
    std::fputs("weightcache-xnn-run: launch needs --cache FILE, --no-cache or --xnn-cache\n", stderr);
    return 2;
  }
  return -1;
}

int die(const std::string& what) {
  std::fprintf(stderr, "weightcache-xnn-run: %s\n", what.c_str());
  return 2;
}

// Pss of this process's anonymous memory (where XNNPACK's private packed copies live), bytes.
std::uint64_t anon_pss() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Pss_Anon:", 0) == 0) return std::strtoull(line.c_str() + 9, nullptr, 10) * 1024;
  return 0;
}

// ---- launch -------------------------------------------------------------------------------------

int launch(const Args& a) {
  std::string err;
  if (!xnnmlp::ModelFile::ensure(a.model, a.dtype, a.shape, a.seed, &err)) return die(err);
  xnnmlp::ModelFile model;
  if (!model.open(a.model, &err)) return die(err);
  if (xnn_initialize(nullptr) != xnn_status_success) return die("xnn_initialize failed (an unsupported CPU?)");
  pthreadpool_t pool = a.threads > 1 ? pthreadpool_create(a.threads) : nullptr;
  const std::uint64_t anon_before = anon_pss();

  wc_cache* cache = nullptr;
  wc_xnn_adapter* adapter = nullptr;
  xnn_weights_cache_t xnn_cache = nullptr;
  std::vector<std::unique_ptr<xnnmlp::Runtime>> runtimes;
  std::vector<double> create_ms;
  double open_ms = 0, finalize_ms = 0, run_ms = 0;
  std::uint64_t output = 0;
  std::string where;

  if (a.mode == CacheMode::weightcache && a.fresh) {  // before the clock starts: not part of a launch
    std::error_code ec;
    std::filesystem::remove(a.cache, ec);
    std::filesystem::remove(a.cache + ".lock", ec);
  }
  const auto t_open = Clock::now();
  if (a.mode == CacheMode::weightcache) {
    const auto key = xnnmlp::compat_key(model);
    if (key.empty()) return die("cannot build the compatibility key");
    wc_options o;
    wc_options_init(&o);
    o.path = a.cache.c_str();
    o.compat_key = key.data();
    o.compat_key_size = key.size();
    o.verify = a.verify;
    if (!a.prebuilt_dir.empty()) o.prebuilt_dir = a.prebuilt_dir.c_str();
    if (wc_open(&o, &cache) != WC_OK) return die(std::string("wc_open: ") + wc_last_error());
    if (wc_xnn_adapter_create(cache, &adapter) != WC_OK || !model.name_buffers(adapter))
      return die(std::string("adapter: ") + wc_last_error());
    xnn_cache = static_cast<xnn_weights_cache_t>(wc_xnn_adapter_provider(adapter));
    open_ms = ms_since(t_open);
  } else if (a.mode == CacheMode::xnn) {
    if (xnn_create_weights_cache(&xnn_cache) != xnn_status_success) return die("xnn_create_weights_cache failed");
    open_ms = ms_since(t_open);
  }
  for (std::size_t r = 0; r < a.runtimes; ++r) {
    const auto t0 = Clock::now();
    auto rt = std::make_unique<xnnmlp::Runtime>();
    if (rt->create(model, xnn_cache, pool, a.batch, &where) != xnn_status_success)
      return die("creating the XNNPACK runtime failed at: " + where);
    create_ms.push_back(ms_since(t0) + (r == 0 ? open_ms : 0));
    if (r == 0) {
      const auto t_fin = Clock::now();
      // A prebuilt cache is read-only: what it lacked stays in heap memory, nothing to finalize.
      if (a.mode == CacheMode::weightcache && !wc_is_finalized(cache) && !weightcache::example::is_prebuilt(cache) &&
          wc_finalize(cache) != WC_OK)
        return die(std::string("wc_finalize: ") + wc_last_error());
      if (a.mode == CacheMode::xnn &&
          xnn_finalize_weights_cache(xnn_cache, xnn_weights_cache_finalization_kind_soft) != xnn_status_success)
        return die("xnn_finalize_weights_cache failed");
      finalize_ms = ms_since(t_fin);
      const auto t_run = Clock::now();
      if (rt->run(&output, &where) != xnn_status_success) return die("running the model failed at: " + where);
      run_ms = ms_since(t_run);
    }
    runtimes.push_back(std::move(rt));
  }

  std::ostringstream line;
  line << "launch mode=" << (a.mode == CacheMode::weightcache ? "weightcache" : a.mode == CacheMode::none ? "none" : "xnn")
       << " dtype=" << xnnmlp::dtype_name(a.dtype) << " weights=" << model.weight_bytes();
  char buf[64];
  for (std::size_t r = 0; r < create_ms.size(); ++r) {
    std::snprintf(buf, sizeof buf, " create%zu_ms=%.3f", r + 1, create_ms[r]);
    line << buf;
  }
  std::snprintf(buf, sizeof buf, " open_ms=%.3f finalize_ms=%.3f run_ms=%.3f", open_ms, finalize_ms, run_ms);
  line << buf;
  std::snprintf(buf, sizeof buf, " output=%016" PRIx64, output);
  line << buf;
  if (adapter != nullptr) {
    wc_xnn_adapter_stats as;
    wc_xnn_adapter_stats_init(&as);
    wc_stats cs;
    wc_stats_init(&cs);
    if (wc_xnn_adapter_get_stats(adapter, &as) == WC_OK && wc_get_stats(cache, &cs) == WC_OK)
      line << " look_ups=" << as.look_ups << " hits=" << as.hits << " reservations=" << as.reservations
           << " unnamed_inserts=" << as.unnamed_inserts << " cache_bytes=" << cs.mapped_bytes
           << " trusted_entries=" << cs.trusted_entries << " verify_failures=" << cs.verify_failures
           << " prebuilt=" << cs.prebuilt
           << " backing=" << (cs.backing == WC_BACKING_FILE ? "file" : "heap");
  }
  auto memory = [&] {
    std::ostringstream m;
    const std::uint64_t anon = anon_pss();
    m << "anon_pss_delta=" << (anon > anon_before ? anon - anon_before : 0);
    if (a.mode == CacheMode::weightcache)
      m << " cache_pss=" << weightcache::smaps::file_mapping_usage(a.cache).pss;
    m << " model_pss=" << weightcache::smaps::file_mapping_usage(a.model).pss;
    return m.str();
  };
  if (!a.hold) line << " " << memory();
  std::cout << line.str() << std::endl;
  if (a.hold) {  // the caller measures all its processes at one moment
    std::string got;
    std::getline(std::cin, got);
    std::cout << "memory " << memory() << std::endl;
    while (std::getline(std::cin, got)) {
    }
  }
  runtimes.clear();
  if (adapter != nullptr) wc_xnn_adapter_destroy(adapter);
  if (cache != nullptr) wc_close(cache);
  if (xnn_cache != nullptr && a.mode == CacheMode::xnn) xnn_delete_weights_cache(xnn_cache);
  if (pool != nullptr) pthreadpool_destroy(pool);
  return 0;
}

// ---- demo ---------------------------------------------------------------------------------------

std::map<std::string, std::string> fields(const std::string& line) {
  std::map<std::string, std::string> f;
  std::istringstream in(line);
  std::string kv;
  while (in >> kv)
    if (auto eq = kv.find('='); eq != std::string::npos) f[kv.substr(0, eq)] = kv.substr(eq + 1);
  return f;
}

// Runs this program with `args` in a new process and returns its "launch" line's fields.
bool child(const std::vector<std::string>& args, std::map<std::string, std::string>* out) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::vector<char*> argv;
  std::string self = weightcache::examples::self_exe();
  argv.push_back(self.data());
  std::vector<std::string> copy = args;
  for (auto& s : copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return false;
  }
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  *out = fields(text);
  return out->count("create1_ms") != 0;
}

std::string mib(const std::string& bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", std::strtod(bytes.c_str(), nullptr) / (1 << 20));
  return buf;
}

int demo(const Args& a) {
  std::string dir = a.dir;
  if (dir.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    dir = xdg && *xdg ? std::string(xdg) + "/weightcache/xnn-demo"
                      : std::string(home && *home ? home : ".") + "/.cache/weightcache/xnn-demo";
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::printf("XNNPACK runtime (%s), %zu layers of %zux%zu + %zux%zu fully-connected, batch 1, %zu threads\n",
              xnn_experimental_get_build_identifier_size() ? "built from source" : "?", a.shape.layers, a.shape.hidden,
              a.shape.dim, a.shape.dim, a.shape.hidden, a.threads);
  std::printf("files in %s\n\n", dir.c_str());
  std::printf("%-5s %-30s %12s %11s %14s %s\n", "dtype", "launch (each a new process)", "create (ms)", "vs packing",
              "packed memory", "what happened");
  int rc = 0;
  for (xnnmlp::DType t : {xnnmlp::DType::f32, xnnmlp::DType::qc4w}) {
    const std::string name = xnnmlp::dtype_name(t);
    const std::string model = dir + "/model-" + name + ".bin", cache = dir + "/model-" + name + ".wcache";
    std::string err;
    std::fflush(stdout);
    if (!xnnmlp::ModelFile::ensure(model, t, a.shape, a.seed, &err)) return die(err);
    std::vector<std::string> base = {"launch",   "--model",  model,
                                     "--dtype",  name,       "--layers",
                                     std::to_string(a.shape.layers), "--dim", std::to_string(a.shape.dim),
                                     "--hidden", std::to_string(a.shape.hidden), "--seed", std::to_string(a.seed)};
    if (a.shape.attention) base.push_back("--attention");
    std::map<std::string, std::string> none, cold, warm, later;
    auto with = [&](std::vector<std::string> extra) {
      auto v = base;
      v.insert(v.end(), extra.begin(), extra.end());
      return v;
    };
    if (!child(with({"--no-cache"}), &none) || !child(with({"--cache", cache, "--fresh"}), &cold))
      return die("a launch failed (run it by hand: weightcache-xnn-run launch --help)");
    // A file state changed less than 2 s ago is never trusted across processes (a change within
    // the file system's time granularity could hide in it): let the cold launch's commit settle.
    std::this_thread::sleep_for(std::chrono::milliseconds(2200));
    if (!child(with({"--cache", cache}), &warm) || !child(with({"--cache", cache}), &later))
      return die("a launch failed (run it by hand: weightcache-xnn-run launch --help)");
    const double pack = std::strtod(none["create1_ms"].c_str(), nullptr);
    auto row = [&](const char* what, std::map<std::string, std::string>& f, const std::string& memory,
                   const std::string& note) {
      const double ms = std::strtod(f["create1_ms"].c_str(), nullptr);
      char ratio[32] = "";
      if (&f != &none) std::snprintf(ratio, sizeof ratio, "%.1fx", pack / ms);
      std::printf("%-5s %-30s %12.2f %11s %14s %s\n", name.c_str(), what, ms, ratio, mib(memory).c_str(),
                  note.c_str());
    };
    row("no weightcache (packs)", none, none["anon_pss_delta"], "private to this process");
    row("cold (packs into the cache)", cold, cold["cache_pss"],
        cold["reservations"] + " packings; finalize " + cold["finalize_ms"] + " ms more");
    row("warm, 1st process (verifies)", warm, warm["cache_pss"],
        warm["reservations"] + " packings, " + warm["hits"] + "/" + warm["look_ups"] + " hits, all bytes hashed once");
    row("warm, every later process", later, later["cache_pss"],
        later["reservations"] + " packings, " + later["trusted_entries"] + " entries on that verification");
    bool packed = cold["reservations"] == "0";
    for (auto* f : {&warm, &later}) packed = packed || (*f)["reservations"] != "0" || (*f)["hits"] != (*f)["look_ups"];
    if (packed) {
      std::printf("%-5s A WARM LAUNCH PACKED (or the cold one did not): %s reservations cold, %s and %s warm\n",
                  name.c_str(), cold["reservations"].c_str(), warm["reservations"].c_str(),
                  later["reservations"].c_str());
      rc = 1;
    }
    if (none["output"] != cold["output"] || none["output"] != warm["output"] || none["output"] != later["output"]) {
      std::printf("%-5s OUTPUTS DIFFER: %s (no cache) %s (cold) %s %s (warm)\n", name.c_str(), none["output"].c_str(),
                  cold["output"].c_str(), warm["output"].c_str(), later["output"].c_str());
      rc = 1;
    } else {
      std::printf("%-5s outputs bit-identical in all four launches (%s)\n", name.c_str(), none["output"].c_str());
    }
  }
  std::printf("\n'create' is what a launch waits for before its first inference: for weightcache, opening the\n"
              "cache, naming the weights and XNNPACK's runtime creation; 'packed memory' is the packed weights'\n"
              "proportional share of memory in that process (a warm cache's pages are shared by every process).\n"
              "The first process to map a committed state of the file hashes every byte it serves; later\n"
              "processes trust that verification for as long as the file does not change (docs/DESIGN.md).\n");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (int rc = parse(argc, argv, &a); rc >= 0) return rc;
  return a.command == "launch" ? launch(a) : demo(a);
}
