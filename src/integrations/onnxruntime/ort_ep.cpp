// The WeightCache plugin execution provider for ONNX Runtime (include/weightcache/onnxruntime.h).
//
// Shape: ORT loads this library and calls CreateEpFactories once; the one factory creates one
// OrtEp per session. GetCapability claims each fully-connected layer (MatMul with a constant B,
// Gemm, MatMulNBits) together with the bias Add and the Relu/Gelu that only it feeds, as one
// fused partition; Compile packs every layer's weights through the session's own XNNPACK adapter
// (or the built-in packer) into the cache the factory shares between sessions, then finalizes it
// before CreateSession returns. Compute runs the layer on the packed weights.
//
// Nothing here may throw into ORT or abort the host: every entry point goes through boundary().
#include "../common/source_identity.hpp"
#include "kernels.hpp"
#include "ort_util.hpp"

#include <weightcache/onnxruntime.h>
#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>

#ifdef WEIGHTCACHE_ORT_EP_XNNPACK
#include <pthreadpool.h>
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifndef WEIGHTCACHE_ORT_EP_VERSION
#define WEIGHTCACHE_ORT_EP_VERSION "0.1.0"
#endif

namespace weightcache::ort {

using namespace weightcache::source;  // NOLINT: the keys (source_identity.hpp)

Api& api() {
  static Api a;
  return a;
}

void log(const OrtLogger* logger, OrtLoggingLevel level, const std::string& message) noexcept {
  if (logger == nullptr || api().ort == nullptr) return;
  try {
    const std::string m = "WeightCache EP: " + message;
    OrtStatus* st = api().ort->Logger_LogMessage(logger, level, m.c_str(), ORT_TSTR("weightcache_ort_ep"), 0,
                                                 "WeightCache");
    if (st != nullptr) api().ort->ReleaseStatus(st);
  } catch (...) {
  }
}

namespace {

// ---- process-wide counters (wc_ort_ep_get_stats) -------------------------------------------------

struct Counters {
  std::atomic<std::uint64_t> sessions{0}, nodes{0}, weights{0}, packed{0}, from_cache{0}, packed_bytes{0},
      heap_weights{0}, cache_failures{0}, caches_open{0},
      source_bytes_hashed{0}, weight_nodes_seen{0}, weight_nodes_taken{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

constexpr const char* kEpName = WC_ORT_EP_NAME;
constexpr const char* kVendor = "weightcache";
constexpr const char* kMsDomain = "com.microsoft";

// ---- options ------------------------------------------------------------------------------------

struct Options {
  std::optional<std::string> cache_path;  // unset: the default per-user path for the model
  std::string compat_key;
  wc_verify verify = WC_VERIFY_SHARED;
  wc_backing backing = WC_BACKING_AUTO;
  wc_durability durability = WC_DURABILITY_FULL;
  bool weights_cache = true;   // false: XNNPACK packs into its own memory (a baseline)
  bool use_xnnpack = true;     // kernels=xnnpack (default when built with it) or builtin
  // conv=on|off|auto: whether convolutions are taken (XNNPACK only). auto: off on x86-64, where
  // ONNX Runtime's own NCHWc convolutions ran a ResNet-50-shaped model 2.6x faster per Run than
  // XNNPACK's (docs/BENCHMARKS.md), on elsewhere.
  enum class Conv { automatic, on, off } conv = Conv::automatic;
  std::size_t threads = 1;
  std::uint32_t lease_timeout_ms = 1000;
  std::int64_t identity_window_ms = kDefaultIdentityWindowMs;
  std::uint64_t max_file_mb = 0;  // wc_options::max_file_bytes in MiB; 0: the library's default
  std::string prebuilt_dir;       // wc_options::prebuilt_dir; "": none
};

constexpr const char* kOptionList =
    "cache_path, compat_key, verify (none|first_use|shared|open), backing (auto|file|heap), durability "
    "(none|async|full), kernels (xnnpack|builtin), conv (auto|on|off), threads (1-256), weights_cache (on|off), "
    "lease_timeout_ms, "
    "identity_window_ms (0 or more), max_file_mb (1-262144), prebuilt_dir";

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

[[noreturn]] void bad_option(const std::string& key, const std::string& value, const char* accepted) {
  throw OrtError{ORT_INVALID_ARGUMENT, "option " + key + "='" + value + "' is not valid; accepted: " + accepted};
}

// One of a fixed set of words, with the list the error message names.
template <class T, std::size_t N>
T one_of(const std::string& key, const std::string& value, const std::pair<const char*, T> (&choices)[N]) {
  std::string accepted;
  for (const auto& [name, v] : choices) {
    if (value == name) return v;
    accepted += (accepted.empty() ? "" : ", ") + std::string(name);
  }
  bad_option(key, value, accepted.c_str());
}

// A decimal number in [lo, hi]: digits only (no sign, no space).
unsigned long long number(const std::string& key, const std::string& value, unsigned long long lo, unsigned long long hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || !std::isdigit(static_cast<unsigned char>(value[0])) || *end != '\0' || errno != 0 || v < lo ||
      v > hi)
    bad_option(key, value, (std::to_string(lo) + " to " + std::to_string(hi)).c_str());
  return v;
}

void set_option(Options& o, const std::string& key, const std::string& value) {
  if (key == "cache_path") {
    o.cache_path = value;
  } else if (key == "compat_key") {
    o.compat_key = value;
  } else if (key == "prebuilt_dir") {
    o.prebuilt_dir = value;
  } else if (key == "verify") {
    static const std::pair<const char*, wc_verify> v[] = {
        {"none", WC_VERIFY_NONE}, {"first_use", WC_VERIFY_FIRST_USE}, {"shared", WC_VERIFY_SHARED}, {"open", WC_VERIFY_ON_OPEN}};
    o.verify = one_of(key, value, v);
  } else if (key == "backing") {
    static const std::pair<const char*, wc_backing> v[] = {
        {"auto", WC_BACKING_AUTO}, {"file", WC_BACKING_FILE}, {"heap", WC_BACKING_HEAP}};
    o.backing = one_of(key, value, v);
  } else if (key == "durability") {
    static const std::pair<const char*, wc_durability> v[] = {
        {"none", WC_DURABILITY_NONE}, {"async", WC_DURABILITY_ASYNC}, {"full", WC_DURABILITY_FULL}};
    o.durability = one_of(key, value, v);
  } else if (key == "kernels") {
    static const std::pair<const char*, bool> v[] = {{"xnnpack", true}, {"builtin", false}};
    o.use_xnnpack = one_of(key, value, v);
  } else if (key == "conv") {
    static const std::pair<const char*, Options::Conv> v[] = {
        {"auto", Options::Conv::automatic}, {"on", Options::Conv::on}, {"off", Options::Conv::off}};
    o.conv = one_of(key, value, v);
  } else if (key == "weights_cache") {
    static const std::pair<const char*, bool> v[] = {{"on", true}, {"off", false}};
    o.weights_cache = one_of(key, value, v);
  } else if (key == "threads") {
    o.threads = static_cast<std::size_t>(number(key, value, 1, 256));
  } else if (key == "lease_timeout_ms") {
    o.lease_timeout_ms = static_cast<std::uint32_t>(number(key, value, 0, 600000));
  } else if (key == "identity_window_ms") {
    o.identity_window_ms = static_cast<std::int64_t>(number(key, value, 0, kMaxIdentityWindowMs));
  } else if (key == "max_file_mb") {
    o.max_file_mb = number(key, value, 1, 262144);
  } else {
    throw OrtError{ORT_INVALID_ARGUMENT, "unknown option '" + key + "'; the options are: " + kOptionList};
  }
}

// The provider's options: ORT stores SessionOptionsAppendExecutionProvider_V2's pairs in the session
// options as "ep.<provider name in lower case>.<key>".
Options parse_options(const OrtSessionOptions* so) {
  Options o;
  OrtKeyValuePairs* kvps = nullptr;
  check(api().ort->GetSessionOptionsConfigEntries(so, &kvps), "reading the session options");
  struct Release {
    OrtKeyValuePairs* p;
    ~Release() { api().ort->ReleaseKeyValuePairs(p); }
  } release{kvps};
  const char* const* keys = nullptr;
  const char* const* values = nullptr;
  std::size_t n = 0;
  api().ort->GetKeyValuePairs(kvps, &keys, &values, &n);
  const std::string prefix = "ep." + lower(kEpName) + ".";
  for (std::size_t i = 0; i < n; ++i) {
    const std::string key = keys[i] != nullptr ? keys[i] : "";
    if (key.size() <= prefix.size() || lower(key.substr(0, prefix.size())) != prefix) continue;
    set_option(o, key.substr(prefix.size()), values[i] != nullptr ? values[i] : "");
  }
  if (o.use_xnnpack && !have_xnnpack()) o.use_xnnpack = false;
  if (!o.weights_cache) o.backing = WC_BACKING_HEAP;  // the baseline touches no file
  return o;
}

// ---- caches shared by the factory's sessions -------------------------------------------------------

struct SharedCache {
  wc_cache* cache = nullptr;
  std::string path;         // what the options asked for ("" = heap)
  bool stand_in = false;    // a heap cache standing in for a file that could not be used
  std::string why;          // why, when stand_in
  ~SharedCache() {
    wc_close(cache);
    counters().caches_open.fetch_sub(1, std::memory_order_relaxed);
  }
};

std::string compat_key_for(const Options& o) {
  // Everything the packed bytes depend on besides each entry's own key: the provider's layouts
  // (its version, XNNPACK's build and the CPU features XNNPACK dispatches on) and the user's part.
  const std::string build = have_xnnpack() && o.use_xnnpack ? xnnpack_build_id() : std::string("builtin-gemm/1");
  const std::string layout = std::string("weightcache-ort-ep/") + WEIGHTCACHE_ORT_EP_VERSION;
  std::string options = cpu_features() + "|user:" + o.compat_key;
  if (options.size() > WC_XNN_COMPAT_PART_MAX_SIZE) options = cpu_features() + "|user-digest:" + hex_digest(o.compat_key.data(), o.compat_key.size());
  std::string key(WC_XNN_COMPAT_KEY_MAX_SIZE, '\0');
  std::size_t size = 0;
  if (wc_xnn_compat_key(build.data(), build.size(), layout.data(), layout.size(), options.data(), options.size(),
                        key.data(), key.size(), &size) != WC_OK)
    throw OrtError{ORT_FAIL, std::string("cannot build the compatibility key: ") + wc_last_error()};
  key.resize(size);
  return key;
}

class Factory;

// ---- one fused layer ---------------------------------------------------------------------------

// An 8-bit A with one scale and zero point (MatMulInteger, MatMulIntegerToFloat): each is an
// input of the fused node (index) or a constant read at Compile.
struct QuantizedInput {
  bool on = false;
  bool a_unsigned = false;  // uint8 (else int8)
  std::optional<std::size_t> scale_index, zero_index;
  float scale = 1.0f;
  std::int32_t zero = 0;
  // A zero point's byte as the value it is for A's type.
  std::int32_t zero_of(std::uint8_t byte) const noexcept {
    return a_unsigned ? static_cast<std::int32_t>(byte) : static_cast<std::int32_t>(static_cast<std::int8_t>(byte));
  }
};

struct Layer {
  std::unique_ptr<Linear> linear;
  std::unique_ptr<Conv2d> conv;  // a convolution instead of a linear layer
  ConvSpec geometry;             // conv: its shape (no weights)
  std::size_t conv_rank = 0;     // conv: 4, or 3 for a 1-D convolution
  std::size_t k = 0, n = 0;
  std::size_t input_index = 0;  // of the activation among the fused node's inputs
  bool gemm = false;            // A must be 2-D
  QuantizedInput quantized;  // an 8-bit A (MatMulInteger, MatMulIntegerToFloat)
  // A's rank may be unknown until the run (then checked there): a MatMul with a 1-D A gives an
  // output of rank 1 ([N]), any other A an output of A's rank with N last.
};

struct ComputeInfo : OrtNodeComputeInfo {
  std::shared_ptr<Layer> layer;
};

// ---- the execution provider (one per session) ------------------------------------------------------

class Ep : public OrtEp {
 public:
  Ep(Factory& factory, Options options, const OrtLogger* logger);
  ~Ep();

  Factory& factory_;
  Options options_;
  const OrtLogger* logger_;
  std::shared_ptr<SharedCache> cache_;
  wc_xnn_adapter* adapter_ = nullptr;
  void* pool_ = nullptr;  // pthreadpool_t with more than one thread
  std::mutex mu_;         // GetCapability and Compile of one session may not overlap; to be safe
  // Weight-bearing nodes this session's GetCapability calls have seen and taken, by their first
  // output's name (unique in a model, subgraphs included): ONNX Runtime may ask about a graph
  // more than once, and each node is counted and declined in the log once per session.
  std::set<std::string> weight_nodes_seen_, weight_nodes_taken_, declined_;

  OrtStatus* get_capability(const OrtGraph* graph, OrtEpGraphSupportInfo* info);
  OrtStatus* compile(const OrtGraph** graphs, const OrtNode** fused, std::size_t count, OrtNodeComputeInfo** out);
  void ensure_cache(const OrtGraph* graph);
};

class Factory : public OrtEpFactory {
 public:
  explicit Factory(const OrtLogger* logger);

