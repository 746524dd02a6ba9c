/*
 * weightcache for llama.cpp: libllama loads a GGUF model with the weights ggml's CPU backend
 * repacks (Q4_0, IQ4_NL, Q4_K, ...) served from a weightcache file instead of repacked into this
 * process's memory. No patch to llama.cpp: the front fills llama_model_params.tensor_buft_overrides
 * so that exactly the tensors llama.cpp would put in one of ggml's repacking buffer types that the
 * cache serves (AMX on CPUs with it, KleidiAI on arm64 builds with it, CPU_REPACK) go to the
 * cache's buffer type for that layout (weightcache/ggml.h) instead.
 *
 *   wc_cache* cache;                       // wc_open, as usual
 *   wc_llama* wl;
 *   wc_llama_create(cache, NULL, &wl);
 *   struct llama_model_params mp = llama_model_default_params();
 *   wc_llama_model_params(wl, path, &mp, NULL);   // keeps mp's own overrides, first
 *   struct llama_model* model = llama_model_load_from_file(path, mp);
 *   ...
 *   llama_model_free(model);
 *   wc_llama_destroy(wl);                  // after every model it routed is freed
 *   wc_close(cache);
 *
 * Which tensors: those of the GGUF (every file of a split model) that llama.cpp computes by a
 * matrix product (a 2-D weight) or the experts' product (a 3-D one; llama.cpp's tensor table gives
 * each kind of tensor its operation) and would put, trying its buffer types in its own order
 * (an accelerator's, a GPU's host buffer type, the CPU's AMX, KleidiAI, CPU_REPACK, plain memory)
 * and asking each through ggml's supports_op as llama.cpp does, in AMX or CPU_REPACK. Each goes to
 * the cache's buffer type of that layout: the bytes are ggml's own packing, computed by the kernels
 * stock llama.cpp runs. Not the ones
 * llama.cpp reads by row (token_embd, ...), scales, norms or convolves, nor a 3-D weight of a
 * plain product or the 2-D experts of a one-expert model: llama.cpp keeps those in plain memory.
 * A model with tied embeddings (no output.weight) uses token_embd as its output too: llama.cpp
 * repacks that copy itself, as without the cache.
 *
 * This library is compiled against the llama.cpp tree the application links (the ggml inside it,
 * whose internal buffer interface it fills): link libweightcache_llama built from that same tree,
 * instead of libweightcache_ggml (it holds the ggml buffer type too, and its wc_ggml_* calls).
 *
 * Errors never abort and never change outputs: a failing call leaves params with the application's
 * own entries only (stock llama.cpp repacking) and says why in wc_ggml_last_error().
 */
#ifndef WEIGHTCACHE_LLAMA_H
#define WEIGHTCACHE_LLAMA_H

#include <weightcache/ggml.h>

#include <llama.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The llama.cpp front over one cache. Opaque. */
typedef struct wc_llama wc_llama;

/**
 * Creates the front over `cache` (open until wc_llama_destroy), with a weightcache buffer type
 * made with `options` (NULL: defaults; see wc_ggml_options). Fails as wc_ggml_create does;
 * *out is NULL then.
 */
wc_status wc_llama_create(wc_cache* cache, const wc_ggml_options* options, wc_llama** out);

/**
 * Routes the repacked tensors of the GGUF at `gguf_path` (the first file of a split model) to
 * the cache: sets params->tensor_buft_overrides to a list that holds the application's own
 * entries first (they keep precedence: llama.cpp takes the first pattern that matches a tensor's
 * name), then a pattern generated from this model's tensor list that matches exactly the tensors
 * to route, by name. Entries an earlier call added (params used again, for this or another model,
 * through this or another front) are replaced, never kept as the application's. The list stays
 * valid for the life of the process (identical lists are handed out once). Load the model from
 * the same path, unchanged since: the pattern is exact for this tensor list (a tensor it catches
 * in a file replaced meanwhile that llama.cpp would not repack fails the load with a message; it
 * never reaches a kernel that cannot compute it). `routed` (may be NULL) gets how many tensors
 * go to the cache.
 *
 * Routes nothing (WC_OK, *routed 0; params keep the application's entries only) when llama.cpp
 * would put no CPU weight of this model in AMX, KleidiAI or CPU_REPACK: params->use_extra_bufts false,
 * params->vocab_only, a GPU's host buffer type that takes CPU weights first (a GPU device with
 * no_host false), a GPU device with params->n_gpu_layers not 0 (the front serves CPU weights
 * only), an accelerator or a buffer type the cache does not serve taking every one of
 * them, or no tensor of this model repacked on this CPU. The reason is logged once through ggml's
 * log, naming the buffer type: at info level for use_extra_bufts false and vocab_only (the
 * application turned repacking off), at warn level otherwise. When only some of the weights go to
 * a buffer type the cache does not serve, the others are routed and one warn line names it.
 * Fails with WC_ERR_INVALID_ARGUMENT (a NULL argument), WC_ERR_IO (a file of the model cannot be
 * read or parsed, or a split model's first file is not named PREFIX-00001-of-NNNNN.gguf),
 * WC_ERR_NO_MEMORY; params then keep the application's entries only (stock repacking).
 */
wc_status wc_llama_model_params(wc_llama* l, const char* gguf_path, struct llama_model_params* params,
                                size_t* routed);

/** What wc_llama_model_params_ex found (wc_llama_routing_init first). */
typedef struct wc_llama_routing {
  uint32_t struct_size;
  size_t routed;         /* tensors routed to the cache */
  size_t stock_repacked; /* tensors stock llama.cpp, with these params, puts in a buffer type other than
                            plain CPU memory (repacked, or an accelerator's) */
  /* Where stock llama.cpp puts those, per buffer type in its order, "NAME=COUNT" joined by ",":
   * "AMX=28,CPU_REPACK=4" on a CPU with AMX, "CPU_REPACK=32" on most others; "" when none. */
  char stock_buffer_types[256];
  /* When routed is 0: why (what was logged); otherwise "". */
  char why_none[512];
} wc_llama_routing;

void wc_llama_routing_init(wc_llama_routing* routing);

/** wc_llama_model_params, reporting into `routing` (may be NULL; otherwise set up by
 * wc_llama_routing_init, else WC_ERR_INVALID_ARGUMENT and params untouched). */
wc_status wc_llama_model_params_ex(wc_llama* l, const char* gguf_path, struct llama_model_params* params,
                                   wc_llama_routing* routing);

/** What stock llama.cpp does with the weights of the GGUF at `gguf_path` under `params`, on this CPU
 * and with the devices this process has registered, without a cache: `routing` gets
 * stock_repacked, stock_buffer_types and (when no weight would be repacked) why_none; routed is 0.
 * params are not changed; nothing is logged. Fails as wc_llama_model_params does (a NULL argument,
 * an unreadable GGUF). */
wc_status wc_llama_stock_routing(const char* gguf_path, const struct llama_model_params* params,
                                 wc_llama_routing* routing);

/** The buffer type underneath: wc_ggml_get_stats, wc_ggml_finish. Valid until wc_llama_destroy. */
wc_ggml* wc_llama_ggml(wc_llama* l);

/** Destroys the front and its buffer type (see wc_ggml_destroy: models loaded through it must be
 * freed first), and the override lists it wrote. The cache is not closed. NULL is ignored. */
void wc_llama_destroy(wc_llama* l);

#ifdef __cplusplus
}
#endif

#endif /* WEIGHTCACHE_LLAMA_H */
