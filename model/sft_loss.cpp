// model/sft_loss.cpp
#include "model/sft_loss.h"

#include <cmath>

#include "core/error.h"

namespace lockstep {

SftLoss sft_loss(const Tensor& logprob, const Tensor& mask) {
  check_tensor(logprob, "sft_loss: logprob", DType::f32, logprob.device());
  check_tensor(mask, "sft_loss: mask", DType::f32, logprob.device());
  check_shape(mask, "sft_loss: mask", logprob.shape());
  const Tensor lp = logprob.to(Device::cpu), m = mask.to(Device::cpu);
  const float* l = lp.data_as<float>();
  const float* w = m.data_as<float>();
  SftLoss out;
  double sum = 0;
  for (int64_t t = 0; t < lp.numel(); ++t) {
    LOCKSTEP_CHECK(w[t] >= 0 && std::isfinite(w[t]), "sft_loss: mask[", t, "] = ", w[t],
                   " (must be finite and non-negative)");
    out.tokens += w[t];
    if (w[t] != 0) sum += double(w[t]) * double(l[t]);
  }
  LOCKSTEP_CHECK(out.tokens > 0, "sft_loss: the mask selects no token");
  out.loss = -sum / out.tokens;
  Tensor d = Tensor::empty(lp.shape(), DType::f32);
  for (int64_t t = 0; t < lp.numel(); ++t) d.data_as<float>()[t] = float(-w[t] / out.tokens);
  out.dlogprob = logprob.device() == Device::cpu ? d : d.to(logprob.device());
  return out;
}

}  // namespace lockstep
