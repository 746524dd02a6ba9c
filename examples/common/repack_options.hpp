// The options that the ggml and llama.cpp examples share: where a load's repacked weights come
// from (the runtime's own repacking, none, or a weightcache file) and how that file is kept.
//
//   --cache PATH | --no-repack  [--identity-window-ms MS]  [--durability none|async|full]
//   [--max-file-mib N]  [--prebuilt-dir DIR]  [--cpu-compat-key]
//
// The cache's compatibility key is empty (one file may hold the entries of several ggml builds
// and CPUs side by side: each entry's key names them), unless --cpu-compat-key or
// --prebuilt-dir: then it is this CPU's (wc_ggml_compat_key), as a fleet's prebuilt caches,
// one per CPU profile, are told apart by it (docs/DEPLOY.md). Bake with --cpu-compat-key.
#pragma once

#include <weightcache/weightcache.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "cache_info.hpp"
#include "command_line.hpp"

namespace weightcache::example {

struct RepackOptions {
  std::string cache_path;                         // --cache PATH: the repacked weights from this cache file
  bool no_repack = false;                         // --no-repack: plain buffers, nothing repacked
  long long identity_window_ms = 0;               // wc_ggml_options::identity_window_ms
  wc_durability durability = WC_DURABILITY_FULL;  // wc_options::durability
  long long max_file_mib = 0;                     // wc_options::max_file_bytes in MiB (0: the library's default)
  std::string prebuilt_dir;                       // --prebuilt-dir DIR: wc_options::prebuilt_dir
  bool cpu_compat_key = false;                    // --cpu-compat-key: the compatibility key is this CPU's

  // The current argument is one of these options: it is taken.
  bool take(CommandLine& cl) {
    return cl.take("--cache", cache_path) || cl.flag("--no-repack", no_repack) ||
           cl.take("--identity-window-ms", identity_window_ms, 0) || cl.take("--max-file-mib", max_file_mib, 1) ||
           cl.take("--prebuilt-dir", prebuilt_dir) || cl.flag("--cpu-compat-key", cpu_compat_key) ||
           cl.choose("--durability", durability,
                     {{"none", WC_DURABILITY_NONE}, {"async", WC_DURABILITY_ASYNC}, {"full", WC_DURABILITY_FULL}});
  }
  // After the last argument.
  void check(const CommandLine& cl) const {
    if (no_repack && !cache_path.empty()) cl.fail("--cache and --no-repack exclude each other");
  }
  bool cached() const { return !cache_path.empty(); }
  // The cache's options these set.
  // `cpu_key`: what the repacked bytes depend on here (wc_ggml_compat_key()); it must outlive
  // the wc_open the options are for.
  void apply(wc_options* o, const char* cpu_key) const {
    o->path = cache_path.c_str();
    if (cpu_compat_key || !prebuilt_dir.empty()) {
      o->compat_key = cpu_key;
      o->compat_key_size = std::char_traits<char>::length(cpu_key);
    }
    if (!prebuilt_dir.empty()) o->prebuilt_dir = prebuilt_dir.c_str();
    o->durability = durability;
    if (max_file_mib > 0) o->max_file_bytes = static_cast<std::uint64_t>(max_file_mib) << 20;
  }
  // As the JSON reports name it.
  const char* mode() const { return cached() ? "weightcache" : no_repack ? "no-repack" : "repack"; }
};

// `s` as a JSON string's contents.
inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace weightcache::example
