/*
 * weightcache for XNNPACK: a weights-cache provider backed by a wc_cache.
 *
 * C ABI, part of weightcache 0.1 (not yet stable: see weightcache.h). No function throws, and
 * none aborts the host. The rules of weightcache.h (errors and wc_last_error, threads, the
 * memory a cache returns, offsets) hold here too, with the additions below.
 *
 * XNNPACK packs the static weights of fully-connected, convolution and similar operators through
 * a "weights cache provider" (struct xnn_weights_cache_provider in include/xnnpack.h; its handle
 * type xnn_weights_cache_t is simply a pointer to that struct). This adapter implements the
 * provider on top of a wc_cache, so packed weights land in the shared, file-mapped cache and the
 * next launch maps them instead of packing again.
 *
 * Typical use by a runtime that drives XNNPACK:
 *
 *   wc_cache* cache;  wc_open(&options, &cache);          // compat_key: see docs/INTEGRATION.md
 *   wc_xnn_adapter* adapter;  wc_xnn_adapter_create(cache, &adapter);  // one per runtime/session
 *   for (each static weight tensor t of the model)
 *     wc_xnn_adapter_name_buffer(adapter, t.data, t.name); // the tensor's name in the model file
 *   xnn_weights_cache_t wc = (xnn_weights_cache_t)wc_xnn_adapter_provider(adapter);
 *   xnn_create_runtime_v4(subgraph, wc, workspace, threadpool, flags, &runtime);
 *   wc_finalize(cache);                                   // BEFORE setting the runtime up
 *   xnn_reshape_runtime(runtime); xnn_setup_runtime_v2(runtime, ...); xnn_invoke_runtime(runtime);
 *   ...
 *   xnn_delete_runtime(runtime);                           // every runtime and operator first,
 *   wc_xnn_adapter_destroy(adapter);                       // then the adapter,
 *   wc_close(cache);                                       // then the cache.
 *
 * ---------------------------------------------------------------------------------------------
 * How XNNPACK calls the provider, and what that asks of the runtime
 * ---------------------------------------------------------------------------------------------
 * - Creating an operator (or each node of xnn_create_runtime_v*): look_up; on a miss
 *   reserve_space(n), XNNPACK zeroes and packs into the returned memory, then
 *   look_up_or_insert(key, that memory, n). On a hit nothing else is called. Operators keep the
 *   returned offset and call offset_to_addr at every reshape.
 * - Setting a runtime or operator up consults is_finalized and fails with
 *   xnn_status_invalid_state while it returns false. The provider's is_finalized answers for
 *   its adapter only: it is true when every entry this adapter's look_up_or_insert put into the
 *   cache (or found there, packed by another thread) has been through a wc_finalize of that
 *   cache that started after the entry was inserted (a wc_finalize through any handle sharing
 *   the cache, by any adapter or thread), or when the adapter put nothing there. Weights kept in
 *   the adapter's private heap (unnamed buffers) do not count: that memory never moves and there
 *   is nothing to make durable. So the runtime MUST call wc_finalize(cache) between creating
 *   operators/runtimes and setting them up, but another runtime's model loading into the same
 *   cache through another adapter does not stop this one's setup. Do NOT call XNNPACK's own
 *   xnn_finalize_weights_cache on this provider: it is only for XNNPACK's built-in cache.
 * - wc_is_finalized(cache) keeps its cache-wide meaning (nothing inserted by anyone since the
 *   last wc_finalize). An adapter that is not finalized implies a cache that is not, so
 *   "if (!wc_is_finalized(cache)) wc_finalize(cache);" is enough for every adapter.
 * - After a finalize, new weights still go look_up -> reserve_space -> look_up_or_insert:
 *   reserve keeps working, and the inserting adapter's is_finalized turns false again until the
 *   next wc_finalize.
 * - So give each runtime (each session, each model load) its own adapter over the shared cache:
 *   one adapter's is_finalized is false while any of its runtimes' new weights await a finalize,
 *   so runtimes sharing an adapter wait for each other's finalize.
 * - All provider functions may be called from many threads at once.
 *
 * ---------------------------------------------------------------------------------------------
 * Keys: names, not addresses
 * ---------------------------------------------------------------------------------------------
 * XNNPACK's look-up key is {seed, kernel pointer, bias pointer, fingerprint_id}. Pointers differ
 * from run to run, so the adapter turns each pointer into the name the runtime gave it with
 * wc_xnn_adapter_name_buffer. The cache key is length-prefixed (seed, fingerprint_id, kernel
 * name, bias name or "none"): no two different tuples share a key, whatever the names contain.
 * - A kernel (or a non-NULL bias) with no name cannot be persisted. Its packed weights are kept
 *   in a private heap owned by the adapter, keyed by address, for this process only; the first
 *   such buffer is logged (a warning, once per process, whatever the number of adapters) and
 *   all are counted in wc_xnn_adapter_stats. Naming every weight buffer avoids this.
 * - alias_data(alias, original) (XNNPACK calls it when it converts static weights, e.g. bf16 or
 *   fp16 to fp32, into a new buffer): a key whose kernel or bias is `alias` resolves to the
 *   name of `original`.
 * - The compatibility key of the wc_cache must name everything else the packed bytes depend
 *   on: the model file's identity, the XNNPACK version (its packers), and the CPU features it
 *   dispatches on (see docs/INTEGRATION.md); wc_xnn_compat_key builds one from XNNPACK's build
 *   identifier. The seed and fingerprint_id in every key separate the packing layouts within
 *   one XNNPACK build.
 *
 * ---------------------------------------------------------------------------------------------
 * Caveats
 * ---------------------------------------------------------------------------------------------
 * - The wc_cache must stay open while the adapter exists, and the adapter must outlive every
 *   XNNPACK operator and runtime created with its provider: packed weights served from the
 *   adapter's private heap (unnamed buffers) are freed by wc_xnn_adapter_destroy.
 * - Open the wc_cache with an alignment of at least XNNPACK's XNN_ALLOCATION_ALIGNMENT (64 on
 *   x86, 128 on Hexagon, 16 elsewhere); the default of 64 suits every CPU but Hexagon. The
 *   adapter's private heap always uses 128.
 * - Bindings (names and aliases) belong to the adapter: no other adapter sees them, and nothing
 *   outside the adapter keeps them (no process-wide table). Alias bindings must not outlive the
 *   runtime that made them (XNNPACK frees the converted buffer with the runtime, and the address
 *   may then hold other weights): with one adapter per runtime, destroying the adapter after the
 *   runtime drops its names and aliases together. An adapter shared by several runtimes keeps
 *   the aliases of runtimes already deleted until it is destroyed (the host does not know the
 *   converted buffers' addresses, so it cannot unbind them).
 * - Bindings are by address. When a buffer is freed and its address may be
 *   reused for other weights, unbind it first (wc_xnn_adapter_name_buffer(adapter, data, NULL));
 *   re-binding an address (a new name, or an alias) also drops whatever the adapter held for the
 *   old binding. A look-up carries no size, so stale bindings cannot be detected otherwise.
 * - reserve_space refuses (returns NULL, XNNPACK fails the operator creation cleanly) when the
 *   cache cannot provide memory. Once reserve_space succeeded, look_up_or_insert does not fail:
 *   if the cache cannot commit the entry, the bytes are copied to the adapter's private heap
 *   and the cache's reservation is released; wc_last_error on that thread then says why the
 *   cache refused them (the one call that sets it without failing). If that heap cannot
 *   take them, or memory runs out so that no table can, the bytes are served in place from
 *   their reservation (kept, uncached, not shared, until the cache closes; a file reservation
 *   kept so holds the writer lease until then), logged as an error. reserve_space sets aside the
 *   room to keep its reservation so before it returns it (it refuses when there is no memory for
 *   that, or when an adapter keeps 65536 weights so already): look_up_or_insert with memory from
 *   a successful reserve_space never returns SIZE_MAX, which XNNPACK does not check.
 *
 * ---------------------------------------------------------------------------------------------
 * Lifetimes and threads
 * ---------------------------------------------------------------------------------------------
 * - The adapter uses the very wc_cache handle it was created with (it does not own it): keep
 *   that handle open until wc_xnn_adapter_destroy returns.
 * - Memory the provider returns (reserve_space, offset_to_addr) is the cache's, valid until the
 *   cache is closed, or, for weights kept in the adapter's private heap, the adapter's, valid
 *   until wc_xnn_adapter_destroy: so valid until the earlier of the two. It may not be modified
 *   once inserted (see "Memory the cache returns" in weightcache.h).
 * - Every function here and every provider function may run concurrently with any other on the
 *   same or another adapter, except wc_xnn_adapter_destroy, which must not run concurrently
 *   with, nor be followed by, any other use of that adapter or its provider.
 * - When a provider function fails (reserve_space NULL, look_up_or_insert SIZE_MAX), wc_last_error
 *   on that thread says why. A miss of look_up is not a failure.
 */
