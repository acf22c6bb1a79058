// CPU GEMMs: against a double-precision reference on the same (de)quantized operands, and the
// determinism contract — every element is computed by the documented sequence of operations,
// whatever M, N, its position, the rows and columns around it and the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <functional>
#include <tuple>

#include "core/error.h"
#include "ops/gemm.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::poisoned;
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
constexpr double kBf16OutTol = 2e-3;  // bf16 output rounding: ≤ 2^-8 per element, ~2^-10 in norm
constexpr double kF32OutTol = 1e-5;   // fp32 accumulation only (≈ √(K/8)·2^-24 relative)

TEST(GemmBf16, ThreeGemmsMatchDoubleReference) {
  Tensor x = random_tensor({T, K}, DType::bf16, 10), w = random_tensor({N, K}, DType::bf16, 11);
  Tensor dy = random_tensor({T, N}, DType::bf16, 12);
  const auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);

  Tensor y = poisoned({T, N}, DType::bf16);
  gemm_fprop(y, x, w);
  EXPECT_LE(rel_error(to_double(y), ref_tn(xd, wd, T, N, K)), kBf16OutTol);

  Tensor dx = poisoned({T, K}, DType::f32);
  gemm_dgrad(dx, dy, w);
  EXPECT_LE(rel_error(to_double(dx), ref_tn(dyd, transpose(wd, N, K), T, K, N)), kF32OutTol);

  Tensor dw = poisoned({N, K}, DType::f32);
  gemm_wgrad(dw, dy, x, false);
  const auto ref = ref_tn(transpose(dyd, T, N), transpose(xd, T, K), N, K, T);
  EXPECT_LE(rel_error(to_double(dw), ref), kF32OutTol);
  gemm_wgrad(dw, dy, x, true);  // accumulate a second micro-batch
  std::vector<double> twice = ref;
  for (double& v : twice) v *= 2;
  EXPECT_LE(rel_error(to_double(dw), twice), kF32OutTol);
}

// The fp32 recipe (CPU only): f32 operands, f32 or bf16 outputs.
TEST(GemmF32, ThreeGemmsMatchDoubleReference) {
  Tensor x = random_tensor({T, K}, DType::f32, 13, true), w = random_tensor({N, K}, DType::f32, 14);
  Tensor dy = random_tensor({T, N}, DType::f32, 15);
  const auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);

  Tensor y = poisoned({T, N}, DType::f32), y16 = poisoned({T, N}, DType::bf16);
  gemm_fprop(y, x, w);
  gemm_fprop(y16, x, w);
  const auto y_ref = ref_tn(xd, wd, T, N, K);
  EXPECT_LE(rel_error(to_double(y), y_ref), kF32OutTol);
  EXPECT_LE(rel_error(to_double(y16), y_ref), kBf16OutTol);

  Tensor dx = poisoned({T, K}, DType::f32);
  gemm_dgrad(dx, dy, w);
  EXPECT_LE(rel_error(to_double(dx), ref_tn(dyd, transpose(wd, N, K), T, K, N)), kF32OutTol);

  Tensor dw = poisoned({N, K}, DType::f32);
  gemm_wgrad(dw, dy, x, false);
  EXPECT_LE(rel_error(to_double(dw), ref_tn(transpose(dyd, T, N), transpose(xd, T, K), N, K, T)),
            kF32OutTol);
}

TEST(GemmFp8, ThreeGemmsMatchDoubleReferenceOnQuantizedValues) {
  Tensor x = random_tensor({T, K}, DType::bf16, 20, true),
         w = random_tensor({N, K}, DType::f32, 21);
  Tensor dy = random_tensor({T, N}, DType::bf16, 22, true);
  Fp8Rows qx = Fp8Rows::empty(T, K, Device::cpu),
          qxt = Fp8Rows::empty_columnwise(T, K, Device::cpu);
  Fp8Rows qdy = Fp8Rows::empty(T, N, Device::cpu),
          qdyt = Fp8Rows::empty_columnwise(T, N, Device::cpu);
  Fp8Weight qw = Fp8Weight::empty(N, K, Device::cpu);
  quantize_rows_and_columns(qx, qxt, x);
  quantize_rows_and_columns(qdy, qdyt, dy);
  quantize_weight(qw, w);

  Tensor y = poisoned({T, N}, DType::bf16);
  gemm_fprop(y, qx, qw);
  EXPECT_LE(rel_error(to_double(y), ref_tn(dequantized(qx), dequantized(qw.w), T, N, K)),
            kBf16OutTol);

  Tensor dx = poisoned({T, K}, DType::f32);
  gemm_dgrad(dx, qdy, qw);
  EXPECT_LE(rel_error(to_double(dx), ref_tn(dequantized(qdy), dequantized(qw.wt), T, K, N)),
            kF32OutTol);

  Tensor dw = poisoned({N, K}, DType::f32);
  gemm_wgrad(dw, qdyt, qxt, false);
  const int64_t Tp = qxt.cols();
  EXPECT_LE(rel_error(to_double(dw), ref_tn(dequantized(qdyt), dequantized(qxt), N, K, Tp)),
            kF32OutTol);

  // And the quantized GEMM is close to the exact product of the unquantized operands.
  std::vector<double> exact = ref_tn(to_double(x), to_double(w), T, N, K);
  EXPECT_LE(rel_error(to_double(y), exact), 0.06);
}

