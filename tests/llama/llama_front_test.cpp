// The llama.cpp front (weightcache/llama.h) in this process, on a real libllama: which tensors it
// routes and how it keeps the application's overrides, two models loaded from two threads into
// one cache, and one model loaded twice; the logits always bit-identical to stock llama.cpp's.
#include <gtest/gtest.h>

#include <weightcache/llama.h>
#include <weightcache/weightcache.h>

#include <llama.h>

#include "llama_logits.hpp"
#include "temp_dir.hpp"
#include "tool_run.hpp"
#include "../../src/integrations/common/source_identity.hpp"
#include "../../src/integrations/ggml/ggml_detail.hpp"

#include <gguf.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using weightcache::test::TempDir;

std::string gen() { return std::string(WEIGHTCACHE_LLAMA_PREFIX) + "/bin/weightcache-gguf-gen"; }

void make_model(const TempDir& dir, const std::string& out, const std::string& type, const std::string& seed,
                const std::string& vocab = "264", const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--out", out, "--type", type, "--seed", seed, "--layers", "2",
                                "--dim", "256", "--ffn", "512", "--vocab", vocab};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = weightcache::test::run_tool(dir, gen(), args);
  ASSERT_EQ(r.code, 0) << r.describe();
}

using weightcache::test::logits_of;
using weightcache::test::quiet_params;

std::vector<float> stock_logits(const std::string& path) {
  llama_model* m = llama_model_load_from_file(path.c_str(), quiet_params());
  std::vector<float> l = logits_of(m);
  if (m != nullptr) llama_model_free(m);
  return l;
}

class LlamaFront : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    llama_log_set([](ggml_log_level level, const char* text, void*) {
      if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
    }, nullptr);
    llama_backend_init();
  }
  void SetUp() override {
    wc_options o;
    wc_options_init(&o);
    path_ = dir_.file("c.wcache");
    o.path = path_.c_str();
    o.durability = WC_DURABILITY_NONE;
    ASSERT_EQ(wc_open(&o, &cache_), WC_OK) << wc_last_error();
    ASSERT_EQ(wc_llama_create(cache_, nullptr, &wl_), WC_OK) << wc_ggml_last_error();
  }
  void TearDown() override {
    wc_llama_destroy(wl_);
    if (cache_ != nullptr) wc_close(cache_);
  }
  wc_ggml_stats stats() const {
    wc_ggml_stats s;
    wc_ggml_stats_init(&s);
    EXPECT_EQ(wc_ggml_get_stats(wc_llama_ggml(wl_), &s), WC_OK);
    return s;
  }
  // Loads `path` through the front; the model, or nullptr.
  llama_model* load(const std::string& path, std::size_t* routed = nullptr) {
    llama_model_params mp = quiet_params();
    std::size_t n = 0;
    if (wc_llama_model_params(wl_, path.c_str(), &mp, &n) != WC_OK) return nullptr;
    if (routed != nullptr) *routed = n;
    return llama_model_load_from_file(path.c_str(), mp);
  }
  TempDir dir_{"wc-llama-front"};
  std::string path_;
  wc_cache* cache_ = nullptr;
  wc_llama* wl_ = nullptr;
};

TEST_F(LlamaFront, RoutesExactlyTheMatrixWeightsCpuRepackTakes) {
  // vocab 259: output.weight has 259 rows, which no repacked layout takes; token_embd is read by row.
  const std::string model = dir_.file("m.gguf");
  make_model(dir_, model, "q4_0", "1", "259");
  std::size_t routed = 0;
  llama_model* m = load(model, &routed);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(routed, 14u) << "2 layers of 7 matrices; not token_embd, not a 259-row output";
  EXPECT_EQ(stats().tensors, 14u);
  EXPECT_EQ(logits_of(m), stock_logits(model));
  llama_model_free(m);
}

