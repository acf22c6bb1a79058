// ops/kv_fp8_backends.h — per-backend entry points for ops/kv_fp8.h; arguments are checked by
// ops/kv_fp8.cpp.
#pragma once

#include "core/tensor.h"
#include "ops/head_layout.h"

namespace lockstep::cpu {
void round_kv_to_fp8(Tensor& qkv, const HeadLayout& layout);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void round_kv_to_fp8(Tensor& qkv, const HeadLayout& layout);
}  // namespace lockstep::cuda
