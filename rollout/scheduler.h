// rollout/scheduler.h — continuous batching over a paged KV cache: which tokens of which sequences
// go through the model in each step, and in which cache blocks their k/v live.
//
// A sequence is `length` tokens (its prompt, then its generated tokens), of which the first
// `computed` have their k/v in the cache: block i of its table holds positions [i·B, (i+1)·B), B =
// block_size, and it holds exactly ceil(computed / B) blocks. Waiting sequences hold none.
// Running sequences are kept in the order they started (oldest first).
//
// Each step, schedule():
//   1. gives each running sequence, oldest first, its uncomputed tokens (one for a sequence that
//      decodes, a chunk for one whose prompt is being prefilled), cut to the step's token budget
//      and to what the free blocks hold. When not even one token fits, the most recently started
//      running sequence is preempted: its blocks are released, computed = 0, and it goes to the
//      front of the waiting queue, to be recomputed later from all its tokens (prompt + generated
//      so far) — never dropped. So the oldest sequence always advances, and every sequence that
//      fits the cache on its own finishes.
//   2. starts waiting sequences, in queue order, while the budget, the free blocks and the
//      sequence limit allow (starting never preempts anyone).
// The planned chunks count as computed once schedule() returns: the caller runs them.
//
// Blocks may be shared (fork(): the n samples of one prompt hold its blocks together). Before a
// sequence writes into a shared block, the block is copied to a fresh one that the sequence then
// holds alone (copy-on-write); the plan lists these copies, which the caller makes — every layer's
// k and v rows of the block — before the step's forward. Only a prompt's partially filled last
// block is ever written while shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "rollout/block_allocator.h"

namespace lockstep {

// Tokens [begin, end) of sequence `seq` run this step.
struct ScheduledChunk {
  int64_t seq, begin, end;
};

struct BlockCopy {
  int32_t src, dst;
};

struct StepPlan {
  std::vector<BlockCopy> copies;  // in order, before the forward
  std::vector<ScheduledChunk> chunks;
};

class Scheduler {
 public:
  // At most max_step_tokens tokens and max_step_sequences sequences per step (both ≥ 1).
  Scheduler(int64_t num_blocks, int64_t block_size, int64_t max_step_tokens,
            int64_t max_step_sequences);

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return allocator_.num_blocks(); }
  // Blocks a sequence of `tokens` tokens needs.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // A new sequence of `length` ≥ 1 tokens, none computed, at the back of the waiting queue.
  // Returns its id (0, 1, 2, ... in the order of add() and fork()).
  int64_t add(int64_t length);
  // `count` new sequences with ids [returned, returned + count), each a copy of running sequence
  // `seq` (length, computed, blocks — shared, one more reference each), started just after it.
  int64_t fork(int64_t seq, int64_t count);
  // One more token at the end of running sequence `seq` (a sampled one).
  void append(int64_t seq);
  // Running sequence `seq` is done: its blocks are released.
  void finish(int64_t seq);

  StepPlan schedule();

  bool idle() const { return running_.empty() && waiting_.empty(); }
  const std::vector<int32_t>& blocks(int64_t seq) const { return seqs_.at(size_t(seq)).blocks; }
  int64_t free_blocks() const { return allocator_.free_blocks(); }
  int64_t preemptions() const { return preemptions_; }

 private:
  struct Seq {
    int64_t length = 0, computed = 0;
    std::vector<int32_t> blocks;
  };

  // Whether writing position s.computed needs a copy of a shared block first.
  bool needs_copy(const Seq& s) const;
  // The most of s's next `want` tokens that the free blocks hold.
  int64_t fitting_tokens(const Seq& s, int64_t want) const;
  // Copies and allocates what s's next `tokens` tokens write to, and plans them.
  void reserve(int64_t seq, int64_t tokens, StepPlan& plan);
  void preempt_last_running();
  void release_blocks(Seq& s);

  int64_t block_size_, max_step_tokens_, max_step_sequences_;
  BlockAllocator allocator_;
  std::vector<Seq> seqs_;
  std::vector<int64_t> running_;  // oldest first
  std::deque<int64_t> waiting_;
  int64_t preemptions_ = 0;
};

}  // namespace lockstep
