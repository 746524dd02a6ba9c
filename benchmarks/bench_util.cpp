#include "bench_util.hpp"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#ifndef WEIGHTCACHE_BENCH_DEFAULT_DIR
#define WEIGHTCACHE_BENCH_DEFAULT_DIR "."
#endif

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

std::size_t file_vmas(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  std::ifstream in("/proc/self/maps");
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string range, perms, offset, dev;
    unsigned long long inode = 0;
    ls >> range >> perms >> offset >> dev >> inode;
    unsigned maj = 0, min = 0;
    std::sscanf(dev.c_str(), "%x:%x", &maj, &min);
    if (inode == st.st_ino && maj == major(st.st_dev) && min == minor(st.st_dev)) ++n;
  }
  return n;
}

double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
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
