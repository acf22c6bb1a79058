// train/policy_loss.h — the RL policy loss of one PPO mini-batch, its exact derivative with respect
// to every token's current logprob (what Transformer::backward takes), and its metrics.
//
// The batch is packed like model/transformer.h's TrainBatch: sequence s owns tokens
// [cu_seqlens[s], cu_seqlens[s+1]). Per token t of sequence s, with mask m_t ≥ 0 (1 for response
// tokens, 0 for prompt tokens and each sequence's last row; other non-negative weights allowed):
//
//   lp  current logprob (the training forward being differentiated)
//   old old logprob: the policy that rolled out, recomputed by the training forward (the proximal
//       policy of decoupled PPO)
//   ro  rollout logprob, as the rollout engine sampled it (the behaviour policy)
//   ref frozen reference policy's logprob
//   A   advantage[s]
//
//   R    = exp(clamp(lp − old, −20, 20))                the clamp keeps one wild token from
//                                                         overflowing (verl); outside it the
//                                                         gradient through R is 0 (torch.clamp)
//   ℓ_pg = −w · min(R·A, clip(R, 1 − ε_low, U)·A)        PPO-clip; ε_low ≠ ε_high is DAPO's
//                                                         clip-higher; U = 1 + ε_high
//   ℓ_pg = −w · A · c   when A < 0 and R > c             dual-clip PPO (Ye et al. 2020,
//                                                         arXiv:1912.09729; verl's clip_ratio_c):
//                                                         bounds the loss of a negative advantage
//   w    = min(exp(old − ro), C)  with tis_cap C > 0      decoupled PPO with truncated importance
//          1                      otherwise               sampling (FlashRL; verl's rollout_is):
//                                                         w is a constant (no gradient)
//   U    = (1 + ε_high) / r,  r = min(ρ, C) / ρ,          with adaptive_clip: QuRL's Adaptive
//          ρ = exp(old − ro)                              Clipping Range (below)
//   ℓ_kl = β · (lp − ref)                          k1     KL(π_θ ‖ π_ref) estimators on samples of
//          β · (exp(ref − lp) − (ref − lp) − 1)    k3     π_θ (Schulman 2020; k3 as GRPO's)
//   ℓ    = ℓ_pg + ℓ_kl
//
// Aggregation (verl's loss_agg_mode; TRL's loss_type):
//   token_mean:               loss = Σ_t m_t ℓ_t / N,   N = Σ_t m_t over the whole batch
//                             (verl token-mean, TRL dapo)
//   sequence_mean:            loss = (1/S) Σ_s (Σ_{t∈s} m_t ℓ_t / Σ_{t∈s} m_t),
//                             S = sequences with Σ m > 0 (verl seq-mean-token-mean, TRL grpo)
//   sequence_mean_token_sum:  loss = (1/S) Σ_s Σ_{t∈s} m_t ℓ_t   (verl seq-mean-token-sum)
//   token_sum_norm:           loss = Σ_t m_t ℓ_t / (S · L),  L = max_response_tokens, a constant:
//                             Dr.GRPO's length normalizer (Liu et al. 2025; TRL dr_grpo, whose S
//                             is the batch's sequence count; verl's seq-mean-token-sum-norm
//                             divides by L alone, S times the loss)
// `normalizer` > 0 replaces N (token_mean) or S (the others): a mini-batch split into
// micro-batches passes the mini-batch's count to every call, so the gradients add up to the
// mini-batch's.
//
// dlogprob[t] = ∂loss/∂lp_t exactly: ∂ℓ_pg/∂lp = −w·A·R, and 0 where a clip binds (A > 0 and
// R > U; A < 0 and R < 1 − ε_low; A < 0 and R > c with dual-clip; |lp − old| > 20). At R equal
// to a bound the unclipped branch is taken, so with ε = 0 and R = 1 (the first on-policy
// mini-batch) the gradient is −w·A, as torch's clamp passes it at its bounds. ∂k1/∂lp = 1,
// ∂k3/∂lp = 1 − exp(ref − lp). Times the aggregation's weight: m_t / N, m_t / (S·Σ_{t∈s} m),
// m_t / S or m_t / (S·L).
// Tokens with m_t = 0 get 0 and their logprobs are not read (they may be anything). A NaN logprob
// of a counted token propagates into the loss and the gradient, where the training loop skips the
// step; an infinite log-ratio is clamped like any other beyond ±20.
//
// Adaptive Clipping Range (QuRL: Li, Elangovan, Dong, Panda, Khailany, "QuRL: Efficient
// Reinforcement Learning with Quantized Rollout", ICLR 2026, arXiv:2602.13953): written as
// decoupled PPO, truncating ρ at C scales the PPO term by r = min(ρ, C)/ρ, which shrinks the clip
// range to [r(1 − ε), r(1 + ε)] and over-clips positive-advantage tokens of truncated ratios; ACR
// moves the upper bound to (1 + ε_high)/r. r = 1 (plain TIS) unless ρ > C. What was checked
// against the paper (2026-11-28): its abstract (arXiv) and two public summaries of it confirm that
// ACR adjusts the clipping ratio by the policy ratio between the full-precision and the quantized
// actor within decoupled PPO; the method section's equations were not readable here, so the exact
// bound (whether the lower bound moves too) is taken from notes on the paper, not checked.
//
// Metrics are token means over the counted tokens (weights m_t), whatever the aggregation.
// All math runs in double on the host.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace lockstep {

