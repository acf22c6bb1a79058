// The CUDA layer ops (embedding, RMSNorm, SwiGLU, elementwise, the fused fp8 producers) against the
// CPU reference ops on the same inputs: bf16 activations, f32 weights, odd row counts (1, 7, 300,
// 1001) and model-like widths (2048, 6144), plus narrow rows (partial warps) and more rows than a
// grid dimension holds (65535). Every output is poisoned (NaN bytes) before the op writes it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "numerics/quantize.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::poisoned;
using testing::random_tensor;
using testing::rel_error;
using testing::same_bytes;
using testing::to_double;
using testing::worst_row_error;

// bf16 outputs of the same fp32 math, up to summation order (RMSNorm) or an exp that differs in the
// last bit or two (SwiGLU): the fp32 values differ by ~1e-6 relative, so an element's bf16 rounding
// differs by at most one step (2^-8 relative), and rarely; normwise that is ≤ 2^-8 ≈ 3.9e-3.
constexpr double kBf16Tol = 4e-3;
// fp32 sums in another order: for the row sums of squares (≤ 6144 positive terms) and the column
// sums over ≤ 1001 rows, typically √n · 2^-24 ≤ 5e-6 of the result.
constexpr double kF32SumTol = 1e-5;
// Fused fp8 against the CPU composition: the bf16 values feeding the quantizer may differ in the
// last bit (see kBf16Tol), which can move a group's scale slightly or flip an element's E4M3
// rounding (2^-3 of that element); 1e-2 normwise allows for ~1% of elements doing so.
constexpr double kFp8Tol = 1e-2;
// With power-of-two scales a one-bit change of a group's amax can double its scale when the amax
// sits at a power of two (seen on the H200: a 1001×2048 row at 2.0e-2): every element of that
// group then moves by up to one E4M3 step, ~1.5% of a 2048-wide row per group.
constexpr double kFp8Pow2Tol = 5e-2;
double fp8_tolerance(ScaleFormat f) { return f == ScaleFormat::pow2 ? kFp8Pow2Tol : kFp8Tol; }

Fp8Rows poisoned_rows(int64_t rows, int64_t cols, Device device, bool columnwise) {
  Fp8Rows q = columnwise ? Fp8Rows::empty_columnwise(rows, cols, device)
                         : Fp8Rows::empty(rows, cols, device);
  q.data.fill_bytes(0xFF);
  q.scales.fill_bytes(0xFF);
  return q;
}

std::string shape_name(int64_t rows, int64_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

// ---- embedding ---------------------------------------------------------------------------------

constexpr int64_t kVocab = 1000;

// Ids in [0, range) (runs of repeated ids), plus both ends of the vocabulary.
Tensor token_ids(int64_t count, int32_t range, uint64_t seed) {
  Tensor t = Tensor::empty({count}, DType::i32);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, range - 1);
  for (int64_t i = 0; i < count; ++i) t.data_as<int32_t>()[i] = id(rng);
  t.data_as<int32_t>()[0] = int32_t(kVocab) - 1;
  t.data_as<int32_t>()[count - 1] = 0;
  return t;
}

class EmbeddingGpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int32_t>> {};

// A copy, and a backward that does the CPU's additions in the CPU's order: the same bits.
TEST_P(EmbeddingGpu, SameBitsAsCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, H, range] = GetParam();
  const Tensor tokens = token_ids(T, range, uint64_t(T + H));
  const Tensor table = random_tensor({kVocab, H}, DType::bf16, 1);
  Tensor out_cpu = poisoned({T, H}, DType::bf16, Device::cpu);
  embedding_forward(out_cpu, tokens, table);
  Tensor out = poisoned({T, H}, DType::bf16, Device::cuda);
  embedding_forward(out, tokens.to(Device::cuda), table.to(Device::cuda));
  EXPECT_TRUE(same_bytes(out, out_cpu)) << "forward";

  const Tensor dout = random_tensor({T, H}, DType::bf16, 2, /*varied_rows=*/true);
  const Tensor dtable0 = random_tensor({kVocab, H}, DType::f32, 3);
  Tensor dtable_cpu = dtable0.to(Device::cpu), dtable = dtable0.to(Device::cuda);
  embedding_backward(dtable_cpu, tokens, dout);
  embedding_backward(dtable, tokens.to(Device::cuda), dout.to(Device::cuda));
  EXPECT_TRUE(same_bytes(dtable, dtable_cpu)) << "backward";
}

// Ids in [0, 3): runs of hundreds of positions, longer than a block's batch of rows.
INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingGpu,
                         ::testing::Combine(::testing::Values(1, 7, 300, 1001),
                                            ::testing::Values(2048, 6144), ::testing::Values(3, 40)));
// More rows than gridDim.y (65535): the forward strides over rows.
INSTANTIATE_TEST_SUITE_P(ManyRows, EmbeddingGpu,
                         ::testing::Values(std::make_tuple(int64_t(70000), int64_t(16), int32_t(500))));

