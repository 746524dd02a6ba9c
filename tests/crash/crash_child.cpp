// Helper process for the SIGKILL test: a writer that the test kills at a random moment, and a
// verifier that reopens the cache in a fresh process after each kill.
//
//   crash_child write  <cache> <round> <batch> <max_entries>
//       packs entries 0, 1, ... of <round> (reserve, fill, look_up_or_insert), finalizing every
//       <batch> entries with durability full, until killed or <max_entries> are done
//   crash_child big    <cache> <round> <big_bytes>
//       packs kBigIndex small entries and finalizes, then fills one <big_bytes> reservation
//   crash_child verify <cache> <big_bytes> <round>:<probe>:<finalized> ...
//       opens read-only (backing=file) and looks up entries 0..probe-1 of each round
//
// Writers report on descriptor 3, one line per event, each written before the next step:
//   R                ready (the cache is open)
//   A <round> <n>    about to pack entries up to n-1 (nothing at or past n is ever inserted)
//   F <round> <n>    finalize returned ok: entries 0..n-1 of <round> are durable
//   B <round>        about to reserve and fill the big entry
//   P <round> <k>    piece k of kBigPieces of the big entry is filled
// The verifier writes one line:
//   V <open> <hits> <wrong> <lost> <entries> <verify_failures>
// with <open> one of ok, absent (no file and nothing was ever finalized into it), failed.
// Exit codes (child_exit.hpp): ok, usage, a cache call failed (stderr says which), or a mismatch.
#include "child_exit.hpp"
#include "crash_common.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/stat.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <signal.h>

using namespace weightcache;
using namespace weightcache::crash;
using namespace weightcache::test;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "crash_child: %s: %s\n", what.c_str(), last_error().message.c_str());
  return kChildCacheError;
}

/// Packs entries [first, end) of `round` the way a backend does and returns an exit code.
int pack(WeightCache& cache, std::uint64_t round, std::uint64_t first, std::uint64_t end, std::size_t big_bytes) {
  for (std::uint64_t i = first; i < end; ++i) {
    const std::string key = entry_key(round, i);
    const std::size_t size = entry_size(round, i, big_bytes);
    void* p = cache.reserve(size);
    if (p == nullptr) return fail("reserve(" + std::to_string(size) + ")");
    if (big_bytes != 0 && i == kBigIndex && size % (8 * kBigPieces) == 0) {
      // Progress lines let the test aim its kill at a point inside the fill.
      test::Rng stream = entry_stream(key);
      const std::size_t piece = size / kBigPieces;
      for (std::size_t k = 0; k < kBigPieces; ++k) {
        stream.fill(static_cast<char*>(p) + k * piece, piece);
        report("P " + std::to_string(round) + " " + std::to_string(k));
      }
    } else {
      fill_entry(key, p, size);
    }
    const std::size_t off = cache.look_up_or_insert(key, p, size);
    if (off == kNotFound) return fail("look_up_or_insert");
    if (cache.offset_to_addr(off) != p) {
      std::fprintf(stderr, "crash_child: entry %llu of round %llu was not committed in place\n",
                   (unsigned long long)i, (unsigned long long)round);
      return kChildCacheError;
    }
  }
  return kChildOk;
}

int finalize(WeightCache& cache, std::uint64_t round, std::uint64_t end) {
  if (auto r = cache.finalize(); !r) {
    std::fprintf(stderr, "crash_child: finalize: %s\n", r.error().message.c_str());
    return kChildCacheError;
  }
  report("F " + std::to_string(round) + " " + std::to_string(end));
  return kChildOk;
}

int run_writer(const std::string& path, std::uint64_t round, std::uint64_t batch, std::uint64_t max_entries) {
  auto opened = WeightCache::open(writer_options(path));
  if (!opened) return fail("open");
  WeightCache& cache = opened.value();
  report("R");
  for (std::uint64_t n = 0; n < max_entries; n += batch) {
    report("A " + std::to_string(round) + " " + std::to_string(n + batch));
    if (int rc = pack(cache, round, n, n + batch, 0); rc != kChildOk) return rc;
    if (int rc = finalize(cache, round, n + batch); rc != kChildOk) return rc;
  }
  return kChildOk;
}

