#include "real_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace weightcache::xnn_real {

namespace {

// Shapes. Fully connected: 64 -> 96 -> 40. Convolutions: 8x8 images, 3x3 kernels, padding 1.
constexpr std::size_t kIn = 64, kHidden = 96, kOut = 40;  // multiples of the qb4w block
constexpr std::size_t kHW = 8, kConvIn = 4, kConvOut = 8, kDwChannels = 16;
constexpr std::size_t kBmmK = 32, kBmmN = 24;
constexpr std::size_t kBlock = 32;         // qb4w block size (input channels per scale)
constexpr std::size_t kInputPadding = 64;  // XNNPACK may read XNN_EXTRA_BYTES past an input

// Quantization of the qs8 convolutions' activations.
constexpr float kQs8InScale = 0.05f, kQs8MidScale = 0.2f, kQs8OutScale = 0.5f;
constexpr int32_t kQs8InZero = 1, kQs8MidZero = -2, kQs8OutZero = 0;

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float unit() { return static_cast<float>(next() >> 40) / static_cast<float>(1u << 24) * 2.0f - 1.0f; }
};

std::uint64_t fnv(const void* p, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

// Random half-precision bit patterns of moderate magnitude (no infinities, NaNs or denormals).
std::uint16_t random_fp16(Rng& r) {
  const std::uint64_t v = r.next();
  return static_cast<std::uint16_t>(((v & 1) << 15) | ((10 + (v >> 1) % 5) << 10) | ((v >> 8) & 0x3ff));
}
std::uint16_t random_bf16(Rng& r, bool positive = false, unsigned min_exp = 120, unsigned exps = 7) {
  const std::uint64_t v = r.next();
  const std::uint64_t sign = positive ? 0 : (v & 1);
  return static_cast<std::uint16_t>((sign << 15) | ((min_exp + (v >> 1) % exps) << 7) | ((v >> 8) & 0x7f));
}

void fill(const Weight& w, std::uint64_t seed, char type) {
  Rng r{seed ^ fnv(w.name.data(), w.name.size())};
  auto* b = static_cast<unsigned char*>(w.data);
  switch (type) {
    case 'f': {  // f32 in [-1, 1]
      auto* f = static_cast<float*>(w.data);
      for (std::size_t i = 0; i < w.size / 4; ++i) f[i] = r.unit();
      break;
    }
    case 's': {  // positive f32 scales
      auto* f = static_cast<float*>(w.data);
      for (std::size_t i = 0; i < w.size / 4; ++i) f[i] = 0.001f + 0.01f * (r.unit() + 1.0f);
      break;
    }
    case 'b':  // int8 in [-127, 127]
      for (std::size_t i = 0; i < w.size; ++i)
        b[i] = static_cast<unsigned char>(static_cast<int>(r.next() % 255) - 127);
      break;
    case 'n':  // int4 pairs: any nibbles
      for (std::size_t i = 0; i < w.size; ++i) b[i] = static_cast<unsigned char>(r.next());
      break;
    case 'h': {
      auto* h = static_cast<std::uint16_t*>(w.data);
      for (std::size_t i = 0; i < w.size / 2; ++i) h[i] = random_fp16(r);
      break;
    }
    case 'B': {
      auto* h = static_cast<std::uint16_t*>(w.data);
      for (std::size_t i = 0; i < w.size / 2; ++i) h[i] = random_bf16(r);
      break;
    }
    case 'S': {  // positive bf16 block scales, small
      auto* h = static_cast<std::uint16_t*>(w.data);
      for (std::size_t i = 0; i < w.size / 2; ++i) h[i] = random_bf16(r, true, 117, 3);
      break;
    }
    case 'i': {  // int32 biases, small
      auto* v = static_cast<std::int32_t*>(w.data);
      for (std::size_t i = 0; i < w.size / 4; ++i) v[i] = static_cast<std::int32_t>(r.next() % 2001) - 1000;
      break;
    }
  }
}

}  // namespace

