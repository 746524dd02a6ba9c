// The XNNPACK provider adapter, driven through the C stand-in for XNNPACK's operator-creation
// path (fake_xnnpack.c): what is packed, what hits, what lives where, across runtimes, threads
// and processes.
#include "log_capture.hpp"
#include "spawn.hpp"
#include "temp_dir.hpp"
#include "xnn_test_model.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <atomic>
#include <barrier>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace weightcache::xnn_test;
using weightcache::test::LogCapture;
using weightcache::test::TempDir;

// ---- layout: our mirror against an independent C declaration of XNNPACK's structs ----------

static_assert(sizeof(wc_xnn_weights_cache_look_up_key) == sizeof(fxnn_weights_cache_look_up_key));
static_assert(offsetof(wc_xnn_weights_cache_look_up_key, seed) == offsetof(fxnn_weights_cache_look_up_key, seed));
static_assert(offsetof(wc_xnn_weights_cache_look_up_key, kernel) == offsetof(fxnn_weights_cache_look_up_key, kernel));
static_assert(offsetof(wc_xnn_weights_cache_look_up_key, bias) == offsetof(fxnn_weights_cache_look_up_key, bias));
static_assert(offsetof(wc_xnn_weights_cache_look_up_key, fingerprint_id) ==
              offsetof(fxnn_weights_cache_look_up_key, fingerprint_id));
static_assert(sizeof(wc_xnn_weights_cache_provider) == sizeof(fxnn_weights_cache_provider));
#define WC_XNN_SAME_OFFSET(field) \
  static_assert(offsetof(wc_xnn_weights_cache_provider, field) == offsetof(fxnn_weights_cache_provider, field))
WC_XNN_SAME_OFFSET(context);
WC_XNN_SAME_OFFSET(look_up);
WC_XNN_SAME_OFFSET(reserve_space);
WC_XNN_SAME_OFFSET(look_up_or_insert);
WC_XNN_SAME_OFFSET(is_finalized);
WC_XNN_SAME_OFFSET(offset_to_addr);
WC_XNN_SAME_OFFSET(delete_cache);
WC_XNN_SAME_OFFSET(alias_data);
#undef WC_XNN_SAME_OFFSET
static_assert(sizeof(wc_xnn_status) == sizeof(fxnn_status));
static_assert(int{WC_XNN_STATUS_SUCCESS} == int{fxnn_status_success});
static_assert(int{WC_XNN_STATUS_INVALID_PARAMETER} == int{fxnn_status_invalid_parameter});
static_assert(int{WC_XNN_STATUS_INVALID_STATE} == int{fxnn_status_invalid_state});
static_assert(int{WC_XNN_STATUS_OUT_OF_MEMORY} == int{fxnn_status_out_of_memory});

namespace {

std::size_t total_packed(const std::vector<Linear>& model) {
  std::size_t n = 0;
  for (const auto& l : model) n += packed_size(l);
  return n;
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

// One adapter over one cache, with the counting shim in front (what XNNPACK would be handed).
struct Session {
  wc_xnn_adapter* adapter = nullptr;
  fxnn_counting* counting = nullptr;

  explicit Session(wc_cache* cache) {
    EXPECT_EQ(wc_xnn_adapter_create(cache, &adapter), WC_OK) << wc_last_error();
    counting = fxnn_counting_create(static_cast<fxnn_weights_cache_t>(wc_xnn_adapter_provider(adapter)));
  }
  ~Session() {
    fxnn_counting_destroy(counting);
    wc_xnn_adapter_destroy(adapter);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  fxnn_weights_cache_t provider() const { return fxnn_counting_provider(counting); }
  // The provider as the mirror type, for direct calls from C++.
  wc_xnn_weights_cache_provider* mirror() const {
    return static_cast<wc_xnn_weights_cache_provider*>(wc_xnn_adapter_provider(adapter));
  }
  std::size_t count(fxnn_call c) const { return fxnn_counting_get(counting, c); }
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

class XnnAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(open_cache(path_, &cache_), WC_OK) << wc_last_error(); }
  void TearDown() override { wc_close(cache_); }
  void close_cache() {
    wc_close(cache_);
    cache_ = nullptr;
  }

  weightcache::test::ExitStatus run_child(const std::string& mode, std::uint64_t seed, std::size_t layers) {
    return weightcache::test::run_process(WEIGHTCACHE_XNN_CHILD,
                                          {path_, mode, std::to_string(seed), std::to_string(layers)});
  }

  TempDir dir_{"weightcache-xnn"};
  std::string path_ = dir_.file("model.wcache");
  wc_cache* cache_ = nullptr;
};

// ---- the operator-creation path ------------------------------------------------------------

TEST_F(XnnAdapterTest, ColdCreationPacksOnceThenEveryRuntimeHits) {
  const auto model = make_model(11, 12);
  Session s(cache_);
  ASSERT_TRUE(name_model(s.adapter, model));

  Runtime first;
  ASSERT_EQ(create_runtime(s.provider(), model, &first), fxnn_status_success);
  EXPECT_EQ(s.count(fxnn_call_look_up), 12u);
  EXPECT_EQ(s.count(fxnn_call_reserve_space), 12u);
  EXPECT_EQ(s.count(fxnn_call_look_up_or_insert), 12u);
  EXPECT_EQ(fxnn_counting_null_inserts(s.counting), 0u);
  for (const auto& op : first.ops) EXPECT_NE(op.packed_offset, SIZE_MAX);

  // Setup is refused until the runtime finalizes the cache itself.
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_invalid_state);
  ASSERT_EQ(wc_finalize(cache_), WC_OK) << wc_last_error();
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_success);
  EXPECT_EQ(check_runtime(&first, model), "");

  const wc_stats st = cache_stats(cache_);
  EXPECT_EQ(st.entries, 12u);
  EXPECT_EQ(st.mapped_bytes, total_packed(model));
  EXPECT_EQ(st.heap_bytes, 0u);
  EXPECT_EQ(s.stats().unnamed_inserts, 0u);
  EXPECT_EQ(s.stats().reserved_bytes, total_packed(model)) << "every reservation's size, counted once";

  // A second runtime over the same weights: look-ups only, same offsets, no finalize needed.
  Runtime second;
  ASSERT_EQ(create_runtime(s.provider(), model, &second), fxnn_status_success);
  EXPECT_EQ(s.count(fxnn_call_look_up), 24u);
  EXPECT_EQ(s.count(fxnn_call_reserve_space), 12u);
  EXPECT_EQ(s.count(fxnn_call_look_up_or_insert), 12u);
  for (std::size_t i = 0; i < model.size(); ++i) EXPECT_EQ(second.ops[i].packed_offset, first.ops[i].packed_offset);
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_success);
  EXPECT_EQ(check_runtime(&second, model), "");

  // Another adapter (another session of the process) with its own copy of the model.
  const auto copy = make_model(11, 12);
  Session t(cache_);
  ASSERT_TRUE(name_model(t.adapter, copy));
  Runtime third;
  ASSERT_EQ(create_runtime(t.provider(), copy, &third), fxnn_status_success);
  EXPECT_EQ(t.count(fxnn_call_reserve_space), 0u);
  EXPECT_EQ(t.stats().hits, 12u);
  EXPECT_EQ(t.stats().reserved_bytes, 0u);
  EXPECT_EQ(check_runtime(&third, copy), "");
}

TEST_F(XnnAdapterTest, OffsetToAddrIsCalledAtEveryReshapeAndStaysPut) {
  const auto model = make_model(12, 5);
  Session s(cache_);
  ASSERT_TRUE(name_model(s.adapter, model));
  Runtime rt;
  ASSERT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  std::vector<const void*> first;
  for (int reshape = 0; reshape < 3; ++reshape) {
    for (std::size_t i = 0; i < rt.ops.size(); ++i) {
      ASSERT_EQ(fxnn_reshape_operator(&rt.ops[i]), fxnn_status_success);
      if (reshape == 0) first.push_back(rt.ops[i].packed);
      EXPECT_EQ(rt.ops[i].packed, first[i]);
    }
  }
  EXPECT_EQ(s.count(fxnn_call_offset_to_addr), 15u);
  EXPECT_EQ(check_runtime(&rt, model), "");
}

