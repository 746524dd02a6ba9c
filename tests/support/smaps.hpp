// Memory accounting of one file's mappings, from /proc/<pid>/smaps (Linux). Tells whether the
// pages a cache serves are shared page-cache pages (Shared_Clean, Pss < Rss across processes)
// or private copies (Private_Dirty). The parsing is common/proc_smaps.hpp, shared with the
// examples and the benchmarks.
#pragma once

#include "proc_smaps.hpp"

#include <filesystem>
#include <string>
#include <system_error>

#include <sys/stat.h>

namespace weightcache::test {

/// Sums over every mapping of the file; all sizes in bytes.
using SmapsUsage = smaps::MappingUsage;

/// Usage of `file`'s mappings in the process whose smaps is `smaps_path` (default: this one).
/// A file that is not mapped gives no mappings and zero counters. Matches by device and inode
/// (the path shown by the kernel may differ from the one the test used), falling back to the
/// canonical path.
inline SmapsUsage smaps_usage(const std::string& file, const std::string& smaps_path = "/proc/self/smaps") {
  struct stat st {};
  const bool have_stat = ::stat(file.c_str(), &st) == 0;
  std::error_code ec;
  const std::string canonical = std::filesystem::weakly_canonical(file, ec).string();
  return smaps::sum_mappings(smaps_path, [&](const smaps::MappingHeader& h) {
    return (!canonical.empty() && h.path == canonical) || (have_stat && smaps::maps_file(h, st));
  });
}

}  // namespace weightcache::test
