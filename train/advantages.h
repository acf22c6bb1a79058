// train/advantages.h — group-relative advantages (GRPO) and DAPO's dynamic-sampling filter.
//
// Rewards come group by group: B prompts × G samples, prompt-major (rewards[b·G + g] is sample g of
// prompt b). Every sample of a group gets one advantage, shared by all its response tokens:
//
//   A = (r − mean_group) / (std_group + eps)     scale_by_std (GRPO, Shao et al. 2024)
//   A =  r − mean_group                          otherwise (Dr.GRPO, Liu et al. 2025: the std
//                                                division favours easy and hard prompts)
//
// std_group is the sample standard deviation (divides by G − 1), as torch.std in verl and TRL.
// A group whose rewards are all equal gets A = 0 either way (no NaN), and carries no learning
// signal: informative_groups() lists the groups to keep (DAPO dynamic sampling drops the others and
// samples more prompts). Sums run in double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lockstep {

struct GroupAdvantageConfig {
  bool scale_by_std = true;
  float eps = 1e-6f;
};

// rewards: B·G finite values; group_size G ≥ 2. Returns B·G advantages in the same order.
std::vector<float> group_advantages(std::span<const float> rewards, int64_t group_size,
                                    const GroupAdvantageConfig& config = {});

// The indices b of the groups whose rewards are not all equal, ascending.
std::vector<int64_t> informative_groups(std::span<const float> rewards, int64_t group_size);

}  // namespace lockstep