  const OrtLogger* default_logger_;
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, std::weak_ptr<SharedCache>> caches_;

  std::shared_ptr<SharedCache> acquire(const Options& o, const std::string& path, const OrtLogger* logger);
};

std::shared_ptr<SharedCache> Factory::acquire(const Options& o, const std::string& path, const OrtLogger* logger) {
  const std::string compat = compat_key_for(o);
  const std::string want_path = o.backing == WC_BACKING_HEAP ? std::string() : path;
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = caches_[{want_path, compat + '\0' + o.prebuilt_dir}];
  if (auto existing = slot.lock()) return existing;
  auto sc = std::make_shared<SharedCache>();
  counters().caches_open.fetch_add(1, std::memory_order_relaxed);
  sc->path = want_path;
  wc_options wo;
  wc_options_init(&wo);
  wo.compat_key = compat.data();
  wo.compat_key_size = compat.size();
  wo.verify = o.verify;
  wo.durability = o.durability;
  wo.lease_timeout_ms = o.lease_timeout_ms;
  wo.max_file_bytes = o.max_file_mb << 20;  // 0: the library's default
  if (!o.prebuilt_dir.empty()) wo.prebuilt_dir = o.prebuilt_dir.c_str();
  wo.refresh_on_miss = 1;  // a long-lived process sees what other processes committed since
  wo.alignment = 128;      // the largest XNN_ALLOCATION_ALIGNMENT
  wc_status st = WC_ERR_INVALID_ARGUMENT;
  std::string why;
  if (!want_path.empty()) {
    if (want_path != ":memory:") {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(want_path).parent_path(), ec);
    }
    wo.path = want_path.c_str();
    // Try the file alone first: when it cannot be used, this provider says why through ORT's
    // logger and decides the fallback itself (auto: a heap cache; file: an error).
    wo.backing = WC_BACKING_FILE;
    st = wc_open(&wo, &sc->cache);
    if (st == WC_OK && !o.prebuilt_dir.empty()) {
      // The file in use may be a prebuilt one: messages name it.
      std::string in_use(wc_get_path(sc->cache, nullptr, 0), '\0');
      (void)wc_get_path(sc->cache, in_use.data(), in_use.size() + 1);
      sc->path = in_use;
    }
    if (st != WC_OK) {
      why = wc_last_error();
      if (o.backing == WC_BACKING_FILE)
        throw OrtError{ORT_FAIL, "cannot use the cache file '" + want_path + "' (backing=file): " + why};
      counters().cache_failures.fetch_add(1, std::memory_order_relaxed);
      log(logger, ORT_LOGGING_LEVEL_WARNING,
          "cannot use the cache file '" + want_path + "': " + why +
              "; this process packs its weights into heap memory instead (outputs are unaffected). Fix the path "
              "or its permissions, free disk space, or pass another cache_path");
    }
  }
  if (st != WC_OK) {
    wo.path = nullptr;
    wo.backing = WC_BACKING_HEAP;
    if (wc_open(&wo, &sc->cache) != WC_OK)
      throw OrtError{ORT_FAIL, std::string("cannot open even a heap cache: ") + wc_last_error()};
    sc->stand_in = !want_path.empty();
    sc->why = why;
  }
  slot = sc;
  return sc;
}

// ---- graph inspection helpers -------------------------------------------------------------------

struct TensorInfo {
  bool known = false;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  bool rank_known = false;
  std::vector<std::int64_t> dims;  // -1 for a symbolic dimension
};

TensorInfo tensor_info(const OrtValueInfo* vi) {
  TensorInfo t;
  if (vi == nullptr) return t;
  const OrtTypeInfo* ti = nullptr;
  if (OrtStatus* s = api().ort->GetValueInfoTypeInfo(vi, &ti); s != nullptr || ti == nullptr) {
    take_message(s);
    return t;
  }
  const OrtTensorTypeAndShapeInfo* tsi = nullptr;
  if (OrtStatus* s = api().ort->CastTypeInfoToTensorInfo(ti, &tsi); s != nullptr || tsi == nullptr) {
    take_message(s);
    return t;
  }
  t.known = true;
  check(api().ort->GetTensorElementType(tsi, &t.type), "element type");
  std::size_t rank = 0;
  if (OrtStatus* s = api().ort->GetDimensionsCount(tsi, &rank); s != nullptr) {
    take_message(s);
    return t;
  }
  t.dims.resize(rank);
  check(api().ort->GetDimensions(tsi, t.dims.data(), rank), "dimensions");
  // No shape at all (an older exporter's Reshape whose shape is computed, at opset 9, gives its
  // output none) reads as rank 0 above: only ORT's own flag tells it from a scalar.
  t.rank_known = api().ort->TensorTypeAndShape_HasShape(tsi);
  if (!t.rank_known) t.dims.clear();
  return t;
}

std::string value_name(const OrtValueInfo* vi) {
  const char* name = nullptr;
  check(api().ort->GetValueInfoName(vi, &name), "value name");
  return name != nullptr ? name : "";
}

// The items behind one of ORT's count-then-fill pairs (Graph_GetNumNodes + Graph_GetNodes, ...).
template <class T, class Owner, class CountFn, class FillFn>
std::vector<const T*> listed(const Owner* owner, CountFn count_fn, FillFn fill_fn, const char* what) {
  std::size_t n = 0;
  check(count_fn(owner, &n), what);
  std::vector<const T*> v(n);
  if (n) check(fill_fn(owner, v.data(), n), what);
  return v;
}

std::vector<const OrtValueInfo*> node_inputs(const OrtNode* node) {
  return listed<OrtValueInfo>(node, api().ort->Node_GetNumInputs, api().ort->Node_GetInputs, "inputs");
}

std::vector<const OrtValueInfo*> node_outputs(const OrtNode* node) {
  return listed<OrtValueInfo>(node, api().ort->Node_GetNumOutputs, api().ort->Node_GetOutputs, "outputs");
}

std::vector<const OrtNode*> graph_nodes(const OrtGraph* graph) {
  return listed<OrtNode>(graph, api().ort->Graph_GetNumNodes, api().ort->Graph_GetNodes, "nodes");
}

std::string op_type(const OrtNode* node) {
  const char* t = nullptr;
  check(api().ort->Node_GetOperatorType(node, &t), "operator type");
  return t != nullptr ? t : "";
}

std::string domain(const OrtNode* node) {
  const char* d = nullptr;
  check(api().ort->Node_GetDomain(node, &d), "domain");
  std::string s = d != nullptr ? d : "";
  return s == "ai.onnx" ? std::string() : s;
}

bool is_constant(const OrtValueInfo* vi) {
  if (vi == nullptr) return false;
  bool c = false;
  if (OrtStatus* s = api().ort->ValueInfo_IsConstantInitializer(vi, &c); s != nullptr) {
    take_message(s);
    return false;
  }
  return c;
}

bool is_graph_output(const OrtValueInfo* vi) {
  bool o = false;
  if (OrtStatus* s = api().ort->ValueInfo_IsGraphOutput(vi, &o); s != nullptr) {
    take_message(s);
    return true;  // when unsure, do not fuse past it
  }
  return o;
}

// The node that computes a value, or NULL for a graph input or initializer.
const OrtNode* producer_of(const OrtValueInfo* vi) {
  const OrtNode* node = nullptr;
  std::size_t index = 0;
  if (OrtStatus* s = api().ort->ValueInfo_GetValueProducer(vi, &node, &index); s != nullptr) {
    take_message(s);
    return nullptr;
  }
  return node;
}

// The only consumer of a value, or NULL when it has none, several, or is a graph output.
const OrtNode* sole_consumer(const OrtValueInfo* vi) {
  if (is_graph_output(vi)) return nullptr;
  std::size_t n = 0;
  check(api().ort->ValueInfo_GetValueNumConsumers(vi, &n), "consumers");
  if (n != 1) return nullptr;
  const OrtNode* node = nullptr;
  std::int64_t input_index = 0;
  check(api().ort->ValueInfo_GetValueConsumers(vi, &node, &input_index, 1), "consumers");
  return node;
}

// The node's attribute `name`, or NULL when it has none (ONNX Runtime fills in constant defaults).
const OrtOpAttr* attribute(const OrtNode* node, const char* name) {
  const OrtOpAttr* attr = nullptr;
  OrtStatus* s = api().ort->Node_GetAttributeByName(node, name, &attr);
  take_message(s);
  return s == nullptr ? attr : nullptr;
}

// A scalar attribute of the given type, or nullopt when absent or of another type.
template <class T>
std::optional<T> scalar_attr(const OrtNode* node, const char* name, OrtOpAttrType type) {
  const OrtOpAttr* attr = attribute(node, name);
  if (attr == nullptr) return std::nullopt;
  T v{};
  std::size_t size = 0;
  if (OrtStatus* r = api().ort->ReadOpAttr(attr, type, &v, sizeof v, &size); r != nullptr) {
    take_message(r);
    return std::nullopt;
  }
  return v;
}

std::optional<std::int64_t> int_attr(const OrtNode* node, const char* name) {
  return scalar_attr<std::int64_t>(node, name, ORT_OP_ATTR_INT);
}

std::optional<float> float_attr(const OrtNode* node, const char* name) {
  return scalar_attr<float>(node, name, ORT_OP_ATTR_FLOAT);
}

std::optional<std::string> string_attr(const OrtNode* node, const char* name) {
  const OrtOpAttr* attr = attribute(node, name);
  if (attr == nullptr) return std::nullopt;
  std::size_t size = 0;
  take_message(api().ort->ReadOpAttr(attr, ORT_OP_ATTR_STRING, nullptr, 0, &size));  // reports the size needed
  std::string v(size, '\0');
  if (OrtStatus* r = api().ort->ReadOpAttr(attr, ORT_OP_ATTR_STRING, v.data(), v.size(), &size); r != nullptr) {
    take_message(r);
    return std::nullopt;
  }
  v.resize(std::min(size, v.size()));
  while (!v.empty() && v.back() == '\0') v.pop_back();
  return v;
}

// An attribute of integers, or nullopt when absent or of another type.
std::optional<std::vector<std::int64_t>> ints_attr(const OrtNode* node, const char* name) {
  const OrtOpAttr* attr = attribute(node, name);
  if (attr == nullptr) return std::nullopt;
  std::size_t size = 0;
  take_message(api().ort->ReadOpAttr(attr, ORT_OP_ATTR_INTS, nullptr, 0, &size));  // reports the size needed
  std::vector<std::int64_t> v(size / sizeof(std::int64_t));
  if (OrtStatus* r = api().ort->ReadOpAttr(attr, ORT_OP_ATTR_INTS, v.data(), v.size() * sizeof(std::int64_t), &size);
      r != nullptr) {
    take_message(r);
    return std::nullopt;
  }
  v.resize(std::min(v.size(), size / sizeof(std::int64_t)));
  return v;
}

std::int64_t numel(const std::vector<std::int64_t>& dims) {
  std::int64_t n = 1;
  for (auto d : dims) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
}

bool is_f32(const TensorInfo& t) { return t.known && t.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }

// A constant that adds one value per output column: shape [N], [1, N], [1, 1, N] ... (or a scalar).
bool is_row_bias(const OrtValueInfo* vi, std::int64_t n) {
  if (!is_constant(vi)) return false;
  const TensorInfo t = tensor_info(vi);
  if (!is_f32(t) || !t.rank_known) return false;
  const std::int64_t count = numel(t.dims);
  if (count == 1) return true;
  if (count != n || t.dims.empty() || t.dims.back() != n) return false;
  return true;
}

// The bytes of a constant initializer (nullptr and 0 when ORT gives none).
std::pair<const void*, std::size_t> constant_bytes(const OrtValueInfo* vi) {
  const OrtValue* value = nullptr;
  if (OrtStatus* s = api().ort->ValueInfo_GetInitializerValue(vi, &value); s != nullptr || value == nullptr) {
    take_message(s);
    return {nullptr, 0};
  }
  const void* data = nullptr;
  std::size_t bytes = 0;
  if (OrtStatus* s = api().ort->GetTensorData(value, &data); s != nullptr) {
    take_message(s);
    return {nullptr, 0};
  }
  if (OrtStatus* s = api().ort->GetTensorSizeInBytes(value, &bytes); s != nullptr) {
    take_message(s);
    return {nullptr, 0};
  }
  return {data, bytes};
}

// Whether every beta / alpha * C value is finite (C a small constant row, read here).
bool scaled_bias_finite(const OrtValueInfo* vi, float scale, float alpha) {
  if (!std::isfinite(scale)) return false;
  if (alpha == 1.0f) return true;
  const OrtValue* value = nullptr;
  if (OrtStatus* s = api().ort->ValueInfo_GetInitializerValue(vi, &value); s != nullptr || value == nullptr) {
    take_message(s);
    return false;
  }
  const void* data = nullptr;
  std::size_t bytes = 0;
  if (OrtStatus* s = api().ort->GetTensorData(value, &data); s != nullptr) {
    take_message(s);
    return false;
  }
  if (OrtStatus* s = api().ort->GetTensorSizeInBytes(value, &bytes); s != nullptr) {
    take_message(s);
    return false;
  }
  const auto* c = static_cast<const float*>(data);
  for (std::size_t i = 0; i < bytes / sizeof(float); ++i)
    if (!std::isfinite(c[i] * scale)) return false;
  return true;
}

// ---- the layers the provider claims ---------------------------------------------------------------

enum class Core { matmul, gemm, nbits, conv, qc8 };

// One claimed layer, as found by GetCapability (and again by Compile on its own graph).
struct Plan {
  Core core = Core::matmul;
  const OrtNode* core_node = nullptr;
  const OrtNode* add_node = nullptr;   // the fused bias Add, if any
  const OrtNode* act_node = nullptr;   // the fused Relu / Gelu, if any
  Activation activation = Activation::none;
  std::int64_t k = 0, n = 0;
  std::size_t out_rank = 0;  // rank of the layer's output (the activation's)
  std::int64_t block_size = 0;  // nbits: K per block scale
  ConvSpec conv;                // conv: the geometry (weights, names and bias come at Compile)
  std::size_t conv_rank = 0;    // conv: 4 (2-D) or 3 (1-D, run as height 1)
  // qc8: the int8 weights, their scales (1 or N values) and the bias of the core node (or NULL).
  const OrtValueInfo* weight_vi = nullptr;
  const OrtValueInfo* scale_vi = nullptr;
  const OrtValueInfo* bias_vi = nullptr;
  // qc8 on an A quantized before the layer (MatMulInteger, MatMulIntegerToFloat): its scale (NULL:
  // 1, folded into the weights') and zero point (NULL: 0), one value each; and a MatMulInteger's
  // Cast, scale Mul (unless folded) and output Mul.
  bool quantized_a = false;
  const OrtValueInfo* a_scale = nullptr;
  const OrtValueInfo* a_zero = nullptr;
  std::vector<const OrtNode*> chain;
  // The node whose output the bias Add and activation follow: the chain's last, else the core.
  const OrtNode* last_node() const { return chain.empty() ? core_node : chain.back(); }
  std::vector<const OrtNode*> nodes() const {
    std::vector<const OrtNode*> v{core_node};
    v.insert(v.end(), chain.begin(), chain.end());
    if (add_node) v.push_back(add_node);
    if (act_node) v.push_back(act_node);
    return v;
  }
};

std::optional<Activation> activation_of(const OrtNode* node) {
  const std::string t = op_type(node), d = domain(node);
  if (t == "Relu" && d.empty()) return Activation::relu;
  if (t == "Gelu" && d == kMsDomain) return Activation::gelu;
  if (t == "Gelu" && d.empty()) {
    const auto approx = string_attr(node, "approximate");
    if (!approx || *approx == "none") return Activation::gelu;
  }
  return std::nullopt;
}

// The input that holds a node's weight, for the operators that bear weights (matrix products and
// convolutions, float and quantized); -1 for any other node.
int weight_input(const std::string& t, const std::string& d) {
  if (d.empty()) {
    if (t == "MatMul" || t == "Gemm" || t == "Conv" || t == "ConvTranspose" || t == "MatMulInteger" ||
        t == "ConvInteger")
      return 1;
    if (t == "QLinearMatMul" || t == "QLinearConv") return 3;
    return -1;
  }
  if (d == kMsDomain) {
    if (t == "MatMulNBits" || t == "DynamicQuantizeMatMul" || t == "FusedMatMul" || t == "FusedConv" ||
        t == "FusedGemm" || t == "MatMulIntegerToFloat")
      return 1;
    if (t == "QGemm") return 3;
  }
  return -1;
}

// Whether `node` bears a weight: a weight-bearing operator whose weight input is a constant.
bool bears_weight(const OrtNode* node) {
  const int w = weight_input(op_type(node), domain(node));
  if (w < 0) return false;
  const auto in = node_inputs(node);
  return static_cast<std::size_t>(w) < in.size() && is_constant(in[static_cast<std::size_t>(w)]);
}

// Whether a constant float32 holds only finite values, and with `normal`, none subnormal either
// (zero is fine). XNNPACK's quantized kernels clamp their output, which turns a NaN into -inf,
// and flush subnormal values to zero: a layer with such a scale or bias stays on the CPU provider.
bool finite_constant(const OrtValueInfo* vi, bool normal) {
  const auto [data, bytes] = is_constant(vi) ? constant_bytes(vi) : std::pair<const void*, std::size_t>{};
  if (data == nullptr || !is_f32(tensor_info(vi))) return false;
  const auto* f = static_cast<const float*>(data);
  for (std::size_t i = 0; i < bytes / sizeof(float); ++i) {
    if (!std::isfinite(f[i])) return false;
    if (normal && f[i] != 0.0f && !std::isnormal(f[i])) return false;
  }
  return true;
}

// Why the zero points of int8 weights cannot be computed ("" when they can: a constant int8 of 0s,
// since XNNPACK's int8 weights are symmetric; any other stays on the CPU provider).
std::string dims_text(const TensorInfo& t);

// Its shape: one value (a scalar or [1]) or one per column ([N], [1, N]), as ONNX Runtime's kernels
// accept; any other they refuse at run time, and so it is left to them.
std::string nonzero_weight_zero_points(const OrtValueInfo* vi, std::int64_t n) {
  const auto [zp, bytes] = is_constant(vi) ? constant_bytes(vi) : std::pair<const void*, std::size_t>{};
  const TensorInfo t = tensor_info(vi);
  if (zp == nullptr || t.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8) return "b_zero_point is not a constant int8";
  const bool one = t.rank_known && t.dims.size() <= 1 && numel(t.dims) == 1;
  bool column = t.rank_known && !t.dims.empty() && t.dims.back() == n && numel(t.dims) == n;
  if (!one && !column) return "b_zero_point is neither one value nor one per column " + dims_text(t);
  const auto* z = static_cast<const std::int8_t*>(zp);
  for (std::size_t i = 0; i < bytes; ++i)
    if (z[i] != 0) return "b_zero_point is not 0 (only symmetric int8 weights are computed)";
  return {};
}

// A constant float32 of one value or one per column ([N], [1, N] ...): the weights' scale or a
// bias, of at most `rank_room` dimensions (so that it adds none to the output it multiplies or
// is added to).
bool is_scale_row(const OrtValueInfo* vi, std::int64_t n, std::size_t rank_room) {
  return is_row_bias(vi, n) && tensor_info(vi).dims.size() <= rank_room;
}

std::string dims_text(const TensorInfo& t) {
  if (!t.rank_known) return "(unknown rank)";
  std::string s = "[";
  for (std::size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + (t.dims[i] < 0 ? std::string("?") : std::to_string(t.dims[i]));
  return s + "]";
}

// Whether `node` is a layer the provider computes, and with what shape; if not, `*why` says why
// (for a node that bears a weight: the provider's verbose log names each one it leaves to others).
// Why convolutions are not taken with these options ("" when they are).
std::string conv_refusal(const Options& o) {
  if (!o.use_xnnpack) return "convolutions need XNNPACK (kernels=xnnpack)";
  if (o.conv == Options::Conv::off) return "conv=off";
#if defined(__x86_64__) || defined(_M_X64)
  if (o.conv == Options::Conv::automatic)
    return "on x86-64 convolutions are left to ONNX Runtime's CPU provider by default, whose NCHWc kernels run "
           "faster per Run than XNNPACK's; conv=on takes them (faster session creation, slower Runs)";
#endif
  return {};
}

std::optional<Plan> core_plan(const OrtNode* node, bool nbits_ok, std::string* why = nullptr,
                              const std::string& conv_refused = {}) {
  const std::string t = op_type(node), d = domain(node);
  const auto decline = [&](std::string reason) -> std::optional<Plan> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  const auto in = node_inputs(node);
  const auto out = node_outputs(node);
  Plan p;
  p.core_node = node;
  // A fused layer takes its activation as an input; a constant one would be dropped from the
  // fused node with the weights (ONNX Runtime folds such a node or runs it itself).
  if (!in.empty() && in[0] != nullptr && is_constant(in[0]))
    return decline("its input A is a constant initializer, not an activation");
  if ((t == "MatMulInteger" && d.empty() && in.size() >= 2) ||
      (t == "MatMulIntegerToFloat" && d == kMsDomain && in.size() >= 4)) {
    const bool to_float = t == "MatMulIntegerToFloat";
    // A arrives quantized, one scale and zero point for the tensor (DynamicQuantizeLinear's, or
    // fixed); XNNPACK's qd8-qc8w takes it as it is, so the product is ORT's own integer one.
    if (!nbits_ok) return decline("8-bit weights need XNNPACK (kernels=xnnpack)");
    const TensorInfo a = tensor_info(in[0]), b = tensor_info(in[1]);
    if (!a.known || (a.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 && a.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8))
      return decline("A is not uint8 or int8");
    if (a.rank_known && a.dims.empty()) return decline("A is a scalar");
    if (!is_constant(in[1]) || !b.known || b.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 || b.dims.size() != 2 ||
        b.dims[0] <= 0 || b.dims[1] <= 0)
      return decline("B is not a constant 2-D int8 initializer " + dims_text(b) +
                     (b.known && b.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 ? " (uint8 weights are not computed)" : ""));
    p.k = b.dims[0];
    p.n = b.dims[1];
    if (a.rank_known && a.dims.back() >= 0 && a.dims.back() != p.k)
      return decline("A's last dimension " + std::to_string(a.dims.back()) + " is not B's K " + std::to_string(p.k));
    p.out_rank = a.rank_known ? a.dims.size() : 0;
    const std::size_t rank_room = p.out_rank != 0 ? p.out_rank : 1;  // a per-tensor value adds no dimension
    // One value of `type`: a scalar or a 1-D tensor of one (what ONNX Runtime's kernels accept for
    // a zero point and MatMulIntegerToFloat's a_scale); `any_rank`: of any rank that adds no
    // dimension to the output (a value multiplied in by a Mul).
    const auto one_value = [&](const OrtValueInfo* vi, ONNXTensorElementDataType type, bool any_rank = false) {
      const TensorInfo v = tensor_info(vi);
      return v.known && v.type == type && v.rank_known && v.dims.size() <= (any_rank ? rank_room : 1) &&
             numel(v.dims) == 1;
    };
    const std::size_t a_zero_at = to_float ? 4 : 2, b_zero_at = to_float ? 5 : 3;
    if (in.size() > a_zero_at && in[a_zero_at] != nullptr) {
      if (!one_value(in[a_zero_at], a.type))
        return decline("a_zero_point is not one value of A's type (per-row zero points are not computed)");
      p.a_zero = in[a_zero_at];
    }
    if (in.size() > b_zero_at && in[b_zero_at] != nullptr) {
      if (std::string z = nonzero_weight_zero_points(in[b_zero_at], p.n); !z.empty()) return decline(z);
    }
    if (to_float) {
      if (out.size() != 1 || !is_f32(tensor_info(out[0]))) return decline("its output is not one float32 tensor");
      if (!one_value(in[2], ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)) return decline("a_scale is not one float32 value");
      if (!is_scale_row(in[3], p.n, 2)) return decline("b_scale is not a constant float32 of 1 or N values");
      if (!finite_constant(in[3], true)) return decline("b_scale holds a NaN, an infinity or a subnormal value");
      p.a_scale = in[2];
      p.scale_vi = in[3];
      if (in.size() > 6 && in[6] != nullptr) {
        if (!is_scale_row(in[6], p.n, rank_room)) return decline("the bias is not a row of N values");
        if (!finite_constant(in[6], false)) return decline("the bias holds a NaN or an infinity");
        p.bias_vi = in[6];
      }
    } else {
      // The int32 product scaled to float as onnxruntime's quantize_dynamic writes it:
      // Cast(to float), then Mul by (a_scale x b_scale), each the only user of what it takes.
      const auto unlike = [&](const std::string& what) {
        return decline("its int32 result is not scaled to float32 as quantize_dynamic writes it (Cast to float, "
                       "then Mul by a Mul of A's scale and a constant b_scale, or by a constant): " + what);
      };
      if (out.size() != 1 || out[0] == nullptr) return unlike("no single output");
      const OrtNode* cast = sole_consumer(out[0]);
      if (cast == nullptr) return unlike("the int32 product has several users, none, or is a graph output");
      if (op_type(cast) != "Cast" || !domain(cast).empty()) return unlike("the int32 product goes to " + op_type(cast));
      if (int_attr(cast, "to").value_or(0) != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
        return unlike("the Cast is not to float32");
      const auto cast_out = node_outputs(cast);
      const OrtNode* mul = cast_out.size() == 1 ? sole_consumer(cast_out[0]) : nullptr;
      if (mul == nullptr) return unlike("the Cast's output has several users, none, or is a graph output");
      if (op_type(mul) != "Mul" || !domain(mul).empty()) return unlike("the Cast's output goes to " + op_type(mul));
      const auto mul_in = node_inputs(mul);
      const auto mul_out = node_outputs(mul);
      if (mul_in.size() != 2 || mul_out.size() != 1 || !is_f32(tensor_info(mul_out[0])))
        return unlike("the Mul does not give one float32 tensor");
      const OrtValueInfo* scale = mul_in[0] == cast_out[0] ? mul_in[1] : mul_in[1] == cast_out[0] ? mul_in[0] : nullptr;
      if (scale == nullptr) return unlike("the Mul squares the product");
      if (is_constant(scale)) {
        // A and the weights both scaled by constants (static quantization), which ORT folded into
        // one: the weights' scale, with A's taken as 1.
        if (!is_scale_row(scale, p.n, rank_room)) return unlike("the constant scale is not 1 or N values of a rank that adds no dimension");
        if (!finite_constant(scale, true)) return decline("the scale holds a NaN, an infinity or a subnormal value");
        p.scale_vi = scale;
        p.chain = {cast, mul};
      } else {
        const OrtNode* scales_mul = producer_of(scale);
        if (scales_mul == nullptr || op_type(scales_mul) != "Mul" || !domain(scales_mul).empty())
          return unlike("the scale is not computed by a Mul");
        if (sole_consumer(scale) != mul) return unlike("the scales' product has other users");
        const auto s_in = node_inputs(scales_mul);
        if (s_in.size() != 2 || s_in[0] == nullptr || s_in[1] == nullptr) return unlike("the scales' Mul has no two inputs");
        // Which of the two is b_scale: the constant of 1 or N values whose partner is one value.
        for (int i = 0; i < 2 && p.scale_vi == nullptr; ++i)
          if (is_scale_row(s_in[i], p.n, rank_room) &&
              one_value(s_in[1 - i], ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, /*any_rank=*/true)) {
            p.scale_vi = s_in[i];
            p.a_scale = s_in[1 - i];
          }
        if (p.scale_vi == nullptr)
          return unlike("the scales' Mul is not of one float32 value and a constant of 1 or N values, of ranks that "
                        "add no dimension");
        if (!finite_constant(p.scale_vi, true)) return decline("b_scale holds a NaN, an infinity or a subnormal value");
        p.chain = {cast, scales_mul, mul};
      }
    }
    p.core = Core::qc8;
    p.quantized_a = true;
    p.weight_vi = in[1];
    return p;
  }
  if (out.size() != 1 || !is_f32(tensor_info(out[0]))) return decline("its output is not one float32 tensor");
  if (t == "MatMul" && d.empty() && in.size() == 2) {
    const TensorInfo a = tensor_info(in[0]), b = tensor_info(in[1]);
    // A's rank and dimensions may be unknown here (exporters' Reshapes): K and the rank are
    // checked when the layer runs, and a run whose A does not fit fails with an error.
    if (!is_f32(a)) return decline("A is not float32");
    if (a.rank_known && a.dims.empty()) return decline("A is a scalar");
    if (!is_f32(b) || b.dims.size() != 2) return decline("B is not a 2-D float32 matrix " + dims_text(b));
    if (!is_constant(in[1])) return decline("B is not a constant initializer");
    if (b.dims[0] <= 0 || b.dims[1] <= 0) return decline("B has an empty or unknown dimension " + dims_text(b));
    if (a.rank_known && a.dims.back() >= 0 && a.dims.back() != b.dims[0])
      return decline("A's last dimension " + std::to_string(a.dims.back()) + " is not B's K " + std::to_string(b.dims[0]));
    p.core = Core::matmul;
    p.out_rank = a.rank_known ? a.dims.size() : 0;
    p.k = b.dims[0];
    p.n = b.dims[1];
    return p;
  }
  if (t == "Gemm" && d.empty() && (in.size() == 2 || in.size() == 3)) {
    const TensorInfo a = tensor_info(in[0]), b = tensor_info(in[1]);
    if (!is_f32(a) || (a.rank_known && a.dims.size() != 2)) return decline("A is not a 2-D float32 matrix " + dims_text(a));
    if (!is_f32(b) || b.dims.size() != 2) return decline("B is not a 2-D float32 matrix " + dims_text(b));
    if (!is_constant(in[1])) return decline("B is not a constant initializer");
    if (int_attr(node, "transA").value_or(0) != 0) return decline("transA=1 (A transposed) is not computed");
    const bool trans_b = int_attr(node, "transB").value_or(0) != 0;
    p.k = trans_b ? b.dims[1] : b.dims[0];
    p.n = trans_b ? b.dims[0] : b.dims[1];
    if (p.k <= 0 || p.n <= 0) return decline("B has an empty or unknown dimension " + dims_text(b));
    if (a.rank_known && a.dims[1] >= 0 && a.dims[1] != p.k)
      return decline("A's K " + std::to_string(a.dims[1]) + " is not B's " + std::to_string(p.k));
    const float alpha = float_attr(node, "alpha").value_or(1.0f), beta = float_attr(node, "beta").value_or(1.0f);
    if (alpha == 0.0f || !std::isfinite(alpha) || !std::isfinite(beta)) return decline("alpha is 0, or alpha or beta is not finite");
    if (in.size() == 3 && in[2] != nullptr && beta != 0.0f) {
      if (!is_row_bias(in[2], p.n) || tensor_info(in[2]).dims.size() > 2)
        return decline("C is not a constant row of N values " + dims_text(tensor_info(in[2])));
      // The bias is packed as beta * C / alpha (the product is scaled by alpha afterwards): it must
      // stay finite, or a tiny alpha would turn every output into inf or NaN.
      if (!scaled_bias_finite(in[2], beta / alpha, alpha)) return decline("beta * C / alpha is not finite");
    }
    p.core = Core::gemm;
    p.out_rank = 2;
    return p;
  }
  if (t == "MatMulNBits" && d == kMsDomain && in.size() >= 3) {
    if (!nbits_ok) return decline("4-bit weights need XNNPACK (kernels=xnnpack)");
    const auto k = int_attr(node, "K"), n = int_attr(node, "N"), bits = int_attr(node, "bits"),
               block = int_attr(node, "block_size");
    if (!k || !n || !block || bits.value_or(4) != 4 || *k <= 0 || *n <= 0)
      return decline("only bits=4 with K, N and block_size set is computed");
    if (!nbits_supported(static_cast<std::size_t>(*k), static_cast<std::size_t>(*n), static_cast<std::size_t>(*block)))
      return decline("XNNPACK takes no block size " + std::to_string(*block) + " for K " + std::to_string(*k));
    const TensorInfo a = tensor_info(in[0]), b = tensor_info(in[1]), s = tensor_info(in[2]);
    if (!is_f32(a)) return decline("A is not float32");
    if (a.rank_known && a.dims.empty()) return decline("A is a scalar");
    if (!is_constant(in[1]) || !b.known || b.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      return decline("B is not a constant uint8 initializer");
    if (numel(b.dims) != *n * (*k / 2)) return decline("B does not hold N x K/2 bytes");
    if (!is_constant(in[2]) || !is_f32(s) || numel(s.dims) != *n * (*k / *block))
      return decline("the scales are not a constant float32 tensor of N x K/block_size values");
    // zero_points (3), g_idx (4): only the default symmetric layout (zero point 8) is claimed.
    if (in.size() > 3 && in[3] != nullptr) return decline("zero points are not computed (only the default 8)");
    if (in.size() > 4 && in[4] != nullptr) return decline("g_idx is not computed");
    if (in.size() > 5 && in[5] != nullptr && !is_row_bias(in[5], *n)) return decline("the bias is not a row of N values");
    if (in.size() > 5 && in[5] != nullptr && !finite_constant(in[5], false)) return decline("the bias holds a NaN or an infinity");
    p.core = Core::nbits;
    p.out_rank = a.rank_known ? a.dims.size() : 0;
    p.block_size = *block;
    p.k = *k;
    p.n = *n;
    return p;
  }
  if (t == "Conv" && d.empty() && (in.size() == 2 || in.size() == 3)) {
    if (!nbits_ok) return decline("convolutions need XNNPACK (kernels=xnnpack)");
    if (!conv_refused.empty()) return decline(conv_refused);
    const TensorInfo x = tensor_info(in[0]), w = tensor_info(in[1]);
    if (!is_f32(x)) return decline("X is not float32");
    if (!is_constant(in[1]) || !is_f32(w)) return decline("W is not a constant float32 initializer");
    const std::size_t rank = w.dims.size();
    if (rank != 4 && rank != 3) return decline("only 1-D and 2-D convolutions are computed (W " + dims_text(w) + ")");
    if (x.rank_known && x.dims.size() != rank) return decline("X's rank is not W's " + dims_text(x));
    const std::int64_t group = int_attr(node, "group").value_or(1);
    const std::int64_t m = w.dims[0], gi = w.dims[1], kh = rank == 4 ? w.dims[2] : 1, kw = w.dims[rank - 1];
    if (group <= 0 || m <= 0 || gi <= 0 || kh <= 0 || kw <= 0 || m % group != 0)
      return decline("W's shape " + dims_text(w) + " does not fit group " + std::to_string(group));
    if (x.rank_known && x.dims[1] >= 0 && x.dims[1] != gi * group)
      return decline("X has " + std::to_string(x.dims[1]) + " channels, W takes " + std::to_string(gi * group));
    const std::size_t spatial = rank - 2;
    const auto ones = std::vector<std::int64_t>(spatial, 1);
    const auto strides = ints_attr(node, "strides").value_or(ones);
    const auto dilations = ints_attr(node, "dilations").value_or(ones);
    auto pads = ints_attr(node, "pads").value_or(std::vector<std::int64_t>(2 * spatial, 0));
    if (const auto ks = ints_attr(node, "kernel_shape"); ks && (ks->size() != spatial || ks->back() != kw || (spatial == 2 && (*ks)[0] != kh)))
      return decline("kernel_shape disagrees with W " + dims_text(w));
    if (strides.size() != spatial || dilations.size() != spatial || pads.size() != 2 * spatial)
      return decline("strides, dilations or pads do not have one value per spatial dimension");
    for (std::size_t i = 0; i < spatial; ++i)
      if (strides[i] <= 0 || dilations[i] <= 0 || pads[i] < 0 || pads[i + spatial] < 0 || strides[i] > 65535 ||
          dilations[i] > 65535 || pads[i] > 65535 || pads[i + spatial] > 65535)
        return decline("a stride, dilation or pad is out of range");
    const std::string auto_pad = string_attr(node, "auto_pad").value_or("NOTSET");
    if (auto_pad == "VALID") {
      std::fill(pads.begin(), pads.end(), 0);
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      // The pads follow from the input's size: computed here where the graph gives it.
      for (std::size_t i = 0; i < spatial; ++i) {
        const std::int64_t size = x.rank_known ? x.dims[2 + i] : -1;
        if (size <= 0) return decline("auto_pad " + auto_pad + " on an input whose size the graph does not give");
        const std::int64_t k = i == spatial - 1 ? kw : kh;
        const std::int64_t out = (size + strides[i] - 1) / strides[i];
        const std::int64_t total = std::max<std::int64_t>(0, (out - 1) * strides[i] + (k - 1) * dilations[i] + 1 - size);
        const std::int64_t small = total / 2, large = total - small;
        pads[i] = auto_pad == "SAME_UPPER" ? small : large;
        pads[i + spatial] = auto_pad == "SAME_UPPER" ? large : small;
      }
    } else if (auto_pad != "NOTSET") {
      return decline("unknown auto_pad " + auto_pad);
    }
    if (in.size() == 3 && in[2] != nullptr) {
      const TensorInfo bt = tensor_info(in[2]);
      if (!is_constant(in[2]) || !is_f32(bt) || numel(bt.dims) != m) return decline("B is not a constant of M values");
    }
    ConvSpec& c = p.conv;
    c.groups = static_cast<std::size_t>(group);
    c.group_in = static_cast<std::size_t>(gi);
    c.group_out = static_cast<std::size_t>(m / group);
    c.kh = static_cast<std::size_t>(kh);
    c.kw = static_cast<std::size_t>(kw);
    c.sh = spatial == 2 ? static_cast<std::size_t>(strides[0]) : 1;
    c.sw = static_cast<std::size_t>(strides.back());
    c.dh = spatial == 2 ? static_cast<std::size_t>(dilations[0]) : 1;
    c.dw = static_cast<std::size_t>(dilations.back());
    c.pad_top = spatial == 2 ? static_cast<std::size_t>(pads[0]) : 0;
    c.pad_left = static_cast<std::size_t>(pads[spatial - 1]);
    c.pad_bottom = spatial == 2 ? static_cast<std::size_t>(pads[2]) : 0;
    c.pad_right = static_cast<std::size_t>(pads[2 * spatial - 1]);
    p.core = Core::conv;
    p.conv_rank = rank;
    p.out_rank = rank;
    p.k = gi * group;
    p.n = m;
    return p;
  }
  if (t == "Conv" || t == "ConvTranspose" || t == "QLinearConv" || t == "ConvInteger" || t == "FusedConv")
    return decline("only float32 Conv is computed (not " + t + ")");
  if (t == "DynamicQuantizeMatMul" && d == kMsDomain && in.size() >= 3) {
    // Y = dequantize(quantize(A)) x (B * b_scale) + bias, A quantized at run time. XNNPACK's qd8-qc8w
    // fully-connected: A quantized per row (ORT: per tensor), B int8 with a scale per column.
    if (!nbits_ok) return decline("8-bit weights need XNNPACK (kernels=xnnpack)");
    const TensorInfo a = tensor_info(in[0]), b = tensor_info(in[1]), sc = tensor_info(in[2]);
    if (!is_f32(a)) return decline("A is not float32");
    if (a.rank_known && a.dims.empty()) return decline("A is a scalar");
    if (!is_constant(in[1]) || !b.known || b.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 || b.dims.size() != 2 ||
        b.dims[0] <= 0 || b.dims[1] <= 0)
      return decline("B is not a constant 2-D int8 initializer " + dims_text(b));
    p.k = b.dims[0];
    p.n = b.dims[1];
    // Its shape is B's business, not the output's (ORT takes [N] and [1, N] against a 2-D B).
    if (!is_constant(in[2]) || !is_f32(sc) || !is_scale_row(in[2], p.n, 2))
      return decline("b_scale is not a constant float32 of one value or one per column " + dims_text(sc));
    if (!finite_constant(in[2], true)) return decline("b_scale holds a NaN, an infinity or a subnormal value");
    if (in.size() > 3 && in[3] != nullptr) {
      if (std::string z = nonzero_weight_zero_points(in[3], p.n); !z.empty()) return decline(z);
    }
    if (in.size() > 4 && in[4] != nullptr && !is_row_bias(in[4], p.n)) return decline("the bias is not a row of N values");
    if (in.size() > 4 && in[4] != nullptr && !finite_constant(in[4], false)) return decline("the bias holds a NaN or an infinity");
    if (a.rank_known && a.dims.back() >= 0 && a.dims.back() != p.k)
      return decline("A's last dimension " + std::to_string(a.dims.back()) + " is not B's K " + std::to_string(p.k));
    p.core = Core::qc8;
    p.out_rank = a.rank_known ? a.dims.size() : 0;
    p.weight_vi = in[1];
    p.scale_vi = in[2];
    if (in.size() > 4 && in[4] != nullptr) p.bias_vi = in[4];
    return p;
  }
  if (t == "MatMulInteger" || t == "DynamicQuantizeMatMul" || t == "QLinearMatMul" || t == "MatMulIntegerToFloat" ||
      t == "QGemm")
    return decline("of the 8-bit matrix products only MatMulInteger (scaled to float), com.microsoft.DynamicQuantizeMatMul "
                   "and com.microsoft.MatMulIntegerToFloat are computed (not " + t + ")");
  return decline("the operator " + (d.empty() ? std::string() : d + ".") + t + " is not computed by this provider");
}

// Extends a core plan with the bias Add and the activation that only it feeds.
void fuse_epilogue(Plan& p) {
  const OrtValueInfo* cur = node_outputs(p.last_node())[0];
  bool has_bias = false;
  if (p.core == Core::gemm) {
    const auto in = node_inputs(p.core_node);
    has_bias = in.size() == 3 && in[2] != nullptr;
  } else if (p.core == Core::nbits) {
    const auto in = node_inputs(p.core_node);
    has_bias = in.size() > 5 && in[5] != nullptr;
  } else if (p.core == Core::qc8) {
    has_bias = p.bias_vi != nullptr;
  } else if (p.core == Core::conv) {
    const auto in = node_inputs(p.core_node);
    has_bias = in.size() > 2 && in[2] != nullptr;
    // A convolution without its own bias takes a following Add of one value per output channel
    // ([M, 1, 1] or [1, M, 1, 1]; [M, 1] for 1-D), as exporters write a folded bias.
    if (const OrtNode* next = sole_consumer(cur); next != nullptr && !has_bias && op_type(next) == "Add" &&
                                                  domain(next).empty()) {
      const auto add_in = node_inputs(next);
      const auto add_out = node_outputs(next);
      const OrtValueInfo* other = add_in.size() != 2 ? nullptr : add_in[0] == cur ? add_in[1] : add_in[1] == cur ? add_in[0] : nullptr;
      if (other != nullptr && add_out.size() == 1 && is_constant(other) && is_f32(tensor_info(add_out[0]))) {
        const TensorInfo bt = tensor_info(other);
        std::vector<std::int64_t> d = bt.dims;
        while (!d.empty() && d.front() == 1 && d.size() > p.conv_rank - 1) d.erase(d.begin());
        bool channel = is_f32(bt) && bt.rank_known && bt.dims.size() <= p.conv_rank && d.size() == p.conv_rank - 1 &&
                       d[0] == p.n;
        for (std::size_t i = 1; channel && i < d.size(); ++i) channel = d[i] == 1;
        if (channel) {
          p.add_node = next;
          cur = add_out[0];
        }
      }
    }
    has_bias = true;  // nothing else of a bias below
  }
  if (const OrtNode* next = sole_consumer(cur); next != nullptr && !has_bias) {
    if (op_type(next) == "Add" && domain(next).empty()) {
      const auto in = node_inputs(next);
      const auto out = node_outputs(next);
      if (in.size() == 2 && out.size() == 1 && is_f32(tensor_info(out[0]))) {
        const OrtValueInfo* other = in[0] == cur ? in[1] : in[1] == cur ? in[0] : nullptr;
        // The sum keeps the layer's shape only when the bias is a row vector of N values.
        // ... and adds no dimension: Add's output has the larger rank of its two inputs.
        const TensorInfo bt = tensor_info(other);
        // With A's rank unknown (out_rank 0), only a bias of rank 1 or less, which adds no
        // dimension to any output of rank 1 or more.
        const std::size_t rank_room = p.out_rank != 0 ? p.out_rank : 1;
        // XNNPACK's quantized kernels clamp a NaN to -inf: such a bias stays an Add of its own.
        const bool quantized = p.core == Core::qc8 || p.core == Core::nbits;
        if (other != nullptr && is_row_bias(other, p.n) && numel(bt.dims) == p.n && bt.dims.size() <= rank_room &&
            (!quantized || finite_constant(other, false))) {
          p.add_node = next;
          cur = out[0];
        }
      }
    }
  }
  if (const OrtNode* next = sole_consumer(cur); next != nullptr) {
    if (auto act = activation_of(next); act) {
      const auto out = node_outputs(next);
      if (out.size() == 1 && is_f32(tensor_info(out[0]))) {
        p.act_node = next;
        p.activation = *act;
      }
    }
  }
}

// ---- reading weights -------------------------------------------------------------------------

struct Weight {
  WeightSource source;
  std::string identity;
};

Weight read_weight(const OrtValueInfo* vi, const std::filesystem::path& model_dir) {
  Weight w;
  const OrtValue* value = nullptr;
  check(api().ort->ValueInfo_GetInitializerValue(vi, &value), "reading an initializer");
  if (value == nullptr) throw OrtError{ORT_FAIL, "initializer '" + value_name(vi) + "' has no value"};
  check(api().ort->GetTensorData(value, &w.source.data), "initializer data");
  check(api().ort->GetTensorSizeInBytes(value, &w.source.bytes), "initializer size");
  OrtTensorTypeAndShapeInfo* tsi = nullptr;
  check(api().ort->GetTensorTypeAndShape(value, &tsi), "initializer shape");
  ONNXTensorElementDataType type{};
  std::size_t rank = 0;
  OrtStatus* s = api().ort->GetTensorElementType(tsi, &type);
  if (s == nullptr) s = api().ort->GetDimensionsCount(tsi, &rank);
  if (s == nullptr) {
    w.source.dims.resize(rank);
    s = api().ort->GetDimensions(tsi, w.source.dims.data(), rank);
  }
  api().ort->ReleaseTensorTypeAndShapeInfo(tsi);
  check(s, "initializer shape");
  w.source.element_type = static_cast<int>(type);
  OrtExternalInitializerInfo* ext = nullptr;
  if (OrtStatus* e = api().ort->ValueInfo_GetExternalInitializerInfo(vi, &ext); e != nullptr) {
    take_message(e);
    ext = nullptr;
  }
  if (ext != nullptr) {
    const ORTCHAR_T* rel = api().ort->ExternalInitializerInfo_GetFilePath(ext);
    const std::filesystem::path p = rel != nullptr ? std::filesystem::path(rel) : std::filesystem::path();
    if (!p.empty()) w.source.external_path = (p.is_absolute() ? p : model_dir / p).string();
    w.source.external_offset = api().ort->ExternalInitializerInfo_GetFileOffset(ext);
    if (api().ort->ExternalInitializerInfo_GetByteSize(ext) != w.source.bytes) w.source.external_path.clear();
    api().ort->ReleaseExternalInitializerInfo(ext);
  }
  return w;
}

// The content key of a weight (source_identity.hpp). External data whose file identity the cache has
// seen maps to its content key through a small entry, so a warm session reads none of its bytes;
// otherwise the bytes are hashed, and the mapping recorded when the file identity can be trusted.
// Returns whether it inserted such a mapping (the session then finalizes it).
bool identify(Weight& w, wc_cache* cache, std::int64_t floor_ms) {
  const std::int64_t floor_ns = floor_ms * 1'000'000;
  const std::string fid = file_identity(w.source, floor_ns);
  std::string key;
  if (!fid.empty() && cache != nullptr) {
    key = "ort-file-identity/1|" + fid;
    const std::size_t off = wc_look_up(cache, key.data(), key.size());
    if (off != SIZE_MAX) {
      const char* p = static_cast<const char*>(wc_offset_to_addr(cache, off));
      // The value is the content key, NUL-terminated (its size is not stored apart).
      if (p != nullptr && std::strncmp(p, "xxh3|", 5) == 0) {
        const std::size_t n = strnlen(p, 4096);
        if (n < 4096) {
          w.identity.assign(p, n);
          return false;
        }
      }
    }
  }
  // Record a mapping only for bytes hashed while nobody has the file open for writing (may_record),
  // and only if the file identity did not move meanwhile: a later write or store through a
  // mapping needs a new opening, and moves it.
  const Recording rec = key.empty() ? Recording() : may_record(w.source, fid, floor_ns);
  w.identity = content_identity(w.source);
  counters().source_bytes_hashed.fetch_add(w.source.bytes, std::memory_order_relaxed);
  if (!rec.ok()) return false;
  // ONNX Runtime may have read these bytes before the file's last change (a copy in its own
  // memory): the mapping names the file's bytes as they are now, read through the same descriptor.
  const std::string now = file_content_identity(rec, w.source);
  counters().source_bytes_hashed.fetch_add(w.source.bytes, std::memory_order_relaxed);
  if (now != w.identity || !still(rec, w.source, fid, floor_ns)) return false;
  return wc_look_up_or_insert(cache, key.data(), key.size(), const_cast<char*>(w.identity.c_str()),
                              w.identity.size() + 1) != SIZE_MAX;  // copied into the cache
}

std::filesystem::path model_dir_of(const OrtGraph* graph, std::string* model_path) {
  const ORTCHAR_T* p = nullptr;
  if (OrtStatus* s = api().ort->Graph_GetModelPath(graph, &p); s != nullptr) {
    take_message(s);
    p = nullptr;
  }
  const std::string path = p != nullptr ? std::string(p) : std::string();
  if (model_path != nullptr) *model_path = path;
  if (path.empty()) return std::filesystem::current_path();
  std::error_code ec;
  return std::filesystem::absolute(std::filesystem::path(path), ec).parent_path();
}

// A bias of n values from its initializer (one value broadcast, or n).
std::vector<float> bias_values(const Weight& w, std::int64_t n) {
  const auto* f = static_cast<const float*>(w.source.data);
  const std::size_t count = w.source.bytes / sizeof(float);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = count == 1 ? f[0] : f[i];
  return v;
}

// ---- entry points ------------------------------------------------------------------------------

Ep* as_ep(OrtEp* e) { return static_cast<Ep*>(e); }
Factory* as_factory(OrtEpFactory* f) { return static_cast<Factory*>(f); }

const char* ORT_API_CALL ep_get_name(const OrtEp*) noexcept { return kEpName; }

OrtStatus* ORT_API_CALL ep_get_capability(OrtEp* e, const OrtGraph* graph, OrtEpGraphSupportInfo* info) noexcept {
  return boundary("GetCapability", [&] { return as_ep(e)->get_capability(graph, info); });
}

OrtStatus* ORT_API_CALL ep_compile(OrtEp* e, const OrtGraph** graphs, const OrtNode** fused, size_t count,
                                   OrtNodeComputeInfo** infos, OrtNode** ep_context_nodes) noexcept {
  if (ep_context_nodes != nullptr)
    for (size_t i = 0; i < count; ++i) ep_context_nodes[i] = nullptr;
  return boundary("Compile", [&] { return as_ep(e)->compile(graphs, fused, count, infos); });
}

void ORT_API_CALL ep_release_compute_infos(OrtEp*, OrtNodeComputeInfo** infos, size_t count) noexcept {
  for (size_t i = 0; i < count; ++i) delete static_cast<ComputeInfo*>(infos[i]);
}

OrtStatus* ORT_API_CALL ep_concurrent_run(OrtEp*, bool* supported) noexcept {
  *supported = true;  // each layer serializes its own runs
  return nullptr;
}

OrtStatus* ORT_API_CALL ci_create_state(OrtNodeComputeInfo* self, OrtNodeComputeContext*, void** state) noexcept {
  *state = static_cast<ComputeInfo*>(self)->layer.get();
  return nullptr;
}

void ORT_API_CALL ci_release_state(OrtNodeComputeInfo*, void*) noexcept {}

// Reads input `index`, which must hold exactly one element of `type`, into `out`.
void read_one_value(OrtKernelContext* ctx, std::size_t index, ONNXTensorElementDataType type, void* out, const char* what) {
  const OrtValue* v = nullptr;
  check(api().ort->KernelContext_GetInput(ctx, index, &v), what);
  OrtTensorTypeAndShapeInfo* tsi = nullptr;
  check(api().ort->GetTensorTypeAndShape(v, &tsi), what);
  ONNXTensorElementDataType t = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::size_t count = 0;
  OrtStatus* s = api().ort->GetTensorElementType(tsi, &t);
  if (s == nullptr) s = api().ort->GetTensorShapeElementCount(tsi, &count);
  api().ort->ReleaseTensorTypeAndShapeInfo(tsi);
  check(s, what);
  if (t != type || count != 1)
    throw OrtError{ORT_INVALID_ARGUMENT, std::string(what) + " holds " + std::to_string(count) +
                                             " values of element type " + std::to_string(static_cast<int>(t)) +
                                             "; the layer takes one of type " + std::to_string(static_cast<int>(type))};
  const void* data = nullptr;
  check(api().ort->GetTensorData(v, &data), what);
  std::memcpy(out, data, type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? sizeof(float) : 1);
}

OrtStatus* ORT_API_CALL ci_compute(OrtNodeComputeInfo*, void* state, OrtKernelContext* ctx) noexcept {
  return boundary("Compute", [&]() -> OrtStatus* {
    auto* layer = static_cast<Layer*>(state);
    const OrtValue* input = nullptr;
    check(api().ort->KernelContext_GetInput(ctx, layer->input_index, &input), "input");
    OrtTensorTypeAndShapeInfo* tsi = nullptr;
    check(api().ort->GetTensorTypeAndShape(input, &tsi), "input shape");
    std::size_t rank = 0;
    OrtStatus* s = api().ort->GetDimensionsCount(tsi, &rank);
    std::vector<std::int64_t> dims(rank);
    if (s == nullptr) s = api().ort->GetDimensions(tsi, dims.data(), rank);
    api().ort->ReleaseTensorTypeAndShapeInfo(tsi);
    check(s, "input shape");
    if (layer->conv) {
      const ConvSpec& c = layer->geometry;
      std::size_t oh = 0, ow = 0;
      const bool fits = rank == layer->conv_rank && dims[1] == static_cast<std::int64_t>(layer->k) && dims[0] >= 0 &&
                        conv_output_size(c, rank == 4 ? static_cast<std::size_t>(dims[2]) : 1,
                                         static_cast<std::size_t>(dims[rank - 1]), &oh, &ow);
      if (!fits) {
        std::string shape;
        for (std::size_t i = 0; i < rank; ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
        throw OrtError{ORT_INVALID_ARGUMENT, "input of shape [" + shape + "] does not fit a convolution of " +
                                                  std::to_string(layer->k) + " channels"};
      }
      const std::size_t batch = static_cast<std::size_t>(dims[0]);
      std::vector<std::int64_t> out_dims{dims[0], static_cast<std::int64_t>(layer->n)};
      if (rank == 4) out_dims.push_back(static_cast<std::int64_t>(oh));
      out_dims.push_back(static_cast<std::int64_t>(ow));
      OrtValue* output = nullptr;
      check(api().ort->KernelContext_GetOutput(ctx, 0, out_dims.data(), out_dims.size(), &output), "output");
      const void* x = nullptr;
      void* y = nullptr;
      check(api().ort->GetTensorData(input, &x), "input data");
      check(api().ort->GetTensorMutableData(output, &y), "output data");
      if (batch != 0)
        layer->conv->run(static_cast<const float*>(x), batch, rank == 4 ? static_cast<std::size_t>(dims[2]) : 1,
                         static_cast<std::size_t>(dims[rank - 1]), static_cast<float*>(y));
      return nullptr;
    }
    // The graph may not have said A's rank or K (exporters' Reshapes): what arrives is checked
    // here, and a misfit fails the run with an error instead of reading past A.
    // A Gemm's A is 2-D by ONNX; a 1-D one (an unknown rank that turns out so) is one row, as the
    // CPU provider runs it.
    if (rank < 1 || (layer->gemm && rank > 2) || dims.back() != static_cast<std::int64_t>(layer->k)) {
      std::string shape;
      for (std::size_t i = 0; i < rank; ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
      throw OrtError{ORT_INVALID_ARGUMENT, "input of shape [" + shape + "] does not fit a layer of " +
                                                std::to_string(layer->k) + " inputs" +
                                                (layer->gemm ? " (Gemm: 1-D or 2-D, K last)" : " (K last)")};
    }
    std::size_t m = 1;
    for (std::size_t i = 0; i + 1 < rank; ++i) m *= static_cast<std::size_t>(dims[i]);
    dims.back() = static_cast<std::int64_t>(layer->n);  // a 1-D A ([K]) gives [N] for MatMul
    if (layer->gemm && rank == 1) dims.insert(dims.begin(), 1);  // and [1, N] for Gemm, as ORT's CPU kernel
    OrtValue* output = nullptr;
    check(api().ort->KernelContext_GetOutput(ctx, 0, dims.data(), dims.size(), &output), "output");
    const void* a = nullptr;
    void* y = nullptr;
    check(api().ort->GetTensorData(input, &a), "input data");
    check(api().ort->GetTensorMutableData(output, &y), "output data");
    if (m == 0) return nullptr;
    if (const QuantizedInput& q = layer->quantized; q.on) {
      float scale = q.scale;
      std::int32_t zero = q.zero;
      if (q.scale_index) read_one_value(ctx, *q.scale_index, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &scale, "a_scale");
      if (q.zero_index) {
        std::uint8_t z = 0;
        read_one_value(ctx, *q.zero_index, q.a_unsigned ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8,
                       &z, "a_zero_point");
        zero = q.zero_of(z);
      }
      layer->linear->run_quantized(static_cast<const std::uint8_t*>(a), q.a_unsigned, m, layer->k, zero, scale,
                                   static_cast<float*>(y));
      return nullptr;
    }
    layer->linear->run(static_cast<const float*>(a), m, static_cast<float*>(y));
    return nullptr;
  });
}

Ep::Ep(Factory& factory, Options options, const OrtLogger* logger)
    : OrtEp{}, factory_(factory), options_(std::move(options)), logger_(logger) {
  ort_version_supported = ORT_API_VERSION;
  GetName = ep_get_name;
  GetCapability = ep_get_capability;
  Compile = ep_compile;
  ReleaseNodeComputeInfos = ep_release_compute_infos;
  IsConcurrentRunSupported = ep_concurrent_run;
#ifdef WEIGHTCACHE_ORT_EP_XNNPACK
  if (options_.use_xnnpack && options_.threads > 1) pool_ = pthreadpool_create(options_.threads);
#endif
}

Ep::~Ep() {
  // ORT released every compute info (and with them the XNNPACK operators) before the provider.
  wc_xnn_adapter_destroy(adapter_);
#ifdef WEIGHTCACHE_ORT_EP_XNNPACK
  if (pool_ != nullptr) pthreadpool_destroy(static_cast<pthreadpool_t>(pool_));
#endif
}

// Where a graph sits in its model, for telling one node from another of the same output name in
// a sibling subgraph (value names are unique within a graph, not across an If's two branches):
// the output of the node that holds it, and its own name. "" for the main graph.
std::string graph_scope(const OrtGraph* graph) {
  const OrtNode* parent = nullptr;
  if (OrtStatus* st = api().ort->Graph_GetParentNode(graph, &parent); st != nullptr) {
    take_message(st);
    return {};
  }
  if (parent == nullptr) return {};
  const char* name = nullptr;
  if (OrtStatus* st = api().ort->Graph_GetName(graph, &name); st != nullptr) {
    take_message(st);
    name = nullptr;
  }
  const auto outs = node_outputs(parent);
  return (outs.empty() || outs[0] == nullptr ? std::string() : value_name(outs[0])) + "/" +
         (name != nullptr ? name : "") + "/";
}

OrtStatus* Ep::get_capability(const OrtGraph* graph, OrtEpGraphSupportInfo* info) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<const OrtNode*> nodes = graph_nodes(graph);
  std::vector<const OrtNode*> taken;
  const bool nbits_ok = options_.use_xnnpack;
  const std::string conv_refused = conv_refusal(options_);
  const std::string scope = graph_scope(graph);
  for (const OrtNode* node : nodes) {
    if (std::find(taken.begin(), taken.end(), node) != taken.end()) continue;
    const bool weighty = bears_weight(node);
    std::string id;
    if (weighty) {
      const auto outs = node_outputs(node);
      id = scope + (outs.empty() || outs[0] == nullptr ? std::string() : value_name(outs[0]));
      if (weight_nodes_seen_.insert(id).second) counters().weight_nodes_seen.fetch_add(1, std::memory_order_relaxed);
    }
    std::string why;
    auto plan = core_plan(node, nbits_ok, &why, conv_refused);
    const auto declined = [&](const std::string& reason) {
      // Once per node and session; a node taken by an earlier call is not declined now.
      if (!weighty || weight_nodes_taken_.count(id) != 0 || !declined_.insert(id).second) return;
      const char* name = nullptr;
      if (OrtStatus* st = api().ort->Node_GetName(node, &name); st != nullptr) {
        take_message(st);
        name = nullptr;
      }
      const std::string d = domain(node);
      log(logger_, ORT_LOGGING_LEVEL_VERBOSE,
          "left to other providers: " + (d.empty() ? std::string() : d + ".") + op_type(node) + " node '" +
              (name != nullptr ? name : "") + "' (output '" + id + "'): " + reason);
    };
    if (!plan) {
      declined(why);
      continue;
    }
    fuse_epilogue(*plan);
    auto group = plan->nodes();
    bool clash = false;
    for (const OrtNode* g : group) clash = clash || std::find(taken.begin(), taken.end(), g) != taken.end();
    if (clash) {
      declined("its bias or activation is already part of another layer");
      continue;
    }
    OrtNodeFusionOptions fusion{};
    fusion.ort_version_supported = ORT_API_VERSION;
    fusion.drop_constant_initializers = true;  // the provider keeps the packed copy; ORT frees its own
    check(api().ep->EpGraphSupportInfo_AddNodesToFuse(info, group.data(), group.size(), &fusion), "claiming nodes");
    taken.insert(taken.end(), group.begin(), group.end());
    if (weighty && weight_nodes_taken_.insert(id).second)
      counters().weight_nodes_taken.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

void Ep::ensure_cache(const OrtGraph* graph) {
  if (cache_) return;
  std::string model_path;
  (void)model_dir_of(graph, &model_path);
  std::string path;
  if (options_.cache_path) {
    path = *options_.cache_path;
  } else if (options_.backing != WC_BACKING_HEAP) {
    path = default_cache_path(model_path, "ort");
    if (path.empty())
      log(logger_, ORT_LOGGING_LEVEL_WARNING,
          "no per-user cache directory (neither XDG_CACHE_HOME nor HOME is set); packing into heap memory. Pass "
          "cache_path");
  }
  cache_ = factory_.acquire(options_, path, logger_);
  if (options_.use_xnnpack && options_.weights_cache) {
    if (wc_xnn_adapter_create(cache_->cache, &adapter_) != WC_OK)
      throw OrtError{ORT_FAIL, std::string("cannot create the XNNPACK adapter: ") + wc_last_error()};
  }
}

OrtStatus* Ep::compile(const OrtGraph** graphs, const OrtNode** fused, std::size_t count, OrtNodeComputeInfo** out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < count; ++i) out[i] = nullptr;
  if (count == 0) return nullptr;
  ensure_cache(graphs[0]);
  // Each fused graph holds exactly the nodes GetCapability grouped: find its layer again.
  struct Partition {
    std::vector<const OrtNode*> nodes;
    Plan plan;
  };
  std::vector<Partition> parts(count);
  for (std::size_t g = 0; g < count; ++g) {
    Partition& part = parts[g];
    part.nodes = graph_nodes(graphs[g]);
    std::optional<Plan> plan;
    for (const OrtNode* node : part.nodes)
      if ((plan = core_plan(node, options_.use_xnnpack, nullptr, conv_refusal(options_)))) break;
    if (!plan) throw OrtError{ORT_FAIL, "a fused partition holds no layer this provider computes"};
    for (const OrtNode* node : part.nodes) {
      if (node == plan->core_node || std::find(plan->chain.begin(), plan->chain.end(), node) != plan->chain.end()) continue;
      if (op_type(node) == "Add") plan->add_node = node;
      else if (auto act = activation_of(node)) {
        plan->act_node = node;
        plan->activation = *act;
      }
    }
    part.plan = *plan;
  }
  // One set of placeholder block scales for every 4-bit layer of the session (kernels.hpp).
  std::vector<std::uint16_t> placeholder;
  if (options_.use_xnnpack && options_.weights_cache) {
    std::size_t most = 0;
    for (const Partition& part : parts)
      if (part.plan.core == Core::nbits)
        most = std::max(most, static_cast<std::size_t>(part.plan.n * (part.plan.k / part.plan.block_size)));
    placeholder.assign(most, 0x3F80);  // bf16 1.0
  }
  // Each layer: read its initializers through ORT (on this thread), then find their identities
  // and create the kernels on the session's threads, since a warm 4-bit layer spends most of its
  // creation in XNNPACK's checks of block scales it never reads.
  struct Job {
    const Plan* plan = nullptr;
    Weight w, scales, bias;
    bool has_bias = false;
    float beta = 1.0f;
    LinearSpec spec;
    std::size_t input_index = 0;
    bool recorded = false;
    CreateReport report;
    std::unique_ptr<Linear> linear;
    std::vector<float> column_scales;  // qc8: a scale per column
    QuantizedInput quantized;  // qc8 on a quantized A: where its scale and zero point come from
    ConvSpec conv_spec;  // a convolution's (plan->core == Core::conv)
    std::unique_ptr<Conv2d> conv;
  };
  std::vector<Job> jobs(count);
  std::uint64_t nodes_claimed = 0;
  for (std::size_t g = 0; g < count; ++g) {
    Job& job = jobs[g];
    const std::filesystem::path dir = model_dir_of(graphs[g], nullptr);
    const Plan* plan = job.plan = &parts[g].plan;
    nodes_claimed += parts[g].nodes.size();
    const auto in = node_inputs(plan->core_node);
    LinearSpec& spec = job.spec;
    spec.k = static_cast<std::size_t>(plan->k);
    spec.n = static_cast<std::size_t>(plan->n);
    spec.activation = plan->activation;
    job.w = read_weight(in[1], dir);
    spec.weights = job.w.source.data;
    const OrtValueInfo* bias_vi = nullptr;
    if (plan->core == Core::conv) {
      job.conv_spec = plan->conv;
      job.conv_spec.weights = static_cast<const float*>(job.w.source.data);
      job.conv_spec.activation = plan->activation;
      if (in.size() == 3 && in[2] != nullptr) bias_vi = in[2];
    } else if (plan->core == Core::qc8) {
      spec.kind = LinearSpec::Kind::qc8;
      spec.weights_kn = true;
      job.scales = read_weight(plan->scale_vi, dir);
      const auto* sc = static_cast<const float*>(job.scales.source.data);
      const std::size_t count = job.scales.source.bytes / sizeof(float);
      if (count != 1 && count != spec.n) throw OrtError{ORT_FAIL, "the int8 weights' scales are neither 1 nor N values"};
      job.column_scales.resize(spec.n);
      for (std::size_t i = 0; i < spec.n; ++i) job.column_scales[i] = count == 1 ? sc[0] : sc[i];
      spec.scales = job.column_scales.data();
      bias_vi = plan->bias_vi;
    } else if (plan->core == Core::matmul) {
      spec.weights_kn = true;
    } else if (plan->core == Core::gemm) {
      spec.weights_kn = int_attr(plan->core_node, "transB").value_or(0) == 0;
      spec.alpha = float_attr(plan->core_node, "alpha").value_or(1.0f);
      job.beta = float_attr(plan->core_node, "beta").value_or(1.0f);
      if (in.size() == 3 && in[2] != nullptr && job.beta != 0.0f) bias_vi = in[2];
    } else {
      spec.kind = LinearSpec::Kind::nbits4;
      spec.block_size = static_cast<std::size_t>(plan->block_size);
      job.scales = read_weight(in[2], dir);
      spec.scales = static_cast<const float*>(job.scales.source.data);
      if (in.size() > 5 && in[5] != nullptr) bias_vi = in[5];
    }
    if (plan->add_node != nullptr) {
      const auto add_in = node_inputs(plan->add_node);
      const std::string mm_name = value_name(node_outputs(plan->last_node())[0]);
      bias_vi = value_name(add_in[0]) == mm_name ? add_in[1] : add_in[0];
      job.beta = 1.0f;
    }
    if (bias_vi != nullptr) {
      job.bias = read_weight(bias_vi, dir);
      job.has_bias = true;
    }
    // The fused node's inputs are the layer's non-constant ones (constants were dropped).
    const auto fin = node_inputs(fused[g]);
    const auto input_index = [&](const OrtValueInfo* vi) {
      const std::string name = value_name(vi);
      for (std::size_t j = 0; j < fin.size(); ++j)
        if (fin[j] != nullptr && value_name(fin[j]) == name) return j;
      throw OrtError{ORT_FAIL, "the fused node does not take the layer's input '" + name + "'"};
    };
    job.input_index = input_index(in[0]);  // the activation
    if (plan->quantized_a) {
      // A's scale and zero point: inputs of the fused node (DynamicQuantizeLinear's outputs), or
      // constants read now.
      const auto input_or_value = [&](const OrtValueInfo* vi, std::optional<std::size_t>* index, void* value,
                                      std::size_t size) {
        if (!is_constant(vi)) {
          *index = input_index(vi);
          return;
        }
        const auto [data, bytes] = constant_bytes(vi);
        if (data == nullptr || bytes != size) throw OrtError{ORT_FAIL, "the constant '" + value_name(vi) + "' is unreadable"};
        std::memcpy(value, data, size);
      };
      QuantizedInput& q = job.quantized;
      q.on = true;
      q.a_unsigned = tensor_info(in[0]).type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
      if (plan->a_scale != nullptr) input_or_value(plan->a_scale, &q.scale_index, &q.scale, sizeof(float));
      if (plan->a_zero != nullptr) {
        std::uint8_t z = 0;
        input_or_value(plan->a_zero, &q.zero_index, &z, 1);
        q.zero = q.zero_of(z);
      }
    }
  }
  // Identities (a cold session hashes the weights here) and names.
  parallel_for(pool_, count, [&](std::size_t g) {
    Job& job = jobs[g];
    LinearSpec& spec = job.spec;
    job.recorded = identify(job.w, cache_->cache, options_.identity_window_ms);
    if (job.plan->core == Core::conv) {
      // The packed bytes depend on the geometry as well as on the weights: all of it is in the name.
      const ConvSpec& c = job.conv_spec;
      char geometry[192];
      std::snprintf(geometry, sizeof geometry, "w|f32conv|g%zu|%zux%zu|k%zux%zu|s%zux%zu|d%zux%zu|p%zu,%zu,%zu,%zu|",
                    c.groups, c.group_in, c.group_out, c.kh, c.kw, c.sh, c.sw, c.dh, c.dw, c.pad_top, c.pad_left,
                    c.pad_bottom, c.pad_right);
      job.conv_spec.weights_name = geometry + job.w.identity;
      if (job.has_bias) {
        job.recorded = identify(job.bias, cache_->cache, options_.identity_window_ms) || job.recorded;
        const auto* b = static_cast<const float*>(job.bias.source.data);
        job.conv_spec.bias.assign(b, b + job.bias.source.bytes / sizeof(float));
        job.conv_spec.bias_name = "b|" + job.bias.identity;
      }
      return;
    }
    spec.weights_name = std::string(spec.kind == LinearSpec::Kind::nbits4 ? "w|nbits4|"
                                    : spec.kind == LinearSpec::Kind::qc8  ? "w|qc8|"
                                                                          : "w|f32|") +
                        job.w.identity;
    if (spec.kind == LinearSpec::Kind::qc8) {
      job.recorded = identify(job.scales, cache_->cache, options_.identity_window_ms) || job.recorded;
      // The scales are packed with the weights: both identities name the packed bytes.
      spec.weights_name += "|scales|" + job.scales.identity;
    }
    if (spec.kind == LinearSpec::Kind::nbits4) {
      job.recorded = identify(job.scales, cache_->cache, options_.identity_window_ms) || job.recorded;
      // The scales are packed with the weights: both identities name the packed bytes.
      spec.weights_name += "|scales|" + job.scales.identity + "|block" + std::to_string(spec.block_size);
    }
    if (job.has_bias) {
      job.recorded = identify(job.bias, cache_->cache, options_.identity_window_ms) || job.recorded;
      spec.bias = bias_values(job.bias, job.plan->n);
      // The bias is packed as beta * C / alpha (the GEMM output is scaled by alpha afterwards).
      const float scale = job.beta / spec.alpha;
      if (scale != 1.0f)
        for (float& b : spec.bias) b *= scale;
      char buf[64];
      std::snprintf(buf, sizeof buf, "|scale%a", static_cast<double>(scale));
      spec.bias_name = "b|" + job.bias.identity + buf;
    }
  });
  PackTarget target;
  target.cache = cache_->cache;
  target.adapter = adapter_;
  target.use_cache = options_.weights_cache;
  target.threadpool = pool_;
  target.placeholder_scales = placeholder.empty() ? nullptr : placeholder.data();
  target.placeholder_count = placeholder.size();
  // Layers are created on several threads only when every buffer can stay named throughout:
  // one address (an initializer two layers share) must then carry one name.
  std::vector<std::pair<const void*, const std::string*>> names;
  for (const Job& job : jobs) {
    if (job.plan->core == Core::conv) continue;  // a convolution names its own buffers, on this thread
    names.emplace_back(job.spec.weights, &job.spec.weights_name);
    if (!job.spec.bias.empty()) names.emplace_back(job.spec.bias.data(), &job.spec.bias_name);
  }
  std::sort(names.begin(), names.end());
  bool one_name_each = true;
  for (std::size_t i = 1; i < names.size(); ++i)
    if (names[i].first == names[i - 1].first && *names[i].second != *names[i - 1].second) one_name_each = false;
  const bool together = pool_ != nullptr && adapter_ != nullptr && options_.use_xnnpack && options_.weights_cache &&
                        one_name_each && count > 1;
  bool bound = together;
  if (together)
    for (const auto& [address, name] : names)
      if (wc_xnn_adapter_name_buffer(adapter_, address, name->c_str()) != WC_OK) bound = false;
  target.names_bound = bound;
  wc_xnn_adapter_stats before;
  wc_xnn_adapter_stats_init(&before);
  if (adapter_ != nullptr) (void)wc_xnn_adapter_get_stats(adapter_, &before);
  const auto create = [&](std::size_t g) {
    Job& job = jobs[g];
    job.linear = options_.use_xnnpack ? create_xnnpack(job.spec, target, &job.report)
                                      : create_builtin(job.spec, target, &job.report);
  };
  const auto is_conv = [&](std::size_t g) { return jobs[g].plan->core == Core::conv; };
  try {
    if (bound) {
      // Layers over the same weights (one initializer, or equal bytes) are created one after the
      // other on one thread: the first packs, the others find its entry. Created at once, each
      // would miss and pack its own copy.
      std::map<std::string, std::vector<std::size_t>> by_weight;
      for (std::size_t g = 0; g < count; ++g)
        if (!is_conv(g)) by_weight[jobs[g].spec.weights_name].push_back(g);
      std::vector<const std::vector<std::size_t>*> groups;
      for (const auto& [name, members] : by_weight) groups.push_back(&members);
      parallel_for(pool_, groups.size(), [&](std::size_t i) {
        for (std::size_t g : *groups[i]) create(g);
      });
    } else {
      for (std::size_t g = 0; g < count; ++g)
        if (!is_conv(g)) create(g);
    }
    // Convolutions one after the other on this thread: each names its own buffers while it is
    // created (a kernel it transposes lives only that long).
    PackTarget conv_target = target;
    conv_target.names_bound = false;
    for (std::size_t g = 0; g < count; ++g)
      if (is_conv(g)) jobs[g].conv = create_xnnpack_conv(jobs[g].conv_spec, conv_target, &jobs[g].report);
  } catch (...) {
    if (together)
      for (const auto& [address, name] : names) (void)wc_xnn_adapter_name_buffer(adapter_, address, nullptr);
    throw;
  }
  if (together)
    for (const auto& [address, name] : names) (void)wc_xnn_adapter_name_buffer(adapter_, address, nullptr);
  wc_xnn_adapter_stats after;
  wc_xnn_adapter_stats_init(&after);
  if (adapter_ != nullptr) (void)wc_xnn_adapter_get_stats(adapter_, &after);
  // Weights the adapter could not key (a buffer without a name) went to its private heap.
  std::uint64_t heap = std::min<std::uint64_t>(after.unnamed_inserts - before.unnamed_inserts, count);
  std::vector<std::unique_ptr<ComputeInfo>> made;
  std::uint64_t packed = 0, hits = 0, bytes = 0;
  bool recorded = false;  // file-identity mappings inserted
  std::string why;        // the first reason the cache could not take a layer's packed weights
  const bool all_heap = cache_->stand_in || cache_->path.empty() || !options_.weights_cache;
  for (Job& job : jobs) {
    recorded = recorded || job.recorded;
    const CreateReport& report = job.report;
    (report.packed ? packed : hits) += 1;
    if (report.in_heap || all_heap) heap = std::min<std::uint64_t>(heap + 1, count);
    if (report.packed) bytes += report.bytes;
    if (!report.why.empty() && why.empty()) why = report.why;
    auto layer = std::make_shared<Layer>();
    layer->linear = std::move(job.linear);
    layer->conv = std::move(job.conv);
    if (layer->conv) {
      layer->geometry = job.conv_spec;
      layer->geometry.weights = nullptr;
      layer->geometry.bias.clear();
      layer->conv_rank = job.plan->conv_rank;
    }
    layer->k = job.spec.k;
    layer->n = job.spec.n;
    layer->gemm = job.plan->core == Core::gemm;
    layer->input_index = job.input_index;
    layer->quantized = job.quantized;
    auto ci = std::make_unique<ComputeInfo>();
    ci->ort_version_supported = ORT_API_VERSION;
    ci->CreateState = ci_create_state;
    ci->Compute = ci_compute;
    ci->ReleaseState = ci_release_state;
    ci->layer = std::move(layer);
    made.push_back(std::move(ci));
  }
  bool warned = false;  // one warning per session says why
  if (!why.empty() && options_.weights_cache && !cache_->stand_in) {
    warned = true;
    counters().cache_failures.fetch_add(1, std::memory_order_relaxed);
    log(logger_, ORT_LOGGING_LEVEL_WARNING,
        "the cache '" + cache_->path + "' could not take " + std::to_string(heap) + " of " + std::to_string(count) +
            " layers' packed weights (" + why + "); they are packed into this process's memory (outputs are "
            "unaffected). Free disk space, or let the other process finish, and the next session persists them");
  }
  // Durable before the session runs, so the next session or process finds every weight; a
  // failure leaves the weights served from memory here and says why, once.
  if ((packed > 0 || recorded) && !cache_->stand_in && !cache_->path.empty()) {
    if (wc_finalize(cache_->cache) != WC_OK && !warned) {
      counters().cache_failures.fetch_add(1, std::memory_order_relaxed);
      log(logger_, ORT_LOGGING_LEVEL_WARNING,
          std::string("could not make the packed weights durable in '") + cache_->path + "': " + wc_last_error() +
              "; this session computes from memory and the next process packs again");
    }
  } else if (packed > 0 || recorded) {
    (void)wc_finalize(cache_->cache);  // a heap cache: only ends the packing phase XNNPACK checks
  }
  for (std::size_t i = 0; i < made.size(); ++i) out[i] = made[i].release();
  auto& c = counters();
  c.nodes.fetch_add(nodes_claimed, std::memory_order_relaxed);
  c.weights.fetch_add(packed + hits, std::memory_order_relaxed);
  c.packed.fetch_add(packed, std::memory_order_relaxed);
  c.from_cache.fetch_add(hits, std::memory_order_relaxed);
  c.heap_weights.fetch_add(heap, std::memory_order_relaxed);
  c.packed_bytes.fetch_add(bytes, std::memory_order_relaxed);
  log(logger_, ORT_LOGGING_LEVEL_INFO,
      std::to_string(count) + " layers ready (" + std::to_string(packed) + " packed, " + std::to_string(hits) +
          " from the cache" + (heap ? ", " + std::to_string(heap) + " in heap memory" : std::string()) + ") with " +
          (options_.use_xnnpack ? "XNNPACK" : "the built-in GEMM") + "; cache '" +
          (cache_->path.empty() ? std::string("(heap)") : cache_->path) + "'");
  return nullptr;
}

// ---- the factory -------------------------------------------------------------------------------

const char* ORT_API_CALL f_get_name(const OrtEpFactory*) noexcept { return kEpName; }
const char* ORT_API_CALL f_get_vendor(const OrtEpFactory*) noexcept { return kVendor; }
uint32_t ORT_API_CALL f_get_vendor_id(const OrtEpFactory*) noexcept { return 0; }
const char* ORT_API_CALL f_get_version(const OrtEpFactory*) noexcept { return WEIGHTCACHE_ORT_EP_VERSION; }

OrtStatus* ORT_API_CALL f_get_supported_devices(OrtEpFactory* f, const OrtHardwareDevice* const* devices,
                                                size_t num_devices, OrtEpDevice** ep_devices, size_t max_ep_devices,
                                                size_t* num_ep_devices) noexcept {
  return boundary("GetSupportedDevices", [&]() -> OrtStatus* {
    *num_ep_devices = 0;
    for (size_t i = 0; i < num_devices && *num_ep_devices < max_ep_devices; ++i) {
      if (api().ort->HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
      OrtEpDevice* d = nullptr;
      check(api().ep->CreateEpDevice(f, devices[i], nullptr, nullptr, &d), "creating the device");
      ep_devices[(*num_ep_devices)++] = d;
      break;  // one CPU device
    }
    return nullptr;
  });
}

OrtStatus* ORT_API_CALL f_create_ep(OrtEpFactory* f, const OrtHardwareDevice* const*, const OrtKeyValuePairs* const*,
                                    size_t, const OrtSessionOptions* so, const OrtLogger* logger, OrtEp** out) noexcept {
  *out = nullptr;
  return boundary("CreateEp", [&]() -> OrtStatus* {
    Options o = parse_options(so);
    if (!have_xnnpack())
      log(logger, ORT_LOGGING_LEVEL_INFO, "this build has no XNNPACK: layers run on the built-in packer and GEMM");
    auto ep = std::make_unique<Ep>(*as_factory(f), std::move(o), logger);
    counters().sessions.fetch_add(1, std::memory_order_relaxed);
    *out = ep.release();
    return nullptr;
  });
}

void ORT_API_CALL f_release_ep(OrtEpFactory*, OrtEp* ep) noexcept {
  try {
    delete as_ep(ep);
  } catch (...) {
  }
}

OrtStatus* ORT_API_CALL f_validate_compat(OrtEpFactory*, const OrtHardwareDevice* const*, size_t, const char*,
                                          OrtCompiledModelCompatibility* c) noexcept {
  *c = OrtCompiledModelCompatibility_EP_NOT_APPLICABLE;
  return nullptr;
}

OrtStatus* ORT_API_CALL f_create_allocator(OrtEpFactory*, const OrtMemoryInfo*, const OrtKeyValuePairs*,
                                           OrtAllocator** a) noexcept {
  *a = nullptr;  // ORT's default CPU allocator
  return nullptr;
}
void ORT_API_CALL f_release_allocator(OrtEpFactory*, OrtAllocator*) noexcept {}
OrtStatus* ORT_API_CALL f_create_data_transfer(OrtEpFactory*, OrtDataTransferImpl** d) noexcept {
  *d = nullptr;  // CPU memory only: nothing to transfer
  return nullptr;
}
bool ORT_API_CALL f_is_stream_aware(const OrtEpFactory*) noexcept { return false; }
OrtStatus* ORT_API_CALL f_create_stream(OrtEpFactory*, const OrtMemoryDevice*, const OrtKeyValuePairs*,
                                        OrtSyncStreamImpl** s) noexcept {
  *s = nullptr;
  return nullptr;
}
OrtStatus* ORT_API_CALL f_num_domains(OrtEpFactory*, size_t* n) noexcept {
  *n = 0;
  return nullptr;
}
OrtStatus* ORT_API_CALL f_domains(OrtEpFactory*, OrtCustomOpDomain**, size_t) noexcept { return nullptr; }

Factory::Factory(const OrtLogger* logger) : OrtEpFactory{}, default_logger_(logger) {
  ort_version_supported = ORT_API_VERSION;
  GetName = f_get_name;
  GetVendor = f_get_vendor;
  GetSupportedDevices = f_get_supported_devices;
  CreateEp = f_create_ep;
  ReleaseEp = f_release_ep;
  GetVendorId = f_get_vendor_id;
  GetVersion = f_get_version;
  ValidateCompiledModelCompatibilityInfo = f_validate_compat;
  CreateAllocator = f_create_allocator;
  ReleaseAllocator = f_release_allocator;
  CreateDataTransfer = f_create_data_transfer;
  IsStreamAware = f_is_stream_aware;
  CreateSyncStreamForDevice = f_create_stream;
  GetNumCustomOpDomains = f_num_domains;
  GetCustomOpDomains = f_domains;
}

}  // namespace
}  // namespace weightcache::ort

// ---- the library's exports ------------------------------------------------------------------

#define WC_ORT_EXPORT extern "C" __attribute__((visibility("default")))

namespace weightcache::ort {
namespace {
// weightcache's own log goes through ONNX Runtime's logger while the provider is loaded, so a
// host sees one log, filtered by one severity.
std::atomic<const OrtLogger*> g_library_logger{nullptr};
// The loggers of the factories alive (a library registered under two names, or by two Envs, has
// several): the routing uses the newest, and ends with the last.
std::mutex g_factories_mu;
std::vector<const OrtLogger*> g_factory_loggers;

void route_library_log(void*, wc_log_level level, const char* message, size_t size) {
  const OrtLogger* logger = g_library_logger.load(std::memory_order_acquire);
  if (logger == nullptr || api().ort == nullptr) return;
  const OrtLoggingLevel ort_level = level >= WC_LOG_ERROR ? ORT_LOGGING_LEVEL_ERROR
                                    : level == WC_LOG_WARN ? ORT_LOGGING_LEVEL_WARNING
                                    : level == WC_LOG_INFO ? ORT_LOGGING_LEVEL_INFO
                                                           : ORT_LOGGING_LEVEL_VERBOSE;
  try {
    const std::string m = "weightcache: " + std::string(message, size);
    OrtStatus* st = api().ort->Logger_LogMessage(logger, ort_level, m.c_str(), ORT_TSTR("weightcache"), 0, "weightcache");
    if (st != nullptr) api().ort->ReleaseStatus(st);
  } catch (...) {
  }
}
}  // namespace
}  // namespace weightcache::ort

WC_ORT_EXPORT OrtStatus* CreateEpFactories(const char* registration_name, const OrtApiBase* ort_api_base,
                                           const OrtLogger* default_logger, OrtEpFactory** factories,
                                           size_t max_factories, size_t* num_factories) {
  using namespace weightcache::ort;
  if (num_factories != nullptr) *num_factories = 0;
  const OrtApi* ort = ort_api_base != nullptr ? ort_api_base->GetApi(ORT_API_VERSION) : nullptr;
  if (ort == nullptr) return nullptr;  // an ONNX Runtime older than these headers: no factory (and no way to say so)
  api().ort = ort;
  api().ep = ort->GetEpApi();
  return boundary("CreateEpFactories", [&]() -> OrtStatus* {
    if (registration_name == nullptr || std::string(registration_name) != WC_ORT_EP_NAME)
      log(default_logger, ORT_LOGGING_LEVEL_WARNING,
          std::string("registered as '") + (registration_name ? registration_name : "") +
              "'; the provider's own name is '" WC_ORT_EP_NAME "' (its options are ep.weightcache.*)");
    if (max_factories < 1) return make_status(ORT_INVALID_ARGUMENT, "WeightCache EP: no room for its factory");
    factories[0] = new Factory(default_logger);
    *num_factories = 1;
    if (default_logger != nullptr) {
      std::lock_guard<std::mutex> lock(g_factories_mu);
      g_factory_loggers.push_back(default_logger);
      g_library_logger.store(default_logger, std::memory_order_release);
      wc_set_log_callback(route_library_log, nullptr);
    }
    return nullptr;
  });
}

WC_ORT_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  using namespace weightcache::ort;
  // The logger goes with the last factory: back to the library's default (stderr) before it does.
  // wc_set_log_callback returns only once no call of the routing callback is still running.
  if (const OrtLogger* mine = static_cast<Factory*>(factory)->default_logger_; mine != nullptr) {
    std::lock_guard<std::mutex> lock(g_factories_mu);
    auto it = std::find(g_factory_loggers.begin(), g_factory_loggers.end(), mine);
    if (it != g_factory_loggers.end()) g_factory_loggers.erase(it);
    g_library_logger.store(g_factory_loggers.empty() ? nullptr : g_factory_loggers.back(), std::memory_order_release);
    // Setting the callback again waits for any call still using the released logger.
    wc_set_log_callback(g_factory_loggers.empty() ? nullptr : route_library_log, nullptr);
  }
  delete static_cast<Factory*>(factory);
  return nullptr;
}

WC_ORT_EXPORT wc_status wc_ort_ep_get_stats(wc_ort_ep_stats* out) {
  using namespace weightcache::ort;
  if (out == nullptr || out->struct_size < sizeof(std::size_t) || out->struct_size > (1u << 16))
    return WC_ERR_INVALID_ARGUMENT;
  wc_ort_ep_stats s{};
  const auto& c = counters();
  s.struct_size = out->struct_size;
  s.sessions = c.sessions.load();
  s.nodes = c.nodes.load();
  s.weights = c.weights.load();
  s.packed = c.packed.load();
  s.from_cache = c.from_cache.load();
  s.packed_bytes = c.packed_bytes.load();
  s.heap_weights = c.heap_weights.load();
  s.cache_failures = c.cache_failures.load();
  s.caches_open = c.caches_open.load();
  s.source_bytes_hashed = c.source_bytes_hashed.load();
  s.weight_nodes_seen = c.weight_nodes_seen.load();
  s.weight_nodes_taken = c.weight_nodes_taken.load();
  s.xnnpack = have_xnnpack() ? 1 : 0;
  std::memcpy(out, &s, std::min(out->struct_size, sizeof(s)));
  return WC_OK;
}