const std::vector<Kind>& all_kinds() {
  static const std::vector<Kind> kinds = {Kind::fc_f32,      Kind::fc_qd8_qc8w, Kind::fc_qd8_qc4w,
                                          Kind::fc_qd8_qb4w, Kind::conv_f32,    Kind::conv_qs8,
                                          Kind::dwconv_f32,  Kind::fc_f16,      Kind::fc_f16_convert,
                                          Kind::fc_bf16,     Kind::bmm_f32,     Kind::op_fc_conv_f32};
  return kinds;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::fc_f32: return "fc_f32";
    case Kind::fc_qd8_qc8w: return "fc_qd8_qc8w";
    case Kind::fc_qd8_qc4w: return "fc_qd8_qc4w";
    case Kind::fc_qd8_qb4w: return "fc_qd8_qb4w";
    case Kind::conv_f32: return "conv_f32";
    case Kind::conv_qs8: return "conv_qs8";
    case Kind::dwconv_f32: return "dwconv_f32";
    case Kind::fc_f16: return "fc_f16";
    case Kind::fc_f16_convert: return "fc_f16_convert";
    case Kind::fc_bf16: return "fc_bf16";
    case Kind::bmm_f32: return "bmm_f32";
    case Kind::op_fc_conv_f32: return "op_fc_conv_f32";
  }
  return "?";
}

bool kind_from_name(const std::string& name, Kind* out) {
  for (Kind k : all_kinds())
    if (name == kind_name(k)) {
      *out = k;
      return true;
    }
  return false;
}

Weight& Model::add(const std::string& name, std::size_t size) {
  Weight w;
  w.name = prefix_ + name;
  w.size = size;
  // 64-byte aligned, `shift` bytes in; XNN_EXTRA_BYTES of slack after the data.
  w.storage.reset(new unsigned char[size + shift_ + 64 + 64]);
  auto base = reinterpret_cast<std::uintptr_t>(w.storage.get());
  w.data = reinterpret_cast<void*>((base + 63) / 64 * 64 + shift_);
  std::memset(w.storage.get(), 0, size + shift_ + 128);
  weights_.push_back(std::move(w));
  return weights_.back();
}

Model::Model(Kind kind, std::uint64_t seed, std::size_t shift, std::string prefix)
    : kind_(kind), shift_(shift), prefix_(std::move(prefix)) {
  weights_.reserve(16);  // add() returns references into the vector
  auto two_fc = [&](char wtype, std::size_t per_row_num, std::size_t per_row_den, bool scales, bool block_scales) {
    const std::size_t dims[2][2] = {{kHidden, kIn}, {kOut, kHidden}};
    for (int l = 0; l < 2; ++l) {
      const std::string n = "fc" + std::to_string(l + 1);
      const std::size_t rows = dims[l][0], cols = dims[l][1];
      fill(add(n + ".weight", rows * cols * per_row_num / per_row_den), seed, wtype);
      fill(add(n + ".bias", rows * 4), seed, 'f');
      if (scales) fill(add(n + ".scale", rows * 4), seed, 's');
      if (block_scales) fill(add(n + ".scale", rows * (cols / kBlock) * 2), seed, 'S');
    }
  };
  switch (kind) {
    case Kind::fc_f32: two_fc('f', 4, 1, false, false); break;
    case Kind::fc_qd8_qc8w: two_fc('b', 1, 1, true, false); break;
    case Kind::fc_qd8_qc4w: two_fc('n', 1, 2, true, false); break;
    case Kind::fc_qd8_qb4w: two_fc('n', 1, 2, false, true); break;
    case Kind::conv_f32:
      fill(add("conv1.weight", kConvOut * 9 * kConvIn * 4), seed, 'f');
      fill(add("conv1.bias", kConvOut * 4), seed, 'f');
      fill(add("conv2.weight", kConvOut * 9 * kConvOut * 4), seed, 'f');
      fill(add("conv2.bias", kConvOut * 4), seed, 'f');
      break;
    case Kind::conv_qs8: {
      fill(add("conv1.weight", kConvOut * 9 * kConvIn), seed, 'b');
      fill(add("conv1.bias", kConvOut * 4), seed, 'i');
      fill(add("conv1.scale", kConvOut * 4), seed, 's');
      add("conv1.bias_scale", kConvOut * 4);
      fill(add("conv2.weight", kConvOut * 9 * kConvOut), seed, 'b');
      fill(add("conv2.bias", kConvOut * 4), seed, 'i');
      fill(add("conv2.scale", kConvOut * 4), seed, 's');
      add("conv2.bias_scale", kConvOut * 4);
      // A bias's scale is the product of its input's and its filter's (XNNPACK checks it).
      for (int l = 0; l < 2; ++l) {
        const auto* fs = static_cast<const float*>(weights_[l * 4 + 2].data);
        auto* bs = static_cast<float*>(weights_[l * 4 + 3].data);
        for (std::size_t i = 0; i < kConvOut; ++i) bs[i] = (l == 0 ? kQs8InScale : kQs8MidScale) * fs[i];
      }
      break;
    }
    case Kind::dwconv_f32:
      fill(add("dw1.weight", 9 * kDwChannels * 4), seed, 'f');
      fill(add("dw1.bias", kDwChannels * 4), seed, 'f');
      fill(add("dw2.weight", 9 * kDwChannels * 4), seed, 'f');
      fill(add("dw2.bias", kDwChannels * 4), seed, 'f');
      break;
    case Kind::fc_f16:
      fill(add("fc.weight", kHidden * kIn * 2), seed, 'h');
      fill(add("fc.bias", kHidden * 2), seed, 'h');
      break;
    case Kind::fc_f16_convert:
      fill(add("fc.weight", kHidden * kIn * 2), seed, 'h');
      fill(add("fc.bias", kHidden * 4), seed, 'f');
      break;
    case Kind::fc_bf16: fill(add("fc.weight", kHidden * kIn * 2), seed, 'B'); break;
    case Kind::bmm_f32: fill(add("bmm.rhs", kBmmK * kBmmN * 4), seed, 'f'); break;
    case Kind::op_fc_conv_f32:
      fill(add("fc.weight", kHidden * kIn * 4), seed, 'f');
      fill(add("fc.bias", kHidden * 4), seed, 'f');
      fill(add("conv.weight", kConvOut * 9 * kConvIn * 4), seed, 'f');
      fill(add("conv.bias", kConvOut * 4), seed, 'f');
      break;
  }
}

