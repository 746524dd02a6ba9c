// The XNNPACK adapter inside a real, current XNNPACK: what its subgraph runtime and operator API
// pack through the provider, what a second process (weightcache_xnn_real_child, a separate
// launch with its weights at other addresses) finds, and that every output is bit-identical to
// the same model run by XNNPACK without a weights cache.
#include <gtest/gtest.h>
#include <pthreadpool.h>

#include <barrier>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "real_model.hpp"
#include "spawn.hpp"
#include "temp_dir.hpp"

using namespace weightcache::xnn_real;
using weightcache::test::TempDir;

namespace {

constexpr std::size_t kChildBatch = 3;  // real_child.cpp runs this batch
constexpr std::uint64_t kChildSeed = 42;

// What one child reported.
struct Report {
  weightcache::test::ExitStatus exit;
  std::map<std::string, std::string> values;
  std::vector<unsigned char> output;

  std::uint64_t n(const std::string& key) const {
    auto it = values.find(key);
    return it == values.end() ? ~std::uint64_t{0} : std::strtoull(it->second.c_str(), nullptr, 10);
  }
  std::set<std::string> addresses() const {
    std::set<std::string> out;
    auto it = values.find("addresses");
    if (it == values.end()) return out;
    std::stringstream ss(it->second);
    std::string a;
    while (std::getline(ss, a, ','))
      if (!a.empty()) out.insert(a);
    return out;
  }
};

std::vector<unsigned char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

Report read_report(const std::string& report) {
  Report r;
  std::ifstream f(report);
  std::string line;
  while (std::getline(f, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) r.values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  r.output = read_all(report + ".out");
  return r;
}

std::vector<std::string> child_args(Kind kind, const std::string& cache, const std::string& report, const char* build,
                                    std::size_t shift, std::size_t threads) {
  return {kind_name(kind), cache, report, build, std::to_string(shift), std::to_string(threads)};
}

Report run_child(Kind kind, const std::string& cache, const std::string& report, const char* build = "this",
                 std::size_t shift = 0, std::size_t threads = 1) {
  Report r;
  r.exit = weightcache::test::run_process(WEIGHTCACHE_XNN_REAL_CHILD,
                                          child_args(kind, cache, report, build, shift, threads));
  if (r.exit.ok()) {
    const Report parsed = read_report(report);
    r.values = parsed.values;
    r.output = parsed.output;
  }
  return r;
}

bool same_bytes(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  return a.size() == b.size() && !a.empty() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

class XnnInit : public ::testing::Environment {
 public:
  void SetUp() override { ASSERT_EQ(xnn_initialize(nullptr), xnn_status_success); }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new XnnInit);

// One adapter over one cache, with the counting provider in front (what XNNPACK is handed).
struct Session {
  wc_xnn_adapter* adapter = nullptr;
  std::unique_ptr<CountingProvider> counting;

  explicit Session(wc_cache* cache) {
    EXPECT_EQ(wc_xnn_adapter_create(cache, &adapter), WC_OK) << wc_last_error();
    counting = std::make_unique<CountingProvider>(wc_xnn_adapter_provider(adapter));
  }
  ~Session() {
    counting.reset();
    wc_xnn_adapter_destroy(adapter);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  xnn_weights_cache_t provider() { return counting->get(); }
  wc_xnn_adapter_stats stats() const {
    wc_xnn_adapter_stats s;
    wc_xnn_adapter_stats_init(&s);
    EXPECT_EQ(wc_xnn_adapter_get_stats(adapter, &s), WC_OK);
    return s;
  }
};

wc_stats cache_stats(wc_cache* c) {
  wc_stats s;
  wc_stats_init(&s);
  EXPECT_EQ(wc_get_stats(c, &s), WC_OK);
  return s;
}

// Runs `inst` at `batch` and checks the output against XNNPACK without a cache.
void expect_matches_uncached(Instance& inst, const Model& model, std::size_t batch, pthreadpool_t pool = nullptr) {
  std::vector<unsigned char> out, ref;
  std::string where;
  ASSERT_EQ(inst.run(batch, model.make_input(batch), &out, &where), xnn_status_success) << where;
  ASSERT_EQ(run_uncached(model, batch, pool, &ref), xnn_status_success);
  EXPECT_TRUE(same_bytes(out, ref)) << kind_name(model.kind()) << " at batch " << batch
                                    << ": the output differs from XNNPACK's without a weights cache";
}

// ---- every kind: a cold process packs once per node, a warm one packs nothing ---------------

class RealXnnKind : public ::testing::TestWithParam<Kind> {
 protected:
  TempDir dir_{"weightcache-xnn-real"};
  std::string cache_ = dir_.file("model.wcache");
};

TEST_P(RealXnnKind, ColdProcessPacksOncePerNodeWarmProcessPacksNothingSameOutput) {
  const Kind kind = GetParam();
  const Model model(kind, kChildSeed);
  std::vector<unsigned char> reference;
  if (run_uncached(model, kChildBatch, nullptr, &reference) != xnn_status_success)
    GTEST_SKIP() << "this XNNPACK build cannot run " << kind_name(kind) << " on this CPU, even without a cache";

  const Report cold = run_child(kind, cache_, dir_.file("cold.txt"));
  ASSERT_TRUE(cold.exit.ok()) << cold.exit.describe();
  const std::uint64_t nodes = model.packed_nodes();
  EXPECT_EQ(cold.n("look_ups"), nodes);
  EXPECT_EQ(cold.n("hits"), 0u);
  EXPECT_EQ(cold.n("reservations"), nodes);
  EXPECT_EQ(cold.n("inserts"), nodes);
  EXPECT_EQ(cold.n("provider_null_inserts"), 0u);
  EXPECT_EQ(cold.n("unnamed_inserts"), 0u) << "a weight buffer XNNPACK looked up by was not named";
  EXPECT_EQ(cold.n("entries"), nodes);
  EXPECT_EQ(cold.n("heap_bytes"), 0u);
  if (nodes > 0) {
    EXPECT_GT(cold.n("mapped_bytes"), 0u);
  }
  EXPECT_EQ(cold.n("provider_delete_cache"), 0u);
  EXPECT_EQ(cold.n("same_as_uncached"), 1u);
  EXPECT_TRUE(same_bytes(cold.output, reference)) << "the child's output differs from this process's";

  // The next launch: a real separate process, its weights at other addresses.
  const Report warm = run_child(kind, cache_, dir_.file("warm.txt"), "this", /*shift=*/192);
  ASSERT_TRUE(warm.exit.ok()) << warm.exit.describe();
  EXPECT_EQ(warm.n("look_ups"), nodes);
  EXPECT_EQ(warm.n("hits"), warm.n("look_ups"));
  EXPECT_EQ(warm.n("reservations"), 0u);
  EXPECT_EQ(warm.n("inserts"), 0u);
  EXPECT_EQ(warm.n("provider_reserve_space"), 0u);
  EXPECT_EQ(warm.n("provider_look_up_or_insert"), 0u);
  EXPECT_EQ(warm.n("unnamed_inserts"), 0u);
  EXPECT_EQ(warm.n("entries"), nodes);
  if (nodes > 0) {
    EXPECT_GT(warm.n("provider_offset_to_addr"), 0u) << "XNNPACK never asked where the weights are";
  }
  EXPECT_EQ(warm.n("same_as_uncached"), 1u);
  EXPECT_TRUE(same_bytes(warm.output, reference));
  EXPECT_TRUE(same_bytes(warm.output, cold.output));
  for (const auto& a : warm.addresses()) EXPECT_EQ(cold.addresses().count(a), 0u) << "address " << a << " reused";
  EXPECT_EQ(warm.addresses().size(), model.weights().size());

  if (kind == Kind::fc_bf16) {
    // XNNPACK lowers the bf16 node to fp32, converts the static weights into a buffer of its own
    // and looks them up by that buffer: only alias_data ties it to the original's name.
    EXPECT_GT(cold.n("provider_alias_data"), 0u);
    EXPECT_GT(warm.n("provider_alias_data"), 0u);
  }
}

// Test names and failure messages show the kind by name.
}  // namespace
namespace weightcache::xnn_real {
void PrintTo(Kind kind, std::ostream* os) { *os << kind_name(kind); }
}  // namespace weightcache::xnn_real
namespace {

INSTANTIATE_TEST_SUITE_P(Kinds, RealXnnKind, ::testing::ValuesIn(all_kinds()),
                         [](const ::testing::TestParamInfo<Kind>& info) { return std::string(kind_name(info.param)); });

// ---- one process: several runtimes and models, re-creation, reshapes -----------------------

class RealXnnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Model keyed(Kind::fc_f32, 1);
    ASSERT_EQ(open_cache(path_, compat_key(keyed, false), &cache_), WC_OK) << wc_last_error();
  }
  void TearDown() override { wc_close(cache_); }

  TempDir dir_{"weightcache-xnn-real"};
  std::string path_ = dir_.file("models.wcache");
  wc_cache* cache_ = nullptr;
};

TEST_F(RealXnnTest, SeveralRuntimesAndModelsShareOneAdapter) {
  std::vector<std::unique_ptr<Model>> models;
  models.push_back(std::make_unique<Model>(Kind::fc_f32, 1, 0, "a/"));
  models.push_back(std::make_unique<Model>(Kind::conv_f32, 2, 0, "b/"));
  models.push_back(std::make_unique<Model>(Kind::fc_qd8_qc8w, 3, 0, "c/"));
  models.push_back(std::make_unique<Model>(Kind::dwconv_f32, 4, 0, "d/"));
  std::uint64_t nodes = 0;
  for (const auto& m : models) nodes += m->packed_nodes();

  Session s(cache_);
  for (const auto& m : models) ASSERT_TRUE(m->name_buffers(s.adapter)) << wc_last_error();
  std::vector<std::unique_ptr<Instance>> first, second;
  for (const auto& m : models) {
    first.push_back(std::make_unique<Instance>());
    ASSERT_EQ(first.back()->create(*m, s.provider(), nullptr), xnn_status_success) << kind_name(m->kind());
  }
  EXPECT_EQ(s.stats().reservations, nodes);
  ASSERT_EQ(wc_finalize(cache_), WC_OK) << wc_last_error();
  EXPECT_EQ(cache_stats(cache_).entries, nodes);

  // A second runtime of every model: look-ups only, no finalize needed before its setup.
  for (const auto& m : models) {
    second.push_back(std::make_unique<Instance>());
    ASSERT_EQ(second.back()->create(*m, s.provider(), nullptr), xnn_status_success);
  }
  EXPECT_EQ(s.stats().reservations, nodes);
  EXPECT_EQ(s.stats().hits, nodes);
  EXPECT_EQ(wc_is_finalized(cache_), 1);
  for (std::size_t i = 0; i < models.size(); ++i) {
    expect_matches_uncached(*first[i], *models[i], 2);
    expect_matches_uncached(*second[i], *models[i], 2);
  }

  // Another adapter (another session) with its own copies of the models at other addresses.
  Session t(cache_);
  const char* prefixes[] = {"a/", "b/", "c/", "d/"};
  std::vector<std::unique_ptr<Model>> copies;
  for (std::size_t i = 0; i < models.size(); ++i) {
    copies.push_back(std::make_unique<Model>(models[i]->kind(), i + 1, 64, prefixes[i]));
    ASSERT_TRUE(copies.back()->name_buffers(t.adapter));
    Instance inst;
    ASSERT_EQ(inst.create(*copies.back(), t.provider(), nullptr), xnn_status_success);
    expect_matches_uncached(inst, *copies.back(), 4);
  }
  EXPECT_EQ(t.stats().reservations, 0u);
  EXPECT_EQ(t.stats().hits, nodes);
  EXPECT_EQ(cache_stats(cache_).entries, nodes);
  EXPECT_EQ(s.counting->delete_cache.load() + t.counting->delete_cache.load(), 0u);
}

TEST_F(RealXnnTest, RuntimeRecreatedAfterFinalizeOnlyHitsAndNewWeightsWaitForTheNextFinalize) {
  const Model a(Kind::fc_qd8_qc4w, 5, 0, "a/");
  const Model b(Kind::conv_f32, 6, 0, "b/");
  Session s(cache_);
  ASSERT_TRUE(a.name_buffers(s.adapter));
  ASSERT_TRUE(b.name_buffers(s.adapter));
  {
    Instance inst;
    ASSERT_EQ(inst.create(a, s.provider(), nullptr), xnn_status_success);
    ASSERT_EQ(wc_finalize(cache_), WC_OK);
    expect_matches_uncached(inst, a, 2);
  }
  EXPECT_EQ(s.stats().reservations, a.packed_nodes());

  // The runtime is gone; a new one over the same weights hits and sets up at once.
  Instance again;
  ASSERT_EQ(again.create(a, s.provider(), nullptr), xnn_status_success);
  EXPECT_EQ(s.stats().reservations, a.packed_nodes());
  EXPECT_EQ(s.stats().hits, a.packed_nodes());
  expect_matches_uncached(again, a, 2);

  // New weights after the finalize: reserve works, and XNNPACK refuses to set up until the
  // runtime finalizes again (is_finalized turned false with the insert).
  Instance other;
  ASSERT_EQ(other.create(b, s.provider(), nullptr), xnn_status_success);
  EXPECT_EQ(s.stats().reservations, a.packed_nodes() + b.packed_nodes());
  EXPECT_EQ(wc_is_finalized(cache_), 0);
  std::vector<unsigned char> out;
  std::string where;
  EXPECT_EQ(other.run(2, b.make_input(2), &out, &where), xnn_status_invalid_state);
  EXPECT_EQ(where, "setup runtime");
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  expect_matches_uncached(other, b, 2);
  expect_matches_uncached(again, a, 2);
  EXPECT_EQ(cache_stats(cache_).commits, 2u);
}

// Two runtimes on one cache, each with its own adapter (one per runtime, as xnnpack.h asks): the
// provider's is_finalized is its adapter's, so while one runtime loads a model whose new weights
// wait for wc_finalize, the other, whose weights were committed long ago, keeps setting up (a
// server loading model B on one thread must not break model A's inference on another). The
// loading runtime's own setup is still refused until wc_finalize, the contract XNNPACK relies on.
TEST_F(RealXnnTest, AnotherModelLoadingDoesNotBreakTheSetupOfAFinalizedRuntime) {
  const Model a(Kind::fc_f32, 8, 0, "a/"), b(Kind::conv_f32, 9, 0, "b/");
  Session sa(cache_), sb(cache_);
  ASSERT_TRUE(a.name_buffers(sa.adapter));
  ASSERT_TRUE(b.name_buffers(sb.adapter));
  Instance serving;
  ASSERT_EQ(serving.create(a, sa.provider(), nullptr), xnn_status_success);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  expect_matches_uncached(serving, a, 2);
  Instance loading;  // another model arrives; its finalize has not run yet
  ASSERT_EQ(loading.create(b, sb.provider(), nullptr), xnn_status_success);
  EXPECT_EQ(sb.stats().reservations, b.packed_nodes());
  EXPECT_EQ(wc_is_finalized(cache_), 0) << "wc_is_finalized stays the whole cache's";
  expect_matches_uncached(serving, a, 2);  // the whole cache's is_finalized failed this setup
  std::vector<unsigned char> out;
  std::string where;
  EXPECT_EQ(loading.run(2, b.make_input(2), &out, &where), xnn_status_invalid_state);
  EXPECT_EQ(where, "setup runtime");
  expect_matches_uncached(serving, a, 3);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  expect_matches_uncached(loading, b, 2);
  expect_matches_uncached(serving, a, 2);
  EXPECT_EQ(sa.stats().reservations, a.packed_nodes());
  EXPECT_EQ(cache_stats(cache_).entries, a.packed_nodes() + b.packed_nodes());
}

// Two sessions (two adapters) on one cache, on two threads: thread A creates, finalizes and runs
// model a round after round; thread B creates a runtime of a new model every round, packing new
// weights into the cache while A runs, and finalizes only at the end. A runs once during B's
// creation and once more after it, while B's weights of that round await a finalize: no setup
// of A fails, and every output of either matches XNNPACK's without a weights cache.
TEST_F(RealXnnTest, TwoSessionsOnTwoThreadsOneServesWhileTheOtherLoads) {
  constexpr std::size_t kRounds = 4;
  const Model a(Kind::fc_qd8_qc8w, 12, 0, "a/");
  std::vector<std::unique_ptr<Model>> bs;
  std::uint64_t b_nodes = 0;
  for (std::size_t r = 0; r < kRounds; ++r) {
    bs.push_back(std::make_unique<Model>(r % 2 == 0 ? Kind::conv_f32 : Kind::fc_f32, 20 + r, 0,
                                         "b" + std::to_string(r) + "/"));
    b_nodes += bs.back()->packed_nodes();
    ASSERT_GT(bs.back()->packed_nodes(), 0u);
  }
  // The references, XNNPACK without a weights cache, computed before the threads start.
  std::vector<unsigned char> ref_a2, ref_a3;
  ASSERT_EQ(run_uncached(a, 2, nullptr, &ref_a2), xnn_status_success);
  ASSERT_EQ(run_uncached(a, 3, nullptr, &ref_a3), xnn_status_success);
  std::vector<std::vector<unsigned char>> ref_b(kRounds);
  for (std::size_t r = 0; r < kRounds; ++r) ASSERT_EQ(run_uncached(*bs[r], 2, nullptr, &ref_b[r]), xnn_status_success);

  Session sa(cache_), sb(cache_);
  ASSERT_TRUE(a.name_buffers(sa.adapter));
  for (const auto& b : bs) ASSERT_TRUE(b->name_buffers(sb.adapter));

  // Each list is written by its own thread only, and read after both joined.
  std::vector<std::string> a_errors, b_errors;
  const auto run_and_check = [](Instance& inst, const Model& m, std::size_t batch,
                                const std::vector<unsigned char>& ref, const std::string& what,
                                std::vector<std::string>* errors) {
    std::vector<unsigned char> out;
    std::string where;
    const xnn_status st = inst.run(batch, m.make_input(batch), &out, &where);
    if (st != xnn_status_success)
      errors->push_back(what + ": " + where + " failed with xnn_status " + std::to_string(static_cast<int>(st)));
    else if (!same_bytes(out, ref))
      errors->push_back(what + ": the output differs from XNNPACK's without a weights cache");
  };
  std::barrier sync(2);
  std::thread serving([&] {
    for (std::size_t r = 0; r < kRounds; ++r) {
      const std::string round = "a, round " + std::to_string(r);
      Instance inst;
      const xnn_status created = inst.create(a, sa.provider(), nullptr);
      if (created != xnn_status_success) a_errors.push_back(round + ": creation failed");
      if (wc_finalize(cache_) != WC_OK) a_errors.push_back(round + ": wc_finalize failed: " + wc_last_error());
      sync.arrive_and_wait();  // B creates its runtime of this round now
      if (created == xnn_status_success) run_and_check(inst, a, 2, ref_a2, round + ", during b's creation", &a_errors);
      sync.arrive_and_wait();  // B's weights of this round are in the cache, not finalized
      if (created == xnn_status_success)
        run_and_check(inst, a, 3, ref_a3, round + ", while b's weights await a finalize", &a_errors);
    }
  });
  std::thread loading([&] {
    std::vector<std::unique_ptr<Instance>> loaded(kRounds);
    for (std::size_t r = 0; r < kRounds; ++r) {
      sync.arrive_and_wait();
      loaded[r] = std::make_unique<Instance>();
      if (loaded[r]->create(*bs[r], sb.provider(), nullptr) != xnn_status_success) {
        b_errors.push_back("b, round " + std::to_string(r) + ": creation failed");
        loaded[r].reset();
      }
      sync.arrive_and_wait();
    }
    if (wc_finalize(cache_) != WC_OK) b_errors.push_back(std::string("b: wc_finalize failed: ") + wc_last_error());
    for (std::size_t r = 0; r < kRounds; ++r)
      if (loaded[r]) run_and_check(*loaded[r], *bs[r], 2, ref_b[r], "b, round " + std::to_string(r), &b_errors);
  });
  serving.join();
  loading.join();
  for (const auto& e : a_errors) ADD_FAILURE() << e;
  for (const auto& e : b_errors) ADD_FAILURE() << e;
  EXPECT_EQ(sa.stats().reservations, a.packed_nodes()) << "a is packed once, then only hits";
  EXPECT_EQ(sb.stats().reservations, b_nodes);
  EXPECT_EQ(cache_stats(cache_).entries, a.packed_nodes() + b_nodes);
  EXPECT_EQ(wc_is_finalized(cache_), 1);
}

TEST_F(RealXnnTest, ReshapeToNewBatchSizesKeepsThePackedWeights) {
  const Model m(Kind::conv_qs8, 7);
  Session s(cache_);
  ASSERT_TRUE(m.name_buffers(s.adapter));
  Instance inst;
  ASSERT_EQ(inst.create(m, s.provider(), nullptr), xnn_status_success);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  expect_matches_uncached(inst, m, 2);
  const std::uint64_t resolved = s.counting->offset_to_addr.load();
  EXPECT_GT(resolved, 0u);
  for (std::size_t batch : {7u, 1u, 5u}) expect_matches_uncached(inst, m, batch);
  EXPECT_GT(s.counting->offset_to_addr.load(), resolved) << "each reshape resolves the offsets again";
  EXPECT_EQ(s.stats().reservations, m.packed_nodes());
  EXPECT_EQ(cache_stats(cache_).entries, m.packed_nodes());
}

TEST_F(RealXnnTest, TwoThreadPoolRunsMatchAndAWarmProcessWithThreadsPacksNothing) {
  pthreadpool_t pool = pthreadpool_create(2);
  ASSERT_NE(pool, nullptr);
  ASSERT_EQ(pthreadpool_get_threads_count(pool), 2u);
  const Model m(Kind::fc_qd8_qc8w, kChildSeed);
  {
    Session s(cache_);
    ASSERT_TRUE(m.name_buffers(s.adapter));
    Instance inst;
    ASSERT_EQ(inst.create(m, s.provider(), pool), xnn_status_success);
    ASSERT_EQ(wc_finalize(cache_), WC_OK);
    expect_matches_uncached(inst, m, 16, pool);
    expect_matches_uncached(inst, m, 3, pool);
  }
  std::vector<unsigned char> reference;
  ASSERT_EQ(run_uncached(m, kChildBatch, pool, &reference), xnn_status_success);
  pthreadpool_destroy(pool);

  // Two processes with two threads each, on a file of their own.
  const std::string path = dir_.file("threads.wcache");
  const Report cold = run_child(m.kind(), path, dir_.file("cold.txt"), "this", 0, 2);
  ASSERT_TRUE(cold.exit.ok()) << cold.exit.describe();
  EXPECT_EQ(cold.n("reservations"), m.packed_nodes());
  const Report warm = run_child(m.kind(), path, dir_.file("warm.txt"), "this", 128, 2);
  ASSERT_TRUE(warm.exit.ok()) << warm.exit.describe();
  EXPECT_EQ(warm.n("reservations"), 0u);
  EXPECT_EQ(warm.n("hits"), m.packed_nodes());
  EXPECT_EQ(warm.n("same_as_uncached"), 1u);
  EXPECT_TRUE(same_bytes(warm.output, reference));
}

// ---- processes ------------------------------------------------------------------------------

TEST(RealXnnProcesses, TwoProcessesRacingColdOnOnePathBothRunCorrectly) {
  TempDir dir("weightcache-xnn-real");
  for (Kind kind : {Kind::conv_f32, Kind::fc_qd8_qc8w}) {
    SCOPED_TRACE(kind_name(kind));
    const Model m(kind, kChildSeed);
    std::vector<unsigned char> reference;
    ASSERT_EQ(run_uncached(m, kChildBatch, nullptr, &reference), xnn_status_success);
    const std::string p = dir.file(std::string(kind_name(kind)) + ".wcache");
    const std::string r1 = dir.file(std::string(kind_name(kind)) + "-1.txt");
    const std::string r2 = dir.file(std::string(kind_name(kind)) + "-2.txt");
    int e1 = 0, e2 = 0;
    const auto p1 =
        weightcache::test::spawn_process(WEIGHTCACHE_XNN_REAL_CHILD, child_args(kind, p, r1, "this", 0, 1), &e1);
    const auto p2 =
        weightcache::test::spawn_process(WEIGHTCACHE_XNN_REAL_CHILD, child_args(kind, p, r2, "this", 64, 1), &e2);
    ASSERT_NE(p1, weightcache::test::kNoProcess) << e1;
    ASSERT_NE(p2, weightcache::test::kNoProcess) << e2;
    const auto s1 = weightcache::test::wait_process(p1);
    const auto s2 = weightcache::test::wait_process(p2);
    ASSERT_TRUE(s1.ok()) << s1.describe();
    ASSERT_TRUE(s2.ok()) << s2.describe();
    for (const auto& report : {r1, r2}) {
      const Report r = read_report(report);
      EXPECT_EQ(r.n("look_ups"), m.packed_nodes());
      EXPECT_EQ(r.n("hits") + r.n("reservations"), m.packed_nodes()) << "each node either hit or packed once";
      EXPECT_EQ(r.n("same_as_uncached"), 1u);
      EXPECT_TRUE(same_bytes(r.output, reference));
    }
    // Whoever won, the file now serves every node, once.
    const Report warm = run_child(kind, p, dir.file("warm.txt"), "this", 128);
    ASSERT_TRUE(warm.exit.ok()) << warm.exit.describe();
    EXPECT_EQ(warm.n("reservations"), 0u);
    EXPECT_EQ(warm.n("hits"), m.packed_nodes());
    EXPECT_EQ(warm.n("entries"), m.packed_nodes());
    EXPECT_TRUE(same_bytes(warm.output, reference));
  }
}

// ---- the compatibility key ------------------------------------------------------------------

TEST(RealXnnCompatKey, TheKeyCarriesThisBuildsIdentifier) {
  const auto* id = static_cast<const unsigned char*>(xnn_experimental_get_build_identifier_data());
  const std::size_t size = xnn_experimental_get_build_identifier_size();
  ASSERT_GT(size, 0u);
  std::vector<unsigned char> other(id, id + size);
  other[0] ^= 0xff;
  EXPECT_TRUE(xnn_experimental_check_build_identifier(id, size));
  EXPECT_FALSE(xnn_experimental_check_build_identifier(other.data(), other.size()));

  const Model m(Kind::fc_f32, 1);
  const auto mine = compat_key(m, false), theirs = compat_key(m, true);
  ASSERT_FALSE(mine.empty());
  EXPECT_NE(mine, theirs);
  // The identifier's bytes are in the key, after the header and their length.
  ASSERT_GE(mine.size(), 9 + size);
  EXPECT_EQ(std::memcmp(mine.data() + 9, id, size), 0);
}

TEST(RealXnnCompatKey, AFilePackedByAnotherBuildIsNeverServed) {
  TempDir dir("weightcache-xnn-real");
  const std::string path = dir.file("model.wcache");
  const Kind kind = Kind::fc_qd8_qc8w;
  const Model m(kind, kChildSeed);
  std::vector<unsigned char> reference;
  ASSERT_EQ(run_uncached(m, kChildBatch, nullptr, &reference), xnn_status_success);

  const Report mine = run_child(kind, path, dir.file("1.txt"), "this");
  ASSERT_TRUE(mine.exit.ok()) << mine.exit.describe();
  EXPECT_EQ(mine.n("reservations"), m.packed_nodes());

  // Another build opens the same path: nothing of this build's packing is served to it.
  const Report theirs = run_child(kind, path, dir.file("2.txt"), "other", 64);
  ASSERT_TRUE(theirs.exit.ok()) << theirs.exit.describe();
  EXPECT_EQ(theirs.n("hits"), 0u);
  EXPECT_EQ(theirs.n("reservations"), m.packed_nodes());
  EXPECT_EQ(theirs.n("entries"), m.packed_nodes());
  EXPECT_TRUE(same_bytes(theirs.output, reference));

  // And back: the file now holds the other build's packing, which this build does not take.
  const Report back = run_child(kind, path, dir.file("3.txt"), "this", 128);
  ASSERT_TRUE(back.exit.ok()) << back.exit.describe();
  EXPECT_EQ(back.n("hits"), 0u);
  EXPECT_EQ(back.n("reservations"), m.packed_nodes());
  EXPECT_TRUE(same_bytes(back.output, reference));

  const Report warm = run_child(kind, path, dir.file("4.txt"), "this", 192);
  ASSERT_TRUE(warm.exit.ok()) << warm.exit.describe();
  EXPECT_EQ(warm.n("hits"), m.packed_nodes());
  EXPECT_EQ(warm.n("reservations"), 0u);
  EXPECT_TRUE(same_bytes(warm.output, reference));
}

}  // namespace