// Quantizers mix types: a tensor of a kind routed in other layers, but of a type CPU_REPACK does not
// take here, stays with llama.cpp (the pattern must not catch it by its name's ending).
TEST_F(LlamaFront, AModelOfMixedTypesRoutesOnlyTheRepackableTensors) {
  const std::string model = dir_.file("m.gguf");
  make_model(dir_, model, "q4_0", "5", "264",
             {"--tensor-type", "blk.1.ffn_down.weight=q8_0", "--tensor-type", "blk.0.attn_q.weight=q8_0"});
  std::size_t routed = 0;
  llama_model* m = load(model, &routed);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(routed, 13u) << "15 repackable matrices but two of q8_0";
  EXPECT_EQ(stats().tensors, 13u);
  EXPECT_EQ(logits_of(m), stock_logits(model));
  llama_model_free(m);
}

// CPU_REPACK computes a repacked weight only in a matrix product of a 2-D weight or the experts'
// product of a 3-D one. A model with one expert stores its experts' weights 2-D: llama.cpp keeps
// them in plain memory, and routing them would leave their product without a kernel (ggml's
// scheduler aborts the host). With four experts they are 3-D and repacked.
TEST_F(LlamaFront, ExpertWeightsAreRoutedOnlyWhereCpuRepackComputesThem) {
  for (const char* experts : {"1", "4"}) {
    SCOPED_TRACE(std::string(experts) + " experts");
    const std::string model = dir_.file(std::string("moe") + experts + ".gguf");
    make_model(dir_, model, "q4_0", "3", "264", {"--experts", experts});
    const std::size_t before = stats().tensors;
    std::size_t routed = 0;
    llama_model* m = load(model, &routed);
    ASSERT_NE(m, nullptr);
    // 2 layers of 4 attention matrices, the output, and with 4 experts 3 expert tensors per layer.
    EXPECT_EQ(routed, std::string(experts) == "1" ? 9u : 15u);
    EXPECT_EQ(stats().tensors - before, routed);
    EXPECT_EQ(logits_of(m), stock_logits(model));
    llama_model_free(m);
  }
}

// A model split over files: every file's tensors are routed, and only the repackable ones (a later
// file holds a tensor of a type CPU_REPACK does not take).
TEST_F(LlamaFront, ASplitModelRoutesTheRepackableTensorsOfEveryFile) {
  const std::string prefix = dir_.file("split");
  make_model(dir_, prefix, "q4_0", "4", "264", {"--splits", "3", "--tensor-type", "blk.1.ffn_up.weight=q8_0"});
  const std::string first = prefix + "-00001-of-00003.gguf";
  std::size_t routed = 0;
  llama_model* m = load(first, &routed);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(routed, 14u) << "15 repackable matrices but one of q8_0";
  EXPECT_EQ(stats().tensors, 14u);
  EXPECT_EQ(logits_of(m), stock_logits(first));
  llama_model_free(m);
}

// Params used again: the entries an earlier call added are not kept as if they were the
// application's (they would route the next model's tensors by the first model's names).
TEST_F(LlamaFront, ParamsUsedAgainForAnotherModelCarryNothingOver) {
  const std::string a = dir_.file("a.gguf"), q8 = dir_.file("q8.gguf");
  make_model(dir_, a, "q4_0", "1");
  make_model(dir_, q8, "q8_0", "2");
  llama_model_params mp = quiet_params();
  std::size_t routed = 0;
  ASSERT_EQ(wc_llama_model_params(wl_, a.c_str(), &mp, &routed), WC_OK);
  ASSERT_EQ(routed, 15u);
  ASSERT_EQ(wc_llama_model_params(wl_, a.c_str(), &mp, &routed), WC_OK);
  std::size_t n = 0;
  while (mp.tensor_buft_overrides[n].pattern != nullptr) ++n;
  EXPECT_EQ(n, 1u) << "the same model twice: one pattern, not two";
  ASSERT_EQ(wc_llama_model_params(wl_, q8.c_str(), &mp, &routed), WC_OK);
  EXPECT_EQ(routed, 0u);
  EXPECT_EQ(mp.tensor_buft_overrides, nullptr) << "the first model's patterns were kept for a model that routes nothing";
  llama_model* m = llama_model_load_from_file(q8.c_str(), mp);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(logits_of(m), stock_logits(q8));
  llama_model_free(m);
}

