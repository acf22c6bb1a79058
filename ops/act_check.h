// ops/act_check.h — argument checks shared by the activation ops (ops/*.cpp).
#pragma once

#include <cstdint>

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

// What the CUDA layer kernels need of a tensor they access 16 bytes at a time: a 16-byte aligned
// start and, when `rows`, a last dimension of a multiple of 8 elements, so every row starts aligned.
inline void check_cuda_vectors(const Tensor& t, const char* what, bool rows) {
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t.data()) % 16 == 0, what,
                 ": the CUDA kernels need 16-byte aligned data, got ", t.describe(), " at ", t.data());
  LOCKSTEP_CHECK(!rows || (t.rank() >= 1 && t.dim(-1) % 8 == 0), what,
                 ": the CUDA kernels need rows of a multiple of 8 elements, got ", t.describe());
}

// A CUDA activation: bf16 (the CUDA layer kernels take no f32 activations), aligned as above.
inline void check_cuda_act(const Tensor& t, const char* what, bool rows = true) {
  LOCKSTEP_CHECK(t.dtype() == DType::bf16, what, ": the CUDA kernels take bf16 activations, got ",
                 t.describe());
  check_cuda_vectors(t, what, rows);
}

#if LOCKSTEP_HAS_CUDA
#define LOCKSTEP_NO_CUDA_OP(name) fail(name ": no CUDA implementation yet (CPU tensors only)")
#else
#define LOCKSTEP_NO_CUDA_OP(name) fail(name ": this build has no CUDA backend")
#endif

}  // namespace lockstep
