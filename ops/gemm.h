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

#include <cstdint>
#include <vector>

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

// The experts of a mixture-of-experts layer in one fp8 GEMM (FProp, or DGrad), E experts: x's rows
// sorted by expert, expert e owning rows [offsets[e], offsets[e + 1]), and
//   y[rows of e] [n_e, N] = x[rows of e] · W_eᵀ
// w holds the E experts' blocks stacked, [E·N, K]: W_e [N, K] for FProp, the expert's Wᵀ (its
// Fp8Weight's wt) for DGrad, in rows [e·N, (e + 1)·N). N (y's columns) must be a multiple of 128,
// so that every 128×128 scale block belongs to one expert and the stacked scales are the experts'
// scales one after another; a model pays nothing for this form when its experts' weights are views
// of one stacked buffer (stack_fp8_blocks copies separately made ones into it). K as for the other
// fp8 GEMMs (stored padded to 128). y: bf16 or f32 [x.rows(), N].
// offsets: E + 1 values on the host, 0 = offsets[0] ≤ … ≤ offsets[E] = x.rows() (they size the
// launch); for CUDA operands also device_offsets, the same values as i64 [E + 1] on the device
// (each tile of the kernel finds its expert there); on the CPU it may be left undefined.
// Each expert's rows are the ordinary fp8 GEMM of those rows alone (gemm_fprop / gemm_dgrad, the
// same per-128-K-block promotion): on the CPU, bit for bit. On CUDA one launch of the weight-
// streaming kernel (ops/cuda/gemm_fp8_stream_kernel.cuh) over every expert's token tiles: a row's
// bits depend on its expert's weight and the row alone, never on the other rows or experts, and
// meet the fp8 GEMMs' tolerance to the CPU reference. WGrad (reduced over each expert's rows)
// stays a loop of gemm_wgrad per expert.
void gemm_fp8_grouped(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, const std::vector<int64_t>& offsets,
                      const Tensor& device_offsets);
// The same with the offsets on the device alone (i64 [E + 1]): nothing is read back, so a CUDA
// graph can hold it (a decode step's experts, model/transformer_moe.cpp). `most_rows` bounds every
// expert's rows (routed rows: the token count, as a token picks an expert once); the launch is
// sized for the most tiles such offsets can take, and the tiles past the real ones exit at once.
// The same bits as above (a row's bits do not depend on the tile width). On the CPU the offsets are
// a host tensor, read as the host values above.
void gemm_fp8_grouped(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, int64_t most_rows,
                      const Tensor& device_offsets);

// The experts of a mixture-of-experts layer in the bf16 recipe, in one call: the rows of x (dy) sorted
// by expert and `offsets` as for gemm_fp8_grouped (E + 1 host values; no device copy needed), w
// the E experts' weights W_e [N, K] as the model keeps them (LinearWeight::bf16 of each expert: no
// stacked copy), and
//   FProp  y [rows of e]  [n_e, N] = x [rows of e]  · W_eᵀ
//   DGrad  dx[rows of e]  [n_e, K] = dy[rows of e] · W_e     overwritten, or accumulated
// y / dx: [x.rows(), N] / [dy.rows(), K], every row written (an expert without tokens owns none).
// Each expert's rows are the ordinary gemm_fprop / gemm_dgrad of those rows alone: on the CPU bit
// for bit (bf16 operands, or f32 ones: the fp32 recipe; output bf16 or f32). On CUDA one cuBLAS
// grouped GEMM over the experts with rows (ops/cuda/gemm_bf16_grouped.cu): bf16 operands and
// output only (cuBLAS's grouped GEMM has no bf16 → f32 form), fp32 accumulation, within the bf16
// GEMMs' tolerance of the CPU reference; K and N multiples of 8 (every expert's rows 16-byte
// aligned); not during CUDA-graph capture. Under the exact forward kernels (ops/forward_kernels.h)
// CUDA FProp is the per-expert loop of gemm_fprop instead: each expert's rows its exact bits.
void gemm_bf16_grouped_fprop(Tensor& y, const Tensor& x, const std::vector<Tensor>& w,
                             const std::vector<int64_t>& offsets);
void gemm_bf16_grouped_dgrad(Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w,
                             const std::vector<int64_t>& offsets, bool accumulate = false);

// parts (E blocks of the same shape, rows a multiple of 128, on one device) stacked into the
// [E·rows, cols] operand of gemm_fp8_grouped: a copy of every part's bytes and scales.
Fp8Blocks stack_fp8_blocks(const std::vector<Fp8Blocks>& parts);

}  // namespace lockstep
