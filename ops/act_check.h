// ops/act_check.h — argument checks shared by the activation ops (ops/*.cpp).
#pragma once

#include "core/error.h"
#include "core/tensor.h"

namespace lockstep {

// An activation: f32 or bf16, on `device`, of exactly `shape`.
inline void check_act(const Tensor& t, const char* what, Device device, const Shape& shape) {
  LOCKSTEP_CHECK(t.defined(), what, ": tensor is empty (not allocated)");
  LOCKSTEP_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, what,
                 ": expected f32 or bf16, got ", t.describe());
  LOCKSTEP_CHECK(t.device() == device, what, ": on ", device_name(t.device()), ", expected ",
                 device_name(device));
  check_shape(t, what, shape);
}

#if LOCKSTEP_HAS_CUDA
#define LOCKSTEP_NO_CUDA_OP(name) fail(name ": no CUDA implementation yet (CPU tensors only)")
#else
#define LOCKSTEP_NO_CUDA_OP(name) fail(name ": this build has no CUDA backend")
#endif

}  // namespace lockstep
