// ops/elementwise.cpp — argument checks and backend dispatch for ops/elementwise.h.
#include "ops/elementwise.h"

#include "ops/act_check.h"
#include "ops/elementwise_backends.h"

namespace lockstep {

namespace {

// A 2-D activation [T, N] (it sets the device).
void check_rows(const Tensor& t, const char* what) {
  check_act(t, what, t.device(), t.shape());
  LOCKSTEP_CHECK(t.rank() == 2, what, ": expected a 2-D tensor [T, N], got ", t.describe());
}

}  // namespace

void add_into(Tensor& y, const Tensor& x) {
  check_act(y, "add_into: y", y.device(), y.shape());
  check_act(x, "add_into: x", y.device(), y.shape());
  if (y.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    if (y.dtype() == DType::f32 && x.dtype() == DType::f32) {  // gradient accumulation
      check_cuda_vectors(y, "add_into: y", /*rows=*/false);
      check_cuda_vectors(x, "add_into: x", /*rows=*/false);
      return cuda::add_into_f32(y, x);
    }
    check_cuda_act(y, "add_into: y", /*rows=*/false);  // flat: any shape
    check_cuda_act(x, "add_into: x", /*rows=*/false);
    return cuda::add_into(y, x);
#else
    LOCKSTEP_NO_CUDA_OP("add_into");
#endif
  }
  cpu::add_into(y, x);
}

void add_bias(Tensor& y, const Tensor& b) {
  check_rows(y, "add_bias: y");
  check_tensor(b, "add_bias: b", DType::f32, y.device());
  check_shape(b, "add_bias: b", {y.dim(1)});
  if (y.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(y, "add_bias: y");
    check_cuda_vectors(b, "add_bias: b", /*rows=*/true);
    return cuda::add_bias(y, b);
#else
    LOCKSTEP_NO_CUDA_OP("add_bias");
#endif
  }
  cpu::add_bias(y, b);
}

void bias_backward(Tensor& db, const Tensor& dy) {
  check_rows(dy, "bias_backward: dy");
  check_tensor(db, "bias_backward: db", DType::f32, dy.device());
  check_shape(db, "bias_backward: db", {dy.dim(1)});
  if (dy.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(dy, "bias_backward: dy");
    return cuda::bias_backward(db, dy);
#else
    LOCKSTEP_NO_CUDA_OP("bias_backward");
#endif
  }
  cpu::bias_backward(db, dy);
}

void convert(Tensor& dst, const Tensor& src) {
  check_act(src, "convert: src", src.device(), src.shape());
  check_act(dst, "convert: dst", src.device(), src.shape());
  if (src.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_vectors(src, "convert: src", /*rows=*/false);
    check_cuda_vectors(dst, "convert: dst", /*rows=*/false);
    return cuda::convert(dst, src);
#else
    LOCKSTEP_NO_CUDA_OP("convert");
#endif
  }
  cpu::convert(dst, src);
}

double sum_squares(const Tensor& x) { return sum_squares(std::vector<const Tensor*>{&x})[0]; }

std::vector<double> sum_squares(const std::vector<const Tensor*>& xs) {
  if (xs.empty()) return {};
  const Device device = xs[0]->device();
  for (const Tensor* x : xs) check_tensor(*x, "sum_squares: x", DType::f32, device);
  if (device == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    for (const Tensor* x : xs) check_cuda_vectors(*x, "sum_squares: x", /*rows=*/false);
    return cuda::sum_squares(xs);
#else
    LOCKSTEP_NO_CUDA_OP("sum_squares");
#endif
  }
  std::vector<double> sums;
  for (const Tensor* x : xs) sums.push_back(cpu::sum_squares(*x));
  return sums;
}

}  // namespace lockstep
