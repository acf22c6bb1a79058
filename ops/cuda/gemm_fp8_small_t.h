// ops/cuda/gemm_fp8_small_t.h — the fp8 GEMM of ops/gemm.h for few tokens (decoding), where
// cuBLASLt's block-scaled kernels sit at a ~20 µs floor: out[T, M] = act[T, K] · weight[M, K]ᵀ,
// act an Fp8Rows, weight an Fp8Blocks (FProp: W; DGrad: Wᵀ), out bf16 or f32, T ≤ 64.
//
// Like the CPU reference, every 128-wide K block is summed in fp32 (tensor cores), multiplied by
// (act scale · weight scale) and added to an fp32 accumulator.
//
// Two kernels, which sum a K block differently (so their last bits differ):
// - mma.sync: e4m3 widened to f16 (exact), m16n8k16 MMAs; exact products summed in fp32. At 1 .. 16
//   tokens 0.9–2.4× cuBLASLt's fp8 on an H200; at 32 .. 64 the f16 MMAs and conversions limit it.
// - wgmma: native e4m3 m64nNk32 (N = the token tile), for 17 .. 64 tokens; a K block summed with
//   the precision of Hopper's fp8 tensor cores (cuBLASLt's).
// By default (by_tokens) mma.sync runs 1 .. 16 tokens and wgmma 17 .. 64 (kMmaSyncMaxTokens in the
// .cu: 0 if wgmma proves as fast at 1 .. 16); gemm_set_fp8_small_t_kernel (ops/gemm_backends.h)
// forces either. A token's output never depends on the other tokens of the batch while the batch
// stays on one kernel: same bits at every T of 1 .. 16 and of 17 .. 64 (of 1 .. 64 when forced).
//
// ops/cuda/gemm.cu dispatches to it; arguments are checked there and by ops/gemm.cpp (K and M
// multiples of 128, act and weight 16-byte aligned). Include only from CUDA sources.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cuda {

// True when a GEMM of `tokens` tokens goes to gemm_fp8_small_t: 1 ≤ tokens ≤ the limit set by
// gemm_set_fp8_small_t (ops/gemm_backends.h).
bool fp8_small_t_takes(int64_t tokens);

// out: bf16 or f32 [T, M], 16-byte aligned; 1 ≤ T ≤ 64.
void gemm_fp8_small_t(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);

}  // namespace lockstep::cuda
