/* A program a user would write against the installed C ABI: open, miss, reserve, fill, insert,
 * finalize; the second run (same file) must hit and see the same bytes. The insert goes through
 * the integrations' calls (a finalize ticket, the kept-offset address, the log and the last
 * error), so they link from the installed library too. */
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
    uint64_t ticket = 0;
    off = wc_look_up_or_insert_ex(c, "layer0/w", 8, p, sizeof want, &ticket);
    if (off == WC_NOT_FOUND || wc_is_finalized_through(c, ticket)) return 1;
    if (wc_finalize(c) != WC_OK || !wc_is_finalized_through(c, ticket)) return 1;
    wc_log_message(WC_LOG_TRACE, "consumer: packed layer0/w"); /* below the default level: dropped */
  }
  if (wc_set_last_error(WC_ERR_IO, "consumer: check") != WC_ERR_IO || strcmp(wc_last_error(), "consumer: check") != 0)
    return 1;
  const void* p = wc_offset_to_addr(c, off);
  if (wc_offset_to_addr_kept(c, off) != p) return 1;
  const int same = p != NULL && memcmp(p, want, sizeof want) == 0;
  wc_close(c);
  printf("%s %s\n", hit ? "hit" : "miss", same ? "same-bytes" : "WRONG-BYTES");
  return same ? 0 : 1;
}
