/*
 * weightcache for ggml's CPU repacking (llama.cpp, whisper.cpp, stable-diffusion.cpp, ...).
 *
 * ggml's CPU backend repacks quantized weights (Q4_0, IQ4_NL, Q4_K, ...) into kernel layouts at
 * every model load, into private heap memory of every process. It has several repacking buffer
 * types ("extra" buffer types), tried in its order: "AMX" on x86-64 CPUs with AMX (Intel Xeon 4th
 * generation and later: a tile layout for Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS and F16 weights
 * whose rows are a multiple of 2048), "KleidiAI" on arm64 builds with it, "CPU_REPACK" everywhere
 * (interleaved layouts). This header gives, for each layout it serves (AMX, KleidiAI and CPU_REPACK), a ggml
 * buffer type that does the same repacking once, into a weightcache file, and serves the repacked
 * bytes from that file's shared mapping to every later load, session and process. A weight gets
 * the layout ggml's CPU backend would give it on this CPU, so the kernels that compute from it are
 * the ones stock ggml runs. A runtime uses them where it would use the repacking buffer types:
 *   - llama.cpp: include/weightcache/llama.h does it (tensor_buft_overrides);
 *   - any ggml program: for each weight, wc_ggml_buffer_type_for(g, tensor) names the buffer type
 *     (NULL: keep it where the program keeps weights ggml does not repack); allocate a context of
 *     the tensors of each buffer type with ggml_backend_alloc_ctx_tensors_from_buft, then
 *     ggml_backend_tensor_set from the GGUF as usual.
 *
 * This part of weightcache is compiled against the ggml tree the runtime is built with (it needs
 * ggml's internal buffer interface, ggml-backend-impl.h): link libweightcache_ggml built from
 * that same tree. wc_ggml_check_abi() says whether the ggml the process runs is that one.
 *
 * Keys (docs/DESIGN.md, "ggml keys"): a repacked tensor is stored under its content (XXH3-128 of
 * the GGUF bytes, type and shape), the repacked layout (its name, AMX, KleidiAI or CPU_REPACK, a
 * fingerprint of the code that writes it, ggml's version, the CPU features its choice of layout
 * depends on, and for KleidiAI the two environment settings its packing reads, GGML_KLEIDIAI_SME
 * and GGML_TOTAL_THREADS) and nothing else: a cache written under one layout is never served to a process that would use
 * another. A warm load does not read the tensor's bytes
 * to find that key again: a second, small entry maps the GGUF file's identity (device, inode,
 * size, mtime, ctime, the tensor's name and offset) to it, and is trusted only when the bytes
 * handed to set_tensor are that file's own pages at that offset, checked per tensor as they are
 * now (the kernel's PROCMAP_QUERY on Linux 6.11+, which needs no privilege; before 6.11 and
 * under qemu-user, a read of /proc/self/maps per tensor; where neither answers, every load
 * hashes; bytes that are not the
 * process's own and cannot be checked, such as a private file mapping's, are copied before they
 * are hashed and repacked), on a file system whose
 * times follow every store (ext4, xfs, btrfs, f2fs), and when the file's last change is older than its
 * file system's change window (10 ms where change times have nanoseconds, else 2 s) and than
 * identity_window_ms. The load that hashes a tensor records that entry at once where the file is
 * that old and no process has it open for writing (a read lease says so; without one, as for a
 * GGUF owned by another user, only once it is 60 s old). Every other load
 * hashes the tensor's bytes. A changed GGUF therefore never reaches stale repacked
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
  /** A floor (ms, 0 to 86400000) on how long ago a GGUF file's last change must be before its
   * identity stands in for hashing its bytes. Default 0: the file system's own change window
   * alone (10 ms where change times have nanoseconds, 2 s where whole seconds), past which a
   * second write always moves the file's change time (docs/DESIGN.md, "ggml keys"). A host whose
   * clock may be stepped back sets more. */
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
 * Creates the buffer types over `cache` (which must stay open until wc_ggml_destroy), one per
 * layout served on this CPU (wc_ggml_layouts). options may be NULL (the defaults). Fails with
 * WC_ERR_INVALID_ARGUMENT (NULL cache or out, a bad option), WC_ERR_INCOMPATIBLE (this process's
 * ggml has no CPU backend with AMX or CPU_REPACK, or is not the tree this library was built
 * against), WC_ERR_NO_MEMORY; wc_ggml_last_error() says which. *out is NULL on failure.
 */
