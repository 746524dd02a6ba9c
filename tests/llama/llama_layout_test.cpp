// A second repacking layout on a CPU without AMX: a fake extra buffer type named "AMX", put at the
// front of ggml-cpu's list of extra buffer types before anything reads it, with a packing of its own
// (a 256-byte header, the rows in reverse order, XOR 0x5A: larger than the GGUF's bytes, as real
// AMX's tiles are) and a kernel of its own that computes the matrix product from that packing. In a
// model of dim 256 and ffn 512 it takes exactly the two ffn_down (rows of 512), CPU_REPACK the other
// matrices. Then, end to end on a real libllama: stock llama.cpp versus a cold load through the cache
// versus a warm load in a new process, bit-identical logits; and a cache written by a process with
// the fake read by one without it and the other way round: an entry of one layout is never served
// to a process that computes the weight in the other.
//
// A binary of its own with its own main(): the fake must be in ggml-cpu's list before the first call
// that copies it (ggml_backend_cpu_device_get_extra_buffers_type keeps a static copy), and a
// process without the fake is this same binary started with `--layout-child nofake ...`.
#include <gtest/gtest.h>

#include <weightcache/llama.h>
#include <weightcache/weightcache.h>

#include <ggml-backend-impl.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml-cpu/traits.h>
#include <gguf.h>
#include <llama.h>

#include "../../src/integrations/common/source_identity.hpp"
#include "file_time.hpp"
#include "llama_logits.hpp"
#include "temp_dir.hpp"
#include "tool_run.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using weightcache::test::TempDir;

// ---- the fake "AMX" --------------------------------------------------------------------------------

constexpr std::size_t kHeader = 256;
constexpr char kMagic[8] = {'F', 'A', 'K', 'E', 'A', 'M', 'X', '1'};
constexpr std::uint8_t kXor = 0x5A;

// What the fake saw, by weight name: which tensors it packed and which products it computed.
struct Seen {
  std::mutex mu;
  std::set<std::string> packed, computed;
  std::vector<std::string> errors;  // anything the fake could not do as asked
};
Seen& seen() {
  static Seen* s = new Seen;  // compute threads may still run during static destruction
  return *s;
}
void reset_seen() {
  std::lock_guard<std::mutex> lock(seen().mu);
  seen().packed.clear();
  seen().computed.clear();
}
void fake_error(const std::string& what) {
  std::lock_guard<std::mutex> lock(seen().mu);
  seen().errors.push_back(what);
}

bool fake_type(enum ggml_type t) { return t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_K; }

// The fake's rule for a weight (AMX's is "rows a multiple of 2048"): in a model of dim 256 and ffn
// 512, only ffn_down's rows are 512 long.
bool fake_takes_weight(enum ggml_type type, const std::int64_t* ne) {
  return fake_type(type) && ne[0] % 512 == 0 && ne[2] == 1 && ne[3] == 1;
}

// The packing of a whole 2-D weight: the header (magic, type, ne0, ne1), then row r of the source
// at row ne1-1-r, every byte XOR kXor.
std::vector<std::uint8_t> fake_pack(enum ggml_type type, std::int64_t ne0, std::int64_t ne1, const void* data) {
  const std::size_t row = ggml_row_size(type, ne0);
  std::vector<std::uint8_t> out(kHeader + row * static_cast<std::size_t>(ne1), 0);
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  const std::int64_t head[3] = {static_cast<std::int64_t>(type), ne0, ne1};
  std::memcpy(out.data() + sizeof kMagic, head, sizeof head);
  const auto* src = static_cast<const std::uint8_t*>(data);
  for (std::int64_t r = 0; r < ne1; ++r) {
    std::uint8_t* to = out.data() + kHeader + static_cast<std::size_t>(ne1 - 1 - r) * row;
    const std::uint8_t* from = src + static_cast<std::size_t>(r) * row;
    for (std::size_t i = 0; i < row; ++i) to[i] = from[i] ^ kXor;
  }
  return out;
}

bool header_ok(const struct ggml_tensor* w) {
  const auto* p = static_cast<const std::uint8_t*>(w->data);
  std::int64_t head[3];
  std::memcpy(head, p + sizeof kMagic, sizeof head);
  return std::memcmp(p, kMagic, sizeof kMagic) == 0 && head[0] == static_cast<std::int64_t>(w->type) &&
         head[1] == w->ne[0] && head[2] == w->ne[1];
}