#ifndef WEIGHTCACHE_XNNPACK_H
#define WEIGHTCACHE_XNNPACK_H

#include <weightcache/weightcache.h>

#include <stddef.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Mirror types of XNNPACK's include/xnnpack.h (same layout, our own names) ------------- */

/** The values of XNNPACK's `enum xnn_status` that the provider returns (an int-sized enum). */
typedef enum wc_xnn_status {
  WC_XNN_STATUS_SUCCESS = 0,           /* xnn_status_success */
  WC_XNN_STATUS_INVALID_PARAMETER = 2, /* xnn_status_invalid_parameter */
  WC_XNN_STATUS_INVALID_STATE = 3,     /* xnn_status_invalid_state */
  WC_XNN_STATUS_OUT_OF_MEMORY = 6      /* xnn_status_out_of_memory */
} wc_xnn_status;

/** Laid out exactly as `struct xnn_weights_cache_look_up_key`. */
typedef struct wc_xnn_weights_cache_look_up_key {
  uint32_t seed;           /* identifies the micro-kernel and its packing parameters */
  const void* kernel;      /* the original (unpacked) weights */
  const void* bias;        /* the original bias, or NULL */
  uint32_t fingerprint_id; /* identifies the packing layout */
} wc_xnn_weights_cache_look_up_key;

