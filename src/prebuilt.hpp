// Prebuilt caches (Options::prebuilt_dir): a read-only directory of cache files built elsewhere,
// one per compatibility key (CPU profile, runtime build), of which an open takes the one whose
// header says it suits it. Only headers are read here; the open itself checks everything else.
#pragma once

#include "platform/platform.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weightcache::prebuilt {

/// What a look at a prebuilt directory found.
struct Scan {
  std::vector<std::string> suitable;  // paths whose header has the key's hash and a fitting alignment, in name order
  std::size_t looked_at = 0;          // "*.wcache" files whose header was read
  std::string unreadable;             // why the directory itself could not be read ("" if it could)
  std::vector<std::string> skipped;   // "*.wcache" files whose header could not be read, and why
};

/// Reads the header of every regular "*.wcache" file in `dir` and in its immediate
/// subdirectories (symlinks are not followed, so a link planted there cannot point the scan
/// elsewhere), and lists those written for compatibility key hash `compat` with an alignment
/// that `align` divides. Never throws but std::bad_alloc.
/// `not_this`: the device and inode of a file never to list (the open's own cache, which a
/// host may keep inside its set); nullptr: none.
Scan scan(platform::Platform& pf, const std::string& dir, std::uint64_t compat, std::size_t align,
          const platform::FileInfo* not_this = nullptr);

}  // namespace weightcache::prebuilt
