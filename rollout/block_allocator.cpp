// rollout/block_allocator.cpp
#include "rollout/block_allocator.h"

#include "core/error.h"

namespace lockstep {

BlockAllocator::BlockAllocator(int64_t num_blocks) {
  LOCKSTEP_CHECK(num_blocks > 0 && num_blocks <= INT32_MAX,
                 "block allocator: num_blocks must be in [1, 2^31), got ", num_blocks);
  refs_.assign(size_t(num_blocks), 0);
  for (int64_t b = num_blocks; b-- > 0;) free_.push_back(int32_t(b));
}

int32_t BlockAllocator::ref_count(int32_t block) const {
  LOCKSTEP_CHECK(block >= 0 && block < num_blocks(), "block allocator: block ", block,
                 " is outside [0, ", num_blocks(), ")");
  return refs_[size_t(block)];
}

void BlockAllocator::check_held(int32_t block, const char* op) const {
  LOCKSTEP_CHECK(ref_count(block) > 0, "block allocator: ", op, " of block ", block,
                 ", which is free");
}

int32_t BlockAllocator::allocate() {
  LOCKSTEP_CHECK(!free_.empty(), "block allocator: all ", num_blocks(), " blocks are in use");
  const int32_t block = free_.back();
  free_.pop_back();
  refs_[size_t(block)] = 1;
  return block;
}

void BlockAllocator::retain(int32_t block) {
  check_held(block, "retain");
  ++refs_[size_t(block)];
}

void BlockAllocator::release(int32_t block) {
  check_held(block, "release");
  if (--refs_[size_t(block)] == 0) free_.push_back(block);
}

}  // namespace lockstep
