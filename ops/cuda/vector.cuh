// ops/cuda/vector.cuh — what the CUDA layer kernels (ops/cuda/*.cu) share:
//
// - 8-element vectors moved with one 16-byte access (bf16) or two (f32), widened to fp32 exactly
//   and rounded back to bf16 to nearest even (the same bits as core/dtypes.h's float_to_bf16).
//   Callers guarantee 16-byte aligned addresses (the dispatchers check it).
// - Row kernels: a 2-D grid, blockIdx.x a slab of kRowThreads vectors of a row, blockIdx.y the row
//   (strided by gridDim.y, which CUDA caps at 65535).
// - Sums whose order is fixed by the launch shape alone, never by timing: block_sum, and the
//   cross-row column sums (RowParts + add_partial_sums), so results repeat bit for bit run to run.
// Include only from CUDA sources.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtypes.h"

namespace lockstep::cuda {

constexpr int kVec = 8;             // elements per vector
constexpr int kRowThreads = 256;    // threads of a row kernel's block
constexpr uint16_t kBf16NaN = 0x7fff;  // what float_to_bf16 makes of a NaN

__device__ __forceinline__ void unpack_bf16x8(const uint4& raw, float (&v)[kVec]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// lo in the low half. cvt.rn.bf16x2.f32 takes the high value first; it rounds like
// __float2bfloat16_rn (tested equal to float_to_bf16 over every float: tests/gpu/test_convert_gpu.cu).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&v)[kVec]) {
  return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]),
                    pack_bf16x2(v[6], v[7]));
}

__device__ __forceinline__ void load_bf16x8(const uint16_t* p, float (&v)[kVec]) {
  unpack_bf16x8(*reinterpret_cast<const uint4*>(p), v);
}

__device__ __forceinline__ void store_bf16x8(uint16_t* p, const float (&v)[kVec]) {
  *reinterpret_cast<uint4*>(p) = pack_bf16x8(v);
}

__device__ __forceinline__ void load_f32x8(const float* p, float (&v)[kVec]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void store_f32x8(float* p, const float (&v)[kVec]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

inline dim3 row_grid(int64_t rows, int64_t vectors_per_row) {
  return dim3(unsigned((vectors_per_row + kRowThreads - 1) / kRowThreads),
              unsigned(std::min<int64_t>(rows, 65535)));
}

// Σ v over the block, returned to every thread: a butterfly in each warp (every lane ends with the
// same bits), then the warp sums in warp order. blockDim.x: a multiple of 32. scratch: shared,
// one T per warp.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += scratch[w];
  __syncthreads();  // scratch is free again when this returns
  return total;
}

// Cross-row sums: the rows are cut into `parts` runs of `rows_per_part` consecutive rows (the last
// may be shorter), a function of the row count alone. One block sums each run in row order into
// partial[part, :]; add_partial_sums then adds the parts. At most kMaxParts parts keeps the
// partials small (kMaxParts × columns floats) while giving the first pass enough blocks.
struct RowParts {
  static constexpr int64_t kMaxParts = 256;
  int64_t rows_per_part, parts;
  explicit RowParts(int64_t rows)
      : rows_per_part(std::max<int64_t>(1, (rows + kMaxParts - 1) / kMaxParts)),
        parts((rows + rows_per_part - 1) / rows_per_part) {}
};

// out[c] += Σ_p partial[p * n + c] for c < n, in a fixed order (ops/cuda/elementwise.cu).
void add_partial_sums(float* out, const float* partial, int64_t parts, int64_t n);

}  // namespace lockstep::cuda
