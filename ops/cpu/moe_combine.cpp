// ops/cpu/moe_combine.cpp — CPU reference for ops/moe_combine.h: one token at a time.
#include <vector>

#include "ops/cpu/act.h"
#include "ops/moe_combine_backends.h"

namespace lockstep::cpu {

void moe_combine_forward(Tensor& out, const Tensor& rows, const Tensor& slots, const Tensor& weights) {
  const int64_t T = slots.dim(0), k = slots.dim(1), H = rows.dim(1);
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<size_t>(H)), row(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = slots.data_as<int32_t>()[t * k + j];
        const float w = weights.defined() ? weights.data_as<float>()[t * k + j] : 1.0f;
        read_f32(rows, r * H, H, row.data());
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += w * row[size_t(h)];
      }
      write_f32(out, t * H, H, acc.data());
    }
  }
}

void moe_combine_backward(Tensor& drows, Tensor& dweights, const Tensor& dout, const Tensor& rows,
                          const Tensor& slots, const Tensor& weights) {
  const int64_t T = slots.dim(0), k = slots.dim(1), H = rows.dim(1);
#pragma omp parallel
  {
    std::vector<float> d(static_cast<size_t>(H)), row(static_cast<size_t>(H)), scaled(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      read_f32(dout, t * H, H, d.data());
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = slots.data_as<int32_t>()[t * k + j];
        const float w = weights.defined() ? weights.data_as<float>()[t * k + j] : 1.0f;
        for (int64_t h = 0; h < H; ++h) scaled[size_t(h)] = w * d[size_t(h)];
        write_f32(drows, r * H, H, scaled.data());
        if (!weights.defined()) continue;
        read_f32(rows, r * H, H, row.data());
        float dot = 0;
        for (int64_t h = 0; h < H; ++h) dot += d[size_t(h)] * row[size_t(h)];
        dweights.data_as<float>()[t * k + j] = dot;
      }
    }
  }
}

}  // namespace lockstep::cpu
