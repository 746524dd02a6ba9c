// Crash simulation: the run "dies" at a chosen sync point (that sync and every later call fail),
// and the file is rebuilt as a crash would leave it: with the unsynced changes kept (a killed
// process), dropped (power loss before write-back), garbled (torn writes), or a random mix per
// changed byte run. Then a clean reopen must serve no wrong bytes and keep every entry whose
// finalize returned ok before the crash. Garbling follows the power-safe-overwrite model: a write
// can damage the bytes it writes, never bytes it does not touch (docs/RELIABILITY.md).
#include "hooks.hpp"
#include "scenario.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& p, const std::string& bytes) {
  fs::remove(p);
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

enum class Mode { keep, drop, garble, mixed };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::keep: return "keep";
    case Mode::drop: return "drop";
    case Mode::garble: return "garble";
    case Mode::mixed: return "mixed";
  }
  return "?";
}

// Tracks what is durable per path: a snapshot at each fdatasync, patched ranges at each
// msync(MS_SYNC), moved by rename.
class Recorder {
 public:
  void on_sync(const std::string& path) {
    if (path.empty() || !fs::is_regular_file(path)) return;
    durable_[path] = read_file(path);
  }
  void on_msync(const std::string& path, std::int64_t off, std::size_t len) {
    if (path.empty()) return;
    const std::string now = read_file(path);
    std::string& d = durable_[path];
    if (d.size() < now.size()) d.resize(now.size(), '\0');
    const std::size_t end = std::min<std::size_t>(now.size(), static_cast<std::size_t>(off) + len);
    for (std::size_t i = static_cast<std::size_t>(off); i < end; ++i) d[i] = now[i];
  }
  void on_rename(const std::string& from, const std::string& to) {
    auto it = durable_.find(from);
    if (it == durable_.end()) {
      durable_.erase(to);
      return;
    }
    durable_[to] = it->second;
    durable_.erase(it);
  }
  const std::string* durable(const std::string& p) const {
    auto it = durable_.find(p);
    return it == durable_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::string, std::string> durable_;
};

std::string after_crash(const std::string& volatile_bytes, const std::string* durable, Mode mode, std::mt19937_64& rng) {
  if (mode == Mode::keep) return volatile_bytes;
  const std::string base = durable ? *durable : std::string();
  if (mode == Mode::drop) return base;
  // Walk the runs of bytes that differ between durable and volatile; the file keeps the
  // volatile size (its metadata may or may not have made it: both are covered by keep/drop).
  std::string out = volatile_bytes;
  std::size_t i = 0;
  while (i < out.size()) {
    const bool differs = i >= base.size() || base[i] != volatile_bytes[i];
    if (!differs) { ++i; continue; }
    std::size_t j = i;
    while (j < out.size() && (j >= base.size() || base[j] != volatile_bytes[j])) ++j;
    int choice = mode == Mode::garble ? 2 : static_cast<int>(rng() % 3);
    for (std::size_t k = i; k < j; ++k) {
      if (choice == 0) out[k] = volatile_bytes[k];
      else if (choice == 1) out[k] = k < base.size() ? base[k] : '\0';
      else out[k] = static_cast<char>(rng());
    }
    i = j;
  }
  return out;
}

struct Totals {
  std::uint64_t crashes = 0, wrong = 0, lost = 0, durable_checked = 0;
};

void crash_at(std::uint64_t sync_point, Mode mode, std::uint64_t seed, Totals* totals) {
  const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  std::string t = (base / "wc-crash-XXXXXX").string();
  const fs::path dir = ::mkdtemp(t.data());
  const std::string path = (dir / "cache.wc").string();
  Recorder rec;
  std::string volatile_at_crash;
  bool have_volatile = false;
  wctest::Outcome out;
  {
    std::uint64_t syncs = 0;
    bool dead = false;
    wctest::Hooks* self = nullptr;
    wctest::Hooks hooks(
        [&](wctest::Call c, std::uint64_t) {
          if (dead) return wctest::Decision{wctest::Decision::fail, EIO};
          if (c == wctest::Call::fdatasync || c == wctest::Call::fsync || c == wctest::Call::msync) {
            if (++syncs == sync_point) {
              dead = true;
              if (fs::exists(path)) {
                volatile_at_crash = read_file(path);
                have_volatile = true;
              }
              return wctest::Decision{wctest::Decision::fail, EIO};
            }
          }
          return wctest::Decision{};
        },
        [&](wctest::Call c, int fd, const void* addr, std::size_t len, std::int64_t, int flags) {
          if (c == wctest::Call::fdatasync || c == wctest::Call::fsync) rec.on_sync(self->path_of(fd));
          if (c == wctest::Call::msync && (flags & MS_SYNC)) {
            int mfd = -1;
            std::int64_t off = 0;
            if (self->file_of(addr, &mfd, &off)) rec.on_msync(self->path_of(mfd), off, len);
          }
        });
    self = &hooks;
    hooks.rename_observer_ = [&](const std::string& a, const std::string& b) { rec.on_rename(a, b); };
    out = wctest::run_scenario(path, 3, 5);
  }
  std::mt19937_64 rng(seed);
  if (have_volatile) {
    write_file(path, after_crash(volatile_at_crash, rec.durable(path), mode, rng));
  } else if (fs::exists(path)) {
    // Crash after the run finished (sync_point past the last sync): the file is as it is.
  }
  auto c = weightcache::WeightCache::open(wctest::scenario_options(path));
  ASSERT_TRUE(c.ok()) << c.error().message;
  const wctest::Damage d = wctest::damage_after(c.value(), out);
  EXPECT_EQ(d.wrong, 0u) << "crash at sync " << sync_point << " mode " << mode_name(mode);
  EXPECT_EQ(d.lost, 0u) << "crash at sync " << sync_point << " mode " << mode_name(mode);
  totals->crashes++;
  totals->wrong += d.wrong;
  totals->lost += d.lost;
  totals->durable_checked += out.durable.size();
  c = weightcache::Error{};
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(CrashSimulation, EverySyncPointEveryMode) {
  weightcache::set_log_level(weightcache::LogLevel::off);
  // Count the sync points of an undisturbed run.
  std::uint64_t sync_points = 0;
  {
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string t = (base / "wc-crash-XXXXXX").string();
    const fs::path dir = ::mkdtemp(t.data());
    wctest::Hooks hooks([&](wctest::Call c, std::uint64_t) {
      if (c == wctest::Call::fdatasync || c == wctest::Call::fsync || c == wctest::Call::msync) ++sync_points;
      return wctest::Decision{};
    });
    const auto out = wctest::run_scenario((dir / "cache.wc").string(), 3, 5);
    EXPECT_EQ(out.durable.size(), out.all.size());
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  ASSERT_GE(sync_points, 9u);  // at least data, index and slot flushes for each of 3 finalizes
  const int seeds = std::getenv("WEIGHTCACHE_FULL") ? 20 : 4;
  Totals totals;
  for (std::uint64_t k = 1; k <= sync_points + 1; ++k)
    for (Mode m : {Mode::keep, Mode::drop, Mode::garble, Mode::mixed})
      for (int s = 0; s < (m == Mode::mixed || m == Mode::garble ? seeds : 1); ++s)
        crash_at(k, m, 1000 * k + s, &totals);
  weightcache::set_log_level(weightcache::LogLevel::warn);
  EXPECT_GT(totals.durable_checked, 0u);
  std::printf("crash simulation: %llu sync points, %llu simulated crashes, durable entries checked: %llu, "
              "wrong bytes served: %llu, durable entries lost: %llu, crashes: 0\n",
              (unsigned long long)sync_points, (unsigned long long)totals.crashes,
              (unsigned long long)totals.durable_checked, (unsigned long long)totals.wrong,
              (unsigned long long)totals.lost);
}

}  // namespace
