// Fault injection on Windows (issue 7, "the same tests as on Linux"): fails the Nth Win32 call of
// a whole open/reserve/insert/finalize/reopen run with each kind of fault, transient (only the
// Nth) and persistent (the Nth and every later one the kind applies to); then reopens without
// faults and checks that no wrong bytes were ever served, that every entry of a finalize that
// returned ok is still there, and that the run left no file handle or view behind. The run is
// tests/fault/scenario.hpp's (its keys, contents, checks and rounds, with a smaller address
// range), so both platforms sweep the same work.
//
// CI samples N with a stride of 7, at a phase that differs per kind and persistence (so the
// kinds that apply to every call fail every N between them), and always at the first and last
// call of each function (so every function is failed by every kind that applies to it):
// about 1,100 faulted runs, half a minute under Wine. WEIGHTCACHE_FULL=1 sweeps every N of
// every kind (about 3,200 runs, a minute and a half).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>
#include <weightcache/weight_cache.hpp>

#include "../fault/scenario.hpp"
#include "platform/platform.hpp"
#include "win32_hooks.hpp"
#include "win32_util.hpp"

namespace {

namespace fs = std::filesystem;
using wctest::WinCall;
using wctest::WinDecision;

// A fresh directory, removed on destruction. Under Wine on a machine with /dev/shm, there (Z: is
// the Linux root): tmpfs makes the sweep's thousands of FlushFileBuffers (fsync) free.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<unsigned> counter{0};
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);
    if (weightcache::test::under_wine() && fs::is_directory("Z:/dev/shm", ec)) base = "Z:/dev/shm";
    std::random_device rd;
    for (int attempt = 0; attempt < 100 && path_.empty(); ++attempt) {
      const fs::path p = base / ("wc-winfault-" + std::to_string(rd()) + "-" + std::to_string(counter++));
      if (fs::create_directory(p, ec)) path_ = p;
    }
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const char* name) const { return (path_ / name).string(); }
  bool ok() const { return !path_.empty(); }

 private:
  fs::path path_;
};

// The library's warnings during a run (the fallbacks to heap memory say why they happened).
struct Warnings {
  std::mutex mu;
  std::vector<std::string> messages;
  static void sink(void* self, wc_log_level level, const char* message, std::size_t size) {
    if (level < WC_LOG_WARN) return;
    auto* w = static_cast<Warnings*>(self);
    std::lock_guard<std::mutex> l(w->mu);
    w->messages.emplace_back(message, size);
  }
  std::vector<std::string> take() {
    std::lock_guard<std::mutex> l(mu);
    return std::exchange(messages, {});
  }
};
Warnings g_warnings;

// A failure the library blames on the caller or the file, where the path is a good one, every
// argument valid and the file a regular one: an OS failure misreported (or the platform losing
// track of its ranges).
bool misreported(const std::string& message) {
  return message.find("WC_ERR_INVALID_ARGUMENT") != std::string::npos ||
         message.find("not a regular file") != std::string::npos;
}

struct FaultKind {
  const char* name;
  WinDecision decision;
  std::vector<WinCall> only;  // the calls that return this error; empty: every call
  bool applies(WinCall c) const { return only.empty() || std::find(only.begin(), only.end(), c) != only.end(); }
};

