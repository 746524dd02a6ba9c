// Shared by the environment tests and their helper process (no GoogleTest here): entries whose
// bytes follow from their index, a log capture, and checks that return what went wrong.
#pragma once

#include "log_capture.hpp"
#include "random_bytes.hpp"

#include <weightcache/weight_cache.hpp>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace weightcache::env {

using test::LogCapture;

inline std::string key_of(std::uint64_t index) { return test::entry_key(index); }
inline std::string bytes_of(std::uint64_t index, std::size_t size) {
  return test::random_bytes(test::mix_seed(0xe417, index), size);
}

/// An entry the test packed, and whether its reservation landed in the heap.
struct Packed {
  std::uint64_t index = 0;
  std::size_t size = 0;
  std::size_t offset = 0;
  bool heap = false;
};

/// Reserves `size` bytes, fills them with entry `index`'s bytes and commits them in place.
/// Returns false (with last_error() set by the library) when reserve or insert failed.
inline bool pack(WeightCache& cache, std::uint64_t index, std::size_t size, Packed* out) {
  const std::uint64_t fallbacks = cache.stats().heap_fallbacks;
  void* p = cache.reserve(size);
  if (p == nullptr) return false;
  const std::string bytes = bytes_of(index, size);
  std::memcpy(p, bytes.data(), size);  // touches every page: a hole in the file would fault here
  const std::size_t off = cache.look_up_or_insert(key_of(index), p, size);
  if (off == kNotFound) return false;
  *out = Packed{index, size, off, cache.stats().heap_fallbacks != fallbacks};
  return true;
}

/// Empty when entry `e` hits with exactly its bytes; else what is wrong.
inline std::string check(WeightCache& cache, const Packed& e) {
  const std::size_t off = cache.look_up(key_of(e.index));
  if (off == kNotFound) return "entry " + std::to_string(e.index) + " misses";
  const void* p = cache.offset_to_addr(off);
  const std::string bytes = bytes_of(e.index, e.size);
  if (p == nullptr || std::memcmp(p, bytes.data(), bytes.size()) != 0)
    return "entry " + std::to_string(e.index) + " serves wrong bytes";
  return {};
}

/// Empty when entry `e` either misses or hits with exactly its bytes.
inline std::string check_absent_or_right(WeightCache& cache, const Packed& e) {
  if (cache.look_up(key_of(e.index)) == kNotFound) return {};
  return check(cache, e);
}

inline Options cache_options(const std::string& path, Backing backing) {
  Options o;
  o.path = path;
  o.compat_key = "environment-test";
  o.backing = backing;
  o.durability = Durability::full;
  return o;
}

}  // namespace weightcache::env
