// weightcache-ref-ep: a reference CPU execution provider that runs a stack of transformer-style
// MLP blocks (f32) in a real XNNPACK when the build has one (else, and on request, with its own
// GEMM), its weights packed through weightcache's XNNPACK-shaped provider (or its C ABI, or, as
// the baseline, without weightcache at all). Run it twice: the first run packs into the cache
// file, the second maps the packed weights. See --help, and docs/INTEGRATION.md.
#include "../common/self_exe.hpp"
#include "proc_smaps.hpp"
#include "ep.hpp"
#include "model.hpp"
#if WEIGHTCACHE_REF_EP_XNNPACK
#include "xnn_backend.hpp"
#endif

#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>

#include <fcntl.h>
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
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::string human(std::uint64_t bytes) {
  char buf[64];
  if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  else if (bytes >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(1ull << 20));
  else if (bytes >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  else std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  return buf;
}

// ---- arguments --------------------------------------------------------------------------------

#if WEIGHTCACHE_REF_EP_XNNPACK
constexpr bool kHaveXnnpack = true;
#define REFEP_BACKEND_HELP                                                                                 \
  "  --backend B      xnnpack (the default): XNNPACK's operators, 2 threads; gemm: the provider's own\n" \
  "                   packer and single-threaded GEMM (implied by --c-abi)\n"
#else
constexpr bool kHaveXnnpack = false;
#define REFEP_BACKEND_HELP                                                                                 \
  "  --backend B      gemm (the only one here): the provider's own packer and GEMM; xnnpack needs a\n"   \
  "                   build configured with WEIGHTCACHE_XNNPACK_SOURCE_DIR\n"
#endif

const char kUsage[] =
    "usage: weightcache-ref-ep [--cache FILE | --no-cache] [--c-abi] [--fresh] [--backend xnnpack|gemm]\n"
    "                          [--size-mib N | --layers N] [--dim N] [--hidden N] [--tokens N] [--seed N]\n"
    "                          [--sessions K] [--processes N] [--report FILE]\n"
    "\n"
    "A reference CPU execution provider: runs a stack of transformer-style MLP blocks (f32\n"
    "fully-connected layers from packed weights, bias, GELU) whose weights are packed through\n"
    "weightcache's XNNPACK-shaped weights-cache provider. With the xnnpack backend a real XNNPACK\n"
    "packs and computes; with the gemm backend the provider's own packer and GEMM do. The first run\n"
    "packs into the cache file; later runs, and other processes, map the packed weights instead.\n"
    "Outputs of one backend are bit-identical in every mode (the two backends' differ).\n"
    "\n"
    "  --cache FILE     cache file (default $XDG_CACHE_HOME/weightcache/ref-ep.wcache, else\n"
    "                   ~/.cache/weightcache/ref-ep.wcache)\n"
    "  --no-cache       the baseline: no weightcache at all; every session packs (same packer)\n"
    "                   into private memory of its own and runs from it\n"
    "  --c-abi          pack through the C ABI (wc_look_up, wc_reserve_space, wc_look_up_or_insert)\n"
    "                   instead of the XNNPACK-shaped provider, as a backend packing on its own would\n"
    "  --fresh          delete the cache file first (a cold start)\n"
    REFEP_BACKEND_HELP
    "  --size-mib N     weights in MiB, rounded to whole blocks (default 512)\n"
    "  --layers N       number of MLP blocks (default 16)\n"
    "  --dim N          model width (default 1024)\n"
    "  --hidden N       MLP width (default 4096)\n"
    "  --tokens N       batch of tokens per forward pass (default 4)\n"
    "  --seed N         weight generator seed\n"
    "  --sessions K     K sessions in this process, all alive at once (default 1)\n"
    "  --processes N    N processes over one cache, all alive at once (fork/exec of itself)\n"
    "  --report FILE    append one key=value line per session (and per process) to FILE\n"
    "\n"
    "Exit status: 0 success, 1 outputs differ between sessions or processes, 2 any other failure.\n";

struct Args {
  refep::Config config;
  std::string cache_path;
  refep::Mode mode = refep::Mode::adapter;
  refep::Backend backend = kHaveXnnpack ? refep::Backend::xnnpack : refep::Backend::gemm;
  bool backend_set = false;
  bool no_cache = false;  // mode == direct
  bool c_abi = false;
  bool fresh = false;
  std::size_t size_mib = 0;
  bool layers_set = false;
  std::size_t sessions = 1;
  std::size_t processes = 0;
  std::string report;
  // Internal: a child of --processes, synchronised with its siblings through inherited pipe
  // ends: "loaded" then "measured" (each: write one byte, then read until the parent closes).
  int sync_fds[4] = {-1, -1, -1, -1};
};

bool parse_number(const char* s, std::size_t* out, std::uint64_t max = 1ull << 32) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 0);
  if (errno != 0 || *end != '\0' || v == 0 || v > max) return false;
  *out = static_cast<std::size_t>(v);
  return true;
}

int parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    auto number = [&](std::size_t* out) {
      if (!parse_number(next, out)) {
        std::fprintf(stderr, "weightcache-ref-ep: %s needs a positive number\n", arg.c_str());
        return false;
      }
      ++i;
      return true;
    };
    std::size_t v = 0;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--cache" && next != nullptr) {
      a->cache_path = next;
      ++i;
    } else if (arg == "--no-cache") {
      a->no_cache = true;
    } else if (arg == "--c-abi") {
      a->c_abi = true;
    } else if (arg == "--fresh") {
      a->fresh = true;
    } else if (arg == "--backend" && next != nullptr) {
      const std::string b = next;
      ++i;
      if (b == "gemm") {
        a->backend = refep::Backend::gemm;
      } else if (b == "xnnpack" && kHaveXnnpack) {
        a->backend = refep::Backend::xnnpack;
      } else if (b == "xnnpack") {
        std::fprintf(stderr, "weightcache-ref-ep: --backend xnnpack: this build has no XNNPACK (configure it with "
                             "-DWEIGHTCACHE_XNNPACK_SOURCE_DIR=<checkout>)\n");
        return 2;
      } else {
        std::fprintf(stderr, "weightcache-ref-ep: --backend takes xnnpack or gemm, not '%s'\n", b.c_str());
        return 2;
      }
      a->backend_set = true;
    } else if (arg == "--size-mib") {
      if (!number(&a->size_mib)) return 2;
    } else if (arg == "--layers") {
      if (!number(&a->config.layers)) return 2;
      a->layers_set = true;
    } else if (arg == "--dim") {
      if (!number(&a->config.dim)) return 2;
    } else if (arg == "--hidden") {
      if (!number(&a->config.hidden)) return 2;
    } else if (arg == "--tokens") {
      if (!number(&a->config.tokens)) return 2;
    } else if (arg == "--seed") {
      if (!number(&v)) return 2;
      a->config.seed = v;
    } else if (arg == "--sessions") {
      if (!number(&a->sessions)) return 2;
    } else if (arg == "--processes") {
      if (!number(&a->processes)) return 2;
    } else if (arg == "--report" && next != nullptr) {
      a->report = next;
      ++i;
    } else if (arg == "--child-sync" && next != nullptr) {
      if (std::sscanf(next, "%d,%d,%d,%d", &a->sync_fds[0], &a->sync_fds[1], &a->sync_fds[2], &a->sync_fds[3]) != 4)
        return 2;
      ++i;
    } else {
      std::fprintf(stderr, "weightcache-ref-ep: unknown argument '%s'\n\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (a->no_cache && (a->c_abi || !a->cache_path.empty())) {
    std::fprintf(stderr, "weightcache-ref-ep: --no-cache uses no cache: it excludes --c-abi and --cache\n");
    return 2;
  }
  a->mode = a->no_cache ? refep::Mode::direct : a->c_abi ? refep::Mode::c_abi : refep::Mode::adapter;
  if (a->c_abi) {
    // XNNPACK packs through a weights-cache provider only: the C ABI is for a backend that packs
    // its own weights.
    if (a->backend_set && a->backend == refep::Backend::xnnpack) {
      std::fprintf(stderr, "weightcache-ref-ep: --c-abi packs with the gemm backend; it excludes --backend xnnpack\n");
      return 2;
    }
    a->backend = refep::Backend::gemm;
  }
  if (a->size_mib != 0 && !a->layers_set) {
    const double per_layer = static_cast<double>(refep::layer_weight_bytes(a->config));
    a->config.layers = std::max<std::size_t>(1, static_cast<std::size_t>(a->size_mib * double(1 << 20) / per_layer + 0.5));
  }
  if (a->cache_path.empty() && !a->no_cache) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    std::filesystem::path dir = (xdg != nullptr && *xdg != '\0') ? std::filesystem::path(xdg)
                                : (home != nullptr && *home != '\0') ? std::filesystem::path(home) / ".cache"
                                                                     : std::filesystem::temp_directory_path();
    dir /= "weightcache";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    a->cache_path = (dir / "ref-ep.wcache").string();
  }
  return -1;
}

