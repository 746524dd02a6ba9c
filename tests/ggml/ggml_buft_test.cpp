// The ggml buffer type in this process, linked as an application links it (libweightcache_ggml,
// libweightcache, ggml): two models loaded on two threads at once into one cache, their repacked
// bytes compared with ggml's own CPU_REPACK's; and the API's refusals. Built in the sanitizer
// builds too (ggml is then built with the same sanitizer, without OpenMP): TSan checks the loads.
#include <gtest/gtest.h>

#include <functional>

#include <weightcache/ggml.h>
#include <weightcache/weightcache.h>

#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>
#include <gguf.h>

#include "temp_dir.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define WC_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WC_TEST_TSAN 1
#endif
#endif
#ifndef WC_TEST_TSAN
#define WC_TEST_TSAN 0
#endif

namespace {

using weightcache::test::TempDir;

// A llama-shaped GGUF of `layers` layers with random weights of `type` (the same layout as
// weightcache-gguf-gen writes, smaller), written in this process with ggml's gguf writer.
void make_model(const std::string& out, ggml_type type, int seed, int layers = 2, int dim = 256, int ffn = 512) {
  ggml_init_params ip{};
  ip.mem_size = ggml_tensor_overhead() * 64 + static_cast<std::size_t>(layers) * 4 * dim * ffn * 2;
  ggml_context* ctx = ggml_init(ip);
  gguf_context* g = gguf_init_empty();
  gguf_set_val_str(g, "general.architecture", "llama");
  std::uint64_t s = static_cast<std::uint64_t>(seed) * 0x9E3779B97F4A7C15ull + 1;
  std::vector<float> v;
  auto add = [&](const std::string& name, int ne0, int ne1) {
    ggml_tensor* t = ggml_new_tensor_2d(ctx, type, ne0, ne1);
    ggml_set_name(t, name.c_str());
    v.resize(static_cast<std::size_t>(ne0) * ne1);
    for (float& x : v) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      x = static_cast<float>(static_cast<std::int64_t>(s % 2001) - 1000) / 50000.0f;
    }
    ggml_quantize_chunk(type, v.data(), t->data, 0, ne1, ne0, nullptr);
    gguf_add_tensor(g, t);
  };
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (const char* w : {"attn_q", "attn_k", "attn_v", "attn_output"}) add(p + w + ".weight", dim, dim);
    add(p + "ffn_gate.weight", dim, ffn);
    add(p + "ffn_up.weight", dim, ffn);
    add(p + "ffn_down.weight", ffn, dim);
  }
  ASSERT_TRUE(gguf_write_to_file(g, out.c_str(), false));
  gguf_free(g);
  ggml_free(ctx);
}

// ---- in this process: two models on two threads, one cache ---------------------------------------

// The buffer type a load puts a weight in: the cache's for its layout (wc_ggml_buffer_type_for),
// or stock ggml's (wc_ggml_stock_buffer_type). On x86-64 that is CPU_REPACK (or AMX); on arm64
// with KleidiAI, KleidiAI's for what it takes.
using Route = std::function<ggml_backend_buffer_type_t(const ggml_tensor*)>;
Route cached(wc_ggml* g) {
  return [g](const ggml_tensor* t) { return wc_ggml_buffer_type_for(g, t); };
}
Route stock_route() { return [](const ggml_tensor* t) { return wc_ggml_stock_buffer_type(t); }; }

struct Loaded {
  ggml_context* ctx = nullptr;
  ggml_backend_buffer_t buf = nullptr;     // the buffer of a test that allocates one itself
  std::vector<ggml_context*> ctxs;         // load_in_process: a context and a buffer per buffer type
  std::vector<ggml_backend_buffer_t> bufs;
  std::vector<ggml_tensor*> tensors;
  std::vector<std::size_t> sizes;          // each tensor's repacked size (its buffer type's alloc size)
  std::uint8_t* map = nullptr;  // MapHow::keep_mapped
  std::size_t map_size = 0, data_offset = 0;
  ~Loaded() {
    if (buf) ggml_backend_buffer_free(buf);
    if (ctx) ggml_free(ctx);
    for (ggml_backend_buffer_t b : bufs) ggml_backend_buffer_free(b);
    for (ggml_context* c : ctxs) ggml_free(c);
    if (map) ::munmap(map, map_size);
  }
};

// Loads every tensor CPU_REPACK repacks from `model` into a buffer of `buft`, from a mapping.
// How a test maps the GGUF it loads from.
struct MapHow {
  bool shared = true;         // MAP_SHARED (as llama.cpp maps), else MAP_PRIVATE
  void* at = nullptr;         // an address inside a range the test reserved: mapped there (MAP_FIXED), then
                              // reserved again (PROT_NONE) when the load is done; else anywhere
  std::size_t patch_at = 0;   // private: a byte of the data section changed before the load (0: none)
  bool keep_mapped = false;   // leave the mapping (out->map) for the test to look at
  // Called after the i-th tensor is set (a test changing the file in the middle of a load).
  std::function<void(std::size_t i)> after_set;
};

