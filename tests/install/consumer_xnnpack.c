/* A runtime that hands weights to XNNPACK, written against the installed headers only: it opens a
 * cache, creates the XNNPACK adapter, names its weight buffers and drives the provider's function
 * pointers in the order XNNPACK's operator creation does (look_up; on a miss reserve_space,
 * zero, pack, look_up_or_insert), finalizes before setup, and resolves every operator's packed
 * weights with offset_to_addr. The first run over a file packs; the second must only hit (no
 * reserve_space) and read the same packed bytes. Prints "miss same-bytes" or "hit same-bytes". */
#include <weightcache/xnnpack.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define ROWS 24
#define COLS 10
#define NR 8
#define PANELS ((ROWS + NR - 1) / NR)
#define PACKED_FLOATS (PANELS * NR * (COLS + 1))

/* Two fully-connected layers, as a model file holds them (weights [ROWS x COLS], bias [ROWS]). */
static float weights[2][ROWS * COLS];
static float biases[2][ROWS];
static const char* const weight_names[2] = {"fc0.weight", "fc1.weight"};
static const char* const bias_names[2] = {"fc0.bias", "fc1.bias"};

/* Per panel of NR outputs: NR bias values, then COLS x NR weights (k-major). */
static void pack(const float* w, const float* b, float* out) {
  for (int p = 0; p < PANELS; ++p) {
    float* panel = out + p * NR * (COLS + 1);
    for (int j = 0; j < NR && p * NR + j < ROWS; ++j) {
      panel[j] = b[p * NR + j];
      for (int k = 0; k < COLS; ++k) panel[NR + k * NR + j] = w[(p * NR + j) * COLS + k];
    }
  }
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  for (int l = 0; l < 2; ++l) {
    for (int i = 0; i < ROWS * COLS; ++i) weights[l][i] = (float)((i * 37 + l * 11) % 101) / 64.0f - 0.75f;
    for (int i = 0; i < ROWS; ++i) biases[l][i] = (float)(i + 3 * l) / 8.0f;
  }

  wc_options o;
  wc_options_init(&o);
  o.path = argv[1];
  o.backing = WC_BACKING_FILE;
  const char* compat_key = "install-consumer|packer=nr8-v1"; /* model identity | packer | CPU */
  o.compat_key = compat_key;
  o.compat_key_size = strlen(compat_key);
  wc_cache* cache = NULL;
  if (wc_open(&o, &cache) != WC_OK) {
    fprintf(stderr, "wc_open: %s\n", wc_last_error());
    return 1;
  }
  wc_xnn_adapter* adapter = NULL;
  if (wc_xnn_adapter_create(cache, &adapter) != WC_OK) {
    fprintf(stderr, "wc_xnn_adapter_create: %s\n", wc_last_error());
    return 1;
  }
  for (int l = 0; l < 2; ++l) {
    if (wc_xnn_adapter_name_buffer(adapter, weights[l], weight_names[l]) != WC_OK ||
        wc_xnn_adapter_name_buffer(adapter, biases[l], bias_names[l]) != WC_OK) {
      fprintf(stderr, "wc_xnn_adapter_name_buffer: %s\n", wc_last_error());
      return 1;
    }
  }
  /* What the runtime passes to XNNPACK as its xnn_weights_cache_t. */
  wc_xnn_weights_cache_provider* xp = (wc_xnn_weights_cache_provider*)wc_xnn_adapter_provider(adapter);
  if (xp == NULL) return 1;

  /* Operator creation. */
  size_t offsets[2];
  int hits = 0, reserves = 0;
  for (int l = 0; l < 2; ++l) {
    const wc_xnn_weights_cache_look_up_key key = {0x1234u + (uint32_t)l, weights[l], biases[l], 7u};
    size_t off = xp->look_up(xp->context, &key);
    if (off != SIZE_MAX) {
      ++hits;
    } else {
      void* mem = xp->reserve_space(xp->context, sizeof(float) * PACKED_FLOATS);
      if (mem == NULL) {
        fprintf(stderr, "reserve_space: %s\n", wc_last_error());
        return 1;
      }
      ++reserves;
      memset(mem, 0, sizeof(float) * PACKED_FLOATS);
      pack(weights[l], biases[l], (float*)mem);
      off = xp->look_up_or_insert(xp->context, &key, mem, sizeof(float) * PACKED_FLOATS);
      if (off == SIZE_MAX) return 1;
    }
    offsets[l] = off;
  }
  /* Setup refuses until the runtime finalizes (XNNPACK consults is_finalized). */
  if (!xp->is_finalized(xp->context) && wc_finalize(cache) != WC_OK) {
    fprintf(stderr, "wc_finalize: %s\n", wc_last_error());
    return 1;
  }
  if (!xp->is_finalized(xp->context)) return 1;

  /* Reshape: every operator resolves its offset; the bytes must be a fresh packing's. */
  int same = 1;
  for (int l = 0; l < 2; ++l) {
    float want[PACKED_FLOATS];
    memset(want, 0, sizeof want);
    pack(weights[l], biases[l], want);
    const void* packed = xp->offset_to_addr(xp->context, offsets[l]);
    same = same && packed != NULL && memcmp(packed, want, sizeof want) == 0;
  }
  const int hit = hits == 2 && reserves == 0;
  const int consistent = hit || (hits == 0 && reserves == 2);

  wc_xnn_adapter_destroy(adapter);
  wc_close(cache);
  if (!consistent) {
    fprintf(stderr, "%d of 2 layers hit, %d reserved: a run must pack both or neither\n", hits, reserves);
    return 1;
  }
  printf("%s %s\n", hit ? "hit" : "miss", same ? "same-bytes" : "WRONG-BYTES");
  return same ? 0 : 1;
}
