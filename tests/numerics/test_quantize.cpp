// CPU reference quantizers: error bounds, exact scales, layouts, padding, non-finite input, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "numerics/quantize.h"
#include "numerics/scale.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::random_tensor;
using testing::to_double;

float value(const Tensor& x, int64_t i) {
  return x.dtype() == DType::bf16 ? bf16_to_float(x.data_as<bf16>()[i]) : x.data_as<float>()[i];
}

// E4M3 keeps 3 mantissa bits: round to nearest is within 2^-4 relative for normal codes, and within
// half the subnormal step 2^-10 · scale below them. (The small factor covers the fp32 division.)
void expect_within_fp8_error(float x, float back, float scale, const char* where) {
  const double bound = std::max(std::fabs(double(x)) * 0.0625, double(scale) * 0x1p-10) * 1.0001;
  ASSERT_LE(std::fabs(double(back) - x), bound) << where << " x=" << x << " scale=" << scale;
}

class RowsTest : public ::testing::TestWithParam<std::tuple<DType, ScaleFormat>> {};

TEST_P(RowsTest, RoundTripWithinBoundAndExactScales) {
  const auto [dtype, format] = GetParam();
  const int64_t T = 37, K = 384;
  Tensor x = random_tensor({T, K}, dtype, 1, /*varied_rows=*/true);
  Fp8Rows q = Fp8Rows::empty(T, K, Device::cpu);
  quantize_rows(q, x, format);
  Tensor back = Tensor::empty({T, K}, DType::f32);
  dequantize(back, q);
  Tensor back16 = Tensor::empty({T, K}, DType::bf16);
  dequantize(back16, q);
  for (int64_t i = 0; i < T * K; ++i)  // bf16 output: the f32 value rounded to nearest even
    ASSERT_EQ(back16.data_as<bf16>()[i].bits, float_to_bf16(back.data_as<float>()[i]).bits) << i;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t g = 0; g < K / 128; ++g) {
      float amax = 0;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(value(x, t * K + g * 128 + i)));
      const float scale = q.scales.data_as<float>()[g * T + t];  // layout: g * rows + r
      if (format == ScaleFormat::fp32) {
        EXPECT_EQ(scale, amax / 448.0f);
      } else {
        int e;
        EXPECT_EQ(std::frexp(scale, &e), 0.5f) << "not a power of two: " << scale;
        EXPECT_GE(scale, amax / 448.0f);
        EXPECT_LT(scale / 2, amax / 448.0f);
      }
      for (int i = 0; i < 128; ++i) {
        const int64_t j = t * K + g * 128 + i;
        expect_within_fp8_error(value(x, j), back.data_as<float>()[j], scale, "rows");
        // The largest element of a fp32-scaled group lands on ±448.
        if (format == ScaleFormat::fp32 && std::fabs(value(x, j)) == amax) {
          EXPECT_EQ(q.data.data_as<e4m3>()[j].bits & 0x7f, 0x7e);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, RowsTest,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f32),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));

TEST(QuantizeColumns, GroupsAlongTokensTransposedAndPadded) {
  const int64_t T = 200, K = 256, Tp = 256;
  Tensor x = random_tensor({T, K}, DType::bf16, 2, true);
  Fp8Rows qt = Fp8Rows::empty_columnwise(T, K, Device::cpu);
  ASSERT_EQ(qt.data.shape(), (Shape{K, Tp}));
  quantize_columns(qt, x);
  const e4m3* d = qt.data.data_as<e4m3>();
  const float* s = qt.scales.data_as<float>();
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t tb = 0; tb < Tp / 128; ++tb) {
      float amax = 0;
      for (int64_t t = tb * 128; t < std::min(T, (tb + 1) * 128); ++t)
        amax = std::max(amax, std::fabs(value(x, t * K + k)));
      const float scale = s[tb * K + k];
      EXPECT_EQ(scale, amax / 448.0f);
      for (int64_t t = tb * 128; t < (tb + 1) * 128; ++t) {
        const float back = e4m3_to_float(d[k * Tp + t]) * scale;
        if (t < T) {
          expect_within_fp8_error(value(x, t * K + k), back, scale, "columns");
        } else {
          EXPECT_EQ(d[k * Tp + t].bits, 0) << "padding token " << t;
        }
      }
    }
  }
  // The fused form gives the same bytes as the two separate ones.
  Fp8Rows q = Fp8Rows::empty(T, K, Device::cpu), q2 = Fp8Rows::empty(T, K, Device::cpu);
  Fp8Rows qt2 = Fp8Rows::empty_columnwise(T, K, Device::cpu);
  quantize_rows(q, x);
  quantize_rows_and_columns(q2, qt2, x);
  EXPECT_TRUE(testing::same_bytes(q.data, q2.data));
  EXPECT_TRUE(testing::same_bytes(q.scales, q2.scales));
  EXPECT_TRUE(testing::same_bytes(qt.data, qt2.data));
  EXPECT_TRUE(testing::same_bytes(qt.scales, qt2.scales));
}

