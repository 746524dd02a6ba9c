// The provider's layers: XNNPACK fully-connected operators packing through weightcache's XNNPACK
// adapter, or the provider's own packer and GEMM packing through wc_reserve_space.
#include "kernels.hpp"

#include "ort_util.hpp"

#include <weightcache/xnnpack.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <cstdint>
#include <limits>
#include <mutex>

#ifdef WEIGHTCACHE_ORT_EP_XNNPACK
#include <pthreadpool.h>
#include <xnnpack.h>
#endif

namespace weightcache::ort {

void apply_epilogue(float* y, std::size_t count, float alpha, Activation activation, bool relu_done) noexcept {
  if (alpha != 1.0f)
    for (std::size_t i = 0; i < count; ++i) y[i] *= alpha;
  if (activation == Activation::relu && !relu_done) {
    // A NaN stays NaN, as in ONNX Runtime's Relu.
    for (std::size_t i = 0; i < count; ++i) y[i] = (y[i] > 0.0f || std::isnan(y[i])) ? y[i] : 0.0f;
  } else if (activation == Activation::gelu) {
    // The exact (erf) form, as ONNX's Gelu with approximate="none" and com.microsoft.Gelu.
    constexpr float kInvSqrt2 = 0.70710678118654752440f;
    for (std::size_t i = 0; i < count; ++i) y[i] = 0.5f * y[i] * (1.0f + std::erf(y[i] * kInvSqrt2));
  }
}

// ---- the provider's own packer and GEMM ------------------------------------------------------

void Linear::run_quantized(const std::uint8_t* a, bool a_unsigned, std::size_t m, std::size_t k, std::int32_t zero_point, float scale,
                           float* y) {
  // Dequantized exactly ((a - zero_point) is an integer of at most 9 bits) and computed in f32.
  if (m == 0) return;
  std::vector<float> f(m * k);
  for (std::size_t i = 0; i < f.size(); ++i) {
    const std::int32_t v = a_unsigned ? static_cast<std::int32_t>(a[i]) : static_cast<std::int32_t>(static_cast<std::int8_t>(a[i]));
    f[i] = static_cast<float>(v - zero_point) * scale;
  }
  run(f.data(), m, y);
}

namespace {

constexpr std::size_t kPanel = 8;  // output columns per packed panel

// Packed layout (key "ort-builtin/1"): ceil(N/8) panels of K x 8 floats (columns 8p..8p+7, zero
// beyond N), then the bias rounded up to whole panels (zero when the layer has none).
std::size_t builtin_packed_floats(std::size_t k, std::size_t n) {
  const std::size_t panels = (n + kPanel - 1) / kPanel;
  return panels * kPanel * k + panels * kPanel;
}

void builtin_pack(const LinearSpec& s, float* out) {
  const std::size_t panels = (s.n + kPanel - 1) / kPanel;
  const auto* w = static_cast<const float*>(s.weights);
  for (std::size_t p = 0; p < panels; ++p) {
    float* panel = out + p * kPanel * s.k;
    for (std::size_t kk = 0; kk < s.k; ++kk)
      for (std::size_t j = 0; j < kPanel; ++j) {
        const std::size_t col = p * kPanel + j;
        panel[kk * kPanel + j] = col >= s.n ? 0.0f : s.weights_kn ? w[kk * s.n + col] : w[col * s.k + kk];
      }
  }
  float* bias = out + panels * kPanel * s.k;
  for (std::size_t j = 0; j < panels * kPanel; ++j) bias[j] = j < s.bias.size() ? s.bias[j] : 0.0f;
}

class BuiltinLinear final : public Linear {
 public:
  BuiltinLinear(const LinearSpec& s, const float* packed, std::vector<float> heap)
      : k_(s.k), n_(s.n), alpha_(s.alpha), activation_(s.activation), packed_(packed), heap_(std::move(heap)) {
    if (packed_ == nullptr) packed_ = heap_.data();
  }

  void run(const float* a, std::size_t m, float* y) override {
    const std::size_t panels = (n_ + kPanel - 1) / kPanel;
    const float* bias = packed_ + panels * kPanel * k_;
    for (std::size_t row = 0; row < m; ++row) {
      const float* x = a + row * k_;
      float* out = y + row * n_;
      for (std::size_t p = 0; p < panels; ++p) {
        const float* panel = packed_ + p * kPanel * k_;
        float acc[kPanel];
        for (std::size_t j = 0; j < kPanel; ++j) acc[j] = 0.0f;
        for (std::size_t kk = 0; kk < k_; ++kk) {
          const float xv = x[kk];
          const float* wrow = panel + kk * kPanel;
          for (std::size_t j = 0; j < kPanel; ++j) acc[j] += xv * wrow[j];
        }
        const std::size_t cols = std::min(kPanel, n_ - p * kPanel);
        for (std::size_t j = 0; j < cols; ++j) out[p * kPanel + j] = acc[j] + bias[p * kPanel + j];
      }
    }
    apply_epilogue(y, m * n_, alpha_, activation_, false);
  }

