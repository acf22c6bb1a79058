// The grouped fp8 GEMM of a mixture-of-experts layer (ops/gemm.h, gemm_fp8_grouped) on the CPU:
// each expert's rows are, bit for bit, the ordinary fp8 GEMM (gemm_fprop / gemm_dgrad) of those
// rows alone — quantized alone, against the expert's own Fp8Weight — the per-expert loop it replaces.
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
  expect_error([&] { stack_fp8_blocks({Fp8Blocks::empty(64, K, Device::cpu)}); }, "rows must be a multiple of 128");
  expect_error([&] { stack_fp8_blocks({w, Fp8Blocks::empty(2 * N, 2 * K, Device::cpu)}); }, "stack_fp8_blocks: a part");
}

}  // namespace
}  // namespace lockstep
