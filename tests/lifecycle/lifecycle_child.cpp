// One actor of the lifecycle torture test (lifecycle_test.cpp), as a separate process:
//   writer   DIR SLOT LOG   insert entries at random, finalize at random, close and reopen often
//   compact  DIR LOG        compact the cache again and again
//   rebuild  DIR LOG        open the cache under another compatibility key (a rebuild when unused)
//   reader   DIR LOG        open read-only and check every entry it finds, byte for byte
// Each runs until DIR/stop exists. Every event the checker needs is one line appended to LOG with
// a single write (O_APPEND): the order of lines is the order in which the events happened.
//   ok KEY SIZE        finalize returned WC_OK with KEY in this cache (logged before the cache closes)
//   notok N STATUS     a finalize returned an error with N entries not durable
//   gone               the file at the path was replaced or removed while nobody had it open
//   compacted / busy   a compaction's outcome
//   wrong KEY          a look-up served bytes other than the key's (never)
#include "child_exit.hpp"
#include "key_content.hpp"

#include <weightcache/weight_cache.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace weightcache;

namespace {

constexpr const char* kKeyA = "model A | packer 1";
constexpr const char* kKeyB = "model B | packer 9";

int g_log = -1;

void log_line(const std::string& line) {
  const std::string l = line + "\n";
  if (::write(g_log, l.data(), l.size()) != static_cast<ssize_t>(l.size()))
    test::child_exit(test::kChildSetupFailed, "cannot append to the log");
}

bool stopped(const std::string& dir) { return ::access((dir + "/stop").c_str(), F_OK) == 0; }

Options cache_options(const std::string& dir, const char* key) {
  Options o;
  o.path = dir + "/model.wcache";
  o.compat_key = key;
  o.durability = Durability::none;  // a kill, not a power loss: the page cache survives it
  o.lease_timeout = std::chrono::milliseconds(100);
  o.max_file_bytes = std::uint64_t{4} << 30;
  // Compact at open whenever there is anything to reclaim, so that opens race compactions too.
  o.compact_min_dead_bytes = 0;
  o.compact_dead_percent = 10;
  return o;
}

std::size_t size_for(std::mt19937_64& rng) { return 1 + rng() % (96 * 1024); }

int writer(const std::string& dir, const std::string& slot) {
  std::mt19937_64 rng(std::random_device{}());
  std::uint64_t n = 0;
  while (!stopped(dir)) {
    auto c = WeightCache::open(cache_options(dir, kKeyA));
    if (!c) return test::child_failed(test::kChildCacheError, "writer: open: " + c.error().message);
    if (c->stats().compactions != 0) log_line("compacted-at-open");
    {
      struct stat st {};
      if (::stat((dir + "/model.wcache").c_str(), &st) == 0)
        log_line("open w" + slot + " pid " + std::to_string(::getpid()) + " backing " +
                 (c->stats().backing == Backing::file ? "file" : "heap") + " ino " + std::to_string(st.st_ino) +
                 " entries " + std::to_string(c->stats().entries));
    }
    std::vector<std::pair<std::string, std::size_t>> unlogged;  // inserted, not yet finalized OK
    const int rounds = 1 + static_cast<int>(rng() % 4);
    for (int r = 0; r < rounds && !stopped(dir); ++r) {
      const int inserts = 1 + static_cast<int>(rng() % 6);
      for (int i = 0; i < inserts; ++i) {
        const std::string key = "w" + slot + "/" + std::to_string(::getpid()) + "/" + std::to_string(n++);
        const std::size_t size = size_for(rng);
        std::size_t off = kNotFound;
        if (rng() % 2 == 0) {
          void* p = c->reserve(size);
          if (p == nullptr) continue;
          test::fill_for_key(key, p, size);
          off = c->look_up_or_insert(key, p, size);
        } else {
          off = c->insert(key, test::bytes_for_key(key, size));
        }
        if (off == kNotFound) return test::child_failed(test::kChildCacheError, "writer: insert of " + key);
        const void* at = c->offset_to_addr(off);
        if (at == nullptr || std::memcmp(at, test::bytes_for_key(key, size).data(), size) != 0) {
          log_line("wrong " + key);
          return test::child_failed(test::kChildMismatch, "writer: wrong bytes for " + key);
        }
        unlogged.emplace_back(key, size);
      }
      if (rng() % 3 == 0) continue;  // leave some for a later finalize, or for the kill
      auto f = c->finalize();
      if (f.ok()) {
        for (const auto& [key, size] : unlogged) log_line("ok " + key + " " + std::to_string(size));
        unlogged.clear();
        if (c->stats().unpersisted_entries != 0)  // OK means nothing is left in memory
          return test::child_failed(test::kChildUnexpected, "writer: finalize said OK but left entries in memory");
      } else {
        log_line("notok " + std::to_string(unlogged.size()) + " " + to_string(f.error().code));
      }
    }
    c = Result<WeightCache>(WeightCache());  // close, then leave the file alone for a moment
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
  }
  return test::kChildOk;
}

int compactor(const std::string& dir) {
  const std::string path = dir + "/model.wcache";
  while (!stopped(dir)) {
    wc_options o;
    wc_options_init(&o);
    o.path = path.c_str();
    o.compat_key = kKeyA;
    o.compat_key_size = std::strlen(kKeyA);
    o.durability = WC_DURABILITY_NONE;
    wc_compact_report r;
    wc_compact_report_init(&r);
    const wc_status st = wc_compact_ex(&o, 0, &r);
    if (st == WC_OK) {
      struct stat s {};
      (void)::stat(path.c_str(), &s);
      log_line(r.compacted ? "compacted entries " + std::to_string(r.entries) + " ino " + std::to_string(s.st_ino)
                           : std::string("compact-nothing"));
    }
    else log_line(std::string("compact-") + wc_status_string(st));
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  return test::kChildOk;
}

int rebuilder(const std::string& dir) {
  std::mt19937_64 rng(std::random_device{}());
  while (!stopped(dir) && ::access((dir + "/stop-rebuild").c_str(), F_OK) != 0) {
    {
      auto c = WeightCache::open(cache_options(dir, kKeyB));
      if (!c) return test::child_failed(test::kChildCacheError, "rebuilder: open: " + c.error().message);
      if (c->stats().backing == Backing::file) {
        // The file at the path is a key-B file now: whatever key-A entries it held are gone, and
        // no key-A writer can commit to it while we hold it (it is in use).
        log_line("gone rebuild");
        const std::string key = "b/" + std::to_string(rng());
        if (c->insert(key, test::bytes_for_key(key, 100)) == kNotFound)
          return test::child_failed(test::kChildCacheError, "rebuilder: insert");
        (void)c->finalize();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 40));
  }
  return test::kChildOk;
}

// Garbage collection of the directory under a budget smaller than what is there: decoy caches
// appear all the time, and the model's cache goes too whenever nobody uses it and it is the least
// recently used ("gone gc": every OK before the removal was committed to the file removed).
int collector(const std::string& dir) {
  std::uint64_t n = 0;
  while (!stopped(dir) && ::access((dir + "/stop-rebuild").c_str(), F_OK) != 0) {
    {
      Options o = cache_options(dir, kKeyA);
      o.path = dir + "/decoy-" + std::to_string(n++ % 6) + ".wcache";
      auto c = WeightCache::open(o);
      if (!c) return test::child_failed(test::kChildCacheError, "collector: open: " + c.error().message);
      (void)c->insert("d", std::string(200 * 1024, 'd'));
      if (!c->finalize().ok()) return test::child_failed(test::kChildCacheError, "collector: finalize");
    }
    auto r = gc(dir, std::uint64_t{3} << 20);
    if (!r) return test::child_failed(test::kChildCacheError, "collector: gc: " + r.error().message);
    for (const auto& f : r->files)
      if (f.removed && f.path.size() >= 13 && f.path.compare(f.path.size() - 13, 13, "/model.wcache") == 0)
        log_line("gone gc");
    log_line("gc removed " + std::to_string(r->removed_files) + " kept-in-use " + std::to_string(r->kept_in_use));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return test::kChildOk;
}

// Checks, read-only, every entry the log says was finalized: found or not (it may be gone), a
// found entry holds exactly its key's bytes.
int reader(const std::string& dir, const std::string& log_path) {
  std::uint64_t checked = 0;
  while (!stopped(dir)) {
    Options o = cache_options(dir, kKeyA);
    o.read_only = true;
    o.refresh_on_miss = true;
    auto c = WeightCache::open(o);
    if (!c) return test::child_failed(test::kChildCacheError, "reader: open: " + c.error().message);
    FILE* f = std::fopen(log_path.c_str(), "r");
    if (f == nullptr) return test::child_failed(test::kChildSetupFailed, "reader: cannot read the log");
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      char key[400];
      unsigned long long size = 0;
      if (std::sscanf(line, "ok %399s %llu", key, &size) != 2) continue;
      const std::size_t off = c->look_up(key);
      if (off == kNotFound) continue;
      const void* at = c->offset_to_addr(off);
      if (at == nullptr || std::memcmp(at, test::bytes_for_key(key, size).data(), size) != 0) {
        log_line(std::string("wrong ") + key);
        std::fclose(f);
        return test::child_failed(test::kChildMismatch, std::string("reader: wrong bytes for ") + key);
      }
      ++checked;
    }
    std::fclose(f);
    c = Result<WeightCache>(WeightCache());
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  log_line("reader-checked " + std::to_string(checked));
  return test::kChildOk;
}

// The final check, in a process that never had the cache open: every entry finalized OK after
// the last time the file was legitimately replaced or removed is found, byte for byte.
int checker(const std::string& dir, const std::string& log_path) {
  std::vector<std::pair<std::string, std::size_t>> required;
  FILE* f = std::fopen(log_path.c_str(), "r");
  if (f == nullptr) return test::child_failed(test::kChildSetupFailed, "checker: cannot read the log");
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    char key[400];
    unsigned long long size = 0;
    if (std::strncmp(line, "gone", 4) == 0) required.clear();
    else if (std::sscanf(line, "ok %399s %llu", key, &size) == 2) required.emplace_back(key, size);
  }
  std::fclose(f);
  Options o = cache_options(dir, kKeyA);
  o.read_only = true;
  o.backing = Backing::file;
  o.verify = Verify::on_open;
  auto c = WeightCache::open(o);
  if (!c) {
    if (required.empty()) return test::kChildOk;
    return test::child_failed(test::kChildCacheError, "checker: cannot open: " + c.error().message);
  }
  std::size_t missing = 0, wrong = 0;
  for (const auto& [key, size] : required) {
    const std::size_t off = c->look_up(key);
    if (off == kNotFound) {
      if (++missing <= 5) std::fprintf(stderr, "checker: '%s' finalized OK but missing\n", key.c_str());
      continue;
    }
    if (std::memcmp(c->offset_to_addr(off), test::bytes_for_key(key, size).data(), size) != 0) ++wrong;
  }
  std::printf("checked %zu entries finalized OK since the last replacement: %zu missing, %zu wrong\n",
              required.size(), missing, wrong);
  return missing == 0 && wrong == 0 ? test::kChildOk
                                    : test::child_failed(test::kChildMismatch, "checker: entries missing or wrong");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return test::child_failed(test::kChildUsage, "lifecycle_child MODE DIR [SLOT] LOG");
  const std::string mode = argv[1], dir = argv[2];
  const std::string log_path = argv[argc - 1];
  g_log = ::open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (g_log < 0) return test::child_failed(test::kChildSetupFailed, "cannot open the log " + log_path);
  // The library's own account of what it did (rebuilds, compactions, fallbacks) goes into the
  // event log too, so a failed run can be read back.
  set_log_level(LogLevel::info);
  static std::string prefix;
  prefix = "lib " + mode + " " + std::to_string(::getpid()) + ": ";
  static bool rebuilder_process = false;
  rebuilder_process = mode == "rebuild";
  set_log_callback(
      [](void*, wc_log_level, const char* msg, std::size_t n) {
        const std::string m(msg, n);
        log_line(prefix + m);
        // The rebuilder's open replaces the file whenever it finds it unused, even when its cache
        // then ends up in memory (a writer got the new file first and rebuilt it back): that is
        // the moment every key-A entry legitimately goes. It holds the file alone while this is
        // logged, so every OK before this line was committed to the file it replaces.
        if (rebuilder_process && m.find("building a fresh one") != std::string::npos) log_line("gone rebuild at open");
      },
      nullptr);
  if (mode == "writer" && argc == 5) return writer(dir, argv[3]);
  if (mode == "compact") return compactor(dir);
  if (mode == "rebuild") return rebuilder(dir);
  if (mode == "gc") return collector(dir);
  if (mode == "reader") return reader(dir, log_path);
  if (mode == "check") return checker(dir, log_path);
  return test::child_failed(test::kChildUsage, "unknown mode " + mode);
}
