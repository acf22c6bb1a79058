// The block allocator's reference counts, and the scheduler's chunking, copy-on-write of a shared
// partially filled block and preemption of the newest sequence.
#include <gtest/gtest.h>

#include "core/error.h"
#include "rollout/block_allocator.h"
#include "rollout/scheduler.h"

namespace lockstep {
namespace {

TEST(BlockAllocator, CountsReferences) {
  BlockAllocator a(3);
  const int32_t b0 = a.allocate(), b1 = a.allocate();
  EXPECT_NE(b0, b1);
  EXPECT_EQ(a.free_blocks(), 1);
  a.retain(b0);
  EXPECT_EQ(a.ref_count(b0), 2);
  a.release(b0);
  EXPECT_EQ(a.ref_count(b0), 1);
  EXPECT_EQ(a.free_blocks(), 1);  // still held once
  a.release(b0);
  EXPECT_EQ(a.ref_count(b0), 0);
  EXPECT_EQ(a.free_blocks(), 2);
  EXPECT_THROW(a.release(b0), Error);
  EXPECT_THROW(a.retain(b0), Error);
  EXPECT_EQ(a.allocate(), b0);  // the last freed comes back first
  a.allocate();
  EXPECT_EQ(a.free_blocks(), 0);
  EXPECT_THROW(a.allocate(), Error);
  EXPECT_THROW(BlockAllocator(0), Error);
}

TEST(Scheduler, ChunksPromptsUnderTheTokenBudget) {
  Scheduler s(8, 4, 5, 8);
  const int64_t a = s.add(12);
  std::vector<std::pair<int64_t, int64_t>> chunks;
  while (chunks.empty() || chunks.back().second < 12) {
    const StepPlan plan = s.schedule();
    ASSERT_EQ(plan.chunks.size(), 1u);
    EXPECT_EQ(plan.chunks[0].seq, a);
    chunks.emplace_back(plan.chunks[0].begin, plan.chunks[0].end);
  }
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 10}, {10, 12}}));
  EXPECT_EQ(s.blocks(a).size(), 3u);
}

// A prompt of 6 tokens in blocks of 4, forked into 3 samples: the full first block stays shared;
// the half-filled second block is copied for the first two writers, the third writes in place.
TEST(Scheduler, CopiesASharedBlockBeforeWritingIt) {
  Scheduler s(8, 4, 100, 8);
  const int64_t parent = s.add(6);
  StepPlan plan = s.schedule();
  EXPECT_TRUE(plan.copies.empty());
  const std::vector<int32_t> prompt_blocks = s.blocks(parent);
  ASSERT_EQ(prompt_blocks.size(), 2u);
  s.append(parent);
  const int64_t first = s.fork(parent, 2);
  EXPECT_EQ(s.blocks(first), prompt_blocks);
  EXPECT_EQ(s.blocks(first + 1), prompt_blocks);

  plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 3u);
  for (const ScheduledChunk& c : plan.chunks) {
    EXPECT_EQ(c.begin, 6);
    EXPECT_EQ(c.end, 7);
  }
  ASSERT_EQ(plan.copies.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<int32_t>& table = s.blocks(plan.chunks[i].seq);
    EXPECT_EQ(table[0], prompt_blocks[0]);
    EXPECT_EQ(plan.copies[i].src, prompt_blocks[1]);
    EXPECT_EQ(plan.copies[i].dst, table[1]);
    EXPECT_NE(table[1], prompt_blocks[1]);
  }
  EXPECT_NE(plan.copies[0].dst, plan.copies[1].dst);
  EXPECT_EQ(s.blocks(plan.chunks[2].seq), prompt_blocks);
}

TEST(Scheduler, ForkAtABlockBoundaryCopiesNothing) {
  Scheduler s(8, 4, 100, 8);
  const int64_t parent = s.add(8);
  s.schedule();
  s.append(parent);
  const int64_t child = s.fork(parent, 1);
  const StepPlan plan = s.schedule();
  EXPECT_TRUE(plan.copies.empty());
  ASSERT_EQ(s.blocks(parent).size(), 3u);
  EXPECT_NE(s.blocks(parent)[2], s.blocks(child)[2]);
  EXPECT_EQ(s.blocks(parent)[1], s.blocks(child)[1]);
}

// 3 blocks of 2: two sequences of 2 tokens fill two blocks; when both need a third block, the
// newer one is preempted, waits while the older one advances, and comes back to be recomputed
// from all its tokens (in chunks the free blocks hold).
TEST(Scheduler, PreemptsTheNewestAndResumesItFromScratch) {
  Scheduler s(3, 2, 100, 8);
  const int64_t a = s.add(2), b = s.add(2);
  EXPECT_EQ(s.schedule().chunks.size(), 2u);
  s.append(a);
  s.append(b);

  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].seq, a);
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_TRUE(s.blocks(b).empty());
  s.append(a);

  plan = s.schedule();  // a decodes in its own block; b restarts with the one free block
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].seq, a);
  EXPECT_EQ(plan.chunks[1].seq, b);
  EXPECT_EQ(plan.chunks[1].begin, 0);
  EXPECT_EQ(plan.chunks[1].end, 2);
  s.finish(a);

  plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].seq, b);
  EXPECT_EQ(plan.chunks[0].begin, 2);
  EXPECT_EQ(plan.chunks[0].end, 3);
  s.finish(b);
  EXPECT_TRUE(s.idle());
}

}  // namespace
}  // namespace lockstep