const FaultKind kKinds[] = {
    // Any call: a device error, a full disk, no memory, and "access denied" (what a virus
    // scanner or a changed ACL says).
    {"ERROR_IO_DEVICE", {WinDecision::fail, ERROR_IO_DEVICE}, {}},
    {"ERROR_DISK_FULL", {WinDecision::fail, ERROR_DISK_FULL}, {}},
    {"ERROR_NOT_ENOUGH_MEMORY", {WinDecision::fail, ERROR_NOT_ENOUGH_MEMORY}, {}},
    {"ERROR_ACCESS_DENIED", {WinDecision::fail, ERROR_ACCESS_DENIED}, {}},
    // The calls that write or grow a file.
    {"ERROR_HANDLE_DISK_FULL",
     {WinDecision::fail, ERROR_HANDLE_DISK_FULL},
     {WinCall::write_file, WinCall::set_file_information_by_handle, WinCall::create_file_mapping_w,
      WinCall::flush_view_of_file, WinCall::flush_file_buffers}},
    {"short-write", {WinDecision::short_write, 0}, {WinCall::write_file}},
    // Someone else's byte-range lock over the bytes (Windows locks are mandatory), or pages
    // being written by another flush. Not LockFileEx: there it means "another process holds the
    // lease", a wait the lease tests cover; a persistent one here would only time it out.
    {"ERROR_LOCK_VIOLATION",
     {WinDecision::fail, ERROR_LOCK_VIOLATION},
     {WinCall::read_file, WinCall::write_file, WinCall::flush_view_of_file}},
    // A handle opened without sharing (a scanner, a backup tool) on a name we open, rename or delete.
    {"ERROR_SHARING_VIOLATION",
     {WinDecision::fail, ERROR_SHARING_VIOLATION},
     {WinCall::create_file_w, WinCall::move_file_ex_w, WinCall::delete_file_w,
      WinCall::set_file_information_by_handle}},
    // Moving the end of a file that another process maps.
    {"ERROR_USER_MAPPED_FILE",
     {WinDecision::fail, ERROR_USER_MAPPED_FILE},
     {WinCall::set_file_information_by_handle}},
    // The address is taken (another thread's allocation won the race for a released range).
    {"ERROR_INVALID_ADDRESS",
     {WinDecision::fail, ERROR_INVALID_ADDRESS},
     {WinCall::map_view_of_file_ex, WinCall::map_view_of_file3, WinCall::virtual_alloc, WinCall::virtual_alloc2,
      WinCall::virtual_free}},
    // A file system or Windows version without the call (FAT has no POSIX rename or allocation
    // size, a network share may take no locks).
    {"ERROR_NOT_SUPPORTED",
     {WinDecision::fail, ERROR_NOT_SUPPORTED},
     {WinCall::set_file_information_by_handle, WinCall::get_file_information_by_handle_ex, WinCall::lock_file_ex,
      WinCall::map_view_of_file3, WinCall::virtual_alloc2, WinCall::prefetch_virtual_memory,
      WinCall::device_io_control}},
};
constexpr int kKindCount = static_cast<int>(sizeof(kKinds) / sizeof(kKinds[0]));

using PerCall = std::array<std::uint64_t, wctest::kWinCallCount>;

struct Totals {
  std::uint64_t runs = 0, wrong = 0, lost = 0, off_script = 0, handles_left = 0, views_left = 0, reservations_left = 0,
                misreported = 0;
  PerCall failed{};                        // faults injected, by call
  std::array<std::uint64_t, 10> errors{};  // errors open and finalize returned, by weightcache::Errc
};

std::string by_errc(const std::array<std::uint64_t, 10>& counts) {
  std::string s;
  for (int e = 0; e < 10; ++e)
    if (counts[e] != 0)
      s += std::string(s.empty() ? "" : ", ") + weightcache::to_string(static_cast<weightcache::Errc>(e)) + " " +
           std::to_string(counts[e]);
  return s.empty() ? "none" : s;
}

std::string by_call(const PerCall& counts) {
  std::string s;
  for (int c = 0; c < wctest::kWinCallCount; ++c)
    if (counts[c] != 0)
      s += std::string(s.empty() ? "" : ", ") + wctest::win_call_name(static_cast<WinCall>(c)) + " " +
           std::to_string(counts[c]);
  return s;
}

// The scenario's address range here: Wine keeps a byte per page of every reservation, so a
// cache's default 512 GiB (max_file_bytes and the heap arena after it) costs 25 ms to reserve
// there, and legacy mode reserves the rest again after each view it maps.
constexpr std::uint64_t kSweepMaxFileBytes = std::uint64_t{64} << 20;

weightcache::Options sweep_options(const std::string& path) {
  return wctest::scenario_options(path, kSweepMaxFileBytes);
}

// wctest::run_scenario with sweep_options: rounds that each open the cache, check what is
// there, pack `per_round` new keys (half through reservations, half copied in), finalize, close.
// Odd rounds open with allow_symlink. The errors open and finalize returned go to `errors`.
wctest::Outcome run_rounds(const std::string& path, int rounds, int per_round,
                           std::vector<weightcache::Error>* errors = nullptr) {
  return wctest::run_scenario(path, rounds, per_round, kSweepMaxFileBytes, errors);
}

