// ops/cpu/moe_route.cpp — CPU reference for ops/moe_route.h: one token at a time, sums in index
// order, the scalar std::exp (ops/cpu/swiglu.cpp says why).
#include <cmath>
#include <vector>

#include "ops/cpu/act.h"
#include "ops/moe_route_backends.h"

namespace lockstep::cpu {

void moe_route_forward(Tensor& probs, Tensor& expert_ids, Tensor& weights, const Tensor& logits,
                       bool normalize, Tensor* lse) {
  const int64_t T = logits.dim(0), E = logits.dim(1), k = expert_ids.dim(1);
#pragma omp parallel
  {
    std::vector<bool> taken(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float* p = probs.data_as<float>() + t * E;
      read_f32(logits, t * E, E, p);
      float m = p[0];
      for (int64_t e = 1; e < E; ++e) m = std::fmax(m, p[e]);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - m);
      for (int64_t e = 0; e < E; ++e) p[e] /= sum;
      if (lse) lse->data_as<float>()[t] = m + std::log(sum);

      // k passes of "the largest not yet taken": strict > keeps the lowest index among equals, and
      // a NaN is never larger, so it is taken only when nothing else is left.
      int32_t* ids = expert_ids.data_as<int32_t>() + t * k;
      float* w = weights.data_as<float>() + t * k;
      std::fill(taken.begin(), taken.end(), false);
      float picked = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e)
          if (!taken[size_t(e)] && (best < 0 || p[e] > p[best] || (std::isnan(p[best]) && !std::isnan(p[e]))))
            best = e;
        taken[size_t(best)] = true;
        ids[j] = int32_t(best);
        w[j] = p[best];
        picked += p[best];
      }
      if (normalize)
        for (int64_t j = 0; j < k; ++j) w[j] /= picked;
    }
  }
}

void moe_route_weights(Tensor& weights, const Tensor& probs, const Tensor& expert_ids, bool normalize) {
  const int64_t T = probs.dim(0), E = probs.dim(1), k = expert_ids.dim(1);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* p = probs.data_as<float>() + t * E;
    const int32_t* ids = expert_ids.data_as<int32_t>() + t * k;
    float* w = weights.data_as<float>() + t * k;
    float picked = 0;  // as moe_route_forward sums them: in j order
    for (int64_t j = 0; j < k; ++j) {
      w[j] = p[ids[j]];
      picked += p[ids[j]];
    }
    if (normalize)
      for (int64_t j = 0; j < k; ++j) w[j] /= picked;
  }
}

void moe_route_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& dprobs,
                        const Tensor& probs, const Tensor& expert_ids, const Tensor& weights,
                        bool normalize, const Tensor& lse, float z_scale) {
  const int64_t T = probs.dim(0), E = probs.dim(1), k = expert_ids.dim(1);
#pragma omp parallel
  {
    std::vector<float> dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* p = probs.data_as<float>() + t * E;
      const int32_t* ids = expert_ids.data_as<int32_t>() + t * k;
      const float* w = weights.data_as<float>() + t * k;
      const float* dw = dweights.data_as<float>() + t * k;
      for (int64_t e = 0; e < E; ++e)
        dp[size_t(e)] = dprobs.defined() ? dprobs.data_as<float>()[t * E + e] : 0.0f;
      if (normalize) {
        // w_j = p_j / s: dp_j += (dw_j − Σ_i dw_i·w_i) / s.
        float s = 0, dot = 0;
        for (int64_t j = 0; j < k; ++j) s += p[ids[j]];
        for (int64_t j = 0; j < k; ++j) dot += dw[j] * w[j];
        for (int64_t j = 0; j < k; ++j) dp[size_t(ids[j])] += (dw[j] - dot) / s;
      } else {
        for (int64_t j = 0; j < k; ++j) dp[size_t(ids[j])] += dw[j];
      }
      float dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[size_t(e)];
      for (int64_t e = 0; e < E; ++e) dp[size_t(e)] = p[e] * (dp[size_t(e)] - dot);
      if (lse.defined()) {
        const float z = z_scale * lse.data_as<float>()[t];
        for (int64_t e = 0; e < E; ++e) dp[size_t(e)] += z * p[e];
      }
      write_f32(dlogits, t * E, E, dp.data());
    }
  }
}

}  // namespace lockstep::cpu
