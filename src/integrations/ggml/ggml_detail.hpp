// What the ggml buffer type (ggml_buft.cpp) shares with the llama.cpp front built with it
// (src/integrations/llama): not installed.
#pragma once

#include <weightcache/ggml.h>

#include <string>
#include <utility>
#include <vector>

namespace weightcache::ggml_detail {

// Sets this thread's wc_ggml_last_error() to `why` and returns `st`.
wc_status fail(wc_status st, std::string why);

using Candidates = std::vector<std::pair<ggml_backend_dev_t, ggml_backend_buffer_type_t>>;

// ggml's CPU backend's extra buffer types (AMX, KleidiAI, CPU_REPACK, ...), in its order, each with
// the CPU device.
Candidates cpu_extras();

// The first of `candidates`, in order, whose device computes `op` (GGML_OP_MUL_MAT or
// GGML_OP_MUL_MAT_ID) of the weight `w` held in that buffer type, asked as llama.cpp asks
// (weight_buft_supported: the same stand-in operands, a dummy buffer of the type); nullptr when none.
ggml_backend_buffer_type_t first_supporting(const struct ggml_tensor* w, enum ggml_op op, int n_expert_used,
                                            const Candidates& candidates);

// A tensor whose type and shape ggml's own checks accept (a known type, every ne at least 1, rows
// a whole number of blocks; type and ne only); the layout questions are asked of such tensors only.
bool plausible_weight(const struct ggml_tensor* t);

// Whether `stock` is a buffer type of ggml's CPU backend whose layout this library serves.
bool is_served_layout(ggml_backend_buffer_type_t stock);

// g's buffer type for the layout of ggml's buffer type `stock`; nullptr when it serves none.
ggml_backend_buffer_type_t served_for(wc_ggml* g, ggml_backend_buffer_type_t stock);

// The key prefix of the layout written by ggml's buffer type named `buft_name` ("AMX",
// "CPU_REPACK") on this CPU with this build, whether this process has that buffer type or not
// ("" for a name this library does not serve): what a process that repacks into that layout looks
// up and writes. For tests: a layout's keys never meet another's.
std::string key_prefix_of(const char* buft_name);

// Only tensors `filter` accepts may be put in g's buffers (besides the layout check); a refused
// tensor fails its allocation with a message, never reaches a kernel that cannot compute it.
void set_tensor_filter(wc_ggml* g, bool (*filter)(const struct ggml_tensor*));

}  // namespace weightcache::ggml_detail
