// A synthetic transformer-shaped weight set and the panel packer that the demo and the
// benchmarks share. Nothing here depends on weightcache: it stands in for a model file and a
// backend's weight packer.
//
// Weights are stored as a model file would hold them, [out_features x in_features] row-major
// (N x K). GEMM microkernels want B in panels of kNr output columns: panel p holds columns
// [p*kNr, p*kNr + kNr), K-major inside the panel (the kNr values for k = 0, then k = 1, ...), and
// the last panel is zero-padded. That transpose is what packing costs, and what a cache saves.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace weightcache::demo {

inline constexpr std::size_t kNr = 16;  // f32 lanes of one AVX-512 register
inline constexpr std::string_view kPackerId = "panel-f32-nr16-v1";

struct ModelConfig {
  std::size_t layers = 12;
  std::size_t dim = 1024;
  std::size_t mlp_mult = 4;
  std::uint64_t seed = 0x5eed'0f'dead'beefULL;
};

struct MatrixSpec {
  std::string name;      // also the cache key
  std::size_t rows = 0;  // N: output features
  std::size_t cols = 0;  // K: input features
};

inline std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

inline std::size_t source_bytes(const MatrixSpec& m) { return m.rows * m.cols * sizeof(float); }
inline std::size_t packed_bytes(const MatrixSpec& m) { return round_up(m.rows, kNr) * m.cols * sizeof(float); }

/// Per layer: attention q, k, v, o [d x d]; MLP up [4d x d] and down [d x 4d].
inline std::vector<MatrixSpec> model_matrices(const ModelConfig& c) {
  std::vector<MatrixSpec> out;
  const std::size_t d = c.dim, h = c.dim * c.mlp_mult;
  for (std::size_t l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "attn.q", d, d});
    out.push_back({p + "attn.k", d, d});
    out.push_back({p + "attn.v", d, d});
    out.push_back({p + "attn.o", d, d});
    out.push_back({p + "mlp.up", h, d});
    out.push_back({p + "mlp.down", d, h});
  }
  return out;
}

inline std::size_t layer_source_bytes(const ModelConfig& c) {
  const std::size_t d = c.dim, h = c.dim * c.mlp_mult;
  return (4 * d * d + 2 * d * h) * sizeof(float);
}

/// Names what the packed bytes depend on, as a backend's compatibility key would.
inline std::string compat_key(const ModelConfig& c) {
  return "weightcache-demo|layers=" + std::to_string(c.layers) + "|dim=" + std::to_string(c.dim) +
         "|mlp=" + std::to_string(c.mlp_mult) + "|seed=" + std::to_string(c.seed) + "|" + std::string(kPackerId);
}

inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ULL;
  return h;
}

/// Fills `out` (rows * cols floats) with the matrix's weights: uniform in +-1/sqrt(K), a pure
/// function of (seed, name) so any process can regenerate any matrix on its own.
inline void generate(const ModelConfig& c, const MatrixSpec& m, float* out) {
  std::uint64_t state = c.seed ^ fnv1a(m.name);
  (void)splitmix64(state);
  const float scale = 1.0f / static_cast<float>(1u << 23) / std::max(1.0f, __builtin_sqrtf(float(m.cols)));
  const std::size_t n = m.rows * m.cols;
  std::size_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const std::uint64_t r = splitmix64(state);
    out[i] = static_cast<float>(static_cast<std::int32_t>(r >> 40) - (1 << 23)) * scale;
    out[i + 1] = static_cast<float>(static_cast<std::int32_t>((r >> 8) & 0xffffff) - (1 << 23)) * scale;
  }
  if (i < n) out[i] = static_cast<float>(static_cast<std::int32_t>(splitmix64(state) >> 40) - (1 << 23)) * scale;
}

/// Packs w [rows x cols] into packed_bytes(m) bytes at `dst` (any alignment; 64 is best).
inline void pack_panels(const float* w, std::size_t rows, std::size_t cols, float* dst) {
  for (std::size_t n0 = 0; n0 < rows; n0 += kNr) {
    const std::size_t nr = std::min(kNr, rows - n0);
    const float* src[kNr] = {};
    for (std::size_t j = 0; j < nr; ++j) src[j] = w + (n0 + j) * cols;
    if (nr == kNr) {
      // Blocks of 16 k keep the 16 source rows' cache lines hot while they are transposed.
      std::size_t k0 = 0;
      for (; k0 + kNr <= cols; k0 += kNr) {
        for (std::size_t k = k0; k < k0 + kNr; ++k) {
          float* out = dst + k * kNr;
          for (std::size_t j = 0; j < kNr; ++j) out[j] = src[j][k];
        }
      }
      for (std::size_t k = k0; k < cols; ++k)
        for (std::size_t j = 0; j < kNr; ++j) dst[k * kNr + j] = src[j][k];
    } else {
      for (std::size_t k = 0; k < cols; ++k) {
        float* out = dst + k * kNr;
        for (std::size_t j = 0; j < nr; ++j) out[j] = src[j][k];
        for (std::size_t j = nr; j < kNr; ++j) out[j] = 0.0f;
      }
    }
    dst += kNr * cols;
  }
}

/// Wrapping sum of the 32-bit words: order-independent, so a matrix and its packed panels
/// (a permutation plus zero padding) have the same fingerprint. Reads every byte.
inline std::uint64_t word_sum(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t acc[4] = {0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 16 <= bytes; i += 16) {
    std::uint32_t w[4];
    std::memcpy(w, p + i, 16);
    for (int j = 0; j < 4; ++j) acc[j] += w[j];
  }
  for (; i + 4 <= bytes; i += 4) {
    std::uint32_t w;
    std::memcpy(&w, p + i, 4);
    acc[0] += w;
  }
  return acc[0] + acc[1] + acc[2] + acc[3];
}

}  // namespace weightcache::demo
