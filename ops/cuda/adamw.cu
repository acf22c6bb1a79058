// ops/cuda/adamw.cu — CUDA AdamW (ops/adamw.h): the update of ops/adamw_element.h, so the same bits
// as the CPU reference, and the copies of the updated param in the same pass.
//
// Memory-bound: every element of param, m, v and grad is read once and param, m, v (and the
// copies) written once, with 16-byte loads.
// - Without an fp8 copy: 4 consecutive elements a thread, any shape (a scalar tail).
// - With one: a CTA per 128×128 block of param [N, K]. Each thread updates its Fragment's share
//   (8 rows × 4 columns, numerics/cuda/quantize_device.cuh) row by row, keeping the new values in
//   registers; the CTA then quantizes the block exactly as quantize_weight does (block amax,
//   W's bytes, Wᵀ's bytes through shared memory, both scales) without reading param again.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "numerics/cuda/quantize_device.cuh"
#include "ops/adamw_backends.h"

namespace lockstep::cuda {

namespace {

using namespace quant;

constexpr int kThreads = 256;

// Four values rounded to bf16 (as convert does), for one 8-byte store.
__device__ __forceinline__ uint2 to_bf16x4(const float4& x) {
  const auto b = [](float f) { return uint32_t(float_to_bf16(f).bits); };
  return make_uint2(b(x.x) | b(x.y) << 16, b(x.z) | b(x.w) << 16);
}

// Elements i .. i + 3 (all below n), updated in place; their bf16 copy when bf16 is not null.
__device__ __forceinline__ float4 update4(float* p, float* m, float* v, const float* g, int64_t i,
                                          const AdamWScalars& s, uint16_t* bf16) {
  float4 pv = *reinterpret_cast<const float4*>(p + i);
  float4 mv = *reinterpret_cast<const float4*>(m + i);
  float4 vv = *reinterpret_cast<const float4*>(v + i);
  const float4 gv = *reinterpret_cast<const float4*>(g + i);
  adamw_element(pv.x, mv.x, vv.x, gv.x, s);
  adamw_element(pv.y, mv.y, vv.y, gv.y, s);
  adamw_element(pv.z, mv.z, vv.z, gv.z, s);
  adamw_element(pv.w, mv.w, vv.w, gv.w, s);
  *reinterpret_cast<float4*>(p + i) = pv;
  *reinterpret_cast<float4*>(m + i) = mv;
  *reinterpret_cast<float4*>(v + i) = vv;
  if (bf16) *reinterpret_cast<uint2*>(bf16 + i) = to_bf16x4(pv);
  return pv;
}

__global__ void __launch_bounds__(kThreads) adamw_kernel(float* __restrict__ p, float* __restrict__ m,
                                                        float* __restrict__ v, const float* __restrict__ g,
                                                        int64_t n, AdamWScalars s,
                                                        uint16_t* __restrict__ bf16) {
  const int64_t i = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * 4;
  if (i + 4 <= n) {
    update4(p, m, v, g, i, s, bf16);
    return;
  }
  for (int64_t k = i; k < n; ++k) {  // the last n % 4 elements
    adamw_element(p[k], m[k], v[k], g[k], s);
    if (bf16) bf16[k] = float_to_bf16(p[k]).bits;
  }
}

using Frag = Fragment<float>;

// param [N, K]; block b of the grid is the 128×128 block (b / (K/128), b % (K/128)). Two CTAs an
// SM (64 registers, a few bytes spilled), so that one loads while the other quantizes.
__global__ void __launch_bounds__(Frag::kThreads, 2) adamw_fp8_kernel(
    float* __restrict__ p, float* __restrict__ m, float* __restrict__ v, const float* __restrict__ g,
    int64_t N, int64_t K, AdamWScalars s, uint16_t* __restrict__ bf16, Fp8WeightOut out, bool pow2) {
  __shared__ alignas(16) uint8_t tq[kTile * kTile];
  __shared__ uint32_t warp_max[Frag::kThreads / 32];
  const int64_t blocks_k = K / kTile;
  const int64_t n0 = blockIdx.x / blocks_k * kTile, k0 = blockIdx.x % blocks_k * kTile;
  Frag f;
#pragma unroll
  for (int r = 0; r < Frag::kRows; ++r) {
    const float4 x = update4(p, m, v, g, (n0 + Frag::row0() + r) * K + k0 + Frag::col0(), s, bf16);
    f.raw[r] = make_uint4(__float_as_uint(x.x), __float_as_uint(x.y), __float_as_uint(x.z),
                          __float_as_uint(x.w));
  }
  quantize_weight_tile(f, n0, k0, N, K, out, pow2, tq, warp_max);
}

void check_aligned(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t.data()) % 16 == 0, what,
                 ": the CUDA AdamW step needs 16-byte aligned data, got ", t.describe(), " at ",
                 t.data());
}

}  // namespace

void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWScalars& s,
                Tensor* bf16, Fp8Weight* fp8, bool pow2) {
  check_aligned(param, "adamw_step: param");
  check_aligned(m, "adamw_step: m");
  check_aligned(v, "adamw_step: v");
  check_aligned(grad, "adamw_step: grad");
  if (bf16) check_aligned(*bf16, "adamw_step: bf16 copy");
  if (fp8) {
    check_aligned(fp8->w.data, "adamw_step: fp8 copy.w");
    check_aligned(fp8->wt.data, "adamw_step: fp8 copy.wt");
  }
  const int64_t n = param.numel();
  if (n == 0) return;
  float* p = param.data_as<float>();
  float* mp = m.data_as<float>();
  float* vp = v.data_as<float>();
  const float* g = grad.data_as<float>();
  uint16_t* b = bf16 ? static_cast<uint16_t*>(bf16->data()) : nullptr;
  if (fp8) {
    const int64_t N = param.dim(0), K = param.dim(1);
    adamw_fp8_kernel<<<unsigned((N / kTile) * (K / kTile)), Frag::kThreads, 0, current_stream()>>>(
        p, mp, vp, g, N, K, s, b, fp8_weight_out(*fp8), pow2);
  } else {
    const int64_t quads = (n + 3) / 4;
    adamw_kernel<<<unsigned((quads + kThreads - 1) / kThreads), kThreads, 0, current_stream()>>>(
        p, mp, vp, g, n, s, b);
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
