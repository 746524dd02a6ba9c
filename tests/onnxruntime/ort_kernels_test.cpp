// The provider's kernels on an A quantized before the layer (MatMulInteger, MatMulIntegerToFloat):
// run_quantized must compute the product of A dequantized, (a - zero_point) * scale, exactly but
// for float rounding, for uint8 and int8 A. Two implementations: XNNPACK's qd8-qc8w, which takes the 8-bit A as it is,
// and the default every other layer uses (the built-in f32 GEMM over dequantized int8 weights,
// where XNNPACK cannot create the int8 layer), which no model reaches on a CPU XNNPACK supports.
#include <gtest/gtest.h>

#include "../../src/integrations/onnxruntime/kernels.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

using weightcache::ort::CreateReport;
using weightcache::ort::Linear;
using weightcache::ort::LinearSpec;
using weightcache::ort::PackTarget;

constexpr std::size_t kM = 5, kK = 40, kN = 24;

struct Data {
  std::vector<std::int8_t> w = std::vector<std::int8_t>(kK * kN);
  std::vector<float> scales = std::vector<float>(kN);
  std::vector<float> w_f32 = std::vector<float>(kK * kN);  // w dequantized, K x N
  std::vector<std::uint8_t> a = std::vector<std::uint8_t>(kM * kK);
  Data() {
    std::uint32_t x = 12345;
    const auto next = [&] { return x = x * 1664525u + 1013904223u; };
    for (std::size_t i = 0; i < kN; ++i) scales[i] = 0.001f * static_cast<float>(1 + next() % 50);
    for (std::size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<std::int8_t>(static_cast<int>(next() % 255) - 127);
      w_f32[i] = static_cast<float>(w[i]) * scales[i % kN];
    }
    for (auto& v : a) v = static_cast<std::uint8_t>(next() >> 24);
  }
};

// The exact product of A dequantized and the dequantized weights, in double.
std::vector<double> exact(const Data& d, bool a_unsigned, std::int32_t zero, float scale) {
  std::vector<double> y(kM * kN, 0.0);
  for (std::size_t m = 0; m < kM; ++m)
    for (std::size_t k = 0; k < kK; ++k) {
      const std::size_t i = m * kK + k;
      const std::int32_t v = a_unsigned ? d.a[i] : static_cast<std::int8_t>(d.a[i]);
      const double av = static_cast<double>(v - zero) * scale;
      for (std::size_t n = 0; n < kN; ++n) y[m * kN + n] += av * d.w_f32[k * kN + n];
    }
  return y;
}

void expect_exact_product(Linear& layer, const Data& d) {
  for (const bool a_unsigned : {true, false}) {
    const std::int32_t zero = a_unsigned ? 131 : -3;
    const float scale = 0.0173f;
    SCOPED_TRACE(a_unsigned ? "uint8 A" : "int8 A");
    const std::vector<double> want = exact(d, a_unsigned, zero, scale);
    std::vector<float> got(kM * kN);
    layer.run_quantized(d.a.data(), a_unsigned, kM, kK, zero, scale, got.data());
    double err = 0, top = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::fabs(got[i] - want[i]));
      top = std::max(top, std::fabs(want[i]));
    }
    std::printf("  max |run_quantized - exact| %.3g of max %.3g\n", err, top);
    EXPECT_GT(top, 1.0);
    EXPECT_LE(err, 1e-5 * top);  // the integer product is exact; float rounding only
  }
}

TEST(OrtKernels, TheBuiltInGemmRunsAQuantizedAOnItsDequantizedValues) {
  const Data d;
  LinearSpec s;
  s.k = kK;
  s.n = kN;
  s.weights = d.w_f32.data();
  s.weights_name = "test";
  PackTarget target;  // no cache: packed into the heap
  CreateReport report;
  auto layer = weightcache::ort::create_builtin(s, target, &report);
  expect_exact_product(*layer, d);
}

TEST(OrtKernels, XnnpackTakesTheQuantizedAAsItIs) {
  if (!weightcache::ort::have_xnnpack()) GTEST_SKIP() << "this build of the provider has no XNNPACK";
  const Data d;
  LinearSpec s;
  s.kind = LinearSpec::Kind::qc8;
  s.k = kK;
  s.n = kN;
  s.weights = d.w.data();
  s.scales = d.scales.data();
  s.weights_name = "test";
  PackTarget target;
  target.use_cache = false;
  CreateReport report;
  auto layer = weightcache::ort::create_xnnpack(s, target, &report);
  expect_exact_product(*layer, d);
}

}  // namespace
