// ops/cpu/kv_fp8.h — one head through ops/kv_fp8.h's rule on the CPU: quantized (the cache's bytes
// and scale) and dequantized (its values), for round_kv_to_fp8 and the paged attention's reads.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtypes.h"
#include "numerics/scale.h"
#include "ops/kv_fp8.h"

namespace lockstep::cpu {

// x [d] to q [d]; returns the scale.
inline float quantize_kv_head(const float* x, int64_t d, uint8_t* q) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, abs_bits(x[i]));
  const float scale = kv_fp8_scale(amax), inv = inverse_scale(scale);
  for (int64_t i = 0; i < d; ++i) q[i] = quantize_value(x[i], inv);
  return scale;
}

// q [d] times scale to x [d], rounded to `dtype` (f32, or bf16: exact but below 2^-126).
inline void dequantize_kv_head(const uint8_t* q, float scale, int64_t d, DType dtype, float* x) {
  for (int64_t i = 0; i < d; ++i) {
    const float value = e4m3_to_float(e4m3{q[i]}) * scale;
    x[i] = dtype == DType::bf16 ? round_to_bf16(value) : value;
  }
}

}  // namespace lockstep::cpu
