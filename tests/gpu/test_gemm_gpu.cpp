// Every CUDA GEMM (cuBLASLt, the fp8 small-T kernel, the grouped fp8 and bf16 GEMMs) against the CPU
// reference on the same operands: ‖gpu − cpu‖/‖cpu‖.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_graph.h"
#include "core/error.h"
#include "ops/forward_kernels.h"
#include "ops/gemm.h"
#include "ops/gemm_backends.h"
#if LOCKSTEP_HAS_CUDA
#include "ops/cuda/gemm_fp8_pipelined.h"
#include "ops/cuda/gemm_fp8_small_t.h"
#endif
#include "tests/gpu/small_t_settings.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::hashed_tensor;
using testing::kSmallTMax;
using testing::poisoned;
using testing::random_tensor;
using testing::rel_error;
using testing::same_bytes;
using testing::set_fp8_small_t;
using testing::SmallTSettings;
using testing::to_double;
using testing::worst_row_error;

void force_token_padding(bool on) {
#if LOCKSTEP_HAS_CUDA
  cuda::gemm_force_token_padding(on);
#else
  (void)on;
#endif
}

int set_algo_choice(int choice) {
#if LOCKSTEP_HAS_CUDA
  return cuda::gemm_set_algo_choice(choice);
#else
  (void)choice;
  return -1;
#endif
}

bool uses_small_t(int64_t tokens, int64_t rows, int64_t k, DType out) {
#if LOCKSTEP_HAS_CUDA
  return cuda::gemm_fp8_uses_small_t(tokens, rows, k, out);
#else
  (void)tokens, (void)rows, (void)k, (void)out;
  return false;
#endif
}

// bf16 output rounding alone is up to 2^-9 per element. With fp32 output, bf16 GEMMs differ only
// by summation order (1e-5). Hopper's FP8 tensor cores accumulate inside a K block with fewer
// than fp32's bits: 3e-5 to 1.7e-4 measured on an H200 (docs/benchmarks.md), hence 1e-3.
double tolerance(DType out) { return out == DType::bf16 ? 2e-3 : 1e-5; }
constexpr double kFp8F32Tol = 1e-3;

struct GemmCase {
  int64_t T, N, K;
  DType out;
  bool force_padding;
};

std::string shape_name(const GemmCase& c) {
  std::string name = "T";  // (appended to: "T" + std::string trips GCC 12's -Wrestrict here)
  name += std::to_string(c.T) + "_N" + std::to_string(c.N) + "_K" + std::to_string(c.K) + "_" +
          std::string(dtype_name(c.out)) + (c.force_padding ? "_padded" : "");
  return name;
}

std::string case_name(const ::testing::TestParamInfo<GemmCase>& info) { return shape_name(info.param); }

// cuBLASLt only (gemm_set_fp8_small_t(0) still selects it at small T); the small-T kernel has its own
// tests below.
class GemmGpu : public ::testing::TestWithParam<GemmCase> {
 protected:
  void SetUp() override {
    if (cuda_device_available()) previous_ = set_fp8_small_t(0);
  }
  void TearDown() override {
    if (!cuda_device_available()) return;
    force_token_padding(false);
    set_fp8_small_t(previous_);
  }
  int previous_ = 0;
};

TEST_P(GemmGpu, Bf16MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, N, K, out, pad] = GetParam();
  force_token_padding(pad);
  Tensor x = random_tensor({T, K}, DType::bf16, 1), w = random_tensor({N, K}, DType::bf16, 2);
  Tensor dy = random_tensor({T, N}, DType::bf16, 3);
  const Tensor xg = x.to(Device::cuda), wg = w.to(Device::cuda), dyg = dy.to(Device::cuda);

  Tensor y = poisoned({T, N}, out, Device::cpu), yg = poisoned({T, N}, out, Device::cuda);
  gemm_fprop(y, x, w);
  gemm_fprop(yg, xg, wg);
  EXPECT_LE(rel_error(to_double(yg), to_double(y)), tolerance(out)) << "fprop";

  Tensor dx = poisoned({T, K}, out, Device::cpu), dxg = poisoned({T, K}, out, Device::cuda);
  gemm_dgrad(dx, dy, w);
  gemm_dgrad(dxg, dyg, wg);
  EXPECT_LE(rel_error(to_double(dxg), to_double(dx)), tolerance(out)) << "dgrad";
  gemm_dgrad(dx, dy, w, true);
  gemm_dgrad(dxg, dyg, wg, true);
  EXPECT_LE(rel_error(to_double(dxg), to_double(dx)), tolerance(out)) << "dgrad (accumulated)";

  Tensor dw = poisoned({N, K}, DType::f32, Device::cpu), dwg = poisoned({N, K}, DType::f32, Device::cuda);
  gemm_wgrad(dw, dy, x, false);
  gemm_wgrad(dwg, dyg, xg, false);
  gemm_wgrad(dw, dy, x, true);
  gemm_wgrad(dwg, dyg, xg, true);
  EXPECT_LE(rel_error(to_double(dwg), to_double(dw)), 1e-5) << "wgrad (accumulated twice)";
}

