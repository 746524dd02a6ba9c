// Small models run by a real XNNPACK (its subgraph runtime and its operator API), shared by the
// real-XNNPACK suite and its child process: each model's static weights live in buffers the
// model owns (at addresses shifted by a caller's offset, so a second process provably names
// other addresses), are named through the adapter, and are packed by XNNPACK through whatever
// weights cache the runner is given (or none: the baseline outputs are compared with).
#pragma once

#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>
#include <xnnpack.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weightcache::xnn_real {

enum class Kind {
  fc_f32,          // two fully-connected f32 nodes
  fc_qd8_qc8w,     // f32 -> qd8 convert, FC with per-channel int8 weights, twice
  fc_qd8_qc4w,     // same with per-channel int4 weights
  fc_qd8_qb4w,     // same with blockwise int4 weights (bf16 block scales)
  conv_f32,        // two 3x3 convolutions, f32
  conv_qs8,        // two 3x3 convolutions, int8 activations, per-channel int8 weights
  dwconv_f32,      // two 3x3 depthwise convolutions, f32
  fc_f16,          // a fully-connected node with fp16 input, weights and output
  fc_f16_convert,  // static fp16 weights converted to fp32 by a convert node (how a converter
                   // writes a model stored in fp16), feeding an f32 fully-connected node
  fc_bf16,         // a fully-connected node with bf16 input and weights: lowered to fp32 by
                   // XNNPACK, which converts the static weights and calls alias_data
  bmm_f32,         // batch matrix multiply with a static right-hand side
  op_fc_conv_f32,  // the operator API: xnn_create_fully_connected_nc_f32 and
                   // xnn_create_convolution2d_nhwc_f32 with the weights cache
};

/// Every kind, and each one's name (used on child command lines and in test names).
const std::vector<Kind>& all_kinds();
const char* kind_name(Kind kind);
bool kind_from_name(const std::string& name, Kind* out);

/// One static tensor: its name in "the model file" and its bytes, at an address of its own.
struct Weight {
  std::string name;
  std::size_t size = 0;
  void* data = nullptr;
  std::unique_ptr<unsigned char[]> storage;
};

class Model {
 public:
  /// The weights of `kind`, generated from `seed`; each buffer starts `shift` bytes into its
  /// allocation (a multiple of 64), and every name starts with `prefix`.
  Model(Kind kind, std::uint64_t seed, std::size_t shift = 0, std::string prefix = "");

  Kind kind() const { return kind_; }
  const std::vector<Weight>& weights() const { return weights_; }
  /// How many weight packings a cold creation performs through the weights cache.
  std::size_t packed_nodes() const;
  /// Bytes of one input / output element and the element count for a batch.
  std::size_t input_bytes(std::size_t batch) const;
  std::size_t output_bytes(std::size_t batch) const;
  /// A deterministic input for `batch`.
  std::vector<unsigned char> make_input(std::size_t batch) const;
  /// A digest of every weight's name and bytes (what a runtime would put in the compat key).
  std::string digest() const;

  /// Names every weight buffer through the adapter; false (and wc_last_error) on failure.
  bool name_buffers(wc_xnn_adapter* adapter) const;

  const Weight& w(std::size_t i) const { return weights_[i]; }

 private:
  Weight& add(const std::string& name, std::size_t size);
  Kind kind_;
  std::size_t shift_;
  std::string prefix_;
  std::vector<Weight> weights_;
};

/// An instance of a model inside XNNPACK: a runtime built from a fresh subgraph (or, for the
/// operator-API kind, the operators), with what it needs to run.
class Instance {
 public:
  Instance() = default;
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  /// Builds the subgraph (or operators) of `model` and creates them with `cache` (NULL: XNNPACK
  /// packs into its own memory). Returns XNNPACK's status.
  xnn_status create(const Model& model, xnn_weights_cache_t cache, pthreadpool_t threadpool);
  /// Reshapes to `batch`, sets up and runs on `input`; the output lands in *output. Returns
  /// XNNPACK's first failing status (success otherwise); *where names the failing step.
  xnn_status run(std::size_t batch, const std::vector<unsigned char>& input, std::vector<unsigned char>* output,
                 std::string* where = nullptr);
  void destroy();

 private:
  const Model* model_ = nullptr;
  pthreadpool_t threadpool_ = nullptr;
  xnn_runtime_t runtime_ = nullptr;
  std::vector<xnn_operator_t> ops_;
  std::vector<unsigned char> scratch_, workspace_;
};

/// Runs `model` once at `batch` with no weights cache: the reference output.
xnn_status run_uncached(const Model& model, std::size_t batch, pthreadpool_t threadpool,
                        std::vector<unsigned char>* output);

/// A provider in front of the adapter's: forwards every call and counts it (what XNNPACK asked).
class CountingProvider {
 public:
  explicit CountingProvider(void* inner);
  xnn_weights_cache_t get() { return &provider_; }
  xnn_weights_cache_provider* inner() const { return inner_; }

  std::atomic<std::uint64_t> look_up{0}, reserve_space{0}, look_up_or_insert{0}, null_inserts{0}, is_finalized{0},
      offset_to_addr{0}, delete_cache{0}, alias_data{0};

 private:
  xnn_weights_cache_provider provider_{};
  xnn_weights_cache_provider* inner_;
};

/// The compatibility key of `model` for this XNNPACK build; `other_build` flips a byte of the
/// build identifier (what another XNNPACK build would have).
std::vector<unsigned char> compat_key(const Model& model, bool other_build);

/// Opens the cache file at `path` for `model` (file-backed, default alignment).
wc_status open_cache(const std::string& path, const std::vector<unsigned char>& key, wc_cache** out);

}  // namespace weightcache::xnn_real
