// Which buffer type llama.cpp would take for each weight, and so what the front routes, with
// devices and buffer types registered through ggml's public registry (ggml_backend_register): an
// accelerator that takes some weights (or all), a GPU with a host buffer type, offloaded layers.
// The same on every CPU: the expectations are built from ggml's own answer for each tensor
// (wc_ggml_stock_buffer_type), whichever layout this CPU's ggml picks (AMX, CPU_REPACK).
//
// A binary of its own: registered backends stay registered for the life of the process.
#include <gtest/gtest.h>

#include <weightcache/llama.h>
#include <weightcache/weightcache.h>

#include <ggml-backend-impl.h>
#include <gguf.h>
#include <llama.h>

#include "temp_dir.hpp"
#include "tool_run.hpp"

#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

namespace {

using weightcache::test::TempDir;

// ---- a fake accelerator and a fake GPU, registered once ------------------------------------------

// What the accelerator takes: nothing, the matrix products whose rows (ne[0]) are a multiple of 512,
// or every matrix product.
enum class Takes { nothing, rows_of_512, all };
Takes g_accel_takes = Takes::nothing;
bool g_gpu = false;       // the second device is a GPU (else an accelerator without a buffer type of its own)
bool g_gpu_host = false;  // the GPU has a host buffer type

ggml_backend_reg g_reg;
ggml_backend_device g_accel, g_gpu_dev;
ggml_backend_buffer_type g_accel_buft, g_host_buft;

const char* accel_buft_name(ggml_backend_buffer_type_t) { return "FAKE_ACCEL"; }
const char* host_buft_name(ggml_backend_buffer_type_t) { return "FAKE_GPU_HOST"; }
ggml_backend_buffer_t no_alloc(ggml_backend_buffer_type_t, size_t) { return nullptr; }
size_t align64(ggml_backend_buffer_type_t) { return 64; }
bool yes(ggml_backend_buffer_type_t) { return true; }

const char* accel_name(ggml_backend_dev_t) { return "FAKE_ACCEL"; }
const char* gpu_name(ggml_backend_dev_t) { return "FAKE_GPU"; }
void memory(ggml_backend_dev_t, size_t* free, size_t* total) { *free = *total = size_t{1} << 30; }
enum ggml_backend_dev_type accel_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_ACCEL; }
enum ggml_backend_dev_type gpu_type(ggml_backend_dev_t) {
  return g_gpu ? GGML_BACKEND_DEVICE_TYPE_GPU : GGML_BACKEND_DEVICE_TYPE_ACCEL;
}
void props(ggml_backend_dev_t dev, struct ggml_backend_dev_props* p) {
  *p = ggml_backend_dev_props{};
  p->name = dev->iface.get_name(dev);
  p->description = p->name;
  p->type = dev->iface.get_type(dev);
}
ggml_backend_buffer_type_t accel_buft(ggml_backend_dev_t) { return &g_accel_buft; }
// An accelerator whose buffer type is the CPU's is not tried by llama.cpp: the GPU device, when it
// is not a GPU, is such a one.
ggml_backend_buffer_type_t gpu_buft(ggml_backend_dev_t) { return ggml_backend_cpu_buffer_type(); }
ggml_backend_buffer_type_t gpu_host_buft(ggml_backend_dev_t) { return g_gpu && g_gpu_host ? &g_host_buft : nullptr; }
bool accel_supports(ggml_backend_dev_t, const struct ggml_tensor* op) {
  const ggml_tensor* w = op->src[0];
  if (op->op != GGML_OP_MUL_MAT || w == nullptr || w->buffer == nullptr || w->buffer->buft != &g_accel_buft) return false;
  switch (g_accel_takes) {
    case Takes::nothing: return false;
    case Takes::rows_of_512: return w->ne[0] % 512 == 0;
    case Takes::all: return true;
  }
  return false;
}
bool gpu_supports(ggml_backend_dev_t, const struct ggml_tensor*) { return false; }
bool supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t) { return false; }

const char* reg_name(ggml_backend_reg_t) { return "FAKE"; }
size_t reg_count(ggml_backend_reg_t) { return 2; }
ggml_backend_dev_t reg_device(ggml_backend_reg_t, size_t i) { return i == 0 ? &g_accel : &g_gpu_dev; }
void* reg_proc(ggml_backend_reg_t, const char*) { return nullptr; }

