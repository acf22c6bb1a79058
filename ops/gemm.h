// ops/gemm.h — the three GEMMs of a linear layer y = x·Wᵀ, x [T, K], W [N, K], in both recipes:
//
//   FProp  y  [T, N] = x  · Wᵀ
//   DGrad  dx [T, K] = dy · W       overwritten, or accumulated in the bf16 recipe (sums over N)
//   WGrad  dW [N, K] = dyᵀ · x      fp32, overwritten or accumulated (micro-batches)
//
// bf16 recipe: bf16 operands (or f32 operands, CPU only: the fp32 recipe), fp32 accumulation,
// bf16 (or f32) output.
// fp8 recipe (docs/architecture.md): x, dy quantized 1×128 along the reduction dimension (Fp8Rows), W as
// 128×128 blocks (Fp8Weight: DGrad reads its transposed copy), WGrad from the columnwise
// (transposed, token-padded) copies of dy and x. Every 128-wide K block is summed in fp32, scaled
// by its two scales and added to an fp32 accumulator — on the CPU in exactly that order, so a row's
// result never depends on the other rows (T) of the batch.
//
// Tensors on the CPU run the reference; tensors on CUDA run cuBLASLt (plans cached per shape), or
// for fp8 FProp/DGrad of few tokens (decoding) a weight-streaming kernel of ours.
// fp8 recipe: K and N multiples of 16 (kFp8ColsMultiple), the reduction dimension stored padded
// to whole 128-groups with zeros (numerics/quantize.h): a partial last group adds nothing; T is
// free. DGrad's dx [T, K] is the K unpadded rows of Wᵀ.
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep {

// bf16 recipe (x, w, dy both bf16, or both f32 on the CPU). y/dx: bf16 or f32.
void gemm_fprop(Tensor& y, const Tensor& x, const Tensor& w);
void gemm_dgrad(Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate = false);
void gemm_wgrad(Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate);

// fp8 recipe. dy_t, x_t: columnwise copies (Fp8Rows of [N, Tp] and [K, Tp]). FProp reads only
// w.w: an inference-only model leaves w.wt empty.
void gemm_fprop(Tensor& y, const Fp8Rows& x, const Fp8Weight& w);
void gemm_dgrad(Tensor& dx, const Fp8Rows& dy, const Fp8Weight& w);
void gemm_wgrad(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate);

}  // namespace lockstep
