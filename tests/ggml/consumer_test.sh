#!/usr/bin/env bash
# An application against the installed ggml buffer type: C, through pkg-config (weightcache-ggml.pc,
# which brings weightcache.pc), with its own ggml (this build's static ggml and its headers). It
# creates the buffer type over a :memory: cache and asks whether a Q4_0 weight would be repacked.
#   consumer_test.sh PREFIX CC GGML_SOURCE GGML_LIBDIR [EMULATOR]
# With EMULATOR (a cross build: qemu-aarch64), the program is linked statically, as that build's
# own executables are (its ggml has no OpenMP), and run through the emulator.
set -euo pipefail
prefix=$1 cc=$2 ggml_src=$3 ggml_lib=$4 emulator=${5:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/wc-ggml-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
pc=$(dirname "$(find "$prefix" -name weightcache-ggml.pc | head -1)")
[[ -f $pc/weightcache-ggml.pc ]] || { echo "consumer_test: no installed weightcache-ggml.pc" >&2; exit 1; }
cat >"$work/app.c" <<'C'
#include <weightcache/ggml.h>
#include <stdio.h>
int main(void) {
  wc_options o;
  wc_options_init(&o);
  o.path = ":memory:";
  wc_cache* c = NULL;
  if (wc_open(&o, &c) != WC_OK) { printf("open failed: %s\n", wc_last_error()); return 1; }
  wc_ggml* g = NULL;
  if (wc_ggml_create(c, NULL, &g) != WC_OK) { printf("create failed: %s\n", wc_ggml_last_error()); return 1; }
  struct ggml_init_params ip = {ggml_tensor_overhead() * 2, NULL, 1};
  struct ggml_context* ctx = ggml_init(ip);
  struct ggml_tensor* w = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 256, 64);
  struct ggml_tensor* f = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 64);
  /* The layout this CPU's ggml gives a Q4_0 matrix of 256-long rows: CPU_REPACK's (AMX takes rows
   * of 2048 only), through the per-tensor call; none for f32. */
  ggml_backend_buffer_type_t for_w = wc_ggml_buffer_type_for(g, w), for_f = wc_ggml_buffer_type_for(g, f);
  ggml_backend_buffer_type_t stock = wc_ggml_stock_buffer_type(w);
  printf("%s q4_0=%d f32=%d for_q4_0=%s for_f32=%s stock=%s layouts=%s\n", ggml_backend_buft_name(wc_ggml_buffer_type(g)),
         wc_ggml_would_repack(w), wc_ggml_would_repack(f), for_w ? ggml_backend_buft_name(for_w) : "none",
         for_f ? ggml_backend_buft_name(for_f) : "none", stock ? ggml_backend_buft_name(stock) : "none",
         wc_ggml_layouts());
  ggml_free(ctx);
  wc_ggml_destroy(g);
  wc_close(c);
  return 0;
}
C
flags=$(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs weightcache-ggml)
link=(-fopenmp)
run=()
if [[ -n $emulator ]]; then
  link=(-static)
  run=("$emulator")
fi
# shellcheck disable=SC2086
"$cc" "$work/app.c" -o "$work/app" -I"$ggml_src/include" $flags -Wl,-rpath,"$(PKG_CONFIG_PATH=$pc pkg-config --variable=libdir weightcache)" \
  -Wl,--start-group "$ggml_lib"/libggml.a "$ggml_lib"/libggml-cpu.a "$ggml_lib"/libggml-base.a -Wl,--end-group \
  "${link[@]}" -lstdc++ -lm -lpthread -ldl
out=$("${run[@]}" "$work/app")
echo "consumer_test: $out"
# On arm64 with KleidiAI the Q4_0 matrix is KleidiAI's.
[[ $out == "WEIGHTCACHE_REPACK q4_0=1 f32=0 for_q4_0=WEIGHTCACHE_REPACK for_f32=none stock=CPU_REPACK layouts="*CPU_REPACK ||
   $out == "WEIGHTCACHE_REPACK q4_0=1 f32=0 for_q4_0=WEIGHTCACHE_KLEIDIAI for_f32=none stock=CPU_KLEIDIAI layouts=CPU_KLEIDIAI,CPU_REPACK" ||
   $out == "WEIGHTCACHE_REPACK q4_0=0 f32=0 for_q4_0=none for_f32=none stock=none layouts="* ]] ||
  { echo "consumer_test: unexpected output '$out'" >&2; exit 1; }