class FakeTraits : public ggml::cpu::tensor_traits {
 public:
  bool work_size(int, const struct ggml_tensor*, size_t& size) override {
    size = 0;
    return true;
  }
  // dst[r, j] = dot(row r of the weight, column j of src1), rows split among the threads; each
  // sum in one fixed order, so the same bytes give the same floats whatever the split.
  bool compute_forward(struct ggml_compute_params* params, struct ggml_tensor* op) override {
    if (op->op != GGML_OP_MUL_MAT) return false;
    const struct ggml_tensor* w = op->src[0];
    const struct ggml_tensor* x = op->src[1];
    const std::int64_t k = w->ne[0], rows = w->ne[1];
    if (params->ith == 0) {
      std::lock_guard<std::mutex> lock(seen().mu);
      seen().computed.insert(w->name);
    }
    const bool good = header_ok(w) && x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) &&
                      op->type == GGML_TYPE_F32 && x->ne[0] == k;
    if (!good && params->ith == 0) fake_error(std::string("compute_forward of ") + w->name + ": bad header or operands");
    const std::size_t row = ggml_row_size(w->type, k);
    const auto to_float = ggml_get_type_traits(w->type)->to_float;
    std::vector<std::uint8_t> bytes(row);
    std::vector<float> wf(static_cast<std::size_t>(k));
    const std::int64_t r0 = rows * params->ith / params->nth, r1 = rows * (params->ith + 1) / params->nth;
    for (std::int64_t r = r0; r < r1; ++r) {
      const auto* packed = static_cast<const std::uint8_t*>(w->data) + kHeader + static_cast<std::size_t>(rows - 1 - r) * row;
      for (std::size_t i = 0; i < row; ++i) bytes[i] = packed[i] ^ kXor;
      to_float(bytes.data(), wf.data(), k);
      for (std::int64_t i3 = 0; i3 < x->ne[3]; ++i3)
        for (std::int64_t i2 = 0; i2 < x->ne[2]; ++i2)
          for (std::int64_t j = 0; j < x->ne[1]; ++j) {
            const auto* xs = reinterpret_cast<const float*>(static_cast<const char*>(x->data) + j * x->nb[1] +
                                                            i2 * x->nb[2] + i3 * x->nb[3]);
            float sum = 0.0f;
            for (std::int64_t i = 0; i < k; ++i) sum += wf[static_cast<std::size_t>(i)] * xs[i];
            auto* d = reinterpret_cast<float*>(static_cast<char*>(op->data) + r * op->nb[0] + j * op->nb[1] +
                                               i2 * op->nb[2] + i3 * op->nb[3]);
            *d = good ? sum : std::nanf("");
          }
    }
    return true;
  }
};
FakeTraits g_traits;

struct ggml_backend_buffer_type g_fake {};

class FakeExtra : public ggml::cpu::extra_buffer_type {
 public:
  bool supports_op(ggml_backend_dev_t, const struct ggml_tensor* op) override {
    const struct ggml_tensor* w = op->src[0];
    const struct ggml_tensor* x = op->src[1];
    if (op->op != GGML_OP_MUL_MAT || w == nullptr || x == nullptr || w->buffer == nullptr ||
        w->buffer->buft != &g_fake || !ggml_is_contiguous(w) || !fake_takes_weight(w->type, w->ne))
      return false;
    if (x->buffer != nullptr && !ggml_backend_buft_is_host(x->buffer->buft)) return false;
    return x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && op->type == GGML_TYPE_F32;
  }
  ggml::cpu::tensor_traits* get_tensor_traits(const struct ggml_tensor* op) override {
    if (op->op == GGML_OP_MUL_MAT && op->src[0] != nullptr && op->src[0]->buffer != nullptr &&
        op->src[0]->buffer->buft == &g_fake)
      return static_cast<ggml::cpu::tensor_traits*>(op->src[0]->extra);
    return nullptr;
  }
};

void b_free(ggml_backend_buffer_t b) { std::free(b->context); }
void* b_base(ggml_backend_buffer_t b) { return b->context; }
enum ggml_status b_init(ggml_backend_buffer_t, struct ggml_tensor* t) {
  t->extra = &g_traits;
  return GGML_STATUS_SUCCESS;
}
void b_memset(ggml_backend_buffer_t, struct ggml_tensor* t, uint8_t value, size_t offset, size_t size) {
  std::memset(static_cast<char*>(t->data) + offset, value, size);
}
void b_set(ggml_backend_buffer_t, struct ggml_tensor* t, const void* data, size_t offset, size_t size) {
  if (offset != 0 || size != ggml_nbytes(t) || !fake_type(t->type) || ggml_n_dims(t) != 2) {
    fake_error(std::string("set_tensor of ") + t->name + " not whole, or not a 2-D weight of a fake type");
    return;
  }
  const std::vector<std::uint8_t> packed = fake_pack(t->type, t->ne[0], t->ne[1], data);
  std::memcpy(t->data, packed.data(), packed.size());
  std::lock_guard<std::mutex> lock(seen().mu);
  seen().packed.insert(t->name);
}
void b_clear(ggml_backend_buffer_t b, uint8_t value) { std::memset(b->context, value, b->size); }

const char* bt_name(ggml_backend_buffer_type_t) { return "AMX"; }
ggml_backend_buffer_t bt_alloc(ggml_backend_buffer_type_t bt, size_t size) {
  void* p = std::aligned_alloc(64, (size + 63) / 64 * 64);
  if (p == nullptr) return nullptr;
  struct ggml_backend_buffer_i iface {};
  iface.free_buffer = b_free;
  iface.get_base = b_base;
  iface.init_tensor = b_init;
  iface.memset_tensor = b_memset;
  iface.set_tensor = b_set;
  iface.clear = b_clear;
  return ggml_backend_buffer_init(bt, iface, p, size);
}
size_t bt_alignment(ggml_backend_buffer_type_t) { return 64; }
size_t bt_alloc_size(ggml_backend_buffer_type_t, const struct ggml_tensor* t) { return ggml_nbytes(t) + kHeader; }

