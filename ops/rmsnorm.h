// ops/rmsnorm.h — RMSNorm over the last dimension of x [R, C], in fp32 math:
//
//   rstd[r] = 1 / sqrt(mean_c x[r, c]² + eps)
//   y[r, c] = x[r, c] · rstd[r] · w[c]
//   backward, with x̂ = x · rstd:
//   dx[r, c] = rstd[r] · (w[c]·dy[r, c] − x̂[r, c] · mean_c'(x̂[r, c']·w[c']·dy[r, c']))
//   dw[c]   += Σ_r dy[r, c] · x̂[r, c]           (fp32, accumulates; rows added in order)
//
// x, y, dy, dx: f32 or bf16 [R, C]; w: f32 [C]; rstd: f32 [R] (saved by forward for backward).
// CUDA: x, y, dy, dx bf16, C a multiple of 8, 16-byte aligned data. A row's output does not depend
// on the other rows. dw adds the rows in a fixed order (blocks of consecutive rows, then the blocks
// in order; no atomics): the same bits every run, rounded differently from the CPU's.
//
// rmsnorm_forward_fp8 (the fp8 recipe's fused producer): rmsnorm_forward into a bf16 y, then
// quantize_rows_and_columns(y_rows, y_cols, y, format), or quantize_rows(y_rows, y, format) when
// y_cols.data is undefined (inference): the same bytes, scales and rstd as that composition on the
// same backend. The CUDA kernels never store y (C a multiple of 128; other widths, multiples of 16,
// run the composition). y_rows: Fp8Rows::empty(R, C); y_cols: the columnwise layout of
// numerics/quantize.h (Fp8Rows::empty_columnwise(R, C)).
//
// With a residual (the overloads taking `Tensor& x, const Tensor& residual`): first x += residual
// in place, rounded as ops/elementwise.h's add_into rounds (one fp32 add, then x's dtype), then the
// op on that sum: the bits (x, y or y_rows/y_cols, rstd) of add_into(x, residual) followed by the
// op, on the same backend, with the add fused into the norm's pass (the transformer's residual
// adds, each followed by a norm). residual: x's dtype, shape and device (CUDA: 16-byte aligned);
// undefined: no add. It must not overlap y.
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep {

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd);
void rmsnorm_forward_fp8(Fp8Rows& y_rows, Fp8Rows& y_cols, Tensor& rstd, const Tensor& x,
                         const Tensor& w, float eps, ScaleFormat format = ScaleFormat::fp32);

// x += residual, then the ops above on x.
void rmsnorm_forward(Tensor& y, Tensor& rstd, Tensor& x, const Tensor& residual, const Tensor& w,
                     float eps);
void rmsnorm_forward_fp8(Fp8Rows& y_rows, Fp8Rows& y_cols, Tensor& rstd, Tensor& x,
                         const Tensor& residual, const Tensor& w, float eps,
                         ScaleFormat format = ScaleFormat::fp32);

}  // namespace lockstep