// Token ids on the GPU are not checked on the host: a bad one gives NaN where it would have
// contributed, and every other row stays right.
TEST(EmbeddingGpuIds, BadTokensGiveNaNNotOutOfBoundsAccess) {
  LOCKSTEP_REQUIRE_GPU();
  const int64_t T = 50, H = 256, bad[] = {3, 17, 40};
  Tensor tokens = token_ids(T, 40, 4);
  tokens.data_as<int32_t>()[3] = -1;
  tokens.data_as<int32_t>()[17] = int32_t(kVocab);
  tokens.data_as<int32_t>()[40] = 1 << 30;
  const Tensor table = random_tensor({kVocab, H}, DType::bf16, 5);
  Tensor out = poisoned({T, H}, DType::bf16, Device::cuda);
  embedding_forward(out, tokens.to(Device::cuda), table.to(Device::cuda));
  const std::vector<double> o = to_double(out), tv = to_double(table);
  for (int64_t t = 0; t < T; ++t) {
    const bool is_bad = t == bad[0] || t == bad[1] || t == bad[2];
    for (int64_t h = 0; h < H; ++h) {
      const double v = o[size_t(t * H + h)];
      if (is_bad) EXPECT_TRUE(std::isnan(v)) << "row " << t;
      else EXPECT_EQ(v, tv[size_t(tokens.data_as<int32_t>()[t] * H + h)]) << "row " << t;
    }
  }

  // Backward: the CPU reference on the good positions only; dtable row 0 turns NaN.
  const Tensor dout = random_tensor({T, H}, DType::bf16, 6);
  const Tensor dtable0 = random_tensor({kVocab, H}, DType::f32, 7);
  Tensor dtable = dtable0.to(Device::cuda);
  embedding_backward(dtable, tokens.to(Device::cuda), dout.to(Device::cuda));
  Tensor good_tokens = Tensor::empty({T - 3}, DType::i32), good_dout = Tensor::empty({T - 3, H}, DType::bf16);
  for (int64_t t = 0, g = 0; t < T; ++t) {
    if (t == bad[0] || t == bad[1] || t == bad[2]) continue;
    good_tokens.data_as<int32_t>()[g] = tokens.data_as<int32_t>()[t];
    good_dout.rows(g, g + 1).copy_from(dout.rows(t, t + 1));
    ++g;
  }
  Tensor dtable_cpu = dtable0.to(Device::cpu);
  embedding_backward(dtable_cpu, good_tokens, good_dout);
  const Tensor result = dtable.to(Device::cpu);
  for (int64_t h = 0; h < H; ++h) EXPECT_TRUE(std::isnan(result.data_as<float>()[h])) << h;
  EXPECT_TRUE(same_bytes(result.rows(1, kVocab), dtable_cpu.rows(1, kVocab)));
}

// ---- RMSNorm -----------------------------------------------------------------------------------

constexpr float kEps = 1e-6f;

class RmsNormGpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(RmsNormGpu, ForwardAndBackwardMatchCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [R, C] = GetParam();
  const Tensor w = random_tensor({C}, DType::f32, 10);
  // Rows from 1e-3 to 1e2: eps matters in the smallest.
  const Tensor x = random_tensor({R, C}, DType::bf16, 11, /*varied_rows=*/true);
  const Tensor dy = random_tensor({R, C}, DType::bf16, 12, /*varied_rows=*/true);
  const Tensor dw0 = random_tensor({C}, DType::f32, 13);
  const Tensor xg = x.to(Device::cuda), dyg = dy.to(Device::cuda), wg = w.to(Device::cuda);

  Tensor y_cpu = poisoned({R, C}, DType::bf16, Device::cpu), rstd_cpu = poisoned({R}, DType::f32, Device::cpu);
  rmsnorm_forward(y_cpu, rstd_cpu, x, w, kEps);
  Tensor y = poisoned({R, C}, DType::bf16, Device::cuda), rstd = poisoned({R}, DType::f32, Device::cuda);
  rmsnorm_forward(y, rstd, xg, wg, kEps);
  EXPECT_LE(worst_row_error(to_double(y), to_double(y_cpu), C), kBf16Tol);
  EXPECT_LE(worst_row_error(to_double(rstd), to_double(rstd_cpu), 1), kF32SumTol);

  // Both backwards from the same rstd (the CPU's), so only the backward differs.
  Tensor dx_cpu = poisoned({R, C}, DType::bf16, Device::cpu), dw_cpu = dw0.to(Device::cpu);
  rmsnorm_backward(dx_cpu, dw_cpu, dy, x, w, rstd_cpu);
  const Tensor rstd_g = rstd_cpu.to(Device::cuda);
  Tensor dx = poisoned({R, C}, DType::bf16, Device::cuda), dw = dw0.to(Device::cuda);
  rmsnorm_backward(dx, dw, dyg, xg, wg, rstd_g);
  EXPECT_LE(worst_row_error(to_double(dx), to_double(dx_cpu), C), kBf16Tol);
  EXPECT_LE(rel_error(to_double(dw), to_double(dw_cpu)), kF32SumTol);

  // dw's sums have a fixed order: a second run gives the same bits.
  Tensor dx2 = poisoned({R, C}, DType::bf16, Device::cuda), dw2 = dw0.to(Device::cuda);
  rmsnorm_backward(dx2, dw2, dyg, xg, wg, rstd_g);
  EXPECT_TRUE(same_bytes(dw2, dw));
  EXPECT_TRUE(same_bytes(dx2, dx));
}

