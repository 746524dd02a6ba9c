#!/usr/bin/env bash
# The static library as a program built without CMake links it: a C file compiled and linked by
# the C compiler with each usual optimisation level on the link line. Each program must open a
# file-backed cache, insert, finalize and close (a wc_open that never returns ends at the test's
# timeout). The archive must hold no LTO bytecode, which GCC's linker plugin would recompile at the
# link line's level instead of linking the code built and tested here.
#   static_link_test.sh CC ARCHIVE INCLUDE_DIR WORK_DIR OBJDUMP
set -euo pipefail
cc=$1 archive=$2 include=$3 work=$4 objdump=$5
rm -rf "$work" && mkdir -p "$work"
sections=$("$objdump" -h "$archive")
if grep -q '\.gnu\.lto_' <<<"$sections"; then
  echo "$archive holds LTO bytecode (.gnu.lto_* sections)" >&2
  exit 1
fi
cat > "$work/app.c" <<'C'
#include <weightcache/weightcache.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char** argv) {
  wc_options o;
  wc_options_init(&o);
  o.path = argv[1];
  wc_cache* c = NULL;
  if (wc_open(&o, &c) != WC_OK) { fprintf(stderr, "open: %s\n", wc_last_error()); return 1; }
  void* p = wc_reserve_space(c, 64);
  if (p == NULL) { fprintf(stderr, "reserve: %s\n", wc_last_error()); return 1; }
  memset(p, 7, 64);
  if (wc_look_up_or_insert(c, "k", 1, p, 64) == WC_NOT_FOUND) { fprintf(stderr, "insert: %s\n", wc_last_error()); return 1; }
  if (wc_finalize(c) != WC_OK) { fprintf(stderr, "finalize: %s\n", wc_last_error()); return 1; }
  wc_close(c);
  return 0;
}
C
"$cc" -c -O2 -I"$include" "$work/app.c" -o "$work/app.o"
for level in -O0 -O1 -O2 -Os; do
  "$cc" "$level" "$work/app.o" "$archive" -lstdc++ -lpthread -o "$work/app$level"
  "$work/app$level" "$work/cache$level.wcache" || { echo "the program linked with $level failed" >&2; exit 1; }
  echo "linked with $level: opened, inserted, finalized"
done