// ---- where the weights live: /proc/self/smaps ---------------------------------------------------
// Two places: the cache file's mappings (page-cache pages, shared by every process mapping the
// file) and private anonymous memory (the baseline's buffers, or a cache's heap fallback).
// Both are measured from the kernel's account, never assumed.

using weightcache::smaps::AddressRange;
using weightcache::smaps::anonymous_usage_of;
using weightcache::smaps::file_mapping_usage;
using weightcache::smaps::MappingUsage;

std::vector<AddressRange> ranges_of(const refep::ExecutionProvider& ep) {
  std::vector<AddressRange> out;
  for (const auto& [p, n] : ep.packed_ranges()) out.push_back({reinterpret_cast<std::uintptr_t>(p), n});
  return out;
}

// One row of the "where the weights live" table.
void print_row(const char* where, const std::string& bytes, const MappingUsage& u) {
  std::printf("      %-24s %11s %11s %11s %14s\n", where, bytes.c_str(), human(u.rss).c_str(), human(u.pss).c_str(),
              human(u.private_dirty).c_str());
}

void print_table(const char* title, bool cache, const std::string& mapped_bytes, const MappingUsage& mapped,
                 const std::string& private_bytes, const MappingUsage& priv) {
  std::printf("    %-26s %11s %11s %11s %14s\n", title, "bytes", "Rss", "Pss", "Private_Dirty");
  if (cache) print_row("cache file (shared)", mapped_bytes, mapped);
  else std::printf("      %-24s %11s\n", "cache file (shared)", "not used");
  print_row("private memory (heap)", private_bytes, priv);
}

std::uint64_t process_rss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

// ---- sessions ---------------------------------------------------------------------------------

std::string packer_id(refep::Backend backend) {
#if WEIGHTCACHE_REF_EP_XNNPACK
  if (backend == refep::Backend::xnnpack) return refep::XnnpackProvider::packer_id();
#endif
  (void)backend;
  return std::string(refep::kPackerId);
}

std::unique_ptr<refep::ExecutionProvider> make_provider(const Args& a, wc_cache* cache, refep::SourceModel* source) {
#if WEIGHTCACHE_REF_EP_XNNPACK
  if (a.backend == refep::Backend::xnnpack)
    return std::make_unique<refep::XnnpackProvider>(a.mode, cache, source, a.config);
#endif
  return std::make_unique<refep::GemmProvider>(a.mode, cache, source, a.config);
}