TEST_F(XnnAdapterTest, ReserveKeepsWorkingAfterFinalizeAndIsFinalizedFollowsInserts) {
  const auto a = make_model(13, 4, "encoder.");
  const auto b = make_model(14, 3, "decoder.");
  Session s(cache_);
  ASSERT_TRUE(name_model(s.adapter, a));
  ASSERT_TRUE(name_model(s.adapter, b));
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_success);  // nothing inserted yet

  Runtime ra;
  ASSERT_EQ(create_runtime(s.provider(), a, &ra), fxnn_status_success);
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_invalid_state);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_success);

  // A second runtime with new weights after the finalize: reserve works, setup waits again.
  Runtime rb;
  ASSERT_EQ(create_runtime(s.provider(), b, &rb), fxnn_status_success);
  EXPECT_EQ(s.count(fxnn_call_reserve_space), 7u);
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_invalid_state);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_success);
  EXPECT_EQ(check_runtime(&ra, a), "");
  EXPECT_EQ(check_runtime(&rb, b), "");
  EXPECT_EQ(cache_stats(cache_).commits, 2u);
  EXPECT_EQ(cache_stats(cache_).entries, 7u);
}

// ---- is_finalized: per adapter ---------------------------------------------------------------

// What XNNPACK does for one weight whose look-up missed: reserve, pack, insert. Returns the offset.
std::size_t pack_through(wc_xnn_weights_cache_provider* p, const void* kernel, unsigned char fill) {
  const wc_xnn_weights_cache_look_up_key key{7, kernel, nullptr, 1};
  EXPECT_EQ(p->look_up(p->context, &key), SIZE_MAX);
  void* mem = p->reserve_space(p->context, 256);
  EXPECT_NE(mem, nullptr);
  if (mem == nullptr) return SIZE_MAX;
  std::memset(mem, fill, 256);
  return p->look_up_or_insert(p->context, &key, mem, 256);
}

bool finalized(wc_xnn_weights_cache_provider* p) { return p->is_finalized(p->context); }

// The provider's is_finalized answers for its adapter (xnnpack.h): true when every entry this
// adapter put into the cache has been through a wc_finalize that started after the insert (by
// anyone, through any handle sharing the cache), or when it put nothing there. wc_is_finalized
// stays the whole cache's.
TEST_F(XnnAdapterTest, IsFinalizedIsPerAdapterAndCountsOnlyFinalizesThatStartAfterItsInserts) {
  Session a(cache_), b(cache_);
  alignas(64) float wa[16], wa2[16], wa3[16], wb[16], shared_a[16], shared_b[16], unnamed[16];
  ASSERT_EQ(wc_xnn_adapter_name_buffer(a.adapter, wa, "a.w"), WC_OK);
  ASSERT_EQ(wc_xnn_adapter_name_buffer(a.adapter, wa2, "a.w2"), WC_OK);
  ASSERT_EQ(wc_xnn_adapter_name_buffer(a.adapter, wa3, "a.w3"), WC_OK);
  ASSERT_EQ(wc_xnn_adapter_name_buffer(b.adapter, wb, "b.w"), WC_OK);
  ASSERT_EQ(wc_xnn_adapter_name_buffer(a.adapter, shared_a, "shared.w"), WC_OK);
  ASSERT_EQ(wc_xnn_adapter_name_buffer(b.adapter, shared_b, "shared.w"), WC_OK);
  wc_xnn_weights_cache_provider* pa = a.mirror();
  wc_xnn_weights_cache_provider* pb = b.mirror();
  EXPECT_TRUE(finalized(pa));  // nothing inserted yet
  EXPECT_TRUE(finalized(pb));

  // A finalize that ran before A's insert does not count for it.
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  ASSERT_NE(pack_through(pa, wa, 0xa1), SIZE_MAX);
  EXPECT_FALSE(finalized(pa));
  EXPECT_TRUE(finalized(pb)) << "B inserted nothing: A's pending weights must not stop B's setup";
  EXPECT_EQ(fxnn_setup(b.provider()), fxnn_status_success);
  EXPECT_EQ(fxnn_setup(a.provider()), fxnn_status_invalid_state);
  EXPECT_EQ(wc_is_finalized(cache_), 0) << "wc_is_finalized is the whole cache's";

  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  EXPECT_TRUE(finalized(pa));
  EXPECT_TRUE(finalized(pb));
  EXPECT_EQ(wc_is_finalized(cache_), 1);

  // A inserts again: A waits for the next finalize, B does not.
  ASSERT_NE(pack_through(pa, wa2, 0xa2), SIZE_MAX);
  EXPECT_FALSE(finalized(pa));
  EXPECT_TRUE(finalized(pb));

  // A reservation made before a finalize, inserted after it: the insert is what counts.
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  EXPECT_TRUE(finalized(pa));
  const wc_xnn_weights_cache_look_up_key k3{7, wa3, nullptr, 1};
  EXPECT_EQ(pa->look_up(pa->context, &k3), SIZE_MAX);
  void* mem = pa->reserve_space(pa->context, 256);
  ASSERT_NE(mem, nullptr);
  std::memset(mem, 0xa3, 256);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);  // before the insert: does not cover it
  ASSERT_NE(pa->look_up_or_insert(pa->context, &k3, mem, 256), SIZE_MAX);
  EXPECT_FALSE(finalized(pa));
  EXPECT_TRUE(finalized(pb));

  // B inserts too; a wc_finalize through another handle sharing the cache covers both.
  ASSERT_NE(pack_through(pb, wb, 0xb1), SIZE_MAX);
  EXPECT_FALSE(finalized(pb));
  wc_cache* other = nullptr;
  ASSERT_EQ(open_cache(path_, &other), WC_OK) << wc_last_error();
  EXPECT_EQ(wc_is_finalized(other), 0) << "the second handle should share the first's cache";
  ASSERT_EQ(wc_finalize(other), WC_OK);
  EXPECT_TRUE(finalized(pa));
  EXPECT_TRUE(finalized(pb));
  wc_close(other);

  // Two adapters that both missed and packed the same weights: the second insert finds the
  // first's entry, which has not been finalized yet, so neither adapter is.
  const std::size_t first = pack_through(pa, shared_a, 0x5a);
  ASSERT_NE(first, SIZE_MAX);
  const wc_xnn_weights_cache_look_up_key kb{7, shared_b, nullptr, 1};
  void* raced = pb->reserve_space(pb->context, 256);
  ASSERT_NE(raced, nullptr);
  std::memset(raced, 0x5a, 256);
  EXPECT_EQ(pb->look_up_or_insert(pb->context, &kb, raced, 256), first);
  EXPECT_FALSE(finalized(pa));
  EXPECT_FALSE(finalized(pb)) << "B was handed weights that no finalize has covered yet";
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  EXPECT_TRUE(finalized(pa));
  EXPECT_TRUE(finalized(pb));
  // Found again once finalized: nothing new waits.
  void* again = pb->reserve_space(pb->context, 256);
  ASSERT_NE(again, nullptr);
  std::memset(again, 0x5a, 256);
  EXPECT_EQ(pb->look_up_or_insert(pb->context, &kb, again, 256), first);
  EXPECT_TRUE(finalized(pb));

  // Weights kept in the adapter's private heap (an unnamed buffer) never make it unfinalized.
  ASSERT_NE(pack_through(pb, unnamed, 0x77), SIZE_MAX);
  EXPECT_EQ(b.stats().unnamed_inserts, 1u);
  EXPECT_TRUE(finalized(pb));
  EXPECT_EQ(wc_is_finalized(cache_), 1);
  EXPECT_EQ(cache_stats(cache_).entries, 5u);
}