// A row normalizes to the same bits alone as in a batch (the rollout = training-forward property).
TEST_P(RmsNormGpu, RowsAreIndependentOfTheBatch) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [R, C] = GetParam();
  const Tensor w = random_tensor({C}, DType::f32, 14).to(Device::cuda);
  const Tensor x = random_tensor({R, C}, DType::bf16, 15, true).to(Device::cuda);
  Tensor y = poisoned({R, C}, DType::bf16, Device::cuda), rstd = poisoned({R}, DType::f32, Device::cuda);
  rmsnorm_forward(y, rstd, x, w, kEps);
  const int64_t row = R / 2;
  const Tensor x1 = x.rows(row, row + 1).to(Device::cuda);
  Tensor y1 = poisoned({1, C}, DType::bf16, Device::cuda), rstd1 = poisoned({1}, DType::f32, Device::cuda);
  rmsnorm_forward(y1, rstd1, x1, w, kEps);
  EXPECT_TRUE(same_bytes(y1, y.rows(row, row + 1)));
  EXPECT_TRUE(same_bytes(rstd1, rstd.rows(row, row + 1)));
}

// 200 columns: 25 vectors, a partly idle warp; 1001 rows: a last part of one row (RowParts).
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormGpu,
                         ::testing::Combine(::testing::Values(1, 7, 300, 1001),
                                            ::testing::Values(200, 2048, 6144)),
                         [](const auto& info) {
                           return shape_name(std::get<0>(info.param), std::get<1>(info.param));
                         });

class RmsNormFp8Gpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, ScaleFormat>> {};

// The fused producer gives the bytes of CUDA rmsnorm_forward followed by CUDA quantization (the same
// code on the same values), and is close to the CPU composition.
TEST_P(RmsNormFp8Gpu, SameBytesAsTheComposition) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [R, C, format] = GetParam();
  const Tensor w = random_tensor({C}, DType::f32, 20);
  const Tensor x = random_tensor({R, C}, DType::bf16, 21, true);
  const Tensor xg = x.to(Device::cuda), wg = w.to(Device::cuda);

  Tensor y = poisoned({R, C}, DType::bf16, Device::cuda), rstd = poisoned({R}, DType::f32, Device::cuda);
  rmsnorm_forward(y, rstd, xg, wg, kEps);
  Fp8Rows rows = poisoned_rows(R, C, Device::cuda, false), cols = poisoned_rows(R, C, Device::cuda, true);
  quantize_rows_and_columns(rows, cols, y, format);

  Fp8Rows f_rows = poisoned_rows(R, C, Device::cuda, false), f_cols = poisoned_rows(R, C, Device::cuda, true);
  Tensor f_rstd = poisoned({R}, DType::f32, Device::cuda);
  rmsnorm_forward_fp8(f_rows, f_cols, f_rstd, xg, wg, kEps, format);
  EXPECT_TRUE(same_bytes(f_rows.data, rows.data));
  EXPECT_TRUE(same_bytes(f_rows.scales, rows.scales));
  EXPECT_TRUE(same_bytes(f_cols.data, cols.data));
  EXPECT_TRUE(same_bytes(f_cols.scales, cols.scales));
  EXPECT_TRUE(same_bytes(f_rstd, rstd));

  Fp8Rows i_rows = poisoned_rows(R, C, Device::cuda, false), none;  // inference: rows only
  Tensor i_rstd = poisoned({R}, DType::f32, Device::cuda);
  rmsnorm_forward_fp8(i_rows, none, i_rstd, xg, wg, kEps, format);
  EXPECT_TRUE(same_bytes(i_rows.data, rows.data));
  EXPECT_TRUE(same_bytes(i_rows.scales, rows.scales));
  EXPECT_TRUE(same_bytes(i_rstd, rstd));

  Fp8Rows c_rows = poisoned_rows(R, C, Device::cpu, false), c_cols = poisoned_rows(R, C, Device::cpu, true);
  Tensor c_rstd = poisoned({R}, DType::f32, Device::cpu);
  rmsnorm_forward_fp8(c_rows, c_cols, c_rstd, x, w, kEps, format);
  const int64_t Tp = c_cols.cols();
  Tensor a = Tensor::empty({R, C}, DType::f32), b = Tensor::empty({R, C}, DType::f32);
  dequantize(a, Fp8Rows{f_rows.data.to(Device::cpu), f_rows.scales.to(Device::cpu)});
  dequantize(b, c_rows);
  EXPECT_LE(worst_row_error(to_double(a), to_double(b), C), fp8_tolerance(format));
  Tensor at = Tensor::empty({C, Tp}, DType::f32), bt = Tensor::empty({C, Tp}, DType::f32);
  dequantize(at, Fp8Rows{f_cols.data.to(Device::cpu), f_cols.scales.to(Device::cpu)});
  dequantize(bt, c_cols);
  EXPECT_LE(rel_error(to_double(at), to_double(bt)), fp8_tolerance(format));
}

