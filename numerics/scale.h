// numerics/scale.h — the scale of one quantization group, shared by the CPU reference and the CUDA
// kernels so both compute it with the same operations (and so the same bits).
#pragma once

#include "core/dtypes.h"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace lockstep {

// |x| as an ordered integer: for non-negative floats the bit patterns sort like the values, and
// NaN (> 0x7f800000) sorts above infinity, so an integer max finds amax and catches non-finite
// values at once (fmaxf would silently drop NaN).
LOCKSTEP_HD uint32_t abs_bits(float x) { return float_bits(x) & 0x7fffffffu; }

constexpr uint32_t kInfBits = 0x7f800000u;
constexpr uint32_t kFloatMinNormalBits = 0x00800000u;

// amax_bits: max of abs_bits over the group. pow2: round the scale up to a power of two.
LOCKSTEP_HD float group_scale(uint32_t amax_bits, bool pow2) {
  if (amax_bits >= kInfBits) return bits_float(0x7fc00000u);  // NaN or inf in the group
  if (amax_bits == 0) return 1.0f;                            // all zeros: any scale is exact
  float s = bits_float(amax_bits) / kE4M3Max;
  // Tiny groups: keep the scale a normal float so x / scale never divides by zero.
  if (float_bits(s) < kFloatMinNormalBits) s = bits_float(kFloatMinNormalBits);
  if (pow2) s = e8m0_to_float(float_to_e8m0_ceil(s));
  return s;
}

// What quantize_value multiplies by: one IEEE division per group (exact on both sides: nvcc
// divides correctly rounded unless told -use_fast_math), so each element costs one multiply.
LOCKSTEP_HD float inverse_scale(float scale) { return 1.0f / scale; }

// x · (1/scale) rounded to E4M3 (nearest even, saturating); a NaN scale gives the NaN code.
LOCKSTEP_HD uint8_t quantize_value(float x, float inv_scale) {
#if defined(__CUDA_ARCH__)
  // The hardware conversion; tested bit-identical to float_to_e4m3 over every fp32 pattern.
  return __nv_cvt_float_to_fp8(x * inv_scale, __NV_SATFINITE, __NV_E4M3);
#else
  return float_to_e4m3(x * inv_scale).bits;
#endif
}

}  // namespace lockstep
