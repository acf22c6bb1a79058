// ops/cpu/gemm.cpp — reference GEMMs. Operands are widened to fp32 once; each output element is a
// dot product over K in a fixed order (8 interleaved fp32 lanes, then a fixed tree), so it is
// deterministic and independent of how many rows the batch has. The lanes are written out so the
// compiler vectorizes them without -ffast-math.
#include <vector>

#include "ops/gemm_backends.h"

namespace lockstep::cpu {

namespace {

constexpr int kLanes = 8;

// Σ_k a[k]·b[k]: element k goes to lane k % kLanes.
inline float dot(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {};
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t k = 0; k < whole; k += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[k + l] * b[k + l];
  const int tail = int(n - whole);  // < kLanes
  for (int l = 0; l < tail; ++l) lane[l] += a[whole + l] * b[whole + l];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

std::vector<float> widen(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  if (t.dtype() == DType::bf16) {
    const bf16* p = t.data_as<bf16>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(p[i]);
  } else {
    const e4m3* p = t.data_as<e4m3>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = e4m3_to_float(p[i]);
  }
  return v;
}

void store(Tensor& out, int64_t i, float v, bool accumulate) {
  if (out.dtype() == DType::f32) {
    float* o = out.data_as<float>();
    o[i] = accumulate ? o[i] + v : v;
  } else {
    bf16* o = out.data_as<bf16>();
    o[i] = float_to_bf16(accumulate ? bf16_to_float(o[i]) + v : v);
  }
}

// scale(i, kb) of either scaled layout.
struct Scales {
  const float* s;
  int64_t row_stride, block_stride, row_div;
  float at(int64_t row, int64_t kb) const { return s[(row / row_div) * row_stride + kb * block_stride]; }
};

Scales scales_of(const Fp8Rows& q) { return {q.scales.data_as<float>(), 1, q.rows(), 1}; }
Scales scales_of(const Fp8Blocks& q) {
  return {q.scales.data_as<float>(), q.scales.dim(1), 1, kQuantGroup};
}

template <class B>
void gemm_fp8(Tensor& out, const Fp8Rows& a, const B& b, bool accumulate) {
  const int64_t m = a.rows(), n = b.rows(), k = a.cols(), blocks = k / kQuantGroup;
  const std::vector<float> av = widen(a.data), bv = widen(b.data);
  const Scales sa = scales_of(a), sb = scales_of(b);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const int64_t off = kb * kQuantGroup;
        const float partial = dot(&av[size_t(i * k + off)], &bv[size_t(j * k + off)], kQuantGroup);
        acc += partial * (sa.at(i, kb) * sb.at(j, kb));
      }
      store(out, i * n + j, acc, accumulate);
    }
  }
}

}  // namespace

void gemm_tn_bf16(Tensor& out, const Tensor& a, const Tensor& b, bool accumulate) {
  const int64_t m = a.dim(0), n = b.dim(0), k = a.dim(1);
  const std::vector<float> av = widen(a), bv = widen(b);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      store(out, i * n + j, dot(&av[size_t(i * k)], &bv[size_t(j * k)], k), accumulate);
}

void gemm_tn_fp8(Tensor& out, const Fp8Rows& a, const Fp8Rows& b, bool accumulate) {
  gemm_fp8(out, a, b, accumulate);
}

void gemm_tn_fp8(Tensor& out, const Fp8Rows& a, const Fp8Blocks& b, bool accumulate) {
  gemm_fp8(out, a, b, accumulate);
}

Tensor transpose_bf16(const Tensor& x) {
  const int64_t r = x.dim(0), c = x.dim(1);
  Tensor t = Tensor::empty({c, r}, DType::bf16);
  const bf16* src = x.data_as<bf16>();
  bf16* dst = t.data_as<bf16>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
  return t;
}

}  // namespace lockstep::cpu
