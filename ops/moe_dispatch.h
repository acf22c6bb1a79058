// ops/moe_dispatch.h — the plan that sends a sparse (mixture-of-experts) layer's tokens to their
// experts (model/moe.h's MoeDispatch): the (token, j) pairs of expert_ids [T, k] sorted by expert,
// and within an expert in (token, j) order (a stable counting sort):
//   offsets      i64 [E + 1]  expert e owns rows [offsets[e], offsets[e + 1]); offsets[E] = T·k
//   token_of_row i32 [T·k]    the token each row gathers
//   slots        i32 [T, k]   the row of (t, j)
// E = offsets.dim(0) − 1. On the CPU every id is checked to lie in [0, E). On CUDA the ids are
// taken as valid (moe_route_forward's, or replayed ones the model checked on the host; one outside
// [0, E) is clamped into it) and nothing is read back, so a CUDA graph can hold the op: one block
// counts the experts' rows in shared memory, a warp prefix-sums them, and the rows are placed 32 at
// a time in (t, j) order, each warp's after the previous warp's.
#pragma once

#include "core/tensor.h"

namespace lockstep {

void moe_dispatch(Tensor& offsets, Tensor& token_of_row, Tensor& slots, const Tensor& expert_ids);

}  // namespace lockstep