// Puts the fake first in ggml-cpu's extra buffer types (AMX's place); false when ggml-cpu had
// already handed its list out, so the fake would not be seen.
bool inject_fake() {
  std::vector<ggml_backend_buffer_type_t>& extras = ggml_backend_cpu_get_extra_buffer_types();
  g_fake.iface.get_name = bt_name;
  g_fake.iface.alloc_buffer = bt_alloc;
  g_fake.iface.get_alignment = bt_alignment;
  g_fake.iface.get_alloc_size = bt_alloc_size;
  g_fake.context = new FakeExtra;  // ggml-cpu casts it to ggml::cpu::extra_buffer_type*
  extras.insert(extras.begin(), &g_fake);
  g_fake.device = ggml_backend_reg_dev_get(ggml_backend_cpu_reg(), 0);
  // What llama.cpp and weightcache are handed (ggml-cpu copies the list on the first call).
  ggml_backend_reg_t reg = ggml_backend_cpu_reg();
  auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
      ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
  return get != nullptr && get(g_fake.device)[0] == &g_fake;
}

ggml_backend_buffer_type_t cpu_repack() {
  for (ggml_backend_buffer_type_t b : ggml_backend_cpu_get_extra_buffer_types())
    if (std::strcmp(ggml_backend_buft_name(b), "CPU_REPACK") == 0) return b;
  return nullptr;
}

// ---- the model ---------------------------------------------------------------------------------------

std::string installed(const std::string& tool) { return std::string(WEIGHTCACHE_LLAMA_PREFIX) + "/bin/" + tool; }

void make_model(const TempDir& dir, const std::string& out, const std::string& type, const std::string& seed) {
  const auto r = weightcache::test::run_tool(dir, installed("weightcache-gguf-gen"),
                                             {"--out", out, "--type", type, "--seed", seed, "--layers", "2", "--dim",
                                              "256", "--ffn", "512", "--vocab", "264"});
  ASSERT_EQ(r.code, 0) << r.describe();
}

struct Weight {
  std::string name;
  enum ggml_type type = GGML_TYPE_F32;
  std::int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
  std::vector<std::uint8_t> bytes;  // the GGUF's
  bool matrix = false;              // llama.cpp computes it by a matrix product of a 2-D weight
  bool fake = false;                // the fake's rule takes it
  bool repack = false;              // CPU_REPACK takes it (ggml-cpu's answer)
};

// Whether ggml-cpu computes the product of `w` (as llama.cpp asks: a stand-in activation of 512
// columns) from a weight in `buft`.
bool ggml_takes(const Weight& w, ggml_backend_buffer_type_t buft) {
  if (buft == nullptr) return false;
  ggml_init_params p{};
  p.mem_size = ggml_tensor_overhead() * 4;
  p.no_alloc = true;
  ggml_context* ctx = ggml_init(p);
  ggml_tensor* t = ggml_new_tensor(ctx, w.type, GGML_MAX_DIMS, w.ne);
  ggml_tensor* op = ggml_mul_mat(ctx, t, ggml_new_tensor_4d(ctx, GGML_TYPE_F32, w.ne[0], 512, w.ne[2], w.ne[3]));
  t->buffer = ggml_backend_buft_alloc_buffer(buft, 0);
  const bool ok = ggml_backend_dev_supports_op(ggml_backend_reg_dev_get(ggml_backend_cpu_reg(), 0), op);
  ggml_backend_buffer_free(t->buffer);
  ggml_free(ctx);
  return ok;
}

std::vector<Weight> weights_of(const std::string& path) {
  std::vector<Weight> out;
  ggml_context* meta = nullptr;
  gguf_init_params gp{};
  gp.no_alloc = true;
  gp.ctx = &meta;
  gguf_context* g = gguf_init_from_file(path.c_str(), gp);
  if (g == nullptr) return out;
  std::ifstream f(path, std::ios::binary);
  for (std::int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
    Weight w;
    w.name = gguf_get_tensor_name(g, i);
    const ggml_tensor* t = ggml_get_tensor(meta, w.name.c_str());
    w.type = t->type;
    std::copy(t->ne, t->ne + GGML_MAX_DIMS, w.ne);
    w.bytes.resize(ggml_nbytes(t));
    f.seekg(static_cast<std::streamoff>(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i)));
    f.read(reinterpret_cast<char*>(w.bytes.data()), static_cast<std::streamsize>(w.bytes.size()));
    w.matrix = ggml_n_dims(t) == 2 && w.name != "token_embd.weight" && w.name.find("norm") == std::string::npos;
    w.fake = w.matrix && fake_takes_weight(w.type, w.ne);
    w.repack = w.matrix && ggml_takes(w, cpu_repack());
    out.push_back(std::move(w));
  }
  gguf_free(g);
  ggml_free(meta);
  return out;
}

std::set<std::string> names(const std::vector<Weight>& ws, bool (*pick)(const Weight&)) {
  std::set<std::string> s;
  for (const Weight& w : ws)
    if (pick(w)) s.insert(w.name);
  return s;
}
bool in_fake(const Weight& w) { return w.fake; }
// CPU_REPACK's in a process with the fake: what the fake does not take first.
bool in_repack_with_fake(const Weight& w) { return !w.fake && w.repack; }
bool in_repack_without_fake(const Weight& w) { return w.repack; }

