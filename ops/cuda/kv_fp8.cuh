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

}  // namespace lockstep::cuda::kv_fp8