std::size_t Model::packed_nodes() const {
  switch (kind_) {
    case Kind::fc_f16:
    case Kind::fc_bf16: return 1;
    // Where this XNNPACK packs without the weights cache (what it would take to cache them is
    // XNNPACK's to change; the suite notices when it does):
    // - a batch-matrix-multiply's static right-hand side goes into the operator's own memory
    //   (xnn_create_batch_matrix_multiply_nc_*_const_weights takes no weights cache);
    // - a convert node from static fp16 weights is left in place (its fp32 fallback skips
    //   converts), so the fully-connected node sees dynamic weights and packs them at every run.
    case Kind::fc_f16_convert:
    case Kind::bmm_f32: return 0;
    default: return 2;
  }
}

std::size_t Model::input_bytes(std::size_t batch) const {
  switch (kind_) {
    case Kind::fc_f32:
    case Kind::fc_qd8_qc8w:
    case Kind::fc_qd8_qc4w:
    case Kind::fc_qd8_qb4w: return batch * kIn * 4;
    case Kind::fc_f16:
    case Kind::fc_bf16: return batch * kIn * 2;
    case Kind::fc_f16_convert: return batch * kIn * 4;
    case Kind::conv_f32: return batch * kHW * kHW * kConvIn * 4;
    case Kind::conv_qs8: return batch * kHW * kHW * kConvIn;
    case Kind::dwconv_f32: return batch * kHW * kHW * kDwChannels * 4;
    case Kind::bmm_f32: return batch * kBmmK * 4;
    case Kind::op_fc_conv_f32: return batch * kIn * 4 + batch * kHW * kHW * kConvIn * 4;
  }
  return 0;
}

std::size_t Model::output_bytes(std::size_t batch) const {
  switch (kind_) {
    case Kind::fc_f32:
    case Kind::fc_qd8_qc8w:
    case Kind::fc_qd8_qc4w:
    case Kind::fc_qd8_qb4w: return batch * kOut * 4;
    case Kind::fc_f16: return batch * kHidden * 2;
    case Kind::fc_f16_convert: return batch * kHidden * 4;
    case Kind::fc_bf16: return batch * kHidden * 4;
    case Kind::conv_f32: return batch * kHW * kHW * kConvOut * 4;
    case Kind::conv_qs8: return batch * kHW * kHW * kConvOut;
    case Kind::dwconv_f32: return batch * kHW * kHW * kDwChannels * 4;
    case Kind::bmm_f32: return batch * kBmmN * 4;
    case Kind::op_fc_conv_f32: return batch * kHidden * 4 + batch * kHW * kHW * kConvOut * 4;
  }
  return 0;
}

std::vector<unsigned char> Model::make_input(std::size_t batch) const {
  std::vector<unsigned char> in(input_bytes(batch) + kInputPadding);
  Rng r{0x5eed0000u + batch * 7919u + static_cast<unsigned>(kind_)};
  const std::size_t n = input_bytes(batch);
  switch (kind_) {
    case Kind::fc_f16:
      for (std::size_t i = 0; i < n / 2; ++i) {
        const std::uint16_t h = random_fp16(r);
        std::memcpy(&in[2 * i], &h, 2);
      }
      break;
    case Kind::fc_bf16:
      for (std::size_t i = 0; i < n / 2; ++i) {
        const std::uint16_t h = random_bf16(r);
        std::memcpy(&in[2 * i], &h, 2);
      }
      break;
    case Kind::conv_qs8:
      for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<unsigned char>(r.next());
      break;
    default:
      for (std::size_t i = 0; i < n / 4; ++i) {
        const float f = r.unit();
        std::memcpy(&in[4 * i], &f, 4);
      }
  }
  return in;
}