TEST_P(GemmGpu, Fp8MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, N, K, out, pad] = GetParam();
  force_token_padding(pad);
  Tensor x = random_tensor({T, K}, DType::bf16, 4, true), w = random_tensor({N, K}, DType::f32, 5);
  Tensor dy = random_tensor({T, N}, DType::bf16, 6, true);
  // Quantized on the GPU (the bytes equal the CPU's, tested elsewhere), then the same bytes on both.
  Fp8Rows qx = Fp8Rows::empty(T, K, Device::cuda), qxt = Fp8Rows::empty_columnwise(T, K, Device::cuda);
  Fp8Rows qdy = Fp8Rows::empty(T, N, Device::cuda), qdyt = Fp8Rows::empty_columnwise(T, N, Device::cuda);
  Fp8Weight qw = Fp8Weight::empty(N, K, Device::cuda);
  quantize_rows_and_columns(qx, qxt, x.to(Device::cuda));
  quantize_rows_and_columns(qdy, qdyt, dy.to(Device::cuda));
  quantize_weight(qw, w.to(Device::cuda));
  auto host = [](const Fp8Rows& q) { return Fp8Rows{q.data.to(Device::cpu), q.scales.to(Device::cpu)}; };
  auto host_blocks = [](const Fp8Blocks& q) { return Fp8Blocks{q.data.to(Device::cpu), q.scales.to(Device::cpu)}; };
  const Fp8Rows cx = host(qx), cxt = host(qxt), cdy = host(qdy), cdyt = host(qdyt);
  const Fp8Weight cw{host_blocks(qw.w), host_blocks(qw.wt)};

  Tensor y = poisoned({T, N}, out, Device::cpu), yg = poisoned({T, N}, out, Device::cuda);
  gemm_fprop(y, cx, cw);
  gemm_fprop(yg, qx, qw);
  EXPECT_LE(rel_error(to_double(yg), to_double(y)), std::max(tolerance(out), kFp8F32Tol)) << "fprop";

  Tensor dx = poisoned({T, K}, out, Device::cpu), dxg = poisoned({T, K}, out, Device::cuda);
  gemm_dgrad(dx, cdy, cw);
  gemm_dgrad(dxg, qdy, qw);
  EXPECT_LE(rel_error(to_double(dxg), to_double(dx)), std::max(tolerance(out), kFp8F32Tol)) << "dgrad";

  Tensor dw = poisoned({N, K}, DType::f32, Device::cpu), dwg = poisoned({N, K}, DType::f32, Device::cuda);
  gemm_wgrad(dw, cdyt, cxt, false);
  gemm_wgrad(dwg, qdyt, qxt, false);
  gemm_wgrad(dw, cdyt, cxt, true);
  gemm_wgrad(dwg, qdyt, qxt, true);
  EXPECT_LE(rel_error(to_double(dwg), to_double(dw)), kFp8F32Tol) << "wgrad (accumulated twice)";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmGpu,
    ::testing::Values(GemmCase{1, 256, 384, DType::bf16, false}, GemmCase{3, 256, 384, DType::bf16, false},
                      GemmCase{3, 256, 384, DType::bf16, true}, GemmCase{16, 512, 256, DType::f32, false},
                      GemmCase{77, 384, 512, DType::bf16, false}, GemmCase{77, 384, 512, DType::f32, true},
                      GemmCase{256, 1024, 768, DType::bf16, false},
                      GemmCase{1000, 768, 1024, DType::bf16, false}),
    case_name);
// K and N that end inside a 128-group (fp8: K stored padded, N a partial block of weight rows;
// numerics/quantize.h): SmolLM2-135M's qkv (960 over 576), o (576, 576), gate_up (3072 over 576),
// down (576 over 1536), and 192 over 320, at decode and prefill token counts.
INSTANTIATE_TEST_SUITE_P(
    PartialBlocks, GemmGpu,
    ::testing::Values(GemmCase{1, 960, 576, DType::bf16, false}, GemmCase{7, 576, 1536, DType::bf16, false},
                      GemmCase{7, 576, 576, DType::bf16, true}, GemmCase{64, 960, 576, DType::f32, false},
                      GemmCase{65, 192, 320, DType::bf16, false}, GemmCase{65, 3072, 576, DType::bf16, true},
                      GemmCase{300, 576, 576, DType::bf16, false}, GemmCase{300, 576, 1536, DType::f32, false},
                      GemmCase{300, 192, 192, DType::bf16, false}),
    case_name);

// The fp8 small-T kernel (ops/cuda/gemm_fp8_small_t.cu), forced at every T: FProp and DGrad (both
// go through it) against the CPU reference on the same quantized bytes, error per token row (the
// rows' magnitudes span 1e-3 .. 1e2). Shapes: K of 1 block (no split), 5 blocks split unevenly four
// ways (N=384, K=640; its DGrad: two ways), and Qwen3-1.7B's qkv (8 ways). The tolerances are the
// cuBLASLt fp8 tests': bf16 rounding of the output for bf16; for f32, wgmma sums a K block with the
// fp8 tensor cores' precision (cuBLASLt's, ≤ 1.7e-4), below 1e-3.
Fp8Rows to_host(const Fp8Rows& q) { return Fp8Rows{q.data.to(Device::cpu), q.scales.to(Device::cpu)}; }
Fp8Blocks to_host(const Fp8Blocks& q) { return Fp8Blocks{q.data.to(Device::cpu), q.scales.to(Device::cpu)}; }

// Random quantized operands of an fp8 FProp (x [T, K], W [N, K]) and DGrad (dy [T, N]) on the
// current stream, and their host copies; and the CPU reference's outputs.
struct Fp8Gemms {
  Fp8Gemms(int64_t T, int64_t N, int64_t K, DType out)
      : qx(Fp8Rows::empty(T, K, Device::cuda)), qdy(Fp8Rows::empty(T, N, Device::cuda)),
        qw(Fp8Weight::empty(N, K, Device::cuda)), y(poisoned({T, N}, out, Device::cpu)),
        dx(poisoned({T, K}, out, Device::cpu)) {
    quantize_rows(qx, random_tensor({T, K}, DType::bf16, 10, true).to(Device::cuda));
    quantize_rows(qdy, random_tensor({T, N}, DType::bf16, 12, true).to(Device::cuda));
    quantize_weight(qw, random_tensor({N, K}, DType::f32, 11).to(Device::cuda));
    const Fp8Weight cw{to_host(qw.w), to_host(qw.wt)};
    gemm_fprop(y, to_host(qx), cw);
    gemm_dgrad(dx, to_host(qdy), cw);
  }
  Fp8Rows qx, qdy;
  Fp8Weight qw;
  Tensor y, dx;  // CPU
};

class Fp8SmallTGpu : public ::testing::TestWithParam<GemmCase> {};

TEST_P(Fp8SmallTGpu, MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, N, K, out, pad] = GetParam();  // (pad: cuBLASLt only)
  const SmallTSettings settings;
  const Fp8Gemms g(T, N, K, out);
  const double tol = std::max(tolerance(out), kFp8F32Tol);

  Tensor yg = poisoned({T, N}, out, Device::cuda);
  gemm_fprop(yg, g.qx, g.qw);
  EXPECT_LE(worst_row_error(to_double(yg), to_double(g.y), N), tol) << "fprop";

  Tensor dxg = poisoned({T, K}, out, Device::cuda);
  gemm_dgrad(dxg, g.qdy, g.qw);
  EXPECT_LE(worst_row_error(to_double(dxg), to_double(g.dx), K), tol) << "dgrad";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8SmallTGpu,
    ::testing::Values(GemmCase{5, 256, 128, DType::bf16, false}, GemmCase{1, 384, 640, DType::bf16, false},
                      GemmCase{3, 384, 640, DType::bf16, false}, GemmCase{16, 384, 640, DType::bf16, false},
                      GemmCase{17, 384, 640, DType::bf16, false}, GemmCase{kSmallTMax, 384, 640, DType::bf16, false},
                      GemmCase{3, 384, 640, DType::f32, false}, GemmCase{kSmallTMax, 384, 640, DType::f32, false},
                      GemmCase{1, 4096, 2048, DType::bf16, false}, GemmCase{kSmallTMax, 4096, 2048, DType::bf16, false},
                      GemmCase{17, 4096, 2048, DType::f32, false}),
    case_name);