TEST(QuantizeWeight, BlocksAndTransposeAgree) {
  const int64_t N = 256, K = 640;  // K/128 = 5 blocks: scale rows padded to 8
  Tensor w = random_tensor({N, K}, DType::f32, 3);
  // Give each block its own magnitude.
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < K; ++j) w.data_as<float>()[i * K + j] *= float(1 + (i / 128) * 5 + j / 128);
  Fp8Weight q = Fp8Weight::empty(N, K, Device::cpu);
  ASSERT_EQ(q.w.scales.shape(), (Shape{2, 8}));
  ASSERT_EQ(q.wt.scales.shape(), (Shape{5, 4}));
  quantize_weight(q, w);
  const float* s = q.w.scales.data_as<float>();
  const float* st = q.wt.scales.data_as<float>();
  for (int64_t bi = 0; bi < 2; ++bi) {
    for (int64_t bj = 0; bj < 8; ++bj) {
      if (bj >= 5) {
        EXPECT_EQ(s[bi * 8 + bj], 0.0f) << "scale padding";
        continue;
      }
      float amax = 0;
      for (int64_t i = bi * 128; i < bi * 128 + 128; ++i)
        for (int64_t j = bj * 128; j < bj * 128 + 128; ++j)
          amax = std::max(amax, std::fabs(w.data_as<float>()[i * K + j]));
      EXPECT_EQ(s[bi * 8 + bj], amax / 448.0f);
      EXPECT_EQ(st[bj * 4 + bi], s[bi * 8 + bj]);
    }
  }
  Tensor back = Tensor::empty({N, K}, DType::f32);
  dequantize(back, q.w);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t idx = i * K + j;
      expect_within_fp8_error(w.data_as<float>()[idx], back.data_as<float>()[idx],
                              s[(i / 128) * 8 + j / 128], "weight");
      EXPECT_EQ(q.w.data.data_as<e4m3>()[idx].bits, q.wt.data.data_as<e4m3>()[j * N + i].bits);
    }
}

// ---- Partial groups (widths that are multiples of 16, not of 128) --------------------------------

// The brute-force reference of one group: its values (the valid elements only) -> scale and bytes.
struct RefGroup {
  float scale;
  std::vector<uint8_t> bytes;
};
RefGroup ref_group(const std::vector<float>& v, bool pow2) {
  uint32_t amax = 0;
  for (float f : v) amax = std::max(amax, abs_bits(f));
  RefGroup g{group_scale(amax, pow2), {}};
  for (float f : v) g.bytes.push_back(float_to_e4m3(f * (1.0f / g.scale)).bits);
  return g;
}

class PartialGroupsTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, ScaleFormat>> {};

