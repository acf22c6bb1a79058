// numerics/quantize_backends.h — the per-backend entry points behind numerics/quantize.h.
// Arguments are already checked by the dispatcher (numerics/quantize.cpp).
#pragma once

#include "numerics/quantize.h"

namespace lockstep::cpu {
void quantize_rows(Fp8Rows& out, const Tensor& x, bool pow2);
void quantize_columns(Fp8Rows& out_t, const Tensor& x, bool pow2);
void quantize_weight(Fp8Weight& out, const Tensor& w, bool pow2);
void transpose_weight_blocks(Fp8Weight& w);
void dequantize_rows(Tensor& out, const Fp8Rows& q);
void dequantize_blocks(Tensor& out, const Fp8Blocks& q);
int64_t first_nonfinite(const Tensor& scales);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
// Either output may be null: one read of x serves both.
void quantize_rows_and_columns(Fp8Rows* out, Fp8Rows* out_t, const Tensor& x, bool pow2);
void quantize_weight(Fp8Weight& out, const Tensor& w, bool pow2);
void transpose_weight_blocks(Fp8Weight& w);
void dequantize_rows(Tensor& out, const Fp8Rows& q);
void dequantize_blocks(Tensor& out, const Fp8Blocks& q);
int64_t first_nonfinite(const Tensor& scales);
}  // namespace lockstep::cuda