// ---- partial 128-groups (widths that are multiples of 16) ---------------------------------------

// q dequantized to its unpadded width `cols` (the stored padding is not read).
template <class Q>
std::vector<double> dequantized(const Q& q, int64_t cols) {
  Tensor f = Tensor::empty({q.rows(), cols}, DType::f32);
  dequantize(f, q);
  return to_double(f);
}

class GemmFp8Partial : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

// The three GEMMs at K and N that end inside a 128-group: against the double product of the
// dequantized, unpadded operands (the padding adds nothing), at the tolerances above.
TEST_P(GemmFp8Partial, ThreeGemmsMatchDoubleReferenceOnQuantizedValues) {
  const auto [t, n, k] = GetParam();
  Tensor x = random_tensor({t, k}, DType::bf16, 60, true), w = random_tensor({n, k}, DType::f32, 61);
  Tensor dy = random_tensor({t, n}, DType::bf16, 62, true);
  Fp8Rows qx = Fp8Rows::empty(t, k, Device::cpu), qxt = Fp8Rows::empty_columnwise(t, k, Device::cpu);
  Fp8Rows qdy = Fp8Rows::empty(t, n, Device::cpu), qdyt = Fp8Rows::empty_columnwise(t, n, Device::cpu);
  Fp8Weight qw = Fp8Weight::empty(n, k, Device::cpu);
  quantize_rows_and_columns(qx, qxt, x);
  quantize_rows_and_columns(qdy, qdyt, dy);
  quantize_weight(qw, w);

  Tensor y = poisoned({t, n}, DType::bf16);
  gemm_fprop(y, qx, qw);
  EXPECT_LE(rel_error(to_double(y), ref_tn(dequantized(qx, k), dequantized(qw.w, k), t, n, k)), kBf16OutTol);
  EXPECT_LE(rel_error(to_double(y), ref_tn(to_double(x), to_double(w), t, n, k)), 0.06);

  Tensor dx = poisoned({t, k}, DType::f32);
  gemm_dgrad(dx, qdy, qw);
  EXPECT_LE(rel_error(to_double(dx), ref_tn(dequantized(qdy, n), dequantized(qw.wt, n), t, k, n)), kF32OutTol);

  Tensor dw = poisoned({n, k}, DType::f32);
  gemm_wgrad(dw, qdyt, qxt, false);
  EXPECT_LE(rel_error(to_double(dw), ref_tn(dequantized(qdyt, t), dequantized(qxt, t), n, k, t)), kF32OutTol);
}

// SmolLM2-135M's qkv (N 960 over K 576: a block straddles q and k), a small layer (N 192, K 320,
// 7 tokens), and K 208 (one whole group and 80) under 130 tokens (a partial token group too).
INSTANTIATE_TEST_SUITE_P(Shapes, GemmFp8Partial,
                         ::testing::Values(std::make_tuple(int64_t{45}, int64_t{960}, int64_t{576}),
                                           std::make_tuple(int64_t{7}, int64_t{192}, int64_t{320}),
                                           std::make_tuple(int64_t{130}, int64_t{576}, int64_t{208})));

// ---- determinism -------------------------------------------------------------------------------