// Partial 128-blocks (SmolLM2-135M's qkv 960 over 576 and down 576 over 1536; 192 over 320): the
// kernel takes rows in 64s (M = 576, 960, 192, 320, and DGrad's K) and the padded K as it is.
// 208 rows are no multiple of 64: forced small-T still runs them, on cuBLASLt.
INSTANTIATE_TEST_SUITE_P(
    PartialBlocks, Fp8SmallTGpu,
    ::testing::Values(GemmCase{1, 960, 576, DType::bf16, false}, GemmCase{7, 960, 576, DType::f32, false},
                      GemmCase{kSmallTMax, 960, 576, DType::bf16, false}, GemmCase{1, 576, 1536, DType::bf16, false},
                      GemmCase{7, 576, 1536, DType::bf16, false}, GemmCase{kSmallTMax, 192, 320, DType::f32, false},
                      GemmCase{7, 208, 576, DType::bf16, false}),
    case_name);

// A token's output does not depend on the batch around it (the rollout engine decodes the same
// sequence at varying batch sizes): the first T rows of a 64-token FProp, bit for bit, at every
// tile width of the kernel (8, 16, 32, 64 tokens).
TEST(Fp8SmallTGpuBatch, TokenRowsIndependentOfBatch) {
  LOCKSTEP_REQUIRE_GPU();
  const SmallTSettings settings;
  const int64_t N = 384, K = 640;
  const Tensor x = random_tensor({kSmallTMax, K}, DType::bf16, 13, true);
  Fp8Weight qw = Fp8Weight::empty(N, K, Device::cuda);
  quantize_weight(qw, random_tensor({N, K}, DType::f32, 14).to(Device::cuda));
  auto fprop = [&](int64_t T) {
    Fp8Rows qx = Fp8Rows::empty(T, K, Device::cuda);
    quantize_rows(qx, x.rows(0, T).to(Device::cuda));
    Tensor y = poisoned({T, N}, DType::bf16, Device::cuda);
    gemm_fprop(y, qx, qw);
    return y;
  };
  const Tensor full = fprop(kSmallTMax);
  for (int64_t T : {1, 3, 16, 17, 32, 33})
    EXPECT_TRUE(same_bytes(fprop(T), full.rows(0, T))) << "T = " << T;
}

// Rows [begin, begin + count) of a quantized act (on the host) alone, on the GPU: their bytes and
// their columns of the [K/128, T] scales.
Fp8Rows rows_on_gpu(const Fp8Rows& q, int64_t begin, int64_t count) {
  const int64_t T = q.rows(), K = q.cols();
  Fp8Rows part = Fp8Rows::empty(count, K, Device::cpu);
  std::memcpy(part.data.data(), q.data.rows(begin, begin + count).data(), size_t(count * K));
  for (int64_t kb = 0; kb < q.scales.dim(0); ++kb)
    for (int64_t t = 0; t < count; ++t)
      part.scales.data_as<float>()[kb * count + t] = q.scales.data_as<float>()[kb * T + begin + t];
  return Fp8Rows{part.data.to(Device::cuda), part.scales.to(Device::cuda)};
}

// The batch-invariant fp8 FProp (the exact forward kernels' FProp: at these shapes and T the kernel
// above, in 128-token tiles past 64 tokens; the pipelined kernel that takes over at many tokens has
// its own test below, Fp8PipelinedGpu): a token's output row is the same bits whatever the batch
// around it and wherever it sits (a decode step's row and the training forward's row of one
// token), at T past one tile too; and the whole batch matches the CPU reference (fp8 f32/bf16
// tolerances above). Shapes: 4 uneven K splits (384 × 640), Qwen3-1.7B's qkv (4096 × 2048) and
// down projection (2048 × 6144).
class Fp8BatchInvariantGpu : public ::testing::TestWithParam<GemmCase> {};

TEST_P(Fp8BatchInvariantGpu, RowsIndependentOfBatchAndPlace) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, N, K, out, pad] = GetParam();
  const ExactForwardScope exact;
  const Fp8Gemms g(T, N, K, out);
  Tensor full = poisoned({T, N}, out, Device::cuda);
  gemm_fprop(full, g.qx, g.qw);
  EXPECT_LE(worst_row_error(to_double(full), to_double(g.y), N), std::max(tolerance(out), kFp8F32Tol));
  const Fp8Rows qx_host = to_host(g.qx);
  for (const auto& [begin, count] : {std::pair<int64_t, int64_t>{0, 1}, {5, 1}, {T - 1, 1}, {3, 17}, {37, 64},
                                    {10, 65}, {T / 3, T - T / 3}}) {
    Tensor y = poisoned({count, N}, out, Device::cuda);
    gemm_fprop(y, rows_on_gpu(qx_host, begin, count), g.qw);
    EXPECT_TRUE(same_bytes(y, full.rows(begin, begin + count))) << "rows " << begin << " .. " << begin + count;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8BatchInvariantGpu,
    ::testing::Values(GemmCase{300, 384, 640, DType::bf16, false}, GemmCase{300, 384, 640, DType::f32, false},
                      GemmCase{200, 4096, 2048, DType::bf16, false}, GemmCase{130, 2048, 6144, DType::bf16, false}),
    case_name);

// The exact forward kernels' bf16 FProp (one cuBLASLt algorithm for a weight shape at every T): a
// token's output row is the same bits alone, in a decode step's batch and in a training
// micro-batch of T = 8192, wherever it sits — the last rows too, whose tiles a split-K or stream-K
// kernel would cut otherwise than the first — and a part matches the CPU reference (the tolerances
// above). Shapes: Qwen3-1.7B's qkv (4096 × 2048) and down projection (2048 × 6144), and its LM
// head's vocabulary chunk (4096 × 2048) and last chunk (448 × 2048) in f32 (ops/lm_head.h).
class Bf16ExactGpu : public ::testing::TestWithParam<GemmCase> {};

