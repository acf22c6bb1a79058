// ops/cuda/gemm_fp8_pipelined.h — gemm_fp8_batch_invariant's kernel for many tokens (training
// forwards, prefill): out[T, M] = act[T, K] · weight[M, K]ᵀ, act an Fp8Rows, weight an Fp8Blocks,
// out bf16 or f32, with exactly the bits of the weight-streaming kernel (ops/cuda/gemm_fp8_small_t.h,
// gemm_fp8_streaming) for every output element, at any T: the same wgmma steps per K block, the
// same promotion (ops/cuda/wgmma_e4m3.cuh), the same K split of the shape and the same order of
// adding the splits' sums. Only the work's arrangement differs: TMA loads into a ring of
// shared-memory stages, tiles of 128 weight rows × 128 tokens over the whole K range, one
// persistent CTA an SM.
//
// Arguments are checked by ops/gemm.cpp and here (K stored padded to a multiple of 128, act,
// weight and out 16-byte aligned); M must be a multiple of kFp8PipelinedRows. Include only from
// CUDA sources and tests.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cuda {

constexpr int kFp8PipelinedRows = 128;    // weight rows of a tile: M must be a multiple
constexpr int kFp8PipelinedTokens = 128;  // tokens of a tile

// Whether gemm_fp8_batch_invariant runs the pipelined kernel for T tokens and M weight rows:
// - T ≥ kFp8PipelinedMinTokens, where the GEMM turns compute bound on an H200 (a weight byte
//   feeds 2T flops; its fp8 tensor cores do ~412 flops per byte of DRAM bandwidth: 1979 TFLOPS /
//   4.8 TB/s, datasheet figures). Below, streaming the weight is the cost, which the
//   weight-streaming kernel's K splits spread over every SM;
// - M a multiple of 128, and enough 128 × 128 tiles for one CTA on every SM.
// The rule may use T freely: both kernels give every row the same bits.
constexpr int64_t kFp8PipelinedMinTokens = 256;
bool fp8_pipelined_pays(int64_t T, int64_t M);

// out: bf16 or f32 [T, M], 16-byte aligned; 1 ≤ T < 2^31.
void gemm_fp8_pipelined(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);

}  // namespace lockstep::cuda
