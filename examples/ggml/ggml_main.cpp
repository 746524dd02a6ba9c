// weightcache-ggml: a llama-shaped ggml runtime, with ggml's stock CPU repacking, with the
// weightcache buffer type, or without repacking.
//
// It loads a llama-architecture GGUF (llama.cpp's tensor names and llama.* keys; no vocabulary
// needed) the way llama.cpp does: the file mapped, plain tensors used in place from the mapping,
// every tensor that ggml's CPU backend repacks put in a repacking buffer type and set with
// ggml_backend_tensor_set from the mapping. Then it runs --steps steps of a batch of 64 rows and of
// 1 row through the stack (per layer: RMS norm, the four attention projections with one
// single-head softmax attention over the batch, a residual, RMS norm, the gated SiLU MLP, a
// residual) and prints the load time, memory, throughput and a checksum of every output.
//
//   weightcache-ggml --model FILE.gguf [--cache PATH | --no-repack] [--threads N] [--steps N]
//                    [--json] [--identity-window-ms MS] [--durability none|async|full] [--max-file-mib N]
//                    [--early-write-back] [--finalize-sync] [--hold-ms MS]
//
// With --cache the load ends when every tensor is served, and the cache file becomes durable on
// the buffer type's background thread (durable_ms says when); --finalize-sync makes the load wait
// for it instead, and --early-write-back starts each tensor's write-back as it is inserted.
//
// --hold-ms MS waits before measuring the mappings' memory and again before exiting, so several
// processes started together each measure while all of them have the files mapped.
// --cache PATH: the weightcache buffer types over the cache file PATH; without it, ggml's own
// repacking buffer types in its CPU backend's order (AMX, KleidiAI, CPU_REPACK: stock); --no-repack:
// plain CPU buffers (llama.cpp's use_extra_bufts=false).
#include <weightcache/ggml.h>
#include <weightcache/weightcache.h>

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>
#include <gguf.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/command_line.hpp"
#include "../common/proc_usage.hpp"
#include "../common/repack_options.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: weightcache-ggml --model FILE.gguf [--cache PATH | --no-repack] [--threads N] [--steps N] [--json]\n"
    "  [--identity-window-ms MS] [--durability none|async|full] [--max-file-mib N] [--early-write-back] [--finalize-sync]\n"
    "  [--hold-ms MS]\n"
    "  [--prebuilt-dir DIR] [--cpu-compat-key]\n";

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "weightcache-ggml: %s\n", why.c_str());
  std::exit(1);
}

using weightcache::example::file_usage;
using weightcache::example::status_kib;
using weightcache::example::Usage;

struct Layer {
  ggml_tensor *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *gate, *up, *down;
};

struct Model {
  std::int64_t dim = 0, ffn = 0, layers = 0;
  float eps = 1e-5f;
  std::vector<Layer> blk;
  ggml_tensor* output_norm = nullptr;
};

ggml_tensor* rms(ggml_context* c, ggml_tensor* x, ggml_tensor* w, float eps) {
  return ggml_mul(c, ggml_rms_norm(c, x, eps), w);
}

// The stack over a batch of T rows: x [dim, T] -> [dim, T].
ggml_cgraph* build(ggml_context* c, const Model& m, std::int64_t T, ggml_tensor** input, ggml_tensor** output) {
  ggml_tensor* x = ggml_new_tensor_2d(c, GGML_TYPE_F32, m.dim, T);
  ggml_set_input(x);
  *input = x;
  for (const Layer& l : m.blk) {
    ggml_tensor* h = rms(c, x, l.attn_norm, m.eps);
    ggml_tensor* q = ggml_mul_mat(c, l.wq, h);
    ggml_tensor* k = ggml_mul_mat(c, l.wk, h);
    ggml_tensor* v = ggml_mul_mat(c, l.wv, h);
    const std::int64_t kv = k->ne[0];
    if (q->ne[0] != kv) q = ggml_cont(c, ggml_view_2d(c, q, kv, T, q->nb[1], 0));  // grouped KV: the first kv rows
    ggml_tensor* kq = ggml_soft_max_ext(c, ggml_mul_mat(c, k, q), nullptr, 1.0f / std::sqrt(static_cast<float>(kv)), 0.0f);
    ggml_tensor* a = ggml_mul_mat(c, ggml_cont(c, ggml_transpose(c, v)), kq);  // [kv, T]
    if (a->ne[0] != l.wo->ne[0]) a = ggml_pad(c, a, static_cast<int>(l.wo->ne[0] - a->ne[0]), 0, 0, 0);
    x = ggml_add(c, x, ggml_mul_mat(c, l.wo, a));
    ggml_tensor* h2 = rms(c, x, l.ffn_norm, m.eps);
    ggml_tensor* g = ggml_silu(c, ggml_mul_mat(c, l.gate, h2));
    x = ggml_add(c, x, ggml_mul_mat(c, l.down, ggml_mul(c, g, ggml_mul_mat(c, l.up, h2))));
  }
  if (m.output_norm != nullptr) x = rms(c, x, m.output_norm, m.eps);
  ggml_set_output(x);
  *output = x;
  ggml_cgraph* gf = ggml_new_graph_custom(c, 16384, false);
  ggml_build_forward_expand(gf, x);
  return gf;
}

