// ops/swiglu_backends.h — per-backend entry points for ops/swiglu.h; arguments are checked by
// ops/swiglu.cpp.
#pragma once

#include "core/tensor.h"

namespace lockstep::cpu {
void swiglu_forward(Tensor& out, const Tensor& gate_up);
void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);
}  // namespace lockstep::cpu
