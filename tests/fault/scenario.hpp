// A whole open / reserve / insert / finalize / reopen run, with ground truth, shared by the fault
// sweep and the crash simulation. Each key has exactly one byte content (derived from the key),
// so any hit can be checked without knowing what the run managed to commit.
#pragma once

#include "key_content.hpp"

#include <weightcache/weight_cache.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

namespace wctest {

inline std::string content_for(const std::string& key) {
  // Spans several pages, sometimes tiny; the first key of a round is big enough (256 KiB and
  // more) that verifying it populates its pages first, so the run makes that madvise too.
  const std::uint64_t seed = weightcache::test::key_seed(key);
  const bool big = key.size() >= 3 && key.compare(key.size() - 3, 3, "/w0") == 0;
  const std::size_t size = (big ? 256 * 1024 : 1) + seed % 70000;
  return weightcache::test::bytes_for_key(key, size);
}

struct Outcome {
  std::set<std::string> durable;  // keys of finalizes that returned ok
  std::vector<std::string> all;   // every key the run tried
  std::uint64_t wrong_bytes = 0;  // hits during the run with other bytes
};

// `max_file_bytes` defaults to the library's; a smaller one makes opening cheaper where reserving
// the address range is slow (Wine).
inline weightcache::Options scenario_options(const std::string& path,
                                             std::uint64_t max_file_bytes = weightcache::Options{}.max_file_bytes) {
  weightcache::Options o;
  o.path = path;
  o.max_file_bytes = max_file_bytes;
  o.compat_key = "scenario-v1";
  o.durability = weightcache::Durability::full;
  o.lease_timeout = std::chrono::milliseconds(2000);
  return o;
}

// Checks every hit of the run's keys; counts wrong bytes.
inline std::uint64_t check_hits(weightcache::WeightCache& c, const std::vector<std::string>& keys,
                                std::set<std::string>* present = nullptr) {
  std::uint64_t wrong = 0;
  for (const auto& k : keys) {
    const std::size_t off = c.look_up(k);
    if (off == weightcache::kNotFound) continue;
    const auto* p = static_cast<const char*>(c.offset_to_addr(off));
    const std::string want = content_for(k);
    if (p == nullptr || std::memcmp(p, want.data(), want.size()) != 0) ++wrong;
    else if (present) present->insert(k);
  }
  return wrong;
}

/// What the cache holds after the run, against the run's ground truth.
struct Damage {
  std::uint64_t wrong = 0;  // hits with other bytes, during the run or now
  std::uint64_t lost = 0;   // keys of finalizes that returned ok, now missing
};

/// Checks a reopened cache against `out`: every key the run tried, every key it made durable.
inline Damage damage_after(weightcache::WeightCache& reopened, const Outcome& out) {
  std::set<std::string> present;
  Damage d;
  d.wrong = out.wrong_bytes + check_hits(reopened, out.all, &present);
  for (const auto& k : out.durable) d.lost += present.count(k) == 0;
  return d;
}

/// After a faulted run `out` (that followed `seeded`, empty if none): the cache reopens with
/// `options`, no hit ever had other bytes and no key made durable is missing. `what` names the
/// fault in failures; the run and its damage are counted in `totals` (runs, wrong, lost).
template <class Totals>
void check_reopened(const weightcache::Options& options, Outcome out, const Outcome& seeded, const std::string& what,
                    Totals* totals) {
  out.durable.insert(seeded.durable.begin(), seeded.durable.end());
  out.all.insert(out.all.end(), seeded.all.begin(), seeded.all.end());
  auto c = weightcache::WeightCache::open(options);
  ASSERT_TRUE(c.ok()) << c.error().message;
  const Damage d = damage_after(c.value(), out);
  EXPECT_EQ(d.wrong, 0u) << what;
  EXPECT_EQ(d.lost, 0u) << what;
  totals->runs++;
  totals->wrong += d.wrong;
  totals->lost += d.lost;
}

// Rounds: each opens the cache (scenario_options(path, max_file_bytes)), checks what is there,
// packs `per_round` new keys (half through reservations, half copied in), finalizes, closes. Odd
// rounds open with allow_symlink, so the path is looked at with stat as well as lstat. The errors
// open and finalize returned go to `errors` if given.
inline Outcome run_scenario(const std::string& path, int rounds = 3, int per_round = 6,
                            std::uint64_t max_file_bytes = weightcache::Options{}.max_file_bytes,
                            std::vector<weightcache::Error>* errors = nullptr) {
  Outcome out;
  for (int r = 0; r < rounds; ++r) {
    weightcache::Options options = scenario_options(path, max_file_bytes);
    options.allow_symlink = r % 2 == 1;
    auto opened = weightcache::WeightCache::open(options);
    if (!opened) {
      if (errors != nullptr) errors->push_back(opened.error());
      continue;
    }
    auto& c = opened.value();
    out.wrong_bytes += check_hits(c, out.all);
    std::vector<std::string> added;
    for (int i = 0; i < per_round; ++i) {
      const std::string key = "round" + std::to_string(r) + "/w" + std::to_string(i);
      out.all.push_back(key);
      const std::string bytes = content_for(key);
      const std::uint64_t heap_before = c.stats().heap_bytes;
      std::size_t off;
      if (i % 2 == 0) {
        void* p = c.reserve(bytes.size());
        if (p == nullptr) continue;
        std::memcpy(p, bytes.data(), bytes.size());
        off = c.look_up_or_insert(key, p, bytes.size());
      } else {
        off = c.insert(key, bytes);
      }
      if (off == weightcache::kNotFound) continue;
      const auto* q = static_cast<const char*>(c.offset_to_addr(off));
      if (q == nullptr || std::memcmp(q, bytes.data(), bytes.size()) != 0) ++out.wrong_bytes;
      // Only entries placed in the file can be durable; heap fallbacks live and die with this
      // process.
      if (c.stats().backing == weightcache::Backing::file && c.stats().heap_bytes == heap_before) added.push_back(key);
    }
    if (auto f = c.finalize(); f)
      out.durable.insert(added.begin(), added.end());
    else if (errors != nullptr)
      errors->push_back(f.error());
  }
  return out;
}

}  // namespace wctest
