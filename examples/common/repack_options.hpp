// The options that the ggml and llama.cpp examples share: where a load's repacked weights come
// from (the runtime's own repacking, none, or a weightcache file) and how that file is kept.
//
//   --cache PATH | --no-repack  [--identity-window-ms MS]  [--durability none|async|full]
//   [--max-file-mib N]
#pragma once

#include <weightcache/weightcache.h>

#include <cstdint>
#include <string>

#include "command_line.hpp"

namespace weightcache::example {

struct RepackOptions {
  std::string cache_path;                         // --cache PATH: the repacked weights from this cache file
  bool no_repack = false;                         // --no-repack: plain buffers, nothing repacked
  long long identity_window_ms = 0;               // wc_ggml_options::identity_window_ms
  wc_durability durability = WC_DURABILITY_FULL;  // wc_options::durability
  long long max_file_mib = 0;                     // wc_options::max_file_bytes in MiB (0: the library's default)

  // The current argument is one of these options: it is taken.
  bool take(CommandLine& cl) {
    return cl.take("--cache", cache_path) || cl.flag("--no-repack", no_repack) ||
           cl.take("--identity-window-ms", identity_window_ms, 0) || cl.take("--max-file-mib", max_file_mib, 1) ||
           cl.choose("--durability", durability,
                     {{"none", WC_DURABILITY_NONE}, {"async", WC_DURABILITY_ASYNC}, {"full", WC_DURABILITY_FULL}});
  }
  // After the last argument.
  void check(const CommandLine& cl) const {
    if (no_repack && !cache_path.empty()) cl.fail("--cache and --no-repack exclude each other");
  }
  bool cached() const { return !cache_path.empty(); }
  // The cache's options these set.
  void apply(wc_options* o) const {
    o->path = cache_path.c_str();
    o->durability = durability;
    if (max_file_mib > 0) o->max_file_bytes = static_cast<std::uint64_t>(max_file_mib) << 20;
  }
  // As the JSON reports name it.
  const char* mode() const { return cached() ? "weightcache" : no_repack ? "no-repack" : "repack"; }
};

}  // namespace weightcache::example
