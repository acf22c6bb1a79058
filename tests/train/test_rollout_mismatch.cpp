// Train/rollout mismatch metrics (train/rollout_mismatch.h) against a hand calculation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "train/rollout_mismatch.h"

namespace lockstep {
namespace {

// Differences come from float inputs (error ~6e-8 at |logp| ≤ 2): 1e-6 is ample.
constexpr double kTol = 1e-6;

TEST(RolloutMismatch, ByHand) {
  // Δ = train − rollout = 0.1, 0, (−0.2 masked out), −0.2:
  //   mean |Δ| = 0.3/3 = 0.1, max 0.2
  //   exp|Δ|: 1.1051709 + 1 + 1.2214028 = 3.3265737 → 1.1088579
  //   k3 = e^Δ − 1 − Δ: 0.0051709 + 0 + 0.0187308 = 0.0239017 → 0.0079672
  const std::vector<float> train = {-1.0f, -2.0f, -0.5f, -0.7f, -3.0f};
  const std::vector<float> rollout = {-1.1f, -2.0f, -0.3f, -0.5f, NAN};
  const std::vector<float> mask = {1, 1, 0, 1, 0};
  const RolloutMismatch m = rollout_mismatch(train, rollout, mask);
  EXPECT_NEAR(m.mean_abs_diff, 0.1, kTol);
  EXPECT_NEAR(m.max_abs_diff, 0.2, kTol);
  EXPECT_NEAR(m.mult_prob_error, 1.1088579, kTol);
  EXPECT_NEAR(m.kl_k3, 0.0079672, kTol);
  EXPECT_EQ(m.tokens, 3.0);
}

TEST(RolloutMismatch, IdenticalLogprobsGiveNoMismatch) {
  const std::vector<float> lp = {-1.5f, -0.25f, -4.0f};
  const RolloutMismatch m = rollout_mismatch(lp, lp, std::vector<float>{1, 1, 1});
  EXPECT_EQ(m.mean_abs_diff, 0.0);
  EXPECT_EQ(m.max_abs_diff, 0.0);
  EXPECT_EQ(m.mult_prob_error, 1.0);
  EXPECT_EQ(m.kl_k3, 0.0);
}

TEST(RolloutMismatch, NonFiniteCountedTokenPropagates) {
  const RolloutMismatch m = rollout_mismatch(std::vector<float>{NAN, -1.0f},
                                             std::vector<float>{-1.0f, -0.5f},
                                             std::vector<float>{1, 1});
  EXPECT_TRUE(std::isnan(m.mean_abs_diff));
  EXPECT_TRUE(std::isnan(m.max_abs_diff));
}

TEST(RolloutMismatch, BadInputIsNamed) {
  const std::vector<float> two = {-1, -1};
  EXPECT_THROW(rollout_mismatch(two, std::vector<float>{-1}, two), Error);
  EXPECT_THROW(rollout_mismatch(two, two, std::vector<float>{0, 0}), Error);
  EXPECT_THROW(rollout_mismatch(two, two, std::vector<float>{1, -1}), Error);
}

}  // namespace
}  // namespace lockstep
