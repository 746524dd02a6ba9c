/*
 * weightcache for ggml's CPU repacking (llama.cpp, whisper.cpp, stable-diffusion.cpp, ...).
 *
 * ggml's CPU backend repacks quantized weights (Q4_0, IQ4_NL, Q4_K, ...) into interleaved layouts
 * at every model load, into private heap memory of every process (its "CPU_REPACK" buffer type).
 * This header gives a ggml buffer type that does the same repacking once, into a weightcache file,
 * and serves the repacked bytes from that file's shared mapping to every later load, session and
 * process. A runtime uses it where it would use a CPU buffer type:
 *   - llama.cpp: one llama_model_params.tensor_buft_overrides entry per tensor that
 *     wc_ggml_would_repack() accepts (docs/INTEGRATION.md shows the lines);
 *   - any ggml program: ggml_backend_alloc_ctx_tensors_from_buft(ctx, wc_ggml_buffer_type(b))
 *     for a context holding such tensors, then ggml_backend_tensor_set from the GGUF as usual.
 *
 * This part of weightcache is compiled against the ggml tree the runtime is built with (it needs
 * ggml's internal buffer interface, ggml-backend-impl.h): link libweightcache_ggml built from
 * that same tree. wc_ggml_check_abi() says whether the ggml the process runs is that one.
 *
 * Keys (docs/DESIGN.md, "ggml keys"): a repacked tensor is stored under its content (XXH3-128 of
 * the GGUF bytes, type and shape), the repacked layout (ggml's version and build, the CPU features
 * its choice of layout depends on) and nothing else. A warm load does not read the tensor's bytes
 * to find that key again: a second, small entry maps the GGUF file's identity (device, inode,
 * size, mtime, ctime, the tensor's name and offset) to it, and is trusted only when the bytes
 * handed to set_tensor are that file's own pages at that offset, on a file system whose times
 * follow every store, and when the file's last change is older than identity_window_ms. Every
 * other load hashes the tensor's bytes. A changed GGUF therefore never reaches stale repacked
 * bytes: its identity moved, or its bytes are hashed.
 *
 * Errors never abort and never give wrong weights: a tensor the cache cannot take (full disk, an
 * unusable cache, no memory) is repacked into this process's memory, as stock ggml does, with one
 * warning on ggml's log (ggml_log_set routes it; llama.cpp's llama_log_set does too). Functions
 * that fail say why in wc_ggml_last_error().
 *
 * Threads: every function may be called from any thread; buffers of one buffer type may be
 * loaded from several threads at once (one tensor by one thread at a time, as ggml requires).
 */
#ifndef WEIGHTCACHE_GGML_H
#define WEIGHTCACHE_GGML_H

#include <weightcache/weightcache.h>

#include <ggml-backend.h>
#include <ggml.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** A buffer type over one cache. Opaque. */
typedef struct wc_ggml wc_ggml;

typedef struct wc_ggml_options {
  /** sizeof(wc_ggml_options): set by wc_ggml_options_init. */
  uint32_t struct_size;
  /** How long ago (ms) a GGUF file's last change must be before its identity stands in for
   * hashing its bytes (default 60000, least 2000): a second write within one timestamp tick of
   * the first leaves the file's times unchanged, and a write still copying bytes when it began
   * would be taken half done. */
  int64_t identity_window_ms;
  /** After a tensor is served from the cache, give back this process's mapping of its GGUF
   * source pages (madvise MADV_DONTNEED on the whole pages inside the tensor, only where they are
   * a read-only or shared mapping of the file, never heap memory): loaders that read the pages
   * anyway (llama.cpp maps with MAP_POPULATE) then hold only the repacked copy. Default 1. */
  int drop_source_pages;
  /** When the last tensor a buffer was given has been set (loading ended), finalize (make the
   * repacked tensors durable, with the cache's durability):
   *   2 (default): on a background thread of the buffer type, so the load returns without waiting
   *     for the disk; the tensors are served from the mapping meanwhile. wc_ggml_finish waits for
   *     it and returns its status; wc_ggml_destroy waits for it.
   *   1: in that set_tensor call, before the load returns.
   *   0: not at all: call wc_ggml_finish when loading ends. */
  int finalize_when_loaded;
} wc_ggml_options;