// Runs the scenario with call `n` (and, if persistent, every later call `kind` applies to) faulted.
void run_one(std::uint64_t n, bool persistent, const FaultKind& kind, const std::vector<WinCall>& clean, Totals* totals,
             bool seed_first) {
  ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("cache.wc");
  wctest::Outcome seeded;
  if (seed_first) seeded = run_rounds(path, 1, 4);  // a durable state to protect
  wctest::Outcome out;
  {
    wctest::Win32Hooks hooks([&](WinCall c, std::uint64_t i) {
      // Up to call n the run repeats the clean one, or the sweep does not fail the call it means to.
      if (i == n && (n > clean.size() || c != clean[n - 1])) totals->off_script++;
      if ((i == n || (persistent && i > n)) && kind.applies(c)) {
        totals->failed[static_cast<int>(c)]++;
        return kind.decision;
      }
      return WinDecision{};
    });
    std::vector<weightcache::Error> errors;
    (void)g_warnings.take();
    out = run_rounds(path, 2, 4, &errors);
    std::vector<std::string> said = g_warnings.take();
    for (const auto& e : errors) {
      totals->errors[std::min<std::size_t>(static_cast<std::size_t>(e.code), 9)]++;
      said.push_back(std::string(weightcache::to_string(e.code)) + ": " + e.message);
      if (e.code == weightcache::Errc::invalid_argument) said.back() += " (WC_ERR_INVALID_ARGUMENT)";
    }
    for (const auto& m : said) {
      if (!misreported(m)) continue;
      totals->misreported++;
      ADD_FAILURE() << "fault " << kind.name << " at call " << n << (persistent ? " (persistent)" : "")
                    << " reported as the caller's or the file's fault: " << m;
    }
    // Every cache of the run is closed: whatever it opened or mapped must be gone.
    const std::size_t handles = hooks.open_handles(), views = hooks.mapped_views();
    EXPECT_EQ(handles, 0u) << "handles left open after fault " << kind.name << " at call " << n
                           << (persistent ? " (persistent)" : "");
    EXPECT_EQ(views, 0u) << "views left mapped after fault " << kind.name << " at call " << n
                         << (persistent ? " (persistent)" : "");
    totals->handles_left += handles;
    totals->views_left += views;
    totals->reservations_left += hooks.release_leaked_reservations();
  }
  wctest::check_reopened(sweep_options(path), std::move(out), seeded,
                         "fault " + std::string(kind.name) + " at call " + std::to_string(n) +
                             (persistent ? " (persistent)" : ""),
                         totals);
}

// The calls of an undisturbed run, in order: seq[i - 1] is call number i.
std::vector<WinCall> clean_run(bool seed_first) {
  ScratchDir dir;
  EXPECT_TRUE(dir.ok());
  const std::string path = dir.file("cache.wc");
  if (seed_first) (void)run_rounds(path, 1, 4);
  std::vector<WinCall> seq;
  wctest::Win32Hooks hooks([&](WinCall c, std::uint64_t) {
    seq.push_back(c);
    return WinDecision{};
  });
  const auto out = run_rounds(path, 2, 4);
  // Without faults every key must end durable, or the sweep would prove nothing.
  EXPECT_EQ(out.durable.size(), out.all.size());
  EXPECT_EQ(out.wrong_bytes, 0u);
  EXPECT_EQ(hooks.open_handles(), 0u);
  EXPECT_EQ(hooks.mapped_views(), 0u);
  return seq;
}

bool full_sweep() { return std::getenv("WEIGHTCACHE_FULL") != nullptr; }

class WinFaultSweep : public ::testing::TestWithParam<bool> {};

