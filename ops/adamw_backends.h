// ops/adamw_backends.h — per-backend entry points for ops/adamw.h; arguments are checked by
// ops/adamw.cpp.
#pragma once

#include <cstdint>

#include "ops/adamw.h"

namespace lockstep::cpu {
void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWHyper& hyper,
                int64_t step, float grad_scale);
}  // namespace lockstep::cpu
