// What the ggml buffer type (ggml_buft.cpp) shares with the llama.cpp front built with it
// (src/integrations/llama): not installed.
#pragma once

#include <weightcache/weightcache.h>

#include <string>

namespace weightcache::ggml_detail {

// Sets this thread's wc_ggml_last_error() to `why` and returns `st`.
wc_status fail(wc_status st, std::string why);

}  // namespace weightcache::ggml_detail
