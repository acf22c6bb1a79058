// The block allocator's reference counts, and the scheduler's chunking, copy-on-write of a shared
// partially filled block and preemption of the newest sequence.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

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

// Random sequences, some forked into samples once their prompt is computed, grow to random
// lengths through a cache far too small for all of them. After every step: no chunk writes into a
// block another sequence holds, tables hold exactly the computed positions, the free count matches
// the blocks held; every sequence reaches its length, and all blocks come back.
TEST(Scheduler, KeepsItsInvariantsUnderRandomLoad) {
  constexpr int64_t kBlocks = 10, kBlockSize = 3;
  Scheduler s(kBlocks, kBlockSize, 7, 4);
  std::mt19937_64 rng(1);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::map<int64_t, int64_t> length, target, forks;  // by sequence id
  for (int i = 0; i < 12; ++i) {
    const int64_t prompt = uniform(1, 9), id = s.add(prompt);
    length[id] = prompt;
    target[id] = prompt + uniform(1, 8);  // at most 25 ≤ 30 slots: fits alone
    forks[id] = uniform(0, 1) * uniform(1, 3);
  }
  int64_t finished = 0, steps = 0;
  while (!s.idle()) {
    ASSERT_LT(++steps, 5000) << "no progress";
    const StepPlan plan = s.schedule();
    ASSERT_FALSE(plan.chunks.empty());
    std::map<int32_t, int> holders;
    for (const auto& [id, len] : length)
      for (int32_t b : s.blocks(id)) ++holders[b];
    EXPECT_EQ(s.free_blocks(), kBlocks - int64_t(holders.size()));
    for (const BlockCopy& c : plan.copies) EXPECT_GE(holders[c.src], 1);
    for (const ScheduledChunk& c : plan.chunks) {
      const std::vector<int32_t>& table = s.blocks(c.seq);
      EXPECT_EQ(int64_t(table.size()), (c.end + kBlockSize - 1) / kBlockSize);
      EXPECT_LT(c.begin, c.end);
      EXPECT_LE(c.end, length[c.seq]);
      for (int64_t p = c.begin; p < c.end; ++p)
        EXPECT_EQ(holders[table[size_t(p / kBlockSize)]], 1)
            << "sequence " << c.seq << " writes position " << p << " into a shared block";
    }
    for (const ScheduledChunk& c : plan.chunks) {
      if (c.end < length[c.seq]) continue;
      std::vector<int64_t> done = {c.seq};
      if (forks[c.seq] > 0) {
        const int64_t first = s.fork(c.seq, forks[c.seq]);
        for (int64_t i = first; i < first + forks[c.seq]; ++i) {
          length[i] = length[c.seq];
          target[i] = length[c.seq] + uniform(1, 8);
          done.push_back(i);
        }
        forks[c.seq] = 0;
      }
      for (int64_t id : done) {
        if (++length[id] == target[id]) {
          s.finish(id);
          ++finished;
        } else {
          s.append(id);
        }
      }
    }
  }
  EXPECT_EQ(finished, int64_t(target.size()));
  EXPECT_EQ(s.free_blocks(), kBlocks);
  EXPECT_GT(s.preemptions(), 0);
}

}  // namespace
}  // namespace lockstep
