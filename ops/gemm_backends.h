// ops/gemm_backends.h — per-backend GEMM entry points; arguments are checked by ops/gemm.cpp.
// The CPU backend has one "TN" form, out[i][j] (+)= Σ_k a[i][k] · b[j][k], a: [M, K], b: [N', K];
// each operand is read as stored (K contiguous) or transposed: DGrad and WGrad need no transposed
// copy.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cpu {
// A bf16 or f32 matrix read as [rows, K]: stored so, or (transposed) stored as [K, rows].
struct Operand {
  const Tensor& t;
  bool transposed = false;
};
// out: bf16 or f32 [M, N']; a and b may differ in dtype. Every element is computed by the same
// operations whatever M, N', its position and the thread count (ops/cpu/gemm.cpp).
void gemm_tn(Tensor& out, const Operand& a, const Operand& b, bool accumulate);
// a: activation-style (1×128 groups), b: Fp8Rows or Fp8Blocks; out bf16 or f32.
void gemm_tn_fp8(Tensor& out, const Fp8Rows& a, const Fp8Rows& b, bool accumulate);
void gemm_tn_fp8(Tensor& out, const Fp8Rows& a, const Fp8Blocks& b, bool accumulate);
// ops/gemm.h's gemm_fp8_grouped: expert e's rows of a times rows [e·N, (e+1)·N) of b, N = out's
// columns; each expert the gemm_tn_fp8 of its rows alone.
void gemm_fp8_grouped(Tensor& out, const Fp8Rows& a, const Fp8Blocks& b, const std::vector<int64_t>& offsets);
// ops/gemm.h's gemm_bf16_grouped_*: expert e's rows of a times w[e] (FProp) or, `dgrad`, w[e]
// transposed; each expert the gemm_tn of its rows alone (so gemm_fprop's / gemm_dgrad's bits).
void gemm_bf16_grouped(Tensor& out, const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets,
                       bool dgrad, bool accumulate);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void gemm_fprop_bf16(Tensor& y, const Tensor& x, const Tensor& w);
void gemm_dgrad_bf16(Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate);
void gemm_wgrad_bf16(Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate);
void gemm_fp8(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);  // DGrad, FProp …
// … FProp goes through here: gemm_fp8, or under the exact forward kernels (ops/forward_kernels.h)
// the batch-invariant kernel (ops/cuda/gemm_fp8_small_t.h) at every T: each output row the same
// bits whatever the token count and the row's place (cuBLASLt's block-scaled kernels split K by
// shape and T, and promote partial sums in their own order, so a decode row and the training
// forward's row of the same token differ). Slower at training token counts; the weight's rows
// must be a multiple of 64.
void gemm_fp8_fprop(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w);
// ops/gemm.h's gemm_fp8_grouped (ops/cuda/gemm_fp8_grouped.cu).
void gemm_fp8_grouped(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, const std::vector<int64_t>& offsets,
                      const Tensor& device_offsets);
void gemm_fp8_grouped(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, int64_t most_rows,
                      const Tensor& device_offsets);
// ops/gemm.h's gemm_bf16_grouped_* (ops/cuda/gemm_bf16_grouped.cu), as the CPU's above; out bf16.
void gemm_bf16_grouped(Tensor& out, const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets,
                       bool dgrad, bool accumulate);
void gemm_wgrad_fp8(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate);
// Tests: take the padded-token path even where cuBLASLt could run the odd token count natively.
void gemm_force_token_padding(bool on);
// Tests and benches: how new plans pick their algorithm: −1 autotune (default), i ≥ 0 the
// heuristic's i-th candidate. Returns the previous setting.
int gemm_set_algo_choice(int choice);
// Which fp8 GEMMs (FProp, DGrad) of 1 .. 64 tokens run on the small-T kernel
// (ops/cuda/gemm_fp8_small_t.h) rather than cuBLASLt; larger ones always run on cuBLASLt.
// kFp8SmallTAuto (the default): per shape (tokens, rows, K, output dtype), the faster of the two,
// timed (L2 flushed, as in decoding) on the shape's first call and remembered; cuBLASLt must win by
// the autotune margin. Untimed, the small-T kernel takes 1 .. 16 tokens and cuBLASLt more (where it
// measured faster on some Qwen3 shapes): with autotuning off (LOCKSTEP_GEMM_AUTOTUNE=0 or a fixed
// gemm_set_algo_choice: deterministic across runs), and for a shape first called during CUDA-graph
// capture (remembered so; timing would synchronize). A token's bits are independent of the batch
// size among the sizes that run on the same kernel (all of 1 .. 64 when forced, as tests do).
// Tests and benches: 0 .. 64 forces the small-T kernel for 1 .. `tokens` tokens and cuBLASLt
// above (0: always cuBLASLt). Default kFp8SmallTAuto. Returns the previous setting. (Under the
// exact forward kernels fp8 FProp does not come here: gemm_fp8_fprop.)
constexpr int kFp8SmallTAuto = -1;
int gemm_set_fp8_small_t(int tokens);
// Benches: whether gemm_fp8 now runs a GEMM of this shape (act [tokens, k], weight [rows, k]) on
// the small-T kernel; under kFp8SmallTAuto with autotuning, the choice remembered from the shape's
// first call (the untimed rule before one).
bool gemm_fp8_uses_small_t(int64_t tokens, int64_t rows, int64_t k, DType out);
}  // namespace lockstep::cuda
