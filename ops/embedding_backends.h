// ops/embedding_backends.h — per-backend entry points for ops/embedding.h; arguments are checked by
// ops/embedding.cpp (token ids too, for CPU tensors only).
#pragma once

#include "core/tensor.h"

namespace lockstep::cpu {
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table);
void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table);
void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout);
}  // namespace lockstep::cuda
