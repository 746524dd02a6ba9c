// The reference execution provider: a small CPU runtime that creates one fully-connected
// operator per layer and runs the model from the packed weights. Two backends compute:
//  - xnnpack (xnn_backend.hpp, when the build has XNNPACK): XNNPACK's own operators, which pack
//    the weights themselves;
//  - gemm (here): the provider's own packer and GEMM (pack_panels, gemm_packed in model.hpp).
// Where the packed weights come from is the mode:
//  - adapter: through the XNNPACK-shaped weights-cache provider (wc_xnn_adapter); the gemm
//    backend calls its function pointers exactly as XNNPACK's operator-creation path does, the
//    xnnpack backend hands it to XNNPACK;
//  - c_abi:   through the C ABI directly (wc_look_up, wc_reserve_space, wc_look_up_or_insert),
//    as a backend that packs its own weights would (gemm backend only: XNNPACK talks to a
//    weights-cache provider, not to this ABI);
//  - direct:  no weightcache at all: packed into private memory of the session's own (the
//    baseline every output of the same backend is compared with).
#pragma once

#include "model.hpp"

#include <weightcache/weightcache.h>
#include <weightcache/xnnpack.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace refep {

enum class Mode { adapter, c_abi, direct };
enum class Backend { xnnpack, gemm };

inline const char* backend_name(Backend b) { return b == Backend::xnnpack ? "xnnpack" : "gemm"; }

inline const char* mode_name(Mode m) {
  switch (m) {
    case Mode::adapter: return "XNNPACK-shaped provider";
    case Mode::c_abi: return "C ABI";
    case Mode::direct: return "no cache";
  }
  return "?";
}

/// Private, 64-byte aligned memory for packed weights, in one anonymous mapping of its own
/// (what malloc returns for buffers this large), between two guard pages so the kernel never
/// merges it with a neighbour: /proc/self/smaps then accounts for exactly these pages.
class PrivateBuffer {
 public:
  PrivateBuffer() = default;
  explicit PrivateBuffer(std::size_t size) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    size_ = (size + page - 1) / page * page;
    map_size_ = size_ + 2 * page;
    void* p = ::mmap(nullptr, map_size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base_ = static_cast<std::byte*>(p);
    if (::mprotect(base_ + page, size_, PROT_READ | PROT_WRITE) != 0) return;
    data_ = base_ + page;
  }
  ~PrivateBuffer() {
    if (base_ != nullptr) ::munmap(base_, map_size_);
  }
  PrivateBuffer(PrivateBuffer&& o) noexcept { *this = std::move(o); }
  PrivateBuffer& operator=(PrivateBuffer&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(map_size_, o.map_size_);
    return *this;
  }
  std::byte* data() const { return data_; }

 private:
  std::byte* base_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0, map_size_ = 0;
};

struct LoadCounts {
  std::size_t packed = 0;  // operators whose weights were packed in this session
  std::size_t hits = 0;    // operators whose packed weights came from the cache
};

/// Creates the adapter over `cache` and names every weight and bias buffer of `source` after its
/// tensor in the model: the cache keys are built from these names, never from the buffers'
/// addresses. On failure *out may hold an adapter the caller still destroys.
inline std::string open_adapter(wc_cache* cache, const SourceModel& source, wc_xnn_adapter** out) {
  if (wc_xnn_adapter_create(cache, out) != WC_OK) return std::string("adapter: ") + wc_last_error();
  for (const auto& t : source.tensors()) {
    if (wc_xnn_adapter_name_buffer(*out, t.data, t.name.c_str()) != WC_OK)
      return "naming " + t.name + ": " + wc_last_error();
  }
  return {};
}

