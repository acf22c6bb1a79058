// train/advantages.cpp
#include "train/advantages.h"

#include <cmath>

#include "core/error.h"

namespace lockstep {

namespace {

// Checks the layout and the values; returns the number of groups.
int64_t check_rewards(std::span<const float> rewards, int64_t group_size, const char* what) {
  LOCKSTEP_CHECK(group_size >= 2, what, ": group_size must be at least 2, got ", group_size);
  const int64_t n = int64_t(rewards.size());
  LOCKSTEP_CHECK(n > 0 && n % group_size == 0, what, ": ", n,
                 " rewards is not a positive multiple of group_size ", group_size);
  for (int64_t i = 0; i < n; ++i)
    LOCKSTEP_CHECK(std::isfinite(rewards[size_t(i)]), what, ": rewards[", i, "] = ",
                   rewards[size_t(i)], " (must be finite)");
  return n / group_size;
}

double mean_of(std::span<const float> r) {
  double sum = 0;
  for (float x : r) sum += x;
  return sum / double(r.size());
}

// Divides by n − 1 (torch.std); n ≥ 2.
double sample_std(std::span<const float> r) {
  const double mean = mean_of(r);
  double var = 0;
  for (float x : r) var += (x - mean) * (x - mean);
  return std::sqrt(var / double(r.size() - 1));
}

}  // namespace

std::vector<float> group_advantages(std::span<const float> rewards, int64_t group_size,
                                    const GroupAdvantageConfig& config) {
  const int64_t groups = check_rewards(rewards, group_size, "group_advantages");
  LOCKSTEP_CHECK(config.eps > 0 && std::isfinite(config.eps),
                 "group_advantages: eps must be positive and finite, got ", config.eps);
  std::vector<float> out(rewards.size());
  const double batch_scale =
      config.scaling == RewardScaling::batch ? 1.0 / (sample_std(rewards) + config.eps) : 1.0;
  for (int64_t b = 0; b < groups; ++b) {
    const std::span<const float> r = rewards.subspan(size_t(b * group_size), size_t(group_size));
    const double mean = mean_of(r);
    const double scale = config.scaling == RewardScaling::group ? 1.0 / (sample_std(r) + config.eps)
                                                                : batch_scale;
    for (int64_t g = 0; g < group_size; ++g)
      out[size_t(b * group_size + g)] = float((r[size_t(g)] - mean) * scale);
  }
  return out;
}

std::vector<int64_t> informative_groups(std::span<const float> rewards, int64_t group_size) {
  const int64_t groups = check_rewards(rewards, group_size, "informative_groups");
  std::vector<int64_t> keep;
  for (int64_t b = 0; b < groups; ++b) {
    const std::span<const float> r = rewards.subspan(size_t(b * group_size), size_t(group_size));
    for (float x : r) {
      if (x != r[0]) {
        keep.push_back(b);
        break;
      }
    }
  }
  return keep;
}

}  // namespace lockstep
