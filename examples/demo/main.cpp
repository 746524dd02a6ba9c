// weightcache-demo: packs a model-sized set of weights into a cache file (run 1), then launches
// itself again (run 2, a separate process: the first after the change, which checksums every
// byte once) and once more (run 3, as every later launch, which trusts that verification) to
// load the same weights from the file, and prints what each run cost in time and memory. Exits
// nonzero when a warm run finds wrong bytes.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>
#include <weightcache/weight_cache.hpp>

#include "proc_smaps.hpp"
#include "demo_model.hpp"

extern char** environ;

namespace {

namespace wc = weightcache;
namespace demo = weightcache::demo;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- arguments --------------------------------------------------------------------------------

struct Args {
  std::string path;
  bool fresh = false;
  bool help = false;
  std::size_t layers = 0;  // 0: from --size-mib or the default
  std::size_t dim = 1024;
  std::size_t size_mib = 0;
  bool verify_ahead = true;
  // Internal: a warm run (2 or 3), started by run 1.
  bool warm_run = false;
  int report_fd = -1;
  std::optional<std::uint64_t> expect_fingerprint;
};

const char kUsage[] =
    "usage: weightcache-demo [--fresh] [--path FILE] [--size-mib N | --layers N] [--dim N]\n"
    "                        [--no-verify-ahead]\n"
    "\n"
    "Packs a synthetic transformer's f32 weights into GEMM panels through a weightcache file\n"
    "(run 1), then re-executes itself to load them from the file in a new process (run 2, the\n"
    "first after the change: it checksums every byte once) and again (run 3, as every later\n"
    "launch: it trusts run 2's verification), and compares time and memory. Run it twice: the second time both runs find the cache warm.\n"
    "\n"
    "  --fresh         delete the cache file first, so that run 1 packs everything (cold)\n"
    "  --path FILE     cache file (default: $XDG_CACHE_HOME/weightcache/demo.wcache,\n"
    "                  else ~/.cache/weightcache/demo.wcache)\n"
    "  --size-mib N    model size in MiB of f32 weights, rounded to whole layers (default 576)\n"
    "  --layers N      number of layers (each 12*dim^2 floats; default 12)\n"
    "  --dim N         model width (default 1024)\n"
    "  --no-verify-ahead  run 2 checksums each weight only in its own look-up, on one core\n"
    "                  (default: a second thread verifies from the other end of the file)\n"
    "  --help          this text\n"
    "\n"
    "Exit status: 0 when runs 2 and 3 served every weight byte-exact, 1 when one found wrong or missing\n"
    "bytes, 2 on any other failure.\n";

bool parse_size(const std::string& s, std::size_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v == 0 || v > (1ull << 32)) return false;
  *out = static_cast<std::size_t>(v);
  return true;
}

bool parse_args(int argc, char** argv, Args* a, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    bool has_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto need = [&](const char* name) -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) {
        *err = std::string(name) + " needs a value";
        return false;
      }
      value = argv[++i];
      return true;
    };
    auto size_flag = [&](const char* name, std::size_t* out) -> bool {
      if (!need(name)) return false;
      if (!parse_size(value, out)) {
        *err = std::string(name) + " wants a positive integer, got '" + value + "'";
        return false;
      }
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      a->help = true;
    } else if (arg == "--fresh") {
      a->fresh = true;
    } else if (arg == "--no-verify-ahead") {
      a->verify_ahead = false;
    } else if (arg == "--path") {
      if (!need("--path")) return false;
      a->path = value;
    } else if (arg == "--layers") {
      if (!size_flag("--layers", &a->layers)) return false;
    } else if (arg == "--dim") {
      if (!size_flag("--dim", &a->dim)) return false;
    } else if (arg == "--size-mib") {
      if (!size_flag("--size-mib", &a->size_mib)) return false;
    } else if (arg == "--warm-run") {
      a->warm_run = true;
    } else if (arg == "--report-fd") {
      std::size_t fd = 0;
      if (!size_flag("--report-fd", &fd)) return false;
      a->report_fd = static_cast<int>(fd);
    } else if (arg == "--expect-fingerprint") {
      if (!need("--expect-fingerprint")) return false;
      a->expect_fingerprint = std::strtoull(value.c_str(), nullptr, 16);
    } else {
      *err = "unknown argument '" + arg + "'";
      return false;
    }
  }
  if (a->size_mib != 0 && a->layers != 0) {
    *err = "give --size-mib or --layers, not both";
    return false;
  }
  return true;
}

