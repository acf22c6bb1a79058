// model/linear.cpp
#include "model/linear.h"

#include "core/error.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"

namespace lockstep {

LinearWeight::LinearWeight(Recipe r, const Tensor& m, Fp8Weight fp8_copy)
    : recipe(r), master(m), fp8(std::move(fp8_copy)), shape(m.shape()) {
  if (recipe == Recipe::fp8) {
    LOCKSTEP_CHECK(master.dim(0) % kFp8ColsMultiple == 0 && master.dim(1) % kFp8ColsMultiple == 0,
                   "the fp8 recipe needs linear layers whose dimensions are multiples of ", kFp8ColsMultiple,
                   "; this model has a ", shape_string(master.shape()), " weight");
    if (fp8.w.data.defined()) check_fp8_weight(fp8, "LinearWeight: fp8_copy", shape[0], shape[1], master.device());
  }
  refresh();
}

void LinearWeight::allocate_copy(Device d, bool with_transpose) {
  switch (recipe) {
    case Recipe::fp32: break;
    case Recipe::bf16:
      if (!bf16.defined()) bf16 = Tensor::empty(shape, DType::bf16, d);
      break;
    case Recipe::fp8:
      if (fp8.w.data.defined()) break;
      if (with_transpose) fp8 = Fp8Weight::empty(shape[0], shape[1], d);
      else fp8.w = Fp8Blocks::empty(shape[0], shape[1], d);
      break;
  }
}

void LinearWeight::drop_copy() {
  bf16 = Tensor();
  fp8 = Fp8Weight();
}

void LinearWeight::refresh() {
  allocate_copy(master.device(), /*with_transpose=*/true);
  switch (recipe) {
    case Recipe::fp32: break;
    case Recipe::bf16: convert(bf16, master); break;
    case Recipe::fp8: quantize_weight(fp8, master); break;
  }
}

LinearInput linear_input(Recipe recipe, const Tensor& x, bool for_backward) {
  LinearInput in;
  if (recipe != Recipe::fp8) {
    in.act = x;
    return in;
  }
  const int64_t t = x.dim(0), k = x.dim(1);
  in.rows = Fp8Rows::empty(t, k, x.device());
  if (!for_backward) {
    quantize_rows(in.rows, x);
    return in;
  }
  in.cols = Fp8Rows::empty_columnwise(t, k, x.device());
  quantize_rows_and_columns(in.rows, in.cols, x);
  return in;
}

void keep_for_backward(LinearInput& in) {
  if (in.cols.data.defined()) {
    in.act = Tensor();
    in.rows = Fp8Rows();
  }
}

LinearInput linear_saved_input(Recipe recipe, const Tensor& x) {
  LinearInput in;
  if (recipe != Recipe::fp8) {
    in.act = x;
    return in;
  }
  in.cols = Fp8Rows::empty_columnwise(x.dim(0), x.dim(1), x.device());
  quantize_columns(in.cols, x);
  return in;
}

void linear_forward(Tensor& y, const LinearInput& x, const LinearWeight& w, const Tensor& bias) {
  switch (w.recipe) {
    case Recipe::fp32: gemm_fprop(y, x.act, w.master); break;
    case Recipe::bf16: gemm_fprop(y, x.act, w.bf16); break;
    case Recipe::fp8: gemm_fprop(y, x.rows, w.fp8); break;
  }
  if (bias.defined()) add_bias(y, bias);
}

void linear_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy,
                     const LinearInput& saved, const LinearWeight& w) {
  if (db.defined()) bias_backward(db, dy);
  if (w.recipe != Recipe::fp8) {
    const Tensor& weight = w.recipe == Recipe::fp32 ? w.master : w.bf16;
    if (dx.defined()) gemm_dgrad(dx, dy, weight);
    gemm_wgrad(dw, dy, saved.act, /*accumulate=*/true);
    return;
  }
  // dy quantized 1×128 along N for DGrad and 128×1 along T for WGrad, from one read.
  const int64_t t = dy.dim(0), n = dy.dim(1);
  Fp8Rows dy_rows = Fp8Rows::empty(t, n, dy.device());
  Fp8Rows dy_cols = Fp8Rows::empty_columnwise(t, n, dy.device());
  quantize_rows_and_columns(dy_rows, dy_cols, dy);
  if (dx.defined()) gemm_dgrad(dx, dy_rows, w.fp8);
  gemm_wgrad(dw, dy_cols, saved.cols, /*accumulate=*/true);
}

}  // namespace lockstep