// One adapter per session, sessions on their own threads over one cache. Every round half of
// them load (pack new weights, then finalize) while the other half serve weights finalized in an
// earlier round: a serving session sets up while the loaders' weights await their finalize, and
// is_finalized is polled while others insert and finalize (the suite's TSan build checks the
// ordering). A loader's setup is refused until a finalize that follows its inserts.
TEST_F(XnnAdapterTest, EachSessionsSetupWaitsOnlyForItsOwnInsertsAcrossThreads) {
  constexpr int kThreads = 4, kRounds = 6;
  std::vector<std::vector<std::vector<Linear>>> models(kThreads);
  for (int t = 0; t < kThreads; ++t)
    for (int r = 0; r < kRounds; ++r)
      models[t].push_back(make_model(3000 + 100 * t + r, 3, "s" + std::to_string(t) + ".r" + std::to_string(r) + "."));
  std::mutex mu;
  std::vector<std::string> errors;
  std::barrier sync(kThreads);
  auto worker = [&](int t) {
    auto fail = [&](int r, const std::string& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back("session " + std::to_string(t) + ", round " + std::to_string(r) + ": " + e);
    };
    Session s(cache_);
    for (const auto& m : models[t])
      if (!name_model(s.adapter, m)) fail(-1, "name_buffer failed");
    auto poll_setup = [&](int r, fxnn_status want, const char* what) {
      for (int poll = 0; poll < 20; ++poll)
        if (fxnn_setup(s.provider()) != want) return fail(r, what);
    };
    std::vector<Runtime> runtimes(kRounds);
    for (int r = 0; r < kRounds; ++r) {
      const bool loads = (t + r) % 2 == 0;
      bool created = false;
      sync.arrive_and_wait();
      if (loads) {  // new weights into the shared cache
        created = create_runtime(s.provider(), models[t][r], &runtimes[r]) == fxnn_status_success;
        if (!created) fail(r, "create");
      } else {
        poll_setup(r, fxnn_status_success, "a serving session's setup was refused while others packed");
      }
      sync.arrive_and_wait();  // every loader's weights are in the cache; nobody finalized them
      if (loads)
        poll_setup(r, fxnn_status_invalid_state, "set up before its new weights were finalized");
      else
        poll_setup(r, fxnn_status_success, "a serving session's setup was refused while others' weights await a finalize");
      sync.arrive_and_wait();
      if (loads) {
        if (wc_finalize(cache_) != WC_OK) fail(r, std::string("finalize: ") + wc_last_error());
        poll_setup(r, fxnn_status_success, "setup refused after its own finalize");
        if (created)
          if (auto e = check_runtime(&runtimes[r], models[t][r]); !e.empty()) fail(r, e);
      } else {
        poll_setup(r, fxnn_status_success, "a serving session's setup was refused while others finalized");
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(cache_stats(cache_).entries, static_cast<std::uint64_t>(kThreads * kRounds / 2 * 3));
  EXPECT_EQ(wc_is_finalized(cache_), 1);
}

// ---- a second process ----------------------------------------------------------------------

TEST_F(XnnAdapterTest, SecondProcessOnlyHits) {
  const auto model = make_model(21, 16);
  {
    Session s(cache_);
    ASSERT_TRUE(name_model(s.adapter, model));
    Runtime rt;
    ASSERT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
    ASSERT_EQ(wc_finalize(cache_), WC_OK);
  }
  close_cache();
  const auto st = run_child("warm", 21, 16);
  EXPECT_TRUE(st.ok()) << st.describe();
}

TEST_F(XnnAdapterTest, SecondProcessHitsWhileTheFirstStillHasTheCacheOpen) {
  const auto model = make_model(22, 10);
  Session s(cache_);
  ASSERT_TRUE(name_model(s.adapter, model));
  Runtime rt;
  ASSERT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  const auto st = run_child("warm", 22, 10);
  EXPECT_TRUE(st.ok()) << st.describe();
  EXPECT_EQ(check_runtime(&rt, model), "");
}

TEST_F(XnnAdapterTest, ChildReportsPackingWhenTheCacheIsCold) {
  // The child's "only hits" verdict can fail: on an empty cache it has to pack.
  close_cache();
  const auto st = run_child("warm", 23, 4);
  EXPECT_TRUE(st.exited);
  EXPECT_EQ(st.code, weightcache::test::kChildUnexpected) << st.describe();
}

TEST_F(XnnAdapterTest, UnfinalizedEntriesAreNotSeenByTheNextProcess) {
  const auto model = make_model(24, 4);
  {
    Session s(cache_);
    ASSERT_TRUE(name_model(s.adapter, model));
    Runtime rt;
    ASSERT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
  }
  close_cache();  // no wc_finalize: nothing persisted
  const auto st = run_child("warm", 24, 4);
  EXPECT_EQ(st.code, weightcache::test::kChildUnexpected) << st.describe();
}

// ---- alias_data ----------------------------------------------------------------------------

TEST_F(XnnAdapterTest, AliasResolvesAConvertedBufferToTheOriginalsName) {
  const auto model = make_model(31, 6);
  auto run = [&](Session& s, bool alias, std::vector<std::vector<float>>* converted, Runtime* rt) {
    std::vector<std::vector<std::uint16_t>> originals;
    for (const auto& l : model) {
      originals.push_back(to_bf16(l.weight));
      ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, originals.back().data(), l.weight_name.c_str()), WC_OK);
      if (!l.bias.empty()) {
        ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, l.bias.data(), l.bias_name.c_str()), WC_OK);
      }
    }
    std::vector<const float*> kernels;
    for (std::size_t i = 0; i < model.size(); ++i) {
      converted->push_back(from_bf16(originals[i]));
      kernels.push_back(converted->back().data());
      if (alias) {
        ASSERT_EQ(fxnn_alias(s.provider(), converted->back().data(), originals[i].data()), fxnn_status_success);
      }
    }
    ASSERT_EQ(create_runtime(s.provider(), model, rt, &kernels), fxnn_status_success);
    ASSERT_EQ(wc_finalize(cache_), WC_OK);
    EXPECT_EQ(check_runtime(rt, model, &kernels), "");
  };

  {
    Session s(cache_);
    std::vector<std::vector<float>> converted;
    converted.reserve(model.size());
    Runtime rt;
    run(s, true, &converted, &rt);
    EXPECT_EQ(s.count(fxnn_call_reserve_space), 6u);
    EXPECT_EQ(s.count(fxnn_call_alias_data), 6u);
    EXPECT_EQ(s.stats().aliases, 6u);
    EXPECT_EQ(s.stats().unnamed_inserts, 0u);
    EXPECT_EQ(cache_stats(cache_).entries, 6u);
  }
  {
    // A new session converts again, into new buffers at new addresses: all hits.
    Session s(cache_);
    std::vector<std::vector<float>> converted;
    converted.reserve(model.size());
    Runtime rt;
    run(s, true, &converted, &rt);
    EXPECT_EQ(s.count(fxnn_call_reserve_space), 0u);
    EXPECT_EQ(s.stats().hits, 6u);
  }
  {
    // Without alias_data the converted buffers have no name: packed again, to the heap.
    Session s(cache_);
    std::vector<std::vector<float>> converted;
    converted.reserve(model.size());
    Runtime rt;
    run(s, false, &converted, &rt);
    EXPECT_EQ(s.count(fxnn_call_reserve_space), 6u);
    EXPECT_EQ(s.stats().unnamed_inserts, 6u);
    EXPECT_EQ(cache_stats(cache_).entries, 6u);
  }
  close_cache();
  const auto st = run_child("alias", 31, 6);
  EXPECT_TRUE(st.ok()) << st.describe();
}

