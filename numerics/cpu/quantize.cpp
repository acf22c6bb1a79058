// numerics/cpu/quantize.cpp — the reference quantizers: plain loops, one group at a time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "numerics/quantize_backends.h"
#include "numerics/scale.h"

namespace lockstep::cpu {

namespace {

inline float to_f32(bf16 b) { return bf16_to_float(b); }
inline float to_f32(float f) { return f; }

// x (rows × cols, row-major, row stride ld) -> 1×128 groups along cols, scales at g * rows + r. A
// last partial group is quantized as if zero-extended to 128 values (numerics/quantize.h): its
// scale is its valid columns', and out's padding columns (cols .. out.cols()) hold quantized zeros.
void rows_from(const float* x, int64_t rows, int64_t cols, int64_t ld, Fp8Rows& out, bool pow2) {
  uint8_t* q = static_cast<uint8_t*>(out.data.data());
  float* scales = out.scales.data_as<float>();
  const int64_t stored = out.cols(), groups = stored / kQuantGroup;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + r * ld + g * kQuantGroup;
      const int64_t n = std::min<int64_t>(kQuantGroup, cols - g * kQuantGroup);
      uint32_t amax = 0;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, abs_bits(xg[i]));
      const float s = group_scale(amax, pow2);
      scales[g * rows + r] = s;
      const float inv = inverse_scale(s);
      uint8_t* qg = q + r * stored + g * kQuantGroup;
      for (int64_t i = 0; i < kQuantGroup; ++i) qg[i] = quantize_value(i < n ? xg[i] : 0.0f, inv);
    }
  }
}

// x widened to fp32 (transposed when `transpose`).
std::vector<float> to_float(const Tensor& x, bool transpose = false) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  std::vector<float> v(size_t(rows * cols));
  auto widen = [&](auto* p) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float f = to_f32(p[i * cols + j]);
        v[size_t(transpose ? j * rows + i : i * cols + j)] = f;
      }
  };
  if (x.dtype() == DType::bf16) widen(x.data_as<bf16>());
  else widen(x.data_as<float>());
  return v;
}

}  // namespace

void quantize_rows(Fp8Rows& out, const Tensor& x, bool pow2) {
  const std::vector<float> v = to_float(x);
  rows_from(v.data(), x.dim(0), x.dim(1), x.dim(1), out, pow2);
}

// By definition: the rowwise quantization of xᵀ (its rows padded to whole groups of tokens).
void quantize_columns(Fp8Rows& out_t, const Tensor& x, bool pow2) {
  const std::vector<float> xt = to_float(x, /*transpose=*/true);
  rows_from(xt.data(), x.dim(1), x.dim(0), x.dim(0), out_t, pow2);
}

// Block (bi, bj) is its 128×128 square of w zero-extended: its scale is its valid elements', and
// the padding columns of both stored copies (out.w past K, out.wt past N) hold quantized zeros.
void quantize_weight(Fp8Weight& out, const Tensor& w, bool pow2) {
  const int64_t n = w.dim(0), k = w.dim(1), kp = out.w.cols(), np = out.wt.cols();
  const int64_t nb = (n + kQuantGroup - 1) / kQuantGroup, kb = (k + kQuantGroup - 1) / kQuantGroup;
  const int64_t ld = out.w.scales.dim(1), ld_t = out.wt.scales.dim(1);
  const std::vector<float> v = to_float(w);
  uint8_t* q = static_cast<uint8_t*>(out.w.data.data());
  uint8_t* qt = static_cast<uint8_t*>(out.wt.data.data());
  float* s = out.w.scales.data_as<float>();
  float* st = out.wt.scales.data_as<float>();
  out.w.scales.fill_bytes(0);
  out.wt.scales.fill_bytes(0);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t bj = 0; bj < kb; ++bj) {
      const int64_t i1 = std::min(n, (bi + 1) * kQuantGroup), j1 = std::min(k, (bj + 1) * kQuantGroup);
      uint32_t amax = 0;
      for (int64_t i = bi * kQuantGroup; i < i1; ++i)
        for (int64_t j = bj * kQuantGroup; j < j1; ++j) amax = std::max(amax, abs_bits(v[size_t(i * k + j)]));
      const float scale = group_scale(amax, pow2);
      s[bi * ld + bj] = scale;
      st[bj * ld_t + bi] = scale;
      const float inv = inverse_scale(scale);
      for (int64_t i = bi * kQuantGroup; i < (bi + 1) * kQuantGroup; ++i)
        for (int64_t j = bj * kQuantGroup; j < (bj + 1) * kQuantGroup; ++j) {
          const uint8_t b = quantize_value(i < n && j < k ? v[size_t(i * k + j)] : 0.0f, inv);
          if (i < n) q[i * kp + j] = b;
          if (j < k) qt[j * np + i] = b;
        }
    }
  }
}

void transpose_weight_blocks(Fp8Weight& w) {
  const int64_t n = w.w.rows(), k = w.wt.rows(), kp = w.w.cols(), np = w.wt.cols();
  const int64_t nb = (n + kQuantGroup - 1) / kQuantGroup, kb = (k + kQuantGroup - 1) / kQuantGroup;
  const int64_t ld = w.w.scales.dim(1), ld_t = w.wt.scales.dim(1);
  const uint8_t* q = static_cast<const uint8_t*>(w.w.data.data());
  uint8_t* qt = static_cast<uint8_t*>(w.wt.data.data());
  const float* s = w.w.scales.data_as<float>();
  float* st = w.wt.scales.data_as<float>();
  w.wt.scales.fill_bytes(0);
  for (int64_t bi = 0; bi < nb; ++bi)
    for (int64_t bj = 0; bj < kb; ++bj) st[bj * ld_t + bi] = s[bi * ld + bj];
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < k; ++j)
    for (int64_t i = 0; i < np; ++i)
      qt[j * np + i] = i < n ? q[i * kp + j]
                             : quantize_value(0.0f, inverse_scale(s[(i / kQuantGroup) * ld + j / kQuantGroup]));
}

// out [rows, cols]: cols the stored width or the unpadded one (the padding is not read).
void dequantize_rows(Tensor& out, const Fp8Rows& q) {
  const int64_t rows = q.rows(), stored = q.cols(), cols = out.dim(1);
  const e4m3* d = q.data.data_as<e4m3>();
  const float* s = q.scales.data_as<float>();
  auto value = [&](int64_t r, int64_t c) {
    return e4m3_to_float(d[r * stored + c]) * s[(c / kQuantGroup) * rows + r];
  };
  if (out.dtype() == DType::bf16) {
    bf16* o = out.data_as<bf16>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = float_to_bf16(value(r, c));
    return;
  }
  float* o = out.data_as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = value(r, c);
}

void dequantize_blocks(Tensor& out, const Fp8Blocks& q) {
  const int64_t rows = q.rows(), stored = q.cols(), cols = out.dim(1), ld = q.scales.dim(1);
  const e4m3* d = q.data.data_as<e4m3>();
  const float* s = q.scales.data_as<float>();
  float* o = out.data_as<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      o[r * cols + c] = e4m3_to_float(d[r * stored + c]) * s[(r / kQuantGroup) * ld + c / kQuantGroup];
}

int64_t first_nonfinite(const Tensor& scales) {
  const float* s = scales.data_as<float>();
  for (int64_t i = 0; i < scales.numel(); ++i)
    if (!std::isfinite(s[i])) return i;
  return -1;
}

}  // namespace lockstep::cpu
