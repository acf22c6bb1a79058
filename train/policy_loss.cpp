// train/policy_loss.cpp
#include "train/policy_loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace lockstep {

namespace {

void check_size(std::span<const float> values, const char* what, size_t expected) {
  LOCKSTEP_CHECK(values.size() == expected, "policy_loss: ", what, " has ", values.size(),
                 " values, expected ", expected);
}

void check_finite_non_negative(float value, const char* what) {
  LOCKSTEP_CHECK(std::isfinite(value) && value >= 0, "policy_loss: config.", what, " = ", value,
                 " (must be finite and non-negative)");
}

void check_config(const PolicyLossConfig& c, const PolicyLossInputs& in) {
  LOCKSTEP_CHECK(c.clip_low >= 0 && c.clip_low < 1, "policy_loss: config.clip_low = ", c.clip_low,
                 " (must be in [0, 1))");
  check_finite_non_negative(c.clip_high, "clip_high");
  LOCKSTEP_CHECK(c.clip_ratio_c == 0 || (std::isfinite(c.clip_ratio_c) && c.clip_ratio_c > 1),
                 "policy_loss: config.clip_ratio_c = ", c.clip_ratio_c,
                 " (dual-clip bound: must be 0 (off) or > 1)");
  LOCKSTEP_CHECK(c.aggregation != LossAggregation::token_sum_norm ||
                     (std::isfinite(c.max_response_tokens) && c.max_response_tokens > 0),
                 "policy_loss: config.aggregation token_sum_norm needs max_response_tokens > 0, got ",
                 c.max_response_tokens);
  check_finite_non_negative(c.kl_coef, "kl_coef");
  check_finite_non_negative(c.tis_cap, "tis_cap");
  LOCKSTEP_CHECK(std::isfinite(c.normalizer) && c.normalizer >= 0,
                 "policy_loss: config.normalizer = ", c.normalizer,
                 " (must be finite and non-negative)");
  LOCKSTEP_CHECK(c.kl_coef == 0 || !in.ref_logprob.empty(),
                 "policy_loss: config.kl_coef > 0 needs ref_logprob");
  LOCKSTEP_CHECK(c.tis_cap == 0 || !in.rollout_logprob.empty(),
                 "policy_loss: config.tis_cap > 0 (truncated importance sampling) needs "
                 "rollout_logprob");
  LOCKSTEP_CHECK(!c.adaptive_clip || c.tis_cap > 0,
                 "policy_loss: config.adaptive_clip (QuRL's ACR) needs config.tis_cap > 0");
}

void check_inputs(const PolicyLossInputs& in) {
  const size_t t = in.logprob.size();
  check_size(in.old_logprob, "old_logprob", t);
  check_size(in.mask, "mask", t);
  if (!in.rollout_logprob.empty()) check_size(in.rollout_logprob, "rollout_logprob", t);
  if (!in.ref_logprob.empty()) check_size(in.ref_logprob, "ref_logprob", t);
  if (!in.entropy.empty()) check_size(in.entropy, "entropy", t);
  const std::span<const int32_t> cu = in.cu_seqlens;
  LOCKSTEP_CHECK(cu.size() >= 2, "policy_loss: cu_seqlens has ", cu.size(),
                 " entries, expected S + 1 ≥ 2");
  LOCKSTEP_CHECK(cu[0] == 0, "policy_loss: cu_seqlens[0] = ", cu[0], ", expected 0");
  for (size_t s = 1; s < cu.size(); ++s)
    LOCKSTEP_CHECK(cu[s] >= cu[s - 1], "policy_loss: cu_seqlens[", s, "] = ", cu[s],
                   " is less than cu_seqlens[", s - 1, "] = ", cu[s - 1]);
  LOCKSTEP_CHECK(size_t(cu.back()) == t, "policy_loss: cu_seqlens ends at ", cu.back(),
                 ", expected T = ", t, " (the logprob count)");
  check_size(in.advantage, "advantage", cu.size() - 1);
  for (size_t s = 0; s < in.advantage.size(); ++s)
    LOCKSTEP_CHECK(std::isfinite(in.advantage[s]), "policy_loss: advantage[", s, "] = ",
                   in.advantage[s], " (must be finite)");
  for (size_t i = 0; i < t; ++i)
    LOCKSTEP_CHECK(std::isfinite(in.mask[i]) && in.mask[i] >= 0, "policy_loss: mask[", i, "] = ",
                   in.mask[i], " (must be finite and non-negative)");
}

}  // namespace

