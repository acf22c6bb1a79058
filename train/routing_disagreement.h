// train/routing_disagreement.h — how often a mixture-of-experts model's router chose differently
// in the rollout and in the training forward for the same tokens (for logging: where the two
// compute the same function, as the unified fp8 flow on the CPU does, it is 0; with bf16 training
// and an fp8 rollout, near-ties flip).
//
// A token disagrees when its set of k experts differs (the order within the top k is ignored: the
// same experts with the same weights compute the same output in either order). Both inputs are
// row-major [T, k] expert ids of one sparse layer (model/moe.h's RouterStats::expert_ids, or the
// rollout's record of them), on the host.
#pragma once

#include <cstdint>
#include <span>

namespace lockstep {

// The fraction of the T tokens that disagree; 0 for T = 0. Spans of different lengths, or a k that
// does not divide them, are an error.
double routing_disagreement(std::span<const int32_t> rollout_ids, std::span<const int32_t> train_ids, int64_t k);

}  // namespace lockstep
