// ops/rmsnorm_backends.h — per-backend entry points for ops/rmsnorm.h; arguments are checked by
// ops/rmsnorm.cpp. The CPU backend has no fused fp8 forward: its reference is the composition.
// residual null: no add (otherwise x += residual first, in place).
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cpu {
void rmsnorm_forward(Tensor& y, Tensor& rstd, Tensor& x, const Tensor* residual, const Tensor& w,
                     float eps);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void rmsnorm_forward(Tensor& y, Tensor& rstd, Tensor& x, const Tensor* residual, const Tensor& w,
                     float eps);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd);
// y_cols null: rows only.
void rmsnorm_forward_fp8(Fp8Rows& y_rows, Fp8Rows* y_cols, Tensor& rstd, Tensor& x,
                         const Tensor* residual, const Tensor& w, float eps, bool pow2);
}  // namespace lockstep::cuda
