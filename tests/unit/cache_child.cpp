// Helper process for the unit tests: writes or verifies a cache from a fresh address space
// and a fresh process-wide registry, as a second launch of an application would.
//
//   cache_child write  <cache> <seed> <count> <max_size>   pack an entry set, finalize
//   cache_child verify <cache> <seed> <count> <max_size>   every entry hits with its bytes
//   cache_child verify-manifest <cache> <manifest>         every (key, bytes) of the manifest hits
//   cache_child offset <cache> <key> <offset>               the key hits at exactly that offset
//   cache_child miss <cache> <key>                          the key misses (its checksum fails, say)
//   cache_child log-levels <dir>                            exits with 40 + the levels its callback
//       saw (bit 0: debug, bit 1: warn), from a debug and a warning message it provokes under the
//       default level, which WEIGHTCACHE_LOG_LEVEL may set; bit 2: the callback got the message
//       that WEIGHTCACHE_LOG_LEVEL is not a level (kept in <dir>/complaint.txt), bit 3: more than once,
//       bit 4: only after the host's own first line (wc_log_message), the first message of all
//   cache_child fork-at-first-use <dir>                     a thread makes this process's first open
//       and log lines while the main thread forks; each forked child opens a heap cache of its own
//       and logs (exit 0), or is killed by an alarm after 20 s (it hung): exits kChildUnexpected
#include "cache_test_util.hpp"

#include <weightcache/weightcache.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__) || defined(__APPLE__)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

using namespace weightcache;
using namespace weightcache::test;

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: cache_child write|verify <cache> <seed> <count> <max_size>\n"
               "       cache_child verify-manifest <cache> <manifest>\n"
               "       cache_child offset <cache> <key> <offset>\n"
               "       cache_child miss <cache> <key>\n"
               "       cache_child log-levels <dir>\n");
  return kChildUsage;
}

// log-levels exits with kLevelsSeen plus the levels seen, clear of the shared exit codes.
constexpr int kLevelsSeen = 40;
int g_levels_seen = 0;
std::string g_complaint_file;
bool g_host_line_seen = false;

void note_level(void*, wc_log_level level, const char* message, size_t size) {
  if (level == WC_LOG_DEBUG) g_levels_seen |= 1;
  if (level == WC_LOG_WARN) g_levels_seen |= 2;
  const std::string text(message, size);
  if (text == "a line of the host's") g_host_line_seen = true;
  if (text.find("is not a level") == std::string::npos) return;
  g_levels_seen |= (g_levels_seen & 4) != 0 ? 8 : 4;
  if (g_host_line_seen) g_levels_seen |= 16;
  if (std::FILE* f = std::fopen(g_complaint_file.c_str(), "wb")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
}

// A debug message (an entry replaced) and a warning (a file that cannot be created, so the open
// falls back to heap memory), without ever setting the level: what arrives is the default's doing.
int log_levels(const std::string& dir) {
  g_complaint_file = dir + "/complaint.txt";
  std::remove(g_complaint_file.c_str());
  wc_set_log_callback(&note_level, nullptr);  // the host's first call: before the level is read
  wc_log_message(WC_LOG_WARN, "a line of the host's");  // the first message: the complaint goes before it
  {
    auto heap = WeightCache::open(Options{});
    if (!heap) return child_failed(kChildCacheError, "heap open failed: " + heap.error().message);
    if (heap->insert("k", "one") == kNotFound || heap->insert("k", "two") == kNotFound)
      return child_failed(kChildCacheError, "insert failed: " + last_error().message);
  }
  Options o;
  o.path = dir + "/missing-directory/cache.wcache";
  auto fallback = WeightCache::open(o);
  if (!fallback) return child_failed(kChildCacheError, "fallback open failed: " + fallback.error().message);
  wc_set_log_callback(nullptr, nullptr);
  return kLevelsSeen + g_levels_seen;
}

#if defined(__linux__) || defined(__APPLE__)
void slow_sink(void*, wc_log_level, const char*, size_t) { ::usleep(200); }

// weightcache.h, "Caveats": a child may open and log whatever the parent's threads were doing in
// the library at the fork. The first open and the first log line of a process are where the
// library once made its fork handlers and other statics lazily: a fork then could leave one
// half-made in the child, whose own open waited for it forever.
int fork_at_first_use() {
  wc_set_log_level(WC_LOG_DEBUG);  // not a log line: the first one comes from the thread
  std::atomic<bool> done{false};
  std::thread first([&] {
    wc_set_log_callback(&slow_sink, nullptr);
    for (int i = 0; i < 20; ++i) {
      wc_options o;
      wc_options_init(&o);
      o.backing = WC_BACKING_HEAP;
      wc_cache* c = nullptr;
      if (wc_open(&o, &c) == WC_OK) wc_close(c);
    }
    done = true;
  });
  // Forking back to back, the children waited for afterwards: a fork is in progress most of the
  // time, as it must be for the thread's first calls to meet one.
  std::vector<pid_t> children;
  while (!done.load() && children.size() < 200) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(20);
      wc_options o;
      wc_options_init(&o);
      o.backing = WC_BACKING_HEAP;
      wc_cache* c = nullptr;
      if (wc_open(&o, &c) != WC_OK) ::_exit(kChildCacheError);
      wc_log_message(WC_LOG_WARN, "a line from a forked child");
      wc_close(c);
      ::_exit(kChildOk);
    }
    if (pid > 0) children.push_back(pid);
  }
  int hung = 0, failed = 0;
  for (const pid_t pid : children) {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) continue;
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) ++hung;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != kChildOk) ++failed;
  }
  first.join();
  if (hung > 0) return child_failed(kChildUnexpected, std::to_string(hung) + " forked children hung");
  if (failed > 0) return child_failed(kChildCacheError, std::to_string(failed) + " forked children failed");
  return kChildOk;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string mode = argv[1];
  if (mode == "log-levels") return argc == 3 ? log_levels(argv[2]) : usage();