// Rows: groups of 128 along K, the last one cut at K; its scale is its valid elements', the stored
// row is padded with zero bytes to a multiple of 128. Columns: the same along T of xᵀ.
TEST_P(PartialGroupsTest, RowsAndColumnsMatchBruteForce) {
  const auto [T, K, format] = GetParam();
  const bool pow2 = format == ScaleFormat::pow2;
  Tensor x = random_tensor({T, K}, DType::bf16, 11, /*varied_rows=*/true);
  Fp8Rows q = Fp8Rows::empty(T, K, Device::cpu);
  Fp8Rows qt = Fp8Rows::empty_columnwise(T, K, Device::cpu);
  const int64_t Kp = (K + 127) / 128 * 128, Tp = (T + 127) / 128 * 128;
  ASSERT_EQ(q.data.shape(), (Shape{T, Kp}));
  ASSERT_EQ(q.scales.shape(), (Shape{Kp / 128, T}));
  ASSERT_EQ(qt.data.shape(), (Shape{K, Tp}));
  q.data.fill_bytes(0xff);  // poisoned: padding must be written
  qt.data.fill_bytes(0xff);
  quantize_rows_and_columns(q, qt, x, format);
  const uint8_t* d = static_cast<const uint8_t*>(q.data.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < Kp / 128; ++g) {
      std::vector<float> v;
      for (int64_t k = g * 128; k < std::min(K, g * 128 + 128); ++k) v.push_back(value(x, t * K + k));
      const RefGroup ref = ref_group(v, pow2);
      ASSERT_EQ(q.scales.data_as<float>()[g * T + t], ref.scale) << "row " << t << " group " << g;
      for (int64_t i = 0; i < 128; ++i) {
        const int64_t k = g * 128 + i;
        ASSERT_EQ(d[t * Kp + k], k < K ? ref.bytes[size_t(i)] : 0) << "row " << t << " col " << k;
      }
    }
  const uint8_t* dt = static_cast<const uint8_t*>(qt.data.data());
  for (int64_t k = 0; k < K; ++k)
    for (int64_t g = 0; g < Tp / 128; ++g) {
      std::vector<float> v;
      for (int64_t t = g * 128; t < std::min(T, g * 128 + 128); ++t) v.push_back(value(x, t * K + k));
      const RefGroup ref = ref_group(v, pow2);
      ASSERT_EQ(qt.scales.data_as<float>()[g * K + k], ref.scale) << "feature " << k << " group " << g;
      for (int64_t i = 0; i < 128; ++i) {
        const int64_t t = g * 128 + i;
        ASSERT_EQ(dt[k * Tp + t], t < T ? ref.bytes[size_t(i)] : 0) << "feature " << k << " token " << t;
      }
    }
  // Dequantized to the unpadded width: the valid columns only.
  Tensor back = Tensor::empty({T, K}, DType::f32);
  dequantize(back, q);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(back.data_as<float>()[t * K + k],
                e4m3_to_float(e4m3{d[t * Kp + k]}) * q.scales.data_as<float>()[k / 128 * T + t]);
}

// 576 (SmolLM2-135M's hidden: 4 groups and 64), 208 (1 and 80), 16 (a lone partial group), 320.
INSTANTIATE_TEST_SUITE_P(Widths, PartialGroupsTest,
                         ::testing::Combine(::testing::Values<int64_t>(37, 130),
                                            ::testing::Values<int64_t>(576, 208, 16, 320),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));

class PartialBlocksTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, ScaleFormat>> {};

