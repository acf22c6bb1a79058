// train/routing_disagreement.h on hand-made routings.
#include <gtest/gtest.h>

#include <vector>

#include "train/routing_disagreement.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

TEST(RoutingDisagreement, CountsTokensWhoseExpertSetsDiffer) {
  // Four tokens, top-2: the same; the same set in the other order; one expert swapped; both swapped.
  const std::vector<int32_t> rollout = {0, 3, /**/ 5, 1, /**/ 2, 7, /**/ 4, 6};
  const std::vector<int32_t> train = {0, 3, /**/ 1, 5, /**/ 2, 6, /**/ 0, 1};
  EXPECT_EQ(routing_disagreement(rollout, train, 2), 0.5);
  EXPECT_EQ(routing_disagreement(rollout, rollout, 2), 0.0);
  // Read as top-1 of eight tokens instead: positions 2, 3, 5, 6, 7 differ.
  EXPECT_EQ(routing_disagreement(rollout, train, 1), 5.0 / 8.0);
  EXPECT_EQ(routing_disagreement({}, {}, 2), 0.0);
}

TEST(RoutingDisagreement, MismatchedInputsAreAnError) {
  const std::vector<int32_t> three = {0, 1, 2}, four = {0, 1, 2, 3};
  testing::expect_error([&] { routing_disagreement(three, four, 1); }, {"routing_disagreement", "3 and 4"});
  testing::expect_error([&] { routing_disagreement(three, three, 2); }, {"k = 2"});
}

}  // namespace
}  // namespace lockstep
