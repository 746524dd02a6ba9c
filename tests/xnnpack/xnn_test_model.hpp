// Model-shaped weights and a runtime that creates fully-connected operators over them through
// the C stand-in for XNNPACK (fake_xnnpack.h). Shared by the tests and the second-process helper.
#pragma once

#include "fake_xnnpack.h"

#include <weightcache/xnnpack.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace weightcache::xnn_test {

inline constexpr std::size_t kNr = 16;
inline constexpr std::uint32_t kFingerprint = 0x51;
inline constexpr char kCompatKey[] = "xnn-adapter-test|packer=bias-panel-nr16-v1";

/// One fully-connected layer as a model file holds it: weight [rows x cols], bias [rows] or none.
struct Linear {
  std::string weight_name, bias_name;
  std::size_t rows = 0, cols = 0;
  std::vector<float> weight;
  std::vector<float> bias;  // empty: no bias
};

inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// bf16-representable floats, so a bf16 copy converts back to exactly the same values.
inline float random_weight(std::uint64_t& s) {
  const std::uint32_t bits = static_cast<std::uint32_t>(splitmix(s) >> 32);
  const float f = static_cast<float>(static_cast<std::int32_t>(bits >> 8) - (1 << 23)) / static_cast<float>(1 << 24);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

inline Linear make_linear(std::uint64_t seed, std::size_t i, const std::string& prefix = "layers.") {
  Linear l;
  l.weight_name = prefix + std::to_string(i) + ".weight";
  l.bias_name = prefix + std::to_string(i) + ".bias";
  l.rows = 8 + (i * 7) % 41;
  l.cols = 4 + (i * 5) % 29;
  std::uint64_t s = seed ^ (0x632be59bd9b4e019ULL * (i + 1));
  l.weight.resize(l.rows * l.cols);
  for (float& w : l.weight) w = random_weight(s);
  if (i % 3 != 2) {
    l.bias.resize(l.rows);
    for (float& b : l.bias) b = random_weight(s);
  }
  return l;
}

inline std::vector<Linear> make_model(std::uint64_t seed, std::size_t count, const std::string& prefix = "layers.") {
  std::vector<Linear> m;
  for (std::size_t i = 0; i < count; ++i) m.push_back(make_linear(seed, i, prefix));
  return m;
}

/// XNNPACK's seed mixes shapes, tile sizes and flags; ours mixes the shape.
inline std::uint32_t seed_of(const Linear& l) {
  return static_cast<std::uint32_t>(l.rows * 2654435761u) ^ static_cast<std::uint32_t>(l.cols * 40503u);
}

inline std::size_t packed_size(const Linear& l) { return (l.rows + kNr - 1) / kNr * kNr * (l.cols + 1) * sizeof(float); }

struct Shape {
  std::size_t rows = 0, cols = 0;
};

/// fxnn_pack_fn: per panel of kNr output rows, kNr bias values then cols x kNr weights (the
/// layout of XNNPACK's f32 GEMM weights). Reads only through the pointers XNNPACK passes.
inline void pack(void* user, const void* kernel, const void* bias, void* packed, std::size_t size) {
  const auto* shape = static_cast<const Shape*>(user);
  const auto* w = static_cast<const float*>(kernel);
  const auto* b = static_cast<const float*>(bias);
  auto* out = static_cast<float*>(packed);
  const std::size_t floats = size / sizeof(float);
  std::size_t o = 0;
  for (std::size_t n0 = 0; n0 < shape->rows; n0 += kNr) {
    for (std::size_t j = 0; j < kNr; ++j, ++o)
      if (n0 + j < shape->rows && b != nullptr && o < floats) out[o] = b[n0 + j];
    for (std::size_t k = 0; k < shape->cols; ++k)
      for (std::size_t j = 0; j < kNr; ++j, ++o)
        if (n0 + j < shape->rows && o < floats) out[o] = w[(n0 + j) * shape->cols + k];
  }
}

inline std::vector<unsigned char> expected_packed(const Linear& l, const float* kernel = nullptr) {
  std::vector<unsigned char> out(packed_size(l), 0);
  Shape s{l.rows, l.cols};
  pack(&s, kernel != nullptr ? kernel : l.weight.data(), l.bias.empty() ? nullptr : l.bias.data(), out.data(),
       out.size());
  return out;
}

/// Binds every weight and bias buffer of the model to its name.
inline bool name_model(wc_xnn_adapter* a, const std::vector<Linear>& model) {
  for (const auto& l : model) {
    if (wc_xnn_adapter_name_buffer(a, l.weight.data(), l.weight_name.c_str()) != WC_OK) return false;
    if (!l.bias.empty() && wc_xnn_adapter_name_buffer(a, l.bias.data(), l.bias_name.c_str()) != WC_OK) return false;
  }
  return true;
}

/// What xnn_create_runtime does with the weights: one fully-connected operator per layer.
struct Runtime {
  std::vector<Shape> shapes;
  std::vector<fxnn_operator> ops;
};

/// `kernels` (optional) replaces each layer's kernel pointer (e.g. a converted copy).
inline fxnn_status create_runtime(fxnn_weights_cache_t cache, const std::vector<Linear>& model, Runtime* rt,
                                  const std::vector<const float*>* kernels = nullptr) {
  rt->shapes.clear();
  rt->ops.clear();
  rt->shapes.reserve(model.size());  // pack() receives pointers into it
  rt->ops.resize(model.size());
  for (std::size_t i = 0; i < model.size(); ++i) {
    const Linear& l = model[i];
    rt->shapes.push_back(Shape{l.rows, l.cols});
    const float* kernel = kernels != nullptr ? (*kernels)[i] : l.weight.data();
    const fxnn_status st =
        fxnn_create_fully_connected(cache, seed_of(l), kFingerprint, kernel, l.bias.empty() ? nullptr : l.bias.data(),
                                    packed_size(l), pack, &rt->shapes.back(), &rt->ops[i]);
    if (st != fxnn_status_success) return st;
  }
  return fxnn_status_success;
}

/// Reshapes every operator (offset_to_addr) and compares its packed weights with a fresh
/// packing. Returns "" or what differs.
inline std::string check_runtime(Runtime* rt, const std::vector<Linear>& model,
                                 const std::vector<const float*>* kernels = nullptr) {
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (fxnn_reshape_operator(&rt->ops[i]) != fxnn_status_success)
      return "layer " + std::to_string(i) + ": offset_to_addr returned NULL for offset " +
             std::to_string(rt->ops[i].packed_offset);
    // XNN_ALLOCATION_ALIGNMENT on x86; the cache's default alignment.
    if (reinterpret_cast<std::uintptr_t>(rt->ops[i].packed) % 64 != 0)
      return "layer " + std::to_string(i) + ": packed weights are not 64-byte aligned";
    const auto want = expected_packed(model[i], kernels != nullptr ? (*kernels)[i] : nullptr);
    if (std::memcmp(rt->ops[i].packed, want.data(), want.size()) != 0)
      return "layer " + std::to_string(i) + ": packed weights differ";
  }
  return {};
}

/// bf16 copy of a float buffer (the model file's storage) and its fp32 conversion (what XNNPACK
/// allocates and aliases to the original).
inline std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t u;
    std::memcpy(&u, &v[i], 4);
    out[i] = static_cast<std::uint16_t>(u >> 16);
  }
  return out;
}
inline std::vector<float> from_bf16(const std::vector<std::uint16_t>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(v[i]) << 16;
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

/// The options both processes open the test cache with.
inline wc_status open_cache(const std::string& path, wc_cache** out) {
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.compat_key = kCompatKey;
  o.compat_key_size = sizeof(kCompatKey) - 1;
  o.durability = WC_DURABILITY_NONE;  // crash safety is not under test here; fsync is slow
  o.backing = WC_BACKING_FILE;
  return wc_open(&o, out);
}

}  // namespace weightcache::xnn_test