TEST_F(XnnAdapterTest, AliasCyclesAndNullArgumentsAreHandled) {
  Session s(cache_);
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  wc_xnn_weights_cache_provider* p = s.mirror();
  EXPECT_EQ(p->alias_data(p->context, nullptr, b), WC_XNN_STATUS_INVALID_PARAMETER);
  EXPECT_EQ(p->alias_data(p->context, a, nullptr), WC_XNN_STATUS_INVALID_PARAMETER);
  EXPECT_EQ(p->alias_data(p->context, a, a), WC_XNN_STATUS_SUCCESS);
  // a -> b -> a: no name anywhere; a look-up must end (as an unnamed miss), not loop.
  ASSERT_EQ(p->alias_data(p->context, a, b), WC_XNN_STATUS_SUCCESS);
  ASSERT_EQ(p->alias_data(p->context, b, a), WC_XNN_STATUS_SUCCESS);
  wc_xnn_weights_cache_look_up_key key{1, a, nullptr, 2};
  EXPECT_EQ(p->look_up(p->context, &key), SIZE_MAX);
  // Naming b ends the chain: a resolves to b's name.
  ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, b, "b"), WC_OK);
  void* mem = p->reserve_space(p->context, sizeof a);
  ASSERT_NE(mem, nullptr);
  std::memcpy(mem, a, sizeof a);
  const std::size_t off = p->look_up_or_insert(p->context, &key, mem, sizeof a);
  ASSERT_NE(off, SIZE_MAX);
  EXPECT_EQ(s.stats().unnamed_inserts, 0u);
  EXPECT_EQ(cache_stats(cache_).entries, 1u);
}

TEST_F(XnnAdapterTest, AnOffsetXnnpackHoldsStaysUsableAfterItsKeyIsReplaced) {
  // Two threads both miss one weight and pack it; the second packs other bytes (a packer that is
  // not deterministic) and its insert replaces the first. The first operator keeps its offset and
  // XNNPACK feeds it to offset_to_addr at every reshape without checking: it must not get NULL.
  // Through the plain C ABI the replaced offset is no longer an entry's.
  Session s(cache_);
  float w[16] = {};
  ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, w, "layer0.weight"), WC_OK);
  wc_xnn_weights_cache_provider* p = s.mirror();
  wc_xnn_weights_cache_look_up_key key{7, w, nullptr, 3};
  ASSERT_EQ(p->look_up(p->context, &key), SIZE_MAX);
  auto pack = [&](unsigned char fill) {
    void* mem = p->reserve_space(p->context, 256);
    EXPECT_NE(mem, nullptr);
    if (mem == nullptr) return SIZE_MAX;
    std::memset(mem, fill, 256);
    return p->look_up_or_insert(p->context, &key, mem, 256);
  };
  const std::size_t first = pack(0x11);
  const std::size_t second = pack(0x22);
  ASSERT_NE(first, SIZE_MAX);
  ASSERT_NE(second, SIZE_MAX);
  ASSERT_NE(first, second);
  EXPECT_EQ(p->look_up(p->context, &key), second);
  const auto* a = static_cast<const unsigned char*>(p->offset_to_addr(p->context, first));
  const auto* b = static_cast<const unsigned char*>(p->offset_to_addr(p->context, second));
  ASSERT_NE(a, nullptr) << "XNNPACK would dereference this";
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a[0], 0x11);
  EXPECT_EQ(a[255], 0x11);
  EXPECT_EQ(b[0], 0x22);
  EXPECT_EQ(wc_offset_to_addr(cache_, first), nullptr);
  EXPECT_EQ(wc_offset_to_addr(cache_, second), b);
}

// ---- unnamed buffers -----------------------------------------------------------------------

TEST_F(XnnAdapterTest, UnnamedBuffersAreServedFromTheHeapCountedAndLoggedOnce) {
  LogCapture logs;
  const auto model = make_model(41, 5);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  const std::uint64_t size_before = file_size(path_);
  Session s(cache_);

  Runtime rt;
  ASSERT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
  EXPECT_EQ(s.count(fxnn_call_reserve_space), 5u);
  auto as = s.stats();
  EXPECT_EQ(as.unnamed_inserts, 5u);
  EXPECT_EQ(as.unnamed_entries, 5u);
  EXPECT_GE(as.unnamed_bytes, total_packed(model));
  // Once per process: an earlier test of this binary may have logged it already (see
  // UnnamedBufferWarningIsLoggedOncePerProcess for the exact count in a fresh process).
  const std::size_t warnings = logs.count("has no name");
  EXPECT_LE(warnings, 1u);

  // Nothing of it reached the cache or its file (not even an abandoned reservation).
  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_success);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  const wc_stats st = cache_stats(cache_);
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.mapped_bytes, 0u);
  EXPECT_EQ(st.dead_bytes, 0u);
  EXPECT_EQ(file_size(path_), size_before);
  EXPECT_EQ(check_runtime(&rt, model), "");

  // In this process they still hit.
  Runtime again;
  ASSERT_EQ(create_runtime(s.provider(), model, &again), fxnn_status_success);
  EXPECT_EQ(s.count(fxnn_call_reserve_space), 5u);
  EXPECT_EQ(check_runtime(&again, model), "");

  // Named weights with an unnamed bias cannot be persisted either.
  const auto partly = make_model(42, 3, "partly.");
  for (const auto& l : partly) ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, l.weight.data(), l.weight_name.c_str()), WC_OK);
  Runtime rp;
  ASSERT_EQ(create_runtime(s.provider(), partly, &rp), fxnn_status_success);
  std::size_t with_bias = 0;
  for (const auto& l : partly) with_bias += l.bias.empty() ? 0 : 1;
  EXPECT_EQ(s.stats().unnamed_inserts, 5u + with_bias);
  EXPECT_EQ(cache_stats(cache_).entries, partly.size() - with_bias);
  EXPECT_EQ(check_runtime(&rp, partly), "");
  EXPECT_EQ(logs.count("has no name"), warnings);
}

TEST_F(XnnAdapterTest, UnnamedBufferWarningIsLoggedOncePerProcess) {
  // Three adapters in a fresh process each pack unnamed buffers: one warning between them.
  const auto st = run_child("unnamed", 44, 3);
  EXPECT_TRUE(st.ok()) << st.describe();
}

TEST_F(XnnAdapterTest, RebindingAnAddressDropsWhatWasPackedFromIt) {
  Session s(cache_);
  auto model = make_model(43, 1);
  Runtime first;
  ASSERT_EQ(create_runtime(s.provider(), model, &first), fxnn_status_success);
  ASSERT_EQ(s.count(fxnn_call_reserve_space), 1u);

  // The runtime frees the buffer and the address is reused for other weights: it unbinds first.
  for (float& w : model[0].weight) w = -w;
  ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, model[0].weight.data(), nullptr), WC_OK);
  Runtime second;
  ASSERT_EQ(create_runtime(s.provider(), model, &second), fxnn_status_success);
  EXPECT_EQ(s.count(fxnn_call_reserve_space), 2u);
  EXPECT_NE(second.ops[0].packed_offset, first.ops[0].packed_offset);
  EXPECT_EQ(check_runtime(&second, model), "");

  // Naming the buffer now makes it persistable; unbinding a name makes it unnamed again.
  ASSERT_TRUE(name_model(s.adapter, model));
  EXPECT_EQ(s.stats().named_buffers, model[0].bias.empty() ? 1u : 2u);
  Runtime named;
  ASSERT_EQ(create_runtime(s.provider(), model, &named), fxnn_status_success);
  EXPECT_EQ(cache_stats(cache_).entries, 1u);
  ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, model[0].weight.data(), nullptr), WC_OK);
  const std::uint64_t unnamed = s.stats().unnamed_inserts;
  Runtime unbound;
  ASSERT_EQ(create_runtime(s.provider(), model, &unbound), fxnn_status_success);
  EXPECT_EQ(s.stats().unnamed_inserts, unnamed + 1);
  EXPECT_EQ(check_runtime(&unbound, model), "");
}

