// The options that the ggml and llama.cpp examples share: where a load's repacked weights come
// from (the runtime's own repacking, none, or a weightcache file) and how that file is kept.
//
//   --cache PATH | --no-repack  [--identity-window-ms MS]  [--durability none|async|full]
#pragma once

#include <weightcache/weightcache.h>

#include <string>

#include "command_line.hpp"

namespace weightcache::example {

struct RepackOptions {
  std::string cache_path;                         // --cache PATH: the repacked weights from this cache file
  bool no_repack = false;                         // --no-repack: plain buffers, nothing repacked
  long long identity_window_ms = 0;               // wc_ggml_options::identity_window_ms
  wc_durability durability = WC_DURABILITY_FULL;  // wc_options::durability

  // The current argument is one of these options: it is taken.
  bool take(CommandLine& cl) {
    return cl.take("--cache", cache_path) || cl.flag("--no-repack", no_repack) ||
           cl.take("--identity-window-ms", identity_window_ms, 0) ||
           cl.choose("--durability", durability,
                     {{"none", WC_DURABILITY_NONE}, {"async", WC_DURABILITY_ASYNC}, {"full", WC_DURABILITY_FULL}});
  }
  // After the last argument.
  void check(const CommandLine& cl) const {
    if (no_repack && !cache_path.empty()) cl.fail("--cache and --no-repack exclude each other");
  }
  bool cached() const { return !cache_path.empty(); }
  // As the JSON reports name it.
  const char* mode() const { return cached() ? "weightcache" : no_repack ? "no-repack" : "repack"; }
};

}  // namespace weightcache::example