// A call that fails (here: the GGUF is gone) leaves params with the application's entries only:
// stock llama.cpp repacking, not an earlier call's routing.
TEST_F(LlamaFront, AFailingCallDropsAnEarlierCallsEntries) {
  const std::string a = dir_.file("a.gguf");
  make_model(dir_, a, "q4_0", "1");
  const llama_model_tensor_buft_override mine[] = {{"_norm\\.weight$", ggml_backend_cpu_buffer_type()},
                                                   {nullptr, nullptr}};
  llama_model_params mp = quiet_params();
  mp.tensor_buft_overrides = mine;
  ASSERT_EQ(wc_llama_model_params(wl_, a.c_str(), &mp, nullptr), WC_OK);
  ASSERT_NE(mp.tensor_buft_overrides[1].pattern, nullptr);
  EXPECT_EQ(wc_llama_model_params(wl_, dir_.file("gone.gguf").c_str(), &mp, nullptr), WC_ERR_IO);
  ASSERT_NE(mp.tensor_buft_overrides, nullptr);
  EXPECT_EQ(mp.tensor_buft_overrides[0].pattern, mine[0].pattern);
  EXPECT_EQ(mp.tensor_buft_overrides[1].pattern, nullptr) << "the earlier call's pattern survived a failing call";
}

// Two fronts (two caches): params filled by one and then by the other carry only the second's
// entries, and stay valid after the first front is destroyed.
TEST_F(LlamaFront, AnotherFrontsEntriesAreReplacedAndOutliveIt) {
  const std::string a = dir_.file("a.gguf");
  make_model(dir_, a, "q4_0", "1");
  wc_options o;
  wc_options_init(&o);
  const std::string other_path = dir_.file("other.wcache");
  o.path = other_path.c_str();
  o.durability = WC_DURABILITY_NONE;
  wc_cache* other_cache = nullptr;
  ASSERT_EQ(wc_open(&o, &other_cache), WC_OK) << wc_last_error();
  wc_llama* other = nullptr;
  ASSERT_EQ(wc_llama_create(other_cache, nullptr, &other), WC_OK) << wc_ggml_last_error();
  llama_model_params mp = quiet_params();
  ASSERT_EQ(wc_llama_model_params(other, a.c_str(), &mp, nullptr), WC_OK);
  ASSERT_EQ(wc_llama_model_params(wl_, a.c_str(), &mp, nullptr), WC_OK);
  ASSERT_NE(mp.tensor_buft_overrides, nullptr);
  EXPECT_EQ(mp.tensor_buft_overrides[0].buft, wc_ggml_buffer_type(wc_llama_ggml(wl_)));
  EXPECT_EQ(mp.tensor_buft_overrides[1].pattern, nullptr) << "the other front's entry was kept as the application's";
  wc_llama_destroy(other);
  wc_close(other_cache);
  llama_model* m = llama_model_load_from_file(a.c_str(), mp);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(stats().tensors, 15u);
  EXPECT_EQ(logits_of(m), stock_logits(a));
  llama_model_free(m);
}

// The model file replaced between wc_llama_model_params and the load (which llama.h asks not to
// do): a tensor the pattern catches that llama.cpp would not repack (a one-expert model's 2-D
// experts) fails the load cleanly; it never reaches a kernel that cannot compute it (an abort).
TEST_F(LlamaFront, AModelReplacedAfterTheCallFailsItsLoadCleanly) {
  const std::string path = dir_.file("m.gguf"), one = dir_.file("one.gguf");
  make_model(dir_, path, "q4_0", "1", "264", {"--experts", "4"});
  make_model(dir_, one, "q4_0", "2", "264", {"--experts", "1"});
  llama_model_params mp = quiet_params();
  std::size_t routed = 0;
  ASSERT_EQ(wc_llama_model_params(wl_, path.c_str(), &mp, &routed), WC_OK);
  ASSERT_EQ(routed, 15u);
  ASSERT_EQ(std::rename(one.c_str(), path.c_str()), 0);
  llama_model* m = llama_model_load_from_file(path.c_str(), mp);
  if (m != nullptr) {
    EXPECT_EQ(logits_of(m), stock_logits(path));
    llama_model_free(m);
  }
}

