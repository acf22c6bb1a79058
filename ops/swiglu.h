// ops/swiglu.h — the SwiGLU gate of the MLP, on the fused gate/up projection.
//
//   gate_up [T, 2I]: columns [0, I) are the gate g, [I, 2I) the up projection u
//   out [T, I] = silu(g) · u,   silu(g) = g / (1 + exp(−g))      (fp32 math, one rounding)
//   dgate_up: dg = dout · u · silu'(g), du = dout · silu(g),  silu'(g) = s·(1 + g·(1 − s)), s = σ(g)
//
// All tensors f32 or bf16.
#pragma once

#include "core/tensor.h"

namespace lockstep {

void swiglu_forward(Tensor& out, const Tensor& gate_up);
void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);

}  // namespace lockstep