TEST_F(XnnAdapterTest, NullKernelIsNeverSharedNorPersisted) {
  Session s(cache_);
  wc_xnn_weights_cache_provider* p = s.mirror();
  wc_xnn_weights_cache_look_up_key key{7, nullptr, nullptr, 1};
  EXPECT_EQ(p->look_up(p->context, &key), SIZE_MAX);
  const char bytes[] = "packed";
  void* mem = p->reserve_space(p->context, sizeof bytes);
  ASSERT_NE(mem, nullptr);
  std::memcpy(mem, bytes, sizeof bytes);
  const std::size_t off = p->look_up_or_insert(p->context, &key, mem, sizeof bytes);
  ASSERT_NE(off, SIZE_MAX);
  ASSERT_NE(p->offset_to_addr(p->context, off), nullptr);
  EXPECT_EQ(std::memcmp(p->offset_to_addr(p->context, off), bytes, sizeof bytes), 0);
  EXPECT_EQ(p->look_up(p->context, &key), SIZE_MAX);
  EXPECT_EQ(cache_stats(cache_).entries, 0u);
}

// ---- pitfalls ------------------------------------------------------------------------------

TEST_F(XnnAdapterTest, NullPtrInLookUpOrInsertIsALookUpAndNotFoundNeverBecomesAnAddress) {
  const auto model = make_model(51, 1);
  const Linear& l = model[0];
  Session s(cache_);
  ASSERT_TRUE(name_model(s.adapter, model));
  wc_xnn_weights_cache_provider* p = s.mirror();
  wc_xnn_weights_cache_look_up_key key{seed_of(l), l.weight.data(), l.bias.empty() ? nullptr : l.bias.data(),
                                       kFingerprint};

  EXPECT_EQ(p->look_up_or_insert(p->context, &key, nullptr, packed_size(l)), SIZE_MAX);  // a miss, no insert
  EXPECT_EQ(cache_stats(cache_).entries, 0u);
  EXPECT_EQ(p->offset_to_addr(p->context, SIZE_MAX), nullptr);

  Runtime rt;
  ASSERT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
  const std::size_t off = rt.ops[0].packed_offset;
  EXPECT_EQ(p->look_up_or_insert(p->context, &key, nullptr, packed_size(l)), off);  // a hit
  EXPECT_EQ(cache_stats(cache_).entries, 1u);
  EXPECT_EQ(p->offset_to_addr(p->context, SIZE_MAX), nullptr);
  EXPECT_EQ(p->offset_to_addr(p->context, off + 1), nullptr);
  EXPECT_EQ(p->offset_to_addr(p->context, SIZE_MAX - 1), nullptr);  // no process-local entry yet
  EXPECT_EQ(p->offset_to_addr(p->context, SIZE_MAX / 2), nullptr);
  EXPECT_NE(p->offset_to_addr(p->context, off), nullptr);
  EXPECT_EQ(s.stats().look_ups, 3u);  // two ptr == NULL calls and the runtime's look_up

  // A NULL key is refused, not dereferenced.
  EXPECT_EQ(p->look_up(p->context, nullptr), SIZE_MAX);
  EXPECT_EQ(p->look_up_or_insert(p->context, nullptr, nullptr, 4), SIZE_MAX);
}

TEST_F(XnnAdapterTest, KeysAreLengthPrefixedSoConcatenationsDoNotCollide) {
  // Same shape (same seed), names that concatenate to the same string.
  auto make = [](const char* w, const char* b, float value) {
    Linear l;
    l.weight_name = w;
    l.bias_name = b;
    l.rows = 20;
    l.cols = 6;
    l.weight.assign(l.rows * l.cols, value);
    l.bias.assign(l.rows, -value);
    return l;
  };
  // Plus names holding the byte a naive encoding would use as a separator.
  const std::vector<Linear> model = {make("ab", "c", 1.0f), make("a", "bc", 2.0f), make("a\x01", "b", 4.0f),
                                     make("a", "\x01" "b", 5.0f), make("abc", "", 3.0f)};
  auto bind = [&](Session& s, const std::vector<Linear>& m) {
    for (const auto& l : m) {
      ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, l.weight.data(), l.weight_name.c_str()), WC_OK);
      if (!l.bias_name.empty()) {
        ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, l.bias.data(), l.bias_name.c_str()), WC_OK);
      }
    }
  };
  auto last = model;
  last[4].bias.clear();  // "abc" with no bias
  {
    Session s(cache_);
    bind(s, last);
    Runtime rt;
    ASSERT_EQ(create_runtime(s.provider(), last, &rt), fxnn_status_success);
    EXPECT_EQ(s.count(fxnn_call_reserve_space), 5u);
    EXPECT_EQ(cache_stats(cache_).entries, 5u);
    EXPECT_EQ(check_runtime(&rt, last), "");
  }
  {
    // The same bindings in a new session find each its own bytes.
    const auto copy = last;
    Session s(cache_);
    bind(s, copy);
    Runtime rt;
    ASSERT_EQ(create_runtime(s.provider(), copy, &rt), fxnn_status_success);
    EXPECT_EQ(s.count(fxnn_call_reserve_space), 0u);
    EXPECT_EQ(check_runtime(&rt, copy), "");
  }
  {
    // seed and fingerprint_id are part of the key too.
    Session s(cache_);
    bind(s, last);
    wc_xnn_weights_cache_provider* p = s.mirror();
    wc_xnn_weights_cache_look_up_key key{seed_of(last[0]), last[0].weight.data(), last[0].bias.data(), kFingerprint};
    EXPECT_NE(p->look_up(p->context, &key), SIZE_MAX);
    key.seed ^= 1;
    EXPECT_EQ(p->look_up(p->context, &key), SIZE_MAX);
    key.seed ^= 1;
    key.fingerprint_id ^= 1;
    EXPECT_EQ(p->look_up(p->context, &key), SIZE_MAX);
    key.fingerprint_id ^= 1;
    key.bias = nullptr;  // "ab" with no bias is not "ab" with bias "c"
    EXPECT_EQ(p->look_up(p->context, &key), SIZE_MAX);
  }
}

TEST_F(XnnAdapterTest, ReserveRefusesEarlyWhenTheCacheCannotProvideMemory) {
  wc_options o;
  wc_options_init(&o);
  const std::string small = dir_.file("small.wcache");
  o.path = small.c_str();
  o.backing = WC_BACKING_FILE;
  o.durability = WC_DURABILITY_NONE;
  o.max_file_bytes = 1u << 20;
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  {
    Session s(c);
    Linear big;
    big.weight_name = "big.weight";
    big.rows = 1024;
    big.cols = 1024;
    big.weight.assign(big.rows * big.cols, 0.5f);
    const std::vector<Linear> too_big = {big};
    ASSERT_TRUE(name_model(s.adapter, too_big));
    Runtime rt;
    EXPECT_EQ(create_runtime(s.provider(), too_big, &rt), fxnn_status_out_of_memory);
    EXPECT_EQ(s.stats().reserve_failures, 1u);
    EXPECT_EQ(s.count(fxnn_call_look_up_or_insert), 0u);

    const auto model = make_model(61, 4);
    ASSERT_TRUE(name_model(s.adapter, model));
    Runtime ok;
    ASSERT_EQ(create_runtime(s.provider(), model, &ok), fxnn_status_success);
    ASSERT_EQ(wc_finalize(c), WC_OK);
    EXPECT_EQ(check_runtime(&ok, model), "");
    EXPECT_EQ(cache_stats(c).entries, 4u);
  }
  wc_close(c);
}