// 1001 rows: 8 token tiles, the last partial (padding); 6144 × 1001: more tiles (384) than
// persistent blocks, so blocks prefetch.
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormFp8Gpu,
                         ::testing::Combine(::testing::Values(1, 7, 300, 1001),
                                            ::testing::Values(128, 2048, 6144),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));
// Decode sizes: rows only at T ≤ 256 is one row kernel (its rows sliced over a cluster up to 64;
// 257 the tile kernels), compared above with the tile kernels' bytes; 640 columns: 5 groups, so the
// last warp's second half-warp holds none.
INSTANTIATE_TEST_SUITE_P(Decode, RmsNormFp8Gpu,
                         ::testing::Combine(::testing::Values(1, 3, 64, 65, 256, 257), ::testing::Values(640, 4096),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));
// 20 × 32 = 640 tiles: several a persistent block, so the tile loop refills its loads.
// Widths with a partial 128-group (SmolLM2-135M's hidden 576; 192, 960): the composition runs,
// stored padded (numerics/quantize.h).
INSTANTIATE_TEST_SUITE_P(PartialGroups, RmsNormFp8Gpu,
                         ::testing::Combine(::testing::Values(1, 7, 64, 65, 300), ::testing::Values(576, 192, 960),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));
INSTANTIATE_TEST_SUITE_P(ManyTiles, RmsNormFp8Gpu,
                         ::testing::Values(std::make_tuple(int64_t(2500), int64_t(4096), ScaleFormat::fp32)));

class RmsNormResidualGpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// The residual add fused into every CUDA norm path gives the bits of CUDA add_into followed by the
// same path: the sum left in x, y (or the fp8 bytes and scales) and rstd. The sum is one exactly
// rounded add, so x also equals the CPU's bit for bit; y is close to the CPU's (kBf16Tol: the
// sums of squares run in another order, as in RmsNormGpu).
TEST_P(RmsNormResidualGpu, SameBitsAsAddIntoThenRmsNorm) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [R, C] = GetParam();
  const Tensor w = random_tensor({C}, DType::f32, 30), wg = w.to(Device::cuda);
  const Tensor x0 = random_tensor({R, C}, DType::bf16, 31, /*varied_rows=*/true);
  const Tensor residual = random_tensor({R, C}, DType::bf16, 32, /*varied_rows=*/true);
  const Tensor resg = residual.to(Device::cuda);
  Tensor sum = x0.to(Device::cuda);
  add_into(sum, resg);

  Tensor y = poisoned({R, C}, DType::bf16, Device::cuda), rstd = poisoned({R}, DType::f32, Device::cuda);
  rmsnorm_forward(y, rstd, sum, wg, kEps);
  Tensor x = x0.to(Device::cuda);
  Tensor f_y = poisoned({R, C}, DType::bf16, Device::cuda), f_rstd = poisoned({R}, DType::f32, Device::cuda);
  rmsnorm_forward(f_y, f_rstd, x, resg, wg, kEps);
  EXPECT_TRUE(same_bytes(x, sum));
  EXPECT_TRUE(same_bytes(f_y, y));
  EXPECT_TRUE(same_bytes(f_rstd, rstd));

  Tensor c_x = x0.to(Device::cpu);
  Tensor c_y = poisoned({R, C}, DType::bf16, Device::cpu), c_rstd = poisoned({R}, DType::f32, Device::cpu);
  rmsnorm_forward(c_y, c_rstd, c_x, residual, w, kEps);
  EXPECT_TRUE(same_bytes(x, c_x));
  EXPECT_LE(worst_row_error(to_double(f_y), to_double(c_y), C), kBf16Tol);
  EXPECT_LE(worst_row_error(to_double(f_rstd), to_double(c_rstd), 1), kF32SumTol);

  if (C % kQuantGroup != 0) return;
  for (const bool columns : {true, false}) {  // training (the tile kernels), inference (rows only)
    SCOPED_TRACE(columns ? "rows and columns" : "rows only");
    Fp8Rows none;
    Fp8Rows rows = poisoned_rows(R, C, Device::cuda, false);
    Fp8Rows cols = columns ? poisoned_rows(R, C, Device::cuda, true) : none;
    Tensor q_rstd = poisoned({R}, DType::f32, Device::cuda);
    rmsnorm_forward_fp8(rows, cols, q_rstd, sum, wg, kEps, ScaleFormat::pow2);

    x = x0.to(Device::cuda);
    Fp8Rows f_rows = poisoned_rows(R, C, Device::cuda, false);
    Fp8Rows f_cols = columns ? poisoned_rows(R, C, Device::cuda, true) : none;
    Tensor fq_rstd = poisoned({R}, DType::f32, Device::cuda);
    rmsnorm_forward_fp8(f_rows, f_cols, fq_rstd, x, resg, wg, kEps, ScaleFormat::pow2);
    EXPECT_TRUE(same_bytes(x, sum));
    EXPECT_TRUE(same_bytes(f_rows.data, rows.data));
    EXPECT_TRUE(same_bytes(f_rows.scales, rows.scales));
    if (columns) {
      EXPECT_TRUE(same_bytes(f_cols.data, cols.data));
      EXPECT_TRUE(same_bytes(f_cols.scales, cols.scales));
    }
    EXPECT_TRUE(same_bytes(fq_rstd, rstd));
  }
}

