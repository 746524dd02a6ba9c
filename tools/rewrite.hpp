// Writing commands of the command-line tool: `compact` (rewrite a cache with only its live
// entries: wc_compact_ex) and `convert` (ExecuTorch XPWC file -> weightcache file:
// inspect::convert_xpwc). The library builds the new file under a temporary name in the
// destination's directory, verifies it and renames it into place; here are the arguments, the
// checks that pick a message and an exit code, and the printing.
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
