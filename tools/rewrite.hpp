// Writing side of the command-line tool: `compact` (rewrite a cache with only its live entries)
// and `convert` (ExecuTorch XPWC file -> weightcache file). Both build the new file under a
// temporary name in the destination's directory, verify it, and rename it into place, so a
// reader never sees a half-written file and processes that have the old file mapped keep it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace weightcache::cli {

struct CompactOptions {
  std::optional<std::string> compat_key;  // the file must have been written for it
  bool drop_corrupt = false;              // leave out entries that fail their checksum
  bool canonical = false;                 // key order, deterministic bytes (WC_COMPACT_CANONICAL)
};

struct ConvertOptions {
  std::string compat_key;  // empty unless --compat-key
  std::uint64_t alignment = 64;
  bool force = false;  // replace an existing OUT
};

/// Both print their own messages and return an ExitCode.
int run_compact(const std::string& path, const CompactOptions& options);
int run_convert(const std::string& in_path, const std::string& out_path, const ConvertOptions& options);

}  // namespace weightcache::cli