// ---- one process's loads: stock llama.cpp, then (given a cache) through the cache --------------------

std::mutex g_log_mu;
std::vector<std::string> g_log_errors;  // error-level lines, and warnings from weightcache

using weightcache::test::quiet_params;

// The last position's logits after a fixed prompt, computed on 3 threads (the fake's kernel splits
// the rows among them); empty when anything fails.
std::vector<float> logits_of(llama_model* model) { return weightcache::test::logits_of(model, 3); }

struct Outcome {
  std::string error;  // the first thing that failed, "" when none
  std::string layouts, stock_types;
  std::vector<float> stock_logits;
  std::set<std::string> stock_packed, stock_computed;  // by the fake, during the stock load and decode
  // Through the cache:
  std::uint64_t routed = 0, stock_repacked = 0;
  std::map<std::string, std::string> routes;  // tensor -> the buffer type the override list gives it
  std::vector<float> cache_logits;
  std::set<std::string> cache_packed, cache_computed;
  std::uint64_t tensors = 0, repacked = 0, served = 0, heap = 0;
  std::vector<std::string> fake_errors, log_errors;
};

// The buffer type llama.cpp takes for each tensor of `ws` from params' override list (the first
// pattern that matches, searched as llama.cpp does).
std::map<std::string, std::string> routes_of(const llama_model_params& mp, const std::vector<Weight>& ws) {
  std::map<std::string, std::string> out;
  for (const Weight& w : ws)
    for (const llama_model_tensor_buft_override* o = mp.tensor_buft_overrides; o != nullptr && o->pattern != nullptr; ++o)
      if (std::regex_search(w.name, std::regex(o->pattern))) {
        out[w.name] = ggml_backend_buft_name(o->buft);
        break;
      }
  return out;
}

std::set<std::string> take_seen(bool packed) {
  std::lock_guard<std::mutex> lock(seen().mu);
  return packed ? seen().packed : seen().computed;
}

Outcome load_all(const std::string& model, const std::string& cache_path) {
  Outcome o;
  {
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_log_errors.clear();
  }
  o.layouts = wc_ggml_layouts();
  const llama_model_params plain = quiet_params();
  wc_llama_routing stock;
  wc_llama_routing_init(&stock);
  if (wc_llama_stock_routing(model.c_str(), &plain, &stock) != WC_OK) o.error = wc_ggml_last_error();
  o.stock_types = stock.stock_buffer_types;
  reset_seen();
  {
    llama_model* m = llama_model_load_from_file(model.c_str(), plain);
    if (m == nullptr && o.error.empty()) o.error = "the stock load failed";
    o.stock_logits = logits_of(m);
    if (m != nullptr) llama_model_free(m);
  }
  o.stock_packed = take_seen(true);
  o.stock_computed = take_seen(false);
  if (!cache_path.empty()) {
    auto failed = [&](const std::string& what) {
      if (o.error.empty()) o.error = what;
    };
    wc_options opt;
    wc_options_init(&opt);
    opt.path = cache_path.c_str();
    wc_cache* cache = nullptr;
    wc_llama* wl = nullptr;
    if (wc_open(&opt, &cache) != WC_OK) failed(std::string("wc_open: ") + wc_last_error());
    else if (wc_llama_create(cache, nullptr, &wl) != WC_OK) failed(std::string("wc_llama_create: ") + wc_ggml_last_error());
    if (wl != nullptr) {
      llama_model_params mp = quiet_params();
      wc_llama_routing r;
      wc_llama_routing_init(&r);
      if (wc_llama_model_params_ex(wl, model.c_str(), &mp, &r) != WC_OK)
        failed(std::string("wc_llama_model_params_ex: ") + wc_ggml_last_error());
      o.routed = r.routed;
      o.stock_repacked = r.stock_repacked;
      o.routes = routes_of(mp, weights_of(model));
      reset_seen();
      llama_model* m = llama_model_load_from_file(model.c_str(), mp);
      if (m == nullptr) failed("the load through the cache failed");
      o.cache_logits = logits_of(m);
      if (m != nullptr) llama_model_free(m);
      o.cache_packed = take_seen(true);
      o.cache_computed = take_seen(false);
      if (wc_ggml_finish(wc_llama_ggml(wl)) != WC_OK) failed(std::string("wc_ggml_finish: ") + wc_ggml_last_error());
      wc_ggml_stats s;
      wc_ggml_stats_init(&s);
      if (wc_ggml_get_stats(wc_llama_ggml(wl), &s) != WC_OK) failed("wc_ggml_get_stats");
      o.tensors = s.tensors;
      o.repacked = s.repacked;
      o.served = s.served_from_cache;
      o.heap = s.heap_fallbacks;
      wc_llama_destroy(wl);
    }
    if (cache != nullptr) wc_close(cache);
  }
  {
    std::lock_guard<std::mutex> lock(seen().mu);
    o.fake_errors = seen().errors;
  }
  std::lock_guard<std::mutex> lock(g_log_mu);
  o.log_errors = g_log_errors;
  return o;
}

