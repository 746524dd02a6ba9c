// Real processes, real kills: a writer process packs and finalizes entries (durability full)
// while the test SIGKILLs it after a random delay; after every kill a fresh verifier process
// reopens the cache read-only and checks that it opens without a rebuild, that every hit serves
// exactly the bytes packed under its key, that every entry whose finalize returned ok is there,
// and that nothing else is in the file. The next writer appends to the same file, so each kill
// also tests recovery from the previous one (the file starts afresh every kRoundsPerFile rounds).
//
// CI runs 200 kills (WEIGHTCACHE_FULL=1: 1000); WEIGHTCACHE_CRASH_SEED picks another schedule.
#include "child_process.hpp"
#include "crash_common.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using weightcache::crash::ChildProcess;
using weightcache::test::ExitStatus;
using weightcache::test::Rng;
using weightcache::test::TempDir;

constexpr const char* kChild = WC_CRASH_CHILD;

bool full_run() { return std::getenv("WEIGHTCACHE_FULL") != nullptr; }

std::uint64_t schedule_seed(std::uint64_t fallback) {
  const char* s = std::getenv("WEIGHTCACHE_CRASH_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 0) : fallback;
}

void sleep_us(std::uint64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

struct RoundSpec {
  std::uint64_t round = 0;
  std::uint64_t probe = 0;      // entries 0..probe-1 may have been inserted
  std::uint64_t finalized = 0;  // entries 0..finalized-1 were reported durable
};

/// Folds a writer's report lines into its round's spec.
void parse_writer_lines(const std::vector<std::string>& lines, RoundSpec* spec) {
  for (const auto& l : lines) {
    std::istringstream in(l);
    std::string tag;
    std::uint64_t round = 0, n = 0;
    in >> tag >> round >> n;
    if (!in || round != spec->round) continue;
    if (tag == "A") spec->probe = std::max(spec->probe, n);
    if (tag == "F") spec->finalized = std::max(spec->finalized, n);
  }
  spec->probe = std::max(spec->probe, spec->finalized);
}

struct Totals {
  std::uint64_t rounds = 0;
  std::uint64_t killed = 0;              // died of our SIGKILL
  std::uint64_t killed_after_commit = 0;  // ... after at least one finalize of its own returned
  std::uint64_t completed = 0;           // finished before the kill landed
  std::uint64_t writer_errors = 0;       // a cache call failed in the writer
  std::uint64_t crashes = 0;             // any process ended by a signal we did not send
  std::uint64_t open_failures = 0;
  std::uint64_t absent = 0;              // killed before the file first existed
  std::uint64_t finalized = 0;          // entries reported durable by the writers
  std::uint64_t hits_checked = 0;       // look-ups that hit and had their bytes compared
  std::uint64_t finalized_checked = 0;  // presence checks (every round rechecks its whole file)
  std::uint64_t wrong = 0;
  std::uint64_t lost = 0;
  std::uint64_t stray = 0;  // live entries the verifier could not account for
  std::uint64_t verify_failures = 0;
  std::uint64_t temp_litter = 0;  // ".tmp." files left by writers killed while creating the file
};

/// What every SIGKILL schedule must keep at zero: no wrong bytes served, no finalized entry
/// lost, no crash, and no failure a kill cannot explain.
::testing::AssertionResult nothing_went_wrong(const Totals& t) {
  std::string bad;
  auto zero = [&](const char* what, std::uint64_t n) {
    if (n != 0) bad += std::string(bad.empty() ? "" : ", ") + what + " " + std::to_string(n);
  };
  zero("wrong bytes served", t.wrong);
  zero("finalized entries lost", t.lost);
  zero("crashes", t.crashes);
  zero("writer errors", t.writer_errors);
  zero("failed opens", t.open_failures);
  zero("stray entries", t.stray);
  zero("checksum failures", t.verify_failures);
  if (bad.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad;
}

/// Removes the cache and everything next to it, counting abandoned temporary files.
void start_fresh(const TempDir& dir, Totals* t) {
  for (const auto& e : fs::directory_iterator(dir.path())) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++t->temp_litter;
    fs::remove(e.path());
  }
}

/// Runs the verifier over `cycle` and adds what it found to the totals.
void verify_round(const std::string& path, std::size_t big_bytes, const std::vector<RoundSpec>& cycle,
                  Totals* t) {
  std::vector<std::string> args{"verify", path, std::to_string(big_bytes)};
  for (const auto& r : cycle) {
    args.push_back(std::to_string(r.round) + ":" + std::to_string(r.probe) + ":" + std::to_string(r.finalized));
    t->finalized_checked += r.finalized;
  }
  ChildProcess v(kChild, args, weightcache::crash::kReportFd);
  ASSERT_TRUE(v.started()) << "cannot start " << kChild << ": " << std::strerror(v.spawn_errno());
  const ExitStatus st = v.wait();
  const auto& lines = v.all_lines();
  const std::uint64_t round = cycle.back().round;
  if (!st.exited) {
    ++t->crashes;
    ADD_FAILURE() << "verifier after round " << round << ": " << st.describe();
    return;
  }
  std::string result;
  for (const auto& l : lines)
    if (l.rfind("V ", 0) == 0) result = l;
  std::istringstream in(result);
  std::string tag, open;
  std::uint64_t hits = 0, wrong = 0, lost = 0, entries = 0, verify_failures = 0;
  in >> tag >> open >> hits >> wrong >> lost >> entries >> verify_failures;
  ASSERT_TRUE(in) << "verifier after round " << round << " " << st.describe() << " and reported '" << result
                  << "'";
  if (open == "failed") ++t->open_failures;
  if (open == "absent") ++t->absent;
  t->hits_checked += hits;
  t->wrong += wrong;
  t->lost += lost;
  t->verify_failures += verify_failures;
  if (entries > hits) t->stray += entries - hits;
  EXPECT_EQ(st.code, 0) << "verifier after round " << round << " reported '" << result << "'";
}

/// Classifies how a writer ended.
void account_writer(const ExitStatus& st, const RoundSpec& spec, Totals* t) {
  t->finalized += spec.finalized;
  if (st.signal == SIGKILL) {
    ++t->killed;
    if (spec.finalized > 0) ++t->killed_after_commit;
  } else if (st.exited && st.code == 0) {
    ++t->completed;
  } else if (st.exited) {
    ++t->writer_errors;
    ADD_FAILURE() << "writer of round " << spec.round << " " << st.describe();
  } else {
    ++t->crashes;
    ADD_FAILURE() << "writer of round " << spec.round << " " << st.describe();
  }
}

TEST(SigkillWriter, RandomKillsWhileAppending) {
  const std::uint64_t kRounds = full_run() ? 1000 : 200;
  constexpr std::uint64_t kRoundsPerFile = 25;
  constexpr std::uint64_t kBatch = 4;          // entries per finalize
  constexpr std::uint64_t kMaxEntries = 4000;  // per writer, in case a kill comes late
  const std::uint64_t seed = schedule_seed(0x5161c111);
  Rng rng(seed);
  TempDir dir("wc-sigkill");
  const std::string path = dir.file("cache.wc");
  Totals t;
  std::vector<RoundSpec> cycle;
  for (std::uint64_t round = 0; round < kRounds; ++round) {
    if (round % kRoundsPerFile == 0) {
      start_fresh(dir, &t);
      cycle.clear();
    }
    ChildProcess w(kChild,
                   {"write", path, std::to_string(round), std::to_string(kBatch), std::to_string(kMaxEntries)},
                   weightcache::crash::kReportFd);
    ASSERT_TRUE(w.started()) << "cannot start " << kChild << ": " << std::strerror(w.spawn_errno());
    // Where the random delay starts: every 10th kill, and the first of every other file, comes
    // early (start-up, open, creation of the file); a third of the rest after open; the others
    // after the writer's first finalize, so most kills hit a writer appending to committed data.
    if (round % 10 == 9 || round % (2 * kRoundsPerFile) == 0) {
      sleep_us(rng.uniform(0, 3000));
    } else {
      // false: the writer ended already; the kill is then a no-op and the round still counts.
      if (w.wait_for_line(round % 3 == 0 ? "R" : "F")) sleep_us(rng.uniform(0, 30000));
    }
    const ExitStatus st = w.kill_and_wait();
    RoundSpec spec;
    spec.round = round;
    parse_writer_lines(w.all_lines(), &spec);
    account_writer(st, spec, &t);
    cycle.push_back(spec);
    verify_round(path, 0, cycle, &t);
    ++t.rounds;
    if (::testing::Test::HasFatalFailure()) break;
  }
  start_fresh(dir, &t);

  std::printf("SIGKILL rounds: %llu, wrong bytes served: %llu, finalized entries lost: %llu, crashes: %llu\n",
              (unsigned long long)t.rounds, (unsigned long long)t.wrong, (unsigned long long)t.lost,
              (unsigned long long)t.crashes);
  std::printf("  seed %#llx: %llu killed (%llu after a finalize of their own), %llu finished first, "
              "%llu before the file existed; %llu entries finalized, %llu presence checks, %llu hits verified; "
              "writer errors: %llu, failed opens: %llu, stray entries: %llu, checksum failures: %llu, "
              "temporary files left by killed creators: %llu\n",
              (unsigned long long)seed, (unsigned long long)t.killed, (unsigned long long)t.killed_after_commit,
              (unsigned long long)t.completed, (unsigned long long)t.absent, (unsigned long long)t.finalized,
              (unsigned long long)t.finalized_checked, (unsigned long long)t.hits_checked,
              (unsigned long long)t.writer_errors,
              (unsigned long long)t.open_failures, (unsigned long long)t.stray,
              (unsigned long long)t.verify_failures, (unsigned long long)t.temp_litter);
  EXPECT_TRUE(nothing_went_wrong(t));
  // The kills must land mid-run, most of them after the writer committed something (the
  // schedule above waits for a first finalize in 60% of the rounds).
  EXPECT_GE(t.killed, t.rounds / 2);
  EXPECT_GE(t.killed_after_commit + t.completed, t.rounds / 2);
  EXPECT_GT(t.finalized_checked, 0u);
}

// One large reservation (64 MiB: many page faults, tens of milliseconds of filling) is the
// longest window in which the file is grown but not committed: a kill there must leave the small
// entries committed before it intact, and the big entry either absent or whole. The writer
// reports each eighth of the fill, so the kills land inside it.
TEST(SigkillWriter, KillDuringLargeReservationFill) {
  const std::uint64_t kRounds = full_run() ? 40 : 8;
  constexpr std::uint64_t kRoundsPerFile = 4;
  constexpr std::size_t kBigBytes = std::size_t{64} << 20;
  const std::uint64_t seed = schedule_seed(0xb16f111);
  Rng rng(seed);
  TempDir dir("wc-sigkill-big");
  const std::string path = dir.file("cache.wc");
  Totals t;
  std::uint64_t killed_before_commit = 0, killed_mid_fill = 0, big_committed = 0;
  std::vector<RoundSpec> cycle;
  for (std::uint64_t round = 0; round < kRounds; ++round) {
    if (round % kRoundsPerFile == 0) {
      start_fresh(dir, &t);
      cycle.clear();
    }
    ChildProcess w(kChild, {"big", path, std::to_string(round), std::to_string(kBigBytes)},
                   weightcache::crash::kReportFd);
    ASSERT_TRUE(w.started()) << "cannot start " << kChild << ": " << std::strerror(w.spawn_errno());
    // The second writer of each file finishes, so the later kills hit a file that holds a
    // committed big entry, and the verifier checks one. The others are killed at a random
    // moment after a random piece of the fill; after the last piece the kill may also land in
    // the insert or the finalize.
    const bool let_finish = round % kRoundsPerFile == 1;
    const std::uint64_t piece = rng.uniform(0, weightcache::crash::kBigPieces - 1);
    const bool filling = w.wait_for_line("P " + std::to_string(round) + " " + std::to_string(piece));
    if (filling && !let_finish) sleep_us(rng.uniform(0, 2000));
    const ExitStatus st = let_finish ? w.wait() : w.kill_and_wait();
    RoundSpec spec;
    spec.round = round;
    parse_writer_lines(w.all_lines(), &spec);
    EXPECT_TRUE(filling) << "round " << round << ": the writer never reached the big reservation ("
                         << st.describe() << ")";
    account_writer(st, spec, &t);
    EXPECT_GE(spec.finalized, weightcache::crash::kBigIndex) << "round " << round;
    std::size_t pieces = 0;
    for (const auto& l : w.all_lines()) pieces += l.rfind("P ", 0) == 0;
    if (st.signal == SIGKILL && spec.finalized <= weightcache::crash::kBigIndex) {
      ++killed_before_commit;
      if (pieces < weightcache::crash::kBigPieces) ++killed_mid_fill;
    }
    if (spec.finalized > weightcache::crash::kBigIndex) ++big_committed;
    cycle.push_back(spec);
    verify_round(path, kBigBytes, cycle, &t);
    ++t.rounds;
    if (::testing::Test::HasFatalFailure()) break;
  }
  start_fresh(dir, &t);
  std::printf("SIGKILL during a 64 MiB fill: %llu rounds (%llu killed before the big entry was committed, "
              "%llu of them inside the fill; %llu committed it), wrong bytes served: %llu, finalized entries "
              "lost: %llu, crashes: %llu\n",
              (unsigned long long)t.rounds, (unsigned long long)killed_before_commit,
              (unsigned long long)killed_mid_fill, (unsigned long long)big_committed, (unsigned long long)t.wrong,
              (unsigned long long)t.lost, (unsigned long long)t.crashes);
  EXPECT_TRUE(nothing_went_wrong(t));
  EXPECT_GE(killed_mid_fill, 1u);
  EXPECT_GE(big_committed, kRounds / kRoundsPerFile);
}

}  // namespace