// Weight blocks cut by N (rows) or K (columns): each block's scale is its valid elements', W is
// stored [N, Kp] and Wᵀ [K, Np], both zero past the valid columns; scale rows padded to 4 blocks.
TEST_P(PartialBlocksTest, WeightMatchesBruteForce) {
  const auto [N, K, format] = GetParam();
  const bool pow2 = format == ScaleFormat::pow2;
  Tensor w = random_tensor({N, K}, DType::f32, 12);
  for (int64_t i = 0; i < N; ++i)  // each block its own magnitude
    for (int64_t j = 0; j < K; ++j) w.data_as<float>()[i * K + j] *= float(1 + (i / 128) * 3 + j / 128);
  Fp8Weight q = Fp8Weight::empty(N, K, Device::cpu);
  const int64_t Np = (N + 127) / 128 * 128, Kp = (K + 127) / 128 * 128, nb = Np / 128, kb = Kp / 128;
  ASSERT_EQ(q.w.data.shape(), (Shape{N, Kp}));
  ASSERT_EQ(q.wt.data.shape(), (Shape{K, Np}));
  ASSERT_EQ(q.w.scales.shape(), (Shape{nb, (kb + 3) / 4 * 4}));
  ASSERT_EQ(q.wt.scales.shape(), (Shape{kb, (nb + 3) / 4 * 4}));
  q.w.data.fill_bytes(0xff);
  q.wt.data.fill_bytes(0xff);
  q.w.scales.fill_bytes(0xff);
  q.wt.scales.fill_bytes(0xff);
  quantize_weight(q, w, format);
  const uint8_t* d = static_cast<const uint8_t*>(q.w.data.data());
  const uint8_t* dt = static_cast<const uint8_t*>(q.wt.data.data());
  const float* s = q.w.scales.data_as<float>();
  const float* st = q.wt.scales.data_as<float>();
  const int64_t ld = q.w.scales.dim(1), ld_t = q.wt.scales.dim(1);
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t bj = kb; bj < ld; ++bj) EXPECT_EQ(s[bi * ld + bj], 0.0f) << "scale padding";
    for (int64_t bj = 0; bj < kb; ++bj) {
      std::vector<float> v;
      for (int64_t i = bi * 128; i < std::min(N, bi * 128 + 128); ++i)
        for (int64_t j = bj * 128; j < std::min(K, bj * 128 + 128); ++j) v.push_back(w.data_as<float>()[i * K + j]);
      const RefGroup ref = ref_group(v, pow2);
      ASSERT_EQ(s[bi * ld + bj], ref.scale) << "block " << bi << ", " << bj;
      ASSERT_EQ(st[bj * ld_t + bi], ref.scale) << "block " << bi << ", " << bj;
      size_t n = 0;
      for (int64_t i = bi * 128; i < std::min(N, bi * 128 + 128); ++i)
        for (int64_t j = bj * 128; j < std::min(K, bj * 128 + 128); ++j, ++n) {
          ASSERT_EQ(d[i * Kp + j], ref.bytes[n]) << "w " << i << ", " << j;
          ASSERT_EQ(dt[j * Np + i], ref.bytes[n]) << "wt " << j << ", " << i;
        }
    }
  }
  for (int64_t bj = 0; bj < kb; ++bj)
    for (int64_t bi = nb; bi < ld_t; ++bi) EXPECT_EQ(st[bj * ld_t + bi], 0.0f) << "scale padding (wt)";
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = K; j < Kp; ++j) ASSERT_EQ(d[i * Kp + j], 0) << "w padding " << i << ", " << j;
  for (int64_t j = 0; j < K; ++j)
    for (int64_t i = N; i < Np; ++i) ASSERT_EQ(dt[j * Np + i], 0) << "wt padding " << j << ", " << i;
}

// SmolLM2-135M's fused qkv [960, 576] (a block straddles q and k), o-like [192, 576], and K = 320.
INSTANTIATE_TEST_SUITE_P(Shapes, PartialBlocksTest,
                         ::testing::Combine(::testing::Values<int64_t>(960, 192),
                                            ::testing::Values<int64_t>(576, 320),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));

// Wᵀ remade from W's blocks alone (what every rank of a sharded optimizer does after gathering W)
// has quantize_weight's bytes: partial blocks in N and K, and a block holding a NaN, whose Wᵀ
// padding is the NaN code (quantize_weight's own Wᵀ is checked against brute force above).
TEST_P(PartialBlocksTest, TransposeFromWAloneEqualsQuantizeWeight) {
  const auto [N, K, format] = GetParam();
  Tensor w = random_tensor({N, K}, DType::f32, 13);
  w.data_as<float>()[(N - 1) * K + 5] = NAN;  // the last block row (partial when N % 128 != 0)
  Fp8Weight full = Fp8Weight::empty(N, K, Device::cpu);
  quantize_weight(full, w, format);
  Fp8Weight remade = Fp8Weight::empty(N, K, Device::cpu);
  remade.w.data.copy_from(full.w.data);
  remade.w.scales.copy_from(full.w.scales);
  remade.wt.data.fill_bytes(0xa5);
  remade.wt.scales.fill_bytes(0xa5);
  transpose_weight_blocks(remade);
  EXPECT_TRUE(testing::same_bytes(remade.wt.data, full.wt.data));
  EXPECT_TRUE(testing::same_bytes(remade.wt.scales, full.wt.scales));
  if (N % 128) {
    EXPECT_EQ(static_cast<const uint8_t*>(remade.wt.data.data())[5 * remade.wt.cols() + N] & 0x7f, 0x7f)
        << "Wᵀ padding of the block holding the NaN";
  }
}

