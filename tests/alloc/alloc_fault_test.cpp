// Allocation failures, every one of them (docs/RELIABILITY.md, "Allocation failures"). This binary
// replaces the global operator new: a forked child runs a scenario that covers open, create, load,
// reserve, insert, replace, finalize, refresh, stats, a second handle, the XNNPACK adapter,
// compaction at open and by call, a rebuild, gc, a heap cache and a reopen, with the n-th allocation after the start made to
// fail (std::bad_alloc, or NULL from a nothrow form), once, for every n the scenario reaches.
// Each run must end in a normal exit: no abort, no crash, no look-up that returns bytes other
// than those inserted under its key. Then this process (a fresh one for the cache) opens the file
// and finds every entry whose finalize returned WC_OK, with its bytes.
#include <weightcache/weight_cache.hpp>
#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>

#include "key_content.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// ---- the counting allocator --------------------------------------------------------------------

namespace {

std::atomic<long> g_count{0};
std::atomic<long> g_fail_at{0};  // 0: off; -1: count only; n: fail the n-th allocation
std::atomic<bool> g_failed{false};
thread_local int t_quiet = 0;  // the harness's own bookkeeping is neither counted nor failed

constexpr long kFailEvery = -2;  // g_fail_at: fail every allocation from now on

bool should_fail() noexcept {
  const long at = g_fail_at.load(std::memory_order_relaxed);
  if (at == 0 || t_quiet != 0) return false;
  if (at == kFailEvery) {
    g_failed.store(true, std::memory_order_relaxed);
    return true;
  }
  const long n = g_count.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n != at) return false;
  g_failed.store(true, std::memory_order_relaxed);
  if (std::getenv("WC_ALLOC_ONLY") != nullptr) {  // where the failing allocation was made
    void* frames[48];
    ++t_quiet;
    backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
    --t_quiet;
  }
  return true;
}

void* raw_alloc(std::size_t n, std::size_t align) noexcept {
  if (n == 0) n = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(n);
  void* p = nullptr;
  return posix_memalign(&p, align, n) == 0 ? p : nullptr;
}

void* alloc_or_throw(std::size_t n, std::size_t align) {
  if (should_fail()) throw std::bad_alloc();
  if (void* p = raw_alloc(n, align)) return p;
  throw std::bad_alloc();
}

void* alloc_or_null(std::size_t n, std::size_t align) noexcept {
  if (should_fail()) return nullptr;
  return raw_alloc(n, align);
}

}  // namespace

