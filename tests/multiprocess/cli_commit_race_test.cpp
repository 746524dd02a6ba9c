// `weightcache verify` and `weightcache info` beside a writer committing in another process
// (issue 26): the tool reads the file with the library's inspection interface, which reads a
// commit that lands between its size read and its header read again, as a cache opening the
// file does. Before, the tool read against the size it had stat()ed and reported the newest
// commit as pointing outside the file. Every run here must report a sound file. POSIX only (the
// CLI is); built only with the tools (WEIGHTCACHE_CLI_PATH).
#include "cli_run.hpp"
#include "mp_test_util.hpp"

#include <weightcache/inspect.hpp>
#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace weightcache::test::mp {
namespace {

// A round runs two verify and two info at once beside the writer: with more processes than
// cores, a tool is often descheduled between its fstat and its header read while the writer
// commits. The old tool, which read against the size it had stat()ed, then reported damage in
// about 1 of 150 runs; 500 rounds (2000 runs) make a pass by chance vanishingly unlikely.
constexpr std::size_t kRounds = 500;            // each: 2 verify + 2 info at once, and an inspect
constexpr std::size_t kEntrySize = 512;
constexpr std::size_t kWriterRounds = 1000000;  // the writer's bound; it stops when told
constexpr int kStartPolls = 20000;              // 1 ms apart: the writer's first commit

// The commit sequence the library reads in `file` (0 when it cannot be read).
std::uint64_t sequence_of(const std::string& file) {
  auto f = inspect::File::open(file);
  if (!f) return 0;
  auto in = inspect::inspect(f.value());
  return in && in->slot_index >= 0 ? in->commit.sequence : 0;
}

TEST(CliBesideACommittingWriter, VerifyAndInfoReportNoDamage) {
  TempDir dir("weightcache-cli-race"), aux("weightcache-cli-race-aux");
  const std::string file = dir.file("model.wcache"), stop = aux.file("stop"), results = aux.file("results");
  {
    auto c = WeightCache::open(cache_options(file));
    ASSERT_TRUE(c.ok()) << c.error().message;
    ASSERT_NE(c->insert("seed", bytes_for_key("seed", kEntrySize)), kNotFound);
    ASSERT_TRUE(c->finalize().ok());
  }
  const std::uint64_t first = sequence_of(file);
  ASSERT_NE(first, 0u);

  Children children;
  const std::size_t writer =
      children.start("commit_loop", {"path=" + file, "stop=" + stop, "results=" + results,
                                     "rounds=" + std::to_string(kWriterRounds), "size=" + std::to_string(kEntrySize)});
  int polls = 0;
  while (sequence_of(file) == first && ++polls < kStartPolls) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::uint64_t start = sequence_of(file);
  ASSERT_GT(start, first) << "the writer made no commit";

  std::size_t failures = 0;
  std::string first_failure;
  auto failed = [&](const std::string& what) {
    if (failures++ == 0) first_failure = what;
  };
  const std::vector<std::vector<std::string>> commands = {
      {"verify", file}, {"info", "--json", file}, {"verify", file}, {"info", "--json", file}};
  for (std::size_t i = 0; i < kRounds; ++i) {
    std::vector<Process> running;
    for (std::size_t k = 0; k < commands.size(); ++k) running.push_back(start_cli(aux, "run" + std::to_string(k), commands[k]));
    for (std::size_t k = 0; k < commands.size(); ++k) {
      const CliRun r = finish_cli(aux, "run" + std::to_string(k), running[k]);
      const std::string what = commands[k][0] + ", round " + std::to_string(i) + ": exit " + std::to_string(r.code) +
                               "\nstdout: " + r.out + "stderr: " + r.err;
      if (commands[k][0] == "verify") {
        if (r.code != 0 || r.out.find(": OK (") == std::string::npos || !r.err.empty()) failed(what);
      } else {
        const auto j = nlohmann::json::parse(r.out, nullptr, false);
        if (r.code != 0 || j.is_discarded() || j.value("problems", -1) != 0 || j.value("newest_commit_damaged", true))
          failed(what);
      }
    }
    // The interface the tool is built on, called directly.
    auto f = inspect::File::open(file);
    ASSERT_TRUE(f.ok()) << f.error().message;
    auto in = inspect::inspect(f.value());
    ASSERT_TRUE(in.ok()) << in.error().message;
    if (!in->index_usable || in->newest_commit_damaged || !in->findings.empty())
      failed("inspect, round " + std::to_string(i) + ": " +
             (in->findings.empty() ? std::string("newest commit damaged or no usable index")
                                   : in->findings.front().message));
  }
  const std::uint64_t end = sequence_of(file);

  { std::ofstream(stop) << "stop\n"; }
  const ExitStatus st = children.wait(writer);
  EXPECT_TRUE(st.ok()) << st.describe();
  const auto made = read_results(results);
  ASSERT_EQ(made.count("commits"), 1u);
  // The writer was committing all along: the runs raced real commits.
  EXPECT_GT(end, start) << made.at("commits") << " commits in all";
  EXPECT_EQ(failures, 0u) << failures << " of " << 5 * kRounds << " reads reported damage; the first:\n"
                          << first_failure;
}

}  // namespace
}  // namespace weightcache::test::mp