 private:
  std::size_t k_, n_;
  float alpha_;
  Activation activation_;
  const float* packed_;      // in the cache (valid until it closes) or heap_
  std::vector<float> heap_;  // the fallback when the cache could not take the packed weights
};

}  // namespace

std::unique_ptr<Linear> create_builtin(const LinearSpec& s, const PackTarget& t, CreateReport* report) {
  if (s.kind != LinearSpec::Kind::f32)
    throw OrtError{ORT_NOT_IMPLEMENTED, "the built-in GEMM computes f32 layers only"};
  const std::size_t floats = builtin_packed_floats(s.k, s.n);
  const std::size_t bytes = floats * sizeof(float);
  report->bytes = bytes;
  // The key names the layout and everything packing reads: the weights' and the bias's identity.
  std::string key = "ort-builtin/1|" + std::to_string(s.k) + "x" + std::to_string(s.n) + (s.weights_kn ? "|kn|" : "|nk|");
  key += std::to_string(s.weights_name.size()) + ":" + s.weights_name + "|";
  key += std::to_string(s.bias_name.size()) + ":" + s.bias_name;
  if (t.use_cache && t.cache != nullptr) {
    std::size_t off = wc_look_up(t.cache, key.data(), key.size());
    if (off == SIZE_MAX) {
      void* p = wc_reserve_space(t.cache, bytes);
      if (p == nullptr) report->why = wc_last_error();
      if (p != nullptr) {
        builtin_pack(s, static_cast<float*>(p));
        off = wc_look_up_or_insert(t.cache, key.data(), key.size(), p, bytes);
        if (off == SIZE_MAX) (void)wc_release_space(t.cache, p);
        report->packed = true;
      }
    }
    if (off != SIZE_MAX) {
      if (const void* p = wc_offset_to_addr(t.cache, off); p != nullptr)
        return std::make_unique<BuiltinLinear>(s, static_cast<const float*>(p), std::vector<float>{});
    }
  }
  std::vector<float> heap(floats);
  builtin_pack(s, heap.data());
  report->packed = true;
  report->in_heap = true;
  return std::make_unique<BuiltinLinear>(s, nullptr, std::move(heap));
}

namespace {

struct ParallelJob {
  const std::function<void(std::size_t)>* fn;
  std::vector<std::exception_ptr> errors;
};

void run_one(ParallelJob* job, std::size_t i) noexcept {
  try {
    (*job->fn)(i);
  } catch (...) {
    job->errors[i] = std::current_exception();
  }
}

}  // namespace

void parallel_for(void* threadpool, std::size_t count, const std::function<void(std::size_t)>& fn) {
  ParallelJob job{&fn, std::vector<std::exception_ptr>(count)};
#ifdef WEIGHTCACHE_ORT_EP_XNNPACK
  if (threadpool != nullptr && count > 1) {
    pthreadpool_parallelize_1d(
        static_cast<pthreadpool_t>(threadpool),
        [](void* c, size_t i) { run_one(static_cast<ParallelJob*>(c), i); }, &job, count, 0);
  } else
#endif
  {
    (void)threadpool;
    for (std::size_t i = 0; i < count; ++i) run_one(&job, i);
  }
  for (auto& e : job.errors)
    if (e) std::rethrow_exception(e);
}

bool conv_output_size(const ConvSpec& s, std::size_t h, std::size_t w, std::size_t* oh, std::size_t* ow) noexcept {
  const std::size_t eh = (s.kh - 1) * s.dh + 1, ew = (s.kw - 1) * s.dw + 1;
  const std::size_t ph = h + s.pad_top + s.pad_bottom, pw = w + s.pad_left + s.pad_right;
  if (ph < eh || pw < ew) return false;  // an empty input with pads still has an output (all bias)
  *oh = (ph - eh) / s.sh + 1;
  *ow = (pw - ew) / s.sw + 1;
  return true;
}

// ---- XNNPACK -------------------------------------------------------------------------------------

#ifdef WEIGHTCACHE_ORT_EP_XNNPACK

namespace {

bool xnn_ready() noexcept {
  static const bool ok = xnn_initialize(nullptr) == xnn_status_success;
  return ok;
}

std::uint16_t to_bf16(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (scales are finite)
  return static_cast<std::uint16_t>(u >> 16);
}

// A provider that forwards to the session adapter's, except that reserve_space can be refused on
// this thread: creating an operator in that mode succeeds only on a cache hit. The 4-bit layers
// use it to find their packed weights without the real block scales, which XNNPACK reads (and
// validates) before it looks the weights up: on a warm session the scales are never read.
thread_local bool t_hit_only = false;

struct ForwardingProvider {
  wc_xnn_weights_cache_provider self{};
  const wc_xnn_weights_cache_provider* inner = nullptr;
  // What this layer's creation reserved: one thread creates it, so plain counters serve (the
  // adapter's statistics add up every thread's).
  std::size_t reservations = 0, reserved_bytes = 0;