std::string Model::digest() const {
  std::uint64_t h = fnv(kind_name(kind_), std::strlen(kind_name(kind_)));
  for (const auto& w : weights_) {
    h = fnv(w.name.data(), w.name.size(), h);
    h = fnv(w.data, w.size, h);
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "fnv1a64:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool Model::name_buffers(wc_xnn_adapter* adapter) const {
  for (const auto& w : weights_)
    if (wc_xnn_adapter_name_buffer(adapter, w.data, w.name.c_str()) != WC_OK) return false;
  return true;
}

// ---- building and running ----------------------------------------------------------------------

namespace {

#define RETURN_IF_FAILED(expr)                         \
  do {                                                 \
    const xnn_status status_ = (expr);                 \
    if (status_ != xnn_status_success) return status_; \
  } while (0)

constexpr uint32_t kInputId = 0, kOutputId = 1;

xnn_status tensor(xnn_subgraph_t g, xnn_datatype t, std::vector<std::size_t> dims, const void* data, uint32_t* id,
                  uint32_t external = XNN_INVALID_VALUE_ID, uint32_t flags = 0) {
  return xnn_define_tensor_value(g, t, dims.size(), dims.data(), data, external, flags, id);
}

xnn_status define_two_fc(xnn_subgraph_t g, const Model& m, std::size_t batch) {
  const Kind kind = m.kind();
  const bool quantized = kind != Kind::fc_f32;
  uint32_t in = 0, out = 0;
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {batch, kIn}, nullptr, &in, kInputId, XNN_VALUE_FLAG_EXTERNAL_INPUT));
  RETURN_IF_FAILED(
      tensor(g, xnn_datatype_fp32, {batch, kOut}, nullptr, &out, kOutputId, XNN_VALUE_FLAG_EXTERNAL_OUTPUT));
  uint32_t hidden = 0;
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {batch, kHidden}, nullptr, &hidden));
  const std::size_t per_layer = kind == Kind::fc_f32 ? 2 : 3;
  const std::size_t shapes[2][2] = {{kHidden, kIn}, {kOut, kHidden}};
  for (int l = 0; l < 2; ++l) {
    const Weight& weight = m.w(l * per_layer);
    const Weight& bias = m.w(l * per_layer + 1);
    const std::size_t rows = shapes[l][0], cols = shapes[l][1];
    const std::size_t fdims[2] = {rows, cols};
    uint32_t src = l == 0 ? in : hidden, dst = l == 0 ? hidden : out;
    uint32_t filter = 0, bias_id = 0;
    RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {rows}, bias.data, &bias_id));
    switch (kind) {
      case Kind::fc_f32: RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {rows, cols}, weight.data, &filter)); break;
      case Kind::fc_qd8_qc8w:
        RETURN_IF_FAILED(xnn_define_channelwise_quantized_tensor_value(
            g, xnn_datatype_qcint8, static_cast<const float*>(m.w(l * per_layer + 2).data), 2, 0, fdims, weight.data,
            XNN_INVALID_VALUE_ID, 0, &filter));
        break;
      case Kind::fc_qd8_qc4w:
        RETURN_IF_FAILED(xnn_define_channelwise_quantized_tensor_value_v2(
            g, xnn_datatype_qcint4, /*zero_point=*/8, static_cast<const float*>(m.w(l * per_layer + 2).data), 2, 0,
            fdims, weight.data, XNN_INVALID_VALUE_ID, 0, &filter));
        break;
      case Kind::fc_qd8_qb4w:
        RETURN_IF_FAILED(xnn_define_blockwise_quantized_tensor_value_v2(
            g, xnn_datatype_qbint4, /*zero_point=*/8, m.w(l * per_layer + 2).data, 2, 0, kBlock, fdims, weight.data,
            XNN_INVALID_VALUE_ID, 0, xnn_datatype_bf16, &filter));
        break;
      default: return xnn_status_invalid_parameter;
    }
    if (quantized) {
      const std::size_t qdims[2] = {batch, cols};
      uint32_t q = 0;
      RETURN_IF_FAILED(xnn_define_dynamically_quantized_tensor_value(g, xnn_datatype_qdint8, 2, 1, qdims,
                                                                     XNN_INVALID_VALUE_ID, 0, &q));
      RETURN_IF_FAILED(xnn_define_unary(g, xnn_unary_convert, nullptr, src, q, 0));
      src = q;
    }
    RETURN_IF_FAILED(xnn_define_fully_connected(g, -INFINITY, INFINITY, src, filter, bias_id, dst, 0));
  }
  return xnn_status_success;
}

