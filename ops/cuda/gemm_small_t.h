// ops/cuda/gemm_small_t.h — the FProp/DGrad GEMMs of ops/gemm.h for few tokens (decoding), where
// cuBLASLt sits at a latency floor (block-scaled fp8: ~20 µs) or well below the weight bandwidth
// (bf16): out[T, M] = act[T, K] · weight[M, K]ᵀ, out bf16 or f32, 1 ≤ T ≤ 64, weight-bandwidth bound.
//
// fp8: act an Fp8Rows, weight an Fp8Blocks (FProp: W; DGrad: Wᵀ), K and M multiples of 128. Like
// the CPU reference, every 128-wide K block is summed in fp32, multiplied by (act scale · weight
// scale) and added to an fp32 accumulator. A K block is summed by wgmma on e4m3 (m64nNk32, N = the
// token tile), with the precision of Hopper's fp8 tensor cores (cuBLASLt's).
// bf16 (FProp): act bf16 [T, K], weight bf16 [M, K], M a multiple of 128 and K of 64; one fp32
// accumulator over all of K, summed by wgmma on bf16 (m64nNk16), as cuBLASLt's bf16 kernels sum.
//
// A token's output never depends on the other tokens of the batch: the same bits at every T of
// 1 .. 64 (the K split is a function of the shape alone, and each token's sum is the same whatever
// the tile).
//
// ops/cuda/gemm.cu dispatches to these, or to cuBLASLt, per shape (gemm_set_small_t in
// ops/gemm_backends.h); the fp8 arguments are checked there and by ops/gemm.cpp, the bf16 ones
// here. Operands and output 16-byte aligned. Include only from CUDA sources.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cuda {

constexpr int kSmallTMaxTokens = 64;
constexpr int64_t kSmallTRows = 128;   // the bf16 weight's rows: a multiple of this
constexpr int64_t kSmallTBf16K = 64;   // the bf16 K: a multiple of this (one 128-byte swizzle row)

// out: bf16 or f32 [T, M], 16-byte aligned; 1 ≤ T ≤ kSmallTMaxTokens.
void gemm_fp8_small_t(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);
void gemm_bf16_small_t(Tensor& out, const Tensor& act, const Tensor& weight);

}  // namespace lockstep::cuda