std::string compat_key(const refep::Config& c, refep::Backend backend) {
  // Everything the packed bytes depend on: the model's identity (here, the parameters that
  // generate it; a real runtime would use the model file's digest), the packer (the backend's:
  // XNNPACK's build identifier, or the gemm packer's name), the CPU.
#if defined(__x86_64__)
  const char* cpu = "x86_64";
#elif defined(__aarch64__)
  const char* cpu = "aarch64";
#else
  const char* cpu = "generic";
#endif
  return "weightcache-ref-ep|model:seed=" + std::to_string(c.seed) + ",layers=" + std::to_string(c.layers) +
         ",dim=" + std::to_string(c.dim) + ",hidden=" + std::to_string(c.hidden) + "|packer=" +
         packer_id(backend) + "|cpu=" + cpu;
}

struct Session {
  wc_cache* cache = nullptr;
  std::unique_ptr<refep::SourceModel> source;
  std::unique_ptr<refep::ExecutionProvider> ep;
  ~Session() {
    ep.reset();  // the adapter goes before the cache it uses
    wc_close(cache);
  }
};

class Reporter {
 public:
  explicit Reporter(const std::string& path) {
    if (!path.empty()) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  ~Reporter() {
    if (fd_ >= 0) ::close(fd_);
  }
  // One write per line: lines from concurrent processes do not interleave (O_APPEND).
  void line(const std::string& s) {
    if (fd_ < 0) return;
    const std::string l = s + "\n";
    (void)!::write(fd_, l.data(), l.size());
  }

 private:
  int fd_ = -1;
};

// Child side of a barrier: announce, then wait until the parent closes the other pipe.
void barrier(int announce_fd, int wait_fd) {
  (void)!::write(announce_fd, "r", 1);
  ::close(announce_fd);
  char c;
  for (;;) {
    const ssize_t n = ::read(wait_fd, &c, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) break;  // end of file: released
  }
  ::close(wait_fd);
}

// Parent side: wait for `count` announcements (or for every child to be gone), then release.
void release_when_all(int announce_fd, int release_fd, std::size_t count) {
  std::size_t seen = 0;
  char c;
  while (seen < count) {
    const ssize_t n = ::read(announce_fd, &c, 1);
    if (n == 1) ++seen;
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(release_fd);
  ::close(announce_fd);
}

int run_sessions(const Args& args) {
  const refep::Config& cfg = args.config;
  Reporter report(args.report);
  const std::string key = compat_key(cfg, args.backend);
  const char* backend = refep::backend_name(args.backend);
  const auto input = refep::make_input(cfg);
  const std::uint64_t weight_bytes = refep::layer_weight_bytes(cfg) * cfg.layers;
  const long pid = static_cast<long>(::getpid());
  const bool cached = args.mode != refep::Mode::direct;
  std::printf("[pid %ld] model: %zu MLP blocks, dim %zu, hidden %zu, %s of f32 weights, %zu tokens; backend %s; %s\n",
              pid, cfg.layers, cfg.dim, cfg.hidden, human(weight_bytes).c_str(), cfg.tokens,
              args.backend == refep::Backend::xnnpack ? "xnnpack (XNNPACK operators, 2 threads)" : "gemm (own GEMM)",
              cached ? (std::string(refep::mode_name(args.mode)) + " over " + args.cache_path).c_str()
                     : "no cache: every session packs into private memory");
  std::fflush(stdout);

  std::vector<std::unique_ptr<Session>> sessions;
  std::string first_hash;
  bool identical = true;
  for (std::size_t k = 1; k <= args.sessions; ++k) {
    auto s = std::make_unique<Session>();
    const auto t0 = Clock::now();
    if (cached) {
      wc_options o;
      wc_options_init(&o);
      o.path = args.cache_path.c_str();
      o.compat_key = key.data();
      o.compat_key_size = key.size();
      o.refresh_on_miss = 1;  // pick up what concurrent processes committed meanwhile
      if (wc_open(&o, &s->cache) != WC_OK) {
        std::fprintf(stderr, "weightcache-ref-ep: cannot open the cache: %s\n", wc_last_error());
        return 2;
      }
    }
    s->source = std::make_unique<refep::SourceModel>(cfg, refep::model_layers(cfg));
    if (!s->source->ok()) {
      std::fprintf(stderr, "weightcache-ref-ep: cannot map %s for the model\n", human(weight_bytes).c_str());
      return 2;
    }
    s->ep = make_provider(args, s->cache, s->source.get());
    refep::LoadCounts counts;
    std::string err = s->ep->init();
    if (err.empty()) err = s->ep->create_operators(&counts);
    if (err.empty()) err = s->ep->finalize();
    if (err.empty()) err = s->ep->reshape();
    if (!err.empty()) {
      std::fprintf(stderr, "weightcache-ref-ep: session %zu: %s\n", k, err.c_str());
      return 2;
    }
    const double load_ms = ms_since(t0);

    const auto t1 = Clock::now();
    std::vector<float> out;
    err = s->ep->run(input, &out);
    if (!err.empty()) {
      std::fprintf(stderr, "weightcache-ref-ep: session %zu: run: %s\n", k, err.c_str());
      return 2;
    }
    const double run_ms = ms_since(t1);
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016" PRIx64, refep::fnv1a(out.data(), out.size() * sizeof(float)));
    if (first_hash.empty()) first_hash = hash;
    identical = identical && first_hash == hash;

    // Where this session's weights live: bytes from the library's account (in the baseline,
    // the buffers it packed into), pages from the kernel's. The cache file's mappings are one per
    // process, whatever the number of sessions; private memory is this session's own.
    wc_stats cs;
    wc_stats_init(&cs);
    wc_xnn_adapter_stats as;
    wc_xnn_adapter_stats_init(&as);
    if (cached) wc_get_stats(s->cache, &cs);
    if (s->ep->adapter() != nullptr) wc_xnn_adapter_get_stats(s->ep->adapter(), &as);
    const std::uint64_t reserves = args.mode == refep::Mode::adapter ? as.reservations : counts.packed;
    const std::uint64_t private_bytes = cached ? cs.heap_bytes + as.unnamed_bytes : s->ep->packed_total();
    const MappingUsage mapped = file_mapping_usage(cached ? args.cache_path : std::string());
    const MappingUsage priv = anonymous_usage_of(ranges_of(*s->ep));
    std::printf("[pid %ld session %zu/%zu] load %.1f ms: %zu operators, %zu packed, %zu from the cache; run %.1f ms; "
                "output %s\n",
                pid, k, args.sessions, load_ms, s->ep->operators(), counts.packed, counts.hits, run_ms, hash);
    if (s->ep->adapter() != nullptr)
      std::printf("    adapter: %" PRIu64 " look-ups, %" PRIu64 " hits, %" PRIu64 " reservations%s\n", as.look_ups,
                  as.hits, as.reservations,
                  as.reservations == 0 && as.hits == as.look_ups ? " (nothing packed: every look-up hit)" : "");
    print_table(("weights (" + human(s->ep->packed_total()) + " packed)").c_str(), cached, human(cs.mapped_bytes),
                mapped, human(private_bytes), priv);
    std::fflush(stdout);
    char line[768];
    std::snprintf(line, sizeof line,
                  "pid=%ld session=%zu backend=%s mode=%s hash=%s load_ms=%.3f run_ms=%.3f packed=%zu hits=%zu "
                  "look_ups=%" PRIu64 " adapter_hits=%" PRIu64 " reserves=%" PRIu64
                  " weights=%zu mapped_bytes=%" PRIu64 " heap_bytes=%" PRIu64 " unnamed_bytes=%" PRIu64 " rss=%" PRIu64
                  " pss=%" PRIu64 " private_dirty=%" PRIu64 " heap_rss=%" PRIu64 " heap_pss=%" PRIu64
                  " heap_private_dirty=%" PRIu64,
                  pid, k, backend, args.mode == refep::Mode::adapter ? "adapter" : cached ? "c-abi" : "direct", hash,
                  load_ms, run_ms, counts.packed, counts.hits, as.look_ups, as.hits, reserves, s->ep->packed_total(), cs.mapped_bytes, private_bytes,
                  as.unnamed_bytes, mapped.rss, mapped.pss, mapped.private_dirty, priv.rss, priv.pss,
                  priv.private_dirty);
    report.line(line);
    sessions.push_back(std::move(s));
  }

  // Every process of --processes holds its sessions until all have loaded, and stays until all
  // have measured, so the figures below show what the processes share.
  const bool child = args.sync_fds[0] >= 0;
  if (child) barrier(args.sync_fds[0], args.sync_fds[1]);
  const MappingUsage mu = file_mapping_usage(cached ? args.cache_path : std::string());
  std::vector<AddressRange> all;
  for (const auto& s : sessions) {
    const auto r = ranges_of(*s->ep);
    all.insert(all.end(), r.begin(), r.end());
  }
  const MappingUsage priv = anonymous_usage_of(all);
  const std::uint64_t rss = process_rss();
  std::printf("[pid %ld] %zu session(s) alive, process RSS %s\n", pid, sessions.size(), human(rss).c_str());
  // With one session in one process that is the table above; otherwise the total, measured
  // while every session (and, with --processes, every process) is alive.
  if (sessions.size() > 1 || child) print_table("all sessions' weights", cached, "", mu, "", priv);
  std::fflush(stdout);
  char line[384];
  std::snprintf(line, sizeof line,
                "pid=%ld summary=1 sessions=%zu process_rss=%" PRIu64 " rss=%" PRIu64 " pss=%" PRIu64
                " private_dirty=%" PRIu64 " heap_rss=%" PRIu64 " heap_pss=%" PRIu64 " heap_private_dirty=%" PRIu64,
                pid, sessions.size(), rss, mu.rss, mu.pss, mu.private_dirty, priv.rss, priv.pss, priv.private_dirty);
  report.line(line);
  if (child) barrier(args.sync_fds[2], args.sync_fds[3]);
  if (!identical) {
    std::fprintf(stderr, "weightcache-ref-ep: sessions of this process produced different outputs\n");
    return 1;
  }
  return 0;
}

// ---- --processes: fork/exec of itself ---------------------------------------------------------

std::map<std::string, std::string> parse_report_line(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream ss(line);
  std::string tok;
  while (ss >> tok) {
    const auto eq = tok.find('=');
    if (eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
  }
  return kv;
}

int run_processes(int argc, char** argv, const Args& args) {
  std::string report = args.report;
  std::string temp_report;
  if (report.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/weightcache-ref-ep-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    const int fd = ::mkstemp(buf.data());
    if (fd < 0) {
      std::perror("weightcache-ref-ep: mkstemp");
      return 2;
    }
    ::close(fd);
    report = temp_report = buf.data();
  }
  std::size_t lines_before = 0;
  {
    std::ifstream in(report);
    std::string l;
    while (std::getline(in, l)) ++lines_before;
  }

  // Two barriers, each a pair of pipes: children announce on one and wait for the other to close.
  int loaded[2], go[2], measured[2], leave[2];
  if (::pipe(loaded) != 0 || ::pipe(go) != 0 || ::pipe(measured) != 0 || ::pipe(leave) != 0) {
    std::perror("weightcache-ref-ep: pipe");
    return 2;
  }
  // The parent's ends must not leak into the children, or a barrier never opens.
  for (int fd : {loaded[0], go[1], measured[0], leave[1]}) ::fcntl(fd, F_SETFD, FD_CLOEXEC);

  std::vector<std::string> child_args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--processes" || a == "--report") {
      ++i;
      continue;
    }
    if (a == "--fresh") continue;  // done once, below
    child_args.push_back(a);
  }
  if (args.fresh && args.mode != refep::Mode::direct) {
    std::error_code ec;
    std::filesystem::remove(args.cache_path, ec);
  }
  child_args.push_back("--report");
  child_args.push_back(report);
  child_args.push_back("--child-sync");
  child_args.push_back(std::to_string(loaded[1]) + "," + std::to_string(go[0]) + "," + std::to_string(measured[1]) +
                       "," + std::to_string(leave[0]));

  std::vector<pid_t> pids;
  const std::string self = weightcache::examples::self_exe();
  for (std::size_t i = 0; i < args.processes; ++i) {
    std::vector<std::string> storage = {"weightcache-ref-ep"};
    storage.insert(storage.end(), child_args.begin(), child_args.end());
    std::vector<char*> cargv;
    for (auto& s : storage) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, cargv.data(), environ);
    if (rc != 0) {
      std::fprintf(stderr, "weightcache-ref-ep: cannot start process %zu: %s\n", i + 1, std::strerror(rc));
      break;
    }
    pids.push_back(pid);
  }
  for (int fd : {loaded[1], go[0], measured[1], leave[0]}) ::close(fd);
  // A child that dies closes its ends, so a barrier never waits for it forever.
  release_when_all(loaded[0], go[1], pids.size());
  release_when_all(measured[0], leave[1], pids.size());

