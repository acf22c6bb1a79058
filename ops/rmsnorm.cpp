// ops/rmsnorm.cpp — argument checks and backend dispatch for ops/rmsnorm.h.
#include "ops/rmsnorm.h"

#include <cmath>

#include "ops/act_check.h"
#include "ops/rmsnorm_backends.h"

namespace lockstep {

namespace {

// x [R, C] with C > 0 (anywhere: it sets the device), w f32 [C], rstd f32 [R].
void check_inputs(const char* x_what, const Tensor& x, const char* w_what, const Tensor& w,
                  const char* rstd_what, const Tensor& rstd) {
  const Device d = x.device();
  check_act(x, x_what, d, x.shape());
  LOCKSTEP_CHECK(x.rank() == 2 && x.dim(1) > 0, x_what,
                 ": expected a 2-D tensor [rows, cols] with cols > 0, got ", x.describe());
  check_tensor(w, w_what, DType::f32, d);
  check_shape(w, w_what, {x.dim(1)});
  check_tensor(rstd, rstd_what, DType::f32, d);
  check_shape(rstd, rstd_what, {x.dim(0)});
}

}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  check_inputs("rmsnorm_forward: x", x, "rmsnorm_forward: w", w, "rmsnorm_forward: rstd", rstd);
  check_act(y, "rmsnorm_forward: y", x.device(), x.shape());
  LOCKSTEP_CHECK(std::isfinite(eps) && eps >= 0,
                 "rmsnorm_forward: eps must be finite and >= 0, got ", eps);
  if (x.is_cuda()) LOCKSTEP_NO_CUDA_OP("rmsnorm_forward");
  cpu::rmsnorm_forward(y, rstd, x, w, eps);
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  check_inputs("rmsnorm_backward: x", x, "rmsnorm_backward: w", w, "rmsnorm_backward: rstd", rstd);
  check_act(dy, "rmsnorm_backward: dy", x.device(), x.shape());
  check_act(dx, "rmsnorm_backward: dx", x.device(), x.shape());
  check_tensor(dw, "rmsnorm_backward: dw", DType::f32, x.device());
  check_shape(dw, "rmsnorm_backward: dw", w.shape());
  if (x.is_cuda()) LOCKSTEP_NO_CUDA_OP("rmsnorm_backward");
  cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd);
}

}  // namespace lockstep