// Loads every tensor ggml repacks from `model` into buffers of the buffer types `route` gives, from
// a mapping.
bool load_in_process(const std::string& model, const Route& route, Loaded* out, std::string* why,
                     const MapHow& how = {}) {
  ggml_context* meta = nullptr;
  gguf_init_params p{};
  p.no_alloc = true;
  p.ctx = &meta;
  gguf_context* g = gguf_init_from_file(model.c_str(), p);
  if (g == nullptr) return *why = "cannot read " + model, false;
  const int fd = ::open(model.c_str(), O_RDONLY);
  struct stat st {};
  ::fstat(fd, &st);
  const int prot = how.shared ? PROT_READ : PROT_READ | PROT_WRITE;
  const int flags = (how.shared ? MAP_SHARED : MAP_PRIVATE) | (how.at != nullptr ? MAP_FIXED : 0);
  auto* map = static_cast<std::uint8_t*>(::mmap(how.at, st.st_size, prot, flags, fd, 0));
  ::close(fd);
  if (map == MAP_FAILED || (how.at != nullptr && map != how.at)) return *why = "cannot map " + model, false;
  if (!how.shared) {
    // A loader that patches its private copy, then makes it read-only: the pages are not the file's.
    if (how.patch_at != 0) map[gguf_get_data_offset(g) + how.patch_at] ^= 0x77;
    ::mprotect(map, st.st_size, PROT_READ);
  }
  ggml_init_params ip{};
  ip.mem_size = ggml_tensor_overhead() * 256;
  ip.no_alloc = true;
  std::vector<ggml_backend_buffer_type_t> types;  // out->ctxs[i] holds the tensors of types[i]
  std::vector<std::pair<ggml_tensor*, const std::uint8_t*>> src;
  for (std::int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
    ggml_tensor* t = ggml_get_tensor(meta, gguf_get_tensor_name(g, i));
    if (!wc_ggml_would_repack(t)) continue;
    ggml_backend_buffer_type_t buft = route(t);
    if (buft == nullptr) return *why = std::string("no buffer type for ") + t->name, false;
    std::size_t k = 0;
    while (k < types.size() && types[k] != buft) ++k;
    if (k == types.size()) {
      types.push_back(buft);
      out->ctxs.push_back(ggml_init(ip));
    }
    ggml_tensor* d = ggml_dup_tensor(out->ctxs[k], t);
    ggml_set_name(d, t->name);
    src.emplace_back(d, map + gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i));
    out->tensors.push_back(d);
    out->sizes.push_back(ggml_backend_buft_get_alloc_size(buft, d));
  }
  for (std::size_t k = 0; k < types.size(); ++k) {
    out->bufs.push_back(ggml_backend_alloc_ctx_tensors_from_buft(out->ctxs[k], types[k]));
    if (out->bufs.back() == nullptr) return *why = "no buffer", false;
    // Zeros where a layout leaves bytes unwritten (KleidiAI's alignment padding, the header slots of
    // kernels it has not), as in the cache's fresh space: stock's heap would hold garbage there.
    ggml_backend_buffer_clear(out->bufs.back(), 0);
  }
  for (std::size_t i = 0; i < src.size(); ++i) {
    ggml_backend_tensor_set(src[i].first, src[i].second, 0, ggml_nbytes(src[i].first));
    if (how.after_set) how.after_set(i);
  }
  // The repacked bytes outlive the mapping (they are in the buffer or the cache).
  if (how.keep_mapped) {
    out->map = map;
    out->map_size = static_cast<std::size_t>(st.st_size);
    out->data_offset = gguf_get_data_offset(g);
  } else if (how.at != nullptr) {
    ::mmap(how.at, st.st_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  } else {
    ::munmap(map, st.st_size);
  }
  gguf_free(g);
  ggml_free(meta);
  return true;
}

// Whether every repacked tensor of `mine` has the bytes of the tensor of its name in `stock` (all of
// its repacked size, which is more than ggml_nbytes for KleidiAI's); with `all`, both hold the same tensors.
::testing::AssertionResult same_repacked(const Loaded& mine, const Loaded& stock, bool all = true) {
  if (mine.tensors.empty()) return ::testing::AssertionFailure() << "nothing loaded";
  if (all && mine.tensors.size() != stock.tensors.size()) return ::testing::AssertionFailure() << "tensor counts differ";
  for (std::size_t i = 0; i < mine.tensors.size(); ++i) {
    std::size_t j = 0;
    while (j < stock.tensors.size() && std::strcmp(stock.tensors[j]->name, mine.tensors[i]->name) != 0) ++j;
    if (j == stock.tensors.size()) return ::testing::AssertionFailure() << mine.tensors[i]->name << ": not in stock's load";
    if (mine.sizes[i] != stock.sizes[j])
      return ::testing::AssertionFailure() << mine.tensors[i]->name << ": repacked sizes differ from stock's";
    if (std::memcmp(mine.tensors[i]->data, stock.tensors[j]->data, mine.sizes[i]) != 0)
      return ::testing::AssertionFailure() << mine.tensors[i]->name << ": repacked bytes differ from stock ggml's";
  }
  return ::testing::AssertionSuccess();
}