/**
 * Laid out exactly as `struct xnn_weights_cache_provider` of current XNNPACK (alias_data is its
 * newest, last member; an XNNPACK that predates it reads only the members before it, at the
 * same offsets). wc_xnn_adapter_provider returns one of these, filled in; never modify it.
 */
typedef struct wc_xnn_weights_cache_provider {
  void* context;
  /** Offset of the packed weights for the key, or SIZE_MAX on a miss (also for a NULL key). */
  size_t (*look_up)(void* context, const wc_xnn_weights_cache_look_up_key* cache_key);
  /** At least n writable bytes to pack into (inside the cache file when it is file-backed; in
   * the adapter's private heap after a look-up whose kernel or bias had no name), aligned to the
   * cache's alignment (128 in the private heap); NULL when no memory can be had. */
  void* (*reserve_space)(void* context, size_t n);
  /** Commits `size` packed bytes at `ptr` under the key and returns their offset. ptr == NULL
   * behaves as look_up. Does not fail once reserve_space has succeeded (see "Caveats"); with a
   * NULL key it fails (SIZE_MAX, WC_ERR_INVALID_ARGUMENT in wc_last_error). */
  size_t (*look_up_or_insert)(void* context, const wc_xnn_weights_cache_look_up_key* cache_key, void* ptr,
                              size_t size);
  /** This adapter's finalization, not the whole cache's: false while an entry this adapter's
   * look_up_or_insert put into (or found in) the cache has not been through a wc_finalize of the
   * cache that started after the entry's insert (a wc_finalize through any handle sharing the
   * cache counts); true when the adapter put nothing there. Its private heap does not count. */
  bool (*is_finalized)(void* context);
  /** Address of the packed weights at an offset from look_up / look_up_or_insert (an entry
   * replaced since under its key included: XNNPACK cannot take a NULL); NULL for SIZE_MAX and
   * for an offset that is no entry's. Sets no error. */
  void* (*offset_to_addr)(void* context, size_t offset);
  /** Returns success and does nothing: the cache and adapter belong to the runtime, which
   * releases them with wc_xnn_adapter_destroy and wc_close. */
  wc_xnn_status (*delete_cache)(void* context);
  /** Records that `alias` holds a conversion of `original` (see the file comment). Returns
   * invalid_parameter when either pointer is NULL, out_of_memory when it cannot be recorded. */
  wc_xnn_status (*alias_data)(void* context, void* alias, void* original);
} wc_xnn_weights_cache_provider;

