// weightcache-llama: llama-cli's core (load a GGUF, tokenize a prompt, decode greedily) on a real
// libllama, with llama.cpp's stock repacking, with the repacked weights from a weightcache file,
// or without repacking.
//
//   weightcache-llama --model FILE.gguf [--cache PATH | --no-repack] [--threads N]
//                     [--prompt TEXT] [--n-predict N] [--json] [--identity-window-ms MS]
//                     [--durability none|async|full] [--max-file-mib N] [--hold-ms MS] [--no-mmap] [--keep-source-pages]
//
// --cache PATH: the weightcache front (weightcache/llama.h) over the cache file PATH; without it,
// stock llama.cpp (CPU_REPACK); --no-repack: llama_model_params.use_extra_bufts = false.
// The JSON line has the load time, memory after the load and after decoding, prompt and
// generation speed, the generated token ids, and checksums of the logits: `checksum` of the
// first decode step's (the prompt's last position), `checksum_all` of every step's.
// --hold-ms MS waits before measuring the mappings' memory and again before exiting, so several
// processes started together each measure while all of them have the files mapped.
#include <weightcache/llama.h>
#include <weightcache/weightcache.h>

#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../common/command_line.hpp"
#include "../common/proc_usage.hpp"
#include "../common/repack_options.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

using Clock = std::chrono::steady_clock;
using weightcache::example::file_usage;
using weightcache::example::status_kib;

constexpr const char* kUsage =
    "usage: weightcache-llama --model FILE.gguf [--cache PATH | --no-repack] [--threads N] [--prompt TEXT]\n"
    "  [--n-predict N] [--json] [--identity-window-ms MS] [--durability none|async|full] [--max-file-mib N] [--hold-ms MS]\n"
    "  [--no-mmap] [--keep-source-pages]\n"
    "  [--prebuilt-dir DIR] [--cpu-compat-key]\n";

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "weightcache-llama: %s\n", why.c_str());
  std::exit(1);
}

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}


}  // namespace

// ggml's own limit (GGML_MAX_N_THREADS); 100,000 threads crashed inside its thread pool.
constexpr int kMaxThreads = 512;

