// What an example reports of the cache it opened: the file it serves from (a prebuilt one
// chosen from --prebuilt-dir, or --cache) and whether it is prebuilt.
#pragma once

#include <weightcache/weightcache.h>

#include <string>

namespace weightcache::example {

// The file `cache` serves from ("" without one): --cache, or the prebuilt file it chose.
inline std::string served_path(wc_cache* cache) {
  if (cache == nullptr) return {};
  std::string path(wc_get_path(cache, nullptr, 0), '\0');
  (void)wc_get_path(cache, path.data(), path.size() + 1);
  return path;
}

// Whether `cache` is a prebuilt file chosen from --prebuilt-dir.
inline bool is_prebuilt(wc_cache* cache) {
  wc_stats st;
  wc_stats_init(&st);
  return cache != nullptr && wc_get_stats(cache, &st) == WC_OK && st.prebuilt != 0;
}

}  // namespace weightcache::example
