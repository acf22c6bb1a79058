// train/routing_disagreement.h on hand-made routings.
#include <gtest/gtest.h>

#include <vector>

#include "train/routing_disagreement.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

TEST(RoutingDisagreement, CountsTokensWhoseExpertSetsDiffer) {
  // Four tokens, one layer, top-2: the same; the same set in the other order; one expert swapped;
  // both swapped.
  const std::vector<int32_t> rollout = {0, 3, /**/ 5, 1, /**/ 2, 7, /**/ 4, 6};
  const std::vector<int32_t> train = {0, 3, /**/ 1, 5, /**/ 2, 6, /**/ 0, 1};
  const std::vector<uint8_t> all4(4, 1), all8(8, 1);
  EXPECT_EQ(routing_disagreement(rollout, train, all4, 1, 2).token_fraction(), 0.5);
  EXPECT_EQ(routing_disagreement(rollout, rollout, all4, 1, 2).token_fraction(), 0.0);
  // Read as top-1 of eight tokens instead: positions 2, 3, 5, 6, 7 differ.
  EXPECT_EQ(routing_disagreement(rollout, train, all8, 1, 1).token_fraction(), 5.0 / 8.0);
  // Tokens not counted are skipped: of tokens 1 and 3 only the last differs.
  const RoutingDisagreement some = routing_disagreement(rollout, train, {{0, 1, 0, 1}}, 1, 2);
  EXPECT_EQ(some.tokens, 2);
  EXPECT_EQ(some.tokens_differ, 1);
  EXPECT_EQ(routing_disagreement({}, {}, {}, 1, 2).token_fraction(), 0.0);
}

TEST(RoutingDisagreement, ATokenDiffersWhenAnyLayerDoes) {
  // The same ids read as two tokens of two layers, top-2: token 0's layer 1 ({2, 7} vs {2, 6})
  // and token 1's layer 1 ({4, 6} vs {0, 1}) differ; the layer 0 sets agree.
  const std::vector<int32_t> rollout = {0, 3, /**/ 2, 7, /**/ 5, 1, /**/ 4, 6};
  const std::vector<int32_t> train = {3, 0, /**/ 2, 6, /**/ 1, 5, /**/ 0, 1};
  const RoutingDisagreement d = routing_disagreement(rollout, train, {{1, 1}}, 2, 2);
  EXPECT_EQ(d.tokens, 2);
  EXPECT_EQ(d.tokens_differ, 2);
  EXPECT_EQ(d.pairs, 4);
  EXPECT_EQ(d.pairs_differ, 2);
  EXPECT_EQ(d.pair_fraction(), 0.5);
}

TEST(RoutingDisagreement, MismatchedInputsAreAnError) {
  const std::vector<int32_t> three = {0, 1, 2}, four = {0, 1, 2, 3};
  const std::vector<uint8_t> t3(3, 1), t4(4, 1);
  testing::expect_error([&] { routing_disagreement(three, four, t3, 1, 1); },
                        {"routing_disagreement", "3 and 4"});
  testing::expect_error([&] { routing_disagreement(three, three, t3, 1, 2); }, {"k = 2"});
  testing::expect_error([&] { routing_disagreement(four, four, t4, 2, 1); }, {"layers = 2"});
}

}  // namespace
}  // namespace lockstep
