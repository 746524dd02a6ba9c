// Helpers shared by the unit tests and their helper process (no GoogleTest here: the helper
// process links only the library). Functions return an empty string on success, else what
// went wrong, so both a test assertion and a process exit code can report it.
#pragma once

#include "child_exit.hpp"
#include "random_bytes.hpp"

#include <weightcache/weight_cache.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace weightcache::test {

/// Options for a file-backed test cache. Durability none: these tests are about contents, not
/// power loss, and skipping fdatasync keeps the suite fast.
inline Options file_options(const std::string& path, Durability durability = Durability::none) {
  Options o;
  o.path = path;
  o.compat_key = "unit-test";
  o.backing = Backing::file;
  o.durability = durability;
  return o;
}

/// Packs every entry of `spec` the way XNNPACK does: look_up (must miss), reserve, fill in
/// place, look_up_or_insert (must commit in place). Does not finalize.
inline std::string write_entry_set(WeightCache& cache, const EntrySetSpec& spec) {
  for (std::size_t i = 0; i < spec.count; ++i) {
    const std::string key = entry_key(i);
    const std::size_t size = entry_size(spec, i);
    if (cache.look_up(key) != kNotFound) return "entry " + std::to_string(i) + " already present before insert";
    void* p = cache.reserve(size);
    if (p == nullptr) return "reserve(" + std::to_string(size) + ") failed: " + last_error().message;
    fill_entry(spec, i, p, size);
    const std::size_t off = cache.look_up_or_insert(key, p, size);
    if (off == kNotFound) return "look_up_or_insert of entry " + std::to_string(i) + " failed: " + last_error().message;
    if (cache.offset_to_addr(off) != p)
      return "entry " + std::to_string(i) + " was not committed in place (its reservation was copied)";
  }
  return {};
}

/// Checks that `key` hits and that the entry starts with exactly `expected`.
inline std::string verify_entry(WeightCache& cache, const std::string& key, const std::string& expected,
                                const std::string& what) {
  const std::size_t off = cache.look_up(key);
  if (off == kNotFound) return what + ": look_up missed";
  const void* p = cache.offset_to_addr(off);
  if (p == nullptr) return what + ": offset_to_addr(" + std::to_string(off) + ") returned NULL for a hit";
  if (!expected.empty() && std::memcmp(p, expected.data(), expected.size()) != 0) {
    std::size_t first = 0;
    while (static_cast<const char*>(p)[first] == expected[first]) ++first;
    return what + ": bytes differ (size " + std::to_string(expected.size()) + ", first difference at byte " +
           std::to_string(first) + ")";
  }
  return {};
}

/// Checks every entry of `spec` hits with its exact bytes and that nothing else is in the cache.
inline std::string verify_entry_set(WeightCache& cache, const EntrySetSpec& spec) {
  for (std::size_t i = 0; i < spec.count; ++i) {
    auto err = verify_entry(cache, entry_key(i), entry_bytes(spec, i), "entry " + std::to_string(i));
    if (!err.empty()) return err;
  }
  const Stats s = cache.stats();
  if (s.entries != spec.count)
    return "cache holds " + std::to_string(s.entries) + " entries, expected " + std::to_string(spec.count);
  return {};
}

/// A list of (key, bytes) written to a file, for handing exact expectations to a helper process.
using Manifest = std::vector<std::pair<std::string, std::string>>;

inline bool write_manifest(const std::string& path, const Manifest& m) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& [k, v] : m) {
    const std::uint64_t ks = k.size(), vs = v.size();
    out.write(reinterpret_cast<const char*>(&ks), sizeof ks).write(k.data(), static_cast<std::streamsize>(ks));
    out.write(reinterpret_cast<const char*>(&vs), sizeof vs).write(v.data(), static_cast<std::streamsize>(vs));
  }
  return static_cast<bool>(out.flush());
}

inline bool read_manifest(const std::string& path, Manifest* m) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  for (;;) {
    std::uint64_t ks = 0, vs = 0;
    if (!in.read(reinterpret_cast<char*>(&ks), sizeof ks)) return in.eof();
    std::string k(ks, '\0');
    if (!in.read(k.data(), static_cast<std::streamsize>(ks))) return false;
    if (!in.read(reinterpret_cast<char*>(&vs), sizeof vs)) return false;
    std::string v(vs, '\0');
    if (!in.read(v.data(), static_cast<std::streamsize>(vs))) return false;
    m->emplace_back(std::move(k), std::move(v));
  }
}

}  // namespace weightcache::test