void register_fakes() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_reg.api_version = GGML_BACKEND_API_VERSION;
    g_reg.iface.get_name = reg_name;
    g_reg.iface.get_device_count = reg_count;
    g_reg.iface.get_device = reg_device;
    g_reg.iface.get_proc_address = reg_proc;
    for (ggml_backend_device* d : {&g_accel, &g_gpu_dev}) {
      d->iface.get_description = d == &g_accel ? accel_name : gpu_name;
      d->iface.get_name = d == &g_accel ? accel_name : gpu_name;
      d->iface.get_memory = memory;
      d->iface.get_type = d == &g_accel ? accel_type : gpu_type;
      d->iface.get_props = props;
      d->iface.get_buffer_type = d == &g_accel ? accel_buft : gpu_buft;
      d->iface.get_host_buffer_type = d == &g_accel ? nullptr : gpu_host_buft;
      d->iface.supports_op = d == &g_accel ? accel_supports : gpu_supports;
      d->iface.supports_buft = supports_buft;
      d->reg = &g_reg;
    }
    g_accel_buft.iface.get_name = accel_buft_name;
    g_accel_buft.iface.alloc_buffer = no_alloc;
    g_accel_buft.iface.get_alignment = align64;
    g_accel_buft.device = &g_accel;
    g_host_buft.iface.get_name = host_buft_name;
    g_host_buft.iface.alloc_buffer = no_alloc;
    g_host_buft.iface.get_alignment = align64;
    g_host_buft.iface.is_host = yes;
    g_host_buft.device = &g_gpu_dev;
    ggml_backend_register(&g_reg);
  });
}

// ---- the log, captured --------------------------------------------------------------------------

std::mutex g_log_mu;
std::vector<std::pair<ggml_log_level, std::string>> g_log;

std::vector<std::string> logged_at(ggml_log_level level, const std::string& containing) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::vector<std::string> v;
  for (const auto& [l, text] : g_log)
    if (l == level && text.find(containing) != std::string::npos) v.push_back(text);
  return v;
}

// ---- the model ------------------------------------------------------------------------------------

struct Tensor {
  std::string name;
  ggml_tensor* t = nullptr;
};

class LlamaRoute : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    llama_log_set([](ggml_log_level level, const char* text, void*) {
      std::lock_guard<std::mutex> lock(g_log_mu);
      g_log.emplace_back(level, text);
    }, nullptr);
    llama_backend_init();
    register_fakes();
  }
  void SetUp() override {
    g_accel_takes = Takes::nothing;
    g_gpu = g_gpu_host = false;
    {
      std::lock_guard<std::mutex> lock(g_log_mu);
      g_log.clear();
    }
    // 2 layers of 256 with an MLP of 512: ffn_down's rows are 512 long, every other matrix's 256.
    // vocab 259: output.weight has 259 rows, which no repacked layout takes.
    model_ = dir_.file("m.gguf");
    const auto r = weightcache::test::run_tool(
        dir_, std::string(WEIGHTCACHE_LLAMA_PREFIX) + "/bin/weightcache-gguf-gen",
        {"--out", model_, "--type", "q4_0", "--seed", "3", "--layers", "2", "--dim", "256", "--ffn", "512", "--vocab", "259"});
    ASSERT_EQ(r.code, 0) << r.describe();
    ggml_context* meta = nullptr;
    gguf_init_params gp{};
    gp.no_alloc = true;
    gp.ctx = &meta;
    gguf_ = gguf_init_from_file(model_.c_str(), gp);
    ASSERT_NE(gguf_, nullptr);
    meta_ = meta;
    for (std::int64_t i = 0; i < gguf_get_n_tensors(gguf_); ++i) {
      const char* name = gguf_get_tensor_name(gguf_, i);
      tensors_.push_back({name, ggml_get_tensor(meta_, name)});
    }
    wc_options o;
    wc_options_init(&o);
    o.path = ":memory:";
    ASSERT_EQ(wc_open(&o, &cache_), WC_OK) << wc_last_error();
    ASSERT_EQ(wc_llama_create(cache_, nullptr, &wl_), WC_OK) << wc_ggml_last_error();
  }
  void TearDown() override {
    wc_llama_destroy(wl_);
    if (cache_ != nullptr) wc_close(cache_);
    if (gguf_ != nullptr) gguf_free(gguf_);
    if (meta_ != nullptr) ggml_free(meta_);
  }

  // The matrix weights of the model (every *.weight of two dimensions but token_embd and the norms).
  std::vector<Tensor> matrices() const {
    std::vector<Tensor> v;
    for (const Tensor& t : tensors_)
      if (ggml_n_dims(t.t) == 2 && t.name != "token_embd.weight" && t.name.find("norm") == std::string::npos)
        v.push_back(t);
    return v;
  }

  // The names each entry the front added to params routes (by llama.cpp's rule: the first pattern
  // that matches a name wins), per buffer type name.
  std::map<std::string, std::vector<std::string>> routed_by(const llama_model_params& mp) const {
    std::map<std::string, std::vector<std::string>> out;
    for (const Tensor& t : tensors_) {
      for (const llama_model_tensor_buft_override* o = mp.tensor_buft_overrides; o != nullptr && o->pattern != nullptr;
           ++o) {
        if (std::regex_search(t.name, std::regex(o->pattern))) {
          out[ggml_backend_buft_name(o->buft)].push_back(t.name);
          break;
        }
      }
    }
    return out;
  }

  TempDir dir_{"wc-llama-route"};
  std::string model_;
  gguf_context* gguf_ = nullptr;
  ggml_context* meta_ = nullptr;
  std::vector<Tensor> tensors_;
  wc_cache* cache_ = nullptr;
  wc_llama* wl_ = nullptr;
};

