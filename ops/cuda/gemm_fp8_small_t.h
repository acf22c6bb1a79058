// ops/cuda/gemm_fp8_small_t.h — the fp8 GEMM of ops/gemm.h for few tokens (decoding), where
// cuBLASLt's block-scaled kernels sit at a ~20 µs floor: out[T, M] = act[T, K] · weight[M, K]ᵀ,
// act an Fp8Rows, weight an Fp8Blocks (FProp: W; DGrad: Wᵀ), out bf16 or f32, T ≤ 64.
//
// Like the CPU reference, every 128-wide K block is summed in fp32, multiplied by (act scale ·
// weight scale) and added to an fp32 accumulator. A K block is summed by wgmma on e4m3 (m64nNk32,
// N = the token tile), with the precision of Hopper's fp8 tensor cores (cuBLASLt's). A token's
// output never depends on the other tokens of the batch: the same bits at every T of 1 .. 64 (the
// K split is a function of the shape alone, and each token's sum is the same whatever the tile).
//
// Inside an EarlyStartScope (core/early_start.h) it starts early and reads its first weight tiles
// before waiting for the kernel before it: that kernel must not write the weight (the scope's
// promise).
//
// ops/cuda/gemm.cu dispatches to it, or to cuBLASLt, per shape (gemm_set_fp8_small_t in
// ops/gemm_backends.h); arguments are checked there and by ops/gemm.cpp (K stored padded to a
// multiple of 128 as numerics/quantize.h pads it, act and weight 16-byte aligned). M must be a
// multiple of kFp8SmallTRows (a CTA's rows; a 128-row scale block may end halfway, as at M = 576);
// gemm.cu sends other M to cuBLASLt. Include only from CUDA sources.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cuda {

constexpr int kFp8SmallTMaxTokens = 64;
constexpr int kFp8SmallTRows = 64;  // weight rows of a CTA: M must be a multiple

// out: bf16 or f32 [T, M], 16-byte aligned; 1 ≤ T ≤ kFp8SmallTMaxTokens.
void gemm_fp8_small_t(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);

// The same kernel at any T ≥ 1: past 64 tokens, tiles of 128 (a grid dimension; each tile streams
// the weight again, from L2 mostly, with wgmma m64n128k32); up to 64, one tile of the narrowest
// width, as gemm_fp8_small_t. Every token's output row is the same bits whatever T and wherever the
// token sits in the batch (the K split and the order of the K blocks are the shape's alone, and
// wgmma sums a token's column alike at every tile width and column).
void gemm_fp8_streaming(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);

// How many ways gemm_fp8_streaming splits the K blocks of an [M, K] weight (1, 2 or 4; a function
// of the shape and the GPU, never of T). Split s sums K blocks [s·kb/splits, (s+1)·kb/splits), and
// the splits' sums are added in order of s: the pipelined kernel (ops/cuda/gemm_fp8_pipelined.h)
// repeats both to give the same bits.
int fp8_batch_invariant_splits(int64_t M, int64_t K);

// The fp8 FProp of the exact forward kernels (ops/forward_kernels.h, gemm_fp8_fprop), where the
// rollout's decode rows and the training forward's rows must agree: gemm_fp8_streaming, or at many
// tokens (fp8_pipelined_pays) the pipelined kernel, which gives every element the same bits.
void gemm_fp8_batch_invariant(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);

}  // namespace lockstep::cuda