/** Fills the defaults (see each field). */
void wc_ggml_options_init(wc_ggml_options* options);

/**
 * Creates a buffer type over `cache` (which must stay open until wc_ggml_destroy). options may
 * be NULL (the defaults). Fails with WC_ERR_INVALID_ARGUMENT (NULL cache or out, a bad option),
 * WC_ERR_INCOMPATIBLE (this process's ggml has no CPU backend with CPU_REPACK, or is not the tree
 * this library was built against), WC_ERR_NO_MEMORY; wc_ggml_last_error() says which. *out is NULL on failure.
 */
wc_status wc_ggml_create(wc_cache* cache, const wc_ggml_options* options, wc_ggml** out);

/**
 * Destroys the buffer type, after finalizing what is not yet durable (waiting for the background
 * finalize). Every buffer allocated from it must have been freed first (ggml frees a model's
 * buffers when the model is freed); otherwise it logs an error and keeps the buffer type alive.
 * The cache is not closed. NULL is ignored.
 */
void wc_ggml_destroy(wc_ggml* g);

/** The ggml buffer type; valid until wc_ggml_destroy. Buffers it allocates report ggml's own
 * CPU_REPACK buffer type as theirs (ggml-cpu recognizes repacked weights by that pointer). */
ggml_backend_buffer_type_t wc_ggml_buffer_type(wc_ggml* g);

/**
 * Nonzero when ggml's CPU backend, on this CPU, would repack `tensor` (its type and shape: a 2-D
 * or 3-D weight of a type with a repacked layout for this CPU, ne[1] a multiple of the layout's
 * rows). Only such tensors may be put in a buffer of this type; any other is refused by
 * ggml_backend_tensor_alloc's init step (GGML_STATUS_FAILED) with a message on the log.
 * Looks at type and ne only; tensor->data may be NULL.
 */
int wc_ggml_would_repack(const struct ggml_tensor* tensor);

/**
 * Ends loading: makes every tensor repacked into the cache so far durable (wc_finalize), waiting
 * for a background finalize in progress first. Returns WC_OK when everything repacked is durable
 * (nothing to do included), else wc_finalize's status (wc_ggml_last_error says why; the tensors
 * stay served from memory, and the next call tries again). Optional with finalize_when_loaded 1
 * or 2, unless a buffer's tensors are not all set.
 */
wc_status wc_ggml_finish(wc_ggml* g);

/** Counts since wc_ggml_create (wc_ggml_stats_init first). */
typedef struct wc_ggml_stats {
  uint32_t struct_size;
  uint64_t tensors;           /* tensors set through buffers of this type */
  uint64_t repacked;          /* repacked in this process (a miss) */
  uint64_t served_from_cache; /* found in the cache: not repacked, source bytes not read */
  uint64_t heap_fallbacks;    /* repacked into this process's memory: the cache could not take them */
  uint64_t repacked_bytes;    /* bytes repacked in this process */
  uint64_t source_bytes_hashed; /* GGUF bytes read to find a key (no trusted file identity) */
  uint64_t source_bytes_dropped; /* GGUF source pages given back (drop_source_pages) */
  uint64_t finalizes_failed;  /* wc_finalize calls that did not return WC_OK */
} wc_ggml_stats;

void wc_ggml_stats_init(wc_ggml_stats* stats);
/** WC_OK, or WC_ERR_INVALID_ARGUMENT for a NULL argument or a struct_size this library does not
 * know. */
wc_status wc_ggml_get_stats(const wc_ggml* g, wc_ggml_stats* out);

/**
 * Zero when the ggml this process runs has the buffer interface this library was compiled
 * against: same ggml_version() and GGML_BACKEND_API_VERSION. Otherwise WC_ERR_INCOMPATIBLE with
 * the two versions in wc_ggml_last_error. wc_ggml_create calls it.
 */
wc_status wc_ggml_check_abi(void);

/** Why the last failing call of this header on this thread failed ("" when none has). Valid
 * until the next call on this thread. */
const char* wc_ggml_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* WEIGHTCACHE_GGML_H */