#if defined(__linux__) || defined(__APPLE__)
  if (mode == "fork-at-first-use") return fork_at_first_use();
#endif
  auto opened = WeightCache::open(file_options(argv[2], Durability::full));
  if (!opened) return child_failed(kChildCacheError, "open failed: " + opened.error().message);
  WeightCache& cache = opened.value();

  if (mode == "verify-manifest") {
    if (argc != 4) return usage();
    Manifest m;
    if (!read_manifest(argv[3], &m)) return child_failed(kChildUsage, "cannot read the manifest");
    for (std::size_t i = 0; i < m.size(); ++i) {
      auto err = verify_entry(cache, m[i].first, m[i].second, "manifest entry " + std::to_string(i));
      if (!err.empty()) return child_failed(kChildMismatch, err);
    }
    return kChildOk;
  }

  if (mode == "offset" || mode == "miss") {
    if (argc != (mode == "offset" ? 5 : 4)) return usage();
    const std::size_t off = cache.look_up(argv[3]);
    if (mode == "miss")
      return off == kNotFound ? kChildOk : child_failed(kChildMismatch, std::string("'") + argv[3] + "' hit");
    const std::size_t want = std::strtoull(argv[4], nullptr, 10);
    if (off != want)
      return child_failed(kChildMismatch,
                          std::string("'") + argv[3] + "' is at offset " + std::to_string(off) + ", not " + argv[4]);
    return kChildOk;
  }

  if (argc != 6) return usage();
  EntrySetSpec spec;
  spec.seed = std::strtoull(argv[3], nullptr, 10);
  spec.count = std::strtoull(argv[4], nullptr, 10);
  spec.max_size = std::strtoull(argv[5], nullptr, 10);
  if (mode == "write") {
    if (auto err = write_entry_set(cache, spec); !err.empty()) return child_failed(kChildCacheError, err);
    if (auto r = cache.finalize(); !r) return child_failed(kChildCacheError, "finalize failed: " + r.error().message);
    return kChildOk;
  }
  if (mode == "verify") {
    if (auto err = verify_entry_set(cache, spec); !err.empty()) return child_failed(kChildMismatch, err);
    return kChildOk;
  }
  return usage();
}
