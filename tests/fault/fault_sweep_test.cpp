// Fails the Nth system call of a whole open/reserve/insert/finalize/reopen run, for every N, with
// each kind of fault, transient and persistent; then reopens without faults and checks that no
// wrong bytes were ever served and every entry of a finalize that returned ok is still there.
#include "hooks.hpp"
#include "scenario.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
using wctest::Call;

constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ, as src/platform/posix.cpp asks for it

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
  std::vector<Call> only;  // the calls that return this errno; empty: every call
  bool applies(Call c) const { return only.empty() || std::find(only.begin(), only.end(), c) != only.end(); }
};

const FaultKind kKinds[] = {
    {"EIO", {wctest::Decision::fail, EIO}, {}},
    {"ENOSPC", {wctest::Decision::fail, ENOSPC}, {}},
    {"EINTR", {wctest::Decision::fail, EINTR}, {}},
    {"short-write", {wctest::Decision::short_write, 0}, {}},
    {"ENOMEM", {wctest::Decision::fail, ENOMEM}, {}},
    // Nearly every call lists it; for fcntl, madvise and getrlimit it is the one failure.
    {"EINVAL", {wctest::Decision::fail, EINVAL}, {}},
    // The errnos below only where the OS returns them. EAGAIN from flock means "another process
    // holds the lease", a wait the lease suites cover; a persistent one here would only time it out.
    {"EAGAIN", {wctest::Decision::fail, EAGAIN}, {Call::mmap, Call::madvise}},
    {"EBUSY", {wctest::Decision::fail, EBUSY}, {Call::unlink, Call::rename}},
    // From MADV_POPULATE_READ: the pages cannot be read (the file is shorter than the mapping).
    {"EFAULT", {wctest::Decision::fail, EFAULT}, {Call::madvise, Call::getrlimit}},
#ifdef EHWPOISON
    {"EHWPOISON", {wctest::Decision::fail, EHWPOISON}, {Call::madvise}},
#endif
};

struct Totals {
  std::uint64_t runs = 0, wrong = 0, lost = 0, off_script = 0;
  std::array<std::uint64_t, wctest::kCallCount> failed{};  // faults injected, by call
};

// The calls of an undisturbed run, in order: seq[i - 1] is call number i.
struct CleanRun {
  std::vector<Call> seq;
  std::uint64_t populates = 0;  // MADV_POPULATE_READ calls among the madvises
};

// Runs the scenario with call `n` (and, if persistent, every later call `kind` applies to) faulted.
void run_one(std::uint64_t n, bool persistent, const FaultKind& kind, const CleanRun& clean, Totals* totals,
             bool seed_first) {
  TempDir dir;
  const std::string path = (dir.path / "cache.wc").string();
  wctest::Outcome seeded;
  if (seed_first) seeded = wctest::run_scenario(path, 1, 4);  // a durable state to protect
  wctest::Outcome out;
  {
    wctest::Hooks hooks([&](Call c, std::uint64_t i) {
      // Up to call n the run repeats the clean one, or the sweep does not fail the call it means to.
      if (i == n && c != clean.seq[n - 1]) totals->off_script++;
      if ((i == n || (persistent && i > n)) && kind.applies(c)) {
        if (c != Call::munmap) totals->failed[static_cast<int>(c)]++;  // the hooks never fail an unmap
        // Short writes only make sense for pwrite and pwritev: EIO elsewhere.
        if (kind.decision.kind == wctest::Decision::short_write && c != Call::pwrite && c != Call::pwritev)
          return wctest::Decision{wctest::Decision::fail, EIO};
        return kind.decision;
      }
      return wctest::Decision{};
    });
    out = wctest::run_scenario(path, 2, 4);
  }
  wctest::check_reopened(wctest::scenario_options(path), std::move(out), seeded,
                         "fault " + std::string(kind.name) + " at call " + std::to_string(n) +
                             (persistent ? " (persistent)" : ""),
                         totals);
}