// ---- an Outcome through a file (a child process's) -----------------------------------------------

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) out += (out.empty() ? "" : ",") + x;
  return out;
}
std::set<std::string> split(const std::string& s) {
  std::set<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty()) out.insert(x);
  return out;
}
std::string floats(const std::vector<float>& v) {
  std::string out;
  char hex[16];
  for (float f : v) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    std::snprintf(hex, sizeof hex, "%08" PRIx32 " ", bits);
    out += hex;
  }
  return out;
}
std::vector<float> unfloats(const std::string& s) {
  std::vector<float> out;
  std::stringstream in(s);
  for (std::string x; in >> x;) {
    const auto bits = static_cast<std::uint32_t>(std::stoul(x, nullptr, 16));
    float f;
    std::memcpy(&f, &bits, sizeof f);
    out.push_back(f);
  }
  return out;
}

// One line per field, "name value"; messages with their newlines flattened.
std::string flat(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

bool write_outcome(const Outcome& o, const std::string& path) {
  std::ofstream f(path, std::ios::trunc);
  f << "error " << flat(o.error) << "\n"
    << "layouts " << o.layouts << "\n"
    << "stock_types " << o.stock_types << "\n"
    << "stock_logits " << floats(o.stock_logits) << "\n"
    << "stock_packed " << join(o.stock_packed) << "\n"
    << "stock_computed " << join(o.stock_computed) << "\n"
    << "routed " << o.routed << "\n"
    << "stock_repacked " << o.stock_repacked << "\n"
    << "cache_logits " << floats(o.cache_logits) << "\n"
    << "cache_packed " << join(o.cache_packed) << "\n"
    << "cache_computed " << join(o.cache_computed) << "\n"
    << "tensors " << o.tensors << "\n"
    << "repacked " << o.repacked << "\n"
    << "served " << o.served << "\n"
    << "heap " << o.heap << "\n";
  for (const auto& [name, buft] : o.routes) f << "route " << name << "=" << buft << "\n";
  for (const std::string& e : o.fake_errors) f << "fake_error " << flat(e) << "\n";
  for (const std::string& e : o.log_errors) f << "log_error " << flat(e) << "\n";
  f << "end\n";
  return static_cast<bool>(f);
}

bool read_outcome(const std::string& path, Outcome* o) {
  std::ifstream f(path);
  bool ended = false;
  for (std::string line; std::getline(f, line);) {
    const std::size_t sp = line.find(' ');
    const std::string key = line.substr(0, sp), value = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (key == "error") o->error = value;
    else if (key == "layouts") o->layouts = value;
    else if (key == "stock_types") o->stock_types = value;
    else if (key == "stock_logits") o->stock_logits = unfloats(value);
    else if (key == "stock_packed") o->stock_packed = split(value);
    else if (key == "stock_computed") o->stock_computed = split(value);
    else if (key == "routed") o->routed = std::stoull(value);
    else if (key == "stock_repacked") o->stock_repacked = std::stoull(value);
    else if (key == "cache_logits") o->cache_logits = unfloats(value);
    else if (key == "cache_packed") o->cache_packed = split(value);
    else if (key == "cache_computed") o->cache_computed = split(value);
    else if (key == "tensors") o->tensors = std::stoull(value);
    else if (key == "repacked") o->repacked = std::stoull(value);
    else if (key == "served") o->served = std::stoull(value);
    else if (key == "heap") o->heap = std::stoull(value);
    else if (key == "route") o->routes[value.substr(0, value.find('='))] = value.substr(value.find('=') + 1);
    else if (key == "fake_error") o->fake_errors.push_back(value);
    else if (key == "log_error") o->log_errors.push_back(value);
    else if (key == "end") ended = true;
  }
  return ended;
}

void quiet_log() {
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    const bool ours = std::strstr(text, "weightcache") != nullptr;
    if (level == GGML_LOG_LEVEL_ERROR || (ours && level == GGML_LOG_LEVEL_WARN)) {
      std::fputs(text, stderr);
      std::lock_guard<std::mutex> lock(g_log_mu);
      g_log_errors.emplace_back(text);
    }
  }, nullptr);
}

// `--layout-child fake|nofake MODEL CACHE|- OUT`: load_all in this new process, into OUT.
int child_main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s --layout-child fake|nofake MODEL CACHE|- OUT\n", argv[0]);
    return 2;
  }
  quiet_log();
  llama_backend_init();
  const std::string cache = argv[4];
  const Outcome o = load_all(argv[3], cache == "-" ? "" : cache);
  const bool written = write_outcome(o, argv[5]);
  llama_backend_free();
  return written ? 0 : 1;
}

// Runs load_all in a new process of this binary, with or without the fake.
Outcome in_child(const TempDir& dir, bool fake, const std::string& model, const std::string& cache) {
  static int runs = 0;
  const std::string out = dir.file("child" + std::to_string(runs++) + ".outcome");
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  Outcome o;
  if (n <= 0) {
    o.error = "cannot read /proc/self/exe";
    return o;
  }
  self[n] = '\0';
  const auto r = weightcache::test::run_tool(
      dir, self, {"--layout-child", fake ? "fake" : "nofake", model, cache.empty() ? "-" : cache, out});
  if (r.code != 0) o.error = "the child failed: " + r.describe();
  else if (!read_outcome(out, &o)) o.error = "the child's outcome is incomplete: " + weightcache::test::slurp(out);
  return o;
}

