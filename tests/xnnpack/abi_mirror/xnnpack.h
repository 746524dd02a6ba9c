/*
 * A test input, not XNNPACK: the declarations of current XNNPACK's include/xnnpack.h that the
 * weights-cache provider uses, written out by hand (enum xnn_status, the look-up key, the
 * provider struct and its handle type), with nothing else. abi_check.cpp is meant to run
 * against the real header (configure with -DWEIGHTCACHE_XNNPACK_INCLUDE=<XNNPACK>/include);
 * this copy only shows that the check itself compiles, and, with WC_ABI_MIRROR_BREAK defined,
 * that it rejects a provider whose member types differ while every offset and size still match
 * (tests/xnnpack/CMakeLists.txt builds both).
 */
#ifndef WEIGHTCACHE_TESTS_ABI_MIRROR_XNNPACK_H
#define WEIGHTCACHE_TESTS_ABI_MIRROR_XNNPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum xnn_status {
  xnn_status_success = 0,
  xnn_status_uninitialized = 1,
  xnn_status_invalid_parameter = 2,
  xnn_status_invalid_state = 3,
  xnn_status_unsupported_parameter = 4,
  xnn_status_unsupported_hardware = 5,
  xnn_status_out_of_memory = 6,
  xnn_status_reallocation_required = 7,
  xnn_status_deprecated = 8,
};

struct xnn_weights_cache_look_up_key {
  uint32_t seed;
  const void* kernel;
  const void* bias;
  uint32_t fingerprint_id;
};

struct xnn_weights_cache_provider {
  void* context;
  size_t (*look_up)(void* context, const struct xnn_weights_cache_look_up_key* cache_key);
  void* (*reserve_space)(void* context, size_t n);
  size_t (*look_up_or_insert)(void* context, const struct xnn_weights_cache_look_up_key* cache_key, void* ptr,
                              size_t size);
#ifdef WC_ABI_MIRROR_BREAK
  int (*is_finalized)(void* context); /* same size and offset as a function pointer returning bool */
#else
  bool (*is_finalized)(void* context);
#endif
  void* (*offset_to_addr)(void* context, size_t offset);
  enum xnn_status (*delete_cache)(void* context);
  enum xnn_status (*alias_data)(void* context, void* alias, void* original);
};

typedef struct xnn_weights_cache_provider* xnn_weights_cache_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTCACHE_TESTS_ABI_MIRROR_XNNPACK_H */
