// Growth of a cache whose every entry is replaced at every launch (a packer upgrade each time,
// the worst case for dead bytes), with default options, against the same loop without
// compaction at open (compact_dead_percent = 0). Each launch is a separate process (this binary
// started again with "launch"), as an application's launches are.
//   weightcache-growth [LAUNCHES [MIB]]        prints one line per launch: file bytes, both modes
//   weightcache-growth launch PATH GEN MIB ON  one launch (internal)
#include <weightcache/weight_cache.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace {

using namespace weightcache;
constexpr std::size_t kEntrySize = 1u << 20;  // 1 MiB entries, as a layer's weights

void fill(std::string& s, const std::string& key, unsigned long gen) {
  std::uint64_t x = std::hash<std::string>{}(key) ^ (gen * 0x9e3779b97f4a7c15ull) ^ 1;
  auto* p = reinterpret_cast<std::uint64_t*>(s.data());
  for (std::size_t i = 0; i < s.size() / 8; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = x;
  }
}

int launch(const std::string& path, unsigned long gen, unsigned long mib, bool compact) {
  Options o;
  o.path = path;
  o.compat_key = "growth";
  o.durability = Durability::none;
  if (!compact) o.compact_dead_percent = 0;
  auto c = WeightCache::open(o);
  if (!c) return 10;
  std::string bytes(kEntrySize, '\0');
  for (unsigned long i = 0; i < mib; ++i) {
    const std::string key = "layer" + std::to_string(i);
    void* p = c->reserve(kEntrySize);
    if (p == nullptr) return 11;
    fill(bytes, key, gen);
    std::memcpy(p, bytes.data(), bytes.size());
    if (c->look_up_or_insert(key, p, kEntrySize) == kNotFound) return 12;
  }
  if (!c->finalize().ok()) return 13;
  return c->stats().compactions != 0 ? 100 : 0;  // 100: this launch compacted at open
}

int run_launch(const char* self, const std::string& path, unsigned long gen, unsigned long mib, bool compact) {
  std::vector<std::string> args = {self, "launch", path, std::to_string(gen), std::to_string(mib), compact ? "1" : "0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace

int main(int argc, char** argv) {
  set_log_level(LogLevel::error);
  if (argc == 6 && std::strcmp(argv[1], "launch") == 0)
    return launch(argv[2], std::strtoul(argv[3], nullptr, 10), std::strtoul(argv[4], nullptr, 10), argv[5][0] == '1');
  const unsigned long launches = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 50;
  const unsigned long mib = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 64;
  const char* dir_env = std::getenv("WEIGHTCACHE_BENCH_DIR");
  const std::filesystem::path dir = dir_env != nullptr ? dir_env : std::filesystem::temp_directory_path();
  const std::string on = (dir / "growth-on.wcache").string(), off = (dir / "growth-off.wcache").string();
  for (const auto& p : {on, off}) {
    std::filesystem::remove(p);
    std::filesystem::remove(p + ".lock");
  }
  const double live = static_cast<double>(mib * kEntrySize);
  std::printf("# launch  file_bytes_with_compaction  x_live  compacted_at_open  file_bytes_without  x_live  "
              "ms_with  ms_without\n");
  double worst_on = 0, worst_off = 0;
  unsigned compactions = 0;
  double sum_on = 0, sum_off = 0, sum_first = 0;
  for (unsigned long l = 1; l <= launches; ++l) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const int a = run_launch(argv[0], on, l, mib, true);
    const auto t1 = clock::now();
    const int b = run_launch(argv[0], off, l, mib, false);
    const auto t2 = clock::now();
    const double ms_on = std::chrono::duration<double, std::milli>(t1 - t0).count();
    const double ms_off = std::chrono::duration<double, std::milli>(t2 - t1).count();
    (l == 1 ? sum_first : sum_on) += ms_on;
    sum_off += l == 1 ? 0 : ms_off;
    if ((a != 0 && a != 100) || b != 0) {
      std::fprintf(stderr, "launch %lu failed (%d, %d)\n", l, a, b);
      return 1;
    }
    compactions += a == 100;
    const auto s_on = std::filesystem::file_size(on), s_off = std::filesystem::file_size(off);
    worst_on = std::max(worst_on, s_on / live);
    worst_off = std::max(worst_off, s_off / live);
    std::printf("%lu %llu %.3f %d %llu %.3f %.1f %.1f\n", l, static_cast<unsigned long long>(s_on), s_on / live,
                a == 100, static_cast<unsigned long long>(s_off), s_off / live, ms_on, ms_off);
  }
  std::printf("# %lu launches of a %lu MiB cache, every entry replaced each time: largest file %.2fx the live bytes "
              "with compaction at open (%u compactions), %.2fx without\n",
              launches, mib, worst_on, compactions, worst_off);
  if (launches > 1)
    std::printf("# mean launch after the first: %.1f ms with compaction at open, %.1f ms without (%.2fx)\n",
                sum_on / (launches - 1), sum_off / (launches - 1), sum_on / sum_off);
  for (const auto& p : {on, off}) {
    std::filesystem::remove(p);
    std::filesystem::remove(p + ".lock");
  }
  return worst_on <= 2.5 ? 0 : 2;
}
