#include "bench_util.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#ifndef WEIGHTCACHE_BENCH_DEFAULT_DIR
#define WEIGHTCACHE_BENCH_DEFAULT_DIR "."
#endif
#ifndef WEIGHTCACHE_BENCH_CHILD
#define WEIGHTCACHE_BENCH_CHILD "weightcache-bench-child"
#endif

extern char** environ;

namespace weightcache::bench {
namespace fs = std::filesystem;
namespace {

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double unit(std::uint64_t& s) { return double(splitmix(s) >> 11) * 0x1.0p-53; }

struct Scratch {
  std::string dir;
  Scratch() {
    const char* env = std::getenv("WEIGHTCACHE_BENCH_DIR");
    const fs::path base = env != nullptr && env[0] != '\0' ? fs::path(env) : fs::path(WEIGHTCACHE_BENCH_DEFAULT_DIR);
    std::error_code ec;
    fs::create_directories(base, ec);
    std::string tmpl = (base / "wcbench.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "weightcache-bench: cannot create a directory under '%s': %s\n", base.c_str(),
                   std::strerror(errno));
      std::exit(2);
    }
    dir = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

struct Records {
  std::mutex mu;
  std::map<std::string, std::vector<Lap>> times;
  std::map<std::string, double> values;
  std::map<std::string, std::vector<double>> samples;
};

Records& records() {
  static Records r;
  return r;
}

}  // namespace

const std::string& scratch_dir() {
  static Scratch s;
  return s.dir;
}

std::string scratch_fs_type() {
  struct statfs sf {};
  if (::statfs(scratch_dir().c_str(), &sf) != 0) return "unknown";
  switch (static_cast<unsigned long>(sf.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x01021994:
      return "tmpfs";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794c7630:
      return "overlayfs";
    case 0x2fc12fc1:
      return "zfs";
    case 0x65735546:
      return "fuse";
    case 0x6969:
      return "nfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(sf.f_type));
      return buf;
    }
  }
}

std::string scratch_path(const std::string& stem) {
  static std::atomic<unsigned> n{0};
  return (fs::path(scratch_dir()) / (stem + "." + std::to_string(n.fetch_add(1)) + ".wcache")).string();
}

void remove_cache_file(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  fs::remove(path + ".lock", ec);
}

std::vector<std::size_t> mixed_sizes(std::uint64_t total, std::size_t lo, std::size_t hi, std::uint64_t seed,
                                     bool log_uniform) {
  std::vector<std::size_t> out;
  std::uint64_t sum = 0;
  while (sum < total) {
    const double u = unit(seed);
    std::size_t s = log_uniform ? static_cast<std::size_t>(std::exp(std::log(double(lo)) +
                                                                    u * (std::log(double(hi)) - std::log(double(lo)))))
                                : lo + static_cast<std::size_t>(u * double(hi - lo));
    s = std::clamp<std::size_t>(s, lo, hi);
    s = std::min<std::uint64_t>(s, total - sum);
    out.push_back(s);
    sum += s;
  }
  return out;
}

std::vector<std::size_t> mixed_sizes_n(std::size_t count, std::size_t lo, std::size_t hi, std::uint64_t seed) {
  std::vector<std::size_t> out(count);
  for (auto& s : out) {
    const double u = unit(seed);
    s = std::clamp<std::size_t>(
        static_cast<std::size_t>(std::exp(std::log(double(lo)) + u * (std::log(double(hi)) - std::log(double(lo))))),
        lo, hi);
  }
  return out;
}

void fill_pattern(void* p, std::size_t size, std::uint64_t seed) {
  auto* q = static_cast<std::uint64_t*>(p);
  const std::size_t n = size / 8;
  const std::uint64_t k = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (std::size_t i = 0; i < n; ++i) q[i] = (i + 1) * k;
  std::memset(static_cast<char*>(p) + n * 8, 0x5a, size - n * 8);
}

bool reserve_fill_insert(WeightCache& cache, const std::vector<std::size_t>& sizes,
                         const std::vector<std::string>& keys, bool fill, bool insert) {
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    void* p = cache.reserve(sizes[i]);
    if (p == nullptr) return false;
    if (fill) fill_pattern(p, sizes[i], i);
    if (insert && cache.look_up_or_insert(keys[i], p, sizes[i]) == kNotFound) return false;
  }
  return true;
}

std::size_t file_vmas(const std::string& path) {
  // /proc/self/maps lists the same mapping headers as smaps, without the counters.
  return smaps::file_mapping_usage(path, "/proc/self/maps").mappings;
}

MemFigures process_memory(pid_t pid) {
  // smaps_rollup: one header standing for the whole process, then its counters.
  return smaps::sum_mappings("/proc/" + std::to_string(pid) + "/smaps_rollup",
                                [](const smaps::MappingHeader&) { return true; });
}

MemFigures file_memory(pid_t pid, const std::string& path) {
  return smaps::file_mapping_usage(path, "/proc/" + std::to_string(pid) + "/smaps");
}

bool sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fdatasync(fd) == 0;
  ::close(fd);
  return ok;
}