xnn_status define_conv_f32(xnn_subgraph_t g, const Model& m, std::size_t batch) {
  uint32_t in = 0, mid = 0, out = 0, w1 = 0, b1 = 0, w2 = 0, b2 = 0;
  RETURN_IF_FAILED(
      tensor(g, xnn_datatype_fp32, {batch, kHW, kHW, kConvIn}, nullptr, &in, kInputId, XNN_VALUE_FLAG_EXTERNAL_INPUT));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {batch, kHW, kHW, kConvOut}, nullptr, &mid));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {batch, kHW, kHW, kConvOut}, nullptr, &out, kOutputId,
                          XNN_VALUE_FLAG_EXTERNAL_OUTPUT));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {kConvOut, 3, 3, kConvIn}, m.w(0).data, &w1));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {kConvOut}, m.w(1).data, &b1));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {kConvOut, 3, 3, kConvOut}, m.w(2).data, &w2));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {kConvOut}, m.w(3).data, &b2));
  RETURN_IF_FAILED(xnn_define_convolution_2d(g, 1, 1, 1, 1, 3, 3, 1, 1, 1, 1, 1, kConvIn, kConvOut, -INFINITY, INFINITY,
                                             in, w1, b1, mid, 0));
  RETURN_IF_FAILED(xnn_define_convolution_2d(g, 1, 1, 1, 1, 3, 3, 1, 1, 1, 1, 1, kConvOut, kConvOut, -INFINITY,
                                             INFINITY, mid, w2, b2, out, 0));
  return xnn_status_success;
}

xnn_status define_conv_qs8(xnn_subgraph_t g, const Model& m, std::size_t batch) {
  uint32_t in = 0, mid = 0, out = 0;
  const std::size_t in_dims[4] = {batch, kHW, kHW, kConvIn}, out_dims[4] = {batch, kHW, kHW, kConvOut};
  RETURN_IF_FAILED(xnn_define_quantized_tensor_value(g, xnn_datatype_qint8, kQs8InZero, kQs8InScale, 4, in_dims,
                                                     nullptr, kInputId, XNN_VALUE_FLAG_EXTERNAL_INPUT, &in));
  RETURN_IF_FAILED(xnn_define_quantized_tensor_value(g, xnn_datatype_qint8, kQs8MidZero, kQs8MidScale, 4, out_dims,
                                                     nullptr, XNN_INVALID_VALUE_ID, 0, &mid));
  RETURN_IF_FAILED(xnn_define_quantized_tensor_value(g, xnn_datatype_qint8, kQs8OutZero, kQs8OutScale, 4, out_dims,
                                                     nullptr, kOutputId, XNN_VALUE_FLAG_EXTERNAL_OUTPUT, &out));
  for (int l = 0; l < 2; ++l) {
    const std::size_t cin = l == 0 ? kConvIn : kConvOut;
    const std::size_t fdims[4] = {kConvOut, 3, 3, cin}, bdims[1] = {kConvOut};
    uint32_t w = 0, b = 0;
    RETURN_IF_FAILED(xnn_define_channelwise_quantized_tensor_value(
        g, xnn_datatype_qcint8, static_cast<const float*>(m.w(l * 4 + 2).data), 4, 0, fdims, m.w(l * 4).data,
        XNN_INVALID_VALUE_ID, 0, &w));
    RETURN_IF_FAILED(xnn_define_channelwise_quantized_tensor_value(
        g, xnn_datatype_qcint32, static_cast<const float*>(m.w(l * 4 + 3).data), 1, 0, bdims, m.w(l * 4 + 1).data,
        XNN_INVALID_VALUE_ID, 0, &b));
    RETURN_IF_FAILED(xnn_define_convolution_2d(g, 1, 1, 1, 1, 3, 3, 1, 1, 1, 1, 1, cin, kConvOut, -INFINITY, INFINITY,
                                               l == 0 ? in : mid, w, b, l == 0 ? mid : out, 0));
  }
  return xnn_status_success;
}

