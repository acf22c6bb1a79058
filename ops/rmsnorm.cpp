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

void check_eps(const char* op, float eps) {
  LOCKSTEP_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
}

// The residual added into x: x's dtype, shape and device.
void check_residual(const char* what, const Tensor& residual, const Tensor& x) {
  check_tensor(residual, what, x.dtype(), x.device());
  check_shape(residual, what, x.shape());
}

void forward(Tensor& y, Tensor& rstd, Tensor& x, const Tensor* residual, const Tensor& w, float eps) {
  check_inputs("rmsnorm_forward: x", x, "rmsnorm_forward: w", w, "rmsnorm_forward: rstd", rstd);
  check_act(y, "rmsnorm_forward: y", x.device(), x.shape());
  if (residual) check_residual("rmsnorm_forward: residual", *residual, x);
  check_eps("rmsnorm_forward", eps);
  if (x.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(x, "rmsnorm_forward: x");
    check_cuda_act(y, "rmsnorm_forward: y");
    check_cuda_vectors(w, "rmsnorm_forward: w", /*rows=*/true);
    if (residual) check_cuda_act(*residual, "rmsnorm_forward: residual");
    return cuda::rmsnorm_forward(y, rstd, x, residual, w, eps);
#else
    LOCKSTEP_NO_CUDA_OP("rmsnorm_forward");
#endif
  }
  cpu::rmsnorm_forward(y, rstd, x, residual, w, eps);
}

void forward_fp8(Fp8Rows& y_rows, Fp8Rows& y_cols, Tensor& rstd, Tensor& x, const Tensor* residual,
                 const Tensor& w, float eps, ScaleFormat format) {
  check_inputs("rmsnorm_forward_fp8: x", x, "rmsnorm_forward_fp8: w", w, "rmsnorm_forward_fp8: rstd",
               rstd);
  if (residual) check_residual("rmsnorm_forward_fp8: residual", *residual, x);
  check_eps("rmsnorm_forward_fp8", eps);
  const int64_t R = x.dim(0), C = x.dim(1);
  LOCKSTEP_CHECK(C % kFp8ColsMultiple == 0, "rmsnorm_forward_fp8: x: the row width must be a multiple of ",
                 kFp8ColsMultiple, " for FP8 groups, got ", x.describe());
  check_fp8_rows(y_rows, "rmsnorm_forward_fp8: y_rows", R, C, x.device());
  const bool columns = y_cols.data.defined();
  if (columns) check_fp8_rows(y_cols, "rmsnorm_forward_fp8: y_cols", C, R, x.device());
  // The fused kernels quantize whole 128-wide groups of a row; a row with a partial group takes
  // the composition itself (rmsnorm_forward, then the quantizers).
  if (x.is_cuda() && C % kQuantGroup == 0) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(x, "rmsnorm_forward_fp8: x");
    check_cuda_vectors(w, "rmsnorm_forward_fp8: w", /*rows=*/true);
    check_cuda_vectors(y_rows.data, "rmsnorm_forward_fp8: y_rows", /*rows=*/true);
    if (columns) check_cuda_vectors(y_cols.data, "rmsnorm_forward_fp8: y_cols", /*rows=*/true);
    if (residual) check_cuda_act(*residual, "rmsnorm_forward_fp8: residual");
    return cuda::rmsnorm_forward_fp8(y_rows, columns ? &y_cols : nullptr, rstd, x, residual, w, eps,
                                     format == ScaleFormat::pow2);
#else
    LOCKSTEP_NO_CUDA_OP("rmsnorm_forward_fp8");
#endif
  }
  Tensor y = Tensor::empty({R, C}, DType::bf16, x.device());
  forward(y, rstd, x, residual, w, eps);
  if (columns) quantize_rows_and_columns(y_rows, y_cols, y, format);
  else quantize_rows(y_rows, y, format);
}

}  // namespace

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  check_inputs("rmsnorm_backward: x", x, "rmsnorm_backward: w", w, "rmsnorm_backward: rstd", rstd);
  check_act(dy, "rmsnorm_backward: dy", x.device(), x.shape());
  check_act(dx, "rmsnorm_backward: dx", x.device(), x.shape());
  check_tensor(dw, "rmsnorm_backward: dw", DType::f32, x.device());
  check_shape(dw, "rmsnorm_backward: dw", w.shape());
  if (x.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(x, "rmsnorm_backward: x");
    check_cuda_act(dy, "rmsnorm_backward: dy");
    check_cuda_act(dx, "rmsnorm_backward: dx");
    check_cuda_vectors(w, "rmsnorm_backward: w", /*rows=*/true);
    return cuda::rmsnorm_backward(dx, dw, dy, x, w, rstd);
#else
    LOCKSTEP_NO_CUDA_OP("rmsnorm_backward");
#endif
  }
  cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd);
}

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  Tensor input = x;  // a second handle: with no residual the op only reads it
  forward(y, rstd, input, nullptr, w, eps);
}

void rmsnorm_forward(Tensor& y, Tensor& rstd, Tensor& x, const Tensor& residual, const Tensor& w,
                     float eps) {
  forward(y, rstd, x, residual.defined() ? &residual : nullptr, w, eps);
}

void rmsnorm_forward_fp8(Fp8Rows& y_rows, Fp8Rows& y_cols, Tensor& rstd, const Tensor& x,
                         const Tensor& w, float eps, ScaleFormat format) {
  Tensor input = x;
  forward_fp8(y_rows, y_cols, rstd, input, nullptr, w, eps, format);
}

void rmsnorm_forward_fp8(Fp8Rows& y_rows, Fp8Rows& y_cols, Tensor& rstd, Tensor& x,
                         const Tensor& residual, const Tensor& w, float eps, ScaleFormat format) {
  forward_fp8(y_rows, y_cols, rstd, x, residual.defined() ? &residual : nullptr, w, eps, format);
}

}  // namespace lockstep