enum class LossAggregation { token_mean, sequence_mean, sequence_mean_token_sum, token_sum_norm };
enum class KlEstimator { k1, k3 };

struct PolicyLossConfig {
  float clip_low = 0.2f;   // ε_low, in [0, 1)
  float clip_high = 0.2f;  // ε_high ≥ 0 (DAPO: 0.28)
  float clip_ratio_c = 3.0f;  // c > 1: dual-clip (verl's default 3); 0: off
  LossAggregation aggregation = LossAggregation::token_mean;
  float kl_coef = 0.0f;  // β ≥ 0; > 0 needs ref_logprob
  KlEstimator kl_estimator = KlEstimator::k3;
  float tis_cap = 0.0f;        // C > 0: truncated importance sampling (needs rollout_logprob)
  bool adaptive_clip = false;  // QuRL's ACR (needs tis_cap > 0)
  double normalizer = 0;       // > 0: N or S of the whole mini-batch (see above)
  double max_response_tokens = 0;  // L > 0 of token_sum_norm (the rollout's max_new_tokens)
};

// Host-side per-token data of T tokens in S sequences (std::vector converts implicitly).
struct PolicyLossInputs {
  std::span<const float> logprob;          // [T] lp
  std::span<const float> old_logprob;      // [T] old
  std::span<const float> rollout_logprob;  // [T] ro, or empty (no TIS)
  std::span<const float> ref_logprob;      // [T] ref, or empty (no KL)
  std::span<const float> entropy;          // [T] or empty; for the metric only
  std::span<const float> mask;             // [T] m
  std::span<const int32_t> cu_seqlens;     // [S + 1]: 0, ..., T, non-decreasing
  std::span<const float> advantage;        // [S] finite
};

struct PolicyLoss {
  double loss = 0;
  double policy_loss = 0;  // the ℓ_pg part of loss
  double kl_loss = 0;      // the ℓ_kl part of loss
  Tensor dlogprob;         // f32 [T] on the CPU
  double tokens = 0;       // N = Σ m of this call
  int64_t sequences = 0;   // sequences of this call with Σ m > 0

  double clip_frac_low = 0;   // share of tokens with A < 0 and R < 1 − ε_low
  double clip_frac_high = 0;  // share of tokens with A > 0 and R > U
  double clip_frac_dual = 0;  // share of tokens with A < 0 and R > c (dual-clip)
  double ratio_mean = 0;      // mean R
  double approx_kl_old = 0;   // mean (R − 1) − log R: k3 estimate of KL(π_old ‖ π_θ)
  double kl_ref = 0;          // mean k1 or k3 (kl_estimator); 0 without ref_logprob
  double tis_clip_frac = 0;   // share of tokens with exp(old − ro) > C; 0 without TIS
  double entropy_mean = 0;    // 0 without entropy
};

PolicyLoss policy_loss(const PolicyLossInputs& in, const PolicyLossConfig& config);

}  // namespace lockstep
