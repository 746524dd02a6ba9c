/*
 * weightcache for ONNX Runtime: a plugin execution provider whose packed weights live in a
 * weightcache file, shared by every session, process and launch.
 *
 * Part of weightcache 0.1 (not yet stable: see weightcache.h). The provider is the shared library
 * libweightcache_ort_ep.so (weightcache_ort_ep.dll on Windows), installed beside libweightcache.
 * ONNX Runtime loads it at run time; an application needs none of this header to use it:
 *
 *   OrtEnv* env;  api->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "app", &env);
 *   api->RegisterExecutionProviderLibrary(env, "WeightCache", "/usr/lib/libweightcache_ort_ep.so");
 *   const OrtEpDevice* const* devices; size_t n;  api->GetEpDevices(env, &devices, &n);
 *   // pick the device whose EpDevice_EpName is "WeightCache"
 *   const char* keys[] = {"cache_path"};  const char* values[] = {"/var/cache/app/model.wcache"};
 *   api->SessionOptionsAppendExecutionProvider_V2(options, env, &device, 1, keys, values, 1);
 *   api->CreateSession(env, "model.onnx", options, &session);
 *
 * The library path must be absolute (ONNX Runtime resolves a relative one against its own
 * directory). pkg-config gives it: `pkg-config --variable=ort_ep weightcache`; CMake's package
 * sets WEIGHTCACHE_ORT_EP_LIBRARY. docs/INTEGRATION.md, "ONNX Runtime", has a whole host program.
 *
 * ---------------------------------------------------------------------------------------------
 * Options (the key/value pairs of SessionOptionsAppendExecutionProvider_V2)
 * ---------------------------------------------------------------------------------------------
 *   cache_path  the cache file. Default: <per-user cache directory>/weightcache/ort/<model>.wcache,
 *               where the directory is $XDG_CACHE_HOME or ~/.cache (%LOCALAPPDATA% on Windows) and
 *               <model> a digest of the model's path; a model loaded from bytes has no path and
 *               gets "unnamed-model". ":memory:" and "" are as in wc_options.path.
 *   compat_key  bytes appended to the provider's own compatibility key (its version, the
 *               XNNPACK build identifier and packing fingerprint, this CPU's features).
 *   verify      none | first_use | shared | open (wc_verify; default shared)
 *   backing     auto | file | heap (wc_backing; default auto)
 *   durability  none | async | full (wc_durability; default full)
 *   kernels     xnnpack | builtin (the provider's own packer and GEMM; default xnnpack when built
 *               with it)
 *   threads     compute threads per layer, 1 to 256 (default 1)
 *   lease_timeout_ms  how long a session waits for another process's writer lease (default 1000)
 *   weights_cache     on | off (off: XNNPACK packs into its own memory, the no-cache baseline)
 *   identity_window_ms  0 to 86400000 (default 0): a floor on how long ago an external data file's
 *               last change must be before its file identity stands in for hashing its bytes; 0
 *               leaves the file system's own change window (10 ms where change times have
 *               nanoseconds, 2 s where whole seconds; docs/DESIGN.md, "ONNX Runtime keys")
 *   max_file_mb  1 to 262144: the most address space the cache file may take, in MiB
 *               (wc_options::max_file_bytes; default: the library's, 1/512 of what the process may
 *               reserve); weights past it are packed into heap memory. Sessions sharing a
 *               cache_path share one cache: the first to open it sets this
 *   prebuilt_dir  a read-only directory of caches built elsewhere, one per CPU profile
 *               (wc_options.prebuilt_dir; docs/DEPLOY.md): a file there written for this session's
 *               compatibility key is served read-only instead of cache_path, which is then never
 *               opened; with none, cache_path as without it. Default: none
 * An unknown key or value fails session creation with a message that names it and lists the
 * accepted values (ORT reports ORT_FAIL around the provider's INVALID_ARGUMENT).
 *
 * ---------------------------------------------------------------------------------------------
 * What it runs, and what never breaks a session
 * ---------------------------------------------------------------------------------------------
 * The provider claims MatMul with a constant 2-D B, Gemm with a constant B (transA 0),
 * com.microsoft MatMulNBits (4-bit), the 8-bit products com.microsoft DynamicQuantizeMatMul,
 * MatMulInteger scaled to float by Cast and Mul (what quantize_dynamic writes) and
 * com.microsoft MatMulIntegerToFloat (int8 weights), f32 Conv (with conv=on; the default on all
 * but x86-64), and the bias Add and the Relu or Gelu that follow them; docs/INTEGRATION.md says
 * exactly which forms. Everything else stays on ONNX Runtime's CPU provider, and its verbose log
 * names each weight-bearing node it left, with the reason. When the cache
 * cannot be opened, written or trusted (a path that cannot be created, a full disk, a corrupt or
 * foreign file, another process holding the writer lease), the session is still created and
 * computes the same outputs from heap memory; one warning through ONNX Runtime's logger says why.
 * While the provider is loaded, weightcache's own log goes through ONNX Runtime's logger.
 *
 * One cache per (cache path, compatibility key) per process is shared by every session the
 * provider's factory creates, on any thread. Each session's packed weights are finalized (made
 * durable) before CreateSession returns, so the next process finds every one of them.
 */