double drop_file_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  double resident = -1;
  if (::fstat(fd, &st) == 0 && ::fdatasync(fd) == 0 && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0) {
    const std::size_t size = static_cast<std::size_t>(st.st_size);
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* p = size ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (p != MAP_FAILED) {
      std::vector<unsigned char> vec((size + page - 1) / page);
      if (::mincore(p, size, vec.data()) == 0) {
        std::size_t n = 0;
        for (unsigned char v : vec) n += v & 1;
        resident = vec.empty() ? 0 : double(n) / double(vec.size());
      }
      ::munmap(p, size);
    }
  }
  ::close(fd);
  return resident;
}

Child spawn_child(const std::vector<std::string>& args) {
  Child c;
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return c;
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return c;
  }
  const char* env = std::getenv("WEIGHTCACHE_BENCH_CHILD");
  const std::string exe = env != nullptr && env[0] != '\0' ? env : WEIGHTCACHE_BENCH_CHILD;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);  // dup2 clears O_CLOEXEC on the copy
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    std::fprintf(stderr, "weightcache-bench: cannot start '%s': %s\n", exe.c_str(), std::strerror(rc));
    ::close(in[1]);
    ::close(out[0]);
    return c;
  }
  c.pid = pid;
  c.to_child = in[1];
  c.from_child = out[0];
  return c;
}

std::string read_child_line(const Child& c) {
  std::string line;
  char ch = 0;
  for (;;) {
    const ssize_t n = ::read(c.from_child, &ch, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || ch == '\n') break;
    line.push_back(ch);
  }
  return line;
}

bool finish_child(Child& c) {
  if (c.pid < 0) return false;
  if (c.to_child >= 0) ::close(c.to_child);
  if (c.from_child >= 0) ::close(c.from_child);
  c.to_child = c.from_child = -1;
  int status = 0;
  while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  c.pid = -1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

const WarmFile& warm_file() {
  static const WarmFile f = [] {
    WarmFile w;
    w.path = scratch_path("warm10k");
    w.keys_path = w.path + ".keys";
    // 4-48 KiB, uniform: enough total for kWarmEntries sizes of at most 48 KiB; the surplus is
    // dropped. About 254 MiB in all.
    w.sizes = mixed_sizes(std::uint64_t{kWarmEntries} * (48 << 10), 4 << 10, 48 << 10, 11, false);
    w.sizes.resize(kWarmEntries);
    char key[64];
    std::ofstream keys_out(w.keys_path);
    for (std::size_t i = 0; i < kWarmEntries; ++i) {
      std::snprintf(key, sizeof key, "blk.%03zu.ffn_%zu.weight", i / 8, i % 8);
      w.keys.emplace_back(key);
      keys_out << key << '\n';
      w.payload += w.sizes[i];
    }
    keys_out.close();
    if (!keys_out) w.error = "cannot write " + w.keys_path;
    auto cache = WeightCache::open(bench_options(w.path, w.compat));
    if (!cache) {
      w.error = cache.error().message;
      return w;
    }
    for (std::size_t i = 0; i < kWarmEntries; ++i) {
      void* p = cache->reserve(w.sizes[i]);
      if (p == nullptr ||
          (fill_pattern(p, w.sizes[i], i), cache->look_up_or_insert(w.keys[i], p, w.sizes[i])) == kNotFound) {
        w.error = last_error().message;
        return w;
      }
    }
    if (auto r = cache->finalize(); !r) w.error = r.error().message;
    return w;
  }();
  return f;
}

double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

void record_sample(const std::string& name, double v) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  r.samples[name].push_back(v);
}

bool has_sample(const std::string& name) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.samples.count(name) != 0 && !r.samples[name].empty();
}

double median_sample(const std::string& name) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<double> v = r.samples[name];
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void record_time(const std::string& name, const Lap& lap) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  r.times[name].push_back(lap);
}

void record_value(const std::string& name, double v) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  r.values[name] = v;
}

bool has_time(const std::string& name) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.times.count(name) != 0 && !r.times[name].empty();
}

double median_time(const std::string& name, bool cpu) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<double> v;
  for (const Lap& l : r.times[name]) v.push_back(cpu ? l.cpu : l.wall);
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

bool has_value(const std::string& name) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.values.count(name) != 0;
}

double value(const std::string& name) {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.values.count(name) ? r.values[name] : 0;
}

Options bench_options(const std::string& path, const std::string& compat) {
  Options o;
  o.path = path;
  o.compat_key = compat;
  o.durability = Durability::none;
  o.backing = Backing::file;  // a silent heap fallback would measure the wrong thing
  return o;
}

}  // namespace weightcache::bench