TEST_P(Bf16ExactGpu, RowsIndependentOfBatchAndPlace) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, N, K, out, pad] = GetParam();
  const ExactForwardScope exact;
  const Tensor x = random_tensor({T, K}, DType::bf16, 1), w = random_tensor({N, K}, DType::bf16, 2);
  const Tensor xg = x.to(Device::cuda), wg = w.to(Device::cuda);
  Tensor full = poisoned({T, N}, out, Device::cuda);
  gemm_fprop(full, xg, wg);
  for (const auto& [begin, count] : {std::pair<int64_t, int64_t>{0, 1}, {T - 1, 1}, {5, 7}, {100, 64},
                                     {T - 300, 300}}) {
    Tensor y = poisoned({count, N}, out, Device::cuda);
    gemm_fprop(y, xg.rows(begin, begin + count), wg);
    EXPECT_TRUE(same_bytes(y, full.rows(begin, begin + count)))
        << "rows " << begin << " .. " << begin + count;
    if (count != 7) continue;
    Tensor y_cpu = poisoned({count, N}, out);
    gemm_fprop(y_cpu, x.rows(begin, begin + count), w);
    EXPECT_LE(rel_error(to_double(y), to_double(y_cpu)), tolerance(out)) << "against the CPU";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Bf16ExactGpu,
    ::testing::Values(GemmCase{8192, 4096, 2048, DType::bf16, false}, GemmCase{8192, 2048, 6144, DType::bf16, false},
                      GemmCase{8192, 4096, 2048, DType::f32, false},
                      GemmCase{8192, 448, 2048, DType::f32, false}),
    case_name);

#if LOCKSTEP_HAS_CUDA
// The pipelined kernel (ops/cuda/gemm_fp8_pipelined.cu) computes the weight-streaming kernel's bits
// for every element: f32 outputs (every bit of the fp32 sums; bf16 would round differences away)
// compared byte for byte at T = 512, 777 (a partial last token tile), 4096 and 8192, bf16 at 777;
// and rows computed alone at decode token counts (1 .. 64, through the weight-streaming kernel, as
// the rollout computes them) equal the same rows inside the 8192-token batch. Shapes: Qwen3-8B's and
// Qwen3-1.7B's FProp weights (N × K: qkv, o, gate_up, down), which take 1, 2 or 4 K splits.
struct Fp8Shape {
  int64_t N, K;
};

class Fp8PipelinedGpu : public ::testing::TestWithParam<Fp8Shape> {};

TEST_P(Fp8PipelinedGpu, SameBitsAsWeightStreaming) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [N, K] = GetParam();
  constexpr int64_t kTokens = 8192;
  Fp8Rows qx = Fp8Rows::empty(kTokens, K, Device::cuda);
  quantize_rows(qx, hashed_tensor({kTokens, K}, DType::bf16, 20, 1.0f, /*varied_rows=*/true).to(Device::cuda));
  Fp8Weight qw = Fp8Weight::empty(N, K, Device::cuda);
  quantize_weight(qw, hashed_tensor({N, K}, DType::f32, 21, 1.0f, /*varied_rows=*/true).to(Device::cuda));
  const Fp8Rows qx_host = to_host(qx);
  Tensor full;
  for (const int64_t T : {512, 777, 4096, 8192}) {
    const Fp8Rows x = T == kTokens ? qx : rows_on_gpu(qx_host, 0, T);
    for (const DType out : {DType::f32, DType::bf16}) {
      if (out == DType::bf16 && T != 777) continue;
      Tensor pipelined = poisoned({T, N}, out, Device::cuda), streaming = poisoned({T, N}, out, Device::cuda);
      cuda::gemm_fp8_pipelined(pipelined, x, qw.w);
      cuda::gemm_fp8_streaming(streaming, x, qw.w);
      EXPECT_TRUE(same_bytes(pipelined, streaming)) << "T = " << T << ", " << dtype_name(out);
      if (T == kTokens) full = std::move(pipelined);
    }
  }
  EXPECT_TRUE(cuda::fp8_pipelined_pays(kTokens, N)) << "gemm_fp8_batch_invariant takes the pipelined kernel";
  for (const auto& [begin, count] : {std::pair<int64_t, int64_t>{0, 1}, {kTokens - 1, 1}, {777, 17}, {4000, 33},
                                    {kTokens - 64, 64}}) {
    Tensor y = poisoned({count, N}, DType::f32, Device::cuda);
    cuda::gemm_fp8_batch_invariant(y, rows_on_gpu(qx_host, begin, count), qw.w);
    EXPECT_TRUE(same_bytes(y, full.rows(begin, begin + count))) << "rows " << begin << " .. " << begin + count;
  }
}

INSTANTIATE_TEST_SUITE_P(Qwen3FProp, Fp8PipelinedGpu,
                         ::testing::Values(Fp8Shape{6144, 4096}, Fp8Shape{4096, 4096}, Fp8Shape{24576, 4096},
                                           Fp8Shape{4096, 12288}, Fp8Shape{4096, 2048}, Fp8Shape{2048, 2048},
                                           Fp8Shape{12288, 2048}, Fp8Shape{2048, 6144}),
                         [](const ::testing::TestParamInfo<Fp8Shape>& info) {
                           std::string name = "N";  // (appended to, as in shape_name)
                           return name += std::to_string(info.param.N) + "_K" + std::to_string(info.param.K);
                         });

// Weight rows that are no multiple of 128 (the weight-streaming kernel takes them in 64s) are
// refused with the reason; gemm_fp8_batch_invariant sends them to the weight-streaming kernel.
TEST(Fp8PipelinedGpuErrors, RowsNotAMultipleOf128) {
  LOCKSTEP_REQUIRE_GPU();
  Fp8Rows x = Fp8Rows::empty(512, 256, Device::cuda);
  Fp8Weight w = Fp8Weight::empty(192, 256, Device::cuda);
  Tensor y = Tensor::empty({512, 192}, DType::bf16, Device::cuda);
  testing::expect_error([&] { cuda::gemm_fp8_pipelined(y, x, w.w); }, {"pipelined", "multiple of 128", "[192, 256]"});
  EXPECT_FALSE(cuda::fp8_pipelined_pays(1 << 20, 192));
}
#endif

