// ops/swiglu_backends.h — per-backend entry points for ops/swiglu.h; arguments are checked by
// ops/swiglu.cpp. The CPU backend has no fused fp8 ops (the forward, those from an E4M3 input): its
// reference is the composition.
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cpu {
void swiglu_forward(Tensor& out, const Tensor& gate_up);
void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void swiglu_forward(Tensor& out, const Tensor& gate_up);
void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);
// out_cols null: rows only.
void swiglu_forward_fp8(Fp8Rows& out_rows, Fp8Rows* out_cols, const Tensor& gate_up, bool pow2);
// gate_up in E4M3 (ops/swiglu.h).
void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Fp8Rows& gate_up);
void swiglu_forward_fp8(Fp8Rows& out_rows, Fp8Rows* out_cols, const Fp8Rows& gate_up, bool pow2);
}  // namespace lockstep::cuda