/// What a session drives, whatever the backend: init, create_operators, finalize, reshape, then
/// run as often as it likes. Every call that can fail returns what failed (empty: success).
class ExecutionProvider {
 public:
  virtual ~ExecutionProvider() = default;
  /// Adapter mode: the adapter, its buffers named. Direct mode: whatever private memory needs.
  virtual std::string init() = 0;
  /// Creates one fully-connected operator per layer, packing (or finding) its weights.
  virtual std::string create_operators(LoadCounts* counts) = 0;
  /// The runtime's own job with a cache: finalize before setup (with the XNNPACK-shaped
  /// provider, setup is refused until is_finalized says so).
  virtual std::string finalize() = 0;
  /// Resolves every operator's packed weights for the configured batch of tokens.
  virtual std::string reshape() = 0;
  /// One forward pass over `tokens` rows of activations.
  virtual std::string run(const std::vector<float>& input, std::vector<float>* output) = 0;
  /// Where every operator's packed weights are (after reshape): [address, address + bytes).
  virtual std::vector<std::pair<const void*, std::size_t>> packed_ranges() const = 0;
  virtual std::size_t packed_total() const = 0;
  /// The adapter (adapter mode), else NULL.
  virtual wc_xnn_adapter* adapter() const = 0;
  virtual std::size_t operators() const = 0;
  virtual Backend backend() const = 0;
};

/// The gemm backend: the provider's own packer (pack_panels) and GEMM.
class GemmProvider final : public ExecutionProvider {
 public:
  /// `cache` (NULL in direct mode) and `source` are borrowed and must outlive the provider.
  GemmProvider(Mode mode, wc_cache* cache, SourceModel* source, const Config& config)
      : mode_(mode), cache_(cache), source_(source), config_(config), layers_(model_layers(config)) {}
  ~GemmProvider() override { wc_xnn_adapter_destroy(adapter_); }
  GemmProvider(const GemmProvider&) = delete;
  GemmProvider& operator=(const GemmProvider&) = delete;

  /// Direct mode: allocates the private memory every layer is packed into.
  std::string init() override {
    if (mode_ == Mode::direct) {
      std::size_t total = 0;
      for (const Linear& l : layers_) total += align64(packed_bytes(l));
      private_ = PrivateBuffer(total);
      return private_.data() != nullptr ? std::string() : "cannot allocate " + std::to_string(total) + " bytes";
    }
    if (mode_ == Mode::c_abi) return {};
    std::string err = open_adapter(cache_, *source_, &adapter_);
    provider_ = static_cast<wc_xnn_weights_cache_provider*>(wc_xnn_adapter_provider(adapter_));
    return err;
  }

