// ops/block_copy.h — copying whole blocks (dim-0 rows) of paged-cache tensors: the rollout
// engine's copy-on-write of KV blocks, every layer's K and V in one call (one kernel on CUDA).
//
// For each pair (src, dst) of `pairs` (i32 [C, 2]) and each tensor t of `tensors`: t[dst] = t[src].
// `tensors`: at least one, all of one shape [N, ...], dtype and device (the pairs' device).
//
// The pairs of one call run at once, so no block that a pair writes may be read or written by
// another pair of the call: the caller puts dependent copies in separate calls, in order
// (independent_copies finds the split). CPU pairs are checked for this and for indices in [0, N);
// CUDA pairs are not read on the host (that would need a sync): there a pair whose dst is outside
// [0, N) copies nothing, and one whose src alone is outside fills its dst block with 0xFF bytes
// (NaN in f32, bf16 and e4m3), which the trainer's non-finite checks catch.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace lockstep {

void copy_blocks(std::span<Tensor> tensors, const Tensor& pairs);

// How many leading pairs of `pairs` (src0, dst0, src1, dst1, ... in host memory) one copy_blocks
// call may take: the pairs before the first that writes a block an earlier one reads or writes,
// or reads a block an earlier one writes.
int64_t independent_copies(std::span<const int32_t> pairs);

}  // namespace lockstep
