// rollout/scheduler.cpp
#include "rollout/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace lockstep {

Scheduler::Scheduler(int64_t num_blocks, int64_t block_size, int64_t max_step_tokens,
                     int64_t max_step_sequences)
    : block_size_(block_size),
      max_step_tokens_(max_step_tokens),
      max_step_sequences_(max_step_sequences),
      allocator_(num_blocks) {
  LOCKSTEP_CHECK(block_size > 0, "scheduler: block_size must be positive, got ", block_size);
  LOCKSTEP_CHECK(max_step_tokens > 0, "scheduler: max_step_tokens must be positive, got ",
                 max_step_tokens);
  LOCKSTEP_CHECK(max_step_sequences > 0, "scheduler: max_step_sequences must be positive, got ",
                 max_step_sequences);
}

int64_t Scheduler::add(int64_t length) {
  LOCKSTEP_CHECK(length > 0, "scheduler: a sequence needs at least one token, got ", length);
  seqs_.push_back({length, 0, {}});
  waiting_.push_back(int64_t(seqs_.size()) - 1);
  return int64_t(seqs_.size()) - 1;
}

int64_t Scheduler::fork(int64_t seq, int64_t count) {
  const auto at = std::find(running_.begin(), running_.end(), seq);
  LOCKSTEP_CHECK(at != running_.end(), "scheduler: fork of sequence ", seq,
                 ", which is not running");
  const int64_t first = int64_t(seqs_.size());
  for (int64_t i = 0; i < count; ++i) {
    Seq copy = seqs_[size_t(seq)];
    for (int32_t b : copy.blocks) allocator_.retain(b);
    seqs_.push_back(std::move(copy));
  }
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) ids[size_t(i)] = first + i;
  running_.insert(at + 1, ids.begin(), ids.end());
  return first;
}

void Scheduler::append(int64_t seq) { ++seqs_.at(size_t(seq)).length; }

void Scheduler::finish(int64_t seq) {
  const auto at = std::find(running_.begin(), running_.end(), seq);
  LOCKSTEP_CHECK(at != running_.end(), "scheduler: finish of sequence ", seq,
                 ", which is not running");
  running_.erase(at);
  release_blocks(seqs_[size_t(seq)]);
}

void Scheduler::release_blocks(Seq& s) {
  for (int32_t b : s.blocks) allocator_.release(b);
  s.blocks.clear();
}

bool Scheduler::needs_copy(const Seq& s) const {
  // The table holds ceil(computed / B) blocks, so a position inside a block is in the last one.
  return s.computed % block_size_ != 0 && allocator_.ref_count(s.blocks.back()) > 1;
}

int64_t Scheduler::fitting_tokens(const Seq& s, int64_t want) const {
  const int64_t copy = needs_copy(s) ? 1 : 0, free = allocator_.free_blocks();
  if (free < copy) return 0;
  // The copy replaces a block of the table, so the table can grow by free − copy blocks.
  const int64_t room = (int64_t(s.blocks.size()) + free - copy) * block_size_ - s.computed;
  return std::min(want, room);
}

void Scheduler::reserve(int64_t seq, int64_t tokens, StepPlan& plan) {
  Seq& s = seqs_[size_t(seq)];
  if (needs_copy(s)) {
    const int32_t fresh = allocator_.allocate();
    plan.copies.push_back({s.blocks.back(), fresh});
    allocator_.release(s.blocks.back());  // still held by the others: the copy's source stays valid
    s.blocks.back() = fresh;
  }
  while (int64_t(s.blocks.size()) < blocks_for(s.computed + tokens))
    s.blocks.push_back(allocator_.allocate());
  plan.chunks.push_back({seq, s.computed, s.computed + tokens});
  s.computed += tokens;
}

void Scheduler::preempt_last_running() {
  const int64_t seq = running_.back();
  running_.pop_back();
  release_blocks(seqs_[size_t(seq)]);
  seqs_[size_t(seq)].computed = 0;
  waiting_.push_front(seq);  // victims are taken newest first, so the oldest ends up in front
  ++preemptions_;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = max_step_tokens_;
  const int64_t preempted_before = preemptions_;
  auto room_for_more = [&] {
    return budget > 0 && int64_t(plan.chunks.size()) < max_step_sequences_;
  };
  for (size_t i = 0; i < running_.size() && room_for_more(); ++i) {
    const int64_t seq = running_[i];
    const int64_t want = std::min(seqs_[size_t(seq)].length - seqs_[size_t(seq)].computed, budget);
    LOCKSTEP_CHECK(want > 0, "scheduler: running sequence ", seq,
                   " has no token to compute (append() or finish() it after sampling)");
    int64_t tokens = fitting_tokens(seqs_[size_t(seq)], want);
    while (tokens == 0 && running_.size() > i + 1) {
      preempt_last_running();
      tokens = fitting_tokens(seqs_[size_t(seq)], want);
    }
    if (tokens == 0) {
      // Only older sequences hold blocks now, so this one waits for them. The oldest holds the
      // whole cache by now: it fails only for a sequence longer than the cache (which callers
      // refuse up front, as the engine does).
      LOCKSTEP_CHECK(i > 0, "scheduler: sequence ", seq, " does not fit in the cache's ",
                     num_blocks(), " blocks even alone");
      preempt_last_running();
      break;
    }
    reserve(seq, tokens, plan);
    budget -= tokens;
  }
  // After a preemption the free blocks are needed by the running sequences next step: starting
  // new ones now would only get them preempted in turn.
  if (preemptions_ != preempted_before) return plan;
  while (!waiting_.empty() && room_for_more() && int64_t(running_.size()) < max_step_sequences_) {
    const int64_t seq = waiting_.front();
    const int64_t tokens =
        fitting_tokens(seqs_[size_t(seq)], std::min(seqs_[size_t(seq)].length, budget));
    if (tokens == 0) break;
    waiting_.pop_front();
    running_.push_back(seq);
    reserve(seq, tokens, plan);
    budget -= tokens;
  }
  return plan;
}

}  // namespace lockstep
