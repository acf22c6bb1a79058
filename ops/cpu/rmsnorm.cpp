// ops/cpu/rmsnorm.cpp — CPU reference for ops/rmsnorm.h. A row's sums run over its columns in a
// fixed order (8 interleaved fp32 lanes, then a fixed tree), so a row normalizes to the same bits
// whatever else is in the batch; dw adds the rows in increasing order, parallel over columns.
#include <algorithm>
#include <vector>

#include "ops/cpu/act.h"
#include "ops/cpu/rms_row.h"
#include "ops/rmsnorm_backends.h"

namespace lockstep::cpu {

namespace {

constexpr int64_t kColumnBlock = 64;  // dw: columns per task

}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd, Tensor& x, const Tensor* residual, const Tensor& w,
                     float eps) {
  const int64_t R = x.dim(0), C = x.dim(1);
  const float* wp = w.data_as<float>();
  float* rs = rstd.data_as<float>();
#pragma omp parallel
  {
    std::vector<float> row(C), res(residual ? C : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      read_f32(x, r * C, C, row.data());
      if (residual) {  // add_into's operations, then the sum as x holds it (rounded to its dtype)
        read_f32(*residual, r * C, C, res.data());
        for (int64_t i = 0; i < C; ++i) row[i] += res[i];
        write_f32(x, r * C, C, row.data());
        read_f32(x, r * C, C, row.data());
      }
      rs[r] = rms_normalize(row.data(), wp, C, eps);
      write_f32(y, r * C, C, row.data());
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
      read_f32(x, r * C, C, xhat.data());
      read_f32(dy, r * C, C, g.data());
      rms_normalize_backward(xhat.data(), g.data(), wp, C, rs[r], nullptr);
      write_f32(dx, r * C, C, g.data());
    }
  }
}

}  // namespace lockstep::cpu
