// Many threads on one cache (file-backed, and heap-only): look-ups while others reserve and
// insert, a key raced by every thread, finalize while others insert, offset_to_addr from all.
// Every byte is verified. The suite is built and run under ThreadSanitizer in CI.
#include "thread_test_util.hpp"

#include <weightcache/weightcache.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

namespace weightcache::test {
namespace {

constexpr std::size_t kThreads = 8;

enum class Kind { file, heap };
void PrintTo(Kind k, std::ostream* os) { *os << (k == Kind::file ? "file" : "heap"); }

class Threads : public ::testing::TestWithParam<Kind> {
 protected:
  bool file() const { return GetParam() == Kind::file; }
  Options options() const { return thread_options(file() ? dir_.file("cache.wcache") : std::string()); }
  WeightCache open() {
    auto r = WeightCache::open(options());
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    if (!r.ok()) return WeightCache{};
    EXPECT_EQ(r->stats().backing, file() ? Backing::file : Backing::heap);
    return std::move(r.value());
  }
  /// For a file cache: a fresh open (after every handle closed) holds exactly `expected`.
  void check_reopened(const std::map<std::string, std::string>& expected) {
    if (!file()) return;
    WeightCache c = open();
    ASSERT_TRUE(c);
    EXPECT_EQ(c.stats().entries, expected.size());
    for (const auto& [key, bytes] : expected) EXPECT_EQ(check_bytes(c, key, bytes), "");
  }