ggml_backend_buffer_type_t cpu_repack() {
  ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  auto extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
      ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
  for (ggml_backend_buffer_type_t* b = extra ? extra(dev) : nullptr; b && *b; ++b)
    if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
  return nullptr;
}

// A cache file opened with a ggml buffer type over it, both closed when it goes (every tensor
// loaded into it must be freed first). identity_window_ms < 0: the defaults.
struct GgmlCache {
  wc_cache* c = nullptr;
  wc_ggml* g = nullptr;
  explicit GgmlCache(const std::string& path, std::int64_t identity_window_ms = -1) {
    wc_options o;
    wc_options_init(&o);
    o.path = path.c_str();
    EXPECT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
    wc_ggml_options go;
    wc_ggml_options_init(&go);
    if (identity_window_ms >= 0) go.identity_window_ms = identity_window_ms;
    EXPECT_EQ(wc_ggml_create(c, &go, &g), WC_OK) << wc_ggml_last_error();
  }
  GgmlCache(const GgmlCache&) = delete;
  GgmlCache& operator=(const GgmlCache&) = delete;
  ~GgmlCache() {
    wc_ggml_destroy(g);
    wc_close(c);
  }
  wc_ggml_stats stats() const {
    wc_ggml_stats s;
    wc_ggml_stats_init(&s);
    (void)wc_ggml_get_stats(g, &s);
    return s;
  }
};

// The caches of the identity tests trust a GGUF's identity 2 s after its last change.
struct TrustingCache : GgmlCache {
  explicit TrustingCache(const std::string& path) : GgmlCache(path, 2000) {}
};

TEST(GgmlBufferType, TwoThreadsLoadTwoModelsIntoOneCacheAtOnce) {
  TempDir dir("wc-ggml-threads");
  const std::string m1 = dir.file("a.gguf"), m2 = dir.file("b.gguf"), cache = dir.file("c.wcache");
  make_model(m1, GGML_TYPE_Q4_0, 3);
  make_model(m2, GGML_TYPE_IQ4_NL, 4);
  ASSERT_NE(cpu_repack(), nullptr);
  for (int round = 0; round < 2; ++round) {  // cold, then warm
    GgmlCache opened(cache);
    wc_ggml* g = opened.g;
    ASSERT_NE(g, nullptr);
    {
      Loaded a, b, ra, rb;
      std::string wa, wb;
      bool oka = false, okb = false;
      std::thread t1([&] { oka = load_in_process(m1, cached(g), &a, &wa); });
      std::thread t2([&] { okb = load_in_process(m2, cached(g), &b, &wb); });
      t1.join();
      t2.join();
      ASSERT_TRUE(oka) << wa;
      ASSERT_TRUE(okb) << wb;
      std::string why;
      ASSERT_TRUE(load_in_process(m1, stock_route(), &ra, &why)) << why;
      ASSERT_TRUE(load_in_process(m2, stock_route(), &rb, &why)) << why;
      for (auto [mine, stock_load] : {std::pair<Loaded*, Loaded*>{&a, &ra}, {&b, &rb}})
        EXPECT_TRUE(same_repacked(*mine, *stock_load)) << "round " << round;
    }
    wc_ggml_stats s;
    wc_ggml_stats_init(&s);
    ASSERT_EQ(wc_ggml_get_stats(g, &s), WC_OK);
    EXPECT_EQ(s.tensors, 28u);
    if (round == 0) {
      EXPECT_EQ(s.repacked, 28u);
    }
    if (round == 1) {
      EXPECT_EQ(s.served_from_cache, 28u);
    }
    EXPECT_EQ(s.heap_fallbacks, 0u);
  }
}