  explicit ForwardingProvider(const wc_xnn_weights_cache_provider* to) : inner(to) {
    self.context = this;
    self.look_up = [](void* c, const wc_xnn_weights_cache_look_up_key* k) {
      auto* f = static_cast<ForwardingProvider*>(c);
      return f->inner->look_up(f->inner->context, k);
    };
    self.reserve_space = [](void* c, size_t n) -> void* {
      auto* f = static_cast<ForwardingProvider*>(c);
      if (t_hit_only) return nullptr;
      void* p = f->inner->reserve_space(f->inner->context, n);
      if (p != nullptr) {
        ++f->reservations;
        f->reserved_bytes += n;
      }
      return p;
    };
    self.look_up_or_insert = [](void* c, const wc_xnn_weights_cache_look_up_key* k, void* p, size_t n) {
      auto* f = static_cast<ForwardingProvider*>(c);
      return f->inner->look_up_or_insert(f->inner->context, k, p, n);
    };
    self.is_finalized = [](void* c) {
      auto* f = static_cast<ForwardingProvider*>(c);
      return f->inner->is_finalized(f->inner->context);
    };
    self.offset_to_addr = [](void* c, size_t off) {
      auto* f = static_cast<ForwardingProvider*>(c);
      return f->inner->offset_to_addr(f->inner->context, off);
    };
    self.delete_cache = [](void* c) {
      auto* f = static_cast<ForwardingProvider*>(c);
      return f->inner->delete_cache(f->inner->context);
    };
    self.alias_data = [](void* c, void* alias, void* original) {
      auto* f = static_cast<ForwardingProvider*>(c);
      return f->inner->alias_data(f->inner->context, alias, original);
    };
  }
  xnn_weights_cache_t get() { return reinterpret_cast<xnn_weights_cache_t>(&self); }
};

std::unique_ptr<ForwardingProvider> forwarding_provider(wc_xnn_adapter* adapter) {
  return std::make_unique<ForwardingProvider>(
      static_cast<const wc_xnn_weights_cache_provider*>(wc_xnn_adapter_provider(adapter)));
}

struct XnnOp {
  xnn_operator_t op = nullptr;
  ~XnnOp() {
    if (op != nullptr) xnn_delete_operator(op);
  }
  void reset() noexcept {  // an operator whose creation is tried again
    if (op != nullptr) xnn_delete_operator(op);
    op = nullptr;
  }
};

class XnnLinear final : public Linear {
 public:
  XnnLinear(const LinearSpec& s, pthreadpool_t pool, bool relu_fused)
      : k_(s.k), n_(s.n), alpha_(s.alpha), activation_(s.activation), relu_fused_(relu_fused),
        quantized_(s.kind != LinearSpec::Kind::f32), qc8_(s.kind == LinearSpec::Kind::qc8), pool_(pool) {
    const std::size_t scales = qc8_ ? n_ : quantized_ && s.block_size != 0 ? n_ * (k_ / s.block_size) : 0;
    for (std::size_t i = 0; i < scales; ++i) {
      const float v = std::fabs(s.scales[i]);
      if (!std::isfinite(v)) continue;  // 4-bit layers with such scales run on the dequantized fallback
      scale_max_ = std::max(scale_max_, v);
      if (v != 0.0f) scale_min_ = std::min(scale_min_, v);
    }
    sum_max_ = std::min(static_cast<double>(k_) * 255.0 * 128.0, 2147483648.0);
  }

  XnnOp fc, convert;
  std::unique_ptr<ForwardingProvider> provider;  // the operator calls it at every reshape

