// ops/rmsnorm_backends.h — per-backend entry points for ops/rmsnorm.h; arguments are checked by
// ops/rmsnorm.cpp.
#pragma once

#include "core/tensor.h"

namespace lockstep::cpu {
void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd);
}  // namespace lockstep::cpu