// One element in the documented order (ops/cpu/gemm.cpp): lane p % 8 += a[p·sa]·b[p·sb] by fma for
// p = 0, 1, ... over n rounded up to a multiple of 8 (zeros beyond n), then the lane tree.
float documented_dot(int64_t n, const float* a, int64_t sa, const float* b, int64_t sb) {
  float lane[8] = {};
  for (int64_t p = 0; p < round_up(n, 8); ++p)
    lane[p % 8] =
        p < n ? std::fma(a[p * sa], b[p * sb], lane[p % 8]) : std::fma(0.0f, 0.0f, lane[p % 8]);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

std::vector<float> values(const Tensor& t) {
  const std::vector<double> d = to_double(t);
  return std::vector<float>(d.begin(), d.end());  // exact: every element is an fp32 value
}

// Expects out[r][c] to hold exactly expected(row0 + r, col0 + c) rounded to out's dtype.
void expect_bits(const Tensor& out, int64_t row0, int64_t col0, const std::vector<float>& expected,
                 int64_t expected_cols, const char* what) {
  int64_t bad = 0;
  for (int64_t r = 0; r < out.dim(0); ++r)
    for (int64_t c = 0; c < out.dim(1); ++c) {
      const float e = expected[size_t((row0 + r) * expected_cols + col0 + c)];
      const int64_t i = r * out.dim(1) + c;
      const bool same = out.dtype() == DType::f32
                            ? float_bits(out.data_as<float>()[i]) == float_bits(e)
                            : out.data_as<bf16>()[i].bits == float_to_bf16(e).bits;
      bad += !same;
    }
  EXPECT_EQ(bad, 0) << what << ": elements differing from the documented order";
}

// Runs `fn` under 1, 2 and 3 OpenMP threads.
void with_thread_counts(const std::function<void(int)>& fn) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    fn(threads);
  }
  omp_set_num_threads(saved);
}

// M, N and the reductions are not multiples of the micro- or macro-tile sizes and K spans two K
// chunks, with a tail (1100) or without (1096: products of up to 64 rows then read w in place
// instead of packing it), so edges, tails, chunk boundaries and both ways of reading w are
// exercised.
constexpr int64_t kM = 100, kN = 70;

class GemmDeterminism : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(GemmDeterminism, EveryElementFollowsTheDocumentedOrder) {
  const auto [dt, kK] = GetParam();
  Tensor x = random_tensor({kM, kK}, dt, 40, true), w = random_tensor({kN, kK}, dt, 41);
  Tensor dy = random_tensor({kM, kN}, dt, 42);
  const std::vector<float> xv = values(x), wv = values(w), dyv = values(dy);
  std::vector<float> y_ref(size_t(kM * kN)), dx_ref(size_t(kM * kK)), dw_ref(size_t(kN * kK));
  for (int64_t i = 0; i < kM; ++i)
    for (int64_t j = 0; j < kN; ++j)
      y_ref[size_t(i * kN + j)] =
          documented_dot(kK, &xv[size_t(i * kK)], 1, &wv[size_t(j * kK)], 1);
  for (int64_t i = 0; i < kM; ++i)
    for (int64_t j = 0; j < kK; ++j)
      dx_ref[size_t(i * kK + j)] = documented_dot(kN, &dyv[size_t(i * kN)], 1, &wv[size_t(j)], kK);
  for (int64_t i = 0; i < kN; ++i)
    for (int64_t j = 0; j < kK; ++j)
      dw_ref[size_t(i * kK + j)] = documented_dot(kM, &dyv[size_t(i)], kN, &xv[size_t(j)], kK);

  with_thread_counts([&](int threads) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    for (DType out_dt : {DType::f32, DType::bf16}) {
      Tensor y = poisoned({kM, kN}, out_dt);
      gemm_fprop(y, x, w);
      expect_bits(y, 0, 0, y_ref, kN, "fprop");
      // Sub-batches of rows and of output columns (weight rows): the same bits.
      for (auto [r0, r1, c0, c1] : {std::array<int64_t, 4>{0, 1, 0, kN},
                                    {7, 12, 0, kN},
                                    {99, 100, 3, 5},
                                    {13, 50, 61, 70},
                                    {2, 41, 1, 66},
                                    {20, 90, 5, 70}}) {
        Tensor part = poisoned({r1 - r0, c1 - c0}, out_dt);
        gemm_fprop(part, x.rows(r0, r1), w.rows(c0, c1));
        expect_bits(part, r0, c0, y_ref, kN, "fprop on a sub-block");
      }
      Tensor dx = poisoned({kM, kK}, out_dt), dx_part = poisoned({5, kK}, out_dt);
      gemm_dgrad(dx, dy, w);
      expect_bits(dx, 0, 0, dx_ref, kK, "dgrad");
      gemm_dgrad(dx_part, dy.rows(94, 99), w);
      expect_bits(dx_part, 94, 0, dx_ref, kK, "dgrad on a sub-batch");
    }
    Tensor dw = poisoned({kN, kK}, DType::f32);
    gemm_wgrad(dw, dy, x, false);
    expect_bits(dw, 0, 0, dw_ref, kK, "wgrad");
  });
}

