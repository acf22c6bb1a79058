// ops/moe_combine_backends.h — per-backend entry points for ops/moe_combine.h; arguments are
// checked by ops/moe_combine.cpp.
#pragma once

#include "core/tensor.h"

namespace lockstep::cpu {
void moe_combine_forward(Tensor& out, const Tensor& rows, const Tensor& slots, const Tensor& weights);
void moe_combine_backward(Tensor& drows, Tensor& dweights, const Tensor& dout, const Tensor& rows,
                          const Tensor& slots, const Tensor& weights);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void moe_combine_forward(Tensor& out, const Tensor& rows, const Tensor& slots, const Tensor& weights);
void moe_combine_backward(Tensor& drows, Tensor& dweights, const Tensor& dout, const Tensor& rows,
                          const Tensor& slots, const Tensor& weights);
}  // namespace lockstep::cuda
