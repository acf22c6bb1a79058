// numerics/quantize.cpp — argument checks and backend dispatch for numerics/quantize.h.
#include "numerics/quantize.h"

#include <string>

#include "core/error.h"
#include "numerics/quantize_backends.h"

namespace lockstep {

namespace {

#if !LOCKSTEP_HAS_CUDA
[[noreturn]] void no_cuda_backend() {
  fail("this build has no CUDA backend; quantizing a CUDA tensor needs a CUDA build");
}
#endif

void check_input(const Tensor& x, const char* what) {
  LOCKSTEP_CHECK(x.defined() && x.rank() == 2, what, ": expected a 2-D tensor, got ",
                 x.defined() ? x.describe() : "an empty tensor");
  LOCKSTEP_CHECK(x.dtype() == DType::bf16 || x.dtype() == DType::f32, what,
                 ": expected bf16 or f32, got ", x.describe());
  LOCKSTEP_CHECK(x.dim(1) % kFp8ColsMultiple == 0, what, ": the contiguous dimension (", x.dim(1),
                 ") must be a multiple of ", kFp8ColsMultiple, " for FP8 groups, got ", x.describe());
}

int64_t block_rows(int64_t rows) { return (rows + kQuantGroup - 1) / kQuantGroup; }

void check_blocks(const Fp8Blocks& q, const char* what, int64_t rows, int64_t cols, Device device) {
  check_tensor(q.data, what, DType::e4m3, device);
  check_shape(q.data, what, {rows, padded_cols(cols)});
  check_tensor(q.scales, what, DType::f32, device);
  check_shape(q.scales, what, {block_rows(rows), round_up(padded_cols(cols) / kQuantGroup, 4)});
}

// The unpadded width of a dequantize output: padded_cols of it must be q's stored width.
void check_dequantize_shape(const Tensor& out, const Tensor& q) {
  LOCKSTEP_CHECK(out.rank() == 2 && out.dim(0) == q.dim(0) && padded_cols(out.dim(1)) == q.dim(1),
                 "dequantize: out: expected [", q.dim(0), ", cols] with cols padded to ", q.dim(1),
                 " (the stored width), got ", out.describe());
}

[[maybe_unused]] void check_cuda_bf16(const Tensor& x) {
  LOCKSTEP_CHECK(x.dtype() == DType::bf16,
                 "quantize: the CUDA activation quantizers take bf16 input, got ", x.describe());
}

}  // namespace

void check_fp8_rows(const Fp8Rows& q, const char* what, int64_t rows, int64_t cols, Device device) {
  check_tensor(q.data, what, DType::e4m3, device);
  check_shape(q.data, what, {rows, padded_cols(cols)});
  check_tensor(q.scales, what, DType::f32, device);
  check_shape(q.scales, what, {padded_cols(cols) / kQuantGroup, rows});
}

Fp8Rows Fp8Rows::empty(int64_t rows, int64_t cols, Device device) {
  LOCKSTEP_CHECK(cols % kFp8ColsMultiple == 0, "Fp8Rows: cols (", cols, ") must be a multiple of ",
                 kFp8ColsMultiple);
  return {Tensor::empty({rows, padded_cols(cols)}, DType::e4m3, device),
          Tensor::empty({padded_cols(cols) / kQuantGroup, rows}, DType::f32, device)};
}

Fp8Rows Fp8Rows::empty_columnwise(int64_t rows, int64_t cols, Device device) {
  return empty(cols, round_up(rows, kQuantGroup), device);
}

Fp8Blocks Fp8Blocks::empty(int64_t rows, int64_t cols, Device device) {
  LOCKSTEP_CHECK(rows % kFp8ColsMultiple == 0 && cols % kFp8ColsMultiple == 0, "Fp8Blocks: shape [",
                 rows, ", ", cols, "] must be multiples of ", kFp8ColsMultiple, " in both dimensions");
  const int64_t cp = padded_cols(cols);
  return {Tensor::empty({rows, cp}, DType::e4m3, device),
          Tensor::empty({block_rows(rows), round_up(cp / kQuantGroup, 4)}, DType::f32, device)};
}

Fp8Weight Fp8Weight::empty(int64_t n, int64_t k, Device device) {
  return {Fp8Blocks::empty(n, k, device), Fp8Blocks::empty(k, n, device)};
}

void quantize_rows(Fp8Rows& out, const Tensor& x, ScaleFormat format) {
  check_input(x, "quantize_rows: x");
  check_fp8_rows(out, "quantize_rows: out", x.dim(0), x.dim(1), x.device());
  const bool pow2 = format == ScaleFormat::pow2;
  if (!x.is_cuda()) return cpu::quantize_rows(out, x, pow2);
#if LOCKSTEP_HAS_CUDA
  check_cuda_bf16(x);
  cuda::quantize_rows_and_columns(&out, nullptr, x, pow2);
#else
  no_cuda_backend();
#endif
}

void quantize_columns(Fp8Rows& out_t, const Tensor& x, ScaleFormat format) {
  check_input(x, "quantize_columns: x");
  check_fp8_rows(out_t, "quantize_columns: out_t", x.dim(1), x.dim(0), x.device());
  const bool pow2 = format == ScaleFormat::pow2;
  if (!x.is_cuda()) return cpu::quantize_columns(out_t, x, pow2);
#if LOCKSTEP_HAS_CUDA
  check_cuda_bf16(x);
  cuda::quantize_rows_and_columns(nullptr, &out_t, x, pow2);
#else
  no_cuda_backend();
#endif
}

void quantize_rows_and_columns(Fp8Rows& out, Fp8Rows& out_t, const Tensor& x, ScaleFormat format) {
  check_input(x, "quantize_rows_and_columns: x");
  check_fp8_rows(out, "quantize_rows_and_columns: out", x.dim(0), x.dim(1), x.device());
  check_fp8_rows(out_t, "quantize_rows_and_columns: out_t", x.dim(1), x.dim(0), x.device());
  const bool pow2 = format == ScaleFormat::pow2;
  if (!x.is_cuda()) {
    cpu::quantize_rows(out, x, pow2);
    cpu::quantize_columns(out_t, x, pow2);
    return;
  }
#if LOCKSTEP_HAS_CUDA
  check_cuda_bf16(x);
  cuda::quantize_rows_and_columns(&out, &out_t, x, pow2);
#else
  no_cuda_backend();
#endif
}

void quantize_weight(Fp8Weight& out, const Tensor& w, ScaleFormat format) {
  check_input(w, "quantize_weight: w");
  const int64_t n = w.dim(0), k = w.dim(1);
  LOCKSTEP_CHECK(n % kFp8ColsMultiple == 0, "quantize_weight: w has ", n, " rows; FP8 blocks need a multiple of ",
                 kFp8ColsMultiple, ", got ", w.describe());
  check_fp8_weight(out, "quantize_weight: out", n, k, w.device());
  const bool pow2 = format == ScaleFormat::pow2;
  if (!w.is_cuda()) return cpu::quantize_weight(out, w, pow2);
#if LOCKSTEP_HAS_CUDA
  cuda::quantize_weight(out, w, pow2);
#else
  no_cuda_backend();
#endif
}

void transpose_weight_blocks(Fp8Weight& w) {
  LOCKSTEP_CHECK(w.w.data.defined() && w.wt.data.defined(),
                 "transpose_weight_blocks: w needs both its W and Wᵀ blocks allocated");
  check_fp8_weight(w, "transpose_weight_blocks: w", w.w.rows(), w.wt.rows(), w.w.data.device());
  if (!w.w.data.is_cuda()) return cpu::transpose_weight_blocks(w);
#if LOCKSTEP_HAS_CUDA
  cuda::transpose_weight_blocks(w);
#else
  no_cuda_backend();
#endif
}

void check_fp8_weight(const Fp8Weight& out, const char* what, int64_t n, int64_t k, Device device) {
  check_blocks(out.w, (std::string(what) + ".w").c_str(), n, k, device);
  check_blocks(out.wt, (std::string(what) + ".wt").c_str(), k, n, device);
}

void dequantize(Tensor& out, const Fp8Rows& q) {
  check_fp8_rows(q, "dequantize: q", q.rows(), q.cols(), q.data.device());
  LOCKSTEP_CHECK(out.defined() && (out.dtype() == DType::f32 || out.dtype() == DType::bf16),
                 "dequantize: out: expected f32 or bf16, got ",
                 out.defined() ? out.describe() : "an empty tensor");
  check_tensor(out, "dequantize: out", out.dtype(), q.data.device());
  check_dequantize_shape(out, q.data);
  if (!out.is_cuda()) return cpu::dequantize_rows(out, q);
#if LOCKSTEP_HAS_CUDA
  cuda::dequantize_rows(out, q);
#else
  no_cuda_backend();
#endif
}

void dequantize(Tensor& out, const Fp8Blocks& q) {
  check_blocks(q, "dequantize: q", q.rows(), q.cols(), q.data.device());
  check_tensor(out, "dequantize: out", DType::f32, q.data.device());
  check_dequantize_shape(out, q.data);
  if (!out.is_cuda()) return cpu::dequantize_blocks(out, q);
#if LOCKSTEP_HAS_CUDA
  cuda::dequantize_blocks(out, q);
#else
  no_cuda_backend();
#endif
}

int64_t first_nonfinite(const Tensor& scales) {
  LOCKSTEP_CHECK(scales.defined() && scales.dtype() == DType::f32,
                 "first_nonfinite: expected f32 scales, got ",
                 scales.defined() ? scales.describe() : "an empty tensor");
  if (!scales.is_cuda()) return cpu::first_nonfinite(scales);
#if LOCKSTEP_HAS_CUDA
  return cuda::first_nonfinite(scales);
#else
  no_cuda_backend();
#endif
}

}  // namespace lockstep