INSTANTIATE_TEST_SUITE_P(DtypesAndK, GemmDeterminism,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f32),
                                            ::testing::Values(int64_t{1100}, int64_t{1096})),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_K" +
                                  std::to_string(std::get<1>(info.param));
                         });

// fp8: acc += partial·(sa·sb) over the 128-wide blocks in increasing order, each partial a
// documented_dot of the blocks' e4m3 values. a, b: [rows, k] e4m3 values; sa, sb: scale(row, kb).
template <class ScaleA, class ScaleB>
std::vector<float> documented_fp8(const std::vector<float>& a, const std::vector<float>& b,
                                  int64_t m, int64_t n, int64_t k, ScaleA sa, ScaleB sb) {
  std::vector<float> out(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t kb = 0; kb < k / kQuantGroup; ++kb) {
        const int64_t k0 = kb * kQuantGroup;
        const float partial =
            documented_dot(kQuantGroup, &a[size_t(i * k + k0)], 1, &b[size_t(j * k + k0)], 1);
        acc += partial * (sa(i, kb) * sb(j, kb));
      }
      out[size_t(i * n + j)] = acc;
    }
  return out;
}

TEST(GemmFp8Determinism, EveryElementFollowsTheDocumentedOrder) {
  constexpr int64_t M = 50, Nw = 384, Kw = 1152;  // 9 K blocks: two K chunks
  Tensor x = random_tensor({M, Kw}, DType::bf16, 50, true),
         w = random_tensor({Nw, Kw}, DType::f32, 51);
  Tensor dy = random_tensor({M, Nw}, DType::bf16, 52, true);
  Fp8Rows qx = Fp8Rows::empty(M, Kw, Device::cpu),
          qxt = Fp8Rows::empty_columnwise(M, Kw, Device::cpu);
  Fp8Rows qdyt = Fp8Rows::empty_columnwise(M, Nw, Device::cpu);
  Fp8Weight qw = Fp8Weight::empty(Nw, Kw, Device::cpu);
  quantize_rows_and_columns(qx, qxt, x);
  quantize_columns(qdyt, dy);
  quantize_weight(qw, w);
  // Row 5 of x holds every finite e4m3 code (subnormals, both signs), not just typical ones.
  for (int64_t c = 0; c < Kw; ++c) {
    const uint8_t code = uint8_t(c * 37 % 256);
    qx.data.data_as<e4m3>()[5 * Kw + c] = e4m3{(code & 0x7f) == 0x7f ? uint8_t(0x01) : code};
  }
  auto row_scale = [](const Fp8Rows& q) {
    return [&q](int64_t r, int64_t kb) { return q.scales.data_as<float>()[kb * q.rows() + r]; };
  };
  auto block_scale = [&](int64_t j, int64_t kb) {
    return qw.w.scales.data_as<float>()[(j / kQuantGroup) * qw.w.scales.dim(1) + kb];
  };
  const std::vector<float> y_ref =
      documented_fp8(values(qx.data), values(qw.w.data), M, Nw, Kw, row_scale(qx), block_scale);
  const std::vector<float> dw_ref = documented_fp8(values(qdyt.data), values(qxt.data), Nw, Kw,
                                                   qxt.cols(), row_scale(qdyt), row_scale(qxt));

  // The weight's second block row on its own: the same blocks, so the same bytes and scales.
  Fp8Weight qw_part = Fp8Weight::empty(128, Kw, Device::cpu);
  quantize_weight(qw_part, w.rows(128, 256));
  with_thread_counts([&](int threads) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    Tensor y = poisoned({M, Nw}, DType::f32);
    gemm_fprop(y, qx, qw);
    expect_bits(y, 0, 0, y_ref, Nw, "fprop");
    for (auto [r0, r1] : {std::array<int64_t, 2>{0, 1}, {44, 45}, {6, 50}}) {
      Fp8Rows part = Fp8Rows::empty(r1 - r0, Kw, Device::cpu);
      quantize_rows(part, x.rows(r0, r1));
      Tensor y_part = poisoned({r1 - r0, 128}, DType::bf16);
      gemm_fprop(y_part, part, qw_part);
      expect_bits(y_part, r0, 128, y_ref, Nw, "fprop on a sub-block");
    }
    Tensor dw = poisoned({Nw, Kw}, DType::f32);
    gemm_wgrad(dw, qdyt, qxt, false);
    expect_bits(dw, 0, 0, dw_ref, Kw, "wgrad");
  });
}

