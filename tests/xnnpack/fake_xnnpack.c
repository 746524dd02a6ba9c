/* See fake_xnnpack.h. C11: atomics for the counters. */
#include "fake_xnnpack.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum fxnn_status fxnn_create_fully_connected(fxnn_weights_cache_t cache, uint32_t seed, uint32_t fingerprint_id,
                                             const void* kernel, const void* bias, size_t packed_size,
                                             fxnn_pack_fn pack, void* user, struct fxnn_operator* op_out) {
  if (cache == NULL || op_out == NULL) return fxnn_status_invalid_parameter;
  struct fxnn_weights_cache_look_up_key key;
  key.seed = seed;
  key.kernel = kernel;
  key.bias = bias;
  key.fingerprint_id = fingerprint_id;
  size_t offset = cache->look_up(cache->context, &key);
  if (offset == SIZE_MAX) {
    void* packed = cache->reserve_space(cache->context, packed_size);
    if (packed == NULL) return fxnn_status_out_of_memory;
    memset(packed, 0, packed_size);
    pack(user, kernel, bias, packed, packed_size);
    /* As in XNNPACK: the result is stored without a check. */
    offset = cache->look_up_or_insert(cache->context, &key, packed, packed_size);
  }
  op_out->cache = cache;
  op_out->packed_offset = offset;
  op_out->packed_size = packed_size;
  op_out->packed = NULL;
  return fxnn_status_success;
}

enum fxnn_status fxnn_reshape_operator(struct fxnn_operator* op) {
  op->packed = op->cache->offset_to_addr(op->cache->context, op->packed_offset);
  return op->packed != NULL ? fxnn_status_success : fxnn_status_invalid_state;
}

enum fxnn_status fxnn_setup(fxnn_weights_cache_t cache) {
  return cache->is_finalized(cache->context) ? fxnn_status_success : fxnn_status_invalid_state;
}

enum fxnn_status fxnn_alias(fxnn_weights_cache_t cache, void* alias, void* original) {
  return cache->alias_data(cache->context, alias, original);
}

struct fxnn_counting {
  struct fxnn_weights_cache_provider shim;
  fxnn_weights_cache_t inner;
  atomic_size_t counts[fxnn_call_count_];
  atomic_size_t null_inserts;
};

static struct fxnn_counting* counting(void* context) { return (struct fxnn_counting*)context; }

static size_t c_look_up(void* context, const struct fxnn_weights_cache_look_up_key* key) {
  struct fxnn_counting* c = counting(context);
  atomic_fetch_add(&c->counts[fxnn_call_look_up], 1);
  return c->inner->look_up(c->inner->context, key);
}
static void* c_reserve_space(void* context, size_t n) {
  struct fxnn_counting* c = counting(context);
  atomic_fetch_add(&c->counts[fxnn_call_reserve_space], 1);
  return c->inner->reserve_space(c->inner->context, n);
}
static size_t c_look_up_or_insert(void* context, const struct fxnn_weights_cache_look_up_key* key, void* ptr,
                                  size_t size) {
  struct fxnn_counting* c = counting(context);
  atomic_fetch_add(&c->counts[fxnn_call_look_up_or_insert], 1);
  if (ptr == NULL) atomic_fetch_add(&c->null_inserts, 1);
  return c->inner->look_up_or_insert(c->inner->context, key, ptr, size);
}
static bool c_is_finalized(void* context) {
  struct fxnn_counting* c = counting(context);
  atomic_fetch_add(&c->counts[fxnn_call_is_finalized], 1);
  return c->inner->is_finalized(c->inner->context);
}
static void* c_offset_to_addr(void* context, size_t offset) {
  struct fxnn_counting* c = counting(context);
  atomic_fetch_add(&c->counts[fxnn_call_offset_to_addr], 1);
  return c->inner->offset_to_addr(c->inner->context, offset);
}
static enum fxnn_status c_delete_cache(void* context) {
  struct fxnn_counting* c = counting(context);
  atomic_fetch_add(&c->counts[fxnn_call_delete_cache], 1);
  return c->inner->delete_cache(c->inner->context);
}
static enum fxnn_status c_alias_data(void* context, void* alias, void* original) {
  struct fxnn_counting* c = counting(context);
  atomic_fetch_add(&c->counts[fxnn_call_alias_data], 1);
  return c->inner->alias_data(c->inner->context, alias, original);
}

struct fxnn_counting* fxnn_counting_create(fxnn_weights_cache_t inner) {
  struct fxnn_counting* c = (struct fxnn_counting*)calloc(1, sizeof(*c));
  if (c == NULL) return NULL;
  c->inner = inner;
  c->shim.context = c;
  c->shim.look_up = c_look_up;
  c->shim.reserve_space = c_reserve_space;
  c->shim.look_up_or_insert = c_look_up_or_insert;
  c->shim.is_finalized = c_is_finalized;
  c->shim.offset_to_addr = c_offset_to_addr;
  c->shim.delete_cache = c_delete_cache;
  c->shim.alias_data = c_alias_data;
  for (int i = 0; i < fxnn_call_count_; ++i) atomic_init(&c->counts[i], 0);
  atomic_init(&c->null_inserts, 0);
  return c;
}

void fxnn_counting_destroy(struct fxnn_counting* c) { free(c); }

fxnn_weights_cache_t fxnn_counting_provider(struct fxnn_counting* c) { return &c->shim; }

size_t fxnn_counting_get(const struct fxnn_counting* c, enum fxnn_call call) {
  return atomic_load(&((struct fxnn_counting*)c)->counts[call]);
}

size_t fxnn_counting_null_inserts(const struct fxnn_counting* c) {
  return atomic_load(&((struct fxnn_counting*)c)->null_inserts);
}
