// ops/cuda/adamw.cu — CUDA AdamW (ops/adamw.h): the update of ops/adamw_element.h, so the same bits
// as the CPU reference, and the copies of the updated param in the same pass.
//
// Memory-bound: every element of param, m, v and grad is read once and param, m, v (and the
// copies) written once, with 16-byte accesses; what keeps HBM busy is the bytes in flight, so each
// thread issues all the loads of several float4s of the four tensors before any arithmetic
// (update_quads: 8 loads, 128 bytes a thread).
// - Without an fp8 copy: a thread takes 2 float4s (a block's 2 × 256 float4s are consecutive, so
//   each warp access is 512 contiguous bytes), any shape (a scalar tail).
// - With one: a CTA of 512 threads per 128×128 block of param [N, K], each thread owning a
//   Fragment's share (8 rows × 4 columns, numerics/cuda/quantize_device.cuh). It updates its rows
//   two at a time and parks the new values in shared memory (its own 16-byte slots: no barrier, no
//   registers held across the loads); the CTA then quantizes the block exactly as quantize_weight
//   does (block amax, W's bytes, Wᵀ's bytes through shared memory, both scales) without reading
//   param again. Two CTAs an SM (64 registers, 80 KB of shared memory each), so that one streams
//   while the other quantizes.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_launch.h"
#include "core/cuda_stream.h"
#include "numerics/cuda/quantize_device.cuh"
#include "ops/adamw_backends.h"

namespace lockstep::cuda {

namespace {

using namespace quant;

constexpr int kThreads = 256;  // the plain kernel's block
constexpr int kQuads = 2;      // float4s of each tensor a thread of either kernel has in flight

// Four values rounded to bf16 (as convert does), for one 8-byte store.
__device__ __forceinline__ uint2 to_bf16x4(const float4& x) {
  const auto b = [](float f) { return uint32_t(float_to_bf16(f).bits); };
  return make_uint2(b(x.x) | b(x.y) << 16, b(x.z) | b(x.w) << 16);
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store4(float* p, const float4& x) { *reinterpret_cast<float4*>(p) = x; }

// Elements i[j] .. i[j] + 3 for each j (all below n, 16-byte aligned) updated in place, all loads
// issued before any arithmetic; their bf16 copy when bf16 is not null; the new params also to out.
template <int kN>
__device__ __forceinline__ void update_quads(float* p, float* m, float* v, const float* g, const int64_t (&i)[kN],
                                             const AdamWScalars& s, uint16_t* bf16, float4 (&out)[kN]) {
  float4 mv[kN], vv[kN], gv[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    out[j] = load4(p + i[j]);
    mv[j] = load4(m + i[j]);
    vv[j] = load4(v + i[j]);
    gv[j] = load4(g + i[j]);
  }
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    adamw_element(out[j].x, mv[j].x, vv[j].x, gv[j].x, s);
    adamw_element(out[j].y, mv[j].y, vv[j].y, gv[j].y, s);
    adamw_element(out[j].z, mv[j].z, vv[j].z, gv[j].z, s);
    adamw_element(out[j].w, mv[j].w, vv[j].w, gv[j].w, s);
    store4(p + i[j], out[j]);
    store4(m + i[j], mv[j]);
    store4(v + i[j], vv[j]);
    if (bf16) *reinterpret_cast<uint2*>(bf16 + i[j]) = to_bf16x4(out[j]);
  }
}

// Block b: elements [b·2048, (b + 1)·2048), float4 j of thread t at 4·(j·256 + t).
__global__ void __launch_bounds__(kThreads, 4) adamw_kernel(float* __restrict__ p, float* __restrict__ m,
                                                           float* __restrict__ v, const float* __restrict__ g,
                                                           int64_t n, AdamWScalars s,
                                                           uint16_t* __restrict__ bf16) {
  int64_t i[kQuads];
#pragma unroll
  for (int j = 0; j < kQuads; ++j) i[j] = (int64_t(blockIdx.x) * kQuads * kThreads + j * kThreads + threadIdx.x) * 4;
  if (i[kQuads - 1] + 4 <= n) {
    float4 updated[kQuads];
    update_quads(p, m, v, g, i, s, bf16, updated);
    return;
  }
  for (int j = 0; j < kQuads; ++j)  // the last block: whole float4s, then a scalar tail
    for (int64_t k = i[j]; k < std::min(i[j] + 4, n); ++k) {
      adamw_element(p[k], m[k], v[k], g[k], s);
      if (bf16) bf16[k] = float_to_bf16(p[k]).bits;
    }
}

using Frag = Fragment<float>;

// Dynamic shared memory of adamw_fp8_kernel: the block's updated params, word r of thread t (its
// Fragment's row r) at [r * kThreads + t], so a warp's 16-byte accesses are consecutive.
constexpr size_t kParkedBytes = sizeof(Frag) * Frag::kThreads;

// param [N, K]; block b of the grid is the 128×128 block (b / (K/128), b % (K/128)).
__global__ void __launch_bounds__(Frag::kThreads, 2) adamw_fp8_kernel(
    float* __restrict__ p, float* __restrict__ m, float* __restrict__ v, const float* __restrict__ g,
    int64_t N, int64_t K, AdamWScalars s, uint16_t* __restrict__ bf16, Fp8WeightOut out, bool pow2) {
  extern __shared__ uint4 parked[];
  __shared__ alignas(16) uint8_t tq[kTile * kTile];
  __shared__ uint32_t warp_max[Frag::kThreads / 32];
  const int64_t blocks_k = K / kTile;
  const int64_t n0 = blockIdx.x / blocks_k * kTile, k0 = blockIdx.x % blocks_k * kTile;
  const int64_t first = (n0 + Frag::row0()) * K + k0 + Frag::col0();
  uint4* const mine = parked + threadIdx.x;
#pragma unroll 1
  for (int r = 0; r < Frag::kRows; r += kQuads) {
    int64_t i[kQuads];
    float4 updated[kQuads];
#pragma unroll
    for (int j = 0; j < kQuads; ++j) i[j] = first + (r + j) * K;
    update_quads(p, m, v, g, i, s, bf16, updated);
#pragma unroll
    for (int j = 0; j < kQuads; ++j)
      mine[(r + j) * Frag::kThreads] = make_uint4(__float_as_uint(updated[j].x), __float_as_uint(updated[j].y),
                                                  __float_as_uint(updated[j].z), __float_as_uint(updated[j].w));
  }
  Frag f;
#pragma unroll
  for (int r = 0; r < Frag::kRows; ++r) f.raw[r] = mine[r * Frag::kThreads];
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
    allow_dynamic_smem<adamw_fp8_kernel>(kParkedBytes);
    const int64_t N = param.dim(0), K = param.dim(1);
    adamw_fp8_kernel<<<unsigned((N / kTile) * (K / kTile)), Frag::kThreads, kParkedBytes, current_stream()>>>(
        p, mp, vp, g, N, K, s, b, fp8_weight_out(*fp8), pow2);
  } else {
    const int64_t per_block = int64_t(kThreads) * kQuads * 4;
    adamw_kernel<<<unsigned((n + per_block - 1) / per_block), kThreads, 0, current_stream()>>>(
        p, mp, vp, g, n, s, b);
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