xnn_status define_dwconv(xnn_subgraph_t g, const Model& m, std::size_t batch) {
  uint32_t in = 0, mid = 0, out = 0;
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {batch, kHW, kHW, kDwChannels}, nullptr, &in, kInputId,
                          XNN_VALUE_FLAG_EXTERNAL_INPUT));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {batch, kHW, kHW, kDwChannels}, nullptr, &mid));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {batch, kHW, kHW, kDwChannels}, nullptr, &out, kOutputId,
                          XNN_VALUE_FLAG_EXTERNAL_OUTPUT));
  for (int l = 0; l < 2; ++l) {
    uint32_t w = 0, b = 0;
    RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {1, 3, 3, kDwChannels}, m.w(l * 2).data, &w));
    RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {kDwChannels}, m.w(l * 2 + 1).data, &b));
    RETURN_IF_FAILED(xnn_define_depthwise_convolution_2d(g, 1, 1, 1, 1, 3, 3, 1, 1, 1, 1, 1, kDwChannels, -INFINITY,
                                                         INFINITY, l == 0 ? in : mid, w, b, l == 0 ? mid : out, 0));
  }
  return xnn_status_success;
}

xnn_status define_fc_half(xnn_subgraph_t g, const Model& m, std::size_t batch) {
  const bool bf16 = m.kind() == Kind::fc_bf16;
  const xnn_datatype t = bf16 ? xnn_datatype_bf16 : xnn_datatype_fp16;
  uint32_t in = 0, out = 0, w = 0, b = XNN_INVALID_VALUE_ID;
  RETURN_IF_FAILED(tensor(g, t, {batch, kIn}, nullptr, &in, kInputId, XNN_VALUE_FLAG_EXTERNAL_INPUT));
  RETURN_IF_FAILED(tensor(g, bf16 ? xnn_datatype_fp32 : xnn_datatype_fp16, {batch, kHidden}, nullptr, &out, kOutputId,
                          XNN_VALUE_FLAG_EXTERNAL_OUTPUT));
  RETURN_IF_FAILED(tensor(g, t, {kHidden, kIn}, m.w(0).data, &w));
  if (!bf16) RETURN_IF_FAILED(tensor(g, t, {kHidden}, m.w(1).data, &b));
  return xnn_define_fully_connected(g, -INFINITY, INFINITY, in, w, b, out, 0);
}

xnn_status define_fc_f16_convert(xnn_subgraph_t g, const Model& m, std::size_t batch) {
  uint32_t in = 0, out = 0, w16 = 0, w32 = 0, b = 0;
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {batch, kIn}, nullptr, &in, kInputId, XNN_VALUE_FLAG_EXTERNAL_INPUT));
  RETURN_IF_FAILED(
      tensor(g, xnn_datatype_fp32, {batch, kHidden}, nullptr, &out, kOutputId, XNN_VALUE_FLAG_EXTERNAL_OUTPUT));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp16, {kHidden, kIn}, m.w(0).data, &w16));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {kHidden, kIn}, nullptr, &w32));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {kHidden}, m.w(1).data, &b));
  RETURN_IF_FAILED(xnn_define_unary(g, xnn_unary_convert, nullptr, w16, w32, 0));
  return xnn_define_fully_connected(g, -INFINITY, INFINITY, in, w32, b, out, 0);
}

xnn_status define_bmm(xnn_subgraph_t g, const Model& m, std::size_t batch) {
  uint32_t a = 0, b = 0, out = 0;
  RETURN_IF_FAILED(
      tensor(g, xnn_datatype_fp32, {1, batch, kBmmK}, nullptr, &a, kInputId, XNN_VALUE_FLAG_EXTERNAL_INPUT));
  RETURN_IF_FAILED(tensor(g, xnn_datatype_fp32, {1, kBmmK, kBmmN}, m.w(0).data, &b));
  RETURN_IF_FAILED(
      tensor(g, xnn_datatype_fp32, {1, batch, kBmmN}, nullptr, &out, kOutputId, XNN_VALUE_FLAG_EXTERNAL_OUTPUT));
  return xnn_define_batch_matrix_multiply(g, a, b, out, 0);
}

