// Copy-on-write of KV blocks (ops/block_copy.h) on the CPU: every tensor's dst block becomes its
// src block and nothing else changes; independent_copies splits where a copy depends on an earlier
// one; bad indices and dependent pairs in one call are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/block_copy.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::random_tensor;

Tensor pairs_tensor(const std::vector<int32_t>& flat) {
  Tensor t = Tensor::empty({int64_t(flat.size()) / 2, 2}, DType::i32);
  std::copy(flat.begin(), flat.end(), t.data_as<int32_t>());
  return t;
}

TEST(BlockCopy, CopiesEveryTensorsBlocksAndNothingElse) {
  std::vector<Tensor> tensors, before;
  for (uint64_t i = 0; i < 3; ++i) {
    tensors.push_back(random_tensor({6, 4, 2, 8}, DType::bf16, 40 + i));
    before.push_back(tensors.back().to(Device::cpu));
  }
  copy_blocks(tensors, pairs_tensor({1, 4, 1, 0, 3, 5}));
  const size_t block = before[0].nbytes() / 6;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const char* a = static_cast<const char*>(before[i].data());
    const char* b = static_cast<const char*>(tensors[i].data());
    const int32_t source[6] = {1, 1, 2, 3, 1, 3};  // block b now holds block source[b]
    for (size_t blk = 0; blk < 6; ++blk)
      EXPECT_EQ(std::memcmp(b + blk * block, a + size_t(source[blk]) * block, block), 0)
          << "tensor " << i << " block " << blk;
  }
}

TEST(BlockCopy, IndependentCopiesStopAtTheFirstDependentPair) {
  EXPECT_EQ(independent_copies({}), 0);
  const std::vector<int32_t> free = {1, 4, 1, 0, 3, 5};
  EXPECT_EQ(independent_copies(free), 3);
  const std::vector<int32_t> reads_written = {1, 4, 4, 0};  // 4 written, then read
  EXPECT_EQ(independent_copies(reads_written), 1);
  const std::vector<int32_t> writes_read = {1, 4, 2, 1};  // 1 read, then written
  EXPECT_EQ(independent_copies(writes_read), 1);
  const std::vector<int32_t> writes_twice = {1, 4, 2, 5, 3, 4};
  EXPECT_EQ(independent_copies(writes_twice), 2);
}

TEST(BlockCopy, RefusesBadPairsAndTensors) {
  std::vector<Tensor> tensors = {random_tensor({6, 8}, DType::f32, 1),
                                 random_tensor({6, 8}, DType::f32, 2)};
  expect_error([&] { copy_blocks(tensors, pairs_tensor({1, 6})); },
               "pairs[0].dst = 6 is outside the blocks [0, 6)");
  expect_error([&] { copy_blocks(tensors, pairs_tensor({0, 1, -1, 2})); },
               "pairs[1].src = -1");
  expect_error([&] { copy_blocks(tensors, pairs_tensor({0, 1, 1, 2})); },
               "pairs[1] touches a block");
  expect_error([&] { copy_blocks(tensors, Tensor::empty({2, 3}, DType::i32)); },
               "pairs: expected [C, 2]");
  std::vector<Tensor> mixed = {tensors[0], random_tensor({6, 8}, DType::bf16, 3)};
  expect_error([&] { copy_blocks(mixed, pairs_tensor({0, 1})); }, "tensors[1]: expected dtype f32");
  std::vector<Tensor> none;
  expect_error([&] { copy_blocks(none, pairs_tensor({0, 1})); }, "no tensors");
}

}  // namespace
}  // namespace lockstep
