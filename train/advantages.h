// train/advantages.h — group-relative advantages (GRPO) and DAPO's dynamic-sampling filter.
//
// Rewards come group by group: B prompts × G samples, prompt-major (rewards[b·G + g] is sample g of
// prompt b). Every sample of a group gets one advantage, shared by all its response tokens:
//
//   A = (r − mean_group) / (std_group + eps)     RewardScaling::group (GRPO, Shao et al. 2024;
//                                                TRL scale_rewards="group")
//   A = (r − mean_group) / (std_batch + eps)     RewardScaling::batch (TRL scale_rewards="batch":
//                                                one std over all B·G rewards)
//   A =  r − mean_group                          RewardScaling::none (Dr.GRPO, Liu et al. 2025:
//                                                the std division favours easy and hard prompts)
//
// Both stds are sample standard deviations (divide by n − 1), as torch.std in verl and TRL.
// A group whose rewards are all equal gets A = 0 in every mode (no NaN), and carries no learning
// signal: informative_groups() lists the groups to keep (DAPO dynamic sampling drops the others and
// samples more prompts). Sums run in double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lockstep {

enum class RewardScaling { group, batch, none };

struct GroupAdvantageConfig {
  RewardScaling scaling = RewardScaling::group;
  float eps = 1e-6f;
};

// rewards: B·G finite values; group_size G ≥ 2. Returns B·G advantages in the same order.
std::vector<float> group_advantages(std::span<const float> rewards, int64_t group_size,
                                    const GroupAdvantageConfig& config = {});

// The indices b of the groups whose rewards are not all equal, ascending.
std::vector<int64_t> informative_groups(std::span<const float> rewards, int64_t group_size);

}  // namespace lockstep
