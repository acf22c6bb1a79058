// Every CUDA quantization kernel against the CPU reference: identical bytes and scales.
#include <gtest/gtest.h>

#include "numerics/quantize.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::random_tensor;
using testing::same_bytes;

constexpr unsigned char kPoison = 0xA5;

Fp8Rows poisoned_rows(int64_t r, int64_t c, Device d, bool columnwise) {
  Fp8Rows q = columnwise ? Fp8Rows::empty_columnwise(r, c, d) : Fp8Rows::empty(r, c, d);
  q.data.fill_bytes(kPoison);
  q.scales.fill_bytes(kPoison);
  return q;
}

void expect_same(const Fp8Rows& gpu, const Fp8Rows& cpu, const char* what) {
  EXPECT_TRUE(same_bytes(gpu.data, cpu.data)) << what << " data";
  EXPECT_TRUE(same_bytes(gpu.scales, cpu.scales)) << what << " scales";
}

// Equal values, NaN matching NaN (the GPU's NaN payloads differ from the CPU's).
void expect_same_values(const Tensor& gpu, const Tensor& cpu) {
  const std::vector<double> a = testing::to_double(gpu), b = testing::to_double(cpu);
  ASSERT_EQ(a.size(), b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += !(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])));
  EXPECT_EQ(bad, 0) << "dequantized values differ";
}

class ActivationQuantGpu
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, ScaleFormat>> {};

TEST_P(ActivationQuantGpu, SameBytesAsCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, K, format] = GetParam();
  Tensor x = random_tensor({T, K}, DType::bf16, uint64_t(T * 7 + K), /*varied_rows=*/true);
  if (T > 3) {  // a non-finite group, an all-zero token
    x.data_as<bf16>()[3 * K + 5] = float_to_bf16(NAN);
    for (int64_t k = 0; k < K; ++k) x.data_as<bf16>()[1 * K + k] = bf16{0};
  }
  const Tensor xg = x.to(Device::cuda);

  Fp8Rows cpu_rows = poisoned_rows(T, K, Device::cpu, false);
  Fp8Rows cpu_cols = poisoned_rows(T, K, Device::cpu, true);
  quantize_rows_and_columns(cpu_rows, cpu_cols, x, format);

  Fp8Rows rows = poisoned_rows(T, K, Device::cuda, false), cols = poisoned_rows(T, K, Device::cuda, true);
  quantize_rows_and_columns(rows, cols, xg, format);
  expect_same(rows, cpu_rows, "fused rows");
  expect_same(cols, cpu_cols, "fused columns");

  Fp8Rows rows_only = poisoned_rows(T, K, Device::cuda, false);
  quantize_rows(rows_only, xg, format);
  expect_same(rows_only, cpu_rows, "rows");
  Fp8Rows cols_only = poisoned_rows(T, K, Device::cuda, true);
  quantize_columns(cols_only, xg, format);
  expect_same(cols_only, cpu_cols, "columns");

  EXPECT_EQ(first_nonfinite(rows.scales), first_nonfinite(cpu_rows.scales));
  Tensor back = Tensor::empty({T, K}, DType::f32, Device::cuda), back_cpu = Tensor::empty({T, K}, DType::f32);
  back.fill_bytes(kPoison);
  dequantize(back, rows);
  dequantize(back_cpu, cpu_rows);
  expect_same_values(back, back_cpu);
  // bf16 output (the fp8 recipe's saved SwiGLU input): the same values as the CPU's.
  Tensor back16 = Tensor::empty({T, K}, DType::bf16, Device::cuda);
  Tensor back16_cpu = Tensor::empty({T, K}, DType::bf16);
  back16.fill_bytes(kPoison);
  dequantize(back16, rows);
  dequantize(back16_cpu, cpu_rows);
  expect_same_values(back16, back16_cpu);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ActivationQuantGpu,
    ::testing::Combine(::testing::Values(1, 5, 128, 300, 1000), ::testing::Values(128, 640, 2048),
                       ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));
// Decode sizes: rows only at T ≤ 256 is a thread-per-vector kernel, 257 the tile kernel; 640
// columns: 80 vectors a row, so blocks of 128 threads straddle rows.
INSTANTIATE_TEST_SUITE_P(
    Decode, ActivationQuantGpu,
    ::testing::Combine(::testing::Values(1, 3, 64, 65, 256, 257), ::testing::Values(640, 4096),
                       ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));
// More 128×128 tiles than the device holds persistent blocks (2 or 3 per SM), so blocks quantize
// several tiles each, the later ones loaded while the earlier are processed, and the last tile row
// is partial: 20 × 32 = 640 tiles (2 or 3 a block on 132 SMs, some blocks one fewer); 33 × 32 =
// 1056 (4 a block with 2 blocks an SM, a whole number; 2 or 3 with 3): the ring of tiles in flight
// wraps around and is refilled.
INSTANTIATE_TEST_SUITE_P(ManyTiles, ActivationQuantGpu,
                         ::testing::Values(std::make_tuple(int64_t(2500), int64_t(4096), ScaleFormat::fp32),
                                           std::make_tuple(int64_t(4100), int64_t(4096), ScaleFormat::pow2)));