// A NaN operand makes its row NaN, stored as float_to_bf16 stores a NaN (0x7FFF).
TEST(Gemm, NanInputGivesNanRow) {
  Tensor x = random_tensor({5, 40}, DType::bf16, 60), w = random_tensor({9, 40}, DType::bf16, 61);
  x.data_as<bf16>()[2 * 40 + 17] = float_to_bf16(NAN);
  Tensor y = poisoned({5, 9}, DType::bf16);
  gemm_fprop(y, x, w);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 9; ++j) {
      const uint16_t bits = y.data_as<bf16>()[i * 9 + j].bits;
      if (i == 2)
        EXPECT_EQ(bits, 0x7FFF) << j;
      else
        EXPECT_FALSE(std::isnan(bf16_to_float(bf16{bits}))) << i << ", " << j;
    }
}

// An e4m3 NaN code (from a non-finite group) makes its row NaN.
TEST(GemmFp8, NanCodeGivesNanRow) {
  Tensor x = random_tensor({5, 128}, DType::bf16, 62),
         w = random_tensor({128, 128}, DType::f32, 63);
  Fp8Rows qx = Fp8Rows::empty(5, 128, Device::cpu);
  Fp8Weight qw = Fp8Weight::empty(128, 128, Device::cpu);
  quantize_rows(qx, x);
  quantize_weight(qw, w);
  qx.data.data_as<e4m3>()[3 * 128 + 77] = e4m3{0xff};
  Tensor y = poisoned({5, 128}, DType::f32);
  gemm_fprop(y, qx, qw);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 128; ++j)
      EXPECT_EQ(std::isnan(y.data_as<float>()[i * 128 + j]), i == 3) << i << ", " << j;
}

TEST(Gemm, BadArgumentsAreClearErrors) {
  Tensor x = random_tensor({4, 128}, DType::bf16, 1), w = random_tensor({256, 256}, DType::bf16, 2);
  Tensor y = Tensor::empty({4, 256}, DType::bf16);
  expect_error([&] { gemm_fprop(y, x, w); }, "inner dimensions differ");
  Tensor w2 = random_tensor({256, 128}, DType::bf16, 3);
  Tensor y_bad = Tensor::empty({4, 255}, DType::bf16);
  expect_error([&] { gemm_fprop(y_bad, x, w2); }, "gemm_fprop: y: expected shape");
  Tensor y_int = Tensor::empty({4, 256}, DType::i32);
  expect_error([&] { gemm_fprop(y_int, x, w2); }, "gemm_fprop: y: output must be bf16 or f32");
  Tensor x_f32 = random_tensor({4, 128}, DType::f32, 4);
  expect_error([&] { gemm_fprop(y, x_f32, w2); }, "gemm_fprop: w: expected dtype f32");
  Tensor x_i32 = Tensor::empty({4, 128}, DType::i32);
  expect_error([&] { gemm_fprop(y, x_i32, w2); }, "gemm_fprop: x: expected dtype bf16 (or f32");
  // f32 operands on CUDA: refused before any memory is touched, so a fake view suffices.
  float fake[1];
  Tensor x_cuda = Tensor::view_of(fake, {4, 128}, DType::f32, Device::cuda);
  Tensor w_cuda = Tensor::view_of(fake, {256, 128}, DType::f32, Device::cuda);
  Tensor y_cuda = Tensor::view_of(fake, {4, 256}, DType::f32, Device::cuda);
  expect_error([&] { gemm_fprop(y_cuda, x_cuda, w_cuda); }, "f32 GEMM operands are CPU-only");
  Tensor dw_bf16 = Tensor::empty({256, 128}, DType::bf16);
  Tensor dy = random_tensor({4, 256}, DType::bf16, 5);
  expect_error([&] { gemm_wgrad(dw_bf16, dy, x, false); }, "gemm_wgrad: dw: expected dtype f32");
  Fp8Weight qw = Fp8Weight::empty(256, 128, Device::cpu);
  std::swap(qw.w, qw.wt);  // not a [N, K] / [K, N] pair for this x
  Fp8Rows qx = Fp8Rows::empty(4, 128, Device::cpu);
  EXPECT_THROW(gemm_fprop(y, qx, qw), Error);
}

}  // namespace
}  // namespace lockstep
