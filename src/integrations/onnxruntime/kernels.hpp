// The provider's compute: one fully-connected layer (y = alpha * (a x W) + bias, then Relu or
// Gelu) whose packed weights come from a weightcache. Two implementations:
// - XNNPACK's fully-connected operators (f32, and 4-bit blockwise weights with dynamically
//   quantized activations), packing through weightcache's XNNPACK adapter (when the build has
//   XNNPACK: WEIGHTCACHE_ORT_EP_XNNPACK);
// - the provider's own packer and GEMM (f32 only), packing through wc_reserve_space directly.
#pragma once

#include <weightcache/weightcache.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct wc_xnn_adapter;

namespace weightcache::ort {

enum class Activation { none, relu, gelu };

/// One layer's weights and epilogue, as GetCapability/Compile found them in the graph.
struct LinearSpec {
  enum class Kind { f32, nbits4, qc8 } kind = Kind::f32;
  std::size_t k = 0, n = 0;
  // f32: the weights, K x N row-major when weights_kn (MatMul's B, Gemm's B with transB = 0),
  // else N x K. nbits4: MatMulNBits' B, N x K/2 bytes (element 2i in the low nibble).
  // Valid only while the kernel is created: it is read on a cache miss, named on every create.
  const void* weights = nullptr;
  bool weights_kn = true;
  std::string weights_name;  // the weight's identity (source_identity.hpp): what the packed bytes are keyed by
  // qc8: the int8 B of DynamicQuantizeMatMul, MatMulInteger or MatMulIntegerToFloat, K x N
  // (weights_kn), zero point 0, with N per-column scales in `scales` (a per-tensor one repeated).
  // nbits4 only: the per-block scales (N x K/block_size, f32) and the block size.
  const float* scales = nullptr;
  std::size_t block_size = 0;
  // Bias of N values (already beta * C / alpha for Gemm), or empty; and its identity.
  std::vector<float> bias;
  std::string bias_name;
  float alpha = 1.0f;
  Activation activation = Activation::none;
};

/// Counts of one kernel's creation.
struct CreateReport {
  bool packed = false;      // this process packed the weights (a miss)
  bool in_heap = false;     // the packed weights live in private heap memory, not the cache file
  std::string why;          // why the cache could not take the packed weights ("" when it could)
  std::size_t bytes = 0;    // bytes this creation packed (0 on a hit; 0 when XNNPACK packed into its own memory)
};

/// A created layer. run() may be called from several threads; calls are serialized per layer.
class Linear {
 public:
  virtual ~Linear() = default;
  /// y[m x n] = epilogue(a[m x k] x W); a and y are dense row-major.
  virtual void run(const float* a, std::size_t m, float* y) = 0;
  /// The same for an A quantized before the layer, one scale and zero point for all of it
  /// (A = (a - zero_point) * scale, m x k; a is uint8 when a_unsigned, else int8). A qc8 layer on
  /// XNNPACK takes a as it is; any other dequantizes it and calls run().
  virtual void run_quantized(const std::uint8_t* a, bool a_unsigned, std::size_t m, std::size_t k, std::int32_t zero_point,
                             float scale, float* y);
};

/// Where a session packs: its cache (may be a heap cache standing in for a file) and, for
/// XNNPACK, its own adapter (finalization is per adapter, so sessions never block each other).
struct PackTarget {
  wc_cache* cache = nullptr;
  wc_xnn_adapter* adapter = nullptr;  // XNNPACK builds only
  bool use_cache = true;              // false: XNNPACK packs into its own memory (weights_cache=off)
  void* threadpool = nullptr;         // XNNPACK: the session's pthreadpool (NULL: the calling thread)
  // 4-bit layers: bf16 1.0 block scales, at least as many as any layer of the session has, that
  // stand in for the real ones while a hit is looked for (filled once per session, not per layer).
  const std::uint16_t* placeholder_scales = nullptr;
  std::size_t placeholder_count = 0;
  // The caller has named the weights and bias in the adapter for the whole creation (layers are
  // then created on several threads at once); false: the creation names and unnames them itself.
  bool names_bound = false;
};

/// Runs fn(0) ... fn(count - 1) on the XNNPACK threadpool (a pthreadpool_t; NULL or a build
/// without XNNPACK: on the calling thread, in order). Every call runs; the first exception is
/// rethrown after all have returned.
void parallel_for(void* threadpool, std::size_t count, const std::function<void(std::size_t)>& fn);

/// Whether this build computes with XNNPACK.
bool have_xnnpack() noexcept;
/// XNNPACK's build identifier (empty without XNNPACK); part of the compatibility key.
std::string xnnpack_build_id();
/// Whether XNNPACK accepts this 4-bit layer (block size, scales finite and positive).
bool nbits_supported(std::size_t k, std::size_t n, std::size_t block_size) noexcept;

/// One 2-D convolution (ONNX Conv, NCHW; a 1-D one as height 1) and its epilogue.
struct ConvSpec {
  std::size_t groups = 1, group_in = 0, group_out = 0;  // channels per group, in and out
  std::size_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  std::size_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  // ONNX's weights, [groups * group_out, group_in, kh, kw] (OIHW). Valid only while the kernel is
  // created: read on a cache miss (transposed to XNNPACK's OHWI first), named on every create.
  const float* weights = nullptr;
  std::string weights_name;  // its identity and the geometry: what the packed bytes are keyed by
  std::vector<float> bias;   // groups * group_out values, or empty
  std::string bias_name;
  Activation activation = Activation::none;
};

/// A created convolution. run() may be called from several threads; calls are serialized.
class Conv2d {
 public:
  virtual ~Conv2d() = default;
  /// y[n x C_out x oh x ow] = epilogue(conv(x[n x C_in x h x w])), both NCHW; oh and ow are
  /// output_size()'s.
  virtual void run(const float* x, std::size_t n, std::size_t h, std::size_t w, float* y) = 0;
};

/// The output height and width of a convolution on an h x w input; false if it has none.
bool conv_output_size(const ConvSpec& s, std::size_t h, std::size_t w, std::size_t* oh, std::size_t* ow) noexcept;

/// Creates the convolution (XNNPACK builds only), packing (or finding) its weights.
std::unique_ptr<Conv2d> create_xnnpack_conv(const ConvSpec& spec, const PackTarget& target, CreateReport* report);

/// Creates the layer, packing (or finding) its weights. Throws OrtError with a message when
/// neither the cache nor a heap fallback can make it.
std::unique_ptr<Linear> create_xnnpack(const LinearSpec& spec, const PackTarget& target, CreateReport* report);
std::unique_ptr<Linear> create_builtin(const LinearSpec& spec, const PackTarget& target, CreateReport* report);

/// Applies alpha, Relu or Gelu to y in place (the parts the GEMM did not fuse).
void apply_epilogue(float* y, std::size_t count, float alpha, Activation activation, bool relu_done) noexcept;

}  // namespace weightcache::ort