void* operator new(std::size_t n) { return alloc_or_throw(n, 0); }
void* operator new[](std::size_t n) { return alloc_or_throw(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return alloc_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return alloc_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return alloc_or_null(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return alloc_or_null(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return alloc_or_null(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return alloc_or_null(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

#if defined(__GLIBC__)
// A thread_local with a destructor has it registered at the thread's first use of it, through
// __cxa_thread_atexit (the library is linked into this binary, so this definition is the one its
// code calls): glibc allocates a record (calloc) and, when that fails, ends the process ("Fatal
// glibc error: failed to register TLS destructor: out of memory"). Each registration is an
// allocation point here too, and failing it does what glibc does.
std::atomic<long> g_tls_destructors{0};  // registrations seen
extern "C" int __cxa_thread_atexit(void (*dtor)(void*), void* obj, void* dso_symbol) noexcept {
  g_tls_destructors.fetch_add(1);
  if (should_fail()) {
    static const char msg[] = "Fatal glibc error: failed to register TLS destructor: out of memory\n";
    (void)!::write(2, msg, sizeof msg - 1);
    std::abort();
  }
  using Fn = int (*)(void (*)(void*), void*, void*);
  static const Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "__cxa_thread_atexit"));
  if (real == nullptr) std::abort();
  return real(dtor, obj, dso_symbol);
}
#endif

namespace weightcache::test {
namespace {

// How a scenario child ends (its exit status).
constexpr int kRanToTheEnd = 0;
constexpr int kWrongBytes = 3;
constexpr int kHarnessBroken = 4;

struct Quiet {
  Quiet() { ++t_quiet; }
  ~Quiet() { --t_quiet; }
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;
};

constexpr int kKeys = 24;
std::string key_name(int i) { return "w" + std::to_string(i); }
std::size_t size_of(int i, int version) { return 64 + static_cast<std::size_t>((i * 977 + version * 131) % 3000); }
// A key's content at a version: what an insert of that version wrote.
std::string content(int i, int version) {
  return bytes_for_key(key_name(i) + "@" + std::to_string(version), size_of(i, version));
}

// What the child tells this process, line by line, through a pipe: "I key version" after an
// insert that returned an offset, "F" after a finalize that returned WC_OK, "N count" at the end.
class Reporter {
 public:
  explicit Reporter(int fd) : fd_(fd) {}
  void line(const char* fmt, long a = 0, long b = 0) {
    Quiet q;
    char buf[64];
    const int n = std::snprintf(buf, sizeof buf, fmt, a, b);
    if (n > 0 && ::write(fd_, buf, static_cast<std::size_t>(n)) != n) _exit(kHarnessBroken);
  }

 private:
  int fd_;
};

// The child's view: which version each key holds in this process (after a successful insert).
struct Child {
  Reporter& out;
  int current[kKeys] = {};

  // A hit must hold the bytes of the version this process last inserted (or, for a key it has
  // not inserted since opening, of any version: a hit is checked against every one).
  void check_hit(wc_cache* c, int i, std::size_t off) {
    if (off == SIZE_MAX) return;
    const void* p = wc_offset_to_addr(c, off);
    if (p == nullptr) return;  // an offset this cache no longer resolves: a miss, not wrong bytes
    Quiet q;
    for (int v = 3; v >= 1; --v) {
      if (current[i] != 0 && v != current[i]) continue;
      const std::string want = content(i, v);
      if (std::memcmp(p, want.data(), want.size()) == 0) return;
    }
    std::fprintf(stderr, "wrong bytes for %s (current version %d)\n", key_name(i).c_str(), current[i]);
    _exit(kWrongBytes);
  }

  void insert(wc_cache* c, int i, int version) {
    std::string bytes;
    {
      Quiet q;
      bytes = content(i, version);
    }
    void* mem = wc_reserve_space(c, bytes.size());
    if (mem == nullptr) return;
    std::memcpy(mem, bytes.data(), bytes.size());
    const std::string key = key_name(i);
    const std::size_t off = wc_look_up_or_insert(c, key.data(), key.size(), mem, bytes.size());
    if (off == SIZE_MAX) {
      (void)wc_release_space(c, mem);
      return;
    }
    current[i] = version;
    out.line("I %ld %ld\n", i, version);
    check_hit(c, i, off);
  }

  void look_up_all(wc_cache* c) {
    for (int i = 0; i < kKeys; ++i) {
      std::string key;
      {
        Quiet q;
        key = key_name(i);
      }
      check_hit(c, i, wc_look_up(c, key.data(), key.size()));
    }
  }

  // A new cache object: what it inserts is what its finalize answers for. Entries of an earlier
  // one that never reached the file (a heap fallback, closed) may be gone, so a hit may now hold
  // any version ever inserted.
  void opened() {
    std::fill(std::begin(current), std::end(current), 0);
    out.line("O\n");
  }

  void finalize(wc_cache* c) {
    if (wc_finalize(c) == WC_OK) out.line("F\n");
  }
};

wc_options file_options(const std::string& path) {
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.compat_key = "alloc-fault";
  o.compat_key_size = 11;
  o.lease_timeout_ms = 2000;
  o.compact_dead_percent = 0;  // compaction is its own step below
  return o;
}

void log_sink(void* user, wc_log_level, const char* message, size_t size) {
  if (std::getenv("WC_ALLOC_ONLY") != nullptr) std::fprintf(stderr, "log: %.*s\n", static_cast<int>(size), message);
  // Something a host would do: keep the line (this allocates, and may be made to fail).
  auto* kept = static_cast<std::string*>(user);
  try {
    kept->assign(message, size);
  } catch (const std::bad_alloc&) {
  }
}

// The adapter as XNNPACK calls it: name the weight buffers, then reserve, pack, insert, look up.
void adapter_phase(wc_cache* c) {
  wc_xnn_adapter* a = nullptr;
  if (wc_xnn_adapter_create(c, &a) != WC_OK) return;
  auto* p = static_cast<wc_xnn_weights_cache_provider*>(wc_xnn_adapter_provider(a));
  // Four named buffers and a fifth that holds a conversion of the third (XNNPACK's alias_data):
  // it packs to the same bytes and resolves to the third's name.
  static float weights[5][32];
  static const char* names[4] = {"layer0.w", "layer1.w", "layer2.w", "layer3.w"};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 32; ++j) weights[i][j] = static_cast<float>(i * 100 + j);
    (void)wc_xnn_adapter_name_buffer(a, weights[i], names[i]);
  }
  std::memcpy(weights[4], weights[2], sizeof weights[2]);
  (void)p->alias_data(p->context, weights[4], weights[2]);
  for (int i = 0; i < 5; ++i) {
    wc_xnn_weights_cache_look_up_key key{7, weights[i], nullptr, 1};
    std::size_t off = p->look_up(p->context, &key);
    if (off == SIZE_MAX) {
      void* mem = p->reserve_space(p->context, sizeof weights[i]);
      if (mem == nullptr) continue;
      std::memcpy(mem, weights[i], sizeof weights[i]);
      off = p->look_up_or_insert(p->context, &key, mem, sizeof weights[i]);
    }
    if (off == SIZE_MAX) continue;
    const void* got = p->offset_to_addr(p->context, off);
    if (got != nullptr && std::memcmp(got, weights[i], sizeof weights[i]) != 0) {
      std::fprintf(stderr, "adapter: wrong bytes for buffer %d\n", i);
      _exit(kWrongBytes);
    }
  }
  (void)p->is_finalized(p->context);
  (void)wc_finalize(c);
  wc_xnn_adapter_stats st;
  wc_xnn_adapter_stats_init(&st);
  (void)wc_xnn_adapter_get_stats(a, &st);
  wc_xnn_adapter_destroy(a);
}

// A thread that has not called the library before: its first calls fail (a caller error, then
// whatever runs out of memory), and it reads its last error. Per-thread state set up at a
// thread's first failure must not need memory the host may not have.
struct NewThread {
  Child* ch;
  wc_cache* c;
};
void* new_thread_body(void* arg) {
  auto* t = static_cast<NewThread*>(arg);
  wc_cache* none = nullptr;
  (void)wc_open(nullptr, &none);
  (void)wc_last_error();
  (void)weightcache::last_error();
  t->ch->insert(t->c, 7, 2);
  (void)wc_last_error();
  t->ch->check_hit(t->c, 7, wc_look_up(t->c, "w7", 2));
  return nullptr;
}
void new_thread_phase(Child& ch, wc_cache* c) {
  NewThread t{&ch, c};
  pthread_t thread;
  if (::pthread_create(&thread, nullptr, new_thread_body, &t) != 0) return;
  ::pthread_join(thread, nullptr);
}

// With WC_ALLOC_ONLY set, says where the scenario is (by allocation count) on stderr.
void phase(const char* name) {
  if (std::getenv("WC_ALLOC_ONLY") != nullptr) std::fprintf(stderr, "phase %s at allocation %ld\n", name, g_count.load());
}

void scenario(const std::string& dir, const std::string& path, Child& ch) {
  std::string kept_log;
  wc_set_log_callback(log_sink, &kept_log);
  wc_options o = file_options(path);

  // Create, insert, finalize, look up.
  wc_cache* c = nullptr;
  if (wc_open(&o, &c) == WC_OK) {
    ch.opened();
    for (int i = 0; i < 16; ++i) ch.insert(c, i, 1);
    ch.finalize(c);
    ch.look_up_all(c);
    // Replace four, add eight more.
    for (int i = 0; i < 4; ++i) ch.insert(c, i, 2);
    for (int i = 16; i < kKeys; ++i) ch.insert(c, i, 1);
    ch.finalize(c);
    (void)wc_refresh(c);
    wc_stats s;
    wc_stats_init(&s);
    (void)wc_get_stats(c, &s);
    (void)wc_get_fd(c);
    (void)wc_is_finalized(c);
  phase("second");
    // A second handle of the same cache (the process-wide registry), then the adapter.
    wc_cache* second = nullptr;
    if (wc_open(&o, &second) == WC_OK) {
      ch.look_up_all(second);
      wc_close(second);
    }
  phase("new-thread");
    new_thread_phase(ch, c);
  phase("adapter");
    adapter_phase(c);
    wc_close(c);
  }
  (void)wc_last_error();

  // Compaction at open: the four replaced entries are dead bytes.
  phase("compact-at-open");
  wc_options eager = file_options(path);
  eager.compact_dead_percent = 1;
  eager.compact_min_dead_bytes = 1;
  if (wc_open(&eager, &c) == WC_OK) {
    ch.opened();
    ch.look_up_all(c);
    wc_close(c);
  }

  // A rebuild: another cache file, written under one key and opened under another.
  phase("rebuild");
  {
    std::string other;
    {
      Quiet q;
      other = dir + "/other.wc";
    }
    wc_options a = file_options(other);
    if (wc_open(&a, &c) == WC_OK) {
      void* mem = wc_reserve_space(c, 100);
      if (mem != nullptr) {
        std::memset(mem, 1, 100);
        (void)wc_look_up_or_insert(c, "k", 1, mem, 100);
      }
      (void)wc_finalize(c);
      wc_close(c);
    }
    wc_options b = file_options(other);
    b.compat_key = "another key";
    b.compat_key_size = 11;
    if (wc_open(&b, &c) == WC_OK) {
      const std::size_t off = wc_look_up(c, "k", 1);
      if (off != SIZE_MAX) {
        std::fprintf(stderr, "a file written under another key served an entry\n");
        _exit(kWrongBytes);
      }
      void* mem = wc_reserve_space(c, 100);
      if (mem != nullptr) {
        std::memset(mem, 2, 100);
        const std::size_t got = wc_look_up_or_insert(c, "k", 1, mem, 100);
        const auto* p = static_cast<const unsigned char*>(got == SIZE_MAX ? nullptr : wc_offset_to_addr(c, got));
        if (p != nullptr && (p[0] != 2 || p[99] != 2)) _exit(kWrongBytes);
      }
      (void)wc_finalize(c);
      wc_close(c);
    }
  }

  phase("compact");
  // Compaction (what `weightcache compact --canonical` calls), then a read-only load.
  wc_compact_report rep;
  wc_compact_report_init(&rep);
  (void)wc_compact_ex(&o, WC_COMPACT_CANONICAL, &rep);
  wc_options ro = file_options(path);
  ro.read_only = 1;
  ro.verify = WC_VERIFY_ON_OPEN;
  if (wc_open(&ro, &c) == WC_OK) {
    ch.opened();
    ch.look_up_all(c);
    wc_close(c);
  }

  phase("gc");
  // gc over the directory with room to spare (what `weightcache gc` calls): keeps the cache.
  wc_gc_report g;
  wc_gc_report_init(&g);
  (void)wc_gc(dir.c_str(), 1ull << 40, &g);

  phase("reopen");
  // Reopen read-write: replace one more, finalize.
  if (wc_open(&o, &c) == WC_OK) {
    ch.opened();
    ch.look_up_all(c);
    ch.insert(c, 5, 3);
    ch.finalize(c);
    wc_close(c);
  }

  phase("heap");
  // The C++ API over a heap cache: nothing persists, look-ups see what was inserted.
  {
    Options heap;
    heap.backing = Backing::heap;
    if (auto w = WeightCache::open(heap); w) {
      WeightCache cache = std::move(w).value();
      const std::size_t off = cache.insert("h", "heap bytes");
      if (off != kNotFound) {
        const void* p = cache.offset_to_addr(off);
        if (p != nullptr && std::memcmp(p, "heap bytes", 10) != 0) _exit(kWrongBytes);
      }
      (void)cache.look_up("h");
      (void)cache.stats();
      (void)cache.finalize();
    }
  }
  wc_set_log_callback(nullptr, nullptr);
}

struct ChildRun {
  int status = 0;          // waitpid's
  bool injected = false;   // the n-th allocation was reached (and failed)
  long allocations = 0;    // allocations the scenario made (count-only runs)
  std::vector<std::string> events;
};

ChildRun run_child(const std::string& dir, long fail_at) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork");
  if (pid == 0) {
    ::close(fds[0]);
    Reporter out(fds[1]);
    Child ch{out};
    g_count = 0;
    g_failed = false;
    const std::string path = dir + "/cache.wc";
    g_fail_at = fail_at;
    scenario(dir, path, ch);
    const bool failed = g_failed.load();
    const long count = g_count.load();
    g_fail_at = 0;
    out.line("N %ld %ld\n", count, failed ? 1 : 0);
    _exit(kRanToTheEnd);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  ChildRun r;
  while (::waitpid(pid, &r.status, 0) < 0 && errno == EINTR) {
  }
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("N ", 0) == 0) {
      long count = 0, failed = 0;
      std::sscanf(line.c_str(), "N %ld %ld", &count, &failed);
      r.allocations = count;
      r.injected = failed != 0;
    } else {
      r.events.push_back(line);
    }
  }
  return r;
}

// Opens the cache as a fresh process would and checks every entry a WC_OK finalize covered:
// present, with the bytes of that version or of a later one inserted after it.
std::string check_durable(const std::string& dir, const std::vector<std::string>& events) {
  // durable: the version of each key the latest WC_OK finalize covered (entries inserted into
  // the cache object it finalized; an earlier object's stay durable).
  int session[kKeys] = {}, durable[kKeys] = {};
  for (const auto& e : events) {
    int i = 0, v = 0;
    if (std::sscanf(e.c_str(), "I %d %d", &i, &v) == 2 && i >= 0 && i < kKeys) {
      session[i] = v;
    } else if (e == "O") {
      std::fill(std::begin(session), std::end(session), 0);
    } else if (e == "F") {
      for (int k = 0; k < kKeys; ++k)
        if (session[k] != 0) durable[k] = session[k];
    }
  }
  const std::string path = dir + "/cache.wc";
  wc_options o = file_options(path);
  o.read_only = 1;
  o.backing = WC_BACKING_FILE;
  wc_cache* c = nullptr;
  const bool any_durable = std::any_of(std::begin(durable), std::end(durable), [](int v) { return v != 0; });
  if (wc_open(&o, &c) != WC_OK) {
    return any_durable ? std::string("cannot open the cache: ") + wc_last_error() : std::string();
  }
  std::string problems;
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = key_name(i);
    const std::size_t off = wc_look_up(c, key.data(), key.size());
    const void* p = off == SIZE_MAX ? nullptr : wc_offset_to_addr(c, off);
    int found = 0;
    for (int v = 1; v <= 3 && p != nullptr; ++v) {
      const std::string want = content(i, v);
      if (std::memcmp(p, want.data(), want.size()) == 0) found = v;
    }
    if (p != nullptr && found == 0) problems += key + ": wrong bytes; ";
    if (durable[i] != 0 && found < durable[i])
      problems += key + ": finalized at version " + std::to_string(durable[i]) + ", found " +
                  (p == nullptr ? std::string("nothing") : "version " + std::to_string(found)) + "; ";
  }
  wc_close(c);
  return problems;
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  if (WIFEXITED(status)) {
    switch (WEXITSTATUS(status)) {
      case kWrongBytes: return "a look-up returned wrong bytes";
      case kHarnessBroken: return "the harness could not report";
      default: return "exit status " + std::to_string(WEXITSTATUS(status));
    }
  }
  return "status " + std::to_string(status);
}

constexpr int kShards = 4;

// Runs the scenario once in this process first: what the library and its dependencies set up
// lazily on first use (loggers, tables) is then set up before every fork, so the n-th
// allocation is the same point in every run.
void warm_up() {
  static const bool done = [] {
    TempDir dir("wc-alloc");
    const int null_fd = ::open("/dev/null", O_WRONLY);
    Reporter out(null_fd);
    Child ch{out};
    scenario(dir.path().string(), dir.file("cache.wc"), ch);
    ::close(null_fd);
    return true;
  }();
  (void)done;
}

long scenario_allocations() {
  static const long n = [] {
    warm_up();
    TempDir dir("wc-alloc");
    const ChildRun r = run_child(dir.path().string(), -1);
    return WIFEXITED(r.status) && WEXITSTATUS(r.status) == kRanToTheEnd ? r.allocations : -1;
  }();
  return n;
}

class AllocationFailure : public ::testing::TestWithParam<int> {};

// Without any failure the scenario runs to the end and everything it finalized is found: the
// reference the failing runs are held to.
TEST(AllocationFailureBaseline, TheScenarioPassesWithoutFailures) {
  warm_up();
  TempDir dir("wc-alloc");
  const ChildRun r = run_child(dir.path().string(), -1);
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == kRanToTheEnd) << describe(r.status);
  EXPECT_FALSE(r.injected);
  EXPECT_GT(r.allocations, 200) << "the scenario should reach many allocation points";
  EXPECT_GE(std::count(r.events.begin(), r.events.end(), "F"), 3) << "every finalize of the scenario returns WC_OK";
  EXPECT_EQ(check_durable(dir.path().string(), r.events), "");
  std::printf("[ alloc ] the scenario makes %ld allocations\n", r.allocations);
}

