// ops/rmsnorm.h — RMSNorm over the last dimension of x [R, C], in fp32 math:
//
//   rstd[r] = 1 / sqrt(mean_c x[r, c]² + eps)
//   y[r, c] = x[r, c] · rstd[r] · w[c]
//   backward, with x̂ = x · rstd:
//   dx[r, c] = rstd[r] · (w[c]·dy[r, c] − x̂[r, c] · mean_c'(x̂[r, c']·w[c']·dy[r, c']))
//   dw[c]   += Σ_r dy[r, c] · x̂[r, c]           (fp32, accumulates; rows added in order)
//
// x, y, dy, dx: f32 or bf16 [R, C]; w: f32 [C]; rstd: f32 [R] (saved by forward for backward).
#pragma once

#include "core/tensor.h"

namespace lockstep {

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd);

}  // namespace lockstep
