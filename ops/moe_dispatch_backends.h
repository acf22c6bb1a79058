// ops/moe_dispatch_backends.h — per-backend entry points for ops/moe_dispatch.h; arguments are
// checked by ops/moe_dispatch.cpp.
#pragma once

#include "core/tensor.h"

namespace lockstep::cpu {
void moe_dispatch(Tensor& offsets, Tensor& token_of_row, Tensor& slots, const Tensor& expert_ids);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void moe_dispatch(Tensor& offsets, Tensor& token_of_row, Tensor& slots, const Tensor& expert_ids);
}  // namespace lockstep::cuda