// Every weight gets the cache's buffer type of the layout stock ggml gives it on this CPU: AMX's on
// x86-64 with AMX, KleidiAI's on arm64 builds with KleidiAI, CPU_REPACK's otherwise (the test says
// which it saw). A warm load serves every one of them.
TEST(GgmlBufferType, EachWeightGetsTheLayoutStockGivesItOnThisCpuAndWarmServesThemAll) {
  TempDir dir("wc-ggml-layouts");
  const std::string cache = dir.file("c.wcache");
  std::vector<std::string> models;
  int seed = 30;
  for (ggml_type type : {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL}) {
    models.push_back(dir.file(std::string(ggml_type_name(type)) + ".gguf"));
    make_model(models.back(), type, seed++);
  }
  std::map<std::string, int> seen;  // stock layout -> weights
  for (int round = 0; round < 2; ++round) {
    GgmlCache opened(cache);
    wc_ggml* g = opened.g;
    ASSERT_NE(g, nullptr);
    std::size_t weights = 0;
    for (const std::string& m : models) {
      Loaded mine, stock;
      std::string why;
      ASSERT_TRUE(load_in_process(m, cached(g), &mine, &why)) << why;
      ASSERT_TRUE(load_in_process(m, stock_route(), &stock, &why)) << why;
      // A type no layout on this CPU takes (Q8_0 on x86-64 without AMX): nothing to compare.
      if (stock.tensors.empty()) EXPECT_TRUE(mine.tensors.empty()) << m;
      else EXPECT_TRUE(same_repacked(mine, stock)) << m << ", round " << round;
      for (ggml_tensor* t : mine.tensors) {
        const char* stock_name = ggml_backend_buft_name(wc_ggml_stock_buffer_type(t));
        const char* mine_name = ggml_backend_buft_name(wc_ggml_buffer_type_for(g, t));
        const std::string want = std::strcmp(stock_name, "CPU_REPACK") == 0     ? "WEIGHTCACHE_REPACK"
                                 : std::strcmp(stock_name, "CPU_KLEIDIAI") == 0 ? "WEIGHTCACHE_KLEIDIAI"
                                                                                : std::string("WEIGHTCACHE_") + stock_name;
        EXPECT_EQ(mine_name, want) << t->name;
        if (round == 0) ++seen[stock_name];
      }
      weights += mine.tensors.size();
    }
    wc_ggml_stats s;
    wc_ggml_stats_init(&s);
    ASSERT_EQ(wc_ggml_get_stats(g, &s), WC_OK);
    EXPECT_EQ(s.tensors, weights);
    EXPECT_EQ(round == 0 ? s.repacked : s.served_from_cache, weights) << "round " << round;
    EXPECT_EQ(s.heap_fallbacks, 0u);
  }
  std::string which;
  for (const auto& [name, n] : seen) which += " " + name + "=" + std::to_string(n);
  std::printf("  layouts stock ggml gives these weights on this CPU:%s (served: %s)\n", which.c_str(), wc_ggml_layouts());
  // The compatibility key a fleet tells CPU profiles apart by names each served layout and the
  // CPU's features, as every entry key of that layout does.
  const std::string key = wc_ggml_compat_key();
  EXPECT_EQ(key.empty(), std::string(wc_ggml_layouts()).empty()) << key;
  if (!key.empty()) {
    EXPECT_NE(key.find("|cpu "), std::string::npos) << key;
    EXPECT_EQ(key.rfind("ggml-repack/1|ggml ", 0), 0u) << key;
  }
#if defined(__aarch64__) && defined(WEIGHTCACHE_TEST_KLEIDIAI)
  EXPECT_GT(seen["CPU_KLEIDIAI"], 0) << "a build with KleidiAI put no weight in it";
#endif
}

// ---- a cache written on another architecture ------------------------------------------------------

// The output of `cmd` (stdout), or "" when it could not run.
std::string run_output(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  ::pclose(p);
  return out;
}

// The value of "key": in one line of JSON (a number or a string), or "" when it has none.
std::string json_field(const std::string& j, const std::string& key) {
  const std::string tag = "\"" + key + "\":";
  std::size_t at = j.find(tag);
  if (at == std::string::npos) return "";
  at += tag.size();
  if (j[at] == '"') {
    const std::size_t end = j.find('"', at + 1);
    return end == std::string::npos ? "" : j.substr(at + 1, end - at - 1);
  }
  std::size_t end = at;
  while (end < j.size() && j[end] != ',' && j[end] != '}') ++end;
  return j.substr(at, end - at);
}