  void run_quantized(const std::uint8_t* a, bool a_unsigned, std::size_t m, std::size_t k, std::int32_t zero_point, float scale,
                     float* y) override {
    if (!qc8_) return Linear::run_quantized(a, a_unsigned, m, k, zero_point, scale, y);
    // ONNX scales the integer sum by (A's scale x the weights'); XNNPACK by A's first, then the
    // weights', clamping (a NaN becomes -inf) and flushing subnormal values to zero. So a NaN
    // scale gives NaN everywhere, as in ONNX, and a scale the kernel cannot carry fails the run
    // instead of giving other numbers (the graph's constants were checked when the layer was
    // created).
    if (std::isnan(scale)) {
      std::fill(y, y + m * n_, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    check_row_scale(scale, kGivenScale);
    std::lock_guard<std::mutex> lock(mu_);
    // XNNPACK's qd8 input is int8 with a zero point and scale per row: uint8 is shifted by 128
    // (a - zero_point unchanged), and every row gets the tensor's one scale and zero point.
    q_.resize(m * k_ + XNN_EXTRA_BYTES);
    const std::size_t count = m * k_;
    if (a_unsigned) {
      for (std::size_t i = 0; i < count; ++i) q_[i] = static_cast<std::int8_t>(a[i] ^ 0x80u);
      zero_point -= 128;
    } else {
      std::memcpy(q_.data(), a, count);
    }
    params_.assign(m + XNN_EXTRA_QUANTIZATION_PARAMS, xnn_quantization_params{zero_point, scale});
    run_qd8(m, y);
    apply_epilogue(y, m * n_, alpha_, activation_, relu_fused_);
  }

  void run(const float* a, std::size_t m, float* y) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!quantized_) {
      check_xnn(xnn_reshape_fully_connected_nc_f32(fc.op, m, pool_), "fully-connected reshape");
      check_xnn(xnn_setup_fully_connected_nc_f32(fc.op, a, y), "fully-connected setup");
      check_xnn(xnn_run_operator(fc.op, pool_), "fully-connected run");
    } else {
      // Activations are quantized per row to int8 (XNNPACK's qd8), as its subgraph runtime does.
      // A row with a NaN or an infinity would be quantized to nonsense (and the kernel's clamp turns
      // a NaN into -inf). A NaN makes every output of its row NaN in ONNX (a 4-bit layer's), and
      // ONNX Runtime's DynamicQuantizeMatMul quantizes A as one tensor, so there a NaN makes all of
      // the outputs meaningless: NaN here. An infinity without a NaN gives infinities of signs
      // only the weights know: the run fails and says so.
      // A row of zeros gets XNNPACK's scale 1 and a zero point of -128 or 127, whose correction the
      // 4-bit kernel's rounded block sums do not cancel exactly (outputs up to 0.03 off where ONNX
      // gives exactly the bias): such a row's scale is set to 0, which makes its outputs the bias.
      bad_rows_.clear();
      zero_rows_.clear();
      for (std::size_t row = 0; row < m; ++row) {
        const float* r = a + row * k_;
        std::uint32_t special = 0;  // all exponent bits set: a NaN or an infinity
        std::uint32_t nan = 0;      // and a mantissa too: a NaN
        std::uint32_t any = 0;      // any bit but the sign: not a zero
        for (std::size_t i = 0; i < k_; ++i) {
          std::uint32_t bits;
          std::memcpy(&bits, r + i, sizeof bits);
          const std::uint32_t mag = bits & 0x7FFFFFFFu;
          special |= static_cast<std::uint32_t>(mag >= 0x7F800000u);
          nan |= static_cast<std::uint32_t>(mag > 0x7F800000u);
          any |= mag;
        }
        if (any == 0) zero_rows_.push_back(row);
        if (special == 0) continue;
        if (nan == 0)
          throw OrtError{ORT_INVALID_ARGUMENT,
                         "row " + std::to_string(row) + " of A holds an infinity, which this quantized layer cannot "
                         "compute (its outputs are infinities whose signs depend on the weights); ONNX Runtime's "
                         "CPU provider computes such a layer (kernels=builtin leaves every quantized layer to it)"};
        bad_rows_.push_back(row);
      }
      if (!bad_rows_.empty() && qc8_) {
        std::fill(y, y + m * n_, std::numeric_limits<float>::quiet_NaN());
        bad_rows_.clear();
        return;
      }
      if (!bad_rows_.empty()) {  // 4-bit: the other rows are computed; these become NaN after
        clean_.assign(a, a + m * k_);
        for (std::size_t row : bad_rows_) std::fill(clean_.begin() + static_cast<std::ptrdiff_t>(row * k_),
                                                     clean_.begin() + static_cast<std::ptrdiff_t>((row + 1) * k_), 0.0f);
        a = clean_.data();
      }
      q_.resize(m * k_ + XNN_EXTRA_BYTES);
      params_.resize(m + XNN_EXTRA_QUANTIZATION_PARAMS);
      row_sum_.resize(m + XNN_EXTRA_QUANTIZATION_PARAMS);
      check_xnn(xnn_reshape_convert_nc_f32_qd8(convert.op, m, k_, k_, k_, pool_), "fully-connected reshape convert");
      check_xnn(xnn_setup_convert_nc_f32_qd8(convert.op, a, q_.data(), row_sum_.data(), params_.data()), "fully-connected setup convert");
      check_xnn(xnn_run_operator(convert.op, pool_), "fully-connected run convert");
      for (std::size_t row : zero_rows_) params_[row].scale = 0.0f;
      for (std::size_t row = 0; row < m; ++row) {
        if (!bad_rows_.empty() && std::binary_search(bad_rows_.begin(), bad_rows_.end(), row)) continue;
        if (!zero_rows_.empty() && std::binary_search(zero_rows_.begin(), zero_rows_.end(), row)) continue;
        // XNNPACK's quantization multiplier (255 / the row's range) overflows for a row of values
        // all below about 1e-36, and the scale it gives back is then 0 (an all-zero row gets 1).
        check_row_scale(params_[row].scale, row);
      }
      run_qd8(m, y);
    }
    apply_epilogue(y, m * n_, alpha_, activation_, relu_fused_);
    for (std::size_t row : bad_rows_) std::fill(y + row * n_, y + (row + 1) * n_, std::numeric_limits<float>::quiet_NaN());
    bad_rows_.clear();
  }

  static void check_xnn(xnn_status st, const char* what) {
    if (st != xnn_status_success)
      throw OrtError{ORT_FAIL, std::string("XNNPACK ") + what + " failed (xnn_status " +
                                   std::to_string(static_cast<int>(st)) + ")"};
  }

 private:
  static constexpr std::size_t kGivenScale = SIZE_MAX;  // check_row_scale's row: A's given scale

