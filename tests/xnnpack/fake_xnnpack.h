/*
 * A stand-in for the part of XNNPACK that talks to a weights-cache provider, written in C as
 * XNNPACK is. It declares the provider and key structs on its own (as include/xnnpack.h lays
 * them out) and calls the function pointers in the order XNNPACK's operator-creation path does:
 * look_up; on a miss reserve_space, zero, pack, look_up_or_insert (whose result is not checked);
 * offset_to_addr at every reshape; is_finalized at setup. Nothing here includes weightcache.
 */
#ifndef WEIGHTCACHE_TESTS_FAKE_XNNPACK_H
#define WEIGHTCACHE_TESTS_FAKE_XNNPACK_H

#include <stddef.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum fxnn_status {
  fxnn_status_success = 0,
  fxnn_status_uninitialized = 1,
  fxnn_status_invalid_parameter = 2,
  fxnn_status_invalid_state = 3,
  fxnn_status_unsupported_parameter = 4,
  fxnn_status_unsupported_hardware = 5,
  fxnn_status_out_of_memory = 6,
};

struct fxnn_weights_cache_look_up_key {
  uint32_t seed;
  const void* kernel;
  const void* bias;
  uint32_t fingerprint_id;
};

struct fxnn_weights_cache_provider {
  void* context;
  size_t (*look_up)(void* context, const struct fxnn_weights_cache_look_up_key* cache_key);
  void* (*reserve_space)(void* context, size_t n);
  size_t (*look_up_or_insert)(void* context, const struct fxnn_weights_cache_look_up_key* cache_key, void* ptr,
                              size_t size);
  bool (*is_finalized)(void* context);
  void* (*offset_to_addr)(void* context, size_t offset);
  enum fxnn_status (*delete_cache)(void* context);
  enum fxnn_status (*alias_data)(void* context, void* alias, void* original);
};

typedef struct fxnn_weights_cache_provider* fxnn_weights_cache_t;

/* Packs `kernel` (and `bias`) into `packed` (size bytes, already zeroed). */
typedef void (*fxnn_pack_fn)(void* user, const void* kernel, const void* bias, void* packed, size_t size);

/* What a fully-connected operator keeps: the offset, never a pointer, until reshape. */
struct fxnn_operator {
  fxnn_weights_cache_t cache;
  size_t packed_offset;
  size_t packed_size;
  const void* packed; /* set by fxnn_reshape_operator */
};

/* xnn_create_fully_connected_nc_*: look_up, else reserve_space + memset + pack + look_up_or_insert. */
enum fxnn_status fxnn_create_fully_connected(fxnn_weights_cache_t cache, uint32_t seed, uint32_t fingerprint_id,
                                             const void* kernel, const void* bias, size_t packed_size,
                                             fxnn_pack_fn pack, void* user, struct fxnn_operator* op_out);

/* xnn_reshape_*: resolves the packed weights through offset_to_addr. */
enum fxnn_status fxnn_reshape_operator(struct fxnn_operator* op);

/* xnn_setup_runtime: refuses while the cache is not finalized. */
enum fxnn_status fxnn_setup(fxnn_weights_cache_t cache);

/* The static-weight conversion path (bf16 -> fp32): XNNPACK tells the cache that `alias` holds a
 * converted copy of `original` before packing from it. */
enum fxnn_status fxnn_alias(fxnn_weights_cache_t cache, void* alias, void* original);

/* A provider that counts every call and forwards it to another one. Thread-safe. */
enum fxnn_call {
  fxnn_call_look_up,
  fxnn_call_reserve_space,
  fxnn_call_look_up_or_insert,
  fxnn_call_is_finalized,
  fxnn_call_offset_to_addr,
  fxnn_call_delete_cache,
  fxnn_call_alias_data,
  fxnn_call_count_
};
struct fxnn_counting;
struct fxnn_counting* fxnn_counting_create(fxnn_weights_cache_t inner);
void fxnn_counting_destroy(struct fxnn_counting* c);
fxnn_weights_cache_t fxnn_counting_provider(struct fxnn_counting* c);
size_t fxnn_counting_get(const struct fxnn_counting* c, enum fxnn_call call);
/* Pointer arguments of look_up_or_insert calls that were NULL. */
size_t fxnn_counting_null_inserts(const struct fxnn_counting* c);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTCACHE_TESTS_FAKE_XNNPACK_H */
