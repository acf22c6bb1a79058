// ops/cuda/moe_combine.cu — CUDA backend of ops/moe_combine.h (bf16 rows and activations).
//
// Forward and drows: row kernels (ops/cuda/vector.cuh), a thread per 8 columns of a token, walking
// the token's k rows in j order as the CPU does (the CPU's bits, up to the compilers' FMA
// contraction). dweights: one warp per (token, j); each lane sums its 8-column vectors in column
// order, then a butterfly adds the lanes: a fixed order, so the same bits every run.
#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/cuda/vector.cuh"
#include "ops/moe_combine_backends.h"

namespace lockstep::cuda {

namespace {

__global__ void combine_forward_kernel(uint16_t* __restrict__ out, const uint16_t* __restrict__ rows,
                                       const int32_t* __restrict__ slots, const float* __restrict__ weights,
                                       int64_t T, int64_t k, int64_t H) {
  const int64_t c = (int64_t(blockIdx.x) * kRowThreads + threadIdx.x) * kVec;
  if (c >= H) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float acc[kVec] = {};
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights ? weights[t * k + j] : 1.0f;
      float v[kVec];
      load_bf16x8(rows + int64_t(slots[t * k + j]) * H + c, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] += w * v[e];
    }
    store_bf16x8(out + t * H + c, acc);
  }
}

__global__ void combine_drows_kernel(uint16_t* __restrict__ drows, const uint16_t* __restrict__ dout,
                                     const int32_t* __restrict__ slots, const float* __restrict__ weights,
                                     int64_t T, int64_t k, int64_t H) {
  const int64_t c = (int64_t(blockIdx.x) * kRowThreads + threadIdx.x) * kVec;
  if (c >= H) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float d[kVec];
    load_bf16x8(dout + t * H + c, d);
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights ? weights[t * k + j] : 1.0f;
      float v[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] = w * d[e];
      store_bf16x8(drows + int64_t(slots[t * k + j]) * H + c, v);
    }
  }
}

constexpr int kWarpsPerBlock = 8;

__global__ void __launch_bounds__(kWarpsPerBlock * 32) combine_dweights_kernel(
    float* __restrict__ dweights, const uint16_t* __restrict__ dout, const uint16_t* __restrict__ rows,
    const int32_t* __restrict__ slots, int64_t T, int64_t k, int64_t H) {
  const int64_t pair = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // t·k + j
  const int lane = threadIdx.x % 32;
  if (pair >= T * k) return;
  const int64_t t = pair / k;
  const uint16_t* row = rows + int64_t(slots[pair]) * H;
  float sum = 0;
  for (int64_t c = int64_t(lane) * kVec; c < H; c += 32 * kVec) {
    float d[kVec], v[kVec];
    load_bf16x8(dout + t * H + c, d);
    load_bf16x8(row + c, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum += d[e] * v[e];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) dweights[pair] = sum;
}

}  // namespace

void moe_combine_forward(Tensor& out, const Tensor& rows, const Tensor& slots, const Tensor& weights) {
  const int64_t T = slots.dim(0), k = slots.dim(1), H = rows.dim(1);
  if (T == 0 || H == 0) return;
  combine_forward_kernel<<<row_grid(T, H / kVec), kRowThreads, 0, current_stream()>>>(
      static_cast<uint16_t*>(out.data()), static_cast<const uint16_t*>(rows.data()),
      slots.data_as<int32_t>(), weights.defined() ? weights.data_as<float>() : nullptr, T, k, H);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void moe_combine_backward(Tensor& drows, Tensor& dweights, const Tensor& dout, const Tensor& rows,
                          const Tensor& slots, const Tensor& weights) {
  const int64_t T = slots.dim(0), k = slots.dim(1), H = rows.dim(1);
  if (T == 0 || H == 0) return;
  cudaStream_t stream = current_stream();
  combine_drows_kernel<<<row_grid(T, H / kVec), kRowThreads, 0, stream>>>(
      static_cast<uint16_t*>(drows.data()), static_cast<const uint16_t*>(dout.data()),
      slots.data_as<int32_t>(), weights.defined() ? weights.data_as<float>() : nullptr, T, k, H);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  if (!weights.defined()) return;
  combine_dweights_kernel<<<unsigned((T * k + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                            stream>>>(dweights.data_as<float>(), static_cast<const uint16_t*>(dout.data()),
                                      static_cast<const uint16_t*>(rows.data()), slots.data_as<int32_t>(),
                                      T, k, H);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
