// ops/cpu/adamw.cpp — CPU reference for ops/adamw.h.
#include <cmath>

#include "ops/adamw_backends.h"

namespace lockstep::cpu {

void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWHyper& hyper,
                int64_t step, float grad_scale) {
  // The bias corrections are per-step scalars: computed in double, used in fp32.
  const float c1 = float(1.0 - std::pow(double(hyper.beta1), double(step)));
  const float c2 = float(1.0 - std::pow(double(hyper.beta2), double(step)));
  const float b1 = hyper.beta1, b2 = hyper.beta2, a1 = 1.0f - b1, a2 = 1.0f - b2;
  const float lr = hyper.lr, eps = hyper.eps, wd = hyper.weight_decay;
  float* p = param.data_as<float>();
  float* mp = m.data_as<float>();
  float* vp = v.data_as<float>();
  const float* gp = grad.data_as<float>();
  const int64_t n = param.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gp[i] * grad_scale;
    const float mi = b1 * mp[i] + a1 * g;
    const float vi = b2 * vp[i] + a2 * (g * g);
    mp[i] = mi;
    vp[i] = vi;
    p[i] -= lr * ((mi / c1) / (std::sqrt(vi / c2) + eps) + wd * p[i]);
  }
}

}  // namespace lockstep::cpu