/* ---- The adapter ------------------------------------------------------------------------------ */

/** Opaque adapter handle, from wc_xnn_adapter_create, released by wc_xnn_adapter_destroy. */
typedef struct wc_xnn_adapter wc_xnn_adapter;

/**
 * Creates an adapter over `cache` (that very handle must stay open until
 * wc_xnn_adapter_destroy) and stores it in *out; on failure *out is NULL (when out is not
 * NULL). Several adapters may share one cache; each has its own bindings, private heap and
 * finalization (the provider's is_finalized). Use one adapter per runtime (or per session):
 * see "How XNNPACK calls the provider".
 * Statuses: WC_OK, WC_ERR_INVALID_ARGUMENT (NULL cache or out), WC_ERR_NO_MEMORY.
 */
WC_API wc_status wc_xnn_adapter_create(wc_cache* cache, wc_xnn_adapter** out);

/**
 * Destroys the adapter, its provider struct, its bindings (names and aliases) and its private
 * heap (memory the provider returned from there becomes invalid). Call it only after every XNNPACK operator and runtime created
 * with its provider has been deleted; the cache itself is not closed, and what the adapter put
 * there stays. NULL is ignored. Not to be called concurrently with any other call on the same
 * adapter or its provider.
 */
WC_API void wc_xnn_adapter_destroy(wc_xnn_adapter* adapter);

/**
 * Gives a weight buffer the runtime hands to XNNPACK a stable name (e.g. the tensor's name in
 * the model file). Keys are built from names, never from addresses, so they hold across runs.
 * Name the bias buffers too: a key whose bias has no name is not persisted.
 * - name: 1 to 2000 bytes, NUL-terminated, any bytes otherwise. The same name may be given to
 *   several buffers that hold the same weights (e.g. one model loaded twice).
 * - Naming an already-bound address replaces its binding (name or alias).
 * - name == NULL unbinds `data`: do this before the buffer is freed if its address may be
 *   reused for other weights while the adapter lives.
 * The name is copied; `data` is used as an address only, never read. Statuses: WC_OK,
 * WC_ERR_INVALID_ARGUMENT (NULL adapter or data, empty or too long name: nothing changes),
 * WC_ERR_NO_MEMORY.
 */
WC_API wc_status wc_xnn_adapter_name_buffer(wc_xnn_adapter* adapter, const void* data, const char* name);

/**
 * A struct laid out exactly as XNNPACK's `struct xnn_weights_cache_provider`: pass it where
 * XNNPACK takes an xnn_weights_cache_t (`(xnn_weights_cache_t)wc_xnn_adapter_provider(a)`).
 * It points at a wc_xnn_weights_cache_provider owned by the adapter (the same one at every
 * call), valid until wc_xnn_adapter_destroy. NULL for a NULL adapter.
 */
WC_API void* wc_xnn_adapter_provider(wc_xnn_adapter* adapter);

/** What the adapter has done since it was created (counters are monotonic unless noted). Set
 * struct_size with wc_xnn_adapter_stats_init; wc_xnn_adapter_get_stats writes no byte past it. */
typedef struct wc_xnn_adapter_stats {
  size_t struct_size;         /* set by wc_xnn_adapter_stats_init */
  uint64_t look_ups;          /* look_up calls, and look_up_or_insert calls with ptr == NULL */
  uint64_t hits;              /* of those, the ones that found packed weights */
  uint64_t reservations;      /* reserve_space calls that returned memory */
  uint64_t reserve_failures;  /* reserve_space calls that returned NULL */
  uint64_t inserts;           /* look_up_or_insert calls with packed bytes */
  uint64_t named_buffers;     /* addresses currently bound to a name */
  uint64_t aliases;           /* addresses currently bound as an alias (alias_data) */
  uint64_t unnamed_entries;   /* live entries of the private heap (not persisted); current */
  uint64_t unnamed_inserts;   /* inserts that went to the private heap because a buffer had no
                                 name (or, rarely, because the cache could not commit them) */
  uint64_t unnamed_bytes;     /* heap bytes held by the private heap's live entries; current */
  uint64_t reserved_bytes;    /* bytes of the reserve_space calls that returned memory */
} wc_xnn_adapter_stats;

