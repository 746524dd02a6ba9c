// What the in-process llama.cpp suites share: quiet model params and the logits of a fixed prompt.
#pragma once

#include <llama.h>

#include <cstdint>
#include <vector>

namespace weightcache::test {

// llama_model_default_params without the progress dots on stderr.
inline llama_model_params quiet_params() {
  llama_model_params mp = llama_model_default_params();
  mp.progress_callback = [](float, void*) { return true; };
  return mp;
}

// The last position's logits after decoding a fixed prompt on `threads` threads; empty when
// anything fails.
inline std::vector<float> logits_of(llama_model* model, int threads = 1) {
  if (model == nullptr) return {};
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 64;
  cp.n_batch = 64;
  cp.n_ubatch = 64;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return {};
  std::vector<llama_token> toks = {1, 100, 150, 200, 262, 7};
  std::vector<float> out;
  if (llama_decode(ctx, llama_batch_get_one(toks.data(), static_cast<std::int32_t>(toks.size()))) == 0) {
    const float* l = llama_get_logits_ith(ctx, -1);
    const int n = llama_vocab_n_tokens(llama_model_get_vocab(model));
    if (l != nullptr) out.assign(l, l + n);
  }
  llama_free(ctx);
  return out;
}

}  // namespace weightcache::test