TEST(QuantizePartial, WholeBlockShapesKeepTheirLayout) {
  Fp8Weight q = Fp8Weight::empty(256, 640, Device::cpu);
  EXPECT_EQ(q.w.data.shape(), (Shape{256, 640}));
  EXPECT_EQ(q.w.scales.shape(), (Shape{2, 8}));
  Fp8Rows r = Fp8Rows::empty(3, 384, Device::cpu);
  EXPECT_EQ(r.data.shape(), (Shape{3, 384}));
}

TEST(Quantize, ZeroGroupsAndTinyValues) {
  Tensor x = Tensor::zeros({2, 256}, DType::f32);
  x.data_as<float>()[256 + 130] = 1e-40f;  // a float subnormal: scale clamps to FLT_MIN
  Fp8Rows q = Fp8Rows::empty(2, 256, Device::cpu);
  quantize_rows(q, x);
  const float* s = q.scales.data_as<float>();
  EXPECT_EQ(s[0], 1.0f);  // group 0 row 0: all zeros
  EXPECT_TRUE(std::isfinite(s[3]) && s[3] > 0);
  for (int64_t i = 0; i < 512; ++i) {
    if (i != 256 + 130) {
      EXPECT_EQ(q.data.data_as<e4m3>()[i].bits, 0);
    }
  }
  EXPECT_EQ(first_nonfinite(q.scales), -1);
}

TEST(Quantize, NonFiniteInputIsReportedNotHidden) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    Tensor x = random_tensor({3, 256}, DType::bf16, 4);
    x.data_as<bf16>()[2 * 256 + 200] = float_to_bf16(bad);  // row 2, group 1
    Fp8Rows q = Fp8Rows::empty(3, 256, Device::cpu);
    quantize_rows(q, x);
    EXPECT_EQ(first_nonfinite(q.scales), 1 * 3 + 2);  // scale index g * rows + r
    for (int i = 128; i < 256; ++i) EXPECT_EQ(q.data.data_as<e4m3>()[2 * 256 + i].bits, 0x7f);
    for (int i = 0; i < 128; ++i) EXPECT_NE(q.data.data_as<e4m3>()[2 * 256 + i].bits & 0x7f, 0x7f);

    Tensor w = random_tensor({128, 256}, DType::f32, 5);
    w.data_as<float>()[5 * 256 + 3] = bad;
    Fp8Weight qw = Fp8Weight::empty(128, 256, Device::cpu);
    quantize_weight(qw, w);
    EXPECT_EQ(first_nonfinite(qw.w.scales), 0);
    EXPECT_EQ(first_nonfinite(qw.wt.scales), 0);
  }
}

TEST(Quantize, BadInputIsAClearError) {
  Fp8Rows q = Fp8Rows::empty(4, 128, Device::cpu);
  Tensor odd = Tensor::zeros({4, 100}, DType::bf16);
  expect_error([&] { quantize_rows(q, odd); }, "multiple of 16");
  EXPECT_THROW(Fp8Rows::empty(4, 100, Device::cpu), Error);
  EXPECT_THROW(Fp8Blocks::empty(100, 128, Device::cpu), Error);
  Tensor wrong_rows = Tensor::zeros({5, 128}, DType::bf16);
  expect_error([&] { quantize_rows(q, wrong_rows); }, "quantize_rows: out");
  Tensor ints = Tensor::zeros({4, 128}, DType::i32);
  EXPECT_THROW(quantize_rows(q, ints), Error);
  Fp8Weight w = Fp8Weight::empty(128, 128, Device::cpu);
  EXPECT_THROW(quantize_weight(w, Tensor::zeros({64, 128}, DType::f32)), Error);
}

}  // namespace
}  // namespace lockstep