// The dispatcher (kFp8SmallTAuto): a shape's first call times the small-T kernel and cuBLASLt into
// the caller's output, then runs the faster. Whichever it picked, FProp and DGrad match the CPU
// reference (the tolerances above: both paths meet them), and a second call (the remembered pick,
// untimed) writes the same bytes. Qwen3-1.7B's qkv shape at T = 1, 17, 64.
class Fp8DispatchGpu : public ::testing::TestWithParam<int64_t> {};

TEST_P(Fp8DispatchGpu, MatchesCpuWhateverItPicks) {
  LOCKSTEP_REQUIRE_GPU();
  const SmallTSettings settings(cuda::kFp8SmallTAuto);
  const int64_t T = GetParam(), N = 4096, K = 2048;
  const Fp8Gemms g(T, N, K, DType::bf16);
  const double tol = tolerance(DType::bf16);
  const auto check = [&](const char* what, int64_t rows, int64_t k, const Tensor& ref,
                         const std::function<void(Tensor&)>& op) {
    Tensor first = poisoned({T, rows}, DType::bf16, Device::cuda);
    Tensor second = poisoned({T, rows}, DType::bf16, Device::cuda);
    op(first);
    op(second);
    const char* picked = uses_small_t(T, rows, k, DType::bf16) ? "small-T" : "cuBLASLt";
    EXPECT_LE(worst_row_error(to_double(first), to_double(ref), rows), tol) << what << ", " << picked;
    EXPECT_TRUE(same_bytes(first, second)) << what << ", " << picked;
  };
  check("fprop", N, K, g.y, [&](Tensor& y) { gemm_fprop(y, g.qx, g.qw); });
  check("dgrad", K, N, g.dx, [&](Tensor& dx) { gemm_dgrad(dx, g.qdy, g.qw); });
}

INSTANTIATE_TEST_SUITE_P(Tokens, Fp8DispatchGpu, ::testing::Values(1, 17, 64),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           std::string name = "T";  // (appended to, as in shape_name)
                           return name += std::to_string(info.param);
                         });

// A shape first called while a CUDA graph is being captured is not timed (timing synchronizes,
// which fails a capture): the capture succeeds, the untimed rule picks (the small-T kernel at 16
// tokens, cuBLASLt at 33) and the replayed graph matches the CPU reference. An eager call of the
// same kernel, forced, comes first: its one-time set-up (cuBLASLt's plan, workspace and padding
// scratch) allocates, as the rollout engine's eager decode steps do before it captures.
TEST(Fp8DispatchCaptureGpu, NewShapeIsNotTimed) {
  LOCKSTEP_REQUIRE_GPU();
  const int64_t N = 768, K = 1024;
  for (const int64_t T : {16, 33}) {
    const SideStream stream;
    const CurrentStream on(stream);
    const Fp8Gemms g(T, N, K, DType::bf16);
    Tensor y = poisoned({T, N}, DType::bf16, Device::cuda);
    {
      const SmallTSettings forced(T <= 16 ? kSmallTMax : 0);
      gemm_fprop(y, g.qx, g.qw);
    }
    const SmallTSettings settings(cuda::kFp8SmallTAuto);
    y.fill_bytes(0xFF);
    stream.synchronize();
    const CudaGraph graph = CudaGraph::capture(stream, [&] { gemm_fprop(y, g.qx, g.qw); });
    graph.launch();
    stream.synchronize();
    EXPECT_EQ(uses_small_t(T, N, K, DType::bf16), T <= 16) << "T = " << T;
    EXPECT_LE(worst_row_error(to_double(y), to_double(g.y), N), tolerance(DType::bf16)) << "T = " << T;
  }
}

// The grouped fp8 GEMM of the experts (ops/gemm.h gemm_fp8_grouped; ops/cuda/gemm_fp8_grouped.cu):
// FProp (the experts' W stacked) and DGrad (their Wᵀ stacked) against the CPU reference on the same
// quantized bytes — which is, bit for bit, the per-expert loop of the ordinary fp8 GEMM
// (tests/ops/test_gemm_grouped.cpp) — with the small-T kernel's criterion: error per row (rows span
// 1e-3 .. 1e2) within the fp8 GEMMs' tolerances above. The kernel is the small-T kernel's, unsplit.
struct GroupedCase {
  std::vector<int64_t> loads;  // rows per expert
  int64_t N, K;                // the layer: W [N, K]
  DType out;
};

// `experts` loads summing to `rows`: a random share each, none for experts 1, 1 + empty_every, …
std::vector<int64_t> random_loads(int64_t experts, int64_t rows, int empty_every, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> share(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) share[size_t(e)] = e % empty_every == 1 ? 0.0 : double(rng() % 1000 + 1);
  const double total = std::accumulate(share.begin(), share.end(), 0.0);
  std::vector<int64_t> loads(static_cast<size_t>(experts));
  int64_t given = 0;
  for (int64_t e = 0; e < experts; ++e) given += loads[size_t(e)] = int64_t(double(rows) * share[size_t(e)] / total);
  for (int64_t e = 0; given < rows; e = (e + 1) % experts)  // the rounding's rest, to non-empty experts
    if (share[size_t(e)] > 0) ++loads[size_t(e)], ++given;
  return loads;
}

// Random experts quantized on the device and stacked (FProp's W, DGrad's Wᵀ), and host copies.
struct GroupedExperts {
  GroupedExperts(int64_t experts, int64_t N, int64_t K) {
    std::vector<Fp8Blocks> ws, wts;
    for (int64_t e = 0; e < experts; ++e) {
      Fp8Weight q = Fp8Weight::empty(N, K, Device::cuda);
      quantize_weight(q, random_tensor({N, K}, DType::f32, 200 + uint64_t(e)).to(Device::cuda));
      ws.push_back(q.w);
      wts.push_back(q.wt);
    }
    w = stack_fp8_blocks(ws);
    wt = stack_fp8_blocks(wts);
    w_host = to_host(w);
    wt_host = to_host(wt);
  }
  Fp8Blocks w, wt, w_host, wt_host;  // [E·N, K] and [E·K, N]
};

std::vector<int64_t> offsets_of(const std::vector<int64_t>& loads) {
  std::vector<int64_t> offsets{0};
  for (int64_t n : loads) offsets.push_back(offsets.back() + n);
  return offsets;
}