// One cache file used by processes of two architectures (issue 33): an arm64 process (this test,
// under qemu) and an x86-64 one (the main build's weightcache-ggml, which the host runs natively)
// each repack every weight the other wrote and serve only their own, with their stock bytes and
// outputs. Runs in the arm64 run of scripts/test, where WEIGHTCACHE_TEST_FOREIGN_GGML_TOOL names
// the x86-64 tool; skipped elsewhere, saying so.
TEST(GgmlCrossArchitecture, ACacheWrittenOnAnotherArchitectureIsNeverServedToThisOne) {
#ifndef WEIGHTCACHE_TEST_FOREIGN_GGML_TOOL
  GTEST_SKIP() << "no weightcache-ggml of another architecture in this build (the arm64 run of scripts/test "
                  "passes the main build's x86-64 one)";
#else
  const std::string tool = WEIGHTCACHE_TEST_FOREIGN_GGML_TOOL;
  if (::access(tool.c_str(), X_OK) != 0) GTEST_SKIP() << tool << " is not there (build the main configuration first)";
  // Q4_0: KleidiAI's on arm64 with it, CPU_REPACK's 8x8 on x86-64 with AVX2. IQ4_NL: CPU_REPACK's on
  // both, 4x8 on arm64 and 8x8 on x86-64, under keys that differ by the CPU features alone.
  for (const char* type : {"q4_0", "iq4_nl"}) {
  SCOPED_TRACE(type);
  TempDir dir("wc-ggml-cross");
  const std::string model = dir.file("m.gguf"), ours = dir.file("ours.wcache"), theirs = dir.file("theirs.wcache"),
                    theirs_fresh = dir.file("fresh.wcache");
  // The other architecture's generator writes the model (a GGUF is the same on both), so that its
  // tool finds everything a llama-shaped model has.
  const std::string gen = tool.substr(0, tool.rfind('/') + 1) + "weightcache-gguf-gen";
  if (::access(gen.c_str(), X_OK) != 0) GTEST_SKIP() << gen << " is not there";
  ASSERT_NE(run_output("'" + gen + "' --out '" + model + "' --layers 2 --dim 256 --ffn 512 --type " + type + " 2>&1"), "");
  Loaded stock;
  std::string why;
  ASSERT_TRUE(load_in_process(model, stock_route(), &stock, &why)) << why;
  ASSERT_FALSE(stock.tensors.empty());
  // A load in this process from `cache`: its stats, its bytes checked against stock's.
  auto load_here = [&](const std::string& cache, wc_ggml_stats* st) {
    GgmlCache opened(cache);
    ASSERT_NE(opened.g, nullptr);
    Loaded mine;
    std::string w;
    EXPECT_TRUE(load_in_process(model, cached(opened.g), &mine, &w)) << w;
    EXPECT_TRUE(same_repacked(mine, stock)) << cache;
    wc_ggml_stats_init(st);
    EXPECT_EQ(wc_ggml_get_stats(opened.g, st), WC_OK);
    EXPECT_EQ(wc_ggml_finish(opened.g), WC_OK);
  };
  // This architecture writes `ours`.
  {
    wc_ggml_stats st;
    load_here(ours, &st);
    EXPECT_EQ(st.repacked, stock.tensors.size());
  }
  // The other architecture: a cold load of its own, then a load from `ours`, which must serve it
  // nothing and compute what its cold load computed. `theirs` it writes alone.
  const std::string run = "'" + tool + "' --model '" + model + "' --steps 1 --json --cache ";
  const std::string cold = run_output(run + "'" + theirs_fresh + "' 2>/dev/null");
  ASSERT_NE(json_field(cold, "checksum"), "") << "the other architecture's tool did not run: " << cold;
  std::printf("  the other architecture's process: cpu %s\n", json_field(cold, "cpu").c_str());
  const std::string on_ours = run_output(run + "'" + ours + "' 2>/dev/null");
  EXPECT_EQ(json_field(on_ours, "served_from_cache"), "0") << "served a repack written on this architecture: " << on_ours;
  EXPECT_EQ(json_field(on_ours, "repacked"), json_field(cold, "repacked")) << on_ours;
  EXPECT_EQ(json_field(on_ours, "checksum"), json_field(cold, "checksum")) << on_ours;
  const std::string writes = run_output(run + "'" + theirs + "' 2>/dev/null");
  ASSERT_NE(json_field(writes, "checksum"), "") << writes;
  // This architecture on `theirs` (only the other one's entries): repacks all, serves nothing.
  {
    wc_ggml_stats st;
    load_here(theirs, &st);
    EXPECT_EQ(st.served_from_cache, 0u) << "served a repack written on the other architecture";
    EXPECT_EQ(st.repacked, stock.tensors.size());
  }
  // And on `ours`, which now holds both: its own entries, every one served.
  {
    wc_ggml_stats st;
    load_here(ours, &st);
    EXPECT_EQ(st.served_from_cache, stock.tensors.size());
    EXPECT_EQ(st.repacked, 0u);
  }
  }
#endif
}


