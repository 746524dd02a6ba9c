// Fails the Nth system call of a whole open/reserve/insert/finalize/reopen run, for every N, with
// each kind of fault, transient and persistent; then reopens without faults and checks that no
// wrong bytes were ever served and every entry of a finalize that returned ok is still there.
#include "hooks.hpp"
#include "scenario.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    // tmpfs when available: the sweep runs thousands of fsyncs, which cost nothing there.
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string t = (base / "wc-fault-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::error_code ec; fs::remove_all(path, ec); }
};

struct FaultKind {
  const char* name;
  wctest::Decision decision;
};

const FaultKind kKinds[] = {
    {"EIO", {wctest::Decision::fail, EIO}},
    {"ENOSPC", {wctest::Decision::fail, ENOSPC}},
    {"EINTR", {wctest::Decision::fail, EINTR}},
    {"short-write", {wctest::Decision::short_write, 0}},
    {"ENOMEM", {wctest::Decision::fail, ENOMEM}},
};

struct Totals {
  std::uint64_t runs = 0, wrong = 0, lost = 0;
};

// Runs the scenario with call `n` (and, if persistent, every later call) faulted.
void run_one(std::uint64_t n, bool persistent, const FaultKind& kind, Totals* totals, bool seed_first) {
  TempDir dir;
  const std::string path = (dir.path / "cache.wc").string();
  wctest::Outcome seeded;
  if (seed_first) seeded = wctest::run_scenario(path, 1, 4);  // a durable state to protect
  wctest::Outcome out;
  {
    wctest::Hooks hooks([&](wctest::Call c, std::uint64_t i) {
      if (i == n || (persistent && i > n)) {
        // EINTR on fallocate is returned as a value; short writes only make sense for pwrite.
        if (kind.decision.kind == wctest::Decision::short_write && c != wctest::Call::pwrite)
          return wctest::Decision{wctest::Decision::fail, EIO};
        return kind.decision;
      }
      return wctest::Decision{};
    });
    out = wctest::run_scenario(path, 2, 4);
  }
  out.durable.insert(seeded.durable.begin(), seeded.durable.end());
  out.all.insert(out.all.end(), seeded.all.begin(), seeded.all.end());
  auto c = weightcache::WeightCache::open(wctest::scenario_options(path));
  ASSERT_TRUE(c.ok()) << c.error().message;
  const wctest::Damage d = wctest::damage_after(c.value(), out);
  EXPECT_EQ(d.wrong, 0u) << "fault " << kind.name << " at call " << n << (persistent ? " (persistent)" : "");
  EXPECT_EQ(d.lost, 0u) << "fault " << kind.name << " at call " << n << (persistent ? " (persistent)" : "");
  totals->runs++;
  totals->wrong += d.wrong;
  totals->lost += d.lost;
}

std::uint64_t count_calls(bool seed_first) {
  TempDir dir;
  const std::string path = (dir.path / "cache.wc").string();
  if (seed_first) (void)wctest::run_scenario(path, 1, 4);
  wctest::Hooks hooks([](wctest::Call, std::uint64_t) { return wctest::Decision{}; });
  const auto out = wctest::run_scenario(path, 2, 4);
  // Without faults every key must end durable, or the sweep would prove nothing.
  EXPECT_EQ(out.durable.size(), out.all.size());
  EXPECT_EQ(out.wrong_bytes, 0u);
  return hooks.calls();
}

class FaultSweep : public ::testing::TestWithParam<bool> {};

TEST_P(FaultSweep, EveryCallEveryKindTransientAndPersistent) {
  weightcache::set_log_level(weightcache::LogLevel::off);
  const bool seed_first = GetParam();
  const std::uint64_t calls = count_calls(seed_first);
  ASSERT_GT(calls, 20u);
  std::printf("calls per run: %llu\n", (unsigned long long)calls);
  // Every call, every kind: the run is small enough that CI needs no sampling.
  Totals totals;
  for (const auto& kind : kKinds)
    for (bool persistent : {false, true}) {
      // A signal storm that never ends is not a fault the OS produces: EINTR is transient only.
      if (persistent && kind.decision.err == EINTR) continue;
      for (std::uint64_t n = 1; n <= calls + 2; ++n) run_one(n, persistent, kind, &totals, seed_first);
    }
  weightcache::set_log_level(weightcache::LogLevel::warn);
  std::printf("fault sweep (%s): %llu calls per run, %llu faulted runs, wrong bytes served: %llu, "
              "durable entries lost: %llu, crashes: 0\n",
              seed_first ? "over an existing cache" : "from an empty path", (unsigned long long)calls,
              (unsigned long long)totals.runs, (unsigned long long)totals.wrong, (unsigned long long)totals.lost);
}

INSTANTIATE_TEST_SUITE_P(Start, FaultSweep, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "ExistingCache" : "EmptyPath"; });

}  // namespace