TEST_F(XnnAdapterTest, DeleteCacheSucceedsAndHarmsNothing) {
  const auto model = make_model(62, 3);
  Session s(cache_);
  ASSERT_TRUE(name_model(s.adapter, model));
  Runtime rt;
  ASSERT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
  wc_xnn_weights_cache_provider* p = s.mirror();
  EXPECT_EQ(p->delete_cache(p->context), WC_XNN_STATUS_SUCCESS);
  ASSERT_EQ(wc_finalize(cache_), WC_OK);
  EXPECT_EQ(check_runtime(&rt, model), "");
  Runtime again;
  ASSERT_EQ(create_runtime(s.provider(), model, &again), fxnn_status_success);
  EXPECT_EQ(check_runtime(&again, model), "");
}

TEST_F(XnnAdapterTest, HeapBackedCacheAndUnnamedEntriesDoNotShareOffsets) {
  // A heap cache (the --no-cache case) numbers its entries from 0 like the adapter's own heap.
  wc_options o;
  wc_options_init(&o);
  o.private_cache = 1;
  o.backing = WC_BACKING_HEAP;
  wc_cache* heap = nullptr;
  ASSERT_EQ(wc_open(&o, &heap), WC_OK);
  {
    Session s(heap);
    const auto named = make_model(63, 4, "named.");
    const auto unnamed = make_model(64, 4, "unnamed.");
    ASSERT_TRUE(name_model(s.adapter, named));
    Runtime rn, ru;
    ASSERT_EQ(create_runtime(s.provider(), unnamed, &ru), fxnn_status_success);
    ASSERT_EQ(create_runtime(s.provider(), named, &rn), fxnn_status_success);
    ASSERT_EQ(wc_finalize(heap), WC_OK);
    EXPECT_EQ(check_runtime(&rn, named), "");
    EXPECT_EQ(check_runtime(&ru, unnamed), "");
    EXPECT_EQ(s.stats().unnamed_entries, 4u);
    EXPECT_EQ(cache_stats(heap).entries, 4u);
  }
  wc_close(heap);
}

// ---- threads -------------------------------------------------------------------------------