// Rows: 1 and 64 the decode kernels (a row sliced over a cluster of blocks where it is wide
// enough), 65, 256 and 300 one block a row (fp8 rows only: the row kernel up to 256, the tile
// kernels at 300; with columns the tile kernels). Columns: 200 and 640 one block a
// row at every size; 4096 (Qwen3-8B) 2 slices, 6144 3 (a cluster of 4, its last block past the
// row), 20480 10 (capped at 8, two vectors a thread). 200: no fp8 (not a multiple of 128).
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormResidualGpu,
                         ::testing::Combine(::testing::Values(1, 7, 64, 65, 256, 300),
                                            ::testing::Values(200, 640, 4096, 6144, 20480)),
                         [](const auto& info) {
                           return shape_name(std::get<0>(info.param), std::get<1>(info.param));
                         });

// ---- SwiGLU ------------------------------------------------------------------------------------

class SwiGluGpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(SwiGluGpu, ForwardAndBackwardMatchCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, I] = GetParam();
  // Rows from 1e-3 to 1e2: the gate reaches the saturated ends of the sigmoid (and exp overflow).
  const Tensor gate_up = random_tensor({T, 2 * I}, DType::bf16, 30, true);
  const Tensor dout = random_tensor({T, I}, DType::bf16, 31);
  const Tensor gu = gate_up.to(Device::cuda);

  Tensor out_cpu = poisoned({T, I}, DType::bf16, Device::cpu);
  swiglu_forward(out_cpu, gate_up);
  Tensor out = poisoned({T, I}, DType::bf16, Device::cuda);
  swiglu_forward(out, gu);
  EXPECT_LE(worst_row_error(to_double(out), to_double(out_cpu), I), kBf16Tol);

  Tensor d_cpu = poisoned({T, 2 * I}, DType::bf16, Device::cpu);
  swiglu_backward(d_cpu, dout, gate_up);
  Tensor d = poisoned({T, 2 * I}, DType::bf16, Device::cuda);
  swiglu_backward(d, dout.to(Device::cuda), gu);
  EXPECT_LE(worst_row_error(to_double(d), to_double(d_cpu), 2 * I), kBf16Tol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwiGluGpu,
                         ::testing::Combine(::testing::Values(1, 7, 300),
                                            ::testing::Values(8, 1024, 3072)));
INSTANTIATE_TEST_SUITE_P(ManyRows, SwiGluGpu,
                         ::testing::Values(std::make_tuple(int64_t(70000), int64_t(16))));

class SwiGluFp8Gpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, ScaleFormat>> {};

