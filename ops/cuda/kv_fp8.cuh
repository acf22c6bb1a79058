// ops/cuda/kv_fp8.cuh — ops/kv_fp8.h's rule on the device, 8 values of a head a call: the bytes,
// scales and values of the CPU reference (ops/cpu/kv_fp8.h). Include only from CUDA sources.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "numerics/cuda/quantize_device.cuh"
#include "ops/kv_fp8.h"

namespace lockstep::cuda::kv_fp8 {

// max of abs_bits over the 8 bf16 in w (a bf16's magnitude bits, shifted, are its float's).
__device__ __forceinline__ uint32_t amax8(const uint4& w) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t x = quant::component(w, i);
    m = max(m, max(x & 0x7fffu, (x >> 16) & 0x7fffu));
  }
  return m << 16;
}

// The 8 bf16 in w times inv, as e4m3 (quantize_value's instruction): 8 bytes, in order.
__device__ __forceinline__ uint2 quantize8(const uint4& w, float inv) {
  auto lo = [](uint32_t x) { return __uint_as_float(x << 16); };
  auto hi = [](uint32_t x) { return __uint_as_float(x & 0xffff0000u); };
  return make_uint2(quant::pack4(lo(w.x), hi(w.x), lo(w.y), hi(w.y), inv),
                    quant::pack4(lo(w.z), hi(w.z), lo(w.w), hi(w.w), inv));
}

// 8 e4m3 bytes times scale, rounded to bf16 (fp32 product, one rounding: the CPU's dequantize_kv_head).
__device__ __forceinline__ uint4 dequantize8(const uint2& q, float scale) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? q.x : q.y;
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word >> (i % 2 * 16)), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// 4 e4m3 bytes (the first in the lowest) as 4 bf16, unscaled and exact: each byte's magnitude bits
// go to bits 4..10 of a bf16 and its sign to bit 15 (the number times 2^-120: e4m3's exponent bias
// is 7, bf16's 127; e4m3 subnormals land on bf16 subnormals, with the same scaling), then one bf16
// multiply by 2^120 restores it. Five instructions a pair, against six through f16 and f32.
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(uint32_t b) {
  const uint32_t p0 = __byte_perm(b, 0, 0x1404), p1 = __byte_perm(b, 0, 0x3424);  // bytes to bits 8..15
  const uint32_t r0 = ((p0 & 0x7f007f00u) >> 4) | (p0 & 0x80008000u);
  const uint32_t r1 = ((p1 & 0x7f007f00u) >> 4) | (p1 & 0x80008000u);
  const __nv_bfloat162 k = __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80));  // 2^120
  const __nv_bfloat162 v0 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&r0), k);
  const __nv_bfloat162 v1 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&r1), k);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&v0), *reinterpret_cast<const uint32_t*>(&v1));
}

}  // namespace lockstep::cuda::kv_fp8