  // Whether the kernel can carry a row of A with dequantization scale `scale`: it multiplies the
  // integer sum by it, then by the weights' scale, and flushes subnormal values to zero. The sum
  // is at most K x 255 x 128 in magnitude. `row`: the row XNNPACK quantized (a scale of 0 then
  // means it could not), or kGivenScale for A's one given scale (where 0 is a value like any).
  // Throws an error that says why when it cannot.
  void check_row_scale(float scale, std::size_t row) const {
    if (scale == 0.0f && row == kGivenScale) return;
    const double mag = std::fabs(static_cast<double>(scale));
    const double big = std::numeric_limits<float>::max(), small = std::numeric_limits<float>::min();
    const bool has_scales = scale_min_ <= scale_max_;
    const char* why = nullptr;
    if (scale == 0.0f) why = "is 0: the row's values are too small for the kernel's quantization";
    else if (!std::isfinite(scale)) why = "is not finite";
    else if (!std::isnormal(scale)) why = "is subnormal, which the kernel flushes to zero";
    else if (mag * sum_max_ > big || (has_scales && mag * sum_max_ * scale_max_ > big))
      why = "times the largest integer sum the layer can have (K x 255 x 128) may overflow float, which the kernel "
            "computes before the weights' scale";
    else if (has_scales && mag * scale_min_ < small)
      why = "times the smallest weight scale is below float's normal range, which the kernel flushes to zero";
    if (why == nullptr) return;
    const std::string what = row == kGivenScale ? "A's scale" : "the scale XNNPACK gave row " + std::to_string(row) + " of A";
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "%s %g %s (weights' scales %g to %g, K %zu): this quantized layer cannot compute it; ONNX Runtime's "
                  "CPU provider computes such a layer (kernels=builtin leaves every quantized layer to it)",
                  what.c_str(), static_cast<double>(scale), why, has_scales ? static_cast<double>(scale_min_) : 0.0,
                  static_cast<double>(scale_max_), k_);
    throw OrtError{ORT_INVALID_ARGUMENT, msg};
  }

  // The fully-connected operator on the int8 rows in q_ with their params_ (int8 or 4-bit weights).
  void run_qd8(std::size_t m, float* y) {
    std::size_t workspace = 0;
    if (qc8_) {
      check_xnn(xnn_reshape_fully_connected_nc_qd8_f32_qc8w(fc.op, m, &workspace, pool_), "fully-connected reshape");
      workspace_.resize(workspace / sizeof(std::uint64_t) + 1);
      check_xnn(xnn_setup_fully_connected_nc_qd8_f32_qc8w(fc.op, q_.data(), y, workspace_.data(), params_.data()),
                "fully-connected setup");
    } else {
      check_xnn(xnn_reshape_fully_connected_nc_qd8_f32_qb4w(fc.op, m, &workspace, pool_), "fully-connected reshape");
      workspace_.resize(workspace / sizeof(std::uint64_t) + 1);
      check_xnn(xnn_setup_fully_connected_nc_qd8_f32_qb4w(fc.op, q_.data(), y, workspace_.data(), params_.data()),
                "fully-connected setup");
    }
    check_xnn(xnn_run_operator(fc.op, pool_), "fully-connected run");
  }

  std::size_t k_, n_;
  float alpha_;
  Activation activation_;
  bool relu_fused_, quantized_, qc8_;
  pthreadpool_t pool_;
  std::mutex mu_;  // an XNNPACK operator is reshaped, set up and run by one thread at a time
  std::vector<std::int8_t> q_;
  std::vector<xnn_quantization_params> params_;
  std::vector<float> row_sum_;
  std::vector<std::uint64_t> workspace_;
  std::vector<std::size_t> bad_rows_;   // rows of A with a NaN (quantized layers), ascending
  std::vector<std::size_t> zero_rows_;  // rows of A of zeros (quantized layers), ascending
  std::vector<float> clean_;           // A with those rows zeroed (4-bit layers)
  float scale_min_ = std::numeric_limits<float>::max(), scale_max_ = 0.0f;  // |weights' scales| (nonzero min)
  double sum_max_ = 0;  // the largest integer sum a row can give
};

// Creates the fully-connected operator with or without the cache's provider.
xnn_status create_fc(const LinearSpec& s, const std::uint16_t* scales_bf16, const float* bias, float lo, float hi,
                     xnn_weights_cache_t cache, xnn_operator_t* op) {
  if (s.kind == LinearSpec::Kind::f32)
    return xnn_create_fully_connected_nc_f32(s.k, s.n, s.k, s.n, static_cast<const float*>(s.weights), bias, lo, hi,
                                             s.weights_kn ? XNN_FLAG_TRANSPOSE_WEIGHTS : 0, cache, op);
  if (s.kind == LinearSpec::Kind::qc8)
    return xnn_create_fully_connected_nc_qd8_f32_qc8w(s.k, s.n, s.k, s.n, s.scales, static_cast<const std::int8_t*>(s.weights),
                                                      bias, lo, hi, s.weights_kn ? XNN_FLAG_TRANSPOSE_WEIGHTS : 0, cache,
                                                      op);
  return xnn_create_fully_connected_nc_qd8_f32_qb4w(s.k, s.n, s.k, s.n, s.block_size, /*kernel_zero_point=*/8,
                                                    scales_bf16, s.weights, bias, lo, hi, 0, cache, op);
}

class XnnConv final : public Conv2d {
 public:
  XnnConv(const ConvSpec& s, pthreadpool_t pool, bool relu_fused)
      : cin_(s.groups * s.group_in), cout_(s.groups * s.group_out), spec_(s), activation_(s.activation),
        relu_fused_(relu_fused), pool_(pool) {
    spec_.weights = nullptr;  // only creation reads them
  }

