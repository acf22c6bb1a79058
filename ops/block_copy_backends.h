// ops/block_copy_backends.h — per-backend entry points for ops/block_copy.h; arguments (and, for
// CPU pairs, their values) are checked by ops/block_copy.cpp.
#pragma once

#include <span>

#include "core/tensor.h"

namespace lockstep::cpu {
void copy_blocks(std::span<Tensor> tensors, const Tensor& pairs);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void copy_blocks(std::span<Tensor> tensors, const Tensor& pairs);
}  // namespace lockstep::cuda
