// The reference execution provider's model: a stack of transformer-style MLP blocks in f32,
//   x += W_down * gelu(W_up * rmsnorm(x) + b_up) + b_down,
// its weights (generated deterministically, standing in for a model file), the weight packer and
// the GEMM that runs from packed panels. Nothing here depends on weightcache.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace refep {

/// Output columns per packed panel: one AVX-512 register of f32 (four SSE registers).
inline constexpr std::size_t kNr = 16;
/// Names the packed layout; part of the cache's compatibility key. Bump it whenever pack_panels
/// changes what it writes.
inline constexpr std::string_view kPackerId = "refep-f32-bias-panels-nr16-v1";
/// XNNPACK's fingerprint_id names a packing layout; this runtime has one.
inline constexpr std::uint32_t kFingerprintId = 1;

struct Config {
  std::size_t layers = 16;
  std::size_t dim = 1024;
  std::size_t hidden = 4096;
  std::size_t tokens = 4;
  std::uint64_t seed = 0x5eed'0f'ca'c4e5ULL;
};

inline std::size_t layer_weight_bytes(const Config& c) {
  return (2 * c.dim * c.hidden + c.hidden + c.dim) * sizeof(float);
}

/// One fully-connected layer: weight [rows x cols] (rows = output features) and bias [rows].
struct Linear {
  std::string weight_name, bias_name;
  std::size_t rows = 0, cols = 0;
};

inline std::size_t panels(std::size_t rows) { return (rows + kNr - 1) / kNr; }
/// Per panel: kNr bias values, then cols x kNr weights (k-major), zero-padded past `rows`.
inline std::size_t packed_floats(const Linear& l) { return panels(l.rows) * kNr * (l.cols + 1); }
inline std::size_t packed_bytes(const Linear& l) { return packed_floats(l) * sizeof(float); }

/// The layers in execution order: blocks.<i>.mlp.up, blocks.<i>.mlp.down.
inline std::vector<Linear> model_layers(const Config& c) {
  std::vector<Linear> out;
  for (std::size_t i = 0; i < c.layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".mlp.";
    out.push_back({p + "up.weight", p + "up.bias", c.hidden, c.dim});
    out.push_back({p + "down.weight", p + "down.bias", c.dim, c.hidden});
  }
  return out;
}

inline std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ULL) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

/// Fills `out` with `n` values uniform in +-scale: a pure function of (seed, name).
inline void generate(std::uint64_t seed, std::string_view name, float scale, float* out, std::size_t n) {
  std::uint64_t s = seed ^ fnv1a(name.data(), name.size());
  const float unit = scale / static_cast<float>(1u << 23);
  std::size_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const std::uint64_t r = splitmix64(s);
    out[i] = static_cast<float>(static_cast<std::int32_t>(r >> 40) - (1 << 23)) * unit;
    out[i + 1] = static_cast<float>(static_cast<std::int32_t>((r >> 8) & 0xffffff) - (1 << 23)) * unit;
  }
  if (i < n) out[i] = static_cast<float>(static_cast<std::int32_t>(splitmix64(s) >> 40) - (1 << 23)) * unit;
}

/// The unpacked weights, as a runtime sees a memory-mapped model file: every tensor has a fixed
/// address from the start, but its bytes cost nothing until read. Tensors are materialised on
/// first use and released again once packed (a runtime drops unpacked weights after packing).
class SourceModel {
 public:
  struct Tensor {
    std::string name;
    float* data = nullptr;
    std::size_t count = 0;
    float scale = 0;
  };