  /// Operators keep offsets, not pointers.
  std::string create_operators(LoadCounts* counts) override {
    ops_.assign(layers_.size(), Op{});
    std::size_t direct_offset = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const Linear& l = layers_[i];
      const std::size_t n = packed_bytes(l);
      if (mode_ == Mode::direct) {  // what the runtime does without a cache: pack, every time
        void* mem = private_.data() + direct_offset;
        direct_offset += align64(n);
        pack_layer(i, mem, n);
        ops_[i].packed = static_cast<const float*>(mem);
        ++counts->packed;
        continue;
      }
      std::size_t offset = SIZE_MAX;
      if (mode_ == Mode::adapter) {
        // What xnn_create_runtime does for each fully-connected node: look_up; on a miss
        // reserve_space, zero, pack, look_up_or_insert (whose result XNNPACK does not check).
        const wc_xnn_weights_cache_look_up_key key{seed_of(l), source_->weight(i).data, source_->bias(i).data,
                                                   kFingerprintId};
        offset = provider_->look_up(provider_->context, &key);
        if (offset == SIZE_MAX) {
          void* mem = provider_->reserve_space(provider_->context, n);
          if (mem == nullptr)
            return "reserve_space refused " + std::to_string(n) + " bytes for " + l.weight_name + ": " + wc_last_error();
          pack_layer(i, mem, n);
          offset = provider_->look_up_or_insert(provider_->context, &key, mem, n);
          ++counts->packed;
        } else {
          ++counts->hits;
        }
      } else {
        // A backend that packs its own weights: the same steps through the C ABI, with a key
        // of its own making (names, never addresses; length-prefixed).
        const std::string key = c_abi_key(l);
        offset = wc_look_up(cache_, key.data(), key.size());
        if (offset == WC_NOT_FOUND) {
          void* mem = wc_reserve_space(cache_, n);
          if (mem == nullptr)
            return "wc_reserve_space refused " + std::to_string(n) + " bytes for " + l.weight_name + ": " +
                   wc_last_error();
          pack_layer(i, mem, n);
          offset = wc_look_up_or_insert(cache_, key.data(), key.size(), mem, n);
          if (offset == WC_NOT_FOUND) return "wc_look_up_or_insert failed for " + l.weight_name + ": " + wc_last_error();
          ++counts->packed;
        } else {
          ++counts->hits;
        }
      }
      ops_[i].offset = offset;
    }
    return {};
  }

  std::string finalize() override {
    if (mode_ == Mode::direct) return {};
    const bool finalized =
        mode_ == Mode::adapter ? provider_->is_finalized(provider_->context) : wc_is_finalized(cache_) != 0;
    if (finalized) return {};
    if (wc_finalize(cache_) != WC_OK) return std::string("wc_finalize: ") + wc_last_error();
    return {};
  }

  /// As XNNPACK does at every reshape: offset_to_addr for every operator.
  std::string reshape() override {
    if (mode_ == Mode::direct) return {};
    if (mode_ == Mode::adapter && !provider_->is_finalized(provider_->context))
      return "setup refused: the weights cache is not finalized";
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      ops_[i].packed = static_cast<const float*>(mode_ == Mode::adapter
                                                     ? provider_->offset_to_addr(provider_->context, ops_[i].offset)
                                                     : wc_offset_to_addr(cache_, ops_[i].offset));
      if (ops_[i].packed == nullptr) return "offset_to_addr failed for " + layers_[i].weight_name;
    }
    return {};
  }

  std::vector<std::pair<const void*, std::size_t>> packed_ranges() const override {
    std::vector<std::pair<const void*, std::size_t>> out;
    for (std::size_t i = 0; i < ops_.size(); ++i) out.emplace_back(ops_[i].packed, packed_bytes(layers_[i]));
    return out;
  }
  std::size_t packed_total() const override {
    std::size_t n = 0;
    for (const Linear& l : layers_) n += packed_bytes(l);
    return n;
  }

  std::string run(const std::vector<float>& input, std::vector<float>* output) override {
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
    return {};
  }

  wc_xnn_adapter* adapter() const override { return adapter_; }
  std::size_t operators() const override { return layers_.size(); }
  Backend backend() const override { return Backend::gemm; }

 private:
  struct Op {
    std::size_t offset = SIZE_MAX;
    const float* packed = nullptr;
  };

  static std::size_t align64(std::size_t n) { return (n + 63) / 64 * 64; }

  /// Zeroes `mem` (as XNNPACK zeroes a reservation) and packs layer i into it from the source
  /// tensors, which are dropped again afterwards (a runtime frees unpacked weights once packed).
  void pack_layer(std::size_t i, void* mem, std::size_t n) {
    const Linear& l = layers_[i];
    std::memset(mem, 0, n);
    source_->materialize(2 * i);
    source_->materialize(2 * i + 1);
    pack_panels(source_->weight(i).data, source_->bias(i).data, l.rows, l.cols, static_cast<float*>(mem));
    source_->release(2 * i);
    source_->release(2 * i + 1);
  }

  /// The C-ABI mode's key: a tag, then the weight name, the bias name and the packed shape,
  /// each length-prefixed, so no two layers share a key whatever their names contain.
  static std::string c_abi_key(const Linear& l) {
    std::string k = "refep-c-abi/1";
    auto put = [&](std::string_view field) {
      const std::uint32_t n = static_cast<std::uint32_t>(field.size());
      for (int b = 0; b < 4; ++b) k.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
      k.append(field);
    };
    put(l.weight_name);
    put(l.bias_name);
    put(std::to_string(l.rows) + "x" + std::to_string(l.cols) + "/nr" + std::to_string(kNr));
    return k;
  }

  /// XNNPACK's seed mixes the operator's shape, tile sizes and flags; this one its shape.
  static std::uint32_t seed_of(const Linear& l) {
    const std::uint64_t shape[3] = {l.rows, l.cols, kNr};
    return static_cast<std::uint32_t>(fnv1a(shape, sizeof shape));
  }

  Mode mode_;
  wc_cache* cache_;
  SourceModel* source_;
  Config config_;
  std::vector<Linear> layers_;
  wc_xnn_adapter* adapter_ = nullptr;
  wc_xnn_weights_cache_provider* provider_ = nullptr;
  std::vector<Op> ops_;
  PrivateBuffer private_;  // direct mode
};

}  // namespace refep