void fill_input(std::vector<float>& v, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(static_cast<std::int64_t>(s % 2001) - 1000) / 1000.0f;
  }
}

}  // namespace

// ggml's own limit (GGML_MAX_N_THREADS); 100,000 threads crashed inside its thread pool.
constexpr int kMaxThreads = 512;

int main(int argc, char** argv) {
  std::string model_path;
  bool json = false;
  int threads = static_cast<int>(std::max(1u, std::min(4u, std::thread::hardware_concurrency())));
  int steps = 3;
  long long hold_ms = 0;
  weightcache::example::RepackOptions repack;
  bool early_write_back = false, finalize_sync = false;
  weightcache::example::CommandLine cl(argc, argv, "weightcache-ggml", kUsage);
  while (cl.next()) {
    if (cl.take("--model", model_path) || repack.take(cl) || cl.take("--threads", threads, 1, kMaxThreads) ||
        cl.take("--steps", steps, 1) || cl.flag("--json", json) || cl.take("--hold-ms", hold_ms, 0) ||
        cl.flag("--early-write-back", early_write_back) || cl.flag("--finalize-sync", finalize_sync))
      continue;
    cl.unknown();
  }
  cl.require("--model", model_path);
  repack.check(cl);
  ggml_log_set([](ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_WARN || std::getenv("WEIGHTCACHE_GGML_VERBOSE") != nullptr) std::fputs(text, stderr);
  }, nullptr);

  const std::uint64_t anon_before = status_kib("RssAnon:");
  const auto t0 = Clock::now();
  // The metadata, and the file mapped as llama.cpp maps it (read-only, shared; not prefetched).
  ggml_context* meta = nullptr;
  gguf_init_params gp{};
  gp.no_alloc = true;
  gp.ctx = &meta;
  gguf_context* gg = gguf_init_from_file(model_path.c_str(), gp);
  if (gg == nullptr) die("cannot read the GGUF " + model_path);
  const int fd = ::open(model_path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) die("cannot open " + model_path);
  auto* map = static_cast<std::uint8_t*>(::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0));
  if (map == MAP_FAILED) die("cannot map " + model_path);
  ::close(fd);
  const std::size_t data_at = gguf_get_data_offset(gg);

  auto key_u32 = [&](const char* k, std::int64_t fallback) -> std::int64_t {
    const std::int64_t id = gguf_find_key(gg, k);
    return id < 0 ? fallback : static_cast<std::int64_t>(gguf_get_val_u32(gg, id));
  };
  Model m;
  m.layers = key_u32("llama.block_count", -1);
  m.dim = key_u32("llama.embedding_length", -1);
  m.ffn = key_u32("llama.feed_forward_length", -1);
  if (m.layers < 1 || m.dim < 1) die(model_path + " is not a llama-architecture GGUF (no llama.block_count / embedding_length)");
  if (const std::int64_t id = gguf_find_key(gg, "llama.attention.layer_norm_rms_epsilon"); id >= 0)
    m.eps = gguf_get_val_f32(gg, id);

  ggml_backend_t cpu = ggml_backend_cpu_init();
  if (cpu == nullptr) die("no CPU backend");
  ggml_backend_cpu_set_n_threads(cpu, threads);

  // The cache and its buffer types (one per layout this CPU's ggml writes), or none.
  wc_cache* cache = nullptr;
  wc_ggml* wg = nullptr;
  if (repack.cached()) {
    wc_options o;
    wc_options_init(&o);
    repack.apply(&o, wc_ggml_compat_key());
    // The buffer type finalizes on a background thread once loading ends: a load that starts
    // write-back at every insert would only wait on the disk sooner (--early-write-back shows it).
    o.write_back_early = early_write_back ? 1 : 0;
    if (wc_open(&o, &cache) != WC_OK) die(std::string("cannot open the cache: ") + wc_last_error());
    wc_ggml_options go;
    wc_ggml_options_init(&go);
    go.identity_window_ms = repack.identity_window_ms;
    if (finalize_sync) go.finalize_when_loaded = 1;  // durable before the load returns
    if (wc_ggml_create(cache, &go, &wg) != WC_OK) die(std::string("wc_ggml_create: ") + wc_ggml_last_error());
  }

  // Weights: each that ggml's CPU backend repacks goes to the buffer type its order gives on this
  // CPU (AMX, KleidiAI, CPU_REPACK): stock, ggml's own; with the cache, the cache's for that layout
  // where it serves it (ggml's own where it does not). The rest are used in place from the mapping
  // (one CPU buffer over the data section, as llama.cpp does with mmap).
  const std::int64_t n = gguf_get_n_tensors(gg);
  ggml_init_params ip{};
  ip.mem_size = ggml_tensor_overhead() * static_cast<std::size_t>(n + 1);
  ip.no_alloc = true;
  ggml_context* wctx = ggml_init(ip);
  struct Group {
    ggml_backend_buffer_type_t buft = nullptr, stock = nullptr;
    ggml_context* ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    std::vector<std::pair<ggml_tensor*, const std::uint8_t*>> tensors;
  };
  std::vector<Group> groups;
  ggml_backend_buffer_t plain = ggml_backend_cpu_buffer_from_ptr(map + data_at, static_cast<std::size_t>(st.st_size) - data_at);
  std::vector<std::pair<ggml_tensor*, const std::uint8_t*>> to_set;
  std::uint64_t repacked_here = 0, not_served = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const char* name = gguf_get_tensor_name(gg, i);
    ggml_tensor* src = ggml_get_tensor(meta, name);
    const std::uint8_t* at = map + data_at + gguf_get_tensor_offset(gg, i);
    if (at + ggml_nbytes(src) > map + st.st_size) die(std::string("tensor ") + name + " runs past the end of the file");
    ggml_backend_buffer_type_t stock = repack.no_repack ? nullptr : wc_ggml_stock_buffer_type(src);
    ggml_backend_buffer_type_t buft = stock;
    if (wg != nullptr && stock != nullptr) {
      if (ggml_backend_buffer_type_t ours = wc_ggml_buffer_type_for(wg, src); ours != nullptr) buft = ours;
      else ++not_served;
    }
    if (buft == nullptr) {
      ggml_tensor* t = ggml_dup_tensor(wctx, src);
      ggml_set_name(t, name);
      if (ggml_backend_tensor_alloc(plain, t, const_cast<std::uint8_t*>(at)) != GGML_STATUS_SUCCESS)
        die(std::string("cannot place tensor ") + name);
      continue;
    }
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.buft == buft; });
    if (g == groups.end()) {
      Group x;
      x.buft = buft;
      x.stock = stock;
      x.ctx = ggml_init(ip);
      g = groups.insert(groups.end(), std::move(x));
    }
    ggml_tensor* t = ggml_dup_tensor(g->ctx, src);
    ggml_set_name(t, name);
    g->tensors.emplace_back(t, at);
    to_set.emplace_back(t, at);
  }
  std::string stock_bufts;  // "AMX=7,CPU_REPACK=9": where stock ggml puts the repacked weights
  for (Group& g : groups) {
    g.buf = ggml_backend_alloc_ctx_tensors_from_buft(g.ctx, g.buft);
    if (g.buf == nullptr) die(std::string("cannot allocate the ") + ggml_backend_buft_name(g.buft) + " buffer");
    ggml_backend_buffer_set_usage(g.buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (auto& [t, at] : g.tensors) ggml_backend_tensor_set(t, at, 0, ggml_nbytes(t));
    if (g.buft == g.stock) repacked_here += g.tensors.size();  // ggml's own: repacked in this process
  }
  for (const Group& g : groups) {
    std::size_t k = 0;
    for (const Group& h : groups) k += h.stock == g.stock ? h.tensors.size() : 0;
    const std::string item = std::string(ggml_backend_buft_name(g.stock)) + "=" + std::to_string(k);
    if (stock_bufts.find(item) == std::string::npos) stock_bufts += (stock_bufts.empty() ? "" : ",") + item;
  }
  if (wg != nullptr && to_set.empty())
    std::fprintf(stderr, "weightcache-ggml: nothing was cacheable here: ggml's CPU backend repacks none of this "
                         "model's weights on this CPU (%s)\n", weightcache::example::cpu_name().c_str());
  // The cache finalizes in the background from here (finalize_when_loaded's default): the load is
  // done, and the repacked tensors are served from the mapping while they are written back.
  const double load_ms = ms_since(t0);
  const std::uint64_t anon_after_load = status_kib("RssAnon:");

  auto find = [&](const std::string& name) -> ggml_tensor* {
    ggml_tensor* t = ggml_get_tensor(wctx, name.c_str());
    for (const Group& g : groups)
      if (t == nullptr) t = ggml_get_tensor(g.ctx, name.c_str());
    return t;
  };
  for (std::int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L{find(p + "attn_norm.weight"), find(p + "attn_q.weight"), find(p + "attn_k.weight"),
            find(p + "attn_v.weight"),    find(p + "attn_output.weight"), find(p + "ffn_norm.weight"),
            find(p + "ffn_gate.weight"),  find(p + "ffn_up.weight"), find(p + "ffn_down.weight")};
    for (ggml_tensor* t : {L.attn_norm, L.wq, L.wk, L.wv, L.wo, L.ffn_norm, L.gate, L.up, L.down})
      if (t == nullptr) die("layer " + std::to_string(l) + " lacks one of llama's tensors");
    m.blk.push_back(L);
  }
  m.output_norm = find("output_norm.weight");

  // Source pages of the repacked tensors still resident in the page cache (mincore).
  std::uint64_t resident = 0, source_pages = 0;
  {
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> vec;
    for (auto& [t, at] : to_set) {
      const auto a = reinterpret_cast<std::uintptr_t>(at) & ~(page - 1);
      const std::size_t len = reinterpret_cast<std::uintptr_t>(at) + ggml_nbytes(t) - a;
      vec.assign((len + page - 1) / page, 0);
      if (::mincore(reinterpret_cast<void*>(a), len, vec.data()) == 0)
        for (unsigned char c : vec) resident += c & 1;
      source_pages += vec.size();
    }
  }

  // Steps of a batch of 64 and of 1.
  XXH3_state_t* hs = XXH3_createState();
  XXH3_64bits_reset(hs);
  double tok_s[2] = {0, 0};
  const std::int64_t batches[2] = {64, 1};
  for (int bi = 0; bi < 2; ++bi) {
    const std::int64_t T = batches[bi];
    ggml_init_params gpi{};
    gpi.mem_size = ggml_tensor_overhead() * 16384 + ggml_graph_overhead_custom(16384, false);
    gpi.no_alloc = true;
    ggml_context* gctx = ggml_init(gpi);
    ggml_tensor *in = nullptr, *out = nullptr;
    ggml_cgraph* gf = build(gctx, m, T, &in, &out);
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(cpu));
    if (!ggml_gallocr_alloc_graph(ga, gf)) die("cannot allocate the compute graph");
    std::vector<float> x(static_cast<std::size_t>(m.dim * T)), y(x.size());
    double total = 0;
    for (int s = 0; s < steps; ++s) {
      fill_input(x, static_cast<std::uint64_t>(bi * 1000 + s));
      ggml_backend_tensor_set(in, x.data(), 0, x.size() * sizeof(float));
      const auto t1 = Clock::now();
      if (ggml_backend_graph_compute(cpu, gf) != GGML_STATUS_SUCCESS) die("graph compute failed");
      total += ms_since(t1);
      ggml_backend_tensor_get(out, y.data(), 0, y.size() * sizeof(float));
      XXH3_64bits_update(hs, y.data(), y.size() * sizeof(float));
    }
    tok_s[bi] = static_cast<double>(T * steps) / (total / 1000.0);
    ggml_gallocr_free(ga);
    ggml_free(gctx);
  }
  const std::uint64_t checksum = XXH3_64bits_digest(hs);
  // Durable: the background finalize done (it ran while the steps computed).
  wc_status finished = WC_OK;
  if (wg != nullptr) finished = wc_ggml_finish(wg);
  const double durable_ms = ms_since(t0);
  XXH3_freeState(hs);
  if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  const std::string cache_file = weightcache::example::served_path(cache);  // a prebuilt file chosen from --prebuilt-dir, or --cache
  const Usage cu = file_usage(cache_file), mu = file_usage(model_path);
  // --hold-ms: also after measuring, so processes started together all measure while all are mapped.
  if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  wc_ggml_stats gs;
  wc_ggml_stats_init(&gs);
  if (wg != nullptr) (void)wc_ggml_get_stats(wg, &gs);
  const char* mode = repack.mode();
  char sum[32];
  std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(checksum));
  if (json) {
    std::printf("{\"mode\":\"%s\",\"model\":\"%s\",\"layers\":%" PRId64 ",\"dim\":%" PRId64 ",\"threads\":%d,\"steps\":%d,"
                "\"load_ms\":%.3f,\"durable_ms\":%.3f,\"finish_status\":\"%s\",\"rss_anon_bytes\":%llu,\"rss_anon_load_bytes\":%llu,\"repacked\":%llu,"
                "\"served_from_cache\":%llu,\"heap_fallbacks\":%llu,\"source_bytes_hashed\":%llu,"
                "\"source_bytes_dropped\":%llu,\"repack_tensors\":%zu,\"source_pages\":%llu,\"source_pages_resident\":%llu,"
                "\"cache_rss_bytes\":%llu,\"cache_pss_bytes\":%llu,\"cache_private_dirty_bytes\":%llu,"
                "\"model_rss_bytes\":%llu,\"model_pss_bytes\":%llu,\"tok_s_batch64\":%.2f,\"tok_s_batch1\":%.2f,"
                "\"checksum\":\"%s\",\"stock_buffer_types\":\"%s\",\"not_served\":%llu,\"cpu\":\"%s\","
                "\"prebuilt\":%d,\"cache_file\":\"%s\"}\n",
                mode, model_path.c_str(), m.layers, m.dim, threads, steps, load_ms, durable_ms,
                wc_status_string(finished),
                static_cast<unsigned long long>(status_kib("RssAnon:")) * 1024,
                static_cast<unsigned long long>(anon_after_load > anon_before ? anon_after_load - anon_before : 0) * 1024,
                static_cast<unsigned long long>(wg != nullptr ? gs.repacked : repacked_here),
                static_cast<unsigned long long>(gs.served_from_cache), static_cast<unsigned long long>(gs.heap_fallbacks),
                static_cast<unsigned long long>(gs.source_bytes_hashed),
                static_cast<unsigned long long>(gs.source_bytes_dropped), to_set.size(),
                static_cast<unsigned long long>(source_pages), static_cast<unsigned long long>(resident),
                static_cast<unsigned long long>(cu.rss) * 1024, static_cast<unsigned long long>(cu.pss) * 1024,
                static_cast<unsigned long long>(cu.private_dirty) * 1024, static_cast<unsigned long long>(mu.rss) * 1024,
                static_cast<unsigned long long>(mu.pss) * 1024, tok_s[0], tok_s[1], sum, stock_bufts.c_str(),
                static_cast<unsigned long long>(not_served), weightcache::example::cpu_name().c_str(),
                weightcache::example::is_prebuilt(cache) ? 1 : 0, weightcache::example::json_escape(cache_file).c_str());
  } else {
    std::printf("weightcache-ggml (%s): %s, %" PRId64 " layers of %" PRId64 "\n", mode, model_path.c_str(), m.layers, m.dim);
    std::printf("  load %.1f ms; private memory (RssAnon) %.1f MiB; repacked %llu tensors, %llu from the cache\n", load_ms,
                status_kib("RssAnon:") / 1024.0, static_cast<unsigned long long>(wg != nullptr ? gs.repacked : repacked_here),
                static_cast<unsigned long long>(gs.served_from_cache));
    std::printf("  on %s, ggml repacks into %s\n", weightcache::example::cpu_name().c_str(),
                stock_bufts.empty() ? "nothing" : stock_bufts.c_str());
    std::printf("  batch 64: %.1f rows/s; batch 1: %.1f rows/s; checksum %s\n", tok_s[0], tok_s[1], sum);
  }
  for (Group& g : groups) {
    if (g.buf != nullptr) ggml_backend_buffer_free(g.buf);
    ggml_free(g.ctx);
  }
  ggml_backend_buffer_free(plain);
  ggml_free(wctx);
  wc_ggml_destroy(wg);
  if (cache != nullptr) wc_close(cache);
  ggml_backend_free(cpu);
  ::munmap(map, static_cast<std::size_t>(st.st_size));
  gguf_free(gg);
  ggml_free(meta);
  return 0;
}
