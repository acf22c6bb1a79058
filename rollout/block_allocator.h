// rollout/block_allocator.h — the KV cache's blocks (model/kv_cache.h) with reference counts.
//
// A block is free or held by one or more sequences: the n samples of one prompt share the
// prompt's blocks (each holds a reference), and a block is free again when its last holder lets go.
// A sequence may write into a block only while it is the sole holder (ref_count == 1); a shared
// block is copied first (copy-on-write, rollout/scheduler.h).
//
// Blocks are handed out lowest id first at the start, then most recently freed first: placement
// depends only on the sequence of calls, so a run is reproducible.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  int64_t num_blocks() const { return int64_t(refs_.size()); }
  int64_t free_blocks() const { return int64_t(free_.size()); }
  int32_t ref_count(int32_t block) const;

  // A free block, now held once. Throws when none is free.
  int32_t allocate();
  // One more holder of a held block.
  void retain(int32_t block);
  // One holder fewer; the block is free when none is left.
  void release(int32_t block);

 private:
  void check_held(int32_t block, const char* op) const;

  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack
};

}  // namespace lockstep
