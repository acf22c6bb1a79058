// ops/swiglu.h — the SwiGLU gate of the MLP, on the fused gate/up projection.
//
//   gate_up [T, 2I]: columns [0, I) are the gate g, [I, 2I) the up projection u
//   out [T, I] = silu(g) · u,   silu(g) = g / (1 + exp(−g))      (fp32 math, one rounding)
//   dgate_up: dg = dout · u · silu'(g), du = dout · silu(g),  silu'(g) = s·(1 + g·(1 − s)), s = σ(g)
//
// All tensors f32 or bf16. CUDA: bf16, I a multiple of 8, 16-byte aligned data.
//
// swiglu_forward_fp8 (the fp8 recipe's fused producer): swiglu_forward into a bf16 out, then
// quantize_rows_and_columns(out_rows, out_cols, out, format), or quantize_rows(out_rows, out,
// format) when out_cols.data is undefined (inference): the same bytes and scales as that
// composition on the same backend. The CUDA kernel never stores out (I a multiple of 128; other
// widths, multiples of 16, run the composition). out_rows: Fp8Rows::empty(T, I); out_cols: the
// columnwise layout of numerics/quantize.h (Fp8Rows::empty_columnwise(T, I)).
//
// From an E4M3 input (the fp8 recipe's recompute path keeps gate_up as an Fp8Rows [T, 2I], 1×128
// groups): the overloads taking an Fp8Rows gate_up are exactly dequantize into a bf16 [T, 2I]
// (numerics/quantize.h) followed by the op on it, the same bits on the same backend; the CUDA
// kernels read the E4M3 bytes and scales directly, so no bf16 copy of gate_up is written or read
// (for the forward where I is a multiple of 128; other I dequantize first). dout and dgate_up as
// above (CUDA: bf16); 2I a multiple of 128: gate_up is then stored unpadded, and up starts at I.
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep {

void swiglu_forward(Tensor& out, const Tensor& gate_up);
void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);
void swiglu_forward_fp8(Fp8Rows& out_rows, Fp8Rows& out_cols, const Tensor& gate_up,
                        ScaleFormat format = ScaleFormat::fp32);
void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Fp8Rows& gate_up);
void swiglu_forward_fp8(Fp8Rows& out_rows, Fp8Rows& out_cols, const Fp8Rows& gate_up,
                        ScaleFormat format = ScaleFormat::fp32);

}  // namespace lockstep
