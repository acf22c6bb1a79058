// CPU reference GEMMs against a double-precision reference on the same (de)quantized operands.
#include <gtest/gtest.h>

#include "core/error.h"
#include "ops/gemm.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::random_tensor;
using testing::rel_error;
using testing::to_double;

// ref[i][j] = Σ_k a[i][k] b[j][k] in double, from the values the operands hold.
std::vector<double> ref_tn(const std::vector<double>& a, const std::vector<double>& b, int64_t m,
                           int64_t n, int64_t k) {
  std::vector<double> out(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += a[size_t(i * k + p)] * b[size_t(j * k + p)];
      out[size_t(i * n + j)] = acc;
    }
  return out;
}

std::vector<double> transpose(const std::vector<double>& v, int64_t rows, int64_t cols) {
  std::vector<double> t(v.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = v[size_t(i * cols + j)];
  return t;
}

std::vector<double> dequantized(const Fp8Rows& q) {
  Tensor f = Tensor::empty(q.data.shape(), DType::f32);
  dequantize(f, q);
  return to_double(f);
}

std::vector<double> dequantized(const Fp8Blocks& q) {
  Tensor f = Tensor::empty(q.data.shape(), DType::f32);
  dequantize(f, q);
  return to_double(f);
}

constexpr int64_t T = 45, N = 256, K = 384;
constexpr double kBf16OutTol = 2e-3;  // bf16 output rounding: ≤ 2^-9 relative per element
constexpr double kF32OutTol = 1e-5;   // fp32 accumulation only

TEST(GemmBf16, ThreeGemmsMatchDoubleReference) {
  Tensor x = random_tensor({T, K}, DType::bf16, 10), w = random_tensor({N, K}, DType::bf16, 11);
  Tensor dy = random_tensor({T, N}, DType::bf16, 12);
  const auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);

  Tensor y = Tensor::empty({T, N}, DType::bf16);
  gemm_fprop(y, x, w);
  EXPECT_LE(rel_error(to_double(y), ref_tn(xd, wd, T, N, K)), kBf16OutTol);

  Tensor dx = Tensor::empty({T, K}, DType::f32);
  gemm_dgrad(dx, dy, w);
  EXPECT_LE(rel_error(to_double(dx), ref_tn(dyd, transpose(wd, N, K), T, K, N)), kF32OutTol);

  Tensor dw = Tensor::empty({N, K}, DType::f32);
  gemm_wgrad(dw, dy, x, false);
  const auto ref = ref_tn(transpose(dyd, T, N), transpose(xd, T, K), N, K, T);
  EXPECT_LE(rel_error(to_double(dw), ref), kF32OutTol);
  gemm_wgrad(dw, dy, x, true);  // accumulate a second micro-batch
  std::vector<double> twice = ref;
  for (double& v : twice) v *= 2;
  EXPECT_LE(rel_error(to_double(dw), twice), kF32OutTol);
}

