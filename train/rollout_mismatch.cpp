// train/rollout_mismatch.cpp
#include "train/rollout_mismatch.h"

#include <cmath>

#include "core/error.h"

namespace lockstep {

RolloutMismatch rollout_mismatch(std::span<const float> train_logprob,
                                 std::span<const float> rollout_logprob,
                                 std::span<const float> mask) {
  const size_t n = train_logprob.size();
  LOCKSTEP_CHECK(rollout_logprob.size() == n && mask.size() == n,
                 "rollout_mismatch: train_logprob, rollout_logprob and mask have ", n, ", ",
                 rollout_logprob.size(), " and ", mask.size(), " values (must be equal)");
  RolloutMismatch out;
  double abs_sum = 0, mult_sum = 0, kl_sum = 0;
  for (size_t t = 0; t < n; ++t) {
    const double m = mask[t];
    LOCKSTEP_CHECK(std::isfinite(m) && m >= 0, "rollout_mismatch: mask[", t, "] = ", mask[t],
                   " (must be finite and non-negative)");
    if (m == 0) continue;
    const double delta = double(train_logprob[t]) - double(rollout_logprob[t]);
    const double abs_delta = std::abs(delta);
    out.tokens += m;
    out.tokens_differ += train_logprob[t] == rollout_logprob[t] ? 0 : 1;
    abs_sum += m * abs_delta;
    // Written so that a NaN difference propagates (std::max would drop it).
    out.max_abs_diff = abs_delta > out.max_abs_diff || std::isnan(abs_delta) ? abs_delta
                                                                             : out.max_abs_diff;
    mult_sum += m * std::exp(abs_delta);
    kl_sum += m * (std::expm1(delta) - delta);
  }
  LOCKSTEP_CHECK(out.tokens > 0, "rollout_mismatch: the mask selects no token");
  out.mean_abs_diff = abs_sum / out.tokens;
  out.mult_prob_error = mult_sum / out.tokens;
  out.kl_k3 = kl_sum / out.tokens;
  return out;
}

MismatchByPosition rollout_mismatch_by_position(std::span<const float> train_logprob,
                                                std::span<const float> rollout_logprob,
                                                std::span<const float> mask,
                                                std::span<const int64_t> response_position,
                                                int64_t bin_tokens) {
  const size_t n = train_logprob.size();
  LOCKSTEP_CHECK(rollout_logprob.size() == n && mask.size() == n && response_position.size() == n,
                 "rollout_mismatch_by_position: train_logprob, rollout_logprob, mask and response_position "
                 "have ", n, ", ", rollout_logprob.size(), ", ", mask.size(), " and ", response_position.size(),
                 " values (must be equal)");
  LOCKSTEP_CHECK(bin_tokens >= 1, "rollout_mismatch_by_position: bin_tokens = ", bin_tokens, " (must be ≥ 1)");
  MismatchByPosition out;
  std::vector<double> abs_sum;
  for (size_t t = 0; t < n; ++t) {
    const double m = mask[t];
    LOCKSTEP_CHECK(std::isfinite(m) && m >= 0, "rollout_mismatch_by_position: mask[", t, "] = ", mask[t],
                   " (must be finite and non-negative)");
    if (m == 0) continue;
    LOCKSTEP_CHECK(response_position[t] >= 0, "rollout_mismatch_by_position: response_position[", t, "] = ",
                   response_position[t], " at a counted token (must be ≥ 0)");
    const size_t bin = size_t(response_position[t] / bin_tokens);
    if (bin >= out.tokens.size()) out.tokens.resize(bin + 1, 0.0), abs_sum.resize(bin + 1, 0.0);
    out.tokens[bin] += m;
    abs_sum[bin] += m * std::abs(double(train_logprob[t]) - double(rollout_logprob[t]));
  }
  for (size_t b = 0; b < abs_sum.size(); ++b)
    out.mean_abs_diff.push_back(out.tokens[b] > 0 ? abs_sum[b] / out.tokens[b] : NAN);
  return out;
}

}  // namespace lockstep