  int rc = pids.size() == args.processes ? 0 : 2;
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "weightcache-ref-ep: process %ld failed\n", static_cast<long>(pid));
      rc = rc == 0 ? (WIFEXITED(status) && WEXITSTATUS(status) == 1 ? 1 : 2) : rc;
    }
  }

  // Every session of every process must have computed the same output.
  std::ifstream in(report);
  std::string l, hash;
  std::size_t n = 0, seen = 0;
  bool identical = true;
  std::uint64_t pss = 0, rss = 0, heap_pss = 0, heap_rss = 0;
  while (std::getline(in, l)) {
    if (n++ < lines_before) continue;
    auto kv = parse_report_line(l);
    if (kv.count("summary") != 0) {
      pss += std::strtoull(kv["pss"].c_str(), nullptr, 10);
      rss += std::strtoull(kv["rss"].c_str(), nullptr, 10);
      heap_pss += std::strtoull(kv["heap_pss"].c_str(), nullptr, 10);
      heap_rss += std::strtoull(kv["heap_rss"].c_str(), nullptr, 10);
      continue;
    }
    ++seen;
    if (hash.empty()) hash = kv["hash"];
    identical = identical && kv["hash"] == hash;
  }
  if (!temp_report.empty()) ::unlink(temp_report.c_str());
  if (seen != args.processes * args.sessions) {
    std::fprintf(stderr, "weightcache-ref-ep: %zu of %zu sessions reported\n", seen, args.processes * args.sessions);
    return rc != 0 ? rc : 2;
  }
  if (!identical) {
    std::fprintf(stderr, "weightcache-ref-ep: processes produced different outputs\n");
    return 1;
  }
  std::printf("%zu processes x %zu session(s), backend %s: every output %s\n"
              "    weights across processes: cache file mappings Rss %s, Pss %s (shared pages count once in Pss); "
              "private memory Rss %s, Pss %s\n",
              args.processes, args.sessions, refep::backend_name(args.backend), hash.c_str(), human(rss).c_str(), human(pss).c_str(),
              human(heap_rss).c_str(), human(heap_pss).c_str());
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const int rc = parse_args(argc, argv, &args); rc >= 0) return rc;
  if (args.processes > 0) return run_processes(argc, argv, args);
  if (args.fresh && args.mode != refep::Mode::direct) {
    std::error_code ec;
    std::filesystem::remove(args.cache_path, ec);
  }
  return run_sessions(args);
}
