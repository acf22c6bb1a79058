// ops/gemm.cpp — shape/dtype/device checks and backend dispatch for ops/gemm.h.
#include "ops/gemm.h"

#include "core/error.h"
#include "ops/gemm_backends.h"

namespace lockstep {

namespace {

void check_matrix(const Tensor& t, const char* what, DType dtype, Device device) {
  check_tensor(t, what, dtype, device);
  LOCKSTEP_CHECK(t.rank() == 2, what, ": expected a 2-D tensor, got ", t.describe());
}

void check_output(const Tensor& t, const char* what, Device device, const Shape& shape) {
  LOCKSTEP_CHECK(t.defined(), what, ": output tensor is empty (not allocated)");
  LOCKSTEP_CHECK(t.dtype() == DType::bf16 || t.dtype() == DType::f32, what,
                 ": output must be bf16 or f32, got ", t.describe());
  LOCKSTEP_CHECK(t.device() == device, what, ": output on ", device_name(t.device()),
                 " but inputs on ", device_name(device));
  check_shape(t, what, shape);
}

// The stored layouts of numerics/quantize.h: the reduction dimension padded to whole groups.
void check_fp8_rows(const Fp8Rows& q, const char* what, Device device) {
  check_matrix(q.data, what, DType::e4m3, device);
  LOCKSTEP_CHECK(q.cols() % kQuantGroup == 0, what, ": FP8 data must be stored padded to a multiple of ",
                 kQuantGroup, " columns (Fp8Rows::empty), got ", q.data.describe());
  check_tensor(q.scales, what, DType::f32, device);
  check_shape(q.scales, what, {q.cols() / kQuantGroup, q.rows()});
}

void check_fp8_blocks(const Fp8Blocks& q, const char* what, Device device) {
  check_matrix(q.data, what, DType::e4m3, device);
  LOCKSTEP_CHECK(q.rows() % kFp8ColsMultiple == 0 && q.cols() % kQuantGroup == 0, what,
                 ": FP8 GEMM needs rows that are a multiple of ", kFp8ColsMultiple,
                 " and columns stored padded to a multiple of ", kQuantGroup, " (Fp8Blocks::empty), got ",
                 q.data.describe());
  check_tensor(q.scales, what, DType::f32, device);
  check_shape(q.scales, what,
              {(q.rows() + kQuantGroup - 1) / kQuantGroup, round_up(q.cols() / kQuantGroup, 4)});
}

void check_weight(const Fp8Weight& w, Device device) {
  check_fp8_blocks(w.w, "fp8 weight w", device);
  check_fp8_blocks(w.wt, "fp8 weight wt", device);
  LOCKSTEP_CHECK(padded_cols(w.wt.rows()) == w.w.cols() && w.wt.cols() == padded_cols(w.w.rows()),
                 "fp8 weight: wt must be the transpose of w, got ", w.w.data.describe(), " and ",
                 w.wt.data.describe());
}

// Operands of the bf16 recipe: both bf16, or both f32 on the CPU (the fp32 recipe of gradient
// checks and comparisons with PyTorch).
void check_operands(const Tensor& a, const char* a_what, const Tensor& b, const char* b_what) {
  LOCKSTEP_CHECK(a.defined(), a_what, ": tensor is empty (not allocated)");
  LOCKSTEP_CHECK(a.dtype() == DType::bf16 || a.dtype() == DType::f32, a_what,
                 ": expected dtype bf16 (or f32 on the CPU), got ", a.describe());
  LOCKSTEP_CHECK(!(a.dtype() == DType::f32 && a.is_cuda()), a_what,
                 ": f32 GEMM operands are CPU-only, got ", a.describe());
  check_matrix(a, a_what, a.dtype(), a.device());
  check_matrix(b, b_what, a.dtype(), a.device());
}

void check_k(int64_t a, int64_t b, const char* op, const Tensor& x, const Tensor& y) {
  LOCKSTEP_CHECK(a == b, op, ": inner dimensions differ: ", x.describe(), " and ", y.describe());
}

// The offsets of a grouped GEMM (ops/gemm.h), E + 1 >= 2 values (the caller has checked their
// count): from 0 to the rows of `a` (named a_what), never decreasing.
void check_offsets(const char* op, const std::vector<int64_t>& offsets, const char* a_what, int64_t rows) {
  LOCKSTEP_CHECK(offsets.front() == 0 && offsets.back() == rows, op, ": offsets must run from 0 to ", a_what,
                 "'s rows (", rows, "), got ", offsets.front(), " .. ", offsets.back());
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    LOCKSTEP_CHECK(offsets[e] <= offsets[e + 1], op, ": offsets decrease at expert ", e, ": ", offsets[e], " then ",
                   offsets[e + 1]);
}

// The bf16 recipe's grouped GEMMs: a [rows, N] (DGrad) or [rows, K] (FProp) sorted by expert, E
// weights [N, K] of one shape in a's dtype on a's device, out [rows, K] or [rows, N] (bf16 on CUDA:
// cuBLAS's grouped GEMM has no other output for bf16 operands).
void check_bf16_grouped(const char* op, const Tensor& out, const Tensor& a, const char* a_what,
                        const std::vector<Tensor>& w, const std::vector<int64_t>& offsets, bool dgrad) {
  LOCKSTEP_CHECK(!w.empty(), op, ": no experts' weights");
  const Tensor& w0 = w.front();
  check_operands(a, detail::concat(op, ": ", a_what).c_str(), w0, detail::concat(op, ": w[0]").c_str());
  for (size_t e = 1; e < w.size(); ++e)
    LOCKSTEP_CHECK(w[e].defined() && w[e].dtype() == a.dtype() && w[e].device() == a.device() &&
                       w[e].shape() == w0.shape(),
                   op, ": every expert's weight must be ", w0.describe(), " as w[0] is, got w[", e, "] ",
                   w[e].defined() ? w[e].describe() : std::string("empty (not allocated)"));
  check_k(a.dim(1), w0.dim(dgrad ? 0 : 1), op, a, w0);
  LOCKSTEP_CHECK(offsets.size() == w.size() + 1, op, ": offsets must hold E + 1 = ", w.size() + 1, " values for the ",
                 w.size(), " experts of w, got ", offsets.size());
  check_offsets(op, offsets, a_what, a.dim(0));
  check_output(out, detail::concat(op, ": output").c_str(), a.device(), {a.dim(0), w0.dim(dgrad ? 1 : 0)});
  LOCKSTEP_CHECK(!out.is_cuda() || out.dtype() == DType::bf16, op,
                 ": on CUDA the output must be bf16 (cuBLAS's grouped GEMM has no f32 output for bf16 operands), got ",
                 out.describe());
}

#if LOCKSTEP_HAS_CUDA
#define LOCKSTEP_ON_CUDA(call) call
#else
#define LOCKSTEP_ON_CUDA(call) \
  fail("this build has no CUDA backend; GEMM on CUDA tensors needs one")
#endif

}  // namespace

void gemm_fprop(Tensor& y, const Tensor& x, const Tensor& w) {
  check_operands(x, "gemm_fprop: x", w, "gemm_fprop: w");
  check_k(x.dim(1), w.dim(1), "gemm_fprop", x, w);
  check_output(y, "gemm_fprop: y", x.device(), {x.dim(0), w.dim(0)});
  if (!x.is_cuda()) return cpu::gemm_tn(y, {x}, {w}, false);
  LOCKSTEP_ON_CUDA(cuda::gemm_fprop_bf16(y, x, w));
}

void gemm_dgrad(Tensor& dx, const Tensor& dy, const Tensor& w, bool accumulate) {
  check_operands(dy, "gemm_dgrad: dy", w, "gemm_dgrad: w");
  check_k(dy.dim(1), w.dim(0), "gemm_dgrad", dy, w);
  check_output(dx, "gemm_dgrad: dx", dy.device(), {dy.dim(0), w.dim(1)});
  if (!dy.is_cuda()) return cpu::gemm_tn(dx, {dy}, {w, true}, accumulate);
  LOCKSTEP_ON_CUDA(cuda::gemm_dgrad_bf16(dx, dy, w, accumulate));
}

void gemm_wgrad(Tensor& dw, const Tensor& dy, const Tensor& x, bool accumulate) {
  check_operands(dy, "gemm_wgrad: dy", x, "gemm_wgrad: x");
  check_k(dy.dim(0), x.dim(0), "gemm_wgrad", dy, x);
  check_matrix(dw, "gemm_wgrad: dw", DType::f32, dy.device());
  check_shape(dw, "gemm_wgrad: dw", {dy.dim(1), x.dim(1)});
  if (!dy.is_cuda()) return cpu::gemm_tn(dw, {dy, true}, {x, true}, accumulate);
  LOCKSTEP_ON_CUDA(cuda::gemm_wgrad_bf16(dw, dy, x, accumulate));
}

void gemm_fprop(Tensor& y, const Fp8Rows& x, const Fp8Weight& w) {
  const Device d = x.data.device();
  check_fp8_rows(x, "gemm_fprop: x", d);
  check_fp8_blocks(w.w, "gemm_fprop: w.w", d);
  check_k(x.cols(), w.w.cols(), "gemm_fprop", x.data, w.w.data);
  check_output(y, "gemm_fprop: y", d, {x.rows(), w.w.rows()});
  if (d == Device::cpu) return cpu::gemm_tn_fp8(y, x, w.w, false);
  LOCKSTEP_ON_CUDA(cuda::gemm_fp8_fprop(y, x, w.w));
}

void gemm_dgrad(Tensor& dx, const Fp8Rows& dy, const Fp8Weight& w) {
  const Device d = dy.data.device();
  check_fp8_rows(dy, "gemm_dgrad: dy", d);
  check_weight(w, d);
  check_k(dy.cols(), w.wt.cols(), "gemm_dgrad", dy.data, w.wt.data);
  check_output(dx, "gemm_dgrad: dx", d, {dy.rows(), w.wt.rows()});
  if (d == Device::cpu) return cpu::gemm_tn_fp8(dx, dy, w.wt, false);
  LOCKSTEP_ON_CUDA(cuda::gemm_fp8(dx, dy, w.wt));
}

void gemm_wgrad(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate) {
  const Device d = dy_t.data.device();
  check_fp8_rows(dy_t, "gemm_wgrad: dy_t", d);
  check_fp8_rows(x_t, "gemm_wgrad: x_t", d);
  check_k(dy_t.cols(), x_t.cols(), "gemm_wgrad (padded token counts)", dy_t.data, x_t.data);
  LOCKSTEP_CHECK(dy_t.cols() % kQuantGroup == 0,
                 "gemm_wgrad: dy_t and x_t must be columnwise copies (tokens padded to a multiple of 128), got ",
                 dy_t.data.describe());
  LOCKSTEP_CHECK(dy_t.rows() % kFp8ColsMultiple == 0 && x_t.rows() % kFp8ColsMultiple == 0,
                 "gemm_wgrad: fp8 N and K must be multiples of ", kFp8ColsMultiple, ", got ",
                 dy_t.data.describe(), " and ", x_t.data.describe());
  check_matrix(dw, "gemm_wgrad: dw", DType::f32, d);
  check_shape(dw, "gemm_wgrad: dw", {dy_t.rows(), x_t.rows()});
  if (d == Device::cpu) return cpu::gemm_tn_fp8(dw, dy_t, x_t, accumulate);
  LOCKSTEP_ON_CUDA(cuda::gemm_wgrad_fp8(dw, dy_t, x_t, accumulate));
}

namespace {

// gemm_fp8_grouped's operands, `experts` of them in w (E + 1 offsets).
void check_fp8_grouped(const Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, int64_t experts) {
  const Device d = x.data.device();
  check_fp8_rows(x, "gemm_fp8_grouped: x", d);
  check_fp8_blocks(w, "gemm_fp8_grouped: w", d);
  check_k(x.cols(), w.cols(), "gemm_fp8_grouped", x.data, w.data);
  LOCKSTEP_CHECK(y.defined() && y.rank() == 2, "gemm_fp8_grouped: y must be a 2-D tensor, got ", y.describe());
  const int64_t n = y.dim(1);
  check_output(y, "gemm_fp8_grouped: y", d, {x.rows(), n});
  LOCKSTEP_CHECK(n > 0 && n % kQuantGroup == 0, "gemm_fp8_grouped: N (y's columns) must be a positive multiple of ",
                 kQuantGroup, " (whole scale blocks per expert), got ", y.describe());
  LOCKSTEP_CHECK(experts >= 1 && w.rows() == experts * n, "gemm_fp8_grouped: w must stack ", experts,
                 " experts (", experts + 1, " offsets) of N = ", n, " rows, got ", w.data.describe());
}

}  // namespace

void gemm_fp8_grouped(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, const std::vector<int64_t>& offsets,
                      const Tensor& device_offsets) {
  const Device d = x.data.device();
  const int64_t experts = int64_t(offsets.size()) - 1;
  check_fp8_grouped(y, x, w, experts);
  check_offsets("gemm_fp8_grouped", offsets, "x", x.rows());
  if (d == Device::cpu) return cpu::gemm_fp8_grouped(y, x, w, offsets);
  check_tensor(device_offsets, "gemm_fp8_grouped: device_offsets", DType::i64, d);
  check_shape(device_offsets, "gemm_fp8_grouped: device_offsets", {experts + 1});
  LOCKSTEP_ON_CUDA(cuda::gemm_fp8_grouped(y, x, w, offsets, device_offsets));
}

void gemm_fp8_grouped(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, int64_t most_rows,
                      const Tensor& device_offsets) {
  const Device d = x.data.device();
  check_tensor(device_offsets, "gemm_fp8_grouped: device_offsets", DType::i64, d);
  LOCKSTEP_CHECK(device_offsets.rank() == 1 && device_offsets.dim(0) >= 2,
                 "gemm_fp8_grouped: device_offsets: expected [E + 1], got ", device_offsets.describe());
  LOCKSTEP_CHECK(most_rows >= 0, "gemm_fp8_grouped: most_rows must be >= 0, got ", most_rows);
  check_fp8_grouped(y, x, w, device_offsets.dim(0) - 1);
  if (d == Device::cpu) {
    const int64_t* o = device_offsets.data_as<int64_t>();
    const std::vector<int64_t> offsets(o, o + device_offsets.dim(0));
    check_offsets("gemm_fp8_grouped", offsets, "x", x.rows());
    for (size_t e = 0; e + 1 < offsets.size(); ++e)
      LOCKSTEP_CHECK(offsets[e + 1] - offsets[e] <= most_rows, "gemm_fp8_grouped: expert ", e, " has ",
                     offsets[e + 1] - offsets[e], " rows, more than most_rows = ", most_rows);
    return cpu::gemm_fp8_grouped(y, x, w, offsets);
  }
  LOCKSTEP_ON_CUDA(cuda::gemm_fp8_grouped(y, x, w, most_rows, device_offsets));
}

void gemm_bf16_grouped_fprop(Tensor& y, const Tensor& x, const std::vector<Tensor>& w,
                             const std::vector<int64_t>& offsets) {
  check_bf16_grouped("gemm_bf16_grouped_fprop", y, x, "x", w, offsets, false);
  if (!x.is_cuda()) return cpu::gemm_bf16_grouped(y, x, w, offsets, false, false);
  LOCKSTEP_ON_CUDA(cuda::gemm_bf16_grouped(y, x, w, offsets, false, false));
}

void gemm_bf16_grouped_dgrad(Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w,
                             const std::vector<int64_t>& offsets, bool accumulate) {
  check_bf16_grouped("gemm_bf16_grouped_dgrad", dx, dy, "dy", w, offsets, true);
  if (!dy.is_cuda()) return cpu::gemm_bf16_grouped(dx, dy, w, offsets, true, accumulate);
  LOCKSTEP_ON_CUDA(cuda::gemm_bf16_grouped(dx, dy, w, offsets, true, accumulate));
}

Fp8Blocks stack_fp8_blocks(const std::vector<Fp8Blocks>& parts) {
  LOCKSTEP_CHECK(!parts.empty(), "stack_fp8_blocks: no blocks to stack");
  const Fp8Blocks& first = parts.front();
  const Device d = first.data.device();
  const int64_t rows = first.rows(), block_rows = rows / kQuantGroup;
  LOCKSTEP_CHECK(rows % kQuantGroup == 0, "stack_fp8_blocks: rows must be a multiple of ", kQuantGroup, ", got ",
                 first.data.describe());
  Fp8Blocks stacked{Tensor::empty({int64_t(parts.size()) * rows, first.cols()}, DType::e4m3, d),
                    Tensor::empty({int64_t(parts.size()) * block_rows, first.scales.dim(1)}, DType::f32, d)};
  for (size_t e = 0; e < parts.size(); ++e) {
    const Fp8Blocks& part = parts[e];
    check_fp8_blocks(part, "stack_fp8_blocks: a part", d);
    check_shape(part.data, "stack_fp8_blocks: a part", first.data.shape());
    const int64_t r = int64_t(e) * rows, b = int64_t(e) * block_rows;
    stacked.data.rows(r, r + rows).copy_from(part.data);
    stacked.scales.rows(b, b + block_rows).copy_from(part.scales);
  }
  return stacked;
}

}  // namespace lockstep