// ---- the tests ---------------------------------------------------------------------------------------

class LlamaLayout : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    quiet_log();
    llama_backend_init();
  }
  // A model file older than its file system's change window, so that the cold load that follows
  // records its identity (issue 32): a file just written (within 10 ms on ext4) cannot be
  // trusted by its identity yet, and the warm load after it would record it and so write to the
  // cache. On a file system whose times do not follow every store (tmpfs) no identity is ever
  // recorded, and there is nothing to wait for.
  std::string model(const std::string& type, const std::string& seed) {
    const std::string path = dir_.file(type + "-" + seed + ".gguf");
    make_model(dir_, path, type, seed);
    if (weightcache::source::times_track_every_store(path))
      for (int ms = 0; weightcache::source::file_part(path, 0).file.empty() && ms < 5000; ++ms)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return path;
  }
  // "AMX=a,CPU_REPACK=r" as wc_llama_routing reports it, counts of 0 left out.
  static std::string types(std::size_t amx, std::size_t repack) {
    std::string s;
    if (amx > 0) s += "AMX=" + std::to_string(amx);
    if (repack > 0) s += (s.empty() ? "" : ",") + std::string("CPU_REPACK=") + std::to_string(repack);
    return s;
  }
  TempDir dir_{"wc-llama-layout"};
};

// Checks an outcome has no error of its own.
void expect_clean(const Outcome& o, const std::string& what) {
  EXPECT_EQ(o.error, "") << what;
  EXPECT_TRUE(o.fake_errors.empty()) << what << ": " << o.fake_errors.front();
  EXPECT_TRUE(o.log_errors.empty()) << what << ": " << o.log_errors.front();
}

TEST_F(LlamaLayout, TheFakeIsALayoutOfItsOwnAheadOfCpuRepack) {
  EXPECT_STREQ(wc_ggml_layouts(), "AMX,CPU_REPACK");
  const std::string m = model("q4_0", "1");
  const std::vector<Weight> ws = weights_of(m);
  ASSERT_FALSE(ws.empty());
  const std::set<std::string> fake = names(ws, in_fake), repack = names(ws, in_repack_with_fake);
  ASSERT_EQ(fake, (std::set<std::string>{"blk.0.ffn_down.weight", "blk.1.ffn_down.weight"}));
  ASSERT_EQ(repack.size(), 13u) << "6 other matrices per layer and the output";
  // ggml's own choice for each weight, as weightcache asks it.
  for (const Weight& w : ws) {
    ggml_tensor t{};
    t.type = w.type;
    std::copy(w.ne, w.ne + GGML_MAX_DIMS, t.ne);
    if (!w.matrix) continue;
    const ggml_backend_buffer_type_t want = w.fake ? &g_fake : w.repack ? cpu_repack() : nullptr;
    EXPECT_EQ(wc_ggml_stock_buffer_type(&t), want) << w.name;
  }
  wc_llama_routing r;
  wc_llama_routing_init(&r);
  const llama_model_params mp = quiet_params();
  ASSERT_EQ(wc_llama_stock_routing(m.c_str(), &mp, &r), WC_OK) << wc_ggml_last_error();
  EXPECT_EQ(std::string(r.stock_buffer_types), types(fake.size(), repack.size()));
  EXPECT_EQ(r.stock_repacked, fake.size() + repack.size());
  // Stock llama.cpp packs exactly those through the fake and computes their products with its kernel.
  const Outcome o = load_all(m, "");
  expect_clean(o, "stock");
  ASSERT_FALSE(o.stock_logits.empty());
  EXPECT_EQ(o.stock_packed, fake);
  EXPECT_EQ(o.stock_computed, fake);
  // A process without the fake: one layout, and the weights the fake took are CPU_REPACK's.
  const Outcome plain = in_child(dir_, false, m, "");
  expect_clean(plain, "without the fake");
  EXPECT_EQ(plain.layouts, "CPU_REPACK");
  EXPECT_EQ(plain.stock_types, types(0, names(ws, in_repack_without_fake).size()));
  EXPECT_TRUE(plain.stock_packed.empty() && plain.stock_computed.empty());
  // The fake's kernel gives other numbers than CPU_REPACK's (which rounds the activations to 8 bits):
  // the comparisons of logits in this file tell which kernel computed ffn_down. But close ones: it
  // undoes its packing right and computes the product.
  ASSERT_EQ(plain.stock_logits.size(), o.stock_logits.size());
  EXPECT_NE(plain.stock_logits, o.stock_logits);
  float diff = 0.0f, largest = 0.0f;
  for (std::size_t i = 0; i < o.stock_logits.size(); ++i) {
    diff = std::max(diff, std::fabs(o.stock_logits[i] - plain.stock_logits[i]));
    largest = std::max(largest, std::fabs(plain.stock_logits[i]));
  }
  EXPECT_LT(diff, 0.05f * largest) << "the fake's products are not the weights' (largest logit " << largest << ")";
  // And a new process with the fake computes the same numbers as this one.
  const Outcome again = in_child(dir_, true, m, "");
  expect_clean(again, "another process with the fake");
  EXPECT_EQ(again.stock_logits, o.stock_logits);
}

