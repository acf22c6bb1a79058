// rl/dynamic_sampling.h — DAPO's dynamic sampling (Yu et al. 2025, "DAPO", §3.2; verl's
// filter_groups with max_num_gen_batches): a group whose rewards are all equal has advantage 0
// everywhere and teaches nothing, so it is dropped and more prompts are sampled until the batch
// holds `wanted` groups with differing rewards.
//
// collect_groups calls draw(0), draw(1), ... (each a rollout batch of scored groups) and keeps, in
// order, the groups whose rewards differ (informative_groups, train/advantages.h), until `wanted`
// are kept or `max_draws` batches were drawn; the kept groups past `wanted` are dropped (as verl
// trims to the train batch size). With `filter` false it draws once and keeps every group. The
// batch may come out short (even empty) when max_draws runs out: `draws` and the kept count say
// so in the metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "rl/grpo_update.h"

namespace lockstep {

struct CollectedGroups {
  std::vector<ScoredGroup> kept;
  int64_t draws = 0;  // batches drawn
};

// wanted ≥ 1, max_draws ≥ 1.
CollectedGroups collect_groups(int64_t wanted, int64_t max_draws, bool filter,
                               const std::function<std::vector<ScoredGroup>(int64_t draw)>& draw);

}  // namespace lockstep
