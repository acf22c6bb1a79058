// ops/gemm_backends.h — per-backend GEMM entry points; arguments are checked by ops/gemm.cpp.
// The CPU reference has one "TN" form (the wrappers transpose bf16 operands where needed):
//   out[i][j] (+)= Σ_k a[i][k] · b[j][k]      a: [M, K], b: [N', K], both contiguous along K.
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cpu {
// a, b: bf16 with K contiguous. out: bf16 or f32 [M, N'].
void gemm_tn_bf16(Tensor& out, const Tensor& a, const Tensor& b, bool accumulate);
// a: activation-style (1×128 groups), b: Fp8Rows or Fp8Blocks; out bf16 or f32.
void gemm_tn_fp8(Tensor& out, const Fp8Rows& a, const Fp8Rows& b, bool accumulate);
void gemm_tn_fp8(Tensor& out, const Fp8Rows& a, const Fp8Blocks& b, bool accumulate);
// Transposed copy of a bf16 [R, C] tensor as [C, R].
Tensor transpose_bf16(const Tensor& x);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void gemm_fprop_bf16(Tensor& y, const Tensor& x, const Tensor& w);
void gemm_dgrad_bf16(Tensor& dx, const Tensor& dy, const Tensor& w);
void gemm_wgrad_bf16(Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate);
void gemm_fp8(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight);         // FProp, DGrad
void gemm_wgrad_fp8(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate);
// Tests: take the padded-token path even where cuBLASLt could run the odd token count natively.
void gemm_force_token_padding(bool on);
}  // namespace lockstep::cuda
