// ops/cuda/embedding.cu — CUDA backend of ops/embedding.h (bf16 table and activations).
//
// Forward: a copy of 16-byte vectors, one per thread and row. Backward, deterministic without
// atomics: the positions are sorted by token (CUB radix sort: stable, so a token's positions stay
// in increasing t), then one block per run of equal tokens and slab of columns adds the run's rows
// to the table row in that order, starting from the row's value: the CPU reference's operations in
// the CPU reference's order, so the same bits. Only the table rows of the batch's tokens are read
// and written (the table is too large to sweep: V·H·4 bytes, 2.5 GB for Qwen3-8B).
//
// Token ids are not read on the host. A token outside [0, V) gets a NaN output row (forward) or
// sets table row 0 of dtable to NaN (backward), so a non-finite check of the result catches it.
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/cuda/vector.cuh"
#include "ops/embedding_backends.h"

namespace lockstep::cuda {

namespace {

__global__ void embedding_forward_kernel(uint16_t* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const uint16_t* __restrict__ table, int64_t T, int64_t V,
                                         int64_t H) {
  const int64_t c = (int64_t(blockIdx.x) * kRowThreads + threadIdx.x) * kVec;
  if (c >= H) return;
  constexpr uint32_t kNaN2 = uint32_t(kBf16NaN) << 16 | kBf16NaN;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const int32_t token = tokens[t];
    uint4 v = make_uint4(kNaN2, kNaN2, kNaN2, kNaN2);
    if (token >= 0 && token < V) v = *reinterpret_cast<const uint4*>(table + token * H + c);
    *reinterpret_cast<uint4*>(out + t * H + c) = v;
  }
}

__global__ void iota_kernel(int32_t* __restrict__ p, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = int32_t(i);
}

constexpr int kRunThreads = 128;  // a block covers 1024 columns of a run
// Rows loaded together: a run is walked serially (frequent tokens make runs of hundreds), so each
// step keeps 16 row loads in flight rather than waiting for one at a time.
constexpr int kRunBatch = 16;

// Block (i, slab): when sorted position i starts a run of a valid token, adds dout's rows of the
// run's positions, in order, to that token's row of dtable, for the slab's columns.
__global__ void __launch_bounds__(kRunThreads) embedding_backward_kernel(
    float* __restrict__ dtable, const int32_t* __restrict__ sorted_tokens,
    const int32_t* __restrict__ positions, const uint16_t* __restrict__ dout, int64_t T, int64_t V,
    int64_t H) {
  const int64_t i = blockIdx.x;
  const int32_t token = sorted_tokens[i];
  if ((i > 0 && sorted_tokens[i - 1] == token) || token < 0 || token >= V) return;
  const int64_t c = (int64_t(blockIdx.y) * kRunThreads + threadIdx.x) * kVec;
  if (c >= H) return;

  float* row = dtable + token * H + c;
  float acc[kVec];
  load_f32x8(row, acc);
  for (int64_t j = i;; j += kRunBatch) {
    // The run's positions among j .. j + 15: a prefix of them, since the tokens are sorted.
    uint4 batch[kRunBatch];
    int count = 0;
#pragma unroll
    for (int k = 0; k < kRunBatch; ++k) {
      if (j + k < T && sorted_tokens[j + k] == token) {
        batch[k] = *reinterpret_cast<const uint4*>(dout + positions[j + k] * H + c);
        count = k + 1;
      }
    }
#pragma unroll
    for (int k = 0; k < kRunBatch; ++k) {
      if (k >= count) break;
      float v[kVec];
      unpack_bf16x8(batch[k], v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] += v[e];
    }
    if (count < kRunBatch) break;
  }
  store_f32x8(row, acc);
}

// After embedding_backward_kernel (stream order: no race with its writes): when the batch holds a
// token outside [0, V) (sorted, one would be first or last), dtable row 0 becomes NaN.
__global__ void poison_bad_tokens_kernel(float* __restrict__ dtable, const int32_t* __restrict__ sorted_tokens,
                                         int64_t T, int64_t V, int64_t H) {
  if (sorted_tokens[0] >= 0 && sorted_tokens[T - 1] < V) return;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) dtable[c] = __uint_as_float(0x7fffffffu);
}

}  // namespace

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table) {
  const int64_t T = tokens.dim(0), V = table.dim(0), H = table.dim(1);
  if (T == 0 || H == 0) return;
  embedding_forward_kernel<<<row_grid(T, H / kVec), kRowThreads, 0, current_stream()>>>(
      static_cast<uint16_t*>(out.data()), tokens.data_as<int32_t>(),
      static_cast<const uint16_t*>(table.data()), T, V, H);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout) {
  const int64_t T = tokens.dim(0), V = dtable.dim(0), H = dtable.dim(1);
  if (T == 0 || H == 0 || V == 0) return;
  cudaStream_t stream = current_stream();
  Tensor sorted = Tensor::empty({T}, DType::i32, Device::cuda);
  Tensor order = Tensor::empty({T}, DType::i32, Device::cuda);
  Tensor positions = Tensor::empty({T}, DType::i32, Device::cuda);
  iota_kernel<<<unsigned((T + 255) / 256), 256, 0, stream>>>(order.data_as<int32_t>(), T);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  // All 32 key bits: out-of-range ids must sort apart from valid ones too.
  size_t temp_bytes = 0;
  LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, tokens.data_as<int32_t>(), sorted.data_as<int32_t>(),
      order.data_as<int32_t>(), positions.data_as<int32_t>(), T, 0, 32, stream));
  Tensor temp = Tensor::empty({int64_t(temp_bytes)}, DType::e4m3, Device::cuda);  // bytes
  LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.data(), temp_bytes, tokens.data_as<int32_t>(), sorted.data_as<int32_t>(),
      order.data_as<int32_t>(), positions.data_as<int32_t>(), T, 0, 32, stream));

  const dim3 grid(unsigned(T), unsigned((H / kVec + kRunThreads - 1) / kRunThreads));
  embedding_backward_kernel<<<grid, kRunThreads, 0, stream>>>(
      dtable.data_as<float>(), sorted.data_as<int32_t>(), positions.data_as<int32_t>(),
      static_cast<const uint16_t*>(dout.data()), T, V, H);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  poison_bad_tokens_kernel<<<1, 256, 0, stream>>>(dtable.data_as<float>(), sorted.data_as<int32_t>(),
                                                  T, V, H);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
