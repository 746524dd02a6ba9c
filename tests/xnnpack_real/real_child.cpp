// A launch of an application that runs one model with a real XNNPACK through the weightcache
// adapter: opens the cache file, names its weight buffers (at its own addresses), creates the
// runtime (or operators) with the adapter's provider, finalizes, runs, then runs the same model
// without a weights cache and compares the outputs byte for byte.
//
//   weightcache_xnn_real_child <kind> <cache> <report> <this|other> <shift> <threads>
//
// <this|other>: the compatibility key carries this XNNPACK's build identifier, or one with a
// byte flipped (a file packed by "another build"). <shift>: bytes each weight buffer starts into
// its allocation. <threads>: pthreadpool threads (0 or 1: none).
// Writes "key=value" lines to <report> and the cached run's output bytes to <report>.out.
// Exit status (child_exit.hpp): ok when it ran (the report says what happened); a cache error
// when XNNPACK failed with the cache or a weightcache call failed; usage; a set-up failure when
// this XNNPACK cannot run the model at all (without a cache either). Stderr says which.
#include <pthreadpool.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "child_exit.hpp"
#include "real_model.hpp"

using namespace weightcache::xnn_real;
using namespace weightcache::test;

namespace {

constexpr std::size_t kBatch = 3;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7)
    return child_failed(kChildUsage,
                        "usage: weightcache_xnn_real_child <kind> <cache> <report> <this|other> <shift> <threads>");
  Kind kind;
  if (!kind_from_name(argv[1], &kind)) return child_failed(kChildUsage, std::string("unknown kind ") + argv[1]);
  const std::string cache_path = argv[2], report_path = argv[3], build = argv[4];
  const std::size_t shift = std::strtoull(argv[5], nullptr, 10);
  const std::size_t threads = std::strtoull(argv[6], nullptr, 10);
  if (xnn_initialize(nullptr) != xnn_status_success) return child_failed(kChildSetupFailed, "xnn_initialize failed");

  pthreadpool_t pool = threads > 1 ? pthreadpool_create(threads) : nullptr;
  const Model model(kind, 42, shift);

  std::vector<unsigned char> reference;
  const xnn_status ref_status = run_uncached(model, kBatch, pool, &reference);
  if (ref_status != xnn_status_success)
    return child_failed(kChildSetupFailed, std::string(argv[1]) + " does not run without a cache either (status " +
                                               std::to_string(static_cast<int>(ref_status)) + ")");

  wc_cache* cache = nullptr;
  if (open_cache(cache_path, compat_key(model, build == "other"), &cache) != WC_OK)
    return child_failed(kChildCacheError, std::string("wc_open: ") + wc_last_error());
  wc_xnn_adapter* adapter = nullptr;
  if (wc_xnn_adapter_create(cache, &adapter) != WC_OK || !model.name_buffers(adapter))
    return child_failed(kChildCacheError, std::string("adapter: ") + wc_last_error());
  CountingProvider counting(wc_xnn_adapter_provider(adapter));

  int rc = kChildOk;
  std::vector<unsigned char> output;
  {
    Instance inst;
    xnn_status s = inst.create(model, counting.get(), pool);
    std::string where = "create";
    if (s == xnn_status_success) {
      if (wc_finalize(cache) != WC_OK)
        return child_failed(kChildCacheError, std::string("wc_finalize: ") + wc_last_error());
      s = inst.run(kBatch, model.make_input(kBatch), &output, &where);
    }
    if (s != xnn_status_success)
      rc = child_failed(kChildCacheError,
                        "XNNPACK with the cache: " + where + " failed with status " + std::to_string(static_cast<int>(s)));
  }

  wc_xnn_adapter_stats as;
  wc_xnn_adapter_stats_init(&as);
  wc_xnn_adapter_get_stats(adapter, &as);
  wc_stats cs;
  wc_stats_init(&cs);
  wc_get_stats(cache, &cs);

  std::ofstream r(report_path);
  r << "look_ups=" << as.look_ups << "\nhits=" << as.hits << "\nreservations=" << as.reservations
    << "\nreserve_failures=" << as.reserve_failures << "\ninserts=" << as.inserts
    << "\nunnamed_inserts=" << as.unnamed_inserts << "\nprovider_look_up=" << counting.look_up.load()
    << "\nprovider_reserve_space=" << counting.reserve_space.load()
    << "\nprovider_look_up_or_insert=" << counting.look_up_or_insert.load()
    << "\nprovider_null_inserts=" << counting.null_inserts.load()
    << "\nprovider_alias_data=" << counting.alias_data.load()
    << "\nprovider_offset_to_addr=" << counting.offset_to_addr.load()
    << "\nprovider_delete_cache=" << counting.delete_cache.load() << "\nentries=" << cs.entries
    << "\nmapped_bytes=" << cs.mapped_bytes << "\nheap_bytes=" << cs.heap_bytes
    << "\npacked_nodes=" << model.packed_nodes() << "\nsame_as_uncached="
    << (rc == kChildOk && output.size() == reference.size() &&
        std::memcmp(output.data(), reference.data(), output.size()) == 0)
    << "\naddresses=";
  for (const auto& w : model.weights()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%" PRIxPTR ",", reinterpret_cast<std::uintptr_t>(w.data));
    r << buf;
  }
  r << "\n";
  r.close();
  std::ofstream(report_path + ".out", std::ios::binary)
      .write(reinterpret_cast<const char*>(output.data()), static_cast<std::streamsize>(output.size()));

  wc_xnn_adapter_destroy(adapter);
  wc_close(cache);
  if (pool != nullptr) pthreadpool_destroy(pool);
  return rc;
}