Tensor device_offsets(const std::vector<int64_t>& offsets) {
  Tensor t = Tensor::empty({int64_t(offsets.size())}, DType::i64);
  std::copy(offsets.begin(), offsets.end(), t.data_as<int64_t>());
  return t.to(Device::cuda);
}

// rows [T, cols] quantized on the device, from seed.
Fp8Rows quantized_rows(int64_t T, int64_t cols, uint64_t seed) {
  Fp8Rows q = Fp8Rows::empty(T, cols, Device::cuda);
  quantize_rows(q, random_tensor({T, cols}, DType::bf16, seed, true).to(Device::cuda));
  return q;
}

class Fp8GroupedGpu : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(Fp8GroupedGpu, MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const GroupedCase& c = GetParam();
  const std::vector<int64_t> offsets = offsets_of(c.loads);
  const int64_t T = offsets.back();
  const Tensor d_offsets = device_offsets(offsets);
  const GroupedExperts experts(int64_t(c.loads.size()), c.N, c.K);
  const Fp8Rows qx = quantized_rows(T, c.K, 20), qdy = quantized_rows(T, c.N, 21);
  const double tol = std::max(tolerance(c.out), kFp8F32Tol);

  Tensor y = poisoned({T, c.N}, c.out, Device::cpu), yg = poisoned({T, c.N}, c.out, Device::cuda);
  gemm_fp8_grouped(y, to_host(qx), experts.w_host, offsets, Tensor());
  gemm_fp8_grouped(yg, qx, experts.w, offsets, d_offsets);
  EXPECT_LE(worst_row_error(to_double(yg), to_double(y), c.N), tol) << "fprop";
  // The offsets on the device alone (a CUDA graph's form), bounded by the most loaded expert or by
  // every row: the same bits (other tile widths, and tiles past the experts' that exit).
  for (int64_t most : {*std::max_element(c.loads.begin(), c.loads.end()), T}) {
    Tensor yd = poisoned({T, c.N}, c.out, Device::cuda);
    gemm_fp8_grouped(yd, qx, experts.w, most, d_offsets);
    EXPECT_TRUE(same_bytes(yd, yg)) << "fprop with device offsets alone, most_rows " << most;
  }

  Tensor dx = poisoned({T, c.K}, c.out, Device::cpu), dxg = poisoned({T, c.K}, c.out, Device::cuda);
  gemm_fp8_grouped(dx, to_host(qdy), experts.wt_host, offsets, Tensor());
  gemm_fp8_grouped(dxg, qdy, experts.wt, offsets, d_offsets);
  EXPECT_LE(worst_row_error(to_double(dxg), to_double(dx), c.K), tol) << "dgrad";
}

std::string grouped_name(const ::testing::TestParamInfo<GroupedCase>& info) {
  const GroupedCase& c = info.param;
  const int64_t rows = std::accumulate(c.loads.begin(), c.loads.end(), int64_t(0));
  const int64_t most = *std::max_element(c.loads.begin(), c.loads.end());
  std::string name = "E";  // (appended to, as in shape_name)
  name += std::to_string(c.loads.size()) + "_rows" + std::to_string(rows) + "_most" + std::to_string(most) + "_N" +
          std::to_string(c.N) + "_K" + std::to_string(c.K) + "_" + std::string(dtype_name(c.out));
  return name;
}

// Loads at the tile widths' edges (the most loaded expert picks 8 .. 128-row tiles: 1, 9, 64, 65,
// 129 rows), empty experts first, inside and last; random loads of decode (64 tokens × top-8 over
// 32 experts) and training size (2048 rows over 16 experts, one in 4 empty); and the expert shapes
// of Qwen3-30B-A3B (gate_up N = 1536, K = 2048; down N = 2048, K = 768) over 16 of its experts.
INSTANTIATE_TEST_SUITE_P(
    Loads, Fp8GroupedGpu,
    ::testing::Values(GroupedCase{{0, 1, 0}, 256, 384, DType::bf16}, GroupedCase{{3, 0, 9, 2}, 256, 384, DType::f32},
                      GroupedCase{{64, 0, 5, 64, 1}, 256, 384, DType::bf16},
                      GroupedCase{{0, 65, 7, 0}, 384, 640, DType::bf16},
                      GroupedCase{{129, 0, 1, 128, 127, 300, 0}, 256, 384, DType::bf16},
                      GroupedCase{{129, 0, 1, 128, 127, 300, 0}, 256, 384, DType::f32},
                      GroupedCase{random_loads(32, 512, 5, 1), 256, 384, DType::bf16},
                      GroupedCase{random_loads(16, 2048, 4, 2), 384, 640, DType::bf16},
                      GroupedCase{random_loads(16, 512, 6, 3), 1536, 2048, DType::bf16},
                      GroupedCase{random_loads(16, 2048, 6, 4), 2048, 768, DType::bf16}),
    grouped_name);

// A row's bits do not depend on the other experts: the same 5 rows of expert 1 with small
// neighbours (8-row tiles) and after 200 rows of expert 0 (128-row tiles, the rows at another
// place). And they are the dense batch-invariant kernel's bits for those rows alone: the same
// kernel, and with one K block the dense launch cannot split K either.
TEST(Fp8GroupedGpuRows, IndependentOfTheOtherExperts) {
  LOCKSTEP_REQUIRE_GPU();
  const int64_t N = 256, K = 128, rows = 5;
  const GroupedExperts experts(4, N, K);
  const Tensor x1 = random_tensor({rows, K}, DType::bf16, 30, true);
  // Expert 1's rows after `before` rows of expert 0, then `after` rows of expert 3; its output rows.
  auto expert1_rows = [&](int64_t before, int64_t after) {
    const std::vector<int64_t> offsets = offsets_of({before, rows, 0, after});
    const int64_t T = offsets.back();
    Tensor x = random_tensor({T, K}, DType::bf16, 31 + uint64_t(before), true);
    x.rows(before, before + rows).copy_from(x1);
    Fp8Rows qx = Fp8Rows::empty(T, K, Device::cuda);
    quantize_rows(qx, x.to(Device::cuda));
    Tensor y = poisoned({T, N}, DType::bf16, Device::cuda);
    gemm_fp8_grouped(y, qx, experts.w, offsets, device_offsets(offsets));
    return y.rows(before, before + rows).to(Device::cpu);
  };
  const Tensor narrow = expert1_rows(3, 2), wide = expert1_rows(200, 77);
  EXPECT_TRUE(same_bytes(narrow, wide));

  const ExactForwardScope exact;
  Fp8Weight w1 = Fp8Weight::empty(N, K, Device::cuda);  // expert 1's weight (GroupedExperts' seed)
  quantize_weight(w1, random_tensor({N, K}, DType::f32, 201).to(Device::cuda));
  Fp8Rows qx1 = Fp8Rows::empty(rows, K, Device::cuda);
  quantize_rows(qx1, x1.to(Device::cuda));
  Tensor dense = poisoned({rows, N}, DType::bf16, Device::cuda);
  gemm_fprop(dense, qx1, w1);
  EXPECT_TRUE(same_bytes(narrow, dense));
}