  SourceModel(const Config& c, const std::vector<Linear>& layers) : seed_(c.seed) {
    std::size_t total = 0;
    for (const auto& l : layers) total += page_round((l.rows * l.cols + l.rows) * sizeof(float)) + 2 * kPage;
    map_size_ = total;
    void* p = ::mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;
    base_ = static_cast<std::byte*>(p);
    std::size_t off = 0;
    for (const auto& l : layers) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(l.cols));
      add(l.weight_name, l.rows * l.cols, scale, &off);
      add(l.bias_name, l.rows, 0.1f, &off);
    }
    filled_.assign(tensors_.size(), false);
  }
  ~SourceModel() {
    if (base_ != nullptr) ::munmap(base_, map_size_);
  }
  SourceModel(const SourceModel&) = delete;
  SourceModel& operator=(const SourceModel&) = delete;

  bool ok() const { return base_ != nullptr; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  /// Weight and bias tensors of layer `i` (execution order).
  const Tensor& weight(std::size_t i) const { return tensors_[2 * i]; }
  const Tensor& bias(std::size_t i) const { return tensors_[2 * i + 1]; }

  /// Makes the tensor's bytes present (generating them on first use).
  void materialize(std::size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (filled_[index]) return;
    const Tensor& t = tensors_[index];
    generate(seed_, t.name, t.scale, t.data, t.count);
    filled_[index] = true;
  }
  /// Returns the tensor's pages to the OS, as dropping a file mapping's pages would.
  void release(std::size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    const Tensor& t = tensors_[index];
    ::madvise(t.data, page_round(t.count * sizeof(float)), MADV_DONTNEED);
    filled_[index] = false;
  }

 private:
  static constexpr std::size_t kPage = 4096;
  static std::size_t page_round(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }
  void add(const std::string& name, std::size_t count, float scale, std::size_t* off) {
    tensors_.push_back({name, reinterpret_cast<float*>(base_ + *off), count, scale});
    *off += page_round(count * sizeof(float));
  }

  std::uint64_t seed_;
  std::byte* base_ = nullptr;
  std::size_t map_size_ = 0;
  std::vector<Tensor> tensors_;
  std::vector<bool> filled_;  // guarded by mu_
  std::mutex mu_;
};

/// Packs w [rows x cols] and b [rows] into packed_floats() floats at `dst` (already zeroed, as
/// XNNPACK zeroes a reservation before packing into it).
inline void pack_panels(const float* w, const float* b, std::size_t rows, std::size_t cols, float* dst) {
  for (std::size_t n0 = 0; n0 < rows; n0 += kNr) {
    const std::size_t nr = std::min(kNr, rows - n0);
    float* panel = dst + (n0 / kNr) * kNr * (cols + 1);
    for (std::size_t j = 0; j < nr; ++j) panel[j] = b != nullptr ? b[n0 + j] : 0.0f;
    float* body = panel + kNr;
    // Blocks of kNr k-values keep the source rows' cache lines hot during the transpose.
    for (std::size_t k0 = 0; k0 < cols; k0 += kNr) {
      const std::size_t k1 = std::min(cols, k0 + kNr);
      for (std::size_t j = 0; j < nr; ++j) {
        const float* src = w + (n0 + j) * cols;
        for (std::size_t k = k0; k < k1; ++k) body[k * kNr + j] = src[k];
      }
    }
  }
}

/// c [m x n] = a [m x k] * W^T + bias, W packed by pack_panels. The summation order is fixed, so
/// the result depends only on the bytes of `a` and of the panels, not on where they live.
inline void gemm_packed(const float* a, std::size_t m, std::size_t k, const float* packed, std::size_t n, float* c) {
  constexpr std::size_t kMr = 4;
  for (std::size_t p = 0; p < panels(n); ++p) {
    const float* panel = packed + p * kNr * (k + 1);
    const std::size_t n0 = p * kNr, nr = std::min(kNr, n - n0);
    for (std::size_t m0 = 0; m0 < m; m0 += kMr) {
      const std::size_t mr = std::min(kMr, m - m0);
      float acc[kMr][kNr];
      for (std::size_t r = 0; r < kMr; ++r)
        for (std::size_t j = 0; j < kNr; ++j) acc[r][j] = panel[j];
      const float* body = panel + kNr;
      for (std::size_t kk = 0; kk < k; ++kk) {
        const float* wk = body + kk * kNr;
        for (std::size_t r = 0; r < mr; ++r) {
          const float av = a[(m0 + r) * k + kk];
          for (std::size_t j = 0; j < kNr; ++j) acc[r][j] += av * wk[j];
        }
      }
      for (std::size_t r = 0; r < mr; ++r)
        for (std::size_t j = 0; j < nr; ++j) c[(m0 + r) * n + n0 + j] = acc[r][j];
    }
  }
}

inline void rmsnorm(const float* x, std::size_t m, std::size_t d, float* out) {
  for (std::size_t r = 0; r < m; ++r) {
    float ss = 0.0f;
    for (std::size_t i = 0; i < d; ++i) ss += x[r * d + i] * x[r * d + i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + 1e-5f);
    for (std::size_t i = 0; i < d; ++i) out[r * d + i] = x[r * d + i] * inv;
  }
}

inline void gelu(float* x, std::size_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608f;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
}

/// Deterministic input activations [tokens x dim].
inline std::vector<float> make_input(const Config& c) {
  std::vector<float> x(c.tokens * c.dim);
  generate(c.seed ^ 0x1a2b3c4dULL, "input", 1.0f, x.data(), x.size());
  return x;
}

}  // namespace refep
