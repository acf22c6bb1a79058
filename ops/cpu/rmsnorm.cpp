// ops/cpu/rmsnorm.cpp — CPU reference for ops/rmsnorm.h. A row's sums run over its columns in a
// fixed order (8 interleaved fp32 lanes, then a fixed tree), so a row normalizes to the same bits
// whatever else is in the batch; dw adds the rows in increasing order, parallel over columns.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/act.h"
#include "ops/rmsnorm_backends.h"

namespace lockstep::cpu {

namespace {

constexpr int kLanes = 8;
constexpr int64_t kColumnBlock = 64;  // dw: columns per task

// Σ_i a[i]·b[i], element i in lane i % kLanes: written out to vectorize without -ffast-math.
float dot(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {};
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[i + l] * b[i + l];
  for (int l = 0; l < int(n - whole); ++l) lane[l] += a[whole + l] * b[whole + l];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t R = x.dim(0), C = x.dim(1);
  const float* wp = w.data_as<float>();
  float* rs = rstd.data_as<float>();
#pragma omp parallel
  {
    std::vector<float> row(C);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      float* v = row.data();
      read_f32(x, r * C, C, v);
      const float s = 1.0f / std::sqrt(dot(v, v, C) / float(C) + eps);
      for (int64_t c = 0; c < C; ++c) v[c] = v[c] * s * wp[c];
      write_f32(y, r * C, C, v);
      rs[r] = s;
    }
  }
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  const int64_t R = x.dim(0), C = x.dim(1);
  const float* wp = w.data_as<float>();
  const float* rs = rstd.data_as<float>();
  float* dwp = dw.data_as<float>();
  // dw before dx, so that dx may overwrite dy or x in place.
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel
  {
    std::vector<float> xb(kColumnBlock), gb(kColumnBlock), acc(kColumnBlock);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kColumnBlock, n = std::min(kColumnBlock, C - c0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t r = 0; r < R; ++r) {
        read_f32(x, r * C + c0, n, xb.data());
        read_f32(dy, r * C + c0, n, gb.data());
        for (int64_t i = 0; i < n; ++i) acc[i] += gb[i] * (xb[i] * rs[r]);
      }
      for (int64_t i = 0; i < n; ++i) dwp[c0 + i] += acc[i];
    }
  }
#pragma omp parallel
  {
    std::vector<float> xhat(C), g(C);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      float* xh = xhat.data();
      float* gv = g.data();
      read_f32(x, r * C, C, xh);
      read_f32(dy, r * C, C, gv);
      const float s = rs[r];
      for (int64_t c = 0; c < C; ++c) {
        xh[c] = xh[c] * s;
        gv[c] = wp[c] * gv[c];
      }
      const float mean = dot(xh, gv, C) / float(C);
      for (int64_t c = 0; c < C; ++c) gv[c] = s * (gv[c] - xh[c] * mean);
      write_f32(dx, r * C, C, gv);
    }
  }
}

}  // namespace lockstep::cpu