#ifndef WEIGHTCACHE_ONNXRUNTIME_H
#define WEIGHTCACHE_ONNXRUNTIME_H

#include <weightcache/weightcache.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The registration name and OrtEpFactory::GetName of the provider. */
#define WC_ORT_EP_NAME "WeightCache"

/**
 * What the provider did in this process since its library was loaded (all counters monotonic
 * except caches_open). Filled by wc_ort_ep_get_stats, an export of the provider library (look
 * it up with dlsym / GetProcAddress on the library ONNX Runtime loaded: dlopen the same absolute
 * path with RTLD_NOLOAD). Set struct_size with wc_ort_ep_stats_init first.
 */
typedef struct wc_ort_ep_stats {
  size_t struct_size;         /* set by wc_ort_ep_stats_init */
  uint64_t sessions;          /* OrtEp instances created (one per session) */
  uint64_t nodes;             /* nodes claimed (fused into the provider's partitions) */
  uint64_t weights;           /* packed weights a session needed (one per claimed weight use) */
  uint64_t packed;            /* of those, the ones packed in this process (cache misses) */
  uint64_t from_cache;        /* of those, the ones found already packed (no packing) */
  uint64_t packed_bytes;      /* bytes of packed weights this process packed (into the cache or
                                 heap memory; not counted when XNNPACK packed into its own) */
  uint64_t heap_weights;      /* weights a session holds in private heap memory, not a cache file
                                 (a heap cache, a heap fallback, or weights_cache=off) */
  uint64_t cache_failures;    /* caches that could not be opened as files, finalizes that failed */
  uint64_t caches_open;       /* distinct (path, compatibility key) caches open now; current */
  uint64_t xnnpack;           /* 1 when the library computes with XNNPACK, 0 with its own GEMM */
  uint64_t source_bytes_hashed; /* bytes of source weights read to key them: 0 for a warm session
                                   on external data whose file has not changed */
  uint64_t weight_nodes_seen;   /* nodes that bear a constant weight (MatMul, Gemm, Conv, their
                                   quantized and com.microsoft forms: the weight input is a
                                   constant initializer), in every graph and subgraph a session's
                                   provider was asked about; each counted once per session */
  uint64_t weight_nodes_taken;  /* of those, the ones the provider took (the rest run on other
                                   providers; at ONNX Runtime's verbose log level the provider
                                   says why, one line per node and session) */
} wc_ort_ep_stats;

/** Zeroes *stats and sets its struct_size. NULL is ignored. */
static inline void wc_ort_ep_stats_init(wc_ort_ep_stats* stats) {
  if (stats == NULL) return;
  size_t i;
  for (i = 0; i < sizeof(*stats); ++i) ((unsigned char*)stats)[i] = 0;
  stats->struct_size = sizeof(*stats);
}

/** The type of the provider library's export "wc_ort_ep_get_stats". Fills *out (no byte past
 * out->struct_size). Returns WC_OK, or WC_ERR_INVALID_ARGUMENT for NULL or an unset struct_size.
 * Thread-safe; never fails otherwise. */
typedef wc_status (*wc_ort_ep_get_stats_fn)(wc_ort_ep_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTCACHE_ONNXRUNTIME_H */