TEST_P(SwiGluFp8Gpu, SameBytesAsTheComposition) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, I, format] = GetParam();
  const Tensor gate_up = random_tensor({T, 2 * I}, DType::bf16, 40, true);
  const Tensor gu = gate_up.to(Device::cuda);

  Tensor out = poisoned({T, I}, DType::bf16, Device::cuda);
  swiglu_forward(out, gu);
  Fp8Rows rows = poisoned_rows(T, I, Device::cuda, false), cols = poisoned_rows(T, I, Device::cuda, true);
  quantize_rows_and_columns(rows, cols, out, format);

  Fp8Rows f_rows = poisoned_rows(T, I, Device::cuda, false), f_cols = poisoned_rows(T, I, Device::cuda, true);
  swiglu_forward_fp8(f_rows, f_cols, gu, format);
  EXPECT_TRUE(same_bytes(f_rows.data, rows.data));
  EXPECT_TRUE(same_bytes(f_rows.scales, rows.scales));
  EXPECT_TRUE(same_bytes(f_cols.data, cols.data));
  EXPECT_TRUE(same_bytes(f_cols.scales, cols.scales));

  Fp8Rows i_rows = poisoned_rows(T, I, Device::cuda, false), none;
  swiglu_forward_fp8(i_rows, none, gu, format);
  EXPECT_TRUE(same_bytes(i_rows.data, rows.data));
  EXPECT_TRUE(same_bytes(i_rows.scales, rows.scales));

  Fp8Rows c_rows = poisoned_rows(T, I, Device::cpu, false), c_cols = poisoned_rows(T, I, Device::cpu, true);
  swiglu_forward_fp8(c_rows, c_cols, gate_up, format);
  const int64_t Tp = c_cols.cols();
  Tensor a = Tensor::empty({T, I}, DType::f32), b = Tensor::empty({T, I}, DType::f32);
  dequantize(a, Fp8Rows{f_rows.data.to(Device::cpu), f_rows.scales.to(Device::cpu)});
  dequantize(b, c_rows);
  EXPECT_LE(worst_row_error(to_double(a), to_double(b), I), fp8_tolerance(format));
  Tensor at = Tensor::empty({I, Tp}, DType::f32), bt = Tensor::empty({I, Tp}, DType::f32);
  dequantize(at, Fp8Rows{f_cols.data.to(Device::cpu), f_cols.scales.to(Device::cpu)});
  dequantize(bt, c_cols);
  EXPECT_LE(rel_error(to_double(at), to_double(bt)), fp8_tolerance(format));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwiGluFp8Gpu,
                         ::testing::Combine(::testing::Values(1, 7, 300, 1001),
                                            ::testing::Values(128, 2048, 3072),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));
// Decode sizes: rows only at T ≤ 256 is a thread-per-vector kernel (257 the tile kernel), compared
// above with the tile kernel's bytes; 640 columns: 80 vectors a row, so blocks straddle rows.
INSTANTIATE_TEST_SUITE_P(Decode, SwiGluFp8Gpu,
                         ::testing::Combine(::testing::Values(1, 3, 64, 65, 256, 257), ::testing::Values(640, 12288),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));
// I with a partial 128-group (320, 208, 576): the composition runs, stored padded.
INSTANTIATE_TEST_SUITE_P(PartialGroups, SwiGluFp8Gpu,
                         ::testing::Combine(::testing::Values(1, 7, 64, 65, 300), ::testing::Values(320, 208, 576),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));
INSTANTIATE_TEST_SUITE_P(ManyTiles, SwiGluFp8Gpu,
                         ::testing::Values(std::make_tuple(int64_t(2500), int64_t(4096), ScaleFormat::fp32)));

class SwiGluE4m3Gpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// The recompute path's SwiGLU ops on the E4M3 input: the bytes of CUDA dequantize followed by the
// CUDA op on its bf16 output (the same operations on the same values), and close to the CPU's.
TEST_P(SwiGluE4m3Gpu, SameBytesAsDequantizeThenSwiGlu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, I] = GetParam();
  const Tensor gate_up = random_tensor({T, 2 * I}, DType::bf16, 50, true);
  const Tensor dout = random_tensor({T, I}, DType::bf16, 51), dout_g = dout.to(Device::cuda);
  Fp8Rows q = Fp8Rows::empty(T, 2 * I, Device::cpu);
  quantize_rows(q, gate_up);
  const Fp8Rows qg{q.data.to(Device::cuda), q.scales.to(Device::cuda)};
  Tensor deq = poisoned({T, 2 * I}, DType::bf16, Device::cuda);
  dequantize(deq, qg);

  Tensor d = poisoned({T, 2 * I}, DType::bf16, Device::cuda), f_d = poisoned({T, 2 * I}, DType::bf16, Device::cuda);
  swiglu_backward(d, dout_g, deq);
  swiglu_backward(f_d, dout_g, qg);
  EXPECT_TRUE(same_bytes(f_d, d));
  Tensor c_d = poisoned({T, 2 * I}, DType::bf16, Device::cpu);
  swiglu_backward(c_d, dout, q);
  EXPECT_LE(worst_row_error(to_double(f_d), to_double(c_d), 2 * I), kBf16Tol);

  // (I with a partial 128-group, 64 and 320: the forward is the composition itself.)
  Fp8Rows rows = poisoned_rows(T, I, Device::cuda, false), cols = poisoned_rows(T, I, Device::cuda, true);
  swiglu_forward_fp8(rows, cols, deq);
  Fp8Rows f_rows = poisoned_rows(T, I, Device::cuda, false), f_cols = poisoned_rows(T, I, Device::cuda, true);
  swiglu_forward_fp8(f_rows, f_cols, qg);
  EXPECT_TRUE(same_bytes(f_rows.data, rows.data));
  EXPECT_TRUE(same_bytes(f_rows.scales, rows.scales));
  EXPECT_TRUE(same_bytes(f_cols.data, cols.data));
  EXPECT_TRUE(same_bytes(f_cols.scales, cols.scales));
  Fp8Rows i_rows = poisoned_rows(T, I, Device::cuda, false), none;
  swiglu_forward_fp8(i_rows, none, qg);
  EXPECT_TRUE(same_bytes(i_rows.data, rows.data));
  EXPECT_TRUE(same_bytes(i_rows.scales, rows.scales));

  Fp8Rows c_rows = poisoned_rows(T, I, Device::cpu, false), c_cols = poisoned_rows(T, I, Device::cpu, true);
  swiglu_forward_fp8(c_rows, c_cols, q);
  Tensor a = Tensor::empty({T, I}, DType::f32), b = Tensor::empty({T, I}, DType::f32);
  dequantize(a, Fp8Rows{f_rows.data.to(Device::cpu), f_rows.scales.to(Device::cpu)});
  dequantize(b, c_rows);
  EXPECT_LE(worst_row_error(to_double(a), to_double(b), I), kFp8Tol);
}