  XnnOp conv;
  std::unique_ptr<ForwardingProvider> provider;

  void run(const float* x, std::size_t n, std::size_t h, std::size_t w, float* y) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t oh = 0, ow = 0;
    if (!conv_output_size(spec_, h, w, &oh, &ow)) throw OrtError{ORT_INVALID_ARGUMENT, "the convolution has no output for this input size"};
    // ONNX is NCHW, XNNPACK's convolution NHWC: the input is transposed in, the output back out.
    if (h == 0 || w == 0) {
      // Nothing but padding under every window: each output is the bias (XNNPACK takes no empty input).
      for (std::size_t b = 0; b < n; ++b)
        for (std::size_t c = 0; c < cout_; ++c)
          std::fill_n(y + (b * cout_ + c) * oh * ow, oh * ow, spec_.bias.empty() ? 0.0f : spec_.bias[c]);
      apply_epilogue(y, n * cout_ * oh * ow, 1.0f, activation_, false);
      return;
    }
    in_.resize(n * h * w * cin_ + XNN_EXTRA_BYTES / sizeof(float));
    transpose(x, in_.data(), n, cin_, h * w);
    std::size_t workspace = 0, rh = 0, rw = 0;
    XnnLinear::check_xnn(xnn_reshape_convolution2d_nhwc_f32(conv.op, n, h, w, &workspace, &rh, &rw, pool_), "convolution reshape");
    if (rh != oh || rw != ow) throw OrtError{ORT_FAIL, "XNNPACK's convolution output size differs from ONNX's"};
    workspace_.resize(workspace / sizeof(std::uint64_t) + 8);
    out_.resize(n * oh * ow * cout_);
    XnnLinear::check_xnn(xnn_setup_convolution2d_nhwc_f32(conv.op, workspace ? aligned_workspace() : nullptr, in_.data(), out_.data()),
                         "convolution setup");
    XnnLinear::check_xnn(xnn_run_operator(conv.op, pool_), "convolution run");
    transpose(out_.data(), y, n, oh * ow, cout_);
    apply_epilogue(y, n * cout_ * oh * ow, 1.0f, activation_, relu_fused_);
  }

 private:
  // [n][a][b] -> [n][b][a] (NCHW <-> NHWC), with XNNPACK's blocked transpose.
  void transpose(const float* src, float* dst, std::size_t n, std::size_t a, std::size_t b) {
    if (a == 1 || b == 1) {
      std::memcpy(dst, src, n * a * b * sizeof(float));
      return;
    }
    const std::size_t shape[3] = {n, a, b}, perm[3] = {0, 2, 1};
    XnnLinear::check_xnn(xnn_run_transpose_nd_x32(src, dst, 3, shape, perm, 0, pool_), "transpose");
  }
  void* aligned_workspace() {
    auto p = reinterpret_cast<std::uintptr_t>(workspace_.data());
    return reinterpret_cast<void*>((p + 63) & ~std::uintptr_t{63});
  }
  std::size_t cin_, cout_;
  ConvSpec spec_;
  Activation activation_;
  bool relu_fused_;
  pthreadpool_t pool_;
  std::mutex mu_;
  std::vector<float> in_, out_;
  std::vector<std::uint64_t> workspace_;
};

xnn_status create_conv(const ConvSpec& s, const float* kernel, const float* bias, float lo, float hi,
                       xnn_weights_cache_t cache, xnn_operator_t* op) {
  return xnn_create_convolution2d_nhwc_f32(
      static_cast<std::uint32_t>(s.pad_top), static_cast<std::uint32_t>(s.pad_right),
      static_cast<std::uint32_t>(s.pad_bottom), static_cast<std::uint32_t>(s.pad_left),
      static_cast<std::uint32_t>(s.kh), static_cast<std::uint32_t>(s.kw), static_cast<std::uint32_t>(s.sh),
      static_cast<std::uint32_t>(s.sw), static_cast<std::uint32_t>(s.dh), static_cast<std::uint32_t>(s.dw),
      static_cast<std::uint32_t>(s.groups), s.group_in, s.group_out, s.groups * s.group_in, s.groups * s.group_out,
      kernel, bias, lo, hi, 0, cache, op);
}

}  // namespace

