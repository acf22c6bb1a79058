// ops/adamw.cpp — argument checks, the step's scalars and backend dispatch for ops/adamw.h.
#include "ops/adamw.h"

#include <cmath>

#include "ops/act_check.h"
#include "ops/adamw_backends.h"
#include "ops/elementwise.h"

namespace lockstep {

void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWHyper& hyper,
                int64_t step, float grad_scale, const WeightCopies& copies) {
  const Device d = param.device();
  check_tensor(param, "adamw_step: param", DType::f32, d);
  const auto check_like_param = [&](const Tensor& t, const char* what, DType dtype) {
    check_tensor(t, what, dtype, d);
    check_shape(t, what, param.shape());
  };
  check_like_param(m, "adamw_step: m", DType::f32);
  check_like_param(v, "adamw_step: v", DType::f32);
  check_like_param(grad, "adamw_step: grad", DType::f32);
  if (copies.bf16) check_like_param(*copies.bf16, "adamw_step: bf16 copy", DType::bf16);
  if (copies.fp8) {
    LOCKSTEP_CHECK(param.rank() == 2 && param.dim(0) % kFp8ColsMultiple == 0 &&
                       param.dim(1) % kFp8ColsMultiple == 0,
                   "adamw_step: an fp8 copy needs param [N, K] with N and K multiples of ",
                   kFp8ColsMultiple, ", got ", param.describe());
    check_fp8_weight(*copies.fp8, "adamw_step: fp8 copy", param.dim(0), param.dim(1), d);
  }
  LOCKSTEP_CHECK(step >= 1, "adamw_step: step counts from 1, got ", step);
  LOCKSTEP_CHECK(hyper.beta1 >= 0 && hyper.beta1 < 1 && hyper.beta2 >= 0 && hyper.beta2 < 1,
                 "adamw_step: betas must be in [0, 1), got beta1 = ", hyper.beta1,
                 ", beta2 = ", hyper.beta2);
  // A non-finite clipping factor (from a non-finite gradient norm) would poison every weight.
  LOCKSTEP_CHECK(std::isfinite(grad_scale), "adamw_step: grad_scale must be finite, got ",
                 grad_scale);

  // The bias corrections are per-step scalars: computed in double, used in fp32.
  const AdamWScalars s{
      .lr = hyper.lr,
      .beta1 = hyper.beta1,
      .one_minus_beta1 = 1.0f - hyper.beta1,
      .beta2 = hyper.beta2,
      .one_minus_beta2 = 1.0f - hyper.beta2,
      .bias1 = float(1.0 - std::pow(double(hyper.beta1), double(step))),
      .bias2 = float(1.0 - std::pow(double(hyper.beta2), double(step))),
      .eps = hyper.eps,
      .weight_decay = hyper.weight_decay,
      .grad_scale = grad_scale,
  };
  if (param.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    // The fused pass writes whole 128×128 blocks; a param with a partial block is quantized after
    // the step (the same bytes: the fused pass is that composition).
    const bool fused_fp8 = copies.fp8 && param.dim(0) % kQuantGroup == 0 && param.dim(1) % kQuantGroup == 0;
    cuda::adamw_step(param, m, v, grad, s, copies.bf16, fused_fp8 ? copies.fp8 : nullptr,
                     copies.fp8_format == ScaleFormat::pow2);
    if (copies.fp8 && !fused_fp8) quantize_weight(*copies.fp8, param, copies.fp8_format);
    return;
#else
    LOCKSTEP_NO_CUDA_OP("adamw_step");
#endif
  }
  cpu::adamw_step(param, m, v, grad, s);
  if (copies.bf16) convert(*copies.bf16, param);
  if (copies.fp8) quantize_weight(*copies.fp8, param, copies.fp8_format);
}

}  // namespace lockstep