// I = 64: gate and up share each 128-wide group of gate_up; I = 320: 2I = 640 whole groups, the
// output's last group partial.
INSTANTIATE_TEST_SUITE_P(Shapes, SwiGluE4m3Gpu,
                         ::testing::Combine(::testing::Values(1, 7, 300, 1001), ::testing::Values(64, 128, 320, 3072)));
// More rows than a grid dimension holds: the backward's blocks take several rows.
INSTANTIATE_TEST_SUITE_P(ManyRows, SwiGluE4m3Gpu, ::testing::Values(std::make_tuple(int64_t(70000), int64_t(64))));

// ---- elementwise -------------------------------------------------------------------------------

class ElementwiseGpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// One fp32 operation and one round to nearest even per element, as on the CPU: the same bits.
TEST_P(ElementwiseGpu, AddIntoAddBiasAndConvertGiveTheCpuBits) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, N] = GetParam();
  const Tensor y = random_tensor({T, N}, DType::bf16, 50, true), x = random_tensor({T, N}, DType::bf16, 51);
  const Tensor b = random_tensor({N}, DType::f32, 52);

  Tensor y_cpu = y.to(Device::cpu), y_gpu = y.to(Device::cuda);
  add_into(y_cpu, x);
  add_into(y_gpu, x.to(Device::cuda));
  EXPECT_TRUE(same_bytes(y_gpu, y_cpu)) << "add_into";
  // f32 (a sharded optimizer's gradient accumulation).
  Tensor f_cpu = random_tensor({T, N}, DType::f32, 53), f_gpu = f_cpu.to(Device::cuda);
  const Tensor fx = random_tensor({T, N}, DType::f32, 54);
  add_into(f_cpu, fx);
  add_into(f_gpu, fx.to(Device::cuda));
  EXPECT_TRUE(same_bytes(f_gpu, f_cpu)) << "add_into, f32";

  if (N % 8 == 0) {
    add_bias(y_cpu, b);
    add_bias(y_gpu, b.to(Device::cuda));
    EXPECT_TRUE(same_bytes(y_gpu, y_cpu)) << "add_bias";
  }

  const Tensor f = random_tensor({T, N}, DType::f32, 53, true);
  for (const Tensor* src : {&f, &y}) {
    const DType to = src->dtype() == DType::f32 ? DType::bf16 : DType::f32;
    SCOPED_TRACE(std::string(dtype_name(src->dtype())) + " -> " + std::string(dtype_name(to)));
    Tensor dst_cpu = poisoned({T, N}, to, Device::cpu), dst = poisoned({T, N}, to, Device::cuda);
    convert(dst_cpu, *src);
    convert(dst, src->to(Device::cuda));
    EXPECT_TRUE(same_bytes(dst, dst_cpu));
  }
}

// bias_backward and sum_squares: close to the CPU's sums, and the same bits run to run.
TEST_P(ElementwiseGpu, SumsAreCloseToCpuAndRepeat) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, N] = GetParam();
  const Tensor f = random_tensor({T, N}, DType::f32, 54, true);
  const Tensor fg = f.to(Device::cuda);
  const double ss_cpu = sum_squares(f), ss = sum_squares(fg);
  // Exact squares, positive terms: any order of summing n of them is within n · 2^-53 relative, so
  // two orders within twice that.
  EXPECT_NEAR(ss, ss_cpu, 2 * double(T * N) * 0x1p-53 * ss_cpu);
  EXPECT_EQ(sum_squares(fg), ss);
  // The list form (one wait for the device) gives each tensor's bits.
  const Tensor other = random_tensor({N}, DType::f32, 57).to(Device::cuda);
  const std::vector<double> sums = sum_squares({&other, &fg});
  EXPECT_EQ(sums[0], sum_squares(other));
  EXPECT_EQ(sums[1], ss);
  expect_error([&] { sum_squares({&fg, &f}); }, "sum_squares: x");  // one device

  if (N % 8 != 0) return;
  const Tensor dy = random_tensor({T, N}, DType::bf16, 55);
  const Tensor db0 = random_tensor({N}, DType::f32, 56);
  Tensor db_cpu = db0.to(Device::cpu), db = db0.to(Device::cuda), db2 = db0.to(Device::cuda);
  const Tensor dyg = dy.to(Device::cuda);
  bias_backward(db_cpu, dy);
  bias_backward(db, dyg);
  bias_backward(db2, dyg);
  // The CPU adds T terms of random sign in sequence: its error grows like 2^-24 · √(T/2) of the
  // result (1.1e-5 at T = 70000); the GPU's blocked order errs less.
  EXPECT_LE(rel_error(to_double(db), to_double(db_cpu)),
            std::max(kF32SumTol, 4 * 0x1p-24 * std::sqrt(double(T) / 2)));
  EXPECT_TRUE(same_bytes(db, db2));
}