llama_model_params params() {
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  return mp;
}

// The weightcache buffer type's name for a layout ggml names `stock`.
std::string ours(const std::string& stock) { return stock == "CPU_REPACK" ? "WEIGHTCACHE_REPACK" : "WEIGHTCACHE_" + stock; }

TEST_F(LlamaRoute, WithNothingAheadEachWeightGoesWhereThisCpusGgmlPutsIt) {
  llama_model_params mp = params();
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  ASSERT_EQ(wc_llama_model_params_ex(wl_, model_.c_str(), &mp, &r), WC_OK) << wc_ggml_last_error();
  // Expected: per matrix, ggml's own choice on this CPU (CPU_REPACK here, AMX for 2048-long rows).
  std::map<std::string, std::vector<std::string>> expect;
  std::size_t n = 0;
  for (const Tensor& t : matrices())
    if (ggml_backend_buffer_type_t b = wc_ggml_stock_buffer_type(t.t); b != nullptr) {
      expect[ours(ggml_backend_buft_name(b))].push_back(t.name);
      ++n;
    }
  ASSERT_GT(n, 0u) << "this CPU's ggml repacks no Q4_0 matrix of 256";
  EXPECT_EQ(r.routed, n);
  EXPECT_EQ(r.stock_repacked, n);
  EXPECT_STREQ(r.why_none, "");
  EXPECT_EQ(routed_by(mp), expect);
  EXPECT_TRUE(logged_at(GGML_LOG_LEVEL_WARN, "weightcache").empty()) << "a warning although everything was routed";
}

TEST_F(LlamaRoute, AnAcceleratorThatTakesSomeWeightsLeavesTheRestToTheCache) {
  g_accel_takes = Takes::rows_of_512;
  llama_model_params mp = params();
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  ASSERT_EQ(wc_llama_model_params_ex(wl_, model_.c_str(), &mp, &r), WC_OK) << wc_ggml_last_error();
  std::map<std::string, std::vector<std::string>> expect;
  std::size_t accel = 0, cached = 0;
  for (const Tensor& t : matrices()) {
    if (t.t->ne[0] % 512 == 0) {
      ++accel;  // the accelerator's, tried first
    } else if (ggml_backend_buffer_type_t b = wc_ggml_stock_buffer_type(t.t); b != nullptr) {
      expect[ours(ggml_backend_buft_name(b))].push_back(t.name);
      ++cached;
    }
  }
  ASSERT_EQ(accel, 2u) << "the two ffn_down";
  EXPECT_EQ(r.routed, cached);
  EXPECT_EQ(r.stock_repacked, cached + accel);
  EXPECT_EQ(routed_by(mp), expect) << "the accelerator's weights must not be routed, the others must";
  EXPECT_EQ(std::string(r.stock_buffer_types).rfind("FAKE_ACCEL=2,", 0), 0u)
      << "the accelerator comes first in llama.cpp's order: " << r.stock_buffer_types;
  // Said at warn level, naming the buffer type the cache does not serve.
  EXPECT_EQ(logged_at(GGML_LOG_LEVEL_WARN, "FAKE_ACCEL").size(), 1u);
  // Stock llama.cpp's view is the same.
  wc_llama_routing s;
  wc_llama_routing_init(&s);
  ASSERT_EQ(wc_llama_stock_routing(model_.c_str(), &mp, &s), WC_OK);
  EXPECT_STREQ(s.stock_buffer_types, r.stock_buffer_types);
  EXPECT_EQ(s.routed, 0u);
}