int run_big(const std::string& path, std::uint64_t round, std::size_t big_bytes) {
  auto opened = WeightCache::open(writer_options(path));
  if (!opened) return fail("open");
  WeightCache& cache = opened.value();
  report("R");
  report("A " + std::to_string(round) + " " + std::to_string(kBigIndex));
  if (int rc = pack(cache, round, 0, kBigIndex, big_bytes); rc != kChildOk) return rc;
  if (int rc = finalize(cache, round, kBigIndex); rc != kChildOk) return rc;
  report("A " + std::to_string(round) + " " + std::to_string(kBigIndex + 1));
  report("B " + std::to_string(round));
  if (int rc = pack(cache, round, kBigIndex, kBigIndex + 1, big_bytes); rc != kChildOk) return rc;
  return finalize(cache, round, kBigIndex + 1);
}

struct RoundSpec {
  std::uint64_t round = 0, probe = 0, finalized = 0;
};

int run_verify(const std::string& path, std::size_t big_bytes, const std::vector<RoundSpec>& rounds) {
  bool any_finalized = false;
  for (const auto& r : rounds) any_finalized |= r.finalized > 0;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT && !any_finalized) {
    // Killed before the file was first renamed into place: nothing to check, nothing lost.
    report("V absent 0 0 0 0 0");
    return kChildOk;
  }
  Options o = writer_options(path);
  o.read_only = true;  // a kill must never leave a file that needs a rebuild
  auto opened = WeightCache::open(o);
  if (!opened) {
    std::fprintf(stderr, "crash_child: verifier open failed: %s\n", opened.error().message.c_str());
    report("V failed 0 0 0 0 0");
    return kChildMismatch;
  }
  WeightCache& cache = opened.value();
  std::uint64_t hits = 0, wrong = 0, lost = 0;
  std::string expected;
  for (const auto& r : rounds) {
    for (std::uint64_t i = 0; i < r.probe; ++i) {
      const std::string key = entry_key(r.round, i);
      const std::size_t off = cache.look_up(key);
      if (off == kNotFound) {
        if (i < r.finalized) {
          ++lost;
          std::fprintf(stderr, "crash_child: entry %llu of round %llu was finalized but is missing\n",
                       (unsigned long long)i, (unsigned long long)r.round);
        }
        continue;
      }
      ++hits;
      const void* p = cache.offset_to_addr(off);
      expected.resize(entry_size(r.round, i, big_bytes));
      fill_entry(key, expected.data(), expected.size());
      if (p == nullptr || std::memcmp(p, expected.data(), expected.size()) != 0) {
        ++wrong;
        std::fprintf(stderr, "crash_child: entry %llu of round %llu serves wrong bytes\n", (unsigned long long)i,
                     (unsigned long long)r.round);
      }
    }
  }
  const Stats s = cache.stats();
  report("V ok " + std::to_string(hits) + " " + std::to_string(wrong) + " " + std::to_string(lost) + " " +
         std::to_string(s.entries) + " " + std::to_string(s.verify_failures));
  return wrong == 0 && lost == 0 && s.entries == hits && s.verify_failures == 0 ? kChildOk : kChildMismatch;
}

int usage() {
  std::fprintf(stderr,
               "usage: crash_child write <cache> <round> <batch> <max_entries>\n"
               "       crash_child big <cache> <round> <big_bytes>\n"
               "       crash_child verify <cache> <big_bytes> <round>:<probe>:<finalized>...\n");
  return kChildUsage;
}

std::uint64_t number(const char* s) { return std::strtoull(s, nullptr, 10); }

}  // namespace

int main(int argc, char** argv) {
#ifdef __linux__
  // Never outlive a test that died: an orphaned writer would keep growing its file.
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
  if (argc < 3) return usage();
  const std::string mode = argv[1];
  const std::string path = argv[2];
  set_log_level(LogLevel::error);
  if (mode == "write" && argc == 6) return run_writer(path, number(argv[3]), number(argv[4]), number(argv[5]));
  if (mode == "big" && argc == 5) return run_big(path, number(argv[3]), number(argv[4]));
  if (mode == "verify" && argc >= 4) {
    std::vector<RoundSpec> rounds;
    for (int i = 4; i < argc; ++i) {
      unsigned long long round = 0, probe = 0, finalized = 0;
      if (std::sscanf(argv[i], "%llu:%llu:%llu", &round, &probe, &finalized) != 3) return usage();
      rounds.push_back({round, probe, finalized});
    }
    return run_verify(path, number(argv[3]), rounds);
  }
  return usage();
}