// Stock, cold (this process) and warm (a new process): the same logits bit for bit; the cold load
// packs each weight once into the cache through its layout's code, the warm one serves them all and
// leaves the cache file as it was.
TEST_F(LlamaLayout, ColdAndWarmLoadsOfBothLayoutsGiveStockLogits) {
  int seed = 10;
  for (const char* type : {"q4_0", "q4_k", "q8_0"}) {
    SCOPED_TRACE(type);
    const std::string m = model(type, std::to_string(seed++));
    const std::string cache = dir_.file(std::string(type) + ".wcache");
    const std::vector<Weight> ws = weights_of(m);
    const std::set<std::string> fake = names(ws, in_fake), repack = names(ws, in_repack_with_fake);
    ASSERT_EQ(fake.size(), 2u) << "the two ffn_down";
    const Outcome cold = load_all(m, cache);
    expect_clean(cold, "cold");
    ASSERT_FALSE(cold.stock_logits.empty());
    EXPECT_EQ(cold.stock_packed, fake);
    EXPECT_EQ(cold.stock_computed, fake);
    EXPECT_EQ(cold.routed, fake.size() + repack.size());
    EXPECT_EQ(cold.routed, cold.stock_repacked);
    std::map<std::string, std::string> want_routes;
    for (const std::string& n : fake) want_routes[n] = "WEIGHTCACHE_AMX";
    for (const std::string& n : repack) want_routes[n] = "WEIGHTCACHE_REPACK";
    EXPECT_EQ(cold.routes, want_routes);
    EXPECT_EQ(cold.cache_logits, cold.stock_logits) << "cold";
    EXPECT_EQ(cold.cache_packed, fake) << "the fake's packing wrote its weights into the cache";
    EXPECT_EQ(cold.cache_computed, fake) << "the fake's kernel computed from the cache's bytes";
    EXPECT_EQ(cold.tensors, cold.routed);
    EXPECT_EQ(cold.repacked, cold.routed);
    EXPECT_EQ(cold.served, 0u);
    EXPECT_EQ(cold.heap, 0u);

    weightcache::test::FileTimes before, after;
    ASSERT_TRUE(weightcache::test::read_file_times(cache, &before));
    const Outcome warm = in_child(dir_, true, m, cache);
    expect_clean(warm, "warm");
    EXPECT_EQ(warm.routed, cold.routed);
    EXPECT_EQ(warm.routes, want_routes);
    EXPECT_EQ(warm.cache_logits, cold.stock_logits) << "warm";
    EXPECT_EQ(warm.stock_logits, cold.stock_logits) << "stock in another process";
    EXPECT_TRUE(warm.cache_packed.empty()) << "packed again: " << join(warm.cache_packed);
    EXPECT_EQ(warm.cache_computed, fake) << "the fake's kernel computed from the cache's bytes";
    EXPECT_EQ(warm.tensors, warm.routed);
    EXPECT_EQ(warm.repacked, 0u);
    EXPECT_EQ(warm.served, warm.routed);
    EXPECT_EQ(warm.heap, 0u);
    ASSERT_TRUE(weightcache::test::read_file_times(cache, &after));
    EXPECT_EQ(after.size, before.size) << "the warm load grew the cache";
    EXPECT_EQ(after.mtime_ns, before.mtime_ns) << "the warm load wrote to the cache";
  }
}

// A cache written with the fake, read by a process without it: there every weight is CPU_REPACK's,
// and the two ffn_down the fake wrote under its layout are packed again; the rest is served.
TEST_F(LlamaLayout, EntriesOfTheFakesLayoutAreNotServedToAProcessWithoutIt) {
  int seed = 20;
  for (const char* type : {"q4_0", "q4_k"}) {
    SCOPED_TRACE(type);
    const std::string m = model(type, std::to_string(seed++));
    const std::string cache = dir_.file(std::string(type) + ".wcache");
    const std::vector<Weight> ws = weights_of(m);
    const std::set<std::string> fake = names(ws, in_fake), repack = names(ws, in_repack_with_fake),
                                all_repack = names(ws, in_repack_without_fake);
    ASSERT_EQ(fake.size(), 2u);
    ASSERT_EQ(all_repack.size(), fake.size() + repack.size()) << "CPU_REPACK takes ffn_down too, without the fake";
    const Outcome cold = load_all(m, cache);
    expect_clean(cold, "with the fake");
    ASSERT_EQ(cold.repacked, fake.size() + repack.size());
    const Outcome other = in_child(dir_, false, m, cache);
    expect_clean(other, "without the fake");
    EXPECT_EQ(other.routed, all_repack.size());
    std::map<std::string, std::string> want_routes;
    for (const std::string& n : all_repack) want_routes[n] = "WEIGHTCACHE_REPACK";
    EXPECT_EQ(other.routes, want_routes);
    EXPECT_EQ(other.served, repack.size()) << "only CPU_REPACK's entries may be served";
    EXPECT_EQ(other.repacked, fake.size()) << "the fake's weights are CPU_REPACK's here: packed again";
    EXPECT_EQ(other.heap, 0u);
    ASSERT_FALSE(other.stock_logits.empty());
    EXPECT_EQ(other.cache_logits, other.stock_logits);
    EXPECT_NE(other.cache_logits, cold.stock_logits) << "the fake's kernel ran in a process without it?";
  }
}

