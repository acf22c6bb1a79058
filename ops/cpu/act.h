// ops/cpu/act.h — reading and writing activation tensors (f32 or bf16) as fp32 on the CPU.
// Every CPU op computes in fp32 and rounds once (to nearest even) when it stores to bf16.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace lockstep::cpu {

// dst[i] = t[offset + i] as fp32, for i < n.
inline void read_f32(const Tensor& t, int64_t offset, int64_t n, float* dst) {
  if (t.dtype() == DType::f32) {
    const float* p = t.data_as<float>() + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = p[i];
  } else {
    const bf16* p = t.data_as<bf16>() + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(p[i]);
  }
}

// t[offset + i] = src[i], rounded to t's dtype.
inline void write_f32(Tensor& t, int64_t offset, int64_t n, const float* src) {
  if (t.dtype() == DType::f32) {
    float* p = t.data_as<float>() + offset;
    for (int64_t i = 0; i < n; ++i) p[i] = src[i];
  } else {
    bf16* p = t.data_as<bf16>() + offset;
    for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(src[i]);
  }
}

}  // namespace lockstep::cpu
