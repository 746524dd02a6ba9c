// Second "process" for the adapter tests: a new launch of an application that opens the cache
// file, names its weight buffers (at new addresses) and creates a runtime through the provider.
//
//   weightcache_xnn_child <cache> warm  <model-seed> <layers>   every layer must hit
//   weightcache_xnn_child <cache> alias <model-seed> <layers>   same, kernels converted from bf16
//   weightcache_xnn_child <cache> unnamed <model-seed> <layers>  a fresh process: three adapters
//                                                               pack unnamed buffers; prints how
//                                                               often "has no name" was logged
//
// Exit status (child_exit.hpp): ok when every layer hit with the right bytes and nothing was
// packed (unnamed: the warning was logged exactly once); a mismatch for wrong bytes; unexpected
// when something was packed (reserve_space or look_up_or_insert called) or, unnamed, the
// warning count was not 1; usage or a cache error otherwise.
#include "child_exit.hpp"
#include "xnn_test_model.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

using namespace weightcache::xnn_test;
using namespace weightcache::test;

namespace {

std::atomic<int> g_no_name_lines{0};

void count_no_name(void*, wc_log_level, const char* message, size_t size) {
  if (std::string_view(message, size).find("has no name") != std::string_view::npos) ++g_no_name_lines;
}

// The unnamed-buffer warning is per process: several adapters (a runtime's sessions, models)
// packing unnamed buffers log it once between them.
int run_unnamed(wc_cache* cache, const std::vector<Linear>& model) {
  wc_set_log_callback(count_no_name, nullptr);
  int rc = kChildOk;
  for (int a = 0; a < 3 && rc == kChildOk; ++a) {
    wc_xnn_adapter* adapter = nullptr;
    if (wc_xnn_adapter_create(cache, &adapter) != WC_OK) return child_failed(kChildCacheError, "adapter_create");
    Runtime rt;
    if (create_runtime(static_cast<fxnn_weights_cache_t>(wc_xnn_adapter_provider(adapter)), model, &rt) !=
        fxnn_status_success)
      rc = child_failed(kChildCacheError, "create_runtime");
    wc_xnn_adapter_stats st;
    wc_xnn_adapter_stats_init(&st);
    if (rc == kChildOk &&
        (wc_xnn_adapter_get_stats(adapter, &st) != WC_OK || st.unnamed_inserts != model.size()))
      rc = child_failed(kChildUnexpected, "not every unnamed buffer was packed");
    if (rc == kChildOk) {
      if (const std::string err = check_runtime(&rt, model); !err.empty()) rc = child_failed(kChildMismatch, err);
    }
    wc_xnn_adapter_destroy(adapter);
  }
  wc_set_log_callback(nullptr, nullptr);
  std::printf("has-no-name warnings=%d\n", g_no_name_lines.load());
  if (rc != kChildOk) return rc;
  return g_no_name_lines.load() == 1 ? kChildOk : child_failed(kChildUnexpected, "the warning was not logged once");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    return child_failed(kChildUsage, "usage: weightcache_xnn_child <cache> warm|alias|unnamed <model-seed> <layers>");
  }
  const std::string mode = argv[2];
  const auto model = make_model(std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10));
  wc_cache* cache = nullptr;
  if (open_cache(argv[1], &cache) != WC_OK)
    return child_failed(kChildCacheError, std::string("open: ") + wc_last_error());
  if (mode == "unnamed") {
    const int rc = run_unnamed(cache, model);
    wc_close(cache);
    return rc;
  }
  wc_xnn_adapter* adapter = nullptr;
  if (wc_xnn_adapter_create(cache, &adapter) != WC_OK) return child_failed(kChildCacheError, "adapter_create");
  fxnn_counting* counting =
      fxnn_counting_create(static_cast<fxnn_weights_cache_t>(wc_xnn_adapter_provider(adapter)));
  fxnn_weights_cache_t provider = fxnn_counting_provider(counting);

  // Buffers at this process's own addresses: bf16 originals (named) and their fp32 conversions.
  std::vector<std::vector<std::uint16_t>> originals;
  std::vector<std::vector<float>> converted;
  std::vector<const float*> kernels;
  bool named = true;
  if (mode == "alias") {
    for (const auto& l : model) {
      originals.push_back(to_bf16(l.weight));
      named = named && wc_xnn_adapter_name_buffer(adapter, originals.back().data(), l.weight_name.c_str()) == WC_OK;
      if (!l.bias.empty())
        named = named && wc_xnn_adapter_name_buffer(adapter, l.bias.data(), l.bias_name.c_str()) == WC_OK;
    }
    for (std::size_t i = 0; i < model.size(); ++i) {
      converted.push_back(from_bf16(originals[i]));
      kernels.push_back(converted.back().data());
      if (fxnn_alias(provider, converted.back().data(), originals[i].data()) != fxnn_status_success) named = false;
    }
  } else if (mode == "warm") {
    named = name_model(adapter, model);
  } else {
    return child_failed(kChildUsage, "unknown mode " + mode);
  }
  if (!named) return child_failed(kChildCacheError, "naming the buffers");

  int rc = kChildOk;
  Runtime rt;
  const bool finalized_before = fxnn_setup(provider) == fxnn_status_success;
  if (create_runtime(provider, model, &rt, kernels.empty() ? nullptr : &kernels) != fxnn_status_success)
    rc = child_failed(kChildCacheError, "create_runtime");
  // A warm launch that inserted nothing may set up without finalizing.
  if (rc == kChildOk && (!finalized_before || fxnn_setup(provider) != fxnn_status_success))
    rc = child_failed(kChildUnexpected, "setup needed a finalize: something was packed");
  if (rc == kChildOk) {
    const std::string err = check_runtime(&rt, model, kernels.empty() ? nullptr : &kernels);
    if (!err.empty()) rc = child_failed(kChildMismatch, err);
  }
  const std::size_t look_ups = fxnn_counting_get(counting, fxnn_call_look_up);
  const std::size_t reserves = fxnn_counting_get(counting, fxnn_call_reserve_space);
  const std::size_t inserts = fxnn_counting_get(counting, fxnn_call_look_up_or_insert);
  std::printf("look_up=%zu reserve_space=%zu look_up_or_insert=%zu offset_to_addr=%zu\n", look_ups, reserves, inserts,
              fxnn_counting_get(counting, fxnn_call_offset_to_addr));
  if (rc == kChildOk && (reserves != 0 || inserts != 0 || look_ups != model.size()))
    rc = child_failed(kChildUnexpected, "something was packed, or a layer was not looked up");

  fxnn_counting_destroy(counting);
  wc_xnn_adapter_destroy(adapter);
  wc_close(cache);
  return rc;
}
