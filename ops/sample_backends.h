// ops/sample_backends.h — per-backend entry points for ops/sample.h; arguments (and, for CPU
// tensors, the specs' values) are checked by ops/sample.cpp.
#pragma once

#include "core/tensor.h"

namespace lockstep::cpu {
void sample_tokens(Tensor& tokens, Tensor& logprobs, const Tensor& logits, const Tensor& specs);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void sample_tokens(Tensor& tokens, Tensor& logprobs, const Tensor& logits, const Tensor& specs);
}  // namespace lockstep::cuda
