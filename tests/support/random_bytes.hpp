// Deterministic pseudo-random data: the same seed gives the same bytes on every platform and in
// every process, so a writer and a separately spawned verifier can agree without sharing files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace weightcache::test {

/// SplitMix64: tiny, fast, and fully specified (unlike std:: distributions, whose output
/// differs between standard libraries).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) noexcept : state_(seed) {}

  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi] (inclusive); the tiny modulo bias does not matter for tests.
  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) noexcept {
    return lo + (hi - lo == UINT64_MAX ? next() : next() % (hi - lo + 1));
  }
  void fill(void* out, std::size_t size) noexcept {
    auto* p = static_cast<unsigned char*>(out);
    while (size >= 8) {
      const std::uint64_t v = next();
      std::memcpy(p, &v, 8);  // host order is fine: both sides run on the same host
      p += 8;
      size -= 8;
    }
    if (size > 0) {
      const std::uint64_t v = next();
      std::memcpy(p, &v, size);
    }
  }

 private:
  std::uint64_t state_;
};

/// Mixes two values into one seed (for per-entry streams derived from a set seed).
inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) noexcept {
  Rng r(a ^ (b * 0xd6e8feb86659fd93ull));
  r.next();
  return r.next();
}

inline std::string random_bytes(std::uint64_t seed, std::size_t size) {
  std::string s(size, '\0');
  Rng(seed).fill(s.data(), s.size());
  return s;
}

/// A reproducible set of cache entries. Keys depend only on the index (so sets built with
/// different seeds name the same keys); sizes and bytes depend on the seed.
struct EntrySetSpec {
  std::uint64_t seed = 1;
  std::size_t count = 0;
  std::size_t min_size = 0;
  std::size_t max_size = 256 * 1024;
};

/// Key of entry `index`: binary, with an embedded NUL, so no code path may treat keys as C strings.
inline std::string entry_key(std::size_t index) {
  std::string k = "entry/" + std::to_string(index);
  k.push_back('\0');
  const std::uint64_t tag = mix_seed(0x6b6579, index);
  k.append(reinterpret_cast<const char*>(&tag), sizeof(tag));
  return k;
}

/// Uniform in [min_size, max_size], except that every 64th entry takes min_size and the one after
/// it max_size, so the extremes (typically 0 bytes) are always part of a set of 2 or more.
inline std::size_t entry_size(const EntrySetSpec& spec, std::size_t index) {
  if (index % 64 == 0) return spec.min_size;
  if (index % 64 == 1) return spec.max_size;
  return static_cast<std::size_t>(Rng(mix_seed(spec.seed, index)).uniform(spec.min_size, spec.max_size));
}

/// Fills `out` (entry_size bytes) with entry `index`'s bytes.
inline void fill_entry(const EntrySetSpec& spec, std::size_t index, void* out, std::size_t size) {
  Rng(mix_seed(spec.seed ^ 0x5a5a5a5a5a5a5a5aull, index)).fill(out, size);
}

inline std::string entry_bytes(const EntrySetSpec& spec, std::size_t index) {
  std::string s(entry_size(spec, index), '\0');
  fill_entry(spec, index, s.data(), s.size());
  return s;
}

}  // namespace weightcache::test