TEST_F(LlamaRoute, AnAcceleratorThatTakesEveryWeightRoutesNothingAndSaysWhy) {
  g_accel_takes = Takes::all;
  llama_model_params mp = params();
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  ASSERT_EQ(wc_llama_model_params_ex(wl_, model_.c_str(), &mp, &r), WC_OK) << wc_ggml_last_error();
  EXPECT_EQ(r.routed, 0u);
  EXPECT_EQ(mp.tensor_buft_overrides, nullptr);
  EXPECT_NE(std::string(r.why_none).find("FAKE_ACCEL"), std::string::npos) << r.why_none;
  EXPECT_EQ(std::string(r.stock_buffer_types), "FAKE_ACCEL=" + std::to_string(matrices().size()))
      << "every matrix, the 259-row output included";
  const auto warned = logged_at(GGML_LOG_LEVEL_WARN, "FAKE_ACCEL");
  ASSERT_EQ(warned.size(), 1u) << "one warn line naming the buffer type";
  EXPECT_NE(warned.front().find("no weights of"), std::string::npos) << warned.front();
}

TEST_F(LlamaRoute, OffloadedLayersAndAGpuHostBufferTypeAreNamed) {
  g_gpu = true;
  llama_model_params mp = params();
  mp.n_gpu_layers = 99;
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  ASSERT_EQ(wc_llama_model_params_ex(wl_, model_.c_str(), &mp, &r), WC_OK);
  EXPECT_EQ(r.routed, 0u);
  EXPECT_NE(std::string(r.why_none).find("n_gpu_layers"), std::string::npos) << r.why_none;
  EXPECT_NE(std::string(r.why_none).find("FAKE_GPU"), std::string::npos) << r.why_none;
  EXPECT_EQ(logged_at(GGML_LOG_LEVEL_WARN, "n_gpu_layers").size(), 1u);

  g_gpu_host = true;
  mp = params();
  ASSERT_EQ(wc_llama_model_params_ex(wl_, model_.c_str(), &mp, &r), WC_OK);
  EXPECT_EQ(r.routed, 0u);
  EXPECT_NE(std::string(r.why_none).find("FAKE_GPU_HOST"), std::string::npos) << r.why_none;
  // no_host: llama.cpp skips the host buffer type; the CPU's repacking takes the weights again.
  mp = params();
  mp.no_host = true;
  ASSERT_EQ(wc_llama_model_params_ex(wl_, model_.c_str(), &mp, &r), WC_OK);
  EXPECT_GT(r.routed, 0u) << r.why_none;
}

TEST_F(LlamaRoute, RepackingTurnedOffIsSaidAtInfoLevelOnly) {
  llama_model_params mp = params();
  mp.use_extra_bufts = false;
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  ASSERT_EQ(wc_llama_model_params_ex(wl_, model_.c_str(), &mp, &r), WC_OK);
  EXPECT_EQ(r.routed, 0u);
  EXPECT_NE(std::string(r.why_none).find("use_extra_bufts"), std::string::npos) << r.why_none;
  EXPECT_TRUE(logged_at(GGML_LOG_LEVEL_WARN, "weightcache").empty());
  EXPECT_EQ(logged_at(GGML_LOG_LEVEL_INFO, "use_extra_bufts").size(), 1u);
}

TEST_F(LlamaRoute, AModelNothingOfWhichIsRepackedIsSaidAtWarnLevel) {
  const std::string f32 = dir_.file("f32.gguf");
  const auto g = weightcache::test::run_tool(
      dir_, std::string(WEIGHTCACHE_LLAMA_PREFIX) + "/bin/weightcache-gguf-gen",
      {"--out", f32, "--type", "f32", "--seed", "3", "--layers", "1", "--dim", "64", "--ffn", "128", "--vocab", "259"});
  ASSERT_EQ(g.code, 0) << g.describe();
  llama_model_params mp = params();
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  ASSERT_EQ(wc_llama_model_params_ex(wl_, f32.c_str(), &mp, &r), WC_OK);
  EXPECT_EQ(r.routed, 0u);
  EXPECT_STREQ(r.stock_buffer_types, "");
  EXPECT_NE(std::string(r.why_none).find("repacks none"), std::string::npos) << r.why_none;
  EXPECT_EQ(logged_at(GGML_LOG_LEVEL_WARN, "repacks none").size(), 1u);
}

TEST_F(LlamaRoute, ABadRoutingStructIsRefused) {
  llama_model_params mp = params();
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  r.struct_size = 7;
  EXPECT_EQ(wc_llama_model_params_ex(wl_, model_.c_str(), &mp, &r), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_llama_stock_routing(nullptr, &mp, nullptr), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_llama_stock_routing(model_.c_str(), nullptr, nullptr), WC_ERR_INVALID_ARGUMENT);
}

}  // namespace
