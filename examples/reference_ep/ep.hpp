// The reference execution provider: a small CPU runtime that creates one fully-connected
// operator per layer through an XNNPACK-shaped weights-cache provider (wc_xnn_adapter), exactly
// as XNNPACK's operator-creation path drives it, then runs the model from the packed panels.
#pragma once

#include "model.hpp"

#include <weightcache/xnnpack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace refep {

struct LoadCounts {
  std::size_t packed = 0;  // operators whose weights were packed in this session
  std::size_t hits = 0;    // operators whose packed weights came from the cache
};

class ExecutionProvider {
 public:
  /// `cache` and `source` are borrowed and must outlive the provider.
  ExecutionProvider(wc_cache* cache, SourceModel* source, const Config& config)
      : cache_(cache), source_(source), config_(config), layers_(model_layers(config)) {}
  ~ExecutionProvider() { wc_xnn_adapter_destroy(adapter_); }
  ExecutionProvider(const ExecutionProvider&) = delete;
  ExecutionProvider& operator=(const ExecutionProvider&) = delete;

  /// Creates the adapter and names every weight and bias buffer after its tensor in the model:
  /// the cache keys are built from these names, never from the buffers' addresses.
  std::string init() {
    if (wc_xnn_adapter_create(cache_, &adapter_) != WC_OK) return std::string("adapter: ") + wc_last_error();
    provider_ = static_cast<wc_xnn_weights_cache_provider*>(wc_xnn_adapter_provider(adapter_));
    for (const auto& t : source_->tensors()) {
      if (wc_xnn_adapter_name_buffer(adapter_, t.data, t.name.c_str()) != WC_OK)
        return "naming " + t.name + ": " + wc_last_error();
    }
    return {};
  }

  /// What xnn_create_runtime does for each fully-connected node: look_up; on a miss
  /// reserve_space, zero, pack, look_up_or_insert. Operators keep offsets, not pointers.
  std::string create_operators(LoadCounts* counts) {
    ops_.assign(layers_.size(), Op{});
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const Linear& l = layers_[i];
      const wc_xnn_weights_cache_look_up_key key{seed_of(l), source_->weight(i).data, source_->bias(i).data,
                                                 kFingerprintId};
      std::size_t offset = provider_->look_up(provider_->context, &key);
      if (offset == SIZE_MAX) {
        const std::size_t n = packed_bytes(l);
        void* mem = provider_->reserve_space(provider_->context, n);
        if (mem == nullptr)
          return "reserve_space refused " + std::to_string(n) + " bytes for " + l.weight_name + ": " + wc_last_error();
        std::memset(mem, 0, n);
        source_->materialize(2 * i);
        source_->materialize(2 * i + 1);
        pack_panels(source_->weight(i).data, source_->bias(i).data, l.rows, l.cols, static_cast<float*>(mem));
        source_->release(2 * i);
        source_->release(2 * i + 1);
        offset = provider_->look_up_or_insert(provider_->context, &key, mem, n);
        ++counts->packed;
      } else {
        ++counts->hits;
      }
      ops_[i].offset = offset;
    }
    return {};
  }

  /// The runtime's own job with a custom provider: finalize before setup.
  std::string finalize() {
    if (provider_->is_finalized(provider_->context)) return {};
    if (wc_finalize(cache_) != WC_OK) return std::string("wc_finalize: ") + wc_last_error();
    return {};
  }

  /// Reshape: resolve every operator's packed weights (XNNPACK does this at every reshape).
  std::string reshape() {
    if (!provider_->is_finalized(provider_->context)) return "setup refused: the weights cache is not finalized";
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      ops_[i].packed = static_cast<const float*>(provider_->offset_to_addr(provider_->context, ops_[i].offset));
      if (ops_[i].packed == nullptr) return "offset_to_addr failed for " + layers_[i].weight_name;
    }
    return {};
  }

  /// One forward pass over `tokens` rows of activations.
  void run(const std::vector<float>& input, std::vector<float>* output) const {
    const std::size_t m = config_.tokens, d = config_.dim, h = config_.hidden;
    std::vector<float> x = input, normed(m * d), up(m * h), down(m * d);
    for (std::size_t b = 0; b < config_.layers; ++b) {
      const Op& up_op = ops_[2 * b];
      const Op& down_op = ops_[2 * b + 1];
      rmsnorm(x.data(), m, d, normed.data());
      gemm_packed(normed.data(), m, d, up_op.packed, h, up.data());
      gelu(up.data(), up.size());
      gemm_packed(up.data(), m, h, down_op.packed, d, down.data());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += down[i];
    }
    *output = std::move(x);
  }

  wc_xnn_adapter* adapter() const { return adapter_; }
  std::size_t operators() const { return layers_.size(); }

 private:
  struct Op {
    std::size_t offset = SIZE_MAX;
    const float* packed = nullptr;
  };

  /// XNNPACK's seed mixes the operator's shape, tile sizes and flags; this one its shape.
  static std::uint32_t seed_of(const Linear& l) {
    const std::uint64_t shape[3] = {l.rows, l.cols, kNr};
    return static_cast<std::uint32_t>(fnv1a(shape, sizeof shape));
  }

  wc_cache* cache_;
  SourceModel* source_;
  Config config_;
  std::vector<Linear> layers_;
  wc_xnn_adapter* adapter_ = nullptr;
  wc_xnn_weights_cache_provider* provider_ = nullptr;
  std::vector<Op> ops_;
};

}  // namespace refep