// Widths that end inside a 128-group (numerics/quantize.h: stored padded, the padding the quantized
// zeros): SmolLM2-135M's 576 and 960, 208 (one group and 80), 16 (a lone partial group, whose row 3
// holds the NaN: padding of the NaN code), at the tile kernels' and the decode kernel's T.
INSTANTIATE_TEST_SUITE_P(
    PartialGroups, ActivationQuantGpu,
    ::testing::Combine(::testing::Values(1, 7, 64, 65, 257, 300), ::testing::Values(576, 960, 208, 16),
                       ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2)));

class WeightQuantGpu : public ::testing::TestWithParam<std::tuple<DType, ScaleFormat, int64_t, int64_t>> {};

TEST_P(WeightQuantGpu, SameBytesAsCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [dtype, format, N, K] = GetParam();
  Tensor w = random_tensor({N, K}, dtype, 99, true);
  Fp8Weight cpu = Fp8Weight::empty(N, K, Device::cpu);
  quantize_weight(cpu, w, format);
  Fp8Weight gpu = Fp8Weight::empty(N, K, Device::cuda);
  for (Tensor* t : {&gpu.w.data, &gpu.w.scales, &gpu.wt.data, &gpu.wt.scales}) t->fill_bytes(kPoison);
  quantize_weight(gpu, w.to(Device::cuda), format);
  EXPECT_TRUE(same_bytes(gpu.w.data, cpu.w.data));
  EXPECT_TRUE(same_bytes(gpu.w.scales, cpu.w.scales));
  EXPECT_TRUE(same_bytes(gpu.wt.data, cpu.wt.data));
  EXPECT_TRUE(same_bytes(gpu.wt.scales, cpu.wt.scales));
  Tensor back = Tensor::empty({N, K}, DType::f32, Device::cuda), back_cpu = Tensor::empty({N, K}, DType::f32);
  dequantize(back, gpu.w);
  dequantize(back_cpu, cpu.w);
  expect_same_values(back, back_cpu);
  // Wᵀ at its unpadded width too.
  Tensor back_t = Tensor::empty({K, N}, DType::f32, Device::cuda), back_t_cpu = Tensor::empty({K, N}, DType::f32);
  dequantize(back_t, gpu.wt);
  dequantize(back_t_cpu, cpu.wt);
  expect_same_values(back_t, back_t_cpu);
}

INSTANTIATE_TEST_SUITE_P(Formats, WeightQuantGpu,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2),
                                            ::testing::Values(int64_t(384)), ::testing::Values(int64_t(640))));
// Partial blocks along N, K or both (SmolLM2-135M's qkv [960, 576], down [576, 1536]; [192, 320]).
INSTANTIATE_TEST_SUITE_P(PartialBlocks, WeightQuantGpu,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(ScaleFormat::fp32, ScaleFormat::pow2),
                                            ::testing::Values(int64_t(960), int64_t(576), int64_t(192)),
                                            ::testing::Values(int64_t(576), int64_t(1536), int64_t(320))));
// 16 × 32 = 512 blocks: more than the persistent blocks (1 or 2 per SM), as above.
INSTANTIATE_TEST_SUITE_P(ManyTiles, WeightQuantGpu,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(ScaleFormat::fp32),
                                            ::testing::Values(int64_t(2048)), ::testing::Values(int64_t(4096))));

// Wᵀ remade on the GPU from W's blocks alone (a sharded optimizer's all-gather hands over W only)
// has the CPU quantize_weight's bytes, padding included; a NaN in the last block row.
TEST(WeightTransposeGpu, SameBytesAsQuantizeWeight) {
  LOCKSTEP_REQUIRE_GPU();
  for (auto [N, K] : {std::pair<int64_t, int64_t>{960, 576}, {576, 1536}, {2048, 4096}, {192, 320}}) {
    Tensor w = random_tensor({N, K}, DType::f32, 98, true);
    w.data_as<float>()[(N - 1) * K + 7] = NAN;
    Fp8Weight cpu = Fp8Weight::empty(N, K, Device::cpu);
    quantize_weight(cpu, w);
    Fp8Weight gpu = Fp8Weight::empty(N, K, Device::cuda);
    gpu.w.data.copy_from(cpu.w.data.to(Device::cuda));
    gpu.w.scales.copy_from(cpu.w.scales.to(Device::cuda));
    gpu.wt.data.fill_bytes(kPoison);
    gpu.wt.scales.fill_bytes(kPoison);
    transpose_weight_blocks(gpu);
    EXPECT_TRUE(same_bytes(gpu.wt.data, cpu.wt.data)) << N << " x " << K;
    EXPECT_TRUE(same_bytes(gpu.wt.scales, cpu.wt.scales)) << N << " x " << K;
  }
}

}  // namespace
}  // namespace lockstep
