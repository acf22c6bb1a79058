// The grouped GEMMs of a mixture-of-experts layer (ops/gemm.h) on the CPU. gemm_fp8_grouped: each
// expert's rows are, bit for bit, the ordinary fp8 GEMM (gemm_fprop / gemm_dgrad) of those rows
// alone — quantized alone, against the expert's own Fp8Weight — the per-expert loop it replaces.
// gemm_bf16_grouped_fprop / _dgrad: each expert's rows are, bit for bit, gemm_fprop / gemm_dgrad of
// those rows against the expert's weight (bf16 and fp32 recipes), the loop of model/transformer_moe.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/gemm.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::poisoned;
using testing::random_tensor;
using testing::same_bytes;

// Expert loads around the tile edges of the CUDA kernel (8 .. 128 rows) and the CPU's micro-tiles:
// empty experts (first, inside, last), 1 row, 127, 128 and 129 rows, and one large expert.
const std::vector<int64_t> kLoads = {0, 129, 1, 0, 1000, 128, 127, 0};
constexpr int64_t N = 256, K = 384;  // the layer: W [N, K]

std::vector<int64_t> offsets_of(const std::vector<int64_t>& loads) {
  std::vector<int64_t> offsets{0};
  for (int64_t n : loads) offsets.push_back(offsets.back() + n);
  return offsets;
}

class GemmFp8Grouped : public ::testing::TestWithParam<DType> {};

TEST_P(GemmFp8Grouped, EachExpertIsTheOrdinaryGemmOfItsRowsBitForBit) {
  const DType out = GetParam();
  const std::vector<int64_t> offsets = offsets_of(kLoads);
  const int64_t rows = offsets.back(), experts = int64_t(kLoads.size());
  std::vector<Fp8Weight> weights;
  std::vector<Fp8Blocks> w, wt;
  for (int64_t e = 0; e < experts; ++e) {
    weights.push_back(Fp8Weight::empty(N, K, Device::cpu));
    quantize_weight(weights.back(), random_tensor({N, K}, DType::f32, 100 + uint64_t(e)));
    w.push_back(weights.back().w);
    wt.push_back(weights.back().wt);
  }
  const Tensor x = random_tensor({rows, K}, DType::bf16, 1, true), dy = random_tensor({rows, N}, DType::bf16, 2, true);
  Fp8Rows qx = Fp8Rows::empty(rows, K, Device::cpu), qdy = Fp8Rows::empty(rows, N, Device::cpu);
  quantize_rows(qx, x);
  quantize_rows(qdy, dy);

  Tensor y = poisoned({rows, N}, out), dx = poisoned({rows, K}, out);
  gemm_fp8_grouped(y, qx, stack_fp8_blocks(w), offsets, Tensor());  // FProp: the experts' W
  gemm_fp8_grouped(dx, qdy, stack_fp8_blocks(wt), offsets, Tensor());  // DGrad: their Wᵀ
  // The offsets as a tensor (the device-offsets form, here on the host): the same bits.
  Tensor offsets_tensor = Tensor::empty({experts + 1}, DType::i64);
  std::copy(offsets.begin(), offsets.end(), offsets_tensor.data_as<int64_t>());
  Tensor y_t = poisoned({rows, N}, out);
  gemm_fp8_grouped(y_t, qx, stack_fp8_blocks(w), rows, offsets_tensor);
  EXPECT_TRUE(same_bytes(y_t, y));

  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[size_t(e)], end = offsets[size_t(e + 1)], n = end - begin;
    if (n == 0) continue;
    Fp8Rows qx_e = Fp8Rows::empty(n, K, Device::cpu), qdy_e = Fp8Rows::empty(n, N, Device::cpu);
    quantize_rows(qx_e, x.rows(begin, end));
    quantize_rows(qdy_e, dy.rows(begin, end));
    Tensor y_e = poisoned({n, N}, out), dx_e = poisoned({n, K}, out);
    gemm_fprop(y_e, qx_e, weights[size_t(e)]);
    gemm_dgrad(dx_e, qdy_e, weights[size_t(e)]);
    EXPECT_TRUE(same_bytes(y.rows(begin, end), y_e)) << "fprop, expert " << e << " (" << n << " rows)";
    EXPECT_TRUE(same_bytes(dx.rows(begin, end), dx_e)) << "dgrad, expert " << e << " (" << n << " rows)";
  }
}

