// GRPO / Dr.GRPO group advantages and DAPO's dynamic-sampling filter, against hand calculations.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"
#include "train/advantages.h"

namespace lockstep {
namespace {

using testing::expect_error;

// Outputs are floats computed in double: 1e-6 absolute covers their rounding (values ≤ 2).
constexpr double kTol = 1e-6;

// Three groups of G = 4:
//   {1, 0, 0, 1}: mean 0.5, sample std sqrt(4·0.25/3) = 0.5773503 → ±0.5/(0.5773503 + 1e-6)
//                 = ±0.8660239
//   {2, 2, 2, 2}: constant → 0 (std 0: 0/(0 + eps), no NaN)
//   {0, 3, 6, 3}: mean 3, sample std sqrt(18/3) = 2.4494897 → ±3/2.4494907 = ±1.2247444, 0, 0
const std::vector<float> kRewards = {1, 0, 0, 1, 2, 2, 2, 2, 0, 3, 6, 3};

TEST(GroupAdvantages, GrpoDividesByTheGroupStd) {
  const std::vector<float> a = group_advantages(kRewards, 4);
  const std::vector<double> expected = {0.8660239, -0.8660239, -0.8660239, 0.8660239, 0, 0, 0, 0,
                                        -1.2247444, 0, 1.2247444, 0};
  ASSERT_EQ(a.size(), expected.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], expected[i], kTol) << i;
}

TEST(GroupAdvantages, DrGrpoOnlySubtractsTheMean) {
  const std::vector<float> a = group_advantages(kRewards, 4, {.scaling = RewardScaling::none});
  const std::vector<double> expected = {0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, -3, 0, 3, 0};
  ASSERT_EQ(a.size(), expected.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], expected[i], kTol) << i;
}

TEST(GroupAdvantages, ConstantGroupsGiveExactZeros) {
  // 0.1 is not a power of two: the mean must still come out exact (G·x and G·x/G are exact in
  // double), so the advantage is exactly 0 and not 1e-17/eps.
  for (RewardScaling scaling : {RewardScaling::group, RewardScaling::batch, RewardScaling::none}) {
    const std::vector<float> rewards = {0.1f, 0.1f, 0.1f, -7, -7, -7};
    const std::vector<float> a = group_advantages(rewards, 3, {.scaling = scaling});
    for (float x : a) EXPECT_EQ(x, 0.0f);
  }
}

TEST(GroupAdvantages, BatchScalingDividesByOneStdOverAllRewards) {
  // TRL's scale_rewards="batch": the 12 rewards have mean 22/12 = 1.8333333 and
  // Σ(r − mean)² = Σr² − 12·mean² = 72 − 40.3333333 = 31.6666667, sample std
  // sqrt(31.6666667/11) = 1.6966991; A = (r − group mean) / (1.6966991 + 1e-6):
  // ±0.5/1.6967001 = ±0.2946897, 0 ×4, ∓3/1.6967001 = ∓1.7681380, 0, 0.
  const std::vector<float> a = group_advantages(kRewards, 4, {.scaling = RewardScaling::batch});
  const std::vector<double> expected = {0.2946897, -0.2946897, -0.2946897, 0.2946897, 0, 0, 0, 0,
                                        -1.7681380, 0, 1.7681380, 0};
  ASSERT_EQ(a.size(), expected.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], expected[i], kTol) << i;
}

TEST(GroupAdvantages, EpsIsAddedToTheStd) {
  // {0, 1}: mean 0.5, sample std sqrt(0.5) = 0.7071068; with eps = 0.2928932 the divisor is 1.
  const std::vector<float> a =
      group_advantages(std::vector<float>{0, 1}, 2, {.eps = 1.0f - 0.70710678f});
  EXPECT_NEAR(a[0], -0.5, kTol);
  EXPECT_NEAR(a[1], 0.5, kTol);
}

TEST(GroupAdvantages, BadInputIsNamed) {
  const std::vector<float> r = {1, 0, 0};
  EXPECT_THROW(group_advantages(r, 2), Error);  // 3 rewards, groups of 2
  EXPECT_THROW(group_advantages(r, 1), Error);  // no group statistics from one sample
  EXPECT_THROW(group_advantages(r, 3, {.eps = 0}), Error);
  expect_error([] { group_advantages(std::vector<float>{1, 0, NAN, 1}, 2); }, "rewards[2]");
}

TEST(InformativeGroups, KeepsGroupsWhoseRewardsDiffer) {
  EXPECT_EQ(informative_groups(kRewards, 4), (std::vector<int64_t>{0, 2}));
  // Group 0 differs in its last sample only; {0, 0, -0} is constant (-0 equals 0).
  EXPECT_EQ(informative_groups(std::vector<float>{1, 1, 0, 0, 0, -0.0f, 5, 5, 5}, 3),
            (std::vector<int64_t>{0}));
  EXPECT_TRUE(informative_groups(std::vector<float>{3, 3, 4, 4}, 2).empty());
  EXPECT_THROW(informative_groups(std::vector<float>{1, INFINITY}, 2), Error);
}

}  // namespace
}  // namespace lockstep