/** Zeroes *stats and sets stats->struct_size; call before wc_xnn_adapter_get_stats. NULL is
 * ignored. */
WC_API void wc_xnn_adapter_stats_init(wc_xnn_adapter_stats* stats);

/** Fills *out (struct_size set by wc_xnn_adapter_stats_init). Statuses: WC_OK,
 * WC_ERR_INVALID_ARGUMENT (NULL adapter or out, struct_size not set: *out is left untouched). */
WC_API wc_status wc_xnn_adapter_get_stats(wc_xnn_adapter* adapter, wc_xnn_adapter_stats* out);

/* ---- The compatibility key ------------------------------------------------------------------ */

/** Longest part wc_xnn_compat_key accepts (each of the three), in bytes. */
#define WC_XNN_COMPAT_PART_MAX_SIZE 4096
/** Size of a key made from parts of these sizes: a 5-byte header and a 4-byte length per part. */
#define WC_XNN_COMPAT_KEY_SIZE(build_id_size, model_digest_size, options_size) \
  (5 + 12 + (size_t)(build_id_size) + (size_t)(model_digest_size) + (size_t)(options_size))
/** The largest key wc_xnn_compat_key writes: a buffer this big is always enough. */
#define WC_XNN_COMPAT_KEY_MAX_SIZE \
  WC_XNN_COMPAT_KEY_SIZE(WC_XNN_COMPAT_PART_MAX_SIZE, WC_XNN_COMPAT_PART_MAX_SIZE, WC_XNN_COMPAT_PART_MAX_SIZE)

/**
 * Builds the compatibility key (wc_options.compat_key) of a cache that holds weights packed by
 * XNNPACK, from everything the packed bytes depend on besides the per-entry key:
 * - build_id: the XNNPACK build identifier, i.e. the build_id_size =
 *   xnn_experimental_get_build_identifier_size() bytes at xnn_experimental_get_build_identifier_data().
 *   It changes whenever the build's micro-kernels or packing code change, so a file packed by
 *   another XNNPACK build gets another key and is never served (wc_open replaces it).
 * - model_digest: the model's identity, ideally a digest of its weights (any bytes).
 * - options: whatever else changes packing and is not in the entry keys, as bytes the caller
 *   chooses: the CPU features XNNPACK dispatched on (e.g. "avx512f+vnni"), runtime flags
 *   (XNN_FLAG_* such as fp16 inference), quantization mode. NULL with options_size 0 for none.
 * The key is the three parts, each length-prefixed (u32 little-endian) after a 5-byte header, so
 * no two different triples give the same key; equal inputs give equal bytes in every process.
 *
 * Output, as snprintf does it: the key is written to `out`, a buffer of `out_capacity` bytes
 * owned by the caller, and *out_size is set to its size, which is always
 * WC_XNN_COMPAT_KEY_SIZE(build_id_size, model_digest_size, options_size) and never more than
 * WC_XNN_COMPAT_KEY_MAX_SIZE. With out == NULL and out_capacity == 0 only *out_size is set (a
 * size query, WC_OK). The function keeps no pointer to any argument; wc_open copies the key too,
 * so the buffer may be reused once wc_open returns.
 *
 * Errors (nothing is written to `out` then): WC_ERR_INVALID_ARGUMENT when out_size is NULL;
 * when build_id or model_digest is NULL or empty, or options is NULL with a nonzero size; when
 * a part is longer than WC_XNN_COMPAT_PART_MAX_SIZE (*out_size is 0 in these cases); and when
 * out_capacity is smaller than the key (*out_size is then the size needed). wc_last_error says
 * which. Allocates nothing.
 */
WC_API wc_status wc_xnn_compat_key(const void* build_id, size_t build_id_size, const void* model_digest,
                                   size_t model_digest_size, const void* options, size_t options_size, void* out,
                                   size_t out_capacity, size_t* out_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTCACHE_XNNPACK_H */