INSTANTIATE_TEST_SUITE_P(Outputs, GemmFp8Grouped, ::testing::Values(DType::bf16, DType::f32),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

TEST(GemmFp8GroupedArguments, BadArgumentsAreClearErrors) {
  const int64_t rows = 10;
  Fp8Rows qx = Fp8Rows::empty(rows, K, Device::cpu);
  const Fp8Blocks w = Fp8Blocks::empty(2 * N, K, Device::cpu);
  Tensor y = Tensor::empty({rows, N}, DType::bf16);
  expect_error([&] { gemm_fp8_grouped(y, qx, w, {0, 4, 9}, Tensor()); }, "offsets must run from 0 to x's rows (10)");
  expect_error([&] { gemm_fp8_grouped(y, qx, w, {0, 6, 4, 10}, Tensor()); }, "w must stack 3 experts");
  const Fp8Blocks w3 = Fp8Blocks::empty(3 * N, K, Device::cpu);
  expect_error([&] { gemm_fp8_grouped(y, qx, w3, {0, 6, 4, 10}, Tensor()); }, "offsets decrease at expert 1");
  Tensor y_narrow = Tensor::empty({rows, 192}, DType::bf16);
  const Fp8Blocks w_narrow = Fp8Blocks::empty(2 * 192, K, Device::cpu);
  expect_error([&] { gemm_fp8_grouped(y_narrow, qx, w_narrow, {0, 5, 10}, Tensor()); },
               "N (y's columns) must be a positive multiple of 128");
  const Fp8Blocks w_k = Fp8Blocks::empty(2 * N, 2 * K, Device::cpu);
  expect_error([&] { gemm_fp8_grouped(y, qx, w_k, {0, 5, 10}, Tensor()); }, "inner dimensions differ");
  Tensor offsets = Tensor::empty({3}, DType::i64);
  std::copy_n(std::vector<int64_t>{0, 7, 10}.begin(), 3, offsets.data_as<int64_t>());
  expect_error([&] { gemm_fp8_grouped(y, qx, w, 6, offsets); }, "expert 0 has 7 rows, more than most_rows = 6");
  expect_error([&] { gemm_fp8_grouped(y, qx, w, 7, offsets.rows(0, 2)); }, "w must stack 1 experts");
  expect_error([&] { stack_fp8_blocks({Fp8Blocks::empty(64, K, Device::cpu)}); }, "rows must be a multiple of 128");
  expect_error([&] { stack_fp8_blocks({w, Fp8Blocks::empty(2 * N, 2 * K, Device::cpu)}); }, "stack_fp8_blocks: a part");
}

struct Bf16GroupedCase {
  DType operands, out;  // bf16 recipe: bf16 operands, bf16 or f32 out; fp32 recipe: f32, f32
};

class GemmBf16Grouped : public ::testing::TestWithParam<Bf16GroupedCase> {};

TEST_P(GemmBf16Grouped, EachExpertIsTheOrdinaryGemmOfItsRowsBitForBit) {
  const auto [operands, out] = GetParam();
  const std::vector<int64_t> offsets = offsets_of(kLoads);
  const int64_t rows = offsets.back(), experts = int64_t(kLoads.size());
  std::vector<Tensor> w;
  for (int64_t e = 0; e < experts; ++e) w.push_back(random_tensor({N, K}, operands, 100 + uint64_t(e)));
  const Tensor x = random_tensor({rows, K}, operands, 1, true), dy = random_tensor({rows, N}, operands, 2, true);
  const Tensor dx_before = random_tensor({rows, K}, out, 3);  // what DGrad accumulates onto

  Tensor y = poisoned({rows, N}, out), dx = poisoned({rows, K}, out), dx_sum = poisoned({rows, K}, out);
  gemm_bf16_grouped_fprop(y, x, w, offsets);
  gemm_bf16_grouped_dgrad(dx, dy, w, offsets);
  dx_sum.copy_from(dx_before);
  gemm_bf16_grouped_dgrad(dx_sum, dy, w, offsets, true);

  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[size_t(e)], end = offsets[size_t(e + 1)], n = end - begin;
    if (n == 0) continue;
    Tensor y_e = poisoned({n, N}, out), dx_e = poisoned({n, K}, out), dx_sum_e = poisoned({n, K}, out);
    gemm_fprop(y_e, x.rows(begin, end), w[size_t(e)]);
    gemm_dgrad(dx_e, dy.rows(begin, end), w[size_t(e)]);
    dx_sum_e.copy_from(dx_before.rows(begin, end));
    gemm_dgrad(dx_sum_e, dy.rows(begin, end), w[size_t(e)], true);
    EXPECT_TRUE(same_bytes(y.rows(begin, end), y_e)) << "fprop, expert " << e << " (" << n << " rows)";
    EXPECT_TRUE(same_bytes(dx.rows(begin, end), dx_e)) << "dgrad, expert " << e << " (" << n << " rows)";
    EXPECT_TRUE(same_bytes(dx_sum.rows(begin, end), dx_sum_e)) << "dgrad accumulated, expert " << e;
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, GemmBf16Grouped,
                         ::testing::Values(Bf16GroupedCase{DType::bf16, DType::bf16},
                                           Bf16GroupedCase{DType::bf16, DType::f32},
                                           Bf16GroupedCase{DType::f32, DType::f32}),
                         [](const ::testing::TestParamInfo<Bf16GroupedCase>& info) {
                           return std::string(dtype_name(info.param.operands)) + "_to_" +
                                  std::string(dtype_name(info.param.out));
                         });

// A batch without rows (every expert empty) is a call that writes nothing.
TEST(GemmBf16GroupedNoRows, WritesNothing) {
  const std::vector<Tensor> w = {random_tensor({N, K}, DType::bf16, 1), random_tensor({N, K}, DType::bf16, 2)};
  Tensor y = Tensor::empty({0, N}, DType::bf16), dx = Tensor::empty({0, K}, DType::bf16);
  gemm_bf16_grouped_fprop(y, Tensor::empty({0, K}, DType::bf16), w, {0, 0, 0});
  gemm_bf16_grouped_dgrad(dx, Tensor::empty({0, N}, DType::bf16), w, {0, 0, 0}, true);
}

TEST(GemmBf16GroupedArguments, BadArgumentsAreClearErrors) {
  const int64_t rows = 10;
  const Tensor x = random_tensor({rows, K}, DType::bf16, 1), dy = random_tensor({rows, N}, DType::bf16, 2);
  const std::vector<Tensor> w = {random_tensor({N, K}, DType::bf16, 3), random_tensor({N, K}, DType::bf16, 4)};
  Tensor y = Tensor::empty({rows, N}, DType::bf16), dx = Tensor::empty({rows, K}, DType::bf16);
  expect_error([&] { gemm_bf16_grouped_fprop(y, x, w, {0, 4, 9}); },
               "gemm_bf16_grouped_fprop: offsets must run from 0 to x's rows (10), got 0 .. 9");
  expect_error([&] { gemm_bf16_grouped_dgrad(dx, dy, w, {1, 4, 10}); },
               "gemm_bf16_grouped_dgrad: offsets must run from 0 to dy's rows (10), got 1 .. 10");
  expect_error([&] { gemm_bf16_grouped_fprop(y, x, w, {0, 6, 4, 10}); },
               "offsets must hold E + 1 = 3 values for the 2 experts of w, got 4");
  const std::vector<Tensor> w3 = {w[0], w[1], w[0]};
  expect_error([&] { gemm_bf16_grouped_fprop(y, x, w3, {0, 6, 4, 10}); }, "offsets decrease at expert 1: 6 then 4");
  expect_error([&] { gemm_bf16_grouped_fprop(y, x, {}, {0}); }, "no experts' weights");
  expect_error([&] { gemm_bf16_grouped_fprop(y, x, {w[0], random_tensor({N, 2 * K}, DType::bf16, 5)}, {0, 5, 10}); },
               "every expert's weight must be bf16[256, 384] on cpu as w[0] is, got w[1] bf16[256, 768]");
  expect_error([&] { gemm_bf16_grouped_fprop(y, x, {w[0], random_tensor({N, K}, DType::f32, 5)}, {0, 5, 10}); },
               "got w[1] f32[256, 384]");
  expect_error([&] { gemm_bf16_grouped_fprop(y, x, {w[0], Tensor()}, {0, 5, 10}); },
               "got w[1] empty (not allocated)");
  expect_error([&] { gemm_bf16_grouped_dgrad(dx, x, w, {0, 5, 10}); }, "gemm_bf16_grouped_dgrad: inner dimensions differ");
  expect_error([&] { gemm_bf16_grouped_fprop(dx, x, w, {0, 5, 10}); }, "gemm_bf16_grouped_fprop: output");
}

}  // namespace
}  // namespace lockstep
