// tests/model/test_micro_batch.cpp — micro-batch planning and batch packing checks.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/micro_batch.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;

std::vector<std::pair<size_t, size_t>> plan(std::vector<int64_t> lengths, int64_t budget) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const SequenceRange& r : plan_micro_batches(lengths, budget)) out.emplace_back(r.first, r.last);
  return out;
}

TEST(MicroBatch, GreedyInOrderUnderTheBudget) {
  using P = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(plan({4096, 2048, 1024, 1024}, 8192), (P{{0, 4}}));
  EXPECT_EQ(plan({4096, 2048, 1024, 1024}, 4096), (P{{0, 1}, {1, 4}}));
  EXPECT_EQ(plan({4096, 2048, 1024, 1024}, 3000), (P{{0, 1}, {1, 2}, {2, 4}}));
  // A sequence over the budget gets a micro-batch of its own.
  EXPECT_EQ(plan({10, 5000, 10}, 4096), (P{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(plan({3, 3, 3}, 6), (P{{0, 2}, {2, 3}}));
  EXPECT_TRUE(plan({}, 10).empty());
}

TEST(MicroBatch, BadInputIsAnError) {
  EXPECT_THROW(plan({10}, 0), Error);
  expect_error([] { plan({10, 0}, 100); }, "sequence 1");
}

TEST(MicroBatch, TrainBatchChecksIdsOnTheHost) {
  const std::vector<int32_t> tokens{1, 2, 3}, targets{2, 3, 0}, cu{0, 2, 3};
  const TrainBatch b = make_train_batch(tokens, targets, cu, 4, Device::cpu);
  EXPECT_EQ(b.tokens.data_as<int32_t>()[2], 3);
  EXPECT_EQ(b.cu_seqlens.numel(), 3);
  expect_error([&] { make_train_batch(std::vector<int32_t>{1, 7, 3}, targets, cu, 4, Device::cpu); },
               "token 7 at row 1");
  EXPECT_THROW(make_train_batch(tokens, std::vector<int32_t>{2, -1, 0}, cu, 4, Device::cpu), Error);
  EXPECT_THROW(make_train_batch(tokens, targets, std::vector<int32_t>{0, 2}, 4, Device::cpu), Error);
  EXPECT_THROW(make_train_batch(tokens, targets, std::vector<int32_t>{0, 3, 2, 3}, 4, Device::cpu),
               Error);
}

}  // namespace
}  // namespace lockstep