TEST_P(WinFaultSweep, EveryCallEveryKindTransientAndPersistent) {
  weightcache::set_log_level(weightcache::LogLevel::warn);
  weightcache::set_log_callback(&Warnings::sink, &g_warnings);
  // The platform probes its mapping mode once per process, through the call table: done here,
  // before any hook, so that every run makes the same calls.
  (void)weightcache::platform::os().map_granularity();
  const bool seed_first = GetParam();
  const std::vector<WinCall> clean = clean_run(seed_first);
  const std::uint64_t calls = clean.size();
  ASSERT_GT(calls, 20u);
  // The run must make every call below, or the sweep never fails it. Not in an undisturbed run,
  // so failed only after an earlier fault: GetFileAttributesW (asked when CreateFileW is
  // denied), GetFullPathNameW (the POSIX-semantics rename after a refused MoveFileExW),
  // DeleteFileW (after a refused POSIX-semantics delete). Never: GetFileInformationByHandleEx
  // (asked about reparse points only), PrefetchVirtualMemory (nothing calls prefetch yet), and
  // by mapping mode MapViewOfFile3 and VirtualAlloc2, or MapViewOfFileEx.
  PerCall made{};
  for (WinCall c : clean) made[static_cast<int>(c)]++;
  for (WinCall c : {WinCall::create_file_w, WinCall::close_handle, WinCall::duplicate_handle, WinCall::read_file,
                    WinCall::write_file, WinCall::get_file_information_by_handle,
                    WinCall::set_file_information_by_handle, WinCall::get_file_type, WinCall::get_file_size_ex,
                    WinCall::flush_file_buffers, WinCall::lock_file_ex, WinCall::unlock_file_ex,
                    WinCall::create_file_mapping_w, WinCall::unmap_view_of_file, WinCall::virtual_free,
                    WinCall::flush_view_of_file})
    EXPECT_GT(made[static_cast<int>(c)], 0u) << wctest::win_call_name(c) << " is not in the run";
  if (!seed_first) {  // creating the file: a temporary renamed onto the path
    EXPECT_GT(made[static_cast<int>(WinCall::move_file_ex_w)], 0u);
  }
  std::printf("calls per run: %llu (%s)\n", (unsigned long long)calls, by_call(made).c_str());

  // Sampling (see the top of this file): the call numbers every kind fails, stride or not.
  const std::uint64_t stride = full_sweep() ? 1 : 7;
  std::vector<bool> always(calls + 1, false);
  {
    std::array<std::uint64_t, wctest::kWinCallCount> first{}, last{};
    for (std::uint64_t i = 1; i <= calls; ++i) {
      const int c = static_cast<int>(clean[i - 1]);
      if (first[c] == 0) first[c] = i;
      last[c] = i;
    }
    for (int c = 0; c < wctest::kWinCallCount; ++c)
      if (first[c] != 0) always[first[c]] = always[last[c]] = true;
  }
  Totals totals;
  for (int k = 0; k < kKindCount; ++k) {
    const FaultKind& kind = kKinds[k];
    for (bool persistent : {false, true}) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::uint64_t runs0 = totals.runs;
      const std::uint64_t phase = static_cast<std::uint64_t>(2 * k + (persistent ? 1 : 0)) % stride;
      // Two numbers past the last call too, for the kinds of every call: a fault that never comes.
      for (std::uint64_t n = 1; n <= calls + 2; ++n) {
        const bool applies = n <= calls ? kind.applies(clean[n - 1]) : kind.only.empty();
        if (!applies) continue;
        if (n <= calls && !always[n] && n % stride != phase) continue;
        run_one(n, persistent, kind, clean, &totals, seed_first);
        if (::testing::Test::HasFatalFailure()) return;
      }
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      std::printf("  %s%s: %llu runs, %lld ms\n", kind.name, persistent ? " (persistent)" : "",
                  (unsigned long long)(totals.runs - runs0), (long long)ms.count());
    }
  }
  weightcache::set_log_callback(nullptr, nullptr);
  EXPECT_EQ(totals.off_script, 0u) << "faulted runs that did not repeat the clean run up to the fault";
  std::printf("faults injected by call: %s\n", by_call(totals.failed).c_str());
  std::printf("errors open and finalize returned: %s\n", by_errc(totals.errors).c_str());
  std::printf(
      "windows fault sweep (%s, %s mapping, %s): %llu calls per run, %llu faulted runs, wrong bytes served: "
      "%llu, durable entries lost: %llu, failures misreported: %llu, handles left open: %llu, views left mapped: %llu, "
      "reservations "
      "a failed VirtualFree left (released by the test): %llu, crashes: 0\n",
      seed_first ? "over an existing cache" : "from an empty path",
      made[static_cast<int>(WinCall::map_view_of_file3)] > 0 ? "placeholder" : "legacy",
      stride == 1 ? "every call" : ("every " + std::to_string(stride) + "th call").c_str(), (unsigned long long)calls,
      (unsigned long long)totals.runs, (unsigned long long)totals.wrong, (unsigned long long)totals.lost,
      (unsigned long long)totals.misreported, (unsigned long long)totals.handles_left,
      (unsigned long long)totals.views_left, (unsigned long long)totals.reservations_left);
}

INSTANTIATE_TEST_SUITE_P(Start, WinFaultSweep, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "ExistingCache" : "EmptyPath"; });

}  // namespace
