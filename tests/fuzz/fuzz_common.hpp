// Shared by the fuzz targets and the seed-corpus generator: the entries every seed file holds
// (so a target can tell served bytes from wrong ones), the options it opens with, and a
// "re-seal" pass that recomputes the checksums a mutated input invalidated, so the fuzzer can
// reach the bounds and overlap checks behind them.
#pragma once

#include "format/format.hpp"

#include <weightcache/weight_cache.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::fuzz {

inline constexpr char kCompatKey[] = "weightcache-fuzz";
inline constexpr std::size_t kKeyCount = 12;
inline constexpr std::size_t kSizes[kKeyCount] = {0, 1, 3, 64, 65, 100, 128, 200, 7, 500, 33, 1000};

inline std::string key(std::size_t i) { return "w" + std::to_string(i); }

/// The bytes stored under key(i) in every seed file.
inline std::string bytes(std::size_t i) {
  std::string s(kSizes[i], '\0');
  for (std::size_t j = 0; j < s.size(); ++j) s[j] = static_cast<char>((i * 131 + j * 7 + (j >> 8)) & 0xff);
  return s;
}

// First byte of an open-target input: how to open; the rest is the file.
inline constexpr std::uint8_t kReseal = 1u << 0;     // recompute checksums before writing the file
inline constexpr std::uint8_t kReadOnly = 1u << 1;
inline constexpr std::uint8_t kVerifyShift = 2;       // 2 bits: first_use, on_open, none, first_use
inline constexpr std::uint8_t kWrite = 1u << 4;       // insert an entry and finalize after the look-ups
inline constexpr std::uint8_t kSmallSpan = 1u << 5;   // max_file_bytes = 1 MiB

inline Verify verify_of(std::uint8_t config) {
  switch ((config >> kVerifyShift) & 3) {
    case 1: return Verify::on_open;
    case 2: return Verify::none;
    default: return Verify::first_use;
  }
}

/// Recomputes, in place: for each slot whose sequence is nonzero and whose index lies inside the
/// image, the index body checksum and the slot's index checksum, then the slot checksum; the
/// compat hash and the fixed checksum of the header. Anything else (sizes, counts, offsets, keys,
/// entry checksums) stays as the fuzzer made it.
inline void reseal(std::vector<std::byte>& b) {
  using namespace format;
  if (b.size() < kHeaderSize) return;
  put_u64(&b[40], hash_bytes(std::string_view(kCompatKey)));
  for (int i = 0; i < 2; ++i) {
    std::byte* s = &b[kSlotOffset[i]];
    if (get_u64(s) == 0) continue;
    const std::uint64_t off = get_u64(s + 8);
    const std::uint64_t size = get_u64(s + 16);
    if (size >= kIndexHeaderSize && off <= b.size() && size <= b.size() - off) {
      std::byte* idx = &b[off];
      put_u64(idx + 24, hash_bytes(idx + kIndexHeaderSize, size - kIndexHeaderSize));
      put_u64(s + 40, hash_bytes(idx, size));
    }
    put_u64(s + 56, hash_bytes(s, 56));
  }
  // Last: a mutated index_offset may point into the header itself.
  put_u64(&b[kFixedChecksumOffset], hash_bytes(b.data(), kFixedChecksumOffset));
}

}  // namespace weightcache::fuzz
