// ops/cpu/rms_row.h — RMSNorm of one fp32 row, forward and backward (ops/rmsnorm.h's math), shared
// by the RMSNorm op and Qwen3's per-head q/k norm (ops/qkv_rope.h). The sums run in a fixed order
// (element i in lane i % 8, lanes combined by a fixed tree), so a row gives the same bits whatever
// else is in the batch.
#pragma once

#include <cmath>
#include <cstdint>

namespace lockstep::cpu {

// Σ_i a[i]·b[i]: written out in lanes so it vectorizes without -ffast-math.
inline float lane_dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 8;
  float lane[kLanes] = {};
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[i + l] * b[i + l];
  for (int l = 0; l < int(n - whole); ++l) lane[l] += a[whole + l] * b[whole + l];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// x ← x · rstd · w; returns rstd = 1 / sqrt(mean(x²) + eps).
inline float rms_normalize(float* x, const float* w, int64_t n, float eps) {
  const float rstd = 1.0f / std::sqrt(lane_dot(x, x, n) / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * rstd * w[i];
  return rstd;
}

// From the row's input x and output gradient g (both overwritten): x becomes x̂ = x·rstd, g becomes
// dx = rstd·(w·g − x̂·mean(x̂·w·g)). When dw is given, dw[i] += g[i]·x̂[i] (this row's share).
inline void rms_normalize_backward(float* x, float* g, const float* w, int64_t n, float rstd,
                                   float* dw) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] = x[i] * rstd;
    if (dw) dw[i] += g[i] * x[i];
    g[i] = w[i] * g[i];
  }
  const float mean = lane_dot(x, g, n) / float(n);
  for (int64_t i = 0; i < n; ++i) g[i] = rstd * (g[i] - x[i] * mean);
}

}  // namespace lockstep::cpu