std::unique_ptr<Conv2d> create_xnnpack_conv(const ConvSpec& s, const PackTarget& t, CreateReport* report) {
  if (!xnn_ready()) throw OrtError{ORT_FAIL, "XNNPACK could not be initialized on this CPU"};
  const bool relu_fused = s.activation == Activation::relu;
  const float lo = relu_fused ? 0.0f : -std::numeric_limits<float>::infinity();
  const float hi = std::numeric_limits<float>::infinity();
  const float* bias = s.bias.empty() ? nullptr : s.bias.data();
  auto layer = std::make_unique<XnnConv>(s, static_cast<pthreadpool_t>(t.threadpool), relu_fused);
  // XNNPACK takes the kernel as [groups][group_out][kh][kw][group_in] (OHWI), ONNX gives
  // [groups * group_out][group_in][kh][kw] (OIHW): the same bytes where group_in or kh x kw is 1
  // (depthwise, pointwise), otherwise transposed, and only when packing needs them.
  std::vector<float> ohwi;
  const auto kernel = [&]() -> const float* {
    if (s.group_in == 1 || s.kh * s.kw == 1) return s.weights;
    if (ohwi.empty()) {
      const std::size_t outs = s.groups * s.group_out, hw = s.kh * s.kw;
      ohwi.resize(outs * hw * s.group_in);
      for (std::size_t o = 0; o < outs; ++o)
        for (std::size_t i = 0; i < s.group_in; ++i)
          for (std::size_t k = 0; k < hw; ++k) ohwi[(o * hw + k) * s.group_in + i] = s.weights[(o * s.group_in + i) * hw + k];
    }
    return ohwi.data();
  };
  xnn_status st = xnn_status_invalid_state;
  if (t.use_cache && t.adapter != nullptr) {
    layer->provider = forwarding_provider(t.adapter);
    // Keys are names, never addresses (see create_xnnpack). A hit needs none of the kernel's bytes:
    // first ONNX's weights, named, with no packing allowed; only a miss transposes them.
    const bool bias_named = bias == nullptr || wc_xnn_adapter_name_buffer(t.adapter, bias, s.bias_name.c_str()) == WC_OK;
    if (bias_named && wc_xnn_adapter_name_buffer(t.adapter, s.weights, s.weights_name.c_str()) == WC_OK) {
      t_hit_only = true;
      st = create_conv(s, s.weights, bias, lo, hi, layer->provider->get(), &layer->conv.op);
      t_hit_only = false;
      (void)wc_xnn_adapter_name_buffer(t.adapter, s.weights, nullptr);
      if (st != xnn_status_success) {
        layer->conv.reset();
        const float* k = kernel();
        if (wc_xnn_adapter_name_buffer(t.adapter, k, s.weights_name.c_str()) == WC_OK) {
          st = create_conv(s, k, bias, lo, hi, layer->provider->get(), &layer->conv.op);
          if (st != xnn_status_success) report->why = wc_last_error();
          (void)wc_xnn_adapter_name_buffer(t.adapter, k, nullptr);
        }
      }
    }
    if (bias != nullptr) (void)wc_xnn_adapter_name_buffer(t.adapter, bias, nullptr);
    report->packed = layer->provider->reservations > 0;
    report->bytes = layer->provider->reserved_bytes;
  }
  if (st != xnn_status_success) {
    layer->conv.reset();
    layer->provider.reset();
    XnnLinear::check_xnn(create_conv(s, kernel(), bias, lo, hi, nullptr, &layer->conv.op), "convolution create");
    report->packed = true;
    report->in_heap = true;
  }
  return layer;
}

bool have_xnnpack() noexcept { return xnn_ready(); }

std::string xnnpack_build_id() {
  if (!xnn_ready()) return {};
  const auto* p = static_cast<const char*>(xnn_experimental_get_build_identifier_data());
  return std::string(p, xnn_experimental_get_build_identifier_size());
}

bool nbits_supported(std::size_t k, std::size_t n, std::size_t block_size) noexcept {
  return block_size >= XNN_MIN_BLOCKSIZE && block_size % XNN_MIN_BLOCKSIZE == 0 && k % block_size == 0 && n > 0;
}

// XNNPACK refused the 4-bit layer (its scales must be finite and positive in bf16): the layer runs
// on the built-in f32 GEMM over the dequantized weights, keyed as such. Rare, so not fast.
std::unique_ptr<Linear> dequantized(const LinearSpec& s, const PackTarget& t, CreateReport* report) {
  if (s.kind == LinearSpec::Kind::qc8) {  // K x N int8, a scale per column
    std::vector<float> w(s.k * s.n);
    const auto* q = static_cast<const std::int8_t*>(s.weights);
    for (std::size_t kk = 0; kk < s.k; ++kk)
      for (std::size_t col = 0; col < s.n; ++col) w[kk * s.n + col] = static_cast<float>(q[kk * s.n + col]) * s.scales[col];
    LinearSpec f = s;
    f.kind = LinearSpec::Kind::f32;
    f.weights = w.data();
    f.weights_kn = true;
    f.weights_name = "dequantized|" + s.weights_name;
    return create_builtin(f, t, report);
  }
  std::vector<float> w(s.n * s.k);
  const auto* q = static_cast<const std::uint8_t*>(s.weights);
  const std::size_t blocks = s.k / s.block_size;
  for (std::size_t col = 0; col < s.n; ++col)
    for (std::size_t kk = 0; kk < s.k; ++kk) {
      const std::uint8_t byte = q[(col * s.k + kk) / 2];
      const int v = ((kk & 1) != 0 ? byte >> 4 : byte & 0xF) - 8;
      w[col * s.k + kk] = static_cast<float>(v) * s.scales[col * blocks + kk / s.block_size];
    }
  LinearSpec f = s;
  f.kind = LinearSpec::Kind::f32;
  f.weights = w.data();
  f.weights_kn = false;
  f.weights_name = "dequantized|" + s.weights_name;
  return create_builtin(f, t, report);
}