xnn_status define(xnn_subgraph_t g, const Model& m, std::size_t batch) {
  switch (m.kind()) {
    case Kind::fc_f32:
    case Kind::fc_qd8_qc8w:
    case Kind::fc_qd8_qc4w:
    case Kind::fc_qd8_qb4w: return define_two_fc(g, m, batch);
    case Kind::conv_f32: return define_conv_f32(g, m, batch);
    case Kind::conv_qs8: return define_conv_qs8(g, m, batch);
    case Kind::dwconv_f32: return define_dwconv(g, m, batch);
    case Kind::fc_f16:
    case Kind::fc_bf16: return define_fc_half(g, m, batch);
    case Kind::fc_f16_convert: return define_fc_f16_convert(g, m, batch);
    case Kind::bmm_f32: return define_bmm(g, m, batch);
    case Kind::op_fc_conv_f32: break;
  }
  return xnn_status_invalid_parameter;
}

std::vector<std::size_t> input_dims(Kind kind, std::size_t batch) {
  switch (kind) {
    case Kind::conv_f32:
    case Kind::conv_qs8: return {batch, kHW, kHW, kConvIn};
    case Kind::dwconv_f32: return {batch, kHW, kHW, kDwChannels};
    case Kind::bmm_f32: return {1, batch, kBmmK};
    default: return {batch, kIn};
  }
}

}  // namespace

Instance::~Instance() { destroy(); }

void Instance::destroy() {
  if (runtime_ != nullptr) xnn_delete_runtime(runtime_);
  runtime_ = nullptr;
  for (xnn_operator_t op : ops_) xnn_delete_operator(op);
  ops_.clear();
}

xnn_status Instance::create(const Model& model, xnn_weights_cache_t cache, pthreadpool_t threadpool) {
  destroy();
  model_ = &model;
  threadpool_ = threadpool;
  if (model.kind() == Kind::op_fc_conv_f32) {
    xnn_operator_t fc = nullptr, conv = nullptr;
    RETURN_IF_FAILED(xnn_create_fully_connected_nc_f32(
        kIn, kHidden, kIn, kHidden, static_cast<const float*>(model.w(0).data),
        static_cast<const float*>(model.w(1).data), -INFINITY, INFINITY, 0, cache, &fc));
    ops_.push_back(fc);
    RETURN_IF_FAILED(xnn_create_convolution2d_nhwc_f32(1, 1, 1, 1, 3, 3, 1, 1, 1, 1, 1, kConvIn, kConvOut, kConvIn,
                                                       kConvOut, static_cast<const float*>(model.w(2).data),
                                                       static_cast<const float*>(model.w(3).data), -INFINITY, INFINITY,
                                                       0, cache, &conv));
    ops_.push_back(conv);
    return xnn_status_success;
  }
  // A fresh subgraph per runtime: creating a runtime rewrites its subgraph.
  xnn_subgraph_t g = nullptr;
  RETURN_IF_FAILED(xnn_create_subgraph(2, 0, &g));
  xnn_status status = define(g, model, 2);
  if (status == xnn_status_success) status = xnn_create_runtime_v4(g, cache, nullptr, threadpool, 0, &runtime_);
  xnn_delete_subgraph(g);
  return status;
}

xnn_status Instance::run(std::size_t batch, const std::vector<unsigned char>& input, std::vector<unsigned char>* output,
                         std::string* where) {
  auto fail = [&](xnn_status s, const char* step) {
    if (where != nullptr) *where = step;
    return s;
  };
  if (model_ == nullptr) return fail(xnn_status_uninitialized, "create");
  output->assign(model_->output_bytes(batch), 0);
  if (model_->kind() == Kind::op_fc_conv_f32) {
    const auto* in = reinterpret_cast<const float*>(input.data());
    auto* out = reinterpret_cast<float*>(output->data());
    xnn_status s = xnn_reshape_fully_connected_nc_f32(ops_[0], batch, threadpool_);
    if (s != xnn_status_success) return fail(s, "reshape fully-connected operator");
    s = xnn_setup_fully_connected_nc_f32(ops_[0], in, out);
    if (s != xnn_status_success) return fail(s, "setup fully-connected operator");
    s = xnn_run_operator(ops_[0], threadpool_);
    if (s != xnn_status_success) return fail(s, "run fully-connected operator");
    std::size_t ws_size = 0, oh = 0, ow = 0;
    s = xnn_reshape_convolution2d_nhwc_f32(ops_[1], batch, kHW, kHW, &ws_size, &oh, &ow, threadpool_);
    if (s != xnn_status_success) return fail(s, "reshape convolution operator");
    workspace_.assign(ws_size + 128, 0);
    void* ws = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(workspace_.data()) + 127) / 128 * 128);
    s = xnn_setup_convolution2d_nhwc_f32(ops_[1], ws, in + batch * kIn, out + batch * kHidden);
    if (s != xnn_status_success) return fail(s, "setup convolution operator");
    s = xnn_run_operator(ops_[1], threadpool_);
    if (s != xnn_status_success) return fail(s, "run convolution operator");
    return xnn_status_success;
  }
  const auto dims = input_dims(model_->kind(), batch);
  xnn_status s = xnn_reshape_external_value(runtime_, kInputId, dims.size(), dims.data());
  if (s != xnn_status_success) return fail(s, "reshape input");
  s = xnn_reshape_runtime(runtime_);
  if (s != xnn_status_success) return fail(s, "reshape runtime");
  scratch_ = input;  // XNNPACK may read past the end of an input: keep the padding
  const xnn_external_value ext[2] = {{kInputId, scratch_.data()}, {kOutputId, output->data()}};
  s = xnn_setup_runtime_v2(runtime_, 2, ext);
  if (s != xnn_status_success) return fail(s, "setup runtime");
  s = xnn_invoke_runtime(runtime_);
  if (s != xnn_status_success) return fail(s, "invoke runtime");
  return xnn_status_success;
}

