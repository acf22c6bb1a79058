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

// x (rows × cols, row-major) -> 1×128 groups along cols, scales at g * rows + r.
void rows_from(const float* x, int64_t rows, int64_t cols, Fp8Rows& out, bool pow2) {
  uint8_t* q = static_cast<uint8_t*>(out.data.data());
  float* scales = out.scales.data_as<float>();
  const int64_t groups = cols / kQuantGroup;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + r * cols + g * kQuantGroup;
      uint32_t amax = 0;
      for (int i = 0; i < kQuantGroup; ++i) amax = std::max(amax, abs_bits(xg[i]));
      const float s = group_scale(amax, pow2);
      scales[g * rows + r] = s;
      const float inv = inverse_scale(s);
      for (int i = 0; i < kQuantGroup; ++i) q[r * cols + g * kQuantGroup + i] = quantize_value(xg[i], inv);
    }
  }
}

// x widened to fp32 (transposed and zero-padded to `padded_rows` when `transpose`).
std::vector<float> to_float(const Tensor& x, bool transpose = false, int64_t padded_rows = 0) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  std::vector<float> v(size_t(transpose ? cols * padded_rows : rows * cols), 0.0f);
  auto widen = [&](auto* p) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const float f = to_f32(p[i * cols + j]);
        v[size_t(transpose ? j * padded_rows + i : i * cols + j)] = f;
      }
  };
  if (x.dtype() == DType::bf16) widen(x.data_as<bf16>());
  else widen(x.data_as<float>());
  return v;
}

}  // namespace

void quantize_rows(Fp8Rows& out, const Tensor& x, bool pow2) {
  const std::vector<float> v = to_float(x);
  rows_from(v.data(), x.dim(0), x.dim(1), out, pow2);
}

// By definition: the rowwise quantization of xᵀ, zero-padded to whole groups of tokens.
void quantize_columns(Fp8Rows& out_t, const Tensor& x, bool pow2) {
  const std::vector<float> xt = to_float(x, /*transpose=*/true, out_t.cols());
  rows_from(xt.data(), x.dim(1), out_t.cols(), out_t, pow2);
}

void quantize_weight(Fp8Weight& out, const Tensor& w, bool pow2) {
  const int64_t n = w.dim(0), k = w.dim(1);
  const int64_t nb = n / kQuantGroup, kb = k / kQuantGroup;
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
      uint32_t amax = 0;
      for (int64_t i = bi * kQuantGroup; i < (bi + 1) * kQuantGroup; ++i)
        for (int64_t j = bj * kQuantGroup; j < (bj + 1) * kQuantGroup; ++j)
          amax = std::max(amax, abs_bits(v[size_t(i * k + j)]));
      const float scale = group_scale(amax, pow2);
      s[bi * ld + bj] = scale;
      st[bj * ld_t + bi] = scale;
      const float inv = inverse_scale(scale);
      for (int64_t i = bi * kQuantGroup; i < (bi + 1) * kQuantGroup; ++i)
        for (int64_t j = bj * kQuantGroup; j < (bj + 1) * kQuantGroup; ++j)
          qt[j * n + i] = q[i * k + j] = quantize_value(v[size_t(i * k + j)], inv);
    }
  }
}

void dequantize_rows(Tensor& out, const Fp8Rows& q) {
  const int64_t rows = q.rows(), cols = q.cols();
  const e4m3* d = q.data.data_as<e4m3>();
  const float* s = q.scales.data_as<float>();
  auto value = [&](int64_t r, int64_t c) {
    return e4m3_to_float(d[r * cols + c]) * s[(c / kQuantGroup) * rows + r];
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
  const int64_t rows = q.rows(), cols = q.cols(), ld = q.scales.dim(1);
  const e4m3* d = q.data.data_as<e4m3>();
  const float* s = q.scales.data_as<float>();
  float* o = out.data_as<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      o[r * cols + c] = e4m3_to_float(d[r * cols + c]) * s[(r / kQuantGroup) * ld + c / kQuantGroup];
}

int64_t first_nonfinite(const Tensor& scales) {
  const float* s = scales.data_as<float>();
  for (int64_t i = 0; i < scales.numel(); ++i)
    if (!std::isfinite(s[i])) return i;
  return -1;
}

}  // namespace lockstep::cpu
