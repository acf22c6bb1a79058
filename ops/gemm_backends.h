// ops/gemm_backends.h — per-backend GEMM entry points; arguments are checked by ops/gemm.cpp.
// The CPU backend has one "TN" form, out[i][j] (+)= Σ_k a[i][k] · b[j][k], a: [M, K], b: [N', K];
// each operand is read as stored (K contiguous) or transposed: DGrad and WGrad need no transposed
// copy.
#pragma once

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
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void gemm_fprop_bf16(Tensor& y, const Tensor& x, const Tensor& w);
void gemm_dgrad_bf16(Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate);
void gemm_wgrad_bf16(Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate);
void gemm_fp8(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);  // FProp, DGrad
void gemm_wgrad_fp8(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate);
// Tests: take the padded-token path even where cuBLASLt could run the odd token count natively.
void gemm_force_token_padding(bool on);
// Tests and benches: how new plans pick their algorithm: −1 autotune (default), i ≥ 0 the
// heuristic's i-th candidate. Returns the previous setting.
int gemm_set_algo_choice(int choice);
// Tests and benches: the fp8 GEMMs (FProp, DGrad) of 1 .. `tokens` tokens run on the small-T kernel
// (ops/cuda/gemm_fp8_small_t.h), larger ones on cuBLASLt; 0: always cuBLASLt; at most 64.
// Default 64, or the environment's LOCKSTEP_FP8_SMALL_T. Returns the previous setting.
int gemm_set_fp8_small_t(int tokens);
}  // namespace lockstep::cuda