demo::ModelConfig model_config(const Args& a) {
  demo::ModelConfig c;
  c.dim = a.dim;
  if (a.layers != 0) {
    c.layers = a.layers;
  } else if (a.size_mib != 0) {
    const double per_layer = double(demo::layer_source_bytes(c)) / (1 << 20);
    c.layers = std::max<std::size_t>(1, static_cast<std::size_t>(double(a.size_mib) / per_layer + 0.5));
  }
  return c;
}

std::string default_cache_path() {
  namespace fs = std::filesystem;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return (fs::path(xdg) / "weightcache" / "demo.wcache").string();
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return (fs::path(home) / ".cache" / "weightcache" / "demo.wcache").string();
  return {};
}

// ---- terminal output ----------------------------------------------------------------------------

struct Style {
  const char* bold = "";
  const char* dim = "";
  const char* green = "";
  const char* red = "";
  const char* yellow = "";
  const char* reset = "";
};

Style make_style(int fd) {
  Style s;
  const char* no_color = std::getenv("NO_COLOR");
  const char* term = std::getenv("TERM");
  if (::isatty(fd) && (no_color == nullptr || no_color[0] == '\0') &&
      (term == nullptr || std::strcmp(term, "dumb") != 0)) {
    s = {"\033[1m", "\033[2m", "\033[32m", "\033[31m", "\033[33m", "\033[0m"};
  }
  return s;
}

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string bytes_str(double b) {
  if (b < 1024) return strf("%.0f B", b);
  if (b < 1024.0 * 1024) return strf("%.1f KiB", b / 1024);
  if (b < 1024.0 * 1024 * 1024) return strf("%.1f MiB", b / (1024.0 * 1024));
  return strf("%.2f GiB", b / (1024.0 * 1024 * 1024));
}

std::string time_str(double s) {
  if (s < 1e-3) return strf("%.0f us", s * 1e6);
  if (s < 1.0) return strf("%.1f ms", s * 1e3);
  return strf("%.2f s", s);
}