  TempDir dir_{"wc-threads"};
};

/// Runs fn(t) on kThreads threads and joins them.
template <class Fn>
void run_threads(Fn fn) {
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < kThreads; ++t) threads.emplace_back(fn, t);
  for (auto& th : threads) th.join();
}

// Packs `key` the way XNNPACK does (reserve, fill in place, look_up_or_insert); "" on success.
std::string pack(WeightCache& cache, const std::string& key, const std::string& bytes) {
  void* p = cache.reserve(bytes.size());
  if (p == nullptr) return "reserve: " + last_error().message;
  std::memcpy(p, bytes.data(), bytes.size());
  const std::size_t off = cache.look_up_or_insert(key, p, bytes.size());
  if (off == kNotFound) return "look_up_or_insert('" + key + "'): " + last_error().message;
  if (cache.offset_to_addr(off) != p) return "'" + key + "' was not committed in place";
  return check_bytes(cache, key, bytes);
}

TEST_P(Threads, LookUpsRunWhileOtherThreadsReserveAndInsert) {
  constexpr std::size_t kWriters = 4, kBase = 64, kPerWriter = 48;
  std::map<std::string, std::string> expected;
  std::vector<std::string> base_keys;
  std::vector<std::vector<std::string>> writer_keys(kWriters);
  for (std::size_t i = 0; i < kBase; ++i) {
    base_keys.push_back("base/" + std::to_string(i));
    expected[base_keys.back()] = bytes_for_key(base_keys.back(), size_for(i));
  }
  for (std::size_t t = 0; t < kWriters; ++t)
    for (std::size_t i = 0; i < kPerWriter; ++i) {
      writer_keys[t].push_back("w/" + std::to_string(t) + "/" + std::to_string(i));
      expected[writer_keys[t].back()] = bytes_for_key(writer_keys[t].back(), size_for(1000 + t * kPerWriter + i));
    }
  {
    WeightCache cache = open();
    ASSERT_TRUE(cache);
    for (const auto& key : base_keys) ASSERT_NE(cache.insert(key, expected[key]), kNotFound);
    ASSERT_TRUE(cache.finalize().ok());

    Errors errors;
    std::atomic<std::size_t> writers_done{0};
    std::atomic<std::uint64_t> reader_hits{0};
    Barrier start(kThreads);
    run_threads([&](std::size_t t) {
      start.arrive_and_wait();
      if (t < kWriters) {
        for (const auto& key : writer_keys[t])
          if (auto err = pack(cache, key, expected.at(key)); !err.empty()) errors.add(err);
        writers_done.fetch_add(1, std::memory_order_release);
        return;
      }
      std::map<std::string, std::size_t> seen;  // writer key -> offset at first sight
      for (;;) {
        const bool last_pass = writers_done.load(std::memory_order_acquire) == kWriters;
        for (const auto& key : base_keys)
          if (auto err = check_bytes(cache, key, expected.at(key)); !err.empty()) errors.add(err);
        for (const auto& keys : writer_keys)
          for (const auto& key : keys) {
            const std::size_t off = cache.look_up(key);
            auto it = seen.find(key);
            if (it != seen.end()) {
              if (off != it->second) errors.add("'" + key + "' moved or vanished");
              continue;
            }
            if (off == kNotFound) {
              if (last_pass) errors.add("'" + key + "' misses after its writer finished");
              continue;
            }
            // First sight: the whole entry, as its writer packed it.
            if (auto err = check_bytes(cache, key, expected.at(key)); !err.empty()) errors.add(err);
            seen.emplace(key, off);
            reader_hits.fetch_add(1, std::memory_order_relaxed);
          }
        if (last_pass) break;
      }
    });
    ASSERT_TRUE(errors.none());
    EXPECT_EQ(reader_hits.load(), (kThreads - kWriters) * kWriters * kPerWriter);
    EXPECT_EQ(cache.stats().entries, kBase + kWriters * kPerWriter);
    for (const auto& [key, bytes] : expected) EXPECT_EQ(check_bytes(cache, key, bytes), "");
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
  }
  check_reopened(expected);
}

TEST_P(Threads, AKeyRacedByEveryThreadEndsAsOneEntry) {
  constexpr std::size_t kKeys = 24;
  std::vector<std::string> keys, bytes;
  std::map<std::string, std::string> expected;
  for (std::size_t k = 0; k < kKeys; ++k) {
    keys.push_back("race/" + std::to_string(k));
    bytes.push_back(bytes_for_key(keys.back(), size_for(3 * k + 1)));
    expected[keys.back()] = bytes.back();
  }
  {
    WeightCache cache = open();
    ASSERT_TRUE(cache);
    Errors errors;
    std::vector<std::vector<std::size_t>> got(kThreads, std::vector<std::size_t>(kKeys, kNotFound));
    Barrier sync(kThreads);
    run_threads([&](std::size_t t) {
      for (std::size_t k = 0; k < kKeys; ++k) {
        sync.arrive_and_wait();  // all threads on the same key at the same moment
        if (t % 2 == 0) {
          // In place: the losers' reservations must be given back, not committed.
          void* p = cache.reserve(bytes[k].size());
          if (p == nullptr) {
            errors.add("reserve: " + last_error().message);
            continue;
          }
          std::memcpy(p, bytes[k].data(), bytes[k].size());
          got[t][k] = cache.look_up_or_insert(keys[k], p, bytes[k].size());
        } else {
          got[t][k] = cache.insert(keys[k], bytes[k]);
        }
        if (got[t][k] == kNotFound) errors.add("insert of '" + keys[k] + "' failed: " + last_error().message);
      }
      sync.arrive_and_wait();
      for (std::size_t k = 0; k < kKeys; ++k) {
        if (cache.look_up(keys[k]) != got[t][k]) errors.add("'" + keys[k] + "': look_up differs from what insert returned");
        if (auto err = check_bytes(cache, keys[k], bytes[k]); !err.empty()) errors.add(err);
      }
    });
    ASSERT_TRUE(errors.none());
    for (std::size_t k = 0; k < kKeys; ++k)
      for (std::size_t t = 1; t < kThreads; ++t)
        EXPECT_EQ(got[t][k], got[0][k]) << "threads 0 and " << t << " got different entries for " << keys[k];
    const Stats s = cache.stats();
    EXPECT_EQ(s.entries, kKeys);
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
    std::printf("%s: %zu keys raced by %zu threads -> %llu entries, %llu dead bytes after finalize\n",
                file() ? "file" : "heap", kKeys, kThreads, static_cast<unsigned long long>(cache.stats().entries),
                static_cast<unsigned long long>(cache.stats().dead_bytes));
  }
  check_reopened(expected);
}

TEST_P(Threads, FinalizeRunsConcurrentlyWithInsertsAndLookUps) {
  constexpr std::size_t kInserters = 4, kPerInserter = 40;
  std::vector<std::vector<std::string>> keys(kInserters);
  std::map<std::string, std::string> expected;
  for (std::size_t t = 0; t < kInserters; ++t)
    for (std::size_t i = 0; i < kPerInserter; ++i) {
      keys[t].push_back("fin/" + std::to_string(t) + "/" + std::to_string(i));
      expected[keys[t].back()] = bytes_for_key(keys[t].back(), size_for(7 * (t * kPerInserter + i)));
    }
  {
    WeightCache cache = open();
    ASSERT_TRUE(cache);
    Errors errors;
    std::atomic<std::size_t> inserters_done{0};
    std::atomic<std::uint64_t> finalizes{0};
    Barrier start(kThreads);
    run_threads([&](std::size_t t) {
      start.arrive_and_wait();
      if (t < kInserters) {
        for (std::size_t i = 0; i < kPerInserter; ++i) {
          // Halfway, wait for a finalize to have run: then at least one lands between inserts
          // however the threads are scheduled (fast inserters could otherwise finish first).
          if (i == kPerInserter / 2)
            while (finalizes.load(std::memory_order_acquire) == 0) std::this_thread::yield();
          const std::string& key = keys[t][i];
          if (i % 2 == 0) {
            if (auto err = pack(cache, key, expected.at(key)); !err.empty()) errors.add(err);
          } else if (cache.insert(key, expected.at(key)) == kNotFound) {
            errors.add("insert('" + key + "'): " + last_error().message);
          }
        }
        inserters_done.fetch_add(1, std::memory_order_release);
      } else if (t == kInserters) {
        // Finalize over and over while reservations are outstanding and inserts land.
        do {
          if (auto r = cache.finalize(); !r) errors.add("finalize: " + r.error().message);
          finalizes.fetch_add(1, std::memory_order_release);
        } while (inserters_done.load(std::memory_order_acquire) < kInserters);
      } else if (t == kInserters + 1) {
        while (inserters_done.load(std::memory_order_acquire) < kInserters) {
          const Stats s = cache.stats();
          if (s.entries > expected.size()) errors.add("stats: more entries than were ever inserted");
          (void)cache.is_finalized();
        }
      } else {
        while (inserters_done.load(std::memory_order_acquire) < kInserters)
          for (const auto& ks : keys)
            for (const auto& key : ks) {
              const std::size_t off = cache.look_up(key);
              if (off == kNotFound) continue;
              const void* p = cache.offset_to_addr(off);
              const std::string& want = expected.at(key);
              if (p == nullptr || std::memcmp(p, want.data(), std::min<std::size_t>(want.size(), 256)) != 0)
                errors.add("'" + key + "': wrong bytes during finalizes");
            }
      }
    });
    ASSERT_TRUE(errors.none());
    ASSERT_TRUE(cache.finalize().ok()) << last_error().message;
    EXPECT_TRUE(cache.is_finalized());
    EXPECT_EQ(cache.stats().entries, expected.size());
    EXPECT_GT(finalizes.load(), 0u);
    for (const auto& [key, bytes] : expected) EXPECT_EQ(check_bytes(cache, key, bytes), "");
  }
  // Nothing inserted around a concurrent finalize was lost from the file.
  check_reopened(expected);
}

TEST_P(Threads, OffsetToAddrFromManyThreadsWhileTheCacheGrows) {
  constexpr std::size_t kOld = 128, kGrowers = 2, kPerGrower = 32;
  WeightCache cache = open();
  ASSERT_TRUE(cache);
  std::vector<std::string> keys, bytes;
  std::vector<std::size_t> offs;
  std::vector<const void*> addrs;
  for (std::size_t i = 0; i < kOld; ++i) {
    keys.push_back("addr/" + std::to_string(i));
    bytes.push_back(bytes_for_key(keys.back(), size_for(11 * i + 5)));
    offs.push_back(cache.insert(keys.back(), bytes.back()));
    ASSERT_NE(offs.back(), kNotFound);
    addrs.push_back(cache.offset_to_addr(offs.back()));
    ASSERT_NE(addrs.back(), nullptr);
  }
  ASSERT_TRUE(cache.finalize().ok());

  Errors errors;
  Barrier start(kThreads);
  run_threads([&](std::size_t t) {
    start.arrive_and_wait();
    if (t < kGrowers) {
      // Growth maps more of the file (or commits more heap) while others resolve offsets.
      for (std::size_t i = 0; i < kPerGrower; ++i) {
        const std::string key = "addr/new/" + std::to_string(t) + "/" + std::to_string(i);
        const std::string want = bytes_for_key(key, 2 * size_for(i + 17 * t));
        const std::size_t off = cache.insert(key, want);
        if (off == kNotFound) {
          errors.add("insert: " + last_error().message);
          continue;
        }
        const void* p = cache.offset_to_addr(off);
        if (p == nullptr || std::memcmp(p, want.data(), want.size()) != 0) errors.add("'" + key + "': wrong bytes");
      }
    }
    for (int pass = 0; pass < 4; ++pass)
      for (std::size_t i = 0; i < kOld; ++i) {
        const void* p = cache.offset_to_addr(offs[i]);
        if (p != addrs[i]) {
          errors.add("'" + keys[i] + "' resolves to another address");
          continue;
        }
        // Every byte once per thread; later passes the ends (cheap under TSan).
        const std::size_t n = pass == 0 ? bytes[i].size() : std::min<std::size_t>(bytes[i].size(), 64);
        if (std::memcmp(p, bytes[i].data(), n) != 0) errors.add("'" + keys[i] + "': wrong bytes");
        if (cache.offset_to_addr(offs[i] + 1) != nullptr) errors.add("an offset inside an entry resolved");
        if (cache.offset_to_addr(kNotFound) != nullptr) errors.add("kNotFound resolved");
      }
  });
  ASSERT_TRUE(errors.none());
  EXPECT_EQ(cache.stats().entries, kOld + kGrowers * kPerGrower);
}

// weightcache.h, "Threads": "Every call may be made from any thread, concurrently with any call
// on the same or another handle, except: wc_close(c) must not run concurrently with, nor be
// followed by, any other call on c". Each thread opens handles of its own on one file and makes
// every call of the C ABI, while the others do the same; handles close while others work. Run
// under ThreadSanitizer in CI, where a data race between any two of these calls fails the test.
TEST_P(Threads, EveryCallRunsConcurrentlyThroughHandlesOfOneCache) {
  constexpr std::size_t kRounds = 6, kPerRound = 8;
  const std::string path = file() ? dir_.file("cache.wcache") : std::string();
  const std::string gc_dir = dir_.file("gc");
  ASSERT_TRUE(std::filesystem::create_directory(gc_dir));
  static const char kCompat[] = "threads-test";
  Errors errors;
  Barrier start(kThreads);
  run_threads([&](std::size_t t) {
    wc_options o;
    wc_options_init(&o);
    o.path = path.c_str();
    o.compat_key = kCompat;
    o.compat_key_size = sizeof kCompat - 1;
    o.durability = WC_DURABILITY_NONE;
    start.arrive_and_wait();
    for (std::size_t round = 0; round < kRounds; ++round) {
      wc_cache* c = nullptr;
      if (wc_open(&o, &c) != WC_OK) {
        errors.add(std::string("wc_open: ") + wc_last_error());
        continue;
      }
      for (std::size_t i = 0; i < kPerRound; ++i) {
        const std::string key = "every/" + std::to_string(t) + "/" + std::to_string(round) + "/" + std::to_string(i);
        const std::string want = bytes_for_key(key, size_for(i + 31 * t));
        if (wc_look_up(c, key.data(), key.size()) != WC_NOT_FOUND) errors.add("'" + key + "' hit before its insert");
        void* p = wc_reserve_space(c, want.size());
        void* spare = wc_reserve_space(c, 256);
        if (p == nullptr || spare == nullptr) {
#ifdef _WIN32
          // Windows' legacy mapping mode (Wine 8, Windows before 10 1803) releases a range to map
          // into it, and another thread's allocation can win it: the call then fails cleanly
          // (docs/PLATFORMS.md, "Legacy mode"). Anything else is an error here too.
          if (std::string(wc_last_error()).find("another allocation took part") != std::string::npos) {
            if (p != nullptr) (void)wc_release_space(c, p);
            if (spare != nullptr) (void)wc_release_space(c, spare);
            continue;
          }
#endif
          errors.add(std::string("wc_reserve_space: ") + wc_last_error());
          continue;
        }
        if (wc_release_space(c, spare) != WC_OK) errors.add(std::string("wc_release_space: ") + wc_last_error());
        std::memcpy(p, want.data(), want.size());
        const std::size_t off = wc_look_up_or_insert(c, key.data(), key.size(), p, want.size());
        if (off == WC_NOT_FOUND) {
          errors.add(std::string("wc_look_up_or_insert: ") + wc_last_error());
          continue;
        }
        const void* q = wc_offset_to_addr(c, off);
        if (q == nullptr || std::memcmp(q, want.data(), want.size()) != 0) errors.add("'" + key + "': wrong bytes");
        (void)wc_is_finalized(c);
        wc_stats s;
        wc_stats_init(&s);
        if (wc_get_stats(c, &s) != WC_OK) errors.add("wc_get_stats failed");
#ifdef _WIN32
        if (wc_get_fd(c) != -1) errors.add("wc_get_fd: a descriptor on Windows, where the header says -1");
#else
        if (file() != (wc_get_fd(c) >= 0)) errors.add("wc_get_fd: a file cache without a descriptor, or the reverse");
#endif
        if (wc_refresh(c) != WC_OK) errors.add(std::string("wc_refresh: ") + wc_last_error());
        (void)wc_status_string(WC_ERR_BUSY);
        (void)wc_version();
      }
      if (wc_finalize(c) != WC_OK) errors.add(std::string("wc_finalize: ") + wc_last_error());
      if (t == 0) {
        wc_gc_report g;
        wc_gc_report_init(&g);
        if (wc_gc(gc_dir.c_str(), 0, &g) != WC_OK) errors.add(std::string("wc_gc: ") + wc_last_error());
      }
      if (t == 1 && file()) {
        // The file is in use by the other threads: a compaction must refuse, not interfere.
        const wc_status st = wc_compact(&o);
        if (st != WC_ERR_BUSY && st != WC_OK) errors.add(std::string("wc_compact: ") + wc_last_error());
      }
      wc_close(c);
    }
  });
  ASSERT_TRUE(errors.none());
  std::map<std::string, std::string> expected;
  for (std::size_t t = 0; t < kThreads; ++t)
    for (std::size_t round = 0; round < kRounds; ++round)
      for (std::size_t i = 0; i < kPerRound; ++i) {
        const std::string key = "every/" + std::to_string(t) + "/" + std::to_string(round) + "/" + std::to_string(i);
        expected[key] = bytes_for_key(key, size_for(i + 31 * t));
      }
  check_reopened(expected);
}

INSTANTIATE_TEST_SUITE_P(Backings, Threads, ::testing::Values(Kind::file, Kind::heap),
                         [](const auto& info) { return info.param == Kind::file ? "File" : "Heap"; });

}  // namespace
}  // namespace weightcache::test