// A GGUF changed in place in the middle of a warm load (a pwrite into a later tensor's bytes after
// the first tensor is set): the tensors set after the change are keyed by the file as it is then,
// never served by the identity the load began with. (An identity examined once per load, which
// issue 30 tried to save two system calls per tensor, failed this; so did a second look at the
// end of the load, against a loader that maps each tensor apart: a hostile review's finding.)
TEST(GgmlBufferType, AGgufChangedInPlaceDuringAWarmLoadEndsWithItsNewBytes) {
  TempDir dir("wc-ggml-midload");
  const std::string model = dir.file("m.gguf");
  make_model(model, GGML_TYPE_Q4_0, 15);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // the identity trusted
  const std::string path = dir.file("c.wcache");
  std::string why;
  {
    TrustingCache cache(path);
    Loaded cold;
    ASSERT_TRUE(load_in_process(model, cached(cache.g), &cold, &why)) << why;
    ASSERT_EQ(wc_ggml_finish(cache.g), WC_OK);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // another timestamp tick
  TrustingCache cache(path);
  Loaded warm;
  MapHow how;
  struct stat st {};
  ASSERT_EQ(::stat(model.c_str(), &st), 0);
  how.after_set = [&](std::size_t i) {
    if (i != 0) return;
    // Flip one byte inside the last tensor (served by identity if the change went unseen).
    const int fd = ::open(model.c_str(), O_RDWR);
    std::uint8_t b = 0;
    const off_t at = static_cast<off_t>(st.st_size) - 1000;
    ASSERT_EQ(::pread(fd, &b, 1, at), 1);
    b ^= 0x5A;
    ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
    ::close(fd);
  };
  ASSERT_TRUE(load_in_process(model, cached(cache.g), &warm, &why, how)) << why;
  Loaded stock;
  ASSERT_TRUE(load_in_process(model, stock_route(), &stock, &why)) << why;
  EXPECT_TRUE(same_repacked(warm, stock)) << "a tensor kept the repack of the file's earlier bytes";
  const wc_ggml_stats s = cache.stats();
  EXPECT_EQ(s.tensors, warm.tensors.size());
  EXPECT_GE(s.repacked, 1u) << "the changed tensor was not repacked";
  EXPECT_EQ(s.served_from_cache + s.repacked, s.tensors);
}

// A hostile review's finding: a loader that maps each tensor apart (a window over its bytes, unmapped
// once it is set) and a file changed in place between two of those windows. With the identity taken
// once per load, the later window was served the repack of the file's earlier bytes.
TEST(GgmlBufferType, ALoaderMappingEachTensorApartSeesAChangeBetweenTwoTensors) {
  TempDir dir("wc-ggml-windows");
  const std::string model = dir.file("m.gguf");
  make_model(model, GGML_TYPE_Q4_0, 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // the identity trusted
  const std::string path = dir.file("c.wcache");
  std::string why;
  auto load_windows = [&](TrustingCache& cache, bool mutate, Loaded* out) {
    ggml_context* meta = nullptr;
    gguf_init_params p{};
    p.no_alloc = true;
    p.ctx = &meta;
    gguf_context* g = gguf_init_from_file(model.c_str(), p);
    ASSERT_NE(g, nullptr);
    ggml_init_params ip{};
    ip.mem_size = ggml_tensor_overhead() * 256;
    ip.no_alloc = true;
    out->ctx = ggml_init(ip);
    // The tensors of one layout (the first tensor's): one buffer.
    std::vector<std::pair<ggml_tensor*, std::size_t>> src;
    ggml_backend_buffer_type_t layout = nullptr;
    for (std::int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
      ggml_tensor* t = ggml_get_tensor(meta, gguf_get_tensor_name(g, i));
      ggml_backend_buffer_type_t bt = wc_ggml_buffer_type_for(cache.g, t);
      if (bt == nullptr || (layout != nullptr && bt != layout)) continue;
      layout = bt;
      ggml_tensor* d = ggml_dup_tensor(out->ctx, t);
      ggml_set_name(d, t->name);
      src.emplace_back(d, gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i));
      out->tensors.push_back(d);
      out->sizes.push_back(ggml_backend_buft_get_alloc_size(bt, d));
    }
    ASSERT_GE(src.size(), 2u);
    out->buf = ggml_backend_alloc_ctx_tensors_from_buft(out->ctx, layout);
    ASSERT_NE(out->buf, nullptr);
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const int fd = ::open(model.c_str(), O_RDWR);
    for (std::size_t i = 0; i < src.size(); ++i) {
      const auto [t, at] = src[i];
      const std::size_t start = at / page * page, len = at + ggml_nbytes(t) - start;
      void* w = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
      ASSERT_NE(w, MAP_FAILED);
      ggml_backend_tensor_set(t, static_cast<char*>(w) + (at - start), 0, ggml_nbytes(t));
      ::munmap(w, len);
      if (mutate && i == 0) {
        // One byte of the last tensor, before its window is mapped.
        const off_t last = static_cast<off_t>(src.back().second + 100);
        std::uint8_t b = 0;
        ASSERT_EQ(::pread(fd, &b, 1, last), 1);
        b ^= 0x5A;
        ASSERT_EQ(::pwrite(fd, &b, 1, last), 1);
      }
    }
    ::close(fd);
    gguf_free(g);
    ggml_free(meta);
  };
  {
    TrustingCache cache(path);
    Loaded cold;
    load_windows(cache, false, &cold);
    ASSERT_EQ(wc_ggml_finish(cache.g), WC_OK);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  TrustingCache cache(path);
  Loaded warm;
  load_windows(cache, true, &warm);
  Loaded stock;
  ASSERT_TRUE(load_in_process(model, stock_route(), &stock, &why)) << why;
  EXPECT_TRUE(same_repacked(warm, stock, /*all=*/false))
      << "a window mapped after the change was served the earlier bytes' repack";
  EXPECT_GE(cache.stats().repacked, 1u);
}

// A hostile review's finding: a loader unmapped one GGUF and mapped another at the same address
// between two loads through one buffer type, and was served the first file's weights.
TEST(GgmlBufferType, AnotherFileMappedAtTheSameAddressIsNeverTakenForTheFirst) {
  TempDir dir("wc-ggml-remap");
  const std::string m1 = dir.file("a.gguf"), m2 = dir.file("b.gguf");
  make_model(m1, GGML_TYPE_Q4_0, 11);
  make_model(m2, GGML_TYPE_Q4_0, 12);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // both identities trusted
  TrustingCache cache(dir.file("c.wcache"));
  // One address for both: a range this test keeps reserved, each model mapped into it in turn.
  void* at = ::mmap(nullptr, 64 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(at, MAP_FAILED);
  std::string why;
  for (const std::string& model : {m1, m2, m1, m2}) {
    Loaded mine, stock;
    MapHow how;
    how.at = at;
    ASSERT_TRUE(load_in_process(model, cached(cache.g), &mine, &why, how)) << why;
    ASSERT_TRUE(load_in_process(model, stock_route(), &stock, &why)) << why;
    EXPECT_TRUE(same_repacked(mine, stock)) << model;
  }
  // And a new process's view (a fresh buffer type over the same file) agrees.
  for (const std::string& model : {m1, m2}) {
    TrustingCache again(dir.file("c.wcache"));
    Loaded mine, stock;
    ASSERT_TRUE(load_in_process(model, cached(again.g), &mine, &why)) << why;
    ASSERT_TRUE(load_in_process(model, stock_route(), &stock, &why)) << why;
    EXPECT_TRUE(same_repacked(mine, stock)) << model;
  }
  ::munmap(at, 64 << 20);
}

// A hostile review's finding: a private mapping the loader patched and then made read-only is
// not the file. Its bytes are repacked as given, never recorded as the file's, and its pages are
// never given back (they hold the only copy of the patch).
TEST(GgmlBufferType, APatchedPrivateMappingIsNeitherTheFileNorDropped) {
  TempDir dir("wc-ggml-private");
  const std::string model = dir.file("m.gguf");
  make_model(model, GGML_TYPE_Q4_0, 13);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const std::string path = dir.file("c.wcache");
  std::string why;
  {
    TrustingCache cache(path);
    Loaded patched, stock_patched;
    MapHow how;
    how.shared = false;
    how.patch_at = 4096 + 100;  // inside the first tensor, off its first page
    how.keep_mapped = true;
    ASSERT_TRUE(load_in_process(model, cached(cache.g), &patched, &why, how)) << why;
    // The patch is still in the loader's copy.
    std::uint8_t file_byte = 0;
    const int fd = ::open(model.c_str(), O_RDONLY);
    ASSERT_EQ(::pread(fd, &file_byte, 1, static_cast<off_t>(patched.data_offset + how.patch_at)), 1);
    ::close(fd);
    EXPECT_EQ(patched.map[patched.data_offset + how.patch_at], static_cast<std::uint8_t>(file_byte ^ 0x77))
        << "the patched private page was dropped";
    how.keep_mapped = false;
    ASSERT_TRUE(load_in_process(model, stock_route(), &stock_patched, &why, how)) << why;
    EXPECT_TRUE(same_repacked(patched, stock_patched)) << "the patched load was not served its own bytes";
  }
  // The file itself, through a shared mapping in a new buffer type: the file's weights.
  TrustingCache cache(path);
  Loaded mine, stock;
  ASSERT_TRUE(load_in_process(model, cached(cache.g), &mine, &why)) << why;
  ASSERT_TRUE(load_in_process(model, stock_route(), &stock, &why)) << why;
  EXPECT_TRUE(same_repacked(mine, stock)) << "the patched bytes were served as the file's";
}

// A hostile review's finding: a young GGUF (its identity not trusted yet) changed through a shared
// writable mapping while it loads, back and forth, got a repack of one state stored under the
// hash of the other. Now the bytes hashed and repacked are one private copy: every stored entry
// matches its key, so a pristine copy of the file's final state loads its own weights.
TEST(GgmlBufferType, AGgufChangedThroughASharedMappingWhileLoadingNeverPoisonsTheCache) {
#if WC_TEST_TSAN
  GTEST_SKIP() << "races on purpose (a writer stores into the file's pages while they load): TSan would report it";
#endif
  TempDir dir("wc-ggml-aba");
  const std::string model = dir.file("m.gguf"), pristine = dir.file("pristine.gguf");
  make_model(model, GGML_TYPE_Q4_0, 14);
  make_model(pristine, GGML_TYPE_Q4_0, 14);
  const int fd = ::open(model.c_str(), O_RDWR);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  auto* w = static_cast<volatile std::uint8_t*>(::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ::close(fd);
  ASSERT_NE(w, MAP_FAILED);
  const std::size_t byte = static_cast<std::size_t>(st.st_size) - 4096;  // inside the last tensor
  const std::uint8_t original = w[byte];
  // The writer stores through a shared mapping on another thread (a thread, not a process: the
  // interleaving is then tight enough to show the old flaw within a dozen loads).
  std::atomic<bool> stop{false};
  std::thread toggler([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      w[byte] = static_cast<std::uint8_t>(original ^ 0xFF);
      w[byte] = original;
    }
  });
  std::string why;
  for (int i = 0; i < 12; ++i) {
    TrustingCache cache(dir.file("c" + std::to_string(i) + ".wcache"));
    Loaded l;
    ASSERT_TRUE(load_in_process(model, cached(cache.g), &l, &why)) << why;
  }
  stop = true;
  toggler.join();
  w[byte] = original;
  ::munmap(const_cast<std::uint8_t*>(w), st.st_size);
  Loaded stock;
  ASSERT_TRUE(load_in_process(pristine, stock_route(), &stock, &why)) << why;
  for (int i = 0; i < 12; ++i) {
    TrustingCache cache(dir.file("c" + std::to_string(i) + ".wcache"));
    Loaded mine;
    ASSERT_TRUE(load_in_process(pristine, cached(cache.g), &mine, &why)) << why;
    EXPECT_TRUE(same_repacked(mine, stock)) << "cache " << i << " serves a repack stored under another state's key";
  }
}

TEST(GgmlBufferType, RefusesBadArgumentsAndTensorsItCannotRepack) {
  wc_ggml* g = reinterpret_cast<wc_ggml*>(1);
  EXPECT_EQ(wc_ggml_create(nullptr, nullptr, &g), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(g, nullptr);
  EXPECT_STRNE(wc_ggml_last_error(), "");
  wc_options o;
  wc_options_init(&o);
  o.path = ":memory:";
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  wc_ggml_options go;
  wc_ggml_options_init(&go);
  go.identity_window_ms = -1;
  EXPECT_EQ(wc_ggml_create(c, &go, &g), WC_ERR_INVALID_ARGUMENT);
  go.identity_window_ms = 86'400'001;
  EXPECT_EQ(wc_ggml_create(c, &go, &g), WC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(wc_ggml_check_abi(), WC_OK) << wc_ggml_last_error();
  ASSERT_EQ(wc_ggml_create(c, nullptr, &g), WC_OK) << wc_ggml_last_error();
  // An f32 tensor and a Q4_0 one whose ne[1] is not a multiple of 8 are not repacked: refused.
  ggml_init_params ip{};
  ip.mem_size = ggml_tensor_overhead() * 6;
  ip.no_alloc = true;
  ggml_context* ctx = ggml_init(ip);
  ggml_tensor* f32 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 64);
  ggml_tensor* odd = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 64, 7);
  EXPECT_EQ(wc_ggml_would_repack(f32), 0);
  // CPU_REPACK interleaves rows in groups (of 4 or 8); KleidiAI packs any row count.
  ggml_backend_buffer_type_t odd_stock = wc_ggml_stock_buffer_type(odd);
  if (odd_stock != nullptr && std::strcmp(ggml_backend_buft_name(odd_stock), "CPU_KLEIDIAI") == 0)
    EXPECT_EQ(wc_ggml_would_repack(odd), 1);
  else
    EXPECT_EQ(wc_ggml_would_repack(odd), 0);
  EXPECT_EQ(wc_ggml_would_repack(nullptr), 0);
  // Shapes and types ggml's own stand-in operations would assert on (a hostile review's finding:
  // a zero-width Q4_0 matrix aborted the process): no layout, never an abort.
  ggml_tensor* zero = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 0, 8);
  EXPECT_EQ(wc_ggml_would_repack(zero), 0);
  EXPECT_EQ(wc_ggml_stock_buffer_type(zero), nullptr);
  EXPECT_EQ(wc_ggml_buffer_type_for(g, zero), nullptr);
  ggml_tensor bogus = *odd;
  bogus.type = static_cast<ggml_type>(GGML_TYPE_COUNT + 3);
  EXPECT_EQ(wc_ggml_would_repack(&bogus), 0);
  bogus = *odd;
  bogus.ne[0] = 50;  // not a whole number of Q4_0 blocks
  EXPECT_EQ(wc_ggml_stock_buffer_type(&bogus), nullptr);
  EXPECT_EQ(ggml_backend_alloc_ctx_tensors_from_buft(ctx, wc_ggml_buffer_type(g)), nullptr)
      << "a tensor CPU_REPACK would not repack was given a place";
  ggml_free(ctx);
  wc_ggml_stats s;
  wc_ggml_stats_init(&s);
  s.struct_size = 3;
  EXPECT_EQ(wc_ggml_get_stats(g, &s), WC_ERR_INVALID_ARGUMENT);
  wc_ggml_destroy(g);
  wc_close(c);
}

}  // namespace