TEST(GemmFp8, ThreeGemmsMatchDoubleReferenceOnQuantizedValues) {
  Tensor x = random_tensor({T, K}, DType::bf16, 20, true), w = random_tensor({N, K}, DType::f32, 21);
  Tensor dy = random_tensor({T, N}, DType::bf16, 22, true);
  Fp8Rows qx = Fp8Rows::empty(T, K, Device::cpu), qxt = Fp8Rows::empty_columnwise(T, K, Device::cpu);
  Fp8Rows qdy = Fp8Rows::empty(T, N, Device::cpu), qdyt = Fp8Rows::empty_columnwise(T, N, Device::cpu);
  Fp8Weight qw = Fp8Weight::empty(N, K, Device::cpu);
  quantize_rows_and_columns(qx, qxt, x);
  quantize_rows_and_columns(qdy, qdyt, dy);
  quantize_weight(qw, w);

  Tensor y = Tensor::empty({T, N}, DType::bf16);
  gemm_fprop(y, qx, qw);
  EXPECT_LE(rel_error(to_double(y), ref_tn(dequantized(qx), dequantized(qw.w), T, N, K)), kBf16OutTol);

  Tensor dx = Tensor::empty({T, K}, DType::f32);
  gemm_dgrad(dx, qdy, qw);
  EXPECT_LE(rel_error(to_double(dx), ref_tn(dequantized(qdy), dequantized(qw.wt), T, K, N)), kF32OutTol);

  Tensor dw = Tensor::empty({N, K}, DType::f32);
  gemm_wgrad(dw, qdyt, qxt, false);
  const int64_t Tp = qxt.cols();
  EXPECT_LE(rel_error(to_double(dw), ref_tn(dequantized(qdyt), dequantized(qxt), N, K, Tp)), kF32OutTol);

  // And the quantized GEMM is close to the exact product of the unquantized operands.
  std::vector<double> exact = ref_tn(to_double(x), to_double(w), T, N, K);
  EXPECT_LE(rel_error(to_double(y), exact), 0.06);
}

// A row's output does not depend on the other rows of the batch: the basis of bit-identical
// rollout and training logprobs on the CPU.
TEST(GemmFp8, RowsAreIndependentOfTheBatch) {
  Tensor x = random_tensor({T, K}, DType::bf16, 30), w = random_tensor({N, K}, DType::f32, 31);
  Fp8Weight qw = Fp8Weight::empty(N, K, Device::cpu);
  quantize_weight(qw, w);
  Fp8Rows all = Fp8Rows::empty(T, K, Device::cpu);
  quantize_rows(all, x);
  Tensor y_all = Tensor::empty({T, N}, DType::bf16);
  gemm_fprop(y_all, all, qw);
  for (int64_t begin : {0, 7, 44}) {
    Tensor xs = x.rows(begin, begin + 1).to(Device::cpu);
    Fp8Rows one = Fp8Rows::empty(1, K, Device::cpu);
    quantize_rows(one, xs);
    Tensor y_one = Tensor::empty({1, N}, DType::bf16);
    gemm_fprop(y_one, one, qw);
    EXPECT_TRUE(testing::same_bytes(y_one, y_all.rows(begin, begin + 1))) << "row " << begin;
  }
}

TEST(Gemm, BadShapesAreClearErrors) {
  Tensor x = random_tensor({4, 128}, DType::bf16, 1), w = random_tensor({256, 256}, DType::bf16, 2);
  Tensor y = Tensor::empty({4, 256}, DType::bf16);
  try {
    gemm_fprop(y, x, w);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inner dimensions differ"), std::string::npos) << e.what();
  }
  Tensor w2 = random_tensor({256, 128}, DType::bf16, 3);
  Tensor y_bad = Tensor::empty({4, 255}, DType::bf16);
  EXPECT_THROW(gemm_fprop(y_bad, x, w2), Error);
  Tensor y_int = Tensor::empty({4, 256}, DType::i32);
  EXPECT_THROW(gemm_fprop(y_int, x, w2), Error);
  Tensor x_f32 = random_tensor({4, 128}, DType::f32, 4);
  EXPECT_THROW(gemm_fprop(y, x_f32, w2), Error);
  Tensor dw_bf16 = Tensor::empty({256, 128}, DType::bf16);
  Tensor dy = random_tensor({4, 256}, DType::bf16, 5);
  EXPECT_THROW(gemm_wgrad(dw_bf16, dy, x, false), Error);
  Fp8Weight qw = Fp8Weight::empty(256, 128, Device::cpu);
  std::swap(qw.w, qw.wt);  // not a [N, K] / [K, N] pair for this x
  Fp8Rows qx = Fp8Rows::empty(4, 128, Device::cpu);
  EXPECT_THROW(gemm_fprop(y, qx, qw), Error);
}

}  // namespace
}  // namespace lockstep
