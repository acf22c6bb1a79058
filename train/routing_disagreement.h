// train/routing_disagreement.h — how often a mixture-of-experts model's router chose differently
// in the rollout and in the training forward for the same tokens (for logging: where the two
// compute the same function, as the unified fp8 flow on the CPU does, it is 0; with bf16 training
// and an fp8 rollout, near-ties flip).
//
// A (token, layer) pair disagrees when that sparse layer's set of k experts differs (the order
// within the top k is ignored: the same experts with the same weights compute the same output in
// either order); a token disagrees when any of its layers does. Both inputs are row-major
// [T][layers][k] expert ids on the host (rl/packed_rows.h's rollout_experts layout).
#pragma once

#include <cstdint>
#include <span>

namespace lockstep {

struct RoutingDisagreement {
  int64_t tokens = 0, tokens_differ = 0;  // the tokens counted, and those that disagree
  int64_t pairs = 0, pairs_differ = 0;    // (token, layer) pairs
  // The disagreeing fractions; 0 when nothing was counted.
  double token_fraction() const { return tokens ? double(tokens_differ) / double(tokens) : 0.0; }
  double pair_fraction() const { return pairs ? double(pairs_differ) / double(pairs) : 0.0; }
};

// Counts the tokens t with counted[t] != 0 (T = counted.size()). Spans whose lengths are not
// T · layers · k are an error.
RoutingDisagreement routing_disagreement(std::span<const int32_t> rollout_ids,
                                         std::span<const int32_t> train_ids,
                                         std::span<const uint8_t> counted, int64_t layers, int64_t k);

}  // namespace lockstep