PolicyLoss policy_loss(const PolicyLossInputs& in, const PolicyLossConfig& config) {
  check_inputs(in);
  check_config(config, in);
  const int64_t num_tokens = int64_t(in.logprob.size());
  const size_t num_seqs = in.cu_seqlens.size() - 1;
  PolicyLoss out;

  std::vector<double> seq_tokens(num_seqs, 0.0);
  for (size_t s = 0; s < num_seqs; ++s) {
    for (int32_t t = in.cu_seqlens[s]; t < in.cu_seqlens[s + 1]; ++t)
      seq_tokens[s] += in.mask[size_t(t)];
    out.tokens += seq_tokens[s];
    if (seq_tokens[s] > 0) ++out.sequences;
  }
  const LossAggregation agg = config.aggregation;
  const double norm = config.normalizer > 0                  ? config.normalizer
                      : agg == LossAggregation::token_mean ? out.tokens
                                                            : double(out.sequences);
  LOCKSTEP_CHECK(norm > 0, "policy_loss: the mask selects no token");
  // The weight of one token's ℓ in the loss, given its sequence's Σ m (see the header).
  const auto token_weight = [&](double seq_tokens) {
    switch (agg) {
      case LossAggregation::token_mean: return 1.0 / norm;
      case LossAggregation::sequence_mean: return 1.0 / (norm * seq_tokens);
      case LossAggregation::sequence_mean_token_sum: return 1.0 / norm;
      case LossAggregation::token_sum_norm: return 1.0 / (norm * config.max_response_tokens);
    }
    return 0.0;
  };

  out.dlogprob = Tensor::zeros({num_tokens}, DType::f32);
  float* dlogprob = out.dlogprob.data_as<float>();
  const double lower = 1.0 - config.clip_low, upper_fixed = 1.0 + config.clip_high;
  const double cap = config.tis_cap, beta = config.kl_coef, dual = config.clip_ratio_c;
  const bool tis = cap > 0, has_ref = !in.ref_logprob.empty();
  double clipped_low = 0, clipped_high = 0, clipped_dual = 0, ratio_sum = 0, kl_old_sum = 0,
         kl_ref_sum = 0, tis_clipped = 0, entropy_sum = 0;
  constexpr double kMaxLogRatio = 20;  // verl's clamp: exp(20) = 4.9e8, far from overflow
  for (size_t s = 0; s < num_seqs; ++s) {
    if (seq_tokens[s] == 0) continue;
    const double a = in.advantage[s];
    const double scale = token_weight(seq_tokens[s]);
    for (int32_t ti = in.cu_seqlens[s]; ti < in.cu_seqlens[s + 1]; ++ti) {
      const size_t t = size_t(ti);
      const double m = in.mask[t];
      if (m == 0) continue;
      const double lp = in.logprob[t], raw_log_ratio = lp - double(in.old_logprob[t]);
      // std::clamp keeps a NaN (every comparison with it is false).
      const double log_ratio = std::clamp(raw_log_ratio, -kMaxLogRatio, kMaxLogRatio);
      const bool ratio_clamped = log_ratio != raw_log_ratio && !std::isnan(raw_log_ratio);
      const double ratio = std::exp(log_ratio);

      double w = 1, upper = upper_fixed;
      if (tis) {
        const double rho = std::exp(double(in.old_logprob[t]) - double(in.rollout_logprob[t]));
        w = std::min(rho, cap);
        if (rho > cap) {
          tis_clipped += m;
          if (config.adaptive_clip) upper = upper_fixed * rho / cap;  // (1 + ε_high) / r, r = C/ρ
        }
      }
      // min(R·A, clip(R)·A): the clip binds only against the advantage's direction; at a bound
      // the unclipped branch, whose gradient does not vanish.
      double l_pg, d_pg = 0;
      if (a > 0 && ratio > upper) {
        l_pg = -w * a * upper;
        clipped_high += m;
      } else if (a < 0 && ratio < lower) {
        l_pg = -w * a * lower;
        clipped_low += m;
      } else if (a < 0 && dual > 0 && ratio > dual) {
        l_pg = -w * a * dual;
        clipped_dual += m;
      } else {
        l_pg = -w * a * ratio;
        d_pg = ratio_clamped ? 0.0 : l_pg;
      }

      double l_kl = 0, d_kl = 0;
      if (has_ref) {
        const double x = double(in.ref_logprob[t]) - lp;  // log(π_ref / π_θ)
        const bool k1 = config.kl_estimator == KlEstimator::k1;
        const double k = k1 ? -x : std::expm1(x) - x;
        kl_ref_sum += m * k;
        if (beta > 0) {
          l_kl = beta * k;
          d_kl = beta * (k1 ? 1.0 : -std::expm1(x));
        }
      }

      out.policy_loss += m * scale * l_pg;
      out.kl_loss += m * scale * l_kl;
      dlogprob[t] = float(m * scale * (d_pg + d_kl));
      ratio_sum += m * ratio;
      kl_old_sum += m * (std::expm1(log_ratio) - log_ratio);
      if (!in.entropy.empty()) entropy_sum += m * in.entropy[t];
    }
  }
  out.loss = out.policy_loss + out.kl_loss;
  if (out.tokens > 0) {
    out.clip_frac_low = clipped_low / out.tokens;
    out.clip_frac_high = clipped_high / out.tokens;
    out.clip_frac_dual = clipped_dual / out.tokens;
    out.ratio_mean = ratio_sum / out.tokens;
    out.approx_kl_old = kl_old_sum / out.tokens;
    out.kl_ref = kl_ref_sum / out.tokens;
    out.tis_clip_frac = tis_clipped / out.tokens;
    out.entropy_mean = entropy_sum / out.tokens;
  }
  return out;
}

}  // namespace lockstep
