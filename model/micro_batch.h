// model/micro_batch.h — packing sequences into training batches and splitting a step's sequences
// into micro-batches under a token budget (gradients accumulate across them: Transformer::backward
// adds into grads()).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/transformer.h"

namespace lockstep {

// Sequences [first, last) of a step.
struct SequenceRange {
  size_t first = 0, last = 0;
};

// Consecutive sequences, in order, each range holding at most `token_budget` tokens (a sequence
// longer than the budget gets a range of its own). lengths: tokens per sequence, each > 0.
std::vector<SequenceRange> plan_micro_batches(std::span<const int64_t> lengths,
                                              int64_t token_budget);

// A TrainBatch on `device` from host arrays (tokens/targets of every row, cu_seqlens from 0 to the
// row count). Token and target ids are checked against `vocab_size` here, on the host: the CUDA
// ops do not read index values back.
TrainBatch make_train_batch(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                            std::span<const int32_t> cu_seqlens, int64_t vocab_size, Device device);

}  // namespace lockstep