TEST_F(LlamaFront, AModelCpuRepackRefusesIsLeftAlone) {
  const std::string model = dir_.file("m.gguf");
  make_model(dir_, model, "q8_0", "1");  // this ggml repacks no Q8_0
  llama_model_params mp = quiet_params();
  const auto* before = mp.tensor_buft_overrides;
  std::size_t routed = 99;
  ASSERT_EQ(wc_llama_model_params(wl_, model.c_str(), &mp, &routed), WC_OK) << wc_ggml_last_error();
  EXPECT_EQ(routed, 0u);
  EXPECT_EQ(mp.tensor_buft_overrides, before) << "params changed for a model with nothing to route";
}

TEST_F(LlamaFront, KeepsTheApplicationsOverridesFirst) {
  const std::string model = dir_.file("m.gguf");
  make_model(dir_, model, "q4_0", "1");
  // The application keeps output.weight for llama.cpp's own choice (the CPU buffer type makes it
  // pick CPU_REPACK itself) and puts the norms in plain CPU memory.
  const llama_model_tensor_buft_override mine[] = {{"^output\\.weight$", ggml_backend_cpu_buffer_type()},
                                                   {"_norm\\.weight$", ggml_backend_cpu_buffer_type()},
                                                   {nullptr, nullptr}};
  llama_model_params mp = quiet_params();
  mp.tensor_buft_overrides = mine;
  std::size_t routed = 0;
  ASSERT_EQ(wc_llama_model_params(wl_, model.c_str(), &mp, &routed), WC_OK) << wc_ggml_last_error();
  // output.weight is the application's (its entry comes first): not counted as routed.
  ASSERT_EQ(routed, 14u);
  const llama_model_tensor_buft_override* list = mp.tensor_buft_overrides;
  ASSERT_NE(list, mine);
  EXPECT_EQ(list[0].pattern, mine[0].pattern);
  EXPECT_EQ(list[0].buft, mine[0].buft);
  EXPECT_EQ(list[1].pattern, mine[1].pattern);
  std::size_t n = 2;
  while (list[n].pattern != nullptr) {
    EXPECT_EQ(list[n].buft, wc_ggml_buffer_type(wc_llama_ggml(wl_)));
    ++n;
  }
  EXPECT_GT(n, 2u);
  llama_model* m = llama_model_load_from_file(model.c_str(), mp);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(stats().tensors, routed) << "output.weight is the application's: it went to llama.cpp's own choice";
  EXPECT_EQ(logits_of(m), stock_logits(model));
  llama_model_free(m);
  // The application's own list is untouched.
  EXPECT_STREQ(mine[0].pattern, "^output\\.weight$");
  EXPECT_EQ(mine[2].pattern, nullptr);
}

TEST_F(LlamaFront, RoutesNothingWhenTheApplicationTurnedRepackingOff) {
  const std::string model = dir_.file("m.gguf");
  make_model(dir_, model, "q4_0", "1");
  llama_model_params mp = quiet_params();
  mp.use_extra_bufts = false;
  std::size_t routed = 9;
  ASSERT_EQ(wc_llama_model_params(wl_, model.c_str(), &mp, &routed), WC_OK);
  EXPECT_EQ(routed, 0u);
  EXPECT_EQ(mp.tensor_buft_overrides, nullptr);
}

