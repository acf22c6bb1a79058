// ops/cuda/kv_fp8.cuh — ops/kv_fp8.h's rule on the device, 8 values of a head a call: the bytes,
// scales and values of the CPU reference (ops/cpu/kv_fp8.h). Include only from CUDA sources.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "numerics/cuda/quantize_device.cuh"
#include "ops/kv_fp8.h"

namespace lockstep::cuda::kv_fp8 {

// max of abs_bits over the 8 bf16 in w (the quantize kernels' magnitude max, two at a time).
__device__ __forceinline__ uint32_t amax8(const uint4& w) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) m = quant::Bf16::max_magnitude(m, quant::component(w, i));
  return quant::Bf16::unpack_magnitude(m);
}

// The scale of a head held by a whole warp, 8 bf16 a lane in w (zeros in lanes past the head).
__device__ __forceinline__ float warp_head_scale(const uint4& w) {
  uint32_t amax = amax8(w);
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  return kv_fp8_scale(amax);
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