wc_status wc_ggml_create(wc_cache* cache, const wc_ggml_options* options, wc_ggml** out);

/**
 * Destroys the buffer type, after finalizing what is not yet durable (waiting for the background
 * finalize). Every buffer allocated from it must have been freed first (ggml frees a model's
 * buffers when the model is freed); otherwise it logs an error and keeps the buffer type alive.
 * The cache is not closed. NULL is ignored.
 */
void wc_ggml_destroy(wc_ggml* g);

/**
 * The buffer type for the layout ggml's CPU backend gives `tensor` on this CPU (that of
 * wc_ggml_stock_buffer_type), named "WEIGHTCACHE_AMX", "WEIGHTCACHE_KLEIDIAI" or
 * "WEIGHTCACHE_REPACK"; NULL when ggml would not repack it, or repacks it into a layout this
 * library does not serve: keep such a tensor where the program keeps it without the cache. Buffers of the returned type report
 * ggml's own buffer type of that layout as theirs (ggml-cpu recognizes repacked weights, and picks
 * the kernels that read them, by that pointer). A tensor put in a buffer type other than the one
 * returned here for it is refused by ggml_backend_tensor_alloc's init step (GGML_STATUS_FAILED)
 * with a message on the log. Looks at type and ne only; tensor->data may be NULL. Valid until
 * wc_ggml_destroy.
 */
ggml_backend_buffer_type_t wc_ggml_buffer_type_for(wc_ggml* g, const struct ggml_tensor* tensor);

/** The buffer type of the CPU_REPACK layout (NULL when this ggml has none); valid until
 * wc_ggml_destroy. Only the tensors wc_ggml_buffer_type_for gives it may be put in it: on a CPU
 * with AMX some weights are AMX's, so use wc_ggml_buffer_type_for. */
ggml_backend_buffer_type_t wc_ggml_buffer_type(wc_ggml* g);

/**
 * ggml's own choice for `tensor` on this CPU, without the cache: the first of its CPU backend's
 * extra buffer types, in its order (AMX, KleidiAI, CPU_REPACK), that computes the weight's product
 * (GGML_OP_MUL_MAT of a 2-D weight, GGML_OP_MUL_MAT_ID of a 3-D one), asked through ggml's
 * supports_op as llama.cpp asks; NULL when none does (ggml computes it from plain memory). What a
 * program without the cache puts the tensor in. Looks at type and ne only.
 */
ggml_backend_buffer_type_t wc_ggml_stock_buffer_type(const struct ggml_tensor* tensor);

/** Nonzero when wc_ggml_buffer_type_for would give `tensor` a buffer type (of any wc_ggml): ggml
 * repacks it on this CPU into a layout this library serves. */
int wc_ggml_would_repack(const struct ggml_tensor* tensor);

/** The layouts served on this CPU, in ggml's order, by ggml's names: "AMX,CPU_REPACK",
 * "CPU_REPACK", or "" when none. Valid for the life of the process. */
const char* wc_ggml_layouts(void);

/**
 * What every repacked byte this process writes depends on besides its tensor: for each layout
 * served on this CPU, in ggml's order, ggml's version, the layout's name and code fingerprint,
 * its backend API and the CPU features ggml-cpu reports. Use it in wc_options.compat_key (with
 * the host's own parts) where caches are built for one CPU and used on another: a fleet's
 * prebuilt caches, one per CPU profile (wc_options.prebuilt_dir, docs/DEPLOY.md), are told apart
 * by it. "" when no layout is served. Valid for the life of the process.
 */
const char* wc_ggml_compat_key(void);

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
