// ops/cuda/gemm_fp8_small_t.cu — ops/cuda/gemm_fp8_small_t.h: the fp8 GEMM at decode token counts,
// which is weight-bandwidth bound, and the batch-invariant FProp. Both launch the weight-streaming
// kernel (ops/cuda/gemm_fp8_stream_kernel.cuh, where its design is described) over one weight: the
// K split (a function of the shape alone) and the token tile width are chosen here; at many tokens
// the batch-invariant FProp takes the pipelined kernel instead (ops/cuda/gemm_fp8_pipelined.h:
// the same bits, the same K split).
#include "ops/cuda/gemm_fp8_small_t.h"

#include <cstdint>

#include "core/cuda_check.h"
#include "core/device.h"
#include "ops/cuda/gemm_fp8_pipelined.h"
#include "ops/cuda/gemm_fp8_stream_kernel.cuh"

namespace lockstep::cuda {

namespace {

using namespace stream_kernel;

// CTAs in clusters of `splits` that the GPU holds at once, for the 64-token kernel (every token
// count has the same occupancy, kCtasPerSm an SM, and launches the same grid).
int resident_ctas(int splits) {
  static int cached[kMaxSplits + 1] = {};
  if (cached[splits] == 0) {
    const LaunchConfig launch = launch_config(splits, 1, Layout<8>::kSmem);
    int clusters = 0;
    LOCKSTEP_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, prepared_kernel<8, uint16_t>(), &launch.config));
    cached[splits] = clusters * splits;
  }
  return cached[splits];
}

// K splits: doubled while the CTAs do not yet fill every SM kCtasPerSm times, every split keeps at
// least one K block, the cluster is not full, and all of the doubled grid's clusters fit on the GPU
// at once (a second wave would double the time). A function of the shape alone, never of T, so
// that a token's sum is the same at every batch size.
int splits_for(int64_t M, int64_t K) {
  const int64_t row_blocks = M / kRows, kblocks = K / kBlockK;
  int splits = 1;
  while (2 * splits <= kMaxSplits && row_blocks * splits < kCtasPerSm * device_sm_count() && 2 * splits <= kblocks &&
         row_blocks * 2 * splits <= resident_ctas(2 * splits))
    splits *= 2;
  return splits;
}

// T tokens in tiles of 8·NT.
template <int NT, class Out>
void launch(const Args& a, int splits) {
  const int64_t token_tiles = (a.T + 8 * NT - 1) / (8 * NT);
  launch_config(splits, a.M / kRows, Layout<NT>::kSmem, token_tiles)
      .early_start_in_scope()
      .run(prepared_kernel<NT, Out>(), a);
}

template <class Out>
void launch_for_tokens(const Args& a, int splits) {
  // Past 64 tokens: gemm_fp8_batch_invariant only.
  with_tile_width(a.T, [&](auto nt) { launch<decltype(nt)::value, Out>(a, splits); });
}

// The arguments of either entry point, checked (T by the caller).
Args checked_args(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  const int64_t T = act.rows(), K = act.cols(), M = weight.rows();
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(out.data()) % 16 == 0,
                 "fp8 weight-streaming GEMM: the output must be 16-byte aligned, got ", out.describe(), " at ", out.data());
  LOCKSTEP_CHECK(M / kRows <= 65535, "fp8 weight-streaming GEMM: at most 65535 row blocks, got ", weight.data.describe());
  LOCKSTEP_CHECK(M % kRows == 0, "fp8 weight-streaming GEMM: the weight's rows must be a multiple of ", kRows, ", got ",
                 weight.data.describe());
  return Args{static_cast<const uint8_t*>(act.data.data()), act.scales.data_as<float>(),
              static_cast<const uint8_t*>(weight.data.data()), weight.scales.data_as<float>(), out.data(),
              T, M, K, weight.scales.dim(1)};
}

// T tokens: one tile of the narrowest width that holds them up to 64, else tiles of 128.
void run(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  const Args a = checked_args(out, act, weight);
  const int splits = splits_for(a.M, a.K);
  if (out.dtype() == DType::f32) return launch_for_tokens<float>(a, splits);
  launch_for_tokens<uint16_t>(a, splits);
}

}  // namespace

void gemm_fp8_small_t(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  const int64_t T = act.rows();
  LOCKSTEP_CHECK(T >= 1 && T <= kFp8SmallTMaxTokens, "fp8 small-T GEMM: 1 .. ", kFp8SmallTMaxTokens,
                 " tokens, got ", T);
  run(out, act, weight);
}

void gemm_fp8_streaming(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  const int64_t T = act.rows();
  LOCKSTEP_CHECK(T >= 1 && (T + 63) / 64 <= 65535, "fp8 weight-streaming GEMM: 1 .. ", int64_t(65535) * 64,
                 " tokens, got ", T);
  run(out, act, weight);
}

int fp8_batch_invariant_splits(int64_t M, int64_t K) { return splits_for(M, K); }

void gemm_fp8_batch_invariant(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  if (fp8_pipelined_pays(act.rows(), weight.rows())) return gemm_fp8_pipelined(out, act, weight);
  gemm_fp8_streaming(out, act, weight);
}

}  // namespace lockstep::cuda
