// ops/adamw.cpp — argument checks and backend dispatch for ops/adamw.h.
#include "ops/adamw.h"

#include <cmath>

#include "ops/act_check.h"
#include "ops/adamw_backends.h"

namespace lockstep {

void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWHyper& hyper,
                int64_t step, float grad_scale) {
  const Device d = param.device();
  check_tensor(param, "adamw_step: param", DType::f32, d);
  const auto check_like_param = [&](const Tensor& t, const char* what) {
    check_tensor(t, what, DType::f32, d);
    check_shape(t, what, param.shape());
  };
  check_like_param(m, "adamw_step: m");
  check_like_param(v, "adamw_step: v");
  check_like_param(grad, "adamw_step: grad");
  LOCKSTEP_CHECK(step >= 1, "adamw_step: step counts from 1, got ", step);
  LOCKSTEP_CHECK(hyper.beta1 >= 0 && hyper.beta1 < 1 && hyper.beta2 >= 0 && hyper.beta2 < 1,
                 "adamw_step: betas must be in [0, 1), got beta1 = ", hyper.beta1,
                 ", beta2 = ", hyper.beta2);
  // A non-finite clipping factor (from a non-finite gradient norm) would poison every weight.
  LOCKSTEP_CHECK(std::isfinite(grad_scale), "adamw_step: grad_scale must be finite, got ",
                 grad_scale);
  if (param.is_cuda()) LOCKSTEP_NO_CUDA_OP("adamw_step");
  cpu::adamw_step(param, m, v, grad, hyper, step, grad_scale);
}

}  // namespace lockstep
