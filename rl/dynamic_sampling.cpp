// rl/dynamic_sampling.cpp
#include "rl/dynamic_sampling.h"

#include "core/error.h"
#include "train/advantages.h"

namespace lockstep {

CollectedGroups collect_groups(int64_t wanted, int64_t max_draws, bool filter,
                               const std::function<std::vector<ScoredGroup>(int64_t draw)>& draw) {
  LOCKSTEP_CHECK(wanted >= 1 && max_draws >= 1, "collect_groups: wanted = ", wanted,
                 ", max_draws = ", max_draws, " (both must be ≥ 1)");
  CollectedGroups out;
  while (int64_t(out.kept.size()) < wanted && out.draws < max_draws) {
    std::vector<ScoredGroup> batch = draw(out.draws++);
    if (!filter) {
      out.kept = std::move(batch);
      return out;
    }
    for (ScoredGroup& group : batch) {
      if (informative_groups(group.rewards, int64_t(group.rewards.size())).empty()) continue;
      if (int64_t(out.kept.size()) < wanted) out.kept.push_back(std::move(group));
    }
  }
  return out;
}

}  // namespace lockstep