xnn_status run_uncached(const Model& model, std::size_t batch, pthreadpool_t threadpool,
                        std::vector<unsigned char>* output) {
  Instance inst;
  RETURN_IF_FAILED(inst.create(model, nullptr, threadpool));
  return inst.run(batch, model.make_input(batch), output);
}

// ---- the counting provider ----------------------------------------------------------------------

namespace {
CountingProvider* self(void* context) { return static_cast<CountingProvider*>(context); }
xnn_weights_cache_provider* inner_of(void* context) { return self(context)->inner(); }
}  // namespace

CountingProvider::CountingProvider(void* inner) : inner_(static_cast<xnn_weights_cache_provider*>(inner)) {
  provider_.context = this;
  provider_.look_up = [](void* c, const xnn_weights_cache_look_up_key* k) -> size_t {
    ++self(c)->look_up;
    return inner_of(c)->look_up(inner_of(c)->context, k);
  };
  provider_.reserve_space = [](void* c, size_t n) -> void* {
    ++self(c)->reserve_space;
    return inner_of(c)->reserve_space(inner_of(c)->context, n);
  };
  provider_.look_up_or_insert = [](void* c, const xnn_weights_cache_look_up_key* k, void* p, size_t n) -> size_t {
    ++self(c)->look_up_or_insert;
    if (p == nullptr) ++self(c)->null_inserts;
    return inner_of(c)->look_up_or_insert(inner_of(c)->context, k, p, n);
  };
  provider_.is_finalized = [](void* c) -> bool {
    ++self(c)->is_finalized;
    return inner_of(c)->is_finalized(inner_of(c)->context);
  };
  provider_.offset_to_addr = [](void* c, size_t off) -> void* {
    ++self(c)->offset_to_addr;
    return inner_of(c)->offset_to_addr(inner_of(c)->context, off);
  };
  provider_.delete_cache = [](void* c) -> xnn_status {
    ++self(c)->delete_cache;
    return inner_of(c)->delete_cache(inner_of(c)->context);
  };
  provider_.alias_data = [](void* c, void* alias, void* original) -> xnn_status {
    ++self(c)->alias_data;
    return inner_of(c)->alias_data(inner_of(c)->context, alias, original);
  };
}

std::vector<unsigned char> compat_key(const Model& model, bool other_build) {
  const auto* id = static_cast<const unsigned char*>(xnn_experimental_get_build_identifier_data());
  std::vector<unsigned char> build(id, id + xnn_experimental_get_build_identifier_size());
  if (other_build && !build.empty()) build[0] ^= 0xff;
  const std::string digest = model.digest();
  static const char kOptions[] = "xnn_flags=0";
  std::size_t size = 0;
  if (wc_xnn_compat_key(build.data(), build.size(), digest.data(), digest.size(), kOptions, sizeof kOptions - 1,
                        nullptr, 0, &size) != WC_OK)
    return {};
  std::vector<unsigned char> key(size);
  if (wc_xnn_compat_key(build.data(), build.size(), digest.data(), digest.size(), kOptions, sizeof kOptions - 1,
                        key.data(), key.size(), &size) != WC_OK)
    return {};
  return key;
}

wc_status open_cache(const std::string& path, const std::vector<unsigned char>& key, wc_cache** out) {
  wc_options o;
  wc_options_init(&o);
  o.path = path.c_str();
  o.compat_key = key.data();
  o.compat_key_size = key.size();
  o.backing = WC_BACKING_FILE;
  o.durability = WC_DURABILITY_NONE;
  return wc_open(&o, out);
}

}  // namespace weightcache::xnn_real
