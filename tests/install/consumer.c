/* A program a user would write against the installed C ABI: open, miss, reserve, fill, insert,
 * finalize; the second run (same file) must hit and see the same bytes. */
#include <weightcache/weightcache.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  wc_options o;
  wc_options_init(&o);
  o.path = argv[1];
  o.backing = WC_BACKING_FILE;
  wc_cache* c = NULL;
  if (wc_open(&o, &c) != WC_OK) {
    fprintf(stderr, "wc_open: %s\n", wc_last_error());
    return 1;
  }
  unsigned char want[1000];
  for (int i = 0; i < 1000; ++i) want[i] = (unsigned char)(i * 7 + 3);
  int hit = 0;
  size_t off = wc_look_up(c, "layer0/w", 8);
  if (off != WC_NOT_FOUND) {
    hit = 1;
  } else {
    void* p = wc_reserve_space(c, sizeof want);
    if (p == NULL) return 1;
    memcpy(p, want, sizeof want);
    off = wc_look_up_or_insert(c, "layer0/w", 8, p, sizeof want);
    if (off == WC_NOT_FOUND || wc_finalize(c) != WC_OK) return 1;
  }
  const void* p = wc_offset_to_addr(c, off);
  const int same = p != NULL && memcmp(p, want, sizeof want) == 0;
  wc_close(c);
  printf("%s %s\n", hit ? "hit" : "miss", same ? "same-bytes" : "WRONG-BYTES");
  return same ? 0 : 1;
}