// The grouped bf16 GEMM of the experts (ops/gemm.h gemm_bf16_grouped_fprop / _dgrad;
// ops/cuda/gemm_bf16_grouped.cu, one cuBLAS grouped call) against the CPU reference on the same
// operands — which is, bit for bit, the per-expert loop of gemm_fprop / gemm_dgrad
// (tests/ops/test_gemm_grouped.cpp) — error per row within the bf16 GEMMs' tolerance above (bf16
// output rounding; the sums differ only in order). The cases are the fp8 grouped GEMM's (uneven
// loads, empty experts first, inside and last, Qwen3-30B-A3B's shapes); DGrad overwritten and
// accumulated onto the same start.
class Bf16GroupedGpu : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(Bf16GroupedGpu, MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const GroupedCase& c = GetParam();
  const std::vector<int64_t> offsets = offsets_of(c.loads);
  const int64_t T = offsets.back();
  std::vector<Tensor> w, wg;
  for (size_t e = 0; e < c.loads.size(); ++e) {
    w.push_back(random_tensor({c.N, c.K}, DType::bf16, 300 + e));
    wg.push_back(w.back().to(Device::cuda));
  }
  const Tensor x = random_tensor({T, c.K}, DType::bf16, 40, true), dy = random_tensor({T, c.N}, DType::bf16, 41, true);
  const Tensor xg = x.to(Device::cuda), dyg = dy.to(Device::cuda);
  const double tol = tolerance(DType::bf16);

  Tensor y = poisoned({T, c.N}, DType::bf16, Device::cpu), yg = poisoned({T, c.N}, DType::bf16, Device::cuda);
  gemm_bf16_grouped_fprop(y, x, w, offsets);
  gemm_bf16_grouped_fprop(yg, xg, wg, offsets);
  EXPECT_LE(worst_row_error(to_double(yg), to_double(y), c.N), tol) << "fprop";

  Tensor dx = poisoned({T, c.K}, DType::bf16, Device::cpu), dxg = poisoned({T, c.K}, DType::bf16, Device::cuda);
  gemm_bf16_grouped_dgrad(dx, dy, w, offsets);
  gemm_bf16_grouped_dgrad(dxg, dyg, wg, offsets);
  EXPECT_LE(worst_row_error(to_double(dxg), to_double(dx), c.K), tol) << "dgrad";
  gemm_bf16_grouped_dgrad(dx, dy, w, offsets, true);
  gemm_bf16_grouped_dgrad(dxg, dyg, wg, offsets, true);
  EXPECT_LE(worst_row_error(to_double(dxg), to_double(dx), c.K), tol) << "dgrad (accumulated)";
}

INSTANTIATE_TEST_SUITE_P(
    Loads, Bf16GroupedGpu,
    ::testing::Values(GroupedCase{{0, 1, 0}, 256, 384, DType::bf16}, GroupedCase{{3, 0, 9, 2}, 256, 384, DType::bf16},
                      GroupedCase{{129, 0, 1, 128, 127, 300, 0}, 256, 384, DType::bf16},
                      GroupedCase{random_loads(32, 512, 5, 1), 256, 384, DType::bf16},
                      GroupedCase{random_loads(16, 512, 6, 3), 1536, 2048, DType::bf16},
                      GroupedCase{random_loads(16, 2048, 6, 4), 2048, 768, DType::bf16}),
    grouped_name);

// Under the exact forward kernels the grouped bf16 FProp is each expert's exact gemm_fprop of its
// rows alone (one algorithm per weight shape at every T): the same bytes, whatever the other loads.
TEST(Bf16GroupedGpuExact, FPropIsEachExpertsExactGemm) {
  LOCKSTEP_REQUIRE_GPU();
  const ExactForwardScope exact;
  const int64_t N = 256, K = 384;
  const std::vector<int64_t> offsets = offsets_of({3, 0, 40, 1});
  const int64_t T = offsets.back();
  std::vector<Tensor> w;
  for (uint64_t e = 0; e < 4; ++e) w.push_back(random_tensor({N, K}, DType::bf16, 50 + e).to(Device::cuda));
  const Tensor x = random_tensor({T, K}, DType::bf16, 54, true).to(Device::cuda);
  Tensor y = poisoned({T, N}, DType::bf16, Device::cuda);
  gemm_bf16_grouped_fprop(y, x, w, offsets);
  for (size_t e = 0; e < w.size(); ++e) {
    const int64_t begin = offsets[e], end = offsets[e + 1];
    if (begin == end) continue;
    Tensor alone = poisoned({end - begin, N}, DType::bf16, Device::cuda);
    gemm_fprop(alone, x.rows(begin, end), w[e]);
    EXPECT_TRUE(same_bytes(y.rows(begin, end), alone)) << "expert " << e;
  }
}

// What cuBLAS's grouped GEMM cannot do on CUDA is refused with the reason, before any work: an f32
// output, rows that do not start 16-byte aligned (K = 100), a call during graph capture.
TEST(Bf16GroupedGpuErrors, UnsupportedArgumentsAreClearErrors) {
  LOCKSTEP_REQUIRE_GPU();
  const int64_t N = 256, K = 384;
  const std::vector<Tensor> w = {random_tensor({N, K}, DType::bf16, 1).to(Device::cuda),
                                 random_tensor({N, K}, DType::bf16, 2).to(Device::cuda)};
  const Tensor x = random_tensor({5, K}, DType::bf16, 3).to(Device::cuda);
  Tensor y32 = Tensor::empty({5, N}, DType::f32, Device::cuda);
  testing::expect_error([&] { gemm_bf16_grouped_fprop(y32, x, w, {0, 2, 5}); }, "on CUDA the output must be bf16");

  const Tensor w_odd = random_tensor({N, 100}, DType::bf16, 4).to(Device::cuda);
  const Tensor x_odd = random_tensor({5, 100}, DType::bf16, 5).to(Device::cuda);
  Tensor y = Tensor::empty({5, N}, DType::bf16, Device::cuda);
  testing::expect_error([&] { gemm_bf16_grouped_fprop(y, x_odd, {w_odd, w_odd}, {0, 1, 5}); },
                        "expert 1's input rows must start 16-byte aligned");

  const SideStream stream;
  testing::expect_error([&] { CudaGraph::capture(stream, [&] { gemm_bf16_grouped_fprop(y, x, w, {0, 2, 5}); }); },
                        "cannot run while a CUDA graph is captured");
}