/// One self-overwriting status line on stderr, only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(const char* what) : what_(what), on_(::isatty(STDERR_FILENO) != 0) {}
  ~Progress() { done(); }
  void update(std::size_t i, std::size_t n, std::uint64_t bytes, const std::string& name) {
    if (!on_) return;
    const auto now = Clock::now();
    if (i + 1 < n && now - last_ < std::chrono::milliseconds(40)) return;
    last_ = now;
    constexpr int kWidth = 28;
    const int fill = static_cast<int>(double(i + 1) / double(n) * kWidth);
    std::string bar(static_cast<std::size_t>(fill), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[K  %s [%s] %zu/%zu  %s  %s", what_, bar.c_str(), i + 1, n,
                 bytes_str(double(bytes)).c_str(), name.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  void done() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  const char* what_;
  bool on_;
  bool shown_ = false;
  Clock::time_point last_{};
};

const char* backing_name(wc::Backing b) {
  switch (b) {
    case wc::Backing::file:
      return "file";
    case wc::Backing::heap:
      return "heap";
    default:
      return "auto";
  }
}

wc::Options cache_options(const std::string& path, const demo::ModelConfig& cfg, bool verify_ahead = true) {
  wc::Options o;
  o.path = path;
  o.compat_key = demo::compat_key(cfg);
  o.alignment = 64;  // what the microkernels' aligned loads need
  o.verify = wc::Verify::shared;  // the default: the first process after a change checksums, the rest trust it
  o.verify_ahead = verify_ahead;
  return o;
}

// ---- runs 2 and 3: a new process loads everything from the file -------------------------------------

int warm_run(const Args& a) {
  const demo::ModelConfig cfg = model_config(a);
  const auto mats = demo::model_matrices(cfg);
  std::map<std::string, std::string> report;
  auto put = [&](const std::string& k, auto v) {
    std::ostringstream os;
    os << v;
    report[k] = os.str();
  };
  auto emit = [&](int code) {
    put("exit", code);
    std::string out;
    for (const auto& [k, v] : report) out += k + " " + v + "\n";
    if (a.report_fd >= 0) {
      (void)!::write(a.report_fd, out.data(), out.size());
      ::close(a.report_fd);
    } else {
      std::fputs(out.c_str(), stdout);
    }
    return code;
  };
  put("pid", ::getpid());

  const auto t_open = Clock::now();
  auto cache = wc::WeightCache::open(cache_options(a.path, cfg, a.verify_ahead));
  const double open_s = seconds_since(t_open);
  if (!cache) {
    put("error", std::string("open failed: ") + cache.error().message);
    return emit(2);
  }
  put("open_s", open_s);

  // The timed part: every weight found, mapped and checksummed (Verify::shared does that on the
  // first look-up of each entry in the first process after a change; a later process trusts that
  // verification after one fstat).
  std::vector<const void*> addrs(mats.size(), nullptr);
  std::size_t found = 0;
  const auto t_look = Clock::now();
  for (std::size_t i = 0; i < mats.size(); ++i) {
    const std::size_t off = cache->look_up(mats[i].name);
    addrs[i] = cache->offset_to_addr(off);
    found += addrs[i] != nullptr;
  }
  put("lookup_s", seconds_since(t_look));
  put("found", found);

  std::uint64_t fingerprint = 0, payload = 0;
  const auto t_touch = Clock::now();
  for (std::size_t i = 0; i < mats.size(); ++i) {
    if (addrs[i] == nullptr) continue;
    fingerprint += demo::word_sum(addrs[i], demo::packed_bytes(mats[i]));
    payload += demo::packed_bytes(mats[i]);
  }
  put("touch_s", seconds_since(t_touch));
  put("payload", payload);
  put("fingerprint", strf("%016" PRIx64, fingerprint));

  // The cache file's mappings: their Pss and Private_Dirty show whether run 2 shares run 1's pages.
  const wc::smaps::MappingUsage mem = wc::smaps::file_mapping_usage(a.path);
  put("smaps", mem.readable ? 1 : 0);
  put("vmas", mem.mappings);
  put("rss", mem.rss);
  put("pss", mem.pss);
  put("private_dirty", mem.private_dirty);
  put("private_clean", mem.private_clean);
  put("shared_clean", mem.shared_clean);
  put("shared_dirty", mem.shared_dirty);

  const wc::Stats s = cache->stats();
  put("backing", backing_name(s.backing));
  put("file_bytes", s.file_bytes);
  put("mapped_bytes", s.mapped_bytes);
  put("heap_bytes", s.heap_bytes);
  put("mappings", s.mappings);
  put("hits", s.hits);
  put("misses", s.misses);
  put("verify_failures", s.verify_failures);
  put("trusted_entries", s.trusted_entries);

  // Correctness, untimed: one matrix of each kind, from layers spread over the model, plus the
  // last matrix, regenerated and re-packed from scratch and compared byte for byte.
  std::vector<std::size_t> sample;
  for (std::size_t kind = 0; kind < 6 && kind < mats.size(); ++kind) {
    const std::size_t layer = (kind * 7 + 3) % cfg.layers;
    sample.push_back(layer * 6 + kind);
  }
  if (std::find(sample.begin(), sample.end(), mats.size() - 1) == sample.end()) sample.push_back(mats.size() - 1);
  std::size_t bad = 0;
  std::string bad_names;
  std::vector<float> src, packed;
  for (std::size_t i : sample) {
    const auto& m = mats[i];
    src.resize(m.rows * m.cols);
    packed.resize(demo::packed_bytes(m) / sizeof(float));
    demo::generate(cfg, m, src.data());
    demo::pack_panels(src.data(), m.rows, m.cols, packed.data());
    if (addrs[i] == nullptr || std::memcmp(addrs[i], packed.data(), demo::packed_bytes(m)) != 0) {
      ++bad;
      bad_names += (bad_names.empty() ? "" : ",") + m.name;
    }
  }
  put("sample", sample.size());
  put("sample_bad", bad);
  if (!bad_names.empty()) put("sample_bad_names", bad_names);

  bool ok = found == mats.size() && bad == 0 && s.verify_failures == 0;
  if (a.expect_fingerprint && *a.expect_fingerprint != fingerprint) {
    put("fingerprint_mismatch", 1);
    ok = false;
  }
  return emit(ok ? 0 : 1);
}

// ---- run 1, and the report ------------------------------------------------------------------------

std::string self_exe(const char* argv0) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

/// Starts a warm run (2 or 3) and collects its report. Returns the child's exit status (or -1).
int spawn_warm_run(const std::string& exe, const Args& a, std::optional<std::uint64_t> fingerprint,
                   std::map<std::string, std::string>* report, std::string* err) {
  int fds[2];
  if (::pipe(fds) != 0) {
    *err = std::string("pipe: ") + std::strerror(errno);
    return -1;
  }
  constexpr int kChildFd = 3;
  std::vector<std::string> args = {exe,     "--warm-run",          "--path",      a.path,
                                   "--dim", std::to_string(a.dim), "--report-fd", std::to_string(kChildFd)};
  const demo::ModelConfig cfg = model_config(a);
  args.insert(args.end(), {"--layers", std::to_string(cfg.layers)});
  if (fingerprint) args.insert(args.end(), {"--expect-fingerprint", strf("%016" PRIx64, *fingerprint)});
  if (!a.verify_ahead) args.push_back("--no-verify-ahead");
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], kChildFd);
  if (fds[0] != kChildFd) posix_spawn_file_actions_addclose(&fa, fds[0]);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    *err = "cannot start '" + exe + "': " + std::strerror(rc);
    return -1;
  }
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0)
      text.append(buf, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR)
      break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    const auto sp = line.find(' ');
    if (sp != std::string::npos) (*report)[line.substr(0, sp)] = line.substr(sp + 1);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  *err = "a warm run was killed by signal " + std::to_string(WTERMSIG(status));
  return -1;
}