int main(int argc, char** argv) {
  std::string model_path, prompt = "Once upon a time, in a land far away,";
  bool json = false, no_mmap = false, keep_source_pages = false;
  int threads = static_cast<int>(std::max(1u, std::min(4u, std::thread::hardware_concurrency())));
  int n_predict = 16;
  long long hold_ms = 0;
  weightcache::example::RepackOptions repack;
  weightcache::example::CommandLine cl(argc, argv, "weightcache-llama", kUsage);
  while (cl.next()) {
    if (cl.take("--model", model_path) || repack.take(cl) || cl.take("--threads", threads, 1, kMaxThreads) ||
        cl.take("--prompt", prompt) || cl.take("--n-predict", n_predict, 0) || cl.flag("--json", json) ||
        cl.flag("--no-mmap", no_mmap) || cl.flag("--keep-source-pages", keep_source_pages) ||
        cl.take("--hold-ms", hold_ms, 0))
      continue;
    cl.unknown();
  }
  cl.require("--model", model_path);
  repack.check(cl);
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_WARN || std::getenv("WEIGHTCACHE_LLAMA_VERBOSE") != nullptr) std::fputs(text, stderr);
  }, nullptr);
  llama_backend_init();

  const std::uint64_t anon_before = status_kib("RssAnon:");
  const auto t0 = Clock::now();
  llama_model_params mp = llama_model_default_params();
  mp.use_mmap = !no_mmap;
  if (repack.no_repack) mp.use_extra_bufts = false;
  mp.progress_callback = [](float, void*) { return true; };  // no progress dots on stderr
  wc_cache* cache = nullptr;
  wc_llama* wl = nullptr;
  std::size_t routed = 0;
  double params_ms = 0, open_ms = 0, create_ms = 0;
  // Where stock llama.cpp puts this model's repacked weights on this CPU (AMX, CPU_REPACK, ...), and
  // with the cache, what was routed and, when nothing was, why.
  wc_llama_routing routing;
  wc_llama_routing_init(&routing);
  if (repack.cached()) {
    wc_options o;
    wc_options_init(&o);
    repack.apply(&o, wc_ggml_compat_key());
    o.write_back_early = 0;  // the buffer type finalizes on its background thread once loaded
    if (wc_open(&o, &cache) != WC_OK) die(std::string("cannot open the cache: ") + wc_last_error());
    open_ms = ms_since(t0);
    wc_ggml_options go;
    wc_ggml_options_init(&go);
    go.identity_window_ms = repack.identity_window_ms;
    if (keep_source_pages) go.drop_source_pages = 0;
    if (wc_llama_create(cache, &go, &wl) != WC_OK) die(std::string("wc_llama_create: ") + wc_ggml_last_error());
    create_ms = ms_since(t0) - open_ms;
    const auto tp = Clock::now();
    if (wc_llama_model_params_ex(wl, model_path.c_str(), &mp, &routing) != WC_OK)
      die(std::string("wc_llama_model_params: ") + wc_ggml_last_error());
    routed = routing.routed;
    params_ms = ms_since(tp);
  }
  // Stock and no-repack: the same report, outside the timed load.
  const auto t_load = Clock::now();
  if (!repack.cached()) {
    llama_model_params stock = llama_model_default_params();
    stock.use_mmap = mp.use_mmap;
    if (wc_llama_stock_routing(model_path.c_str(), &stock, &routing) != WC_OK)
      die(std::string("wc_llama_stock_routing: ") + wc_ggml_last_error());
  }
  const double report_ms = ms_since(t_load);
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (model == nullptr) die("llama.cpp could not load " + model_path);
  const double load_ms = ms_since(t0) - report_ms;
  const std::uint64_t anon_load = status_kib("RssAnon:"), file_load = status_kib("RssFile:");
  wc_stats cs;  // the cache's own view right after the load
  wc_stats_init(&cs);
  if (cache != nullptr) (void)wc_get_stats(cache, &cs);

  llama_context_params cp = llama_context_default_params();
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::vector<llama_token> toks(prompt.size() + 8);
  int n = llama_tokenize(vocab, prompt.c_str(), static_cast<int32_t>(prompt.size()), toks.data(),
                         static_cast<int32_t>(toks.size()), true, false);
  if (n < 0) die("cannot tokenize the prompt");
  toks.resize(static_cast<std::size_t>(n));
  cp.n_ctx = static_cast<uint32_t>(toks.size() + static_cast<std::size_t>(n_predict) + 8);
  cp.n_batch = std::max<uint32_t>(cp.n_ctx, 64);
  cp.n_ubatch = cp.n_batch;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) die("cannot create a llama context");
  const int n_vocab = llama_vocab_n_tokens(vocab);

  XXH3_state_t* all = XXH3_createState();
  XXH3_64bits_reset(all);
  std::uint64_t first = 0;
  std::vector<llama_token> generated;
  auto t1 = Clock::now();
  llama_batch batch = llama_batch_get_one(toks.data(), static_cast<int32_t>(toks.size()));
  if (llama_decode(ctx, batch) != 0) die("decoding the prompt failed");
  const double prompt_ms = ms_since(t1);
  t1 = Clock::now();
  llama_token next_tok = 0;
  for (int step = 0; step <= n_predict; ++step) {
    const float* logits = llama_get_logits_ith(ctx, -1);
    if (logits == nullptr) die("no logits");
    const std::size_t bytes = static_cast<std::size_t>(n_vocab) * sizeof(float);
    if (step == 0) first = XXH3_64bits(logits, bytes);
    XXH3_64bits_update(all, logits, bytes);
    if (step == n_predict) break;
    next_tok = static_cast<llama_token>(std::max_element(logits, logits + n_vocab) - logits);
    generated.push_back(next_tok);
    llama_batch one = llama_batch_get_one(&next_tok, 1);
    if (llama_decode(ctx, one) != 0) die("decoding failed");
  }
  const double gen_ms = ms_since(t1);
  const std::uint64_t checksum_all = XXH3_64bits_digest(all);
  XXH3_freeState(all);

  wc_status finished = WC_OK;
  wc_ggml_stats gs;
  wc_ggml_stats_init(&gs);
  if (wl != nullptr) {
    finished = wc_ggml_finish(wc_llama_ggml(wl));
    (void)wc_ggml_get_stats(wc_llama_ggml(wl), &gs);
  }
  if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  const std::string cache_file = weightcache::example::served_path(cache);  // a prebuilt file chosen from --prebuilt-dir, or --cache
  const auto cu = file_usage(cache_file), mu = file_usage(model_path);
  const std::uint64_t anon_end = status_kib("RssAnon:"), file_end = status_kib("RssFile:");
  if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  const char* mode = repack.mode();
  const double pp = toks.empty() ? 0 : static_cast<double>(toks.size()) / (prompt_ms / 1000.0);
  const double tg = n_predict == 0 ? 0 : static_cast<double>(n_predict) / (gen_ms / 1000.0);
  if (json) {
    std::string ids;
    for (llama_token t : generated) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    std::printf(
        "{\"mode\":\"%s\",\"model\":\"%s\",\"threads\":%d,\"prompt_tokens\":%zu,\"n_predict\":%d,"
        "\"load_ms\":%.3f,\"open_ms\":%.3f,\"create_ms\":%.3f,\"params_ms\":%.3f,\"rss_anon_bytes\":%llu,\"rss_file_bytes\":%llu,\"rss_anon_load_delta_bytes\":%llu,"
        "\"rss_anon_end_bytes\":%llu,\"rss_file_end_bytes\":%llu,\"routed\":%zu,\"repacked\":%llu,"
        "\"served_from_cache\":%llu,\"heap_fallbacks\":%llu,\"source_bytes_hashed\":%llu,\"source_bytes_dropped\":%llu,"
        "\"finish_status\":\"%s\",\"cache_rss_bytes\":%llu,\"cache_pss_bytes\":%llu,\"cache_private_dirty_bytes\":%llu,\"model_rss_bytes\":%llu,"
        "\"model_pss_bytes\":%llu,\"prompt_tok_s\":%.2f,\"gen_tok_s\":%.2f,\"tokens\":[%s],\"checksum\":\"%s\","
        "\"checksum_all\":\"%s\",\"cache_trusted_entries\":%llu,\"cache_verified_ahead\":%llu,"
        "\"stock_repacked\":%zu,\"stock_buffer_types\":\"%s\",\"why_none\":\"%s\",\"cpu\":\"%s\","
        "\"prebuilt\":%d,\"cache_file\":\"%s\"}\n",
        mode, weightcache::example::json_escape(model_path).c_str(), threads, toks.size(), n_predict, load_ms, open_ms, create_ms, params_ms,
        static_cast<unsigned long long>(anon_load) * 1024, static_cast<unsigned long long>(file_load) * 1024,
        static_cast<unsigned long long>(anon_load > anon_before ? anon_load - anon_before : 0) * 1024,
        static_cast<unsigned long long>(anon_end) * 1024, static_cast<unsigned long long>(file_end) * 1024, routed,
        static_cast<unsigned long long>(gs.repacked), static_cast<unsigned long long>(gs.served_from_cache),
        static_cast<unsigned long long>(gs.heap_fallbacks), static_cast<unsigned long long>(gs.source_bytes_hashed),
        static_cast<unsigned long long>(gs.source_bytes_dropped), wc_status_string(finished),
        static_cast<unsigned long long>(cu.rss) * 1024, static_cast<unsigned long long>(cu.pss) * 1024,
        static_cast<unsigned long long>(cu.private_dirty) * 1024, static_cast<unsigned long long>(mu.rss) * 1024, static_cast<unsigned long long>(mu.pss) * 1024, pp, tg,
        ids.c_str(), hex(first).c_str(), hex(checksum_all).c_str(), static_cast<unsigned long long>(cs.trusted_entries),
        static_cast<unsigned long long>(cs.verified_ahead), routing.stock_repacked,
        weightcache::example::json_escape(routing.stock_buffer_types).c_str(), weightcache::example::json_escape(routing.why_none).c_str(),
        weightcache::example::json_escape(weightcache::example::cpu_name()).c_str(), weightcache::example::is_prebuilt(cache) ? 1 : 0,
        weightcache::example::json_escape(cache_file).c_str());
  } else {
    std::printf("weightcache-llama (%s): %s\n", mode, model_path.c_str());
    std::printf("  load %.1f ms; private memory (RssAnon) %.1f MiB, file pages (RssFile) %.1f MiB after the load\n",
                load_ms, anon_load / 1024.0, file_load / 1024.0);
    std::printf("  on %s, stock llama.cpp repacks %zu weights of this model (%s)\n",
                weightcache::example::cpu_name().c_str(), routing.stock_repacked,
                routing.stock_buffer_types[0] != '\0' ? routing.stock_buffer_types : "none");
    if (wl != nullptr && routed > 0)
      std::printf("  %zu tensors routed to the cache: %llu repacked here, %llu served from the cache\n", routed,
                  static_cast<unsigned long long>(gs.repacked), static_cast<unsigned long long>(gs.served_from_cache));
    else if (wl != nullptr)
      std::printf("  nothing routed to the cache: %s\n", routing.why_none);
    std::printf("  prompt %zu tokens at %.1f tok/s; %d generated at %.1f tok/s; logits %s\n", toks.size(), pp,
                n_predict, tg, hex(checksum_all).c_str());
  }
  llama_free(ctx);
  llama_model_free(model);
  wc_llama_destroy(wl);
  if (cache != nullptr) wc_close(cache);
  llama_backend_free();
  return 0;
}