// Autotuning picks whichever of cuBLASLt's candidates is fastest, so every candidate must compute
// the same GEMM. `gpu` runs the op into a fresh poisoned output and returns it; it is run with
// candidate 0, 1, ... until a shape has no candidate with that index. A candidate cuBLASLt
// declines to run is skipped (autotuning skips it too), except the heuristic's first (0).
constexpr int kMaxCandidates = 17;  // the heuristic's first choice + 16 (ops/cuda/gemm.cu)

void expect_every_candidate(const std::function<Tensor()>& gpu, const Tensor& ref, double tol,
                            const char* what) {
  int checked = 0;
  for (int i = 0; i < kMaxCandidates; ++i) {
    set_algo_choice(i);
    try {
      const Tensor out = gpu();
      EXPECT_LE(rel_error(to_double(out), to_double(ref)), tol) << what << ", candidate " << i;
      ++checked;
    } catch (const Error& e) {
      const std::string message = e.what();
      if (message.find("no algorithm") != std::string::npos) break;  // past the last candidate
      EXPECT_NE(i, 0) << what << ": the heuristic's first choice failed: " << message;
    }
  }
  EXPECT_GE(checked, 1) << what;
  std::printf("%s: %d candidates checked\n", what, checked);
}

class GemmCandidatesGpu : public ::testing::TestWithParam<GemmCase> {
 protected:
  void SetUp() override {
    if (cuda_device_available()) previous_ = set_algo_choice(-1);
  }
  void TearDown() override {
    if (cuda_device_available()) set_algo_choice(previous_);
  }
  int previous_ = -1;
};

TEST_P(GemmCandidatesGpu, EveryCandidateMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, N, K, out, pad] = GetParam();
  Tensor x = random_tensor({T, K}, DType::bf16, 7, true), w = random_tensor({N, K}, DType::bf16, 8);
  Tensor dy = random_tensor({T, N}, DType::bf16, 9, true);
  const Tensor xg = x.to(Device::cuda), wg = w.to(Device::cuda), dyg = dy.to(Device::cuda);
  Fp8Rows qx = Fp8Rows::empty(T, K, Device::cuda), qxt = Fp8Rows::empty_columnwise(T, K, Device::cuda);
  Fp8Rows qdy = Fp8Rows::empty(T, N, Device::cuda), qdyt = Fp8Rows::empty_columnwise(T, N, Device::cuda);
  Fp8Weight qw = Fp8Weight::empty(N, K, Device::cuda);
  quantize_rows_and_columns(qx, qxt, xg);
  quantize_rows_and_columns(qdy, qdyt, dyg);
  quantize_weight(qw, wg);
  auto host = [](const Fp8Rows& q) { return Fp8Rows{q.data.to(Device::cpu), q.scales.to(Device::cpu)}; };
  auto host_blocks = [](const Fp8Blocks& q) { return Fp8Blocks{q.data.to(Device::cpu), q.scales.to(Device::cpu)}; };
  const Fp8Rows cx = host(qx), cxt = host(qxt), cdy = host(qdy), cdyt = host(qdyt);
  const Fp8Weight cw{host_blocks(qw.w), host_blocks(qw.wt)};
  const double tol = tolerance(out), tol8 = std::max(tolerance(out), kFp8F32Tol);

  Tensor y = poisoned({T, N}, out, Device::cpu), dx = poisoned({T, K}, out, Device::cpu);
  Tensor dw = poisoned({N, K}, DType::f32, Device::cpu);
  gemm_fprop(y, x, w);
  expect_every_candidate([&] { Tensor r = poisoned({T, N}, out, Device::cuda); gemm_fprop(r, xg, wg); return r; },
                         y, tol, "bf16 fprop");
  gemm_dgrad(dx, dy, w);
  expect_every_candidate([&] { Tensor r = poisoned({T, K}, out, Device::cuda); gemm_dgrad(r, dyg, wg); return r; },
                         dx, tol, "bf16 dgrad");
  gemm_wgrad(dw, dy, x, false);
  gemm_wgrad(dw, dy, x, true);
  expect_every_candidate(
      [&] {
        Tensor r = poisoned({N, K}, DType::f32, Device::cuda);
        gemm_wgrad(r, dyg, xg, false);
        gemm_wgrad(r, dyg, xg, true);
        return r;
      },
      dw, 1e-5, "bf16 wgrad (accumulated twice)");

  gemm_fprop(y, cx, cw);
  expect_every_candidate([&] { Tensor r = poisoned({T, N}, out, Device::cuda); gemm_fprop(r, qx, qw); return r; },
                         y, tol8, "fp8 fprop");
  gemm_dgrad(dx, cdy, cw);
  expect_every_candidate([&] { Tensor r = poisoned({T, K}, out, Device::cuda); gemm_dgrad(r, qdy, qw); return r; },
                         dx, tol8, "fp8 dgrad");
  gemm_wgrad(dw, cdyt, cxt, false);
  gemm_wgrad(dw, cdyt, cxt, true);
  expect_every_candidate(
      [&] {
        Tensor r = poisoned({N, K}, DType::f32, Device::cuda);
        gemm_wgrad(r, qdyt, qxt, false);
        gemm_wgrad(r, qdyt, qxt, true);
        return r;
      },
      dw, kFp8F32Tol, "fp8 wgrad (accumulated twice)");
}

// A token count cuBLASLt runs natively and an odd one (which may go through the padded copies).
INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmCandidatesGpu,
    ::testing::Values(GemmCase{256, 384, 512, DType::bf16, false}, GemmCase{77, 384, 512, DType::f32, false}),
    case_name);

}  // namespace
}  // namespace lockstep