int cold_run(const Args& args_in, const char* argv0) {
  Args a = args_in;
  const Style st = make_style(STDOUT_FILENO);
  const demo::ModelConfig cfg = model_config(a);
  const auto mats = demo::model_matrices(cfg);
  std::uint64_t payload = 0, source_total = 0;
  std::size_t max_source = 0;
  for (const auto& m : mats) {
    payload += demo::packed_bytes(m);
    source_total += demo::source_bytes(m);
    max_source = std::max(max_source, m.rows * m.cols);
  }

  namespace fs = std::filesystem;
  std::error_code ec;
  if (auto parent = fs::path(a.path).parent_path(); !parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) {
      std::fprintf(stderr, "weightcache-demo: cannot create '%s': %s\n", parent.c_str(), ec.message().c_str());
      return 2;
    }
  }
  bool deleted = false;
  if (a.fresh) {
    deleted = fs::remove(a.path, ec);
    if (ec) {
      std::fprintf(stderr, "weightcache-demo: cannot delete '%s': %s\n", a.path.c_str(), ec.message().c_str());
      return 2;
    }
  }
  const bool existed = fs::exists(a.path, ec);

  std::printf("%sweightcache demo%s: pack weights once, map them in every later launch\n\n", st.bold, st.reset);
  std::printf("  model  synthetic transformer, %zu layer%s x (attn q,k,v,o %zux%zu; mlp up %zux%zu, down %zux%zu)\n",
              cfg.layers, cfg.layers == 1 ? "" : "s", cfg.dim, cfg.dim, cfg.dim * cfg.mlp_mult, cfg.dim, cfg.dim,
              cfg.dim * cfg.mlp_mult);
  std::printf("         %zu f32 matrices, %s, packed into %zu-column panels (K-major, zero-padded tail)\n", mats.size(),
              bytes_str(double(source_total)).c_str(), demo::kNr);
  std::printf("  cache  %s %s(%s)%s\n\n", a.path.c_str(), st.dim,
              deleted   ? "deleted by --fresh"
              : existed ? "found: run 1 uses what it holds"
                        : "absent",
              st.reset);
  std::fflush(stdout);

  // ---- run 1 ----
  const auto t_open = Clock::now();
  auto opened = wc::WeightCache::open(cache_options(a.path, cfg));
  const double open_s = seconds_since(t_open);
  if (!opened) {
    std::fprintf(stderr, "weightcache-demo: cannot open the cache: %s\n", opened.error().message.c_str());
    return 2;
  }
  wc::WeightCache cache = std::move(opened.value());

  std::vector<float> src(max_source);
  double lookup_s = 0, generate_s = 0, pack_s = 0;
  std::size_t packed_count = 0, hit_count = 0, failures = 0;
  std::uint64_t packed_bytes_total = 0;
  {
    Progress progress("packing");
    for (std::size_t i = 0; i < mats.size(); ++i) {
      const auto& m = mats[i];
      const std::size_t bytes = demo::packed_bytes(m);
      auto t = Clock::now();
      std::size_t off = cache.look_up(m.name);
      lookup_s += seconds_since(t);
      if (off != wc::kNotFound) {
        ++hit_count;
        continue;
      }
      t = Clock::now();
      demo::generate(cfg, m, src.data());
      generate_s += seconds_since(t);

      // What a backend does on a miss: reserve in the cache, pack straight into it, commit.
      t = Clock::now();
      void* p = cache.reserve(bytes);
      if (p != nullptr) {
        demo::pack_panels(src.data(), m.rows, m.cols, static_cast<float*>(p));
        off = cache.look_up_or_insert(m.name, p, bytes);
      }
      pack_s += seconds_since(t);
      if (p == nullptr || off == wc::kNotFound) {
        progress.done();
        std::fprintf(stderr, "weightcache-demo: caching '%s' failed: %s\n", m.name.c_str(),
                     wc::last_error().message.c_str());
        return 2;
      }
      // Untimed self-check: packing only permutes and zero-pads, so the word sums agree.
      if (demo::word_sum(src.data(), demo::source_bytes(m)) != demo::word_sum(cache.offset_to_addr(off), bytes))
        ++failures;
      ++packed_count;
      packed_bytes_total += bytes;
      progress.update(i, mats.size(), packed_bytes_total, m.name);
    }
  }
  if (failures != 0) {
    std::fprintf(stderr, "weightcache-demo: %zu packed matrices read back wrong from the cache\n", failures);
    return 1;
  }
  const auto t_fin = Clock::now();
  auto fin = cache.finalize();
  const double finalize_s = seconds_since(t_fin);
  if (!fin) std::fprintf(stderr, "weightcache-demo: finalize failed: %s\n", fin.error().message.c_str());

  // The baseline: what every launch pays without a cache, packing into private heap memory kept
  // alive as a backend keeps it. Timed like run 1's packing; freed before run 2 starts.
  double heap_pack_s = 0;
  {
    std::vector<std::unique_ptr<float[]>> keep;
    Progress progress("packing to heap for comparison");
    std::uint64_t done = 0;
    for (std::size_t i = 0; i < mats.size(); ++i) {
      const auto& m = mats[i];
      demo::generate(cfg, m, src.data());
      const auto t = Clock::now();
      keep.emplace_back(new float[demo::packed_bytes(m) / sizeof(float)]);
      demo::pack_panels(src.data(), m.rows, m.cols, keep.back().get());
      heap_pack_s += seconds_since(t);
      done += demo::packed_bytes(m);
      progress.update(i, mats.size(), done, m.name);
    }
  }
  src = {};

  // Fingerprint of what the file now holds (untimed; reads every byte, which also leaves this
  // process's pages resident for run 2 to share).
  std::uint64_t fingerprint = 0;
  for (const auto& m : mats) {
    const void* p = cache.offset_to_addr(cache.look_up(m.name));
    if (p != nullptr) fingerprint += demo::word_sum(p, demo::packed_bytes(m));
  }
  const wc::Stats s1 = cache.stats();
  const wc::smaps::MappingUsage mem1 = wc::smaps::file_mapping_usage(a.path);
  if (s1.backing != wc::Backing::file || s1.heap_bytes != 0 || !fin) {
    std::fprintf(stderr,
                 "weightcache-demo: the weights did not all reach the cache file (backing %s, %s in heap memory%s);\n"
                 "  a second process would find nothing to load. Is '%s' on a local disk filesystem?\n",
                 backing_name(s1.backing), bytes_str(double(s1.heap_bytes)).c_str(), fin ? "" : ", finalize failed",
                 a.path.c_str());
    return 2;
  }

  std::printf("  %srun 1%s  pid %d, this process: %s\n", st.bold, st.reset, int(::getpid()),
              packed_count == mats.size() ? "cold"
              : hit_count == mats.size()  ? "warm (cache already full)"
                                          : "partly warm");
  std::printf("         open                      %10s\n", time_str(open_s).c_str());
  std::printf("         look up %3zu keys          %10s   %zu hits, %zu misses\n", mats.size(),
              time_str(lookup_s).c_str(), hit_count, packed_count);
  if (packed_count != 0) {
    std::printf("         generate source weights   %10s   %sstand-in for reading the model file; not counted%s\n",
                time_str(generate_s).c_str(), st.dim, st.reset);
    std::printf("         reserve + pack + insert   %10s   %zu matri%s packed straight into the file mapping\n",
                time_str(pack_s).c_str(), packed_count, packed_count == 1 ? "x" : "ces");
    std::printf("         finalize                  %10s   %sdata, index, footer and commit slot flushed to disk%s\n",
                time_str(finalize_s).c_str(), st.dim, st.reset);
  }
  std::printf("         pack to heap, no cache    %10s   %swhat every launch pays without a cache (for comparison)%s\n",
              time_str(heap_pack_s).c_str(), st.dim, st.reset);
  std::fflush(stdout);

  // ---- runs 2 and 3: separate launches, one after the other; this process keeps its mapping
  // open meanwhile. Run 2 is the first process after the change: it checksums every byte once and
  // records that in the lock file (the cache file's state is older than its file system's
  // change-time window by now: run 1 packed to the heap after its finalize). Run 3, launched the
  // moment run 2 ends, stands for every later launch: it trusts run 2's verification. ----
  struct Warm {
    std::map<std::string, std::string> r;
    double num(const char* k) const { return r.count(k) ? std::strtod(r.at(k).c_str(), nullptr) : 0.0; }
    std::uint64_t u64(const char* k) const { return r.count(k) ? std::strtoull(r.at(k).c_str(), nullptr, 10) : 0; }
    double load_s() const { return num("open_s") + num("lookup_s"); }
    bool fp_ok() const { return r.count("fingerprint_mismatch") == 0; }
    bool sample_ok() const { return u64("sample_bad") == 0; }
    wc::smaps::MappingUsage mem() const {
      return {.readable = u64("smaps") != 0,
              .mappings = static_cast<std::size_t>(u64("vmas")),
              .rss = u64("rss"),
              .pss = u64("pss"),
              .shared_clean = u64("shared_clean"),
              .shared_dirty = u64("shared_dirty"),
              .private_clean = u64("private_clean"),
              .private_dirty = u64("private_dirty")};
    }
  };
  Warm runs[2];
  int child_status[2] = {0, 0};
  for (int n = 0; n < 2; ++n) {
    Warm& w = runs[n];
    std::string err;
    const int child = spawn_warm_run(self_exe(argv0), a, fingerprint, &w.r, &err);
    child_status[n] = child;
    if (child < 0 || w.r.count("exit") == 0) {
      std::fprintf(stderr, "weightcache-demo: run %d failed: %s\n", n + 2, err.empty() ? "no report" : err.c_str());
      return 2;
    }
    if (w.r.count("error")) {
      std::fprintf(stderr, "weightcache-demo: run %d: %s\n", n + 2, w.r["error"].c_str());
      return child == 0 ? 2 : child;
    }
    const std::uint64_t trusted = w.u64("trusted_entries"), found = w.u64("found");
    std::printf("  %srun %d%s  pid %s, a new process (this binary re-executed)%s\n", st.bold, n + 2, st.reset,
                w.r["pid"].c_str(), n == 1 ? ", the moment run 2 ended" : "");
    std::printf("         open                      %10s\n", time_str(w.num("open_s")).c_str());
    const std::string how =
        trusted == found && found != 0
            ? strf("all %" PRIu64 " on the verification run 2 recorded: no byte hashed again", trusted)
        : trusted != 0 ? strf("%" PRIu64 " on an earlier verification, the rest checksummed", trusted)
                       : std::string("every entry's checksum verified on first use") +
                             (a.verify_ahead ? " (2 threads)" : "");
    std::printf("         look up %3zu keys          %10s   %" PRIu64 " hits, %s\n", mats.size(),
                time_str(w.num("lookup_s")).c_str(), found, how.c_str());
    std::printf("         read every byte again     %10s   %sfingerprint %s%s %s\n", time_str(w.num("touch_s")).c_str(),
                st.dim, w.r["fingerprint"].c_str(), st.reset,
                w.fp_ok() ? (std::string(st.green) + "= run 1" + st.reset).c_str()
                          : (std::string(st.red) + "!= run 1 (" + strf("%016" PRIx64, fingerprint) + ")" + st.reset).c_str());
    std::printf("         correctness               %10s   %s matrices re-packed from scratch: %s%s%s\n", "",
                w.r["sample"].c_str(), w.sample_ok() ? st.green : st.red,
                w.sample_ok() ? "byte-identical" : ("MISMATCH in " + w.r["sample_bad_names"]).c_str(), st.reset);
    std::fflush(stdout);
  }
  std::printf("\n");
  const Warm& r2 = runs[0];
  const Warm& r3 = runs[1];

  // ---- the headline, then the table ----
  const double run1_ready_s = open_s + lookup_s + pack_s;
  const wc::smaps::MappingUsage mem2 = r2.mem(), mem3 = r3.mem();
  auto ratio = [](double base, double t) { return t > 0 ? base / t : 0.0; };
  {
    const double later = r3.load_s(), first = r2.load_s();
    std::printf("  %severy later launch%s       %s%s%.0fx faster%s than packing without a cache (%s instead of %s)",
                st.bold, st.reset, st.bold, heap_pack_s >= later ? st.green : st.yellow, ratio(heap_pack_s, later),
                st.reset, time_str(later).c_str(), time_str(heap_pack_s).c_str());
    if (mem3.readable)
      std::printf(",\n                           %s%s shared%s with every other process, %s%s private%s", st.bold,
                  bytes_str(double(mem3.rss)).c_str(), st.reset, st.bold,
                  bytes_str(double(mem3.private_dirty)).c_str(), st.reset);
    std::printf("\n  %-24s %.1fx (%s): it checksums every byte once and records that; the launches\n"
                "                           after it trust the record for as long as the file stays unchanged\n",
                "the first after a change", ratio(heap_pack_s, first), time_str(first).c_str());
    if (r3.u64("trusted_entries") != r3.u64("found"))
      std::printf("                           %s(run 3 hashed again: this file system verifies in every process, as\n"
                  "                           tmpfs and network ones do, or keeps change times too coarse to record yet)%s\n",
                  st.dim, st.reset);
    std::printf("\n");
  }
  auto mem_cell = [&](const wc::smaps::MappingUsage& m, std::uint64_t v) {
    return m.readable ? bytes_str(double(v)) : std::string("n/a");
  };
  auto row = [](const std::string& a, const std::string& b, const std::string& c, const std::string& d,
                const std::string& e) {
    std::string line = strf("  %-24s %-22s %-22s %-22s %s", a.c_str(), b.c_str(), c.c_str(), d.c_str(), e.c_str());
    line.erase(line.find_last_not_of(' ') + 1);
    std::puts(line.c_str());
  };
  std::printf("%s", st.bold);
  const char* run1_label = packed_count == mats.size() ? "run 1 (cold)"
                           : hit_count == mats.size()  ? "run 1 (warm)"
                                                       : "run 1 (partly warm)";
  row("", run1_label, "run 2 (verifies)", "run 3 (trusts)", "");
  std::printf("%s", st.reset);
  row("weights ready in", time_str(run1_ready_s), time_str(r2.load_s()), time_str(r3.load_s()), "");
  row("vs packing, no cache", strf("%.1fx", ratio(heap_pack_s, run1_ready_s)),
      strf("%.1fx", ratio(heap_pack_s, r2.load_s())), strf("%.1fx", ratio(heap_pack_s, r3.load_s())),
      strf("(packing: %s)", time_str(heap_pack_s).c_str()));
  row("payload (packed bytes)", bytes_str(double(payload)), bytes_str(double(r2.u64("payload"))),
      bytes_str(double(r3.u64("payload"))), "");
  row("cache file", bytes_str(double(s1.file_bytes)), bytes_str(double(r2.u64("file_bytes"))),
      bytes_str(double(r3.u64("file_bytes"))), "");
  row("backing", backing_name(s1.backing), r2.r.at("backing"), r3.r.at("backing"), "");
  auto mapped_heap = [&](std::uint64_t m, std::uint64_t h) { return bytes_str(double(m)) + " / " + bytes_str(double(h)); };
  row("mapped / heap bytes", mapped_heap(s1.mapped_bytes, s1.heap_bytes),
      mapped_heap(r2.u64("mapped_bytes"), r2.u64("heap_bytes")), mapped_heap(r3.u64("mapped_bytes"), r3.u64("heap_bytes")),
      "");
  row("file mappings (VMAs)", strf("%" PRIu64 " (%" PRIu64 ")", s1.mappings, std::uint64_t{mem1.mappings}),
      strf("%" PRIu64 " (%" PRIu64 ")", r2.u64("mappings"), r2.u64("vmas")),
      strf("%" PRIu64 " (%" PRIu64 ")", r3.u64("mappings"), r3.u64("vmas")), "");
  std::printf("\n  %smemory for the weights%s %s(/proc/self/smaps, mappings of the cache file)%s\n", st.bold, st.reset,
              st.dim, st.reset);
  row("", "run 1 (before run 2)", "run 2", "run 3", "private heap copy");
  row("Rss", mem_cell(mem1, mem1.rss), mem_cell(mem2, mem2.rss), mem_cell(mem3, mem3.rss), bytes_str(double(payload)));
  row("Pss", mem_cell(mem1, mem1.pss), mem_cell(mem2, mem2.pss), mem_cell(mem3, mem3.pss), bytes_str(double(payload)));
  row("Private_Dirty", mem_cell(mem1, mem1.private_dirty), mem_cell(mem2, mem2.private_dirty),
      mem_cell(mem3, mem3.private_dirty), bytes_str(double(payload)));
  std::printf("\n  %s", st.dim);
  std::printf("weights ready = open + look up every key (checksums verified or trusted) + pack the misses;\n");
  std::printf("  generating the source weights, finalize and the runs' extra read are not counted.\n");
  std::printf("  The processes map the same page-cache pages, so Pss splits them between them; a heap\n");
  std::printf("  copy is private to each process (every touched page Private_Dirty, Pss = Rss).\n");
  if (mem3.readable && mem2.private_dirty == 0 && mem3.private_dirty == 0 && mem3.rss > 0)
    std::printf("  Runs 2 and 3 dirtied none of them: another process adds no private memory for the weights.\n");
  std::printf("%s", st.reset);

  const std::size_t found = std::min(r2.u64("found"), r3.u64("found"));
  const bool fp_ok = r2.fp_ok() && r3.fp_ok();
  const bool sample_ok = r2.sample_ok() && r3.sample_ok();
  const int child = child_status[0] != 0 ? child_status[0] : child_status[1];
  const bool ok = child == 0 && found == mats.size() && fp_ok && sample_ok;
  std::printf("\n  %s%s%s\n", st.bold,
              ok ? (std::string(st.green) + "OK: runs 2 and 3 served every weight byte-exact from the cache file").c_str()
                 : (std::string(st.red) + "FAILED: a warm run found wrong or missing bytes (exit 1)").c_str(),
              st.reset);
  if (!ok && found != mats.size())
    std::fprintf(stderr, "weightcache-demo: a warm run found %zu of %zu entries (verify failures: %s, %s)\n", found,
                 mats.size(), r2.r.count("verify_failures") ? r2.r.at("verify_failures").c_str() : "?",
                 r3.r.count("verify_failures") ? r3.r.at("verify_failures").c_str() : "?");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, &a, &err)) {
    std::fprintf(stderr, "weightcache-demo: %s\n\n%s", err.c_str(), kUsage);
    return 2;
  }
  if (a.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (a.path.empty()) a.path = default_cache_path();
  if (a.path.empty()) {
    std::fprintf(stderr, "weightcache-demo: neither XDG_CACHE_HOME nor HOME is set; pass --path FILE\n");
    return 2;
  }
  a.path = std::filesystem::absolute(a.path).string();
  return a.warm_run ? warm_run(a) : cold_run(a, argv[0]);
}
