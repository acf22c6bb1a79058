// rollout/sampler.h — what a request asks of generation (SamplingParams), and drawing one token
// from a row of logits on the host.
//
// For logits l (f32 [V]) and temperature τ > 0, with z = l / τ (f32, as ops/lm_head.h divides):
//   π     = softmax(z)                        the policy's sampling distribution
//   kept  = the top_k tokens of largest logit (all when top_k = 0 or ≥ V); then, of those sorted
//           by logit descending, the shortest prefix whose π-mass reaches top_p times the π-mass
//           of the top-k set (all when top_p = 1). Equal logits: the lower id first.
//   the token is drawn from π restricted to `kept`, renormalized.
// τ = 0 is greedy: the lowest id of largest logit (top_k, top_p and the seed are then unused).
//
// Randomness: one uniform u in (0, 1] (53 bits of Philox at (seed, stream, position),
// core/philox.h); the token is the first kept id v, in increasing id order, with Σ_{kept w ≤ v}
// π(w) ≥ u·Σ_kept π. A token is therefore a function of its logits row and (seed, stream, position)
// alone: the same whatever else is in the batch, and the same wherever it is computed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace lockstep {

struct SamplingParams {
  int64_t n = 1;                // samples of the prompt
  float temperature = 1.0f;     // ≥ 0; 0 = greedy
  float top_p = 1.0f;           // (0, 1]
  int64_t top_k = 0;            // ≥ 0; 0 = no limit
  int64_t max_new_tokens = 16;  // ≥ 1
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;  // non-empty strings; need a tokenizer
  uint64_t seed = 0;
};

// The next token for `logits` under p's temperature, top_k, top_p and seed; `stream` and
// `position` pick the random numbers (rollout/engine.h: the sample index and the token's
// position). Throws when the row holds a NaN or no finite maximum (a diverged model).
int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t stream,
                     uint64_t position);

}  // namespace lockstep