TEST_F(XnnAdapterTest, ManyThreadsCreateOperatorsConcurrentlyOverOneAdapter) {
  constexpr int kThreads = 8;
  constexpr std::size_t kShared = 24, kOwn = 4;
  Session s(cache_);
  std::mutex mu;
  std::vector<std::string> errors;
  std::atomic<int> ready{0};
  // Each thread has its own copy of the shared model (same names, its own addresses) and a few
  // weights of its own, one of them unnamed. All stay alive until every thread is done: a freed
  // buffer's address could be reused while its binding still stands.
  std::vector<std::vector<Linear>> shared_copies, owns;
  for (int t = 0; t < kThreads; ++t) {
    shared_copies.push_back(make_model(71, kShared));
    owns.push_back(make_model(1000 + t, kOwn, "thread" + std::to_string(t) + "."));
  }
  auto worker = [&](int t) {
    const auto& shared = shared_copies[t];
    const auto& own = owns[t];
    auto fail = [&](const std::string& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back("thread " + std::to_string(t) + ": " + e);
    };
    if (!name_model(s.adapter, shared)) return fail("name_buffer failed");
    for (std::size_t i = 0; i + 1 < own.size(); ++i) {
      if (wc_xnn_adapter_name_buffer(s.adapter, own[i].weight.data(), own[i].weight_name.c_str()) != WC_OK ||
          (!own[i].bias.empty() &&
           wc_xnn_adapter_name_buffer(s.adapter, own[i].bias.data(), own[i].bias_name.c_str()) != WC_OK))
        return fail("name_buffer failed");
    }
    ready.fetch_add(1);
    while (ready.load() < kThreads) std::this_thread::yield();  // maximise overlap
    for (int round = 0; round < 2; ++round) {
      Runtime rs, ro;
      if (create_runtime(s.provider(), shared, &rs) != fxnn_status_success) return fail("create shared");
      if (create_runtime(s.provider(), own, &ro) != fxnn_status_success) return fail("create own");
      if (wc_finalize(cache_) != WC_OK) return fail(std::string("finalize: ") + wc_last_error());
      if (auto e = check_runtime(&rs, shared); !e.empty()) return fail(e);
      if (auto e = check_runtime(&ro, own); !e.empty()) return fail(e);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  for (const auto& e : errors) ADD_FAILURE() << e;

  EXPECT_EQ(fxnn_setup(s.provider()), fxnn_status_success);
  const wc_stats st = cache_stats(cache_);
  EXPECT_EQ(st.entries, kShared + kThreads * (kOwn - 1));  // one entry per name, however many packed it
  const auto as = s.stats();
  EXPECT_EQ(as.unnamed_entries, static_cast<std::uint64_t>(kThreads));
  EXPECT_EQ(as.look_ups, 2u * kThreads * (kShared + kOwn));
  EXPECT_LE(as.reservations, static_cast<std::uint64_t>(kThreads) * (kShared + kOwn));
  EXPECT_EQ(as.reservations, as.inserts);
}

// ---- the compatibility key -----------------------------------------------------------------

std::vector<unsigned char> compat_key(std::string_view build, std::string_view digest, std::string_view options) {
  std::size_t size = 0;
  EXPECT_EQ(wc_xnn_compat_key(build.data(), build.size(), digest.data(), digest.size(),
                              options.empty() ? nullptr : options.data(), options.size(), nullptr, 0, &size),
            WC_OK)
      << wc_last_error();
  std::vector<unsigned char> key(size);
  std::size_t written = 0;
  EXPECT_EQ(wc_xnn_compat_key(build.data(), build.size(), digest.data(), digest.size(),
                              options.empty() ? nullptr : options.data(), options.size(), key.data(), key.size(),
                              &written),
            WC_OK)
      << wc_last_error();
  EXPECT_EQ(written, size);
  return key;
}

TEST(XnnCompatKey, LayoutIsAHeaderThenEachPartLengthPrefixed) {
  const auto key = compat_key("BUILD", "sha256:ab", "avx2");
  const unsigned char want[] = {'x', 'n', 'c', 'k', 1,   5,   0,   0,   0,   'B', 'U', 'I', 'L', 'D', 9,
                                0,   0,   0,   's', 'h', 'a', '2', '5', '6', ':', 'a', 'b', 4,   0,   0,
                                0,   'a', 'v', 'x', '2'};
  ASSERT_EQ(key.size(), sizeof want);
  EXPECT_EQ(std::memcmp(key.data(), want, sizeof want), 0);
  EXPECT_EQ(key.size(), WC_XNN_COMPAT_KEY_SIZE(5, 9, 4));
  // No options: a zero length, nothing after it.
  const auto bare = compat_key("BUILD", "sha256:ab", "");
  EXPECT_EQ(bare.size(), WC_XNN_COMPAT_KEY_SIZE(5, 9, 0));
  EXPECT_EQ(std::memcmp(bare.data(), want, bare.size() - 4), 0);
}

TEST(XnnCompatKey, EveryPartChangesTheKeyAndConcatenationsDoNotCollide) {
  const auto base = compat_key("build-1", "model-1", "fp16=0");
  EXPECT_EQ(compat_key("build-1", "model-1", "fp16=0"), base);  // deterministic
  EXPECT_NE(compat_key("build-2", "model-1", "fp16=0"), base);  // another XNNPACK build
  EXPECT_NE(compat_key("build-1", "model-2", "fp16=0"), base);  // another model
  EXPECT_NE(compat_key("build-1", "model-1", "fp16=1"), base);  // another packing option
  EXPECT_NE(compat_key("build-1", "model-1", ""), base);
  // Moving bytes from one part to the next gives another key.
  EXPECT_NE(compat_key("ab", "c", "d"), compat_key("a", "bc", "d"));
  EXPECT_NE(compat_key("a", "bc", "d"), compat_key("a", "b", "cd"));
  // Binary parts (an identifier is bytes, NULs included).
  const std::string with_nul("x\0y", 3), other_nul("x\0z", 3);
  EXPECT_NE(compat_key(with_nul, "m", ""), compat_key(other_nul, "m", ""));
}

TEST(XnnCompatKey, SizesErrorsAndTheCallersBuffer) {
  const char b[] = "build", d[] = "digest";
  std::size_t size = 123;
  // The size query, then a buffer one byte short: refused, nothing written, the size needed said.
  ASSERT_EQ(wc_xnn_compat_key(b, 5, d, 6, nullptr, 0, nullptr, 0, &size), WC_OK);
  EXPECT_EQ(size, WC_XNN_COMPAT_KEY_SIZE(5, 6, 0));
  std::vector<unsigned char> buf(size + 8, 0xAA);
  std::size_t got = 0;
  EXPECT_EQ(wc_xnn_compat_key(b, 5, d, 6, nullptr, 0, buf.data(), size - 1, &got), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(got, size);
  EXPECT_NE(std::string(wc_last_error()).find("needs " + std::to_string(size)), std::string::npos) << wc_last_error();
  for (unsigned char c : buf) EXPECT_EQ(c, 0xAA);
  EXPECT_EQ(wc_xnn_compat_key(b, 5, d, 6, nullptr, 0, nullptr, 16, &got), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(got, size);
  // A larger buffer: exactly `size` bytes written, the rest untouched.
  ASSERT_EQ(wc_xnn_compat_key(b, 5, d, 6, nullptr, 0, buf.data(), buf.size(), &got), WC_OK);
  EXPECT_EQ(got, size);
  for (std::size_t i = size; i < buf.size(); ++i) EXPECT_EQ(buf[i], 0xAA);

  // Bad arguments: *out_size is 0 and wc_last_error says which.
  EXPECT_EQ(wc_xnn_compat_key(b, 5, d, 6, nullptr, 0, buf.data(), buf.size(), nullptr), WC_ERR_INVALID_ARGUMENT);
  const struct {
    const void* build;
    std::size_t build_size;
    const void* digest;
    std::size_t digest_size;
    const void* options;
    std::size_t options_size;
    const char* says;
  } bad[] = {
      {nullptr, 5, d, 6, nullptr, 0, "build identifier"},
      {b, 0, d, 6, nullptr, 0, "build identifier"},
      {b, 5, nullptr, 6, nullptr, 0, "model digest"},
      {b, 5, d, 0, nullptr, 0, "model digest"},
      {b, 5, d, 6, nullptr, 3, "options is NULL"},
  };
  for (const auto& c : bad) {
    got = 99;
    EXPECT_EQ(wc_xnn_compat_key(c.build, c.build_size, c.digest, c.digest_size, c.options, c.options_size,
                                buf.data(), buf.size(), &got),
              WC_ERR_INVALID_ARGUMENT)
        << c.says;
    EXPECT_EQ(got, 0u);
    EXPECT_NE(std::string(wc_last_error()).find(c.says), std::string::npos) << wc_last_error();
  }
  // The largest parts fit the largest key; one byte more is refused.
  const std::vector<unsigned char> big(WC_XNN_COMPAT_PART_MAX_SIZE + 1, 'p');
  std::vector<unsigned char> out(WC_XNN_COMPAT_KEY_MAX_SIZE);
  const std::size_t m = WC_XNN_COMPAT_PART_MAX_SIZE;
  ASSERT_EQ(wc_xnn_compat_key(big.data(), m, big.data(), m, big.data(), m, out.data(), out.size(), &got), WC_OK);
  EXPECT_EQ(got, out.size());
  EXPECT_EQ(wc_xnn_compat_key(big.data(), m + 1, d, 6, nullptr, 0, out.data(), out.size(), &got),
            WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_xnn_compat_key(b, 5, big.data(), m + 1, nullptr, 0, out.data(), out.size(), &got),
            WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_xnn_compat_key(b, 5, d, 6, big.data(), m + 1, out.data(), out.size(), &got), WC_ERR_INVALID_ARGUMENT);
}

// A cache written under one build's key is not served under another's: wc_open replaces it.
TEST(XnnCompatKey, ACacheWrittenUnderAnotherBuildsKeyIsNotServed) {
  TempDir dir("weightcache-xnn");
  const std::string path = dir.file("model.wcache");
  const auto model = make_model(41, 6);
  auto open_with = [&](const std::vector<unsigned char>& key, wc_cache** out) {
    wc_options o;
    wc_options_init(&o);
    o.path = path.c_str();
    o.compat_key = key.data();
    o.compat_key_size = key.size();
    o.durability = WC_DURABILITY_NONE;
    o.backing = WC_BACKING_FILE;
    // Reservable anywhere: under qemu-user a default reservation is cut to the emulated address
    // space, and says so in a warning this test would count.
    o.max_file_bytes = 256u << 20;
    return wc_open(&o, out);
  };
  // Returns how many layers had to be packed.
  auto load = [&](const std::vector<unsigned char>& key) -> std::size_t {
    wc_cache* c = nullptr;
    EXPECT_EQ(open_with(key, &c), WC_OK) << wc_last_error();
    if (c == nullptr) return SIZE_MAX;
    std::size_t packed = SIZE_MAX;
    {
      Session s(c);
      EXPECT_TRUE(name_model(s.adapter, model));
      Runtime rt;
      EXPECT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
      EXPECT_EQ(wc_finalize(c), WC_OK);
      EXPECT_EQ(check_runtime(&rt, model), "");
      packed = s.count(fxnn_call_reserve_space);
    }
    wc_close(c);
    return packed;
  };
  const auto mine = compat_key("xnnpack-build-A", "model-41", "");
  const auto theirs = compat_key("xnnpack-build-B", "model-41", "");
  LogCapture log;  // the replaced file is logged; nothing else
  EXPECT_EQ(load(mine), model.size());
  EXPECT_EQ(load(mine), 0u);
  EXPECT_EQ(load(theirs), model.size());  // another build: nothing served
  EXPECT_EQ(load(mine), model.size());    // and back: the other build's packing is not served either
  EXPECT_EQ(load(mine), 0u);
  EXPECT_EQ(log.count("another compatibility key"), 2u);
  EXPECT_EQ(log.at_least(WC_LOG_WARN).size(), 2u);
}

// ---- contracts of xnnpack.h ---------------------------------------------------------------

// "if the cache cannot commit the entry, the bytes are copied to the adapter's private heap and
// the cache's reservation is released; wc_last_error on that thread then says why the cache
// refused them (the one call that sets it without failing)". The cache refuses a size past the
// reservation; the adapter keeps the bytes, and its offset resolves to them.
TEST_F(XnnAdapterTest, AProviderFallbackSucceedsAndLeavesTheCachesReasonInLastError) {
  Session s(cache_);
  wc_xnn_weights_cache_provider* p = s.mirror();
  float kernel[4] = {1, 2, 3, 4};
  ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, kernel, "kernel"), WC_OK);
  const wc_xnn_weights_cache_look_up_key key{42, kernel, nullptr, 7};
  ASSERT_EQ(p->look_up(p->context, &key), SIZE_MAX);
  auto* packed = static_cast<unsigned char*>(p->reserve_space(p->context, 64));
  ASSERT_NE(packed, nullptr) << wc_last_error();
  for (int i = 0; i < 128; ++i) packed[i] = static_cast<unsigned char>(i);  // 64 more than reserved
  ASSERT_EQ(wc_finalize(nullptr), WC_ERR_INVALID_ARGUMENT);  // a known message to start from
  const std::string before = wc_last_error();

  const std::size_t off = p->look_up_or_insert(p->context, &key, packed, 128);
  ASSERT_NE(off, SIZE_MAX) << "the provider failed instead of keeping the bytes: " << wc_last_error();
  const std::string after = wc_last_error();
  EXPECT_NE(after, before) << "wc_last_error does not say why the cache refused the bytes";
  EXPECT_NE(after.find("look_up_or_insert"), std::string::npos) << after;
  const auto* q = static_cast<const unsigned char*>(p->offset_to_addr(p->context, off));
  ASSERT_NE(q, nullptr);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(q[i], i);
  EXPECT_EQ(s.stats().unnamed_inserts, 1u);
  EXPECT_EQ(cache_stats(cache_).entries, 0u) << "the refused bytes went into the cache";
  EXPECT_EQ(wc_release_space(cache_, packed), WC_ERR_INVALID_ARGUMENT) << "the reservation was not released";
}

// wc_xnn_adapter_name_buffer: "The name is copied; `data` is used as an address only, never
// read"; wc_xnn_adapter_provider: "the same one at every call"; look_up: "SIZE_MAX on a miss (also
// for a NULL key)"; offset_to_addr: "NULL for SIZE_MAX and for an offset that is no entry's. Sets
// no error."; look_up_or_insert "with a NULL key ... fails (SIZE_MAX, WC_ERR_INVALID_ARGUMENT in
// wc_last_error)".
TEST_F(XnnAdapterTest, NamesAreCopiedAndTheProviderAnswersAsDocumented) {
  const auto model = make_model(65, 2);
  {
    Session s(cache_);
    EXPECT_EQ(wc_xnn_adapter_provider(s.adapter), wc_xnn_adapter_provider(s.adapter));
    for (const auto& l : model) {
      std::string name = l.weight_name;  // a buffer the caller reuses at once
      ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, l.weight.data(), name.c_str()), WC_OK);
      std::fill(name.begin(), name.end(), '#');
      if (l.bias.empty()) continue;
      std::string bias = l.bias_name;
      ASSERT_EQ(wc_xnn_adapter_name_buffer(s.adapter, l.bias.data(), bias.c_str()), WC_OK);
      std::fill(bias.begin(), bias.end(), '#');
    }
    Runtime rt;
    ASSERT_EQ(create_runtime(s.provider(), model, &rt), fxnn_status_success);
    ASSERT_EQ(wc_finalize(cache_), WC_OK);
    EXPECT_EQ(check_runtime(&rt, model), "");

    wc_xnn_weights_cache_provider* p = s.mirror();
    ASSERT_EQ(wc_finalize(nullptr), WC_ERR_INVALID_ARGUMENT);
    const std::string before = wc_last_error();
    EXPECT_EQ(p->look_up(p->context, nullptr), SIZE_MAX);
    EXPECT_EQ(p->offset_to_addr(p->context, SIZE_MAX), nullptr);
    EXPECT_EQ(p->offset_to_addr(p->context, 1), nullptr);
    EXPECT_EQ(std::string(wc_last_error()), before) << "a miss or a NULL address set an error";
    char buf[8] = {};
    EXPECT_EQ(p->look_up_or_insert(p->context, nullptr, buf, sizeof buf), SIZE_MAX);
    EXPECT_NE(std::string(wc_last_error()), before) << "a failed insert did not say why";
  }
  // A second adapter that names the buffers as the first was told to finds every entry: the
  // keys were built from the names as given, not from the overwritten buffers.
  Session again(cache_);
  ASSERT_TRUE(name_model(again.adapter, model));
  Runtime rt;
  ASSERT_EQ(create_runtime(again.provider(), model, &rt), fxnn_status_success);
  EXPECT_EQ(again.count(fxnn_call_reserve_space), 0u) << "a name was not copied when it was bound";
  EXPECT_EQ(check_runtime(&rt, model), "");
}

