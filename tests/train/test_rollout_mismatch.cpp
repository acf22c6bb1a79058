// Train/rollout mismatch metrics (train/rollout_mismatch.h) against a hand calculation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"
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
  EXPECT_EQ(m.tokens_differ, 2.0);  // the first and the fourth; the masked NaN does not count
}

TEST(RolloutMismatch, IdenticalLogprobsGiveNoMismatch) {
  const std::vector<float> lp = {-1.5f, -0.25f, -4.0f};
  const RolloutMismatch m = rollout_mismatch(lp, lp, std::vector<float>{1, 1, 1});
  EXPECT_EQ(m.mean_abs_diff, 0.0);
  EXPECT_EQ(m.max_abs_diff, 0.0);
  EXPECT_EQ(m.mult_prob_error, 1.0);
  EXPECT_EQ(m.kl_k3, 0.0);
  EXPECT_EQ(m.tokens_differ, 0.0);
}

TEST(RolloutMismatch, TokensDifferCountsEveryUlp) {
  // One ulp apart (a difference |Δ| ≈ 6e-8 that the means hardly show) counts; a NaN counts.
  const float one_ulp_below = std::nextafter(-1.0f, -2.0f);
  const RolloutMismatch m = rollout_mismatch(std::vector<float>{-1.0f, -1.0f, NAN, -0.5f},
                                             std::vector<float>{one_ulp_below, -1.0f, NAN, -0.5f},
                                             std::vector<float>{1, 1, 1, 2});
  EXPECT_EQ(m.tokens_differ, 2.0);
  EXPECT_EQ(m.tokens, 5.0);
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

// Bins of 256 response positions: tokens on both sides of the 255|256 and 511|512 edges, masked
// tokens (one at a prompt row, position −1) left out, and an empty bin before the last.
//   bin 0: positions 0, 255      |Δ| 0.1, 0.3   → 0.2, 2 tokens
//   bin 1: positions 256, 511    |Δ| 0.2, 0.4   → 0.3, 2 tokens (position 300 is masked)
//   bin 2: none                                 → NaN, 0 tokens (position 512 is masked)
//   bin 3: position 800          |Δ| 0.6        → 0.6, 1 token
TEST(RolloutMismatch, ByPositionBinsByHand) {
  const std::vector<int64_t> position = {-1, 0, 255, 256, 300, 511, 512, 800};
  const std::vector<float> train = {-9.0f, -1.0f, -2.0f, -0.5f, -1.0f, -1.2f, -3.0f, -0.9f};
  const std::vector<float> rollout = {0.0f, -1.1f, -1.7f, -0.7f, -1.5f, -0.8f, -2.0f, -1.5f};
  const std::vector<float> mask = {0, 1, 1, 1, 0, 1, 0, 1};
  const MismatchByPosition m = rollout_mismatch_by_position(train, rollout, mask, position, 256);
  ASSERT_EQ(m.mean_abs_diff.size(), 4u);
  ASSERT_EQ(m.tokens.size(), 4u);
  EXPECT_NEAR(m.mean_abs_diff[0], 0.2, kTol);
  EXPECT_NEAR(m.mean_abs_diff[1], 0.3, kTol);
  EXPECT_TRUE(std::isnan(m.mean_abs_diff[2]));
  EXPECT_NEAR(m.mean_abs_diff[3], 0.6, kTol);
  EXPECT_EQ(m.tokens, (std::vector<double>{2, 2, 0, 1}));

  // The bins' token-weighted means add up to the overall mean |Δ| of rollout_mismatch.
  const RolloutMismatch all = rollout_mismatch(train, rollout, mask);
  EXPECT_NEAR((0.2 * 2 + 0.3 * 2 + 0.6 * 1) / 5, all.mean_abs_diff, kTol);
  EXPECT_EQ(all.tokens, 5.0);

  // Narrower bins: width 100 puts 255 and 256 in bin 2, 511 in bin 5, 800 in bin 8.
  const MismatchByPosition narrow = rollout_mismatch_by_position(train, rollout, mask, position, 100);
  EXPECT_EQ(narrow.tokens, (std::vector<double>{1, 0, 2, 0, 0, 1, 0, 0, 1}));
  EXPECT_NEAR(narrow.mean_abs_diff[2], 0.25, kTol);
}

TEST(RolloutMismatch, ByPositionIdenticalLogprobsAreZeroInEveryBin) {
  const std::vector<float> lp = {-1.5f, -0.25f, -4.0f, -0.125f};
  const MismatchByPosition m = rollout_mismatch_by_position(lp, lp, std::vector<float>{1, 1, 1, 1},
                                                            std::vector<int64_t>{0, 1, 2, 3}, 2);
  EXPECT_EQ(m.mean_abs_diff, (std::vector<double>{0, 0}));
  EXPECT_EQ(m.tokens, (std::vector<double>{2, 2}));
}

TEST(RolloutMismatch, ByPositionBadInputIsNamed) {
  const std::vector<float> two = {-1, -1}, ones = {1, 1};
  const std::vector<int64_t> positions = {0, 1};
  testing::expect_error([&] { rollout_mismatch_by_position(two, two, ones, std::vector<int64_t>{0}, 256); },
                        {"response_position have 2, 2, 2 and 1 values"});
  testing::expect_error([&] { rollout_mismatch_by_position(two, two, ones, positions, 0); },
                        {"bin_tokens = 0"});
  testing::expect_error([&] { rollout_mismatch_by_position(two, two, ones, std::vector<int64_t>{0, -1}, 256); },
                        {"response_position[1] = -1 at a counted token"});
  testing::expect_error([&] { rollout_mismatch_by_position(two, two, std::vector<float>{1, -1}, positions, 256); },
                        {"mask[1] = -1"});
}

}  // namespace
}  // namespace lockstep