TEST_F(LlamaFront, ABadArgumentOrGgufLeavesTheParamsAlone) {
  llama_model_params mp = quiet_params();
  EXPECT_EQ(wc_llama_model_params(nullptr, "x", &mp, nullptr), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_llama_model_params(wl_, nullptr, &mp, nullptr), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_llama_model_params(wl_, "x", nullptr, nullptr), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_llama_model_params(wl_, dir_.file("missing.gguf").c_str(), &mp, nullptr), WC_ERR_IO);
  EXPECT_NE(std::strstr(wc_ggml_last_error(), "missing.gguf"), nullptr) << wc_ggml_last_error();
  std::FILE* f = std::fopen(dir_.file("junk.gguf").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("GGUF but not really", f);
  std::fclose(f);
  EXPECT_EQ(wc_llama_model_params(wl_, dir_.file("junk.gguf").c_str(), &mp, nullptr), WC_ERR_IO);
  EXPECT_EQ(mp.tensor_buft_overrides, nullptr);
  wc_llama* none = reinterpret_cast<wc_llama*>(1);
  EXPECT_EQ(wc_llama_create(nullptr, nullptr, &none), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
}

TEST_F(LlamaFront, TwoModelsFromTwoThreadsIntoOneCache) {
  const std::string a = dir_.file("a.gguf"), b = dir_.file("b.gguf");
  make_model(dir_, a, "q4_0", "1");
  make_model(dir_, b, "q4_k", "2");
  const std::vector<float> want_a = stock_logits(a), want_b = stock_logits(b);
  ASSERT_FALSE(want_a.empty());
  for (int round = 0; round < 2; ++round) {  // cold, then warm
    std::vector<float> got_a, got_b;
    llama_model *ma = nullptr, *mb = nullptr;
    std::thread ta([&] { ma = load(a); });
    std::thread tb([&] { mb = load(b); });
    ta.join();
    tb.join();
    ASSERT_NE(ma, nullptr);
    ASSERT_NE(mb, nullptr);
    EXPECT_EQ(logits_of(ma), want_a) << "round " << round;
    EXPECT_EQ(logits_of(mb), want_b) << "round " << round;
    llama_model_free(ma);
    llama_model_free(mb);
  }
  const wc_ggml_stats s = stats();
  EXPECT_EQ(s.repacked, 30u) << "each model's 15 tensors once";
  EXPECT_EQ(s.served_from_cache, 30u);
  EXPECT_EQ(s.heap_fallbacks, 0u);
}

TEST_F(LlamaFront, OneModelLoadedTwiceInOneProcess) {
  const std::string model = dir_.file("m.gguf");
  make_model(dir_, model, "iq4_nl", "3");
  const std::vector<float> want = stock_logits(model);
  llama_model* first = load(model);
  llama_model* second = load(model);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(logits_of(first), want);
  EXPECT_EQ(logits_of(second), want);
  llama_model_free(first);
  EXPECT_EQ(logits_of(second), want) << "freeing one model changed the other's weights";
  llama_model_free(second);
  EXPECT_EQ(stats().repacked, 15u) << "the second load packed again";
}

// ---- layouts: AMX's and CPU_REPACK's keys never meet ---------------------------------------------

// Each routed tensor of `model`: its name, the layout this CPU's ggml gives it ("AMX" or
// "CPU_REPACK"), and its content key (what the buffer type hashes).
struct Keyed {
  std::string name, layout, content;
};
std::vector<Keyed> keyed_tensors(const std::string& model) {
  std::vector<Keyed> out;
  ggml_context* meta = nullptr;
  gguf_init_params gp{};
  gp.no_alloc = true;
  gp.ctx = &meta;
  gguf_context* g = gguf_init_from_file(model.c_str(), gp);
  if (g == nullptr) return out;
  std::ifstream f(model, std::ios::binary);
  for (std::int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
    const char* name = gguf_get_tensor_name(g, i);
    ggml_tensor* t = ggml_get_tensor(meta, name);
    if (wc_ggml_would_repack(t) == 0 || std::string(name) == "token_embd.weight") continue;
    std::vector<char> bytes(ggml_nbytes(t));
    f.seekg(static_cast<std::streamoff>(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i)));
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    weightcache::source::WeightSource w;
    w.data = bytes.data();
    w.bytes = bytes.size();
    w.element_type = static_cast<int>(t->type);
    for (int d = 0; d < GGML_MAX_DIMS; ++d) w.dims.push_back(t->ne[d]);
    out.push_back({name, ggml_backend_buft_name(wc_ggml_stock_buffer_type(t)), weightcache::source::content_identity(w)});
  }
  gguf_free(g);
  ggml_free(meta);
  return out;
}

std::string other_layout(const std::string& layout) { return layout == "AMX" ? "CPU_REPACK" : "AMX"; }

TEST_F(LlamaFront, EachLayoutsKeysNameItsLayoutAndItsCode) {
  const std::string amx = weightcache::ggml_detail::key_prefix_of("AMX");
  const std::string repack = weightcache::ggml_detail::key_prefix_of("CPU_REPACK");
  EXPECT_NE(amx, repack);
  EXPECT_NE(amx.find(" amx "), std::string::npos) << amx;
  EXPECT_NE(repack.find(" repack "), std::string::npos) << repack;
  EXPECT_EQ(weightcache::ggml_detail::key_prefix_of("KleidiAI"), "") << "a layout the cache does not serve has no keys";
  // Neither is a prefix of the other: no look-up under one can land on an entry of the other.
  EXPECT_NE(amx.compare(0, repack.size(), repack), 0);
  EXPECT_NE(repack.compare(0, amx.size(), amx), 0);
}

// A cache written under the other layout (AMX's entries for a CPU_REPACK process, CPU_REPACK's for
// an AMX one: here garbage under exactly the keys that process would have written) is never
// served; the outputs stay stock and the tensors are repacked into this layout's own entries.
TEST_F(LlamaFront, ACacheWrittenUnderAnotherLayoutIsNeverServed) {
  const std::string model = dir_.file("m.gguf");
  make_model(dir_, model, "q4_0", "21");
  const std::vector<Keyed> keyed = keyed_tensors(model);
  ASSERT_FALSE(keyed.empty());
  // The other layout's entries, in a cache of their own.
  wc_llama_destroy(wl_);
  wl_ = nullptr;
  wc_close(cache_);
  cache_ = nullptr;
  ::unlink(path_.c_str());
  {
    wc_options o;
    wc_options_init(&o);
    o.path = path_.c_str();
    wc_cache* c = nullptr;
    ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
    for (const Keyed& k : keyed) {
      const std::string key = weightcache::ggml_detail::key_prefix_of(other_layout(k.layout).c_str()) + k.content;
      std::vector<unsigned char> junk(4096 * 9, 0xA5);
      ASSERT_EQ(wc_look_up(c, key.data(), key.size()), SIZE_MAX) << "a fresh cache has no entries";
      void* p = wc_reserve_space(c, junk.size());
      ASSERT_NE(p, nullptr);
      std::memcpy(p, junk.data(), junk.size());
      ASSERT_NE(wc_look_up_or_insert(c, key.data(), key.size(), p, junk.size()), SIZE_MAX) << wc_last_error();
    }
    ASSERT_EQ(wc_finalize(c), WC_OK) << wc_last_error();
    wc_close(c);
  }
  wc_options o;
  wc_options_init(&o);
  o.path = path_.c_str();
  ASSERT_EQ(wc_open(&o, &cache_), WC_OK) << wc_last_error();
  ASSERT_EQ(wc_llama_create(cache_, nullptr, &wl_), WC_OK) << wc_ggml_last_error();
  std::size_t routed = 0;
  llama_model* m = load(model, &routed);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(routed, keyed.size());
  EXPECT_EQ(stats().served_from_cache, 0u) << "an entry of the other layout was served";
  EXPECT_EQ(stats().repacked, routed);
  EXPECT_EQ(logits_of(m), stock_logits(model));
  llama_model_free(m);
  ASSERT_EQ(wc_ggml_finish(wc_llama_ggml(wl_)), WC_OK);
  // Both layouts' entries side by side now, each under its own keys.
  for (const Keyed& k : keyed) {
    const std::string mine = weightcache::ggml_detail::key_prefix_of(k.layout.c_str()) + k.content;
    const std::string theirs = weightcache::ggml_detail::key_prefix_of(other_layout(k.layout).c_str()) + k.content;
    EXPECT_NE(wc_look_up(cache_, mine.data(), mine.size()), SIZE_MAX) << k.name;
    EXPECT_NE(wc_look_up(cache_, theirs.data(), theirs.size()), SIZE_MAX) << k.name;
  }
}

// The reverse, read by key: a cache this CPU's layout wrote holds nothing under the other layout's
// keys, so a process that would use the other one finds none of it.
TEST_F(LlamaFront, ACacheWrittenUnderThisLayoutHoldsNothingUnderAnothers) {
  const std::string model = dir_.file("m.gguf");
  make_model(dir_, model, "q4_k", "22");
  const std::vector<Keyed> keyed = keyed_tensors(model);
  ASSERT_FALSE(keyed.empty());
  llama_model* m = load(model);
  ASSERT_NE(m, nullptr);
  llama_model_free(m);
  ASSERT_EQ(wc_ggml_finish(wc_llama_ggml(wl_)), WC_OK);
  for (const Keyed& k : keyed) {
    const std::string mine = weightcache::ggml_detail::key_prefix_of(k.layout.c_str()) + k.content;
    const std::string theirs = weightcache::ggml_detail::key_prefix_of(other_layout(k.layout).c_str()) + k.content;
    EXPECT_NE(wc_look_up(cache_, mine.data(), mine.size()), SIZE_MAX) << k.name << " was not cached under " << k.layout;
    EXPECT_EQ(wc_look_up(cache_, theirs.data(), theirs.size()), SIZE_MAX) << k.name << " is under " << other_layout(k.layout);
  }
}

// ---- the AMX path, where this CPU has it ----------------------------------------------------------

bool cpu_has_amx() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) return line.find(" amx_int8") != std::string::npos;
  return false;
}

