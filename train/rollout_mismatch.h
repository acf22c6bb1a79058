// train/rollout_mismatch.h — how far the training forward's logprobs are from the rollout
// engine's on the same sampled tokens (for logging; in the unified fp8 flow they should agree).
//
// Per counted token, Δ = logp_train − logp_rollout, weighted by mask m ≥ 0 (response tokens):
//   mean_abs_diff    Σ m·|Δ| / Σ m
//   max_abs_diff     max |Δ| over tokens with m > 0
//   mult_prob_error  Σ m·exp(|Δ|) / Σ m: NeMo-RL's token multiplicative probability error
//                    (docs/adding-new-models.md; 1 when the two agree)
//   kl_k3            Σ m·(exp(Δ) − 1 − Δ) / Σ m: the k3 estimate of KL(π_rollout ‖ π_train) — the
//                    tokens are samples of the rollout policy, r = π_train / π_rollout
//   tokens_differ    how many tokens with m > 0 have logp_train ≠ logp_rollout (a NaN differs):
//                    0 exactly where the rollout computes the training forward's logprobs
// Sums run in double. Non-finite logprobs of counted tokens propagate into the results.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lockstep {

struct RolloutMismatch {
  double mean_abs_diff = 0;
  double max_abs_diff = 0;
  double mult_prob_error = 0;
  double kl_k3 = 0;
  double tokens = 0;  // Σ m
  double tokens_differ = 0;
};

// All three of one length T; the mask selects at least one token.
RolloutMismatch rollout_mismatch(std::span<const float> train_logprob,
                                 std::span<const float> rollout_logprob,
                                 std::span<const float> mask);

// mean_abs_diff per response position bin: bin b holds the tokens whose position in their response
// (0 for a response's first token) is in [b·bin_tokens, (b+1)·bin_tokens). The off-policy drift of
// an fp8 rollout is expected to grow along the response; this shows where it does.
struct MismatchByPosition {
  std::vector<double> mean_abs_diff;  // Σ m·|Δ| / Σ m over the bin; NaN for a bin without tokens
  std::vector<double> tokens;         // Σ m over the bin
};

// `response_position` is each token's position in its response (read only where mask > 0, where it
// must be ≥ 0). The bins run from 0 to the last that has a token; bin_tokens ≥ 1. Non-finite
// logprobs of counted tokens propagate into their bin's mean.
MismatchByPosition rollout_mismatch_by_position(std::span<const float> train_logprob,
                                                std::span<const float> rollout_logprob,
                                                std::span<const float> mask,
                                                std::span<const int64_t> response_position,
                                                int64_t bin_tokens);

}  // namespace lockstep
