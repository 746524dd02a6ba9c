// What the ggml buffer type (ggml_buft.cpp) shares with the llama.cpp front built with it
// (src/integrations/llama): not installed.
#pragma once

#include <weightcache/ggml.h>

#include <string>

namespace weightcache::ggml_detail {

// Sets this thread's wc_ggml_last_error() to `why` and returns `st`.
wc_status fail(wc_status st, std::string why);

// ggml's CPU_REPACK buffer type in this process (nullptr when its CPU backend has none).
ggml_backend_buffer_type_t repack_buffer_type();

// Only tensors `filter` accepts may be put in g's buffers (besides the repack check); a refused
// tensor fails its allocation with a message, never reaches a kernel that cannot compute it.
void set_tensor_filter(wc_ggml* g, bool (*filter)(const struct ggml_tensor*));

}  // namespace weightcache::ggml_detail