// Fails each allocation point once (this shard's share of them).
TEST_P(AllocationFailure, EveryAllocationPointFailedOnceNeitherAbortsNorServesWrongBytes) {
  const long total = scenario_allocations();
  ASSERT_GT(total, 0) << "the scenario does not run without failures";
  const int shard = GetParam();
  long runs = 0, injected = 0;
  std::vector<std::string> failures;
  // A little past the count: a failure can make a path allocate more than the plain run did.
  const long last = total + total / 10 + 20;
  // WC_ALLOC_ONLY=n runs that one allocation point (its child's output on stderr).
  long only = 0;
  if (const char* e = std::getenv("WC_ALLOC_ONLY")) only = std::atol(e);
  for (long n = 1 + shard; n <= last; n += kShards) {
    if (only != 0 && n != only) continue;
    TempDir dir("wc-alloc");
    const ChildRun r = run_child(dir.path().string(), n);
    if (only != 0) std::system(("ls -la " + dir.path().string() + " >&2").c_str());
    ++runs;
    if (r.injected) ++injected;
    std::string why;
    if (!(WIFEXITED(r.status) && WEXITSTATUS(r.status) == kRanToTheEnd)) why = describe(r.status);
    else if (std::string lost = check_durable(dir.path().string(), r.events); !lost.empty()) why = lost;
    if (!why.empty() && failures.size() < 200) failures.push_back("allocation " + std::to_string(n) + ": " + why);
  }
  std::printf("[ alloc ] shard %d: %ld runs, %ld with a failed allocation, %zu failures\n", shard, runs, injected,
              failures.size());
  if (only == 0) {
    EXPECT_GT(injected, total / kShards / 2);
  }
  for (const auto& f : failures) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(Shards, AllocationFailure, ::testing::Range(0, kShards));

// An unnamed kernel's insert that runs out of memory part-way leaves no half-recorded entry:
// after the address is unbound, a look-up for new weights there misses instead of finding the
// old bytes. And a private heap that could not be created is tried again at the next call.
TEST(AllocationFailureAdapter, AnUnnamedInsertThatFailsLeavesNothingBehindAtItsAddress) {
  warm_up();
  static unsigned char kernel[16];
  for (int in_insert = 0; in_insert <= 1; ++in_insert)  // fail in reserve_space, then in the insert
  for (long n = 1; n <= 200; ++n) {
    wc_options o;
    wc_options_init(&o);
    wc_cache* c = nullptr;
    ASSERT_EQ(wc_open(&o, &c), WC_OK);
    wc_xnn_adapter* a = nullptr;
    ASSERT_EQ(wc_xnn_adapter_create(c, &a), WC_OK);
    auto* p = static_cast<wc_xnn_weights_cache_provider*>(wc_xnn_adapter_provider(a));
    wc_xnn_weights_cache_look_up_key key{1, kernel, nullptr, 2};
    ASSERT_EQ(p->look_up(p->context, &key), SIZE_MAX);
    // The first reservation creates the private heap: fail inside that too (then retried).
    g_count = 0;
    g_failed = false;
    g_fail_at = in_insert ? 0 : n;
    void* mem = p->reserve_space(p->context, 64);
    g_fail_at = 0;
    const bool failed_in_reserve = g_failed.load();
    if (mem == nullptr) {
      ASSERT_TRUE(failed_in_reserve);
      ASSERT_EQ(p->look_up(p->context, &key), SIZE_MAX);
      mem = p->reserve_space(p->context, 64);
      ASSERT_NE(mem, nullptr) << "allocation " << n << ": a failure to create the private heap is permanent";
    }
    std::memset(mem, 1, 64);
    g_count = 0;
    g_failed = false;
    g_fail_at = in_insert ? n : 0;
    const std::size_t off = p->look_up_or_insert(p->context, &key, mem, 64);
    g_fail_at = 0;
    const bool reached = failed_in_reserve || (in_insert && g_failed.load());
    // New weights at that address: unbind it (xnnpack.h), then look up.
    ASSERT_EQ(wc_xnn_adapter_name_buffer(a, kernel, nullptr), WC_OK);
    EXPECT_EQ(p->look_up(p->context, &key), SIZE_MAX)
        << "allocation " << n << ": old packed bytes served for new weights at an unbound address (insert "
        << (off == SIZE_MAX ? "failed" : "succeeded") << ")";
    wc_xnn_adapter_destroy(a);
    wc_close(c);
    if (!reached) break;
  }
}

// xnnpack.h: once reserve_space succeeded, look_up_or_insert does not fail. XNNPACK does not
// check it: SIZE_MAX would become a NULL pointer it dereferences. Every allocation point of the
// insert, failed once, for a named weight (the file cache, then the private heap as fallback)
// and an unnamed one (the private heap): a usable offset whose bytes are the packed ones.
TEST(AllocationFailureAdapter, LookUpOrInsertAfterASuccessfulReserveNeverFails) {
  warm_up();
  TempDir dir("wc-alloc");
  static unsigned char kernel[16];
  for (int named = 0; named <= 1; ++named)
  for (long n = 1; n <= 300; ++n) {
    SCOPED_TRACE(std::string(named ? "named" : "unnamed") + " weight, allocation " + std::to_string(n));
    const std::string path = dir.file("adapter" + std::to_string(named) + "-" + std::to_string(n) + ".wc");
    wc_options o;
    wc_options_init(&o);
    o.path = path.c_str();
    o.compat_key = "alloc-adapter";
    wc_cache* c = nullptr;
    ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
    wc_xnn_adapter* a = nullptr;
    ASSERT_EQ(wc_xnn_adapter_create(c, &a), WC_OK);
    if (named) {
      ASSERT_EQ(wc_xnn_adapter_name_buffer(a, kernel, "layer0.weight"), WC_OK);
    }
    auto* p = static_cast<wc_xnn_weights_cache_provider*>(wc_xnn_adapter_provider(a));
    wc_xnn_weights_cache_look_up_key key{7, kernel, nullptr, 3};
    ASSERT_EQ(p->look_up(p->context, &key), SIZE_MAX);
    void* mem = p->reserve_space(p->context, 4096);
    ASSERT_NE(mem, nullptr);
    std::memset(mem, 0x5c, 4096);
    g_count = 0;
    g_failed = false;
    g_fail_at = n;
    const std::size_t off = p->look_up_or_insert(p->context, &key, mem, 4096);
    g_fail_at = 0;
    const bool reached = g_failed.load();
    ASSERT_NE(off, SIZE_MAX) << "look_up_or_insert failed after a successful reserve_space";
    const auto* bytes = static_cast<const unsigned char*>(p->offset_to_addr(p->context, off));
    ASSERT_NE(bytes, nullptr);
    for (std::size_t i = 0; i < 4096; ++i) ASSERT_EQ(bytes[i], 0x5c) << "byte " << i;
    wc_xnn_adapter_destroy(a);
    wc_close(c);
    if (!reached) break;
  }
}

// Issue 26, item 5: memory runs out between every reserve_space and its look_up_or_insert, far
// more often than the 256 slots the adapter has from its creation. Every look_up_or_insert still
// returns an offset (XNNPACK does not check for SIZE_MAX) whose bytes are the packed ones, and
// they stay so while later weights are kept the same way.
TEST(AllocationFailureAdapter, WeightsKeptInPlaceHaveNoLimitOfTheirOwn) {
  warm_up();
  TempDir dir("wc-alloc");
  wc_options o;
  wc_options_init(&o);
  const std::string path = dir.file("in-place.wc");
  o.path = path.c_str();
  o.compat_key = "alloc-in-place";
  wc_cache* c = nullptr;
  ASSERT_EQ(wc_open(&o, &c), WC_OK) << wc_last_error();
  wc_xnn_adapter* a = nullptr;
  ASSERT_EQ(wc_xnn_adapter_create(c, &a), WC_OK);
  auto* p = static_cast<wc_xnn_weights_cache_provider*>(wc_xnn_adapter_provider(a));
  constexpr int kWeights = 300;
  static unsigned char kernels[kWeights];
  std::vector<std::size_t> offsets;
  int in_place = 0;
  for (int i = 0; i < kWeights; ++i) {
    ASSERT_EQ(wc_xnn_adapter_name_buffer(a, &kernels[i], ("w" + std::to_string(i)).c_str()), WC_OK);
    wc_xnn_weights_cache_look_up_key key{static_cast<std::uint32_t>(i), &kernels[i], nullptr, 1};
    void* mem = p->reserve_space(p->context, 256);
    ASSERT_NE(mem, nullptr) << "weight " << i << ": " << wc_last_error();
    std::memset(mem, i & 0xff, 256);
    g_failed = false;
    g_fail_at = kFailEvery;
    const std::size_t off = p->look_up_or_insert(p->context, &key, mem, 256);
    g_fail_at = 0;
    ASSERT_NE(off, SIZE_MAX) << "weight " << i << ": look_up_or_insert failed after a successful reserve_space";
    if (g_failed.load() && off > SIZE_MAX - (std::size_t{4} << 20)) ++in_place;
    offsets.push_back(off);
  }
  EXPECT_GT(in_place, 256) << "memory never ran out where the test needs it: it shows nothing";
  for (int i = 0; i < kWeights; ++i) {
    const auto* bytes = static_cast<const unsigned char*>(p->offset_to_addr(p->context, offsets[i]));
    ASSERT_NE(bytes, nullptr) << "weight " << i;
    for (int b = 0; b < 256; ++b) ASSERT_EQ(bytes[b], i & 0xff) << "weight " << i << " byte " << b;
  }
  wc_xnn_adapter_destroy(a);
  wc_close(c);
}

// Issue 13: an error about a file names it, out of memory included. Each allocation point of
// opening a new cache, reserving and inserting into it, and compacting it, failed once: every
// WC_ERR_NO_MEMORY those calls return says which file.
TEST(AllocationFailureMessages, OutOfMemoryErrorsAboutAFileNameIt) {
  warm_up();
  TempDir dir("wc-alloc");
  long named = 0, reached_points = 0;
  for (long n = 1; n <= 2000; ++n) {
    const std::string path = dir.file("messages-" + std::to_string(n) + ".wc");
    auto check = [&](bool no_memory, const std::string& message, const char* call) {
      if (!no_memory) return;
      EXPECT_NE(message.find(path), std::string::npos)
          << call << ", allocation " << n << ": '" << message << "' does not name the file";
      ++named;
    };
    Options o;
    o.path = path;
    o.compat_key = "alloc-messages";
    o.backing = Backing::file;
    g_count = 0;
    g_failed = false;
    g_fail_at = n;
    {
      auto opened = WeightCache::open(o);
      if (!opened) {
        check(opened.error().code == Errc::no_memory, opened.error().message, "open");
      } else {
        void* p = opened->reserve(4096);
        if (p == nullptr) check(last_error().code == Errc::no_memory, last_error().message, "reserve");
        if (opened->insert("k", "value") == kNotFound)
          check(last_error().code == Errc::no_memory, last_error().message, "insert");
        if (p != nullptr) (void)opened->release(p);
        (void)opened->finalize();
      }
    }
    wc_options w;
    wc_options_init(&w);
    w.path = path.c_str();
    w.compat_key = "alloc-messages";
    const wc_status compacted = wc_compact(&w);
    check(compacted == WC_ERR_NO_MEMORY, wc_last_error(), "wc_compact");
    g_fail_at = 0;
    if (!g_failed.load()) break;
    ++reached_points;
  }
  EXPECT_GT(reached_points, 50) << "the scenario failed too few allocations to mean anything";
  EXPECT_GT(named, 0) << "no call reported running out of memory";
}

// Issue 26, item 3: an allocation that fails once inside an open with automatic backing gives
// that opener a heap cache; the next open of the same file, with the first handle still open or
// closed, uses the file again (a transient failure must not pin the process to the heap).
TEST(AllocationFailureFallback, ATransientFailureAtOpenDoesNotKeepLaterOpensOnTheHeap) {
  warm_up();
  TempDir dir("wc-alloc");
  long fell_back = 0;
  for (long n = 1; n <= 3000; ++n) {
    const std::string path = dir.file("fallback-" + std::to_string(n) + ".wc");
    {  // the file exists and holds an entry
      Options o;
      o.path = path;
      o.compat_key = "alloc-fallback";
      auto made = WeightCache::open(o);
      ASSERT_TRUE(made) << made.error().message;
      ASSERT_NE(made->insert("k", "value"), kNotFound);
      ASSERT_TRUE(made->finalize());
    }
    Options o;
    o.path = path;
    o.compat_key = "alloc-fallback";
    g_count = 0;
    g_failed = false;
    g_fail_at = n;
    bool heap = false, reached = false;
    auto again_uses_the_file = [&](const char* when) {
      auto again = WeightCache::open(o);
      ASSERT_TRUE(again) << again.error().message;
      EXPECT_EQ(again->stats().backing, Backing::file)
          << "allocation " << n << ": after a transient failure, a later open " << when << " stays on the heap";
      EXPECT_NE(again->look_up("k"), kNotFound) << "allocation " << n;
    };
    {
      auto first = WeightCache::open(o);
      g_fail_at = 0;
      reached = g_failed.load();
      heap = first && first->stats().backing == Backing::heap;
      if (heap) again_uses_the_file("(the first still open)");
    }
    if (heap) {
      ++fell_back;
      again_uses_the_file("(the first closed)");
    }
    if (!reached) break;
  }
  EXPECT_GT(fell_back, 0) << "no failed allocation made an open fall back to the heap: the test shows nothing";
}

#if defined(__GLIBC__)
// A thread's first failing calls, and reading its last error, register no thread_local
// destructor: glibc allocates for each registration and aborts the host when that fails.
TEST(AllocationFailureThreads, AThreadsFirstFailureRegistersNoTlsDestructor) {
  warm_up();
  TempDir dir("wc-alloc");
  const std::string path = dir.file("cache.wc");
  long registered = -1;
  std::thread([&] {
    const long before = g_tls_destructors.load();
    wc_cache* none = nullptr;
    EXPECT_EQ(wc_open(nullptr, &none), WC_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(wc_last_error()), "");
    EXPECT_EQ(wc_refresh(nullptr), WC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(weightcache::last_error().code, Errc::invalid_argument);
    registered = g_tls_destructors.load() - before;
  }).join();
  EXPECT_EQ(registered, 0) << "a thread_local with a destructor is set up at a thread's first failure";
}
#endif

// weightcache.h, "Errors": "When memory runs out, any call that allocates may fail with
// WC_ERR_NO_MEMORY (in wc_last_error where it returns NULL or WC_NOT_FOUND), whatever its own
// list below says". Each call below runs in a forked child with its n-th allocation failed, for
// n = 1, 2, ... until a run reaches no n-th allocation; a call that then fails must say
// no_memory, in its status and in last_error().
enum class Call { open_file, open_heap, reserve, insert_copy, insert_reserved, finalize, refresh, get_stats,
                  release, look_up_too_long, compact, gc, adapter_create, name_buffer };
constexpr const char* kCallNames[] = {"wc_open (file)", "wc_open (heap)", "wc_reserve_space",
                                      "wc_look_up_or_insert (copy)", "wc_look_up_or_insert (reservation)",
                                      "wc_finalize", "wc_refresh", "wc_get_stats", "wc_release_space",
                                      "wc_look_up (key too long)", "wc_compact", "wc_gc",
                                      "wc_xnn_adapter_create", "wc_xnn_adapter_name_buffer"};
constexpr int kNoNthAllocation = 10, kSaidNoMemory = 0, kSaidSomethingElse = 11;

int one_call(Call call, const std::string& dir, long fail_at) {
  const std::string path = dir + "/cache.wc", other = dir + "/other.wc";
  wc_options o = file_options(path);
  o.backing = WC_BACKING_FILE;
  wc_cache* c = nullptr;
  if (wc_open(&o, &c) != WC_OK) return kHarnessBroken;
  void* r = wc_reserve_space(c, 4096);
  if (r == nullptr) return kHarnessBroken;
  std::memset(r, 7, 4096);
  const std::string bytes(5000, 'b'), long_key(WC_MAX_KEY_SIZE + 1, 'k');
  if (call == Call::finalize && wc_look_up_or_insert(c, "f", 1, const_cast<char*>(bytes.data()), bytes.size()) == SIZE_MAX)
    return kHarnessBroken;
  if (call == Call::compact) {
    wc_options a = file_options(other);
    wc_cache* d = nullptr;
    if (wc_open(&a, &d) != WC_OK) return kHarnessBroken;
    (void)wc_look_up_or_insert(d, "x", 1, const_cast<char*>(bytes.data()), bytes.size());
    (void)wc_finalize(d);
    wc_close(d);
  }
  wc_xnn_adapter* adapter = nullptr;
  if (call == Call::name_buffer && wc_xnn_adapter_create(c, &adapter) != WC_OK) return kHarnessBroken;
  static float weights[4];
  wc_stats st;
  wc_stats_init(&st);

  g_count = 0;
  g_failed = false;
  g_fail_at = fail_at;
  wc_status status = WC_OK;
  bool failed = false;
  switch (call) {
    case Call::open_file: {
      wc_cache* second = nullptr;
      wc_options f = file_options(other);
      f.backing = WC_BACKING_FILE;
      status = wc_open(&f, &second);
      wc_close(second);
      break;
    }
    case Call::open_heap: {
      wc_options h;
      wc_options_init(&h);
      wc_cache* heap = nullptr;
      status = wc_open(&h, &heap);
      wc_close(heap);
      break;
    }
    case Call::reserve: failed = wc_reserve_space(c, 1u << 20) == nullptr; break;
    case Call::insert_copy:
      failed = wc_look_up_or_insert(c, "copy", 4, const_cast<char*>(bytes.data()), bytes.size()) == SIZE_MAX;
      break;
    case Call::insert_reserved: failed = wc_look_up_or_insert(c, "in-place", 8, r, 4096) == SIZE_MAX; break;
    case Call::finalize: status = wc_finalize(c); break;
    case Call::refresh: status = wc_refresh(c); break;
    case Call::get_stats: status = wc_get_stats(c, &st); break;
    case Call::release: status = wc_release_space(c, r); break;
    case Call::look_up_too_long:  // fails whatever happens; the question is what it says
      failed = wc_look_up(c, long_key.data(), long_key.size()) == SIZE_MAX;
      break;
    case Call::compact: {
      wc_options a = file_options(other);
      status = wc_compact(&a);
      break;
    }
    case Call::gc: status = wc_gc(dir.c_str(), 1ull << 40, nullptr); break;
    case Call::adapter_create: {
      wc_xnn_adapter* a = nullptr;
      status = wc_xnn_adapter_create(c, &a);
      wc_xnn_adapter_destroy(a);
      break;
    }
    case Call::name_buffer: status = wc_xnn_adapter_name_buffer(adapter, weights, "a weight buffer with a long name"); break;
  }
  g_fail_at = 0;
  if (!g_failed.load()) return kNoNthAllocation;
  failed = failed || status != WC_OK;
  if (!failed) return kSaidNoMemory;  // the call got over it
  const Errc code = last_error().code;
  if (call == Call::look_up_too_long && code == Errc::invalid_argument) return kSaidNoMemory;  // its own error
  if ((status != WC_OK && status != WC_ERR_NO_MEMORY) || code != Errc::no_memory) {
    std::fprintf(stderr, "%s with allocation %ld failed: status %d, last error %d: %s\n",
                 kCallNames[static_cast<int>(call)], fail_at, static_cast<int>(status), static_cast<int>(code),
                 last_error().message.c_str());
    return kSaidSomethingElse;
  }
  return kSaidNoMemory;
}

TEST(AllocationFailureStatus, ACallThatRunsOutOfMemorySaysNoMemory) {
  warm_up();
  std::vector<std::string> failures;
  for (int k = 0; k <= static_cast<int>(Call::name_buffer); ++k) {
    const Call call = static_cast<Call>(k);
    long n = 1;
    for (; n <= 400; ++n) {
      TempDir dir("wc-alloc");
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) _exit(one_call(call, dir.path().string(), n));
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (WIFEXITED(status) && WEXITSTATUS(status) == kNoNthAllocation) break;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == kSaidNoMemory))
        failures.push_back(std::string(kCallNames[k]) + ", allocation " + std::to_string(n) + ": " + describe(status));
    }
    EXPECT_LE(n, 400) << kCallNames[k] << " never ran out of allocations to fail";
  }
  for (const auto& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace weightcache::test
