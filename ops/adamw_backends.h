// ops/adamw_backends.h — per-backend entry points for ops/adamw.h; arguments are checked and the
// step's scalars computed by ops/adamw.cpp.
#pragma once

#include "ops/adamw.h"
#include "ops/adamw_element.h"

namespace lockstep::cpu {
void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWScalars& s);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
// The step and, when not null, the copies (fp8 with pow2 scales when `pow2`), in one pass.
void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWScalars& s,
                Tensor* bf16, Fp8Weight* fp8, bool pow2);
}  // namespace lockstep::cuda
