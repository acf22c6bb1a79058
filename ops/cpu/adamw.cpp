// ops/cpu/adamw.cpp — CPU reference for ops/adamw.h (the copies are made by the dispatcher, with
// the convert and quantize_weight ops).
#include "ops/adamw_backends.h"

namespace lockstep::cpu {

void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWScalars& s) {
  float* p = param.data_as<float>();
  float* mp = m.data_as<float>();
  float* vp = v.data_as<float>();
  const float* gp = grad.data_as<float>();
  const int64_t n = param.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], mp[i], vp[i], gp[i], s);
}

}  // namespace lockstep::cpu