// wc_xnn_adapter_get_stats: "*out is left untouched" on failure, and it "writes no byte past"
// struct_size; wc_xnn_adapter_stats_init: "Zeroes *stats ... NULL is ignored"; reserve_space:
// memory "in the adapter's private heap after a look-up whose kernel or bias had no name ...
// (128 in the private heap)".
TEST_F(XnnAdapterTest, StatsAreUntouchedByAFailureAndPrivateHeapMemoryIsAlignedTo128) {
  Session s(cache_);
  wc_xnn_weights_cache_provider* p = s.mirror();
  float unnamed[4] = {};
  const wc_xnn_weights_cache_look_up_key key{1, unnamed, nullptr, 1};
  ASSERT_EQ(p->look_up(p->context, &key), SIZE_MAX);
  void* heap = p->reserve_space(p->context, 100);
  ASSERT_NE(heap, nullptr) << wc_last_error();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(heap) % 128, 0u);
  EXPECT_NE(p->look_up_or_insert(p->context, &key, heap, 100), SIZE_MAX);
  EXPECT_EQ(s.stats().unnamed_entries, 1u);

  wc_xnn_adapter_stats part;
  std::memset(&part, 0x5A, sizeof part);
  part.struct_size = offsetof(wc_xnn_adapter_stats, hits);
  ASSERT_EQ(wc_xnn_adapter_get_stats(s.adapter, &part), WC_OK);
  EXPECT_EQ(part.look_ups, 1u);
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&part) + part.struct_size;
  for (std::size_t i = 0; i < sizeof part - part.struct_size; ++i) ASSERT_EQ(tail[i], 0x5A) << "byte " << i;

  wc_xnn_adapter_stats st;
  std::memset(&st, 0xAB, sizeof st);
  wc_xnn_adapter_stats_init(&st);
  wc_xnn_adapter_stats zero{};
  zero.struct_size = sizeof zero;
  EXPECT_EQ(std::memcmp(&st, &zero, sizeof st), 0);
  wc_xnn_adapter_stats_init(nullptr);
  std::memset(&st, 0x5A, sizeof st);
  st.struct_size = sizeof st;
  const wc_xnn_adapter_stats copy = st;
  EXPECT_EQ(wc_xnn_adapter_get_stats(nullptr, &st), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::memcmp(&st, &copy, sizeof st), 0);
}

// ---- the C ABI's argument checks -----------------------------------------------------------

TEST_F(XnnAdapterTest, CApiRejectsBadArguments) {
  wc_xnn_adapter* a = reinterpret_cast<wc_xnn_adapter*>(0x1);
  EXPECT_EQ(wc_xnn_adapter_create(nullptr, &a), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(a, nullptr);
  EXPECT_EQ(wc_xnn_adapter_create(cache_, nullptr), WC_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(wc_xnn_adapter_create(cache_, &a), WC_OK);
  float buf[2] = {};
  EXPECT_EQ(wc_xnn_adapter_name_buffer(nullptr, buf, "x"), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_xnn_adapter_name_buffer(a, nullptr, "x"), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_xnn_adapter_name_buffer(a, buf, ""), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_xnn_adapter_name_buffer(a, buf, std::string(2001, 'n').c_str()), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_xnn_adapter_name_buffer(a, buf, std::string(2000, 'n').c_str()), WC_OK);
  EXPECT_EQ(wc_xnn_adapter_name_buffer(a, buf + 1, nullptr), WC_OK);  // unbinding an unbound buffer
  EXPECT_EQ(wc_xnn_adapter_provider(nullptr), nullptr);
  EXPECT_NE(wc_xnn_adapter_provider(a), nullptr);
  wc_xnn_adapter_stats st{};
  EXPECT_EQ(wc_xnn_adapter_get_stats(a, &st), WC_ERR_INVALID_ARGUMENT);  // struct_size not set
  wc_xnn_adapter_stats_init(&st);
  EXPECT_EQ(wc_xnn_adapter_get_stats(a, &st), WC_OK);
  EXPECT_EQ(st.named_buffers, 1u);
  EXPECT_EQ(wc_xnn_adapter_get_stats(nullptr, &st), WC_ERR_INVALID_ARGUMENT);
  wc_xnn_adapter_destroy(a);
  wc_xnn_adapter_destroy(nullptr);
}

}  // namespace
