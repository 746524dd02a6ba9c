/* A C host that loads the shared library with dlopen, uses a cache, closes it and unloads the
 * library at once, `rounds` times, pinned to one CPU (unload_test.cpp runs it). In C, so that the
 * C++ runtime comes and goes with the library, as it does for a C host (and no copy of the
 * library's template code in the program stands in for the library's own).
 *
 *   weightcache_unload_child LIBRARY none|async|verify-ahead|atexit-close DIR ROUNDS
 *
 * Exit status: 0 done; 2 a setup step failed; 3 the library stayed loaded after dlclose (the
 * test cannot fail then); a signal: the host crashed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weightcache/weightcache.h>

/* In an AddressSanitizer build: the library's process-wide state (registry, platform, log) is
 * never destroyed by design, so each library unloaded leaves it behind, which LeakSanitizer would
 * report at exit; that is not what this host tests. */
const char* __asan_default_options(void);
const char* __asan_default_options(void) { return "detect_leaks=0"; }

typedef struct {
  void* handle;
  void (*options_init)(wc_options*);
  wc_status (*open)(const wc_options*, wc_cache**);
  void* (*reserve)(wc_cache*, size_t);
  size_t (*insert)(wc_cache*, const void*, size_t, void*, size_t);
  wc_status (*finalize)(wc_cache*);
  void (*close)(wc_cache*);
} api;

static int load(const char* library, api* a) {
  a->handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (a->handle == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 0;
  }
  *(void**)&a->options_init = dlsym(a->handle, "wc_options_init");
  *(void**)&a->open = dlsym(a->handle, "wc_open");
  *(void**)&a->reserve = dlsym(a->handle, "wc_reserve_space");
  *(void**)&a->insert = dlsym(a->handle, "wc_look_up_or_insert");
  *(void**)&a->finalize = dlsym(a->handle, "wc_finalize");
  *(void**)&a->close = dlsym(a->handle, "wc_close");
  return a->options_init && a->open && a->reserve && a->insert && a->finalize && a->close;
}

static int mapped(const char* library) {
  const char* name = strrchr(library, '/');
  name = name ? name + 1 : library;
  FILE* maps = fopen("/proc/self/maps", "r");
  if (maps == NULL) return 0;
  char line[1024];
  int found = 0;
  while (fgets(line, sizeof line, maps) != NULL)
    if (strstr(line, name) != NULL) found = 1;
  fclose(maps);
  return found;
}

/* One entry of `size` bytes under key `k<i>`, then finalize and close. */
static int write_one(api* a, wc_options* o, int i, size_t size) {
  wc_cache* c = NULL;
  if (a->open(o, &c) != WC_OK) {
    fprintf(stderr, "wc_open of %s failed\n", o->path);
    return 2;
  }
  char key[32];
  const int n = snprintf(key, sizeof key, "k%d", i);
  void* p = a->reserve(c, size);
  if (p == NULL) return 2;
  memset(p, i & 0xff, size);
  if (a->insert(c, key, (size_t)n, p, size) == SIZE_MAX) return 2;
  (void)a->finalize(c);
  a->close(c);
  return 0;
}

/* atexit-close: the exit handler that closes the cache was registered before the library was
 * loaded, so it runs after the library's static destructors. */
static void (*g_close)(wc_cache*);
static wc_cache* g_open_at_exit;
static void close_at_exit(void) {
  if (g_open_at_exit != NULL) g_close(g_open_at_exit);
}

static int open_for_exit(const char* library, const char* dir) {
  atexit(close_at_exit);
  api a;
  if (!load(library, &a)) return 2;
  char path[4096];
  snprintf(path, sizeof path, "%s/exit.wcache", dir);
  wc_options o;
  a.options_init(&o);
  o.path = path;
  o.compat_key = "unload";
  o.compat_key_size = 6;
  o.durability = WC_DURABILITY_FULL;
  if (write_one(&a, &o, 1, 4096) != 0) return 2;
  if (a.open(&o, &g_open_at_exit) != WC_OK) return 2;
  g_close = a.close;
  return 0; /* the library stays loaded; close_at_exit closes the cache */
}

int main(int argc, char** argv) {
  if (argc == 5 && strcmp(argv[2], "atexit-close") == 0) return open_for_exit(argv[1], argv[3]);
  if (argc != 5) return 2;
  const char* library = argv[1];
  const char* mode = argv[2];
  const char* dir = argv[3];
  const int rounds = atoi(argv[4]);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  (void)sched_setaffinity(0, sizeof one, &one); /* one CPU: the unload overtakes the thread's return */
  char path[4096];
  for (int i = 0; i < rounds; ++i) {
    api a;
    if (!load(library, &a)) return 2;
    wc_options o;
    a.options_init(&o);
    o.compat_key = "unload";
    o.compat_key_size = 6;
    int r = 0;
    if (strcmp(mode, "verify-ahead") == 0) {
      snprintf(path, sizeof path, "%s/va.wcache", dir);
      o.path = path;
      if (i == 0) /* 24 MiB, written once: over the verify-ahead thread's 16 MiB threshold */
        for (int k = 0; k < 24 && r == 0; ++k) r = write_one(&a, &o, k, (size_t)1 << 20);
      o.verify = WC_VERIFY_FIRST_USE;
      o.read_only = 1;
      wc_cache* c = NULL;
      if (r == 0 && a.open(&o, &c) != WC_OK) r = 2;
      if (r == 0) a.close(c);
    } else {
      snprintf(path, sizeof path, "%s/c%d.wcache", dir, i % 4);
      o.path = path;
      o.durability = strcmp(mode, "async") == 0 ? WC_DURABILITY_ASYNC : WC_DURABILITY_NONE;
      r = write_one(&a, &o, i, 4096);
    }
    dlclose(a.handle);
    if (r != 0) return r;
    if (i == 0 && mapped(library)) return 3;
  }
  return 0;
}