// Where ggml offers AMX (a CPU with it, a ggml built for it), weights with rows a multiple of 2048
// are AMX's and go to the cache's AMX buffer type, the others CPU_REPACK's; the logits stay stock's.
// Where it does not, AMX is never offered and no weight is AMX's.
TEST_F(LlamaFront, AmxWeightsGoToTheCachesAmxLayoutWhereThisCpuHasIt) {
  const std::string layouts = wc_ggml_layouts();
  if (layouts.find("AMX") == std::string::npos) {
    if (cpu_has_amx())
      std::printf("note: this CPU has AMX, but this ggml was built without it (GGML_NATIVE on another CPU?)\n");
    else
      EXPECT_EQ(layouts, "CPU_REPACK");
    GTEST_SKIP() << "skipped: this CPU has no AMX (" << (cpu_has_amx() ? "ggml built without it" : "no amx_int8")
                 << "); its layouts: " << layouts;
  }
  for (const char* type : {"q4_0", "q4_k", "q8_0"}) {
    const std::string model = dir_.file(std::string("amx-") + type + ".gguf");
    const auto r = weightcache::test::run_tool(
        dir_, gen(),
        {"--out", model, "--type", type, "--seed", "9", "--layers", "1", "--dim", "2048", "--ffn", "2560", "--vocab", "264"});
    ASSERT_EQ(r.code, 0) << r.describe();
    llama_model_params mp = quiet_params();
    wc_llama_routing routing;
    wc_llama_routing_init(&routing);
    ASSERT_EQ(wc_llama_model_params_ex(wl_, model.c_str(), &mp, &routing), WC_OK);
    EXPECT_NE(std::string(routing.stock_buffer_types).find("AMX="), std::string::npos) << routing.stock_buffer_types;
    EXPECT_EQ(routing.routed, routing.stock_repacked) << routing.stock_buffer_types;
    const wc_ggml_stats before = stats();
    llama_model* m = llama_model_load_from_file(model.c_str(), mp);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(logits_of(m), stock_logits(model)) << type << ": cold";
    llama_model_free(m);
    EXPECT_EQ(stats().repacked - before.repacked, routing.routed) << type;
    m = llama_model_load_from_file(model.c_str(), mp);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(logits_of(m), stock_logits(model)) << type << ": warm";
    llama_model_free(m);
    EXPECT_EQ(stats().served_from_cache - before.served_from_cache, routing.routed) << type;
  }
}

}  // namespace
