// Our fp8 WGrad kernel (ops/cuda/gemm_fp8_wgrad.cu), every tuning variant, against the CPU
// reference on the same quantized bytes, overwriting and accumulating; its determinism; and the
// dispatch between it and cuBLASLt (gemm_set_fp8_wgrad) in each mode.
//
// Operands: dy [T, N] and x [T, K] of N(0, 1) values times 2^a per column and 2^b per 128-token
// block (a, b random in ±12), so the 128×1 group scales span ~7 decades and the rows of dw very
// different magnitudes; quantized columnwise on the CPU (the same bytes as the CUDA kernels).
// Error: per row of dw, ‖gpu − cpu‖/‖cpu‖. Both sides multiply the same e4m3 values (exact in
// fp32) and scale each 128-token block's sum the same way; they differ in how a block is summed:
// the fp8 tensor cores accumulate with fewer bits than fp32 (cuBLASLt's fp8 GEMMs, the same
// instructions, measure 3e-5 .. 1.7e-4 against this reference), and one fma instead of a multiply
// and an add. 2e-3 leaves room for that at every row while a wrong scale, tile, chunk or token
// block (errors of order 1) fails.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "ops/cuda/gemm_fp8_wgrad.h"
#include "ops/gemm.h"
#include "ops/gemm_backends.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::random_tensor;
using testing::same_bytes;
using testing::to_double;
using testing::worst_row_error;

constexpr double kTol = 2e-3;

#if LOCKSTEP_HAS_CUDA
constexpr int kVariants = cuda::kFp8WgradVariants;
#else
constexpr int kVariants = 1;
#endif

// The columnwise Fp8Rows of a [T, cols] activation with the magnitudes described above.
Fp8Rows quantized_columns(int64_t T, int64_t cols, uint64_t seed) {
  Tensor v = random_tensor({T, cols}, DType::f32, seed);
  std::mt19937_64 rng(seed + 1000);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> col_scale(static_cast<size_t>(cols)), block_scale(static_cast<size_t>((T + 127) / 128));
  for (float& s : col_scale) s = std::ldexp(1.0f, exponent(rng));
  for (float& s : block_scale) s = std::ldexp(1.0f, exponent(rng));
  float* p = v.data_as<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < cols; ++c) p[t * cols + c] *= col_scale[size_t(c)] * block_scale[size_t(t / 128)];
  Fp8Rows q = Fp8Rows::empty_columnwise(T, cols, Device::cpu);
  quantize_columns(q, v);
  return q;
}

Fp8Rows to_device(const Fp8Rows& q) { return Fp8Rows{q.data.to(Device::cuda), q.scales.to(Device::cuda)}; }

Tensor poisoned(int64_t N, int64_t K) {
  Tensor t = Tensor::empty({N, K}, DType::f32, Device::cuda);
  t.fill_bytes(0xFF);  // NaN
  return t;
}

void run_ours(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate, int variant) {
#if LOCKSTEP_HAS_CUDA
  cuda::gemm_fp8_wgrad(dw, dy_t, x_t, accumulate, variant);
#else
  (void)dw, (void)dy_t, (void)x_t, (void)accumulate, (void)variant;
#endif
}

struct WgradCase {
  int64_t T, N, K;
};

// Operands on both devices, the CPU reference overwriting (dw) and accumulating onto dw0 (dw_acc).
struct WgradInputs {
  explicit WgradInputs(const WgradCase& c)
      : cdy(quantized_columns(c.T, c.N, 21)), cx(quantized_columns(c.T, c.K, 22)), dy(to_device(cdy)),
        x(to_device(cx)), dw0(random_tensor({c.N, c.K}, DType::f32, 23)), dw(Tensor::empty({c.N, c.K}, DType::f32)),
        dw_acc(dw0.to(Device::cpu)) {
    dw.fill_bytes(0xFF);
    gemm_wgrad(dw, cdy, cx, false);
    gemm_wgrad(dw_acc, cdy, cx, true);
  }
  Fp8Rows cdy, cx, dy, x;
  Tensor dw0, dw, dw_acc;  // CPU
};

// Shape and variant (named so that a variant's tests can be run alone: --gtest_filter='*_v1:*/v1').
using VariantCase = std::tuple<WgradCase, int>;

