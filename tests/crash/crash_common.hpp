// Shared by the SIGKILL test and its helper process (no GoogleTest here): which keys a writer
// round packs, their sizes and bytes, and the line protocol on the report pipe.
//
// Every entry's size and bytes follow from its key alone, so a verifier in a fresh process can
// check any hit without being told what was written.
#pragma once

#include "key_content.hpp"
#include "random_bytes.hpp"

#include <weightcache/weight_cache.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

#include <unistd.h>

namespace weightcache::crash {

/// The writer reports on this descriptor (a pipe: lines written before a SIGKILL stay readable).
inline constexpr int kReportFd = 3;
/// Index of the large entry in a big-fill round (the small entries before it are 0..kBigIndex-1).
inline constexpr std::size_t kBigIndex = 4;

inline std::string compat_key() { return "crash-test/v1"; }

/// Key of entry `index` of writer round `round`: binary, with an embedded NUL.
inline std::string entry_key(std::uint64_t round, std::uint64_t index) {
  std::string k = "crash/" + std::to_string(round) + "/" + std::to_string(index);
  k.push_back('\0');
  k += "tail";
  return k;
}

/// Mostly small entries (0..16 KiB), every 16th up to 256 KiB so the file keeps growing; in a
/// big-fill round entry kBigIndex has `big_bytes`.
inline std::size_t entry_size(std::uint64_t round, std::uint64_t index, std::size_t big_bytes) {
  if (big_bytes != 0 && index == kBigIndex) return big_bytes;
  test::Rng r(test::key_seed(entry_key(round, index)));
  return static_cast<std::size_t>(index % 16 == 15 ? r.uniform(0, 256 * 1024) : r.uniform(0, 16 * 1024));
}

/// The byte stream of `key`'s entry: filling in pieces whose sizes are multiples of 8 gives the
/// same bytes as one fill.
inline test::Rng entry_stream(const std::string& key) { return test::Rng(test::key_seed(key) ^ 0x5a5a5a5a5a5a5a5aull); }

inline void fill_entry(const std::string& key, void* out, std::size_t size) { entry_stream(key).fill(out, size); }

/// The big entry is filled in this many pieces, with a progress line ("P <round> <k>") after each.
inline constexpr std::size_t kBigPieces = 8;

inline Options writer_options(const std::string& path) {
  Options o;
  o.path = path;
  o.compat_key = compat_key();
  o.backing = Backing::file;  // a silent heap fallback would make the whole test vacuous
  o.durability = Durability::full;
  return o;
}

/// Writes one report line; a pipe write of this size is atomic, so a kill never leaves half a line.
inline void report(const std::string& line) {
  const std::string l = line + "\n";
  ssize_t n;
  do {
    n = ::write(kReportFd, l.data(), l.size());
  } while (n < 0 && errno == EINTR);
}

}  // namespace weightcache::crash