// 7 × 13 = 91 elements: a partial last vector; 300 × 2048 and 1001 × 6144: more than one block
// of sum_squares (16384 elements), the last partial.
INSTANTIATE_TEST_SUITE_P(Shapes, ElementwiseGpu,
                         ::testing::Values(std::make_tuple(int64_t(1), int64_t(2048)),
                                           std::make_tuple(int64_t(7), int64_t(13)),
                                           std::make_tuple(int64_t(300), int64_t(2048)),
                                           std::make_tuple(int64_t(1001), int64_t(6144)),
                                           std::make_tuple(int64_t(70000), int64_t(8))));

// Rounding ties both ways, the overflow to infinity, infinities, NaN, signed zeros and subnormals.
TEST(ElementwiseGpuConvert, SpecialValuesGiveTheCpuBits) {
  LOCKSTEP_REQUIRE_GPU();
  const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu,
                           0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                           0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u,
                           0x00018000u, 0x3f7fffffu, 0xbf808001u};
  const int64_t n = int64_t(std::size(bits));
  Tensor f = Tensor::empty({1, n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) std::memcpy(f.data_as<float>() + i, &bits[i], 4);
  Tensor b_cpu = poisoned({1, n}, DType::bf16, Device::cpu), b = poisoned({1, n}, DType::bf16, Device::cuda);
  convert(b_cpu, f);
  convert(b, f.to(Device::cuda));
  EXPECT_TRUE(same_bytes(b, b_cpu));
}

// ---- argument checks ---------------------------------------------------------------------------

TEST(LayerOpsGpu, UnsupportedCudaArgumentsAreClearErrors) {
  LOCKSTEP_REQUIRE_GPU();
  const Device g = Device::cuda;
  const Tensor w = random_tensor({16}, DType::f32, 60).to(g);
  Tensor x32 = random_tensor({4, 16}, DType::f32, 61).to(g), y = Tensor::empty({4, 16}, DType::bf16, g);
  Tensor rstd = Tensor::empty({4}, DType::f32, g);
  expect_error([&] { rmsnorm_forward(y, rstd, x32, w, kEps); }, "rmsnorm_forward: x: the CUDA kernels take bf16");
  expect_error([&] { add_into(x32, y); }, "add_into: y: the CUDA kernels take bf16");

  const Tensor narrow = random_tensor({4, 12}, DType::bf16, 62).to(g);
  Tensor narrow_out = Tensor::empty({4, 12}, DType::bf16, g), rstd4 = Tensor::empty({4}, DType::f32, g);
  const Tensor w12 = random_tensor({12}, DType::f32, 63).to(g);
  expect_error([&] { rmsnorm_forward(narrow_out, rstd4, narrow, w12, kEps); },
               "rmsnorm_forward: x: the CUDA kernels need rows of a multiple of 8");

  // Rows of 4 bf16 (8 bytes): a view from row 1 starts 8 bytes into the allocation.
  const Tensor base = random_tensor({9, 4}, DType::bf16, 64).to(g);
  Tensor shifted = base.rows(1, 9);
  const Tensor other = random_tensor({8, 4}, DType::bf16, 65).to(g);
  expect_error([&] { add_into(shifted, other); }, "add_into: y: the CUDA kernels need 16-byte aligned");

  const Tensor gate_up = random_tensor({4, 80}, DType::bf16, 66).to(g);  // I = 40: no multiple of 16
  Fp8Rows out_rows, out_cols;
  expect_error([&] { swiglu_forward_fp8(out_rows, out_cols, gate_up); },
               "swiglu_forward_fp8: gate_up: the output width (40) must be a multiple of 16");
  const Tensor x = random_tensor({4, 128}, DType::bf16, 67).to(g), w128 = random_tensor({128}, DType::f32, 68).to(g);
  Fp8Rows y_rows = Fp8Rows::empty(4, 128, g), y_cols_wrong = Fp8Rows::empty(4, 128, g);
  expect_error([&] { rmsnorm_forward_fp8(y_rows, y_cols_wrong, rstd, x, w128, kEps); },
               "rmsnorm_forward_fp8: y_cols");
}

}  // namespace
}  // namespace lockstep
