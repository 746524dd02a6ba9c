// A transformer-shaped model run by a real XNNPACK: `layers` MLP blocks, each a fully-connected
// dim -> hidden, GELU, fully-connected hidden -> dim and a residual add (with `attention`, first
// four dim -> dim projections and a residual add: the weights of an attention block, though
// they are only chained here), in f32, or with int8
// (qc8w) or int4 (qc4w) per-channel weights and dynamically quantized activations (the
// on-device LLM path). Its weights live in a model file that every launch maps read-only, as
// ExecuTorch maps a .pte and TFLite a .tflite: XNNPACK reads them only when it packs, so a warm
// launch through weightcache never touches them.
//
// Shared by weightcache-xnn-run (scripts/demo's XNNPACK part, and the launches that
// benchmarks/xnnpack measures).
#pragma once

#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>
#include <xnnpack.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace xnnmlp {

enum class DType { f32, qc8w, qc4w };
const char* dtype_name(DType t);
bool dtype_from_name(const std::string& name, DType* out);

struct Shape {
  std::size_t layers = 8;
  std::size_t dim = 2048;
  std::size_t hidden = 5632;
  bool attention = false;  // also four dim x dim projections per layer (q, k, v, o), chained
};

/// One tensor of the model file.
struct Tensor {
  std::string name;
  const void* data = nullptr;
  std::size_t size = 0;
};

/// The model file: a header, then every tensor 64-byte aligned with 64 bytes of slack after it.
/// Per layer: with attention, attn.{q,k,v,o}.weight [dim x dim] and .bias [dim]; then
/// up.weight [hidden x dim], up.bias [hidden] f32, down.weight [dim x hidden], down.bias [dim]
/// f32; for qc8w / qc4w each weight has per-row f32 scales after its bias (<name>.scale). The header carries a digest of every byte, computed when the file was written
/// (what an exporter stores), so a launch identifies the model without reading its weights.
class ModelFile {
 public:
  ModelFile() = default;
  ~ModelFile();
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;

  /// Writes the model at `path` unless a complete one of this dtype, shape and seed is there.
  static bool ensure(const std::string& path, DType dtype, const Shape& shape, std::uint64_t seed, std::string* err);
  /// Maps the model file read-only.
  bool open(const std::string& path, std::string* err);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  /// Bytes of weights (all tensors).
  std::uint64_t weight_bytes() const;
  /// The digest written into the header, as text (the compatibility key's model part).
  const std::string& digest() const { return digest_; }
  const std::string& path() const { return path_; }

  /// Names every tensor through the adapter (wc_xnn_adapter_name_buffer); false on failure.
  bool name_buffers(wc_xnn_adapter* adapter) const;

 private:
  std::string path_;
  DType dtype_ = DType::f32;
  Shape shape_;
  std::string digest_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::vector<Tensor> tensors_;
};

/// The compatibility key of a cache for `model` under this XNNPACK build (wc_xnn_compat_key with
/// XNNPACK's build identifier, the model digest and the dtype).
std::vector<unsigned char> compat_key(const ModelFile& model);

/// The model inside XNNPACK: a subgraph defined over the mapped weights, and its runtime.
class Runtime {
 public:
  Runtime() = default;
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Defines the subgraph for `batch` tokens and creates the runtime with `cache` (NULL: XNNPACK
  /// packs into memory of its own). XNNPACK's status; *where names a failing step.
  xnn_status create(const ModelFile& model, xnn_weights_cache_t cache, pthreadpool_t threadpool, std::size_t batch,
                    std::string* where);
  /// Runs on a deterministic input; *digest is a digest of the output bytes.
  xnn_status run(std::uint64_t* digest, std::string* where);
  void destroy();

 private:
  const ModelFile* model_ = nullptr;
  std::size_t batch_ = 0;
  xnn_runtime_t runtime_ = nullptr;
  std::vector<float> input_, output_;
};

}  // namespace xnnmlp