CleanRun clean_run(bool seed_first) {
  TempDir dir;
  const std::string path = (dir.path / "cache.wc").string();
  if (seed_first) (void)wctest::run_scenario(path, 1, 4);
  CleanRun clean;
  wctest::Hooks hooks(
      [&](Call c, std::uint64_t) {
        clean.seq.push_back(c);
        return wctest::Decision{};
      },
      [&](Call c, int, const void*, std::size_t, std::int64_t, int flags) {
        if (c == Call::madvise && flags == kPopulateRead) clean.populates++;
      });
  const auto out = wctest::run_scenario(path, 2, 4);
  // Without faults every key must end durable, or the sweep would prove nothing.
  EXPECT_EQ(out.durable.size(), out.all.size());
  EXPECT_EQ(out.wrong_bytes, 0u);
  return clean;
}

std::string by_call(const std::array<std::uint64_t, wctest::kCallCount>& counts) {
  std::string s;
  for (int c = 0; c < wctest::kCallCount; ++c)
    if (counts[c] != 0)
      s += std::string(s.empty() ? "" : ", ") + wctest::call_name(static_cast<Call>(c)) + " " + std::to_string(counts[c]);
  return s;
}

class FaultSweep : public ::testing::TestWithParam<bool> {};

TEST_P(FaultSweep, EveryCallEveryKindTransientAndPersistent) {
  weightcache::set_log_level(weightcache::LogLevel::off);
  const bool seed_first = GetParam();
  const CleanRun clean = clean_run(seed_first);
  const std::uint64_t calls = clean.seq.size();
  ASSERT_GT(calls, 20u);
  // The run must make every call below, or the sweep never fails it. (Not made by an undisturbed
  // run, so failed only after an earlier fault: unlink of a failed rebuild's temporary, mprotect
  // of the heap fallback. prefetch's madvise: nothing calls it yet.)
  std::array<std::uint64_t, wctest::kCallCount> made{};
  for (Call c : clean.seq) made[static_cast<int>(c)]++;
  for (Call c : {Call::open, Call::close, Call::fstat, Call::pread, Call::pwrite, Call::pwritev, Call::posix_fallocate,
                 Call::ftruncate, Call::fdatasync, Call::mmap, Call::munmap, Call::msync, Call::flock, Call::stat,
                 Call::lstat, Call::fcntl, Call::fcntl_lock, Call::futimens, Call::getrlimit})
    EXPECT_GT(made[static_cast<int>(c)], 0u) << wctest::call_name(c) << " is not in the run";
  if (!seed_first) {  // creating the file: temporary, rename, directory sync
    EXPECT_GT(made[static_cast<int>(Call::rename)], 0u);
    EXPECT_GT(made[static_cast<int>(Call::fsync)], 0u);
  }
#ifdef __linux__  // huge-page advice at each map, and populating before a check
  EXPECT_GT(made[static_cast<int>(Call::madvise)], clean.populates);
  EXPECT_GT(clean.populates, 0u) << "no entry was big enough to be populated before its check";
#endif
  std::printf("calls per run: %llu (%s)\n", (unsigned long long)calls, by_call(made).c_str());
  // Every call, every kind that call can return: the run is small enough that CI needs no sampling.
  Totals totals;
  for (const auto& kind : kKinds)
    for (bool persistent : {false, true}) {
      // A signal storm that never ends is not a fault the OS produces: EINTR is transient only.
      if (persistent && kind.decision.err == EINTR) continue;
      // Two numbers past the last call too, for the kinds of every call: a fault that never comes.
      for (std::uint64_t n = 1; n <= calls + 2; ++n)
        if (n <= calls ? kind.applies(clean.seq[n - 1]) : kind.only.empty())
          run_one(n, persistent, kind, clean, &totals, seed_first);
    }
  weightcache::set_log_level(weightcache::LogLevel::warn);
  EXPECT_EQ(totals.off_script, 0u) << "faulted runs that did not repeat the clean run up to the fault";
  std::printf("faults injected by call: %s\n", by_call(totals.failed).c_str());
  std::printf("fault sweep (%s): %llu calls per run, %llu faulted runs, wrong bytes served: %llu, "
              "durable entries lost: %llu, crashes: 0\n",
              seed_first ? "over an existing cache" : "from an empty path", (unsigned long long)calls,
              (unsigned long long)totals.runs, (unsigned long long)totals.wrong, (unsigned long long)totals.lost);
}

INSTANTIATE_TEST_SUITE_P(Start, FaultSweep, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "ExistingCache" : "EmptyPath"; });

}  // namespace