std::string case_name(const ::testing::TestParamInfo<VariantCase>& info) {
  const auto& [c, v] = info.param;
  std::string name = "T";  // (appended to: "T" + std::string trips GCC 12's -Wrestrict)
  name += std::to_string(c.T) + "_N" + std::to_string(c.N) + "_K" + std::to_string(c.K) + "_v" + std::to_string(v);
  return name;
}

class Fp8WgradGpu : public ::testing::TestWithParam<VariantCase> {};

TEST_P(Fp8WgradGpu, MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto& [c, v] = GetParam();
  const WgradInputs in(c);
  Tensor dw = poisoned(c.N, c.K);
  run_ours(dw, in.dy, in.x, false, v);
  EXPECT_LE(worst_row_error(to_double(dw), to_double(in.dw), c.K), kTol) << "overwrite";
  Tensor acc = in.dw0.to(Device::cuda);
  run_ours(acc, in.dy, in.x, true, v);
  EXPECT_LE(worst_row_error(to_double(acc), to_double(in.dw_acc), c.K), kTol) << "accumulate";
}

// One tile and one token block (N = 128: the second CTA of a cluster has no rows); T not a
// multiple of 128 (padded tokens); N, K not multiples of the tiles (partial tiles at the right and
// bottom edges); more tiles than SMs (a CTA walks several, its stage ring wrapping mid-tile), with
// odd and even token-block counts.
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8WgradGpu,
                         ::testing::Combine(::testing::Values(WgradCase{128, 128, 128}, WgradCase{300, 384, 640},
                                                              WgradCase{1000, 256, 512}, WgradCase{640, 512, 384},
                                                              WgradCase{200, 2560, 1664}),
                                            ::testing::Range(0, kVariants)),
                         case_name);

class Fp8WgradGpuDeterminism : public ::testing::TestWithParam<int> {};

TEST_P(Fp8WgradGpuDeterminism, TwoCallsSameBits) {
  LOCKSTEP_REQUIRE_GPU();
  const WgradCase c{1000, 384, 640};
  const Fp8Rows dy = to_device(quantized_columns(c.T, c.N, 31)), x = to_device(quantized_columns(c.T, c.K, 32));
  Tensor a = poisoned(c.N, c.K), b = poisoned(c.N, c.K);
  run_ours(a, dy, x, false, GetParam());
  run_ours(b, dy, x, false, GetParam());
  EXPECT_TRUE(same_bytes(a, b));
}

INSTANTIATE_TEST_SUITE_P(Variants, Fp8WgradGpuDeterminism, ::testing::Range(0, kVariants),
                         [](const ::testing::TestParamInfo<int>& info) { return "v" + std::to_string(info.param); });

TEST(Fp8WgradGpuErrors, BadVariantThrows) {
  LOCKSTEP_REQUIRE_GPU();
  const Fp8Rows dy = to_device(quantized_columns(128, 128, 33)), x = to_device(quantized_columns(128, 128, 34));
  Tensor dw = poisoned(128, 128);
  EXPECT_THROW(run_ours(dw, dy, x, false, kVariants), Error);
}

#if LOCKSTEP_HAS_CUDA
// gemm_wgrad through the dispatch, in each mode (automatic times both on the shape's first call).
TEST(Fp8WgradDispatchGpu, EveryModeMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const WgradCase c{300, 384, 640};
  const WgradInputs in(c);
  for (const cuda::Fp8Wgrad mode : {cuda::Fp8Wgrad::ours, cuda::Fp8Wgrad::cublaslt, cuda::Fp8Wgrad::automatic}) {
    const cuda::Fp8Wgrad previous = cuda::gemm_set_fp8_wgrad(mode);
    Tensor dw = poisoned(c.N, c.K);
    gemm_wgrad(dw, in.dy, in.x, false);
    EXPECT_LE(worst_row_error(to_double(dw), to_double(in.dw), c.K), kTol) << "overwrite, mode " << int(mode);
    Tensor acc = in.dw0.to(Device::cuda);
    gemm_wgrad(acc, in.dy, in.x, true);
    EXPECT_LE(worst_row_error(to_double(acc), to_double(in.dw_acc), c.K), kTol) << "accumulate, mode " << int(mode);
    cuda::gemm_set_fp8_wgrad(previous);
  }
}
#endif

}  // namespace
}  // namespace lockstep