std::unique_ptr<Linear> create_xnnpack(const LinearSpec& s, const PackTarget& t, CreateReport* report) {
  if (!xnn_ready()) throw OrtError{ORT_FAIL, "XNNPACK could not be initialized on this CPU"};
  // A quantized layer's Relu is applied after the kernel, never as its clamp, which turns a NaN
  // into 0 there (the f32 kernels keep it).
  const bool relu_fused = s.activation == Activation::relu && s.alpha == 1.0f && s.kind == LinearSpec::Kind::f32;
  const float lo = relu_fused ? 0.0f : -std::numeric_limits<float>::infinity();
  const float hi = std::numeric_limits<float>::infinity();
  const bool nbits = s.kind == LinearSpec::Kind::nbits4;
  const std::size_t scale_count = nbits ? s.n * (s.k / s.block_size) : 0;
  std::vector<std::uint16_t> scales;
  const auto real_scales = [&] {
    if (scales.size() == scale_count) return;
    scales.resize(scale_count);
    for (std::size_t i = 0; i < scale_count; ++i) scales[i] = to_bf16(s.scales[i]);
  };
  const float* bias = s.bias.empty() ? nullptr : s.bias.data();
  auto layer = std::make_unique<XnnLinear>(s, static_cast<pthreadpool_t>(t.threadpool), relu_fused);
  xnn_status st = xnn_status_invalid_state;
  if (t.use_cache && t.adapter != nullptr) {
    layer->provider = forwarding_provider(t.adapter);
    // Keys are names, never addresses: name the buffers XNNPACK will pass in the look-up key for
    // as long as the operator is created, then unbind them (their memory may be freed and reused).
    bool named = t.names_bound;
    if (!t.names_bound) {
      named = wc_xnn_adapter_name_buffer(t.adapter, s.weights, s.weights_name.c_str()) == WC_OK;
      if (named && bias != nullptr) named = wc_xnn_adapter_name_buffer(t.adapter, bias, s.bias_name.c_str()) == WC_OK;
    }
    if (named && nbits && t.placeholder_scales != nullptr && t.placeholder_count >= scale_count) {
      // A hit needs no scales (the name holds their identity): try one with placeholder scales
      // (bf16 1.0) and no packing allowed, before reading the real ones.
      t_hit_only = true;
      st = create_fc(s, t.placeholder_scales, bias, lo, hi, layer->provider->get(), &layer->fc.op);
      t_hit_only = false;
      if (st != xnn_status_success) layer->fc.reset();
    }
    if (named && st != xnn_status_success) {
      real_scales();
      st = create_fc(s, scales.data(), bias, lo, hi, layer->provider->get(), &layer->fc.op);
      if (st != xnn_status_success) report->why = wc_last_error();  // reserve_space's reason
    }
    if (!t.names_bound) {
      (void)wc_xnn_adapter_name_buffer(t.adapter, s.weights, nullptr);
      if (bias != nullptr) (void)wc_xnn_adapter_name_buffer(t.adapter, bias, nullptr);
    }
    report->packed = layer->provider->reservations > 0;
    report->bytes = layer->provider->reserved_bytes;
  }
  if (st != xnn_status_success) {
    // No cache, or the cache could not give memory (reserve_space refused: disk full, no
    // memory): XNNPACK packs into memory of its own, as without weightcache.
    layer->fc.reset();
    layer->provider.reset();
    real_scales();
    st = create_fc(s, scales.data(), bias, lo, hi, nullptr, &layer->fc.op);
    if (st != xnn_status_success && s.kind != LinearSpec::Kind::f32) return dequantized(s, t, report);
    XnnLinear::check_xnn(st, "fully-connected create");
    report->packed = true;
    report->in_heap = true;
  }
  if (s.kind != LinearSpec::Kind::f32)
    XnnLinear::check_xnn(xnn_create_convert_nc_f32_qd8(0, &layer->convert.op), "fully-connected create convert");
  return layer;
}

#else  // no XNNPACK in this build: the built-in GEMM computes every layer

bool have_xnnpack() noexcept { return false; }
std::string xnnpack_build_id() { return {}; }
bool nbits_supported(std::size_t, std::size_t, std::size_t) noexcept { return false; }
std::unique_ptr<Linear> create_xnnpack(const LinearSpec&, const PackTarget&, CreateReport*) {
  throw OrtError{ORT_NOT_IMPLEMENTED, "this build of the provider has no XNNPACK"};
}
std::unique_ptr<Conv2d> create_xnnpack_conv(const ConvSpec&, const PackTarget&, CreateReport*) {
  throw OrtError{ORT_NOT_IMPLEMENTED, "this build of the provider has no XNNPACK"};
}

#endif

}  // namespace weightcache::ort