// The other way: a cache written without the fake, read with it: the fake's two weights are packed
// (their CPU_REPACK entries are not served), the rest served.
TEST_F(LlamaLayout, EntriesOfCpuRepackAreNotServedForTheFakesWeights) {
  int seed = 30;
  for (const char* type : {"q4_0", "q4_k"}) {
    SCOPED_TRACE(type);
    const std::string m = model(type, std::to_string(seed++));
    const std::string cache = dir_.file(std::string(type) + ".wcache");
    const std::vector<Weight> ws = weights_of(m);
    const std::set<std::string> fake = names(ws, in_fake), repack = names(ws, in_repack_with_fake),
                                all_repack = names(ws, in_repack_without_fake);
    ASSERT_EQ(fake.size(), 2u);
    ASSERT_EQ(all_repack.size(), fake.size() + repack.size());
    const Outcome other = in_child(dir_, false, m, cache);
    expect_clean(other, "without the fake");
    ASSERT_EQ(other.repacked, all_repack.size());
    const Outcome mine = load_all(m, cache);
    expect_clean(mine, "with the fake");
    EXPECT_EQ(mine.routed, fake.size() + repack.size());
    EXPECT_EQ(mine.served, repack.size());
    EXPECT_EQ(mine.repacked, fake.size()) << "a CPU_REPACK entry was served for a weight of the fake's layout";
    EXPECT_EQ(mine.cache_packed, fake);
    EXPECT_EQ(mine.cache_computed, fake);
    EXPECT_EQ(mine.heap, 0u);
    ASSERT_FALSE(mine.stock_logits.empty());
    EXPECT_EQ(mine.cache_logits, mine.stock_logits);
    // Both layouts' entries for ffn_down now, side by side; a third load serves everything.
    const Outcome warm = in_child(dir_, true, m, cache);
    expect_clean(warm, "warm, with the fake");
    EXPECT_EQ(warm.served, warm.routed);
    EXPECT_EQ(warm.cache_logits, mine.stock_logits);
  }
}

// The fake layout's entries hold its packing, at its size (the GGUF's bytes and 256), under keys
// naming its layout; CPU_REPACK's under keys naming that one.
TEST_F(LlamaLayout, TheFakeLayoutsEntriesHoldItsPackingAtItsSize) {
  const std::string m = model("q4_0", "40");
  const std::string cache = dir_.file("c.wcache");
  const std::vector<Weight> ws = weights_of(m);
  const Outcome cold = load_all(m, cache);
  expect_clean(cold, "cold");
  ASSERT_EQ(cold.repacked, cold.routed);
  const auto ls = weightcache::test::run_tool(dir_, installed("weightcache"), {"ls", "--json", cache});
  ASSERT_EQ(ls.code, 0) << ls.describe();
  ASSERT_TRUE(ls.j.contains("entries")) << ls.out;
  // The packings the fake writes for its weights, and the sizes of CPU_REPACK's (the GGUF's).
  std::multiset<std::string> want_amx;
  std::multiset<std::uint64_t> want_repack_sizes;
  for (const Weight& w : ws) {
    if (w.fake) {
      const std::vector<std::uint8_t> p = fake_pack(w.type, w.ne[0], w.ne[1], w.bytes.data());
      ASSERT_EQ(p.size(), w.bytes.size() + kHeader);
      want_amx.insert(std::string(p.begin(), p.end()));
    } else if (w.repack) {
      want_repack_sizes.insert(w.bytes.size());
    }
  }
  std::multiset<std::string> amx;
  std::multiset<std::uint64_t> repack_sizes;
  for (const auto& e : ls.j["entries"]) {
    const std::string key = e["key"].get<std::string>();
    if (key.rfind("ggml-repack/1|", 0) != 0) continue;
    if (key.find(" amx ") != std::string::npos) {
      const auto cat = weightcache::test::run_tool(dir_, installed("weightcache"), {"cat", cache, key});
      ASSERT_EQ(cat.code, 0) << cat.describe();
      EXPECT_EQ(cat.out.size(), e["size"].get<std::uint64_t>()) << key;
      amx.insert(cat.out);
    } else {
      EXPECT_NE(key.find(" repack "), std::string::npos) << key;
      repack_sizes.insert(e["size"].get<std::uint64_t>());
    }
  }
  EXPECT_EQ(amx.size(), 2u);
  EXPECT_TRUE(amx == want_amx) << "the AMX entries are not the fake's packing of the two ffn_down";
  EXPECT_EQ(repack_sizes, want_repack_sizes);
}

}  // namespace

int main(int argc, char** argv) {
  const bool child = argc >= 2 && std::strcmp(argv[1], "--layout-child") == 0;
  const bool fake = !(child && argc >= 3 && std::strcmp(argv[2], "nofake") == 0);
  // Before anything reads ggml-cpu's list of extra buffer types (llama_backend_init included).
  if (fake && !inject_fake()) {
    std::fprintf(stderr, "the fake AMX buffer type could not be put first in ggml-cpu's extra buffer types\n");
    return 3;
  }
  if (child) return child_main(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
