// ops/cuda/elementwise.cu — CUDA backend of ops/elementwise.h (bf16 activations, f32 biases).
//
// All memory-bound: every element is read and written once with 16-byte accesses, one vector of 8
// per thread (flat ops; a last partial vector is done element by element) or per thread and row
// (row ops). add_into, add_bias and convert round exactly like the CPU reference (one fp32
// operation, then round to nearest even): the same bits. The sums (bias_backward, sum_squares) run
// in an order fixed by the shape alone, so they repeat bit for bit; their order differs from the
// CPU's, hence their results differ from it by rounding only.
#include <cuda_runtime.h>

#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/cuda/vector.cuh"
#include "ops/elementwise_backends.h"

namespace lockstep::cuda {

namespace {

constexpr int kFlatThreads = 256;

// Threads for n elements, one vector each (the partial last vector included).
unsigned flat_blocks(int64_t n) {
  const int64_t vectors = (n + kVec - 1) / kVec;
  return unsigned((vectors + kFlatThreads - 1) / kFlatThreads);
}

__device__ __forceinline__ int64_t flat_index() {
  return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
}

__global__ void add_into_kernel(uint16_t* __restrict__ y, const uint16_t* __restrict__ x, int64_t n) {
  const int64_t i = flat_index();
  if (i + kVec <= n) {
    float a[kVec], b[kVec];
    load_bf16x8(y + i, a);
    load_bf16x8(x + i, b);
#pragma unroll
    for (int e = 0; e < kVec; ++e) a[e] = __fadd_rn(a[e], b[e]);
    store_bf16x8(y + i, a);
  } else {
    for (int64_t j = i; j < n; ++j)
      y[j] = float_to_bf16(__fadd_rn(bf16_to_float(bf16{y[j]}), bf16_to_float(bf16{x[j]}))).bits;
  }
}

__global__ void add_into_f32_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void add_bias_kernel(uint16_t* __restrict__ y, const float* __restrict__ b, int64_t T,
                                int64_t N) {
  const int64_t c = (int64_t(blockIdx.x) * kRowThreads + threadIdx.x) * kVec;
  if (c >= N) return;
  float bias[kVec];
  load_f32x8(b + c, bias);
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float v[kVec];
    load_bf16x8(y + t * N + c, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = __fadd_rn(v[e], bias[e]);
    store_bf16x8(y + t * N + c, v);
  }
}

// partial[p, c] = Σ dy[t, c] over part p's rows, in increasing t (blockIdx.y = p).
__global__ void column_sums_kernel(const uint16_t* __restrict__ dy, int64_t T, int64_t N,
                                   int64_t rows_per_part, float* __restrict__ partial) {
  const int64_t c = (int64_t(blockIdx.x) * kRowThreads + threadIdx.x) * kVec;
  if (c >= N) return;
  const int64_t begin = blockIdx.y * rows_per_part, end = std::min(T, begin + rows_per_part);
  float acc[kVec] = {};
#pragma unroll 4
  for (int64_t t = begin; t < end; ++t) {
    float v[kVec];
    load_bf16x8(dy + t * N + c, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] += v[e];
  }
  store_f32x8(partial + blockIdx.y * N + c, acc);
}

// Block (32, 8): 32 columns; thread row j adds parts j, j + 8, ... in order, then the 8 sums are
// added in order of j.
__global__ void add_partial_sums_kernel(float* __restrict__ out, const float* __restrict__ partial,
                                        int64_t parts, int64_t n) {
  __shared__ float sums[8][32];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float s = 0;
  if (c < n) {
#pragma unroll 4
    for (int64_t p = threadIdx.y; p < parts; p += 8) s += partial[p * n + c];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    float total = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) total += sums[j][threadIdx.x];
    out[c] += total;
  }
}

__global__ void f32_to_bf16_kernel(uint16_t* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  const int64_t i = flat_index();
  if (i + kVec <= n) {
    float v[kVec];
    load_f32x8(src + i, v);
    store_bf16x8(dst + i, v);
  } else {
    for (int64_t j = i; j < n; ++j) dst[j] = float_to_bf16(src[j]).bits;
  }
}

__global__ void bf16_to_f32_kernel(float* __restrict__ dst, const uint16_t* __restrict__ src, int64_t n) {
  const int64_t i = flat_index();
  if (i + kVec <= n) {
    float v[kVec];
    load_bf16x8(src + i, v);
    store_f32x8(dst + i, v);
  } else {
    for (int64_t j = i; j < n; ++j) dst[j] = bf16_to_float(bf16{src[j]});
  }
}

// sum_squares: block b sums elements [b·kSumChunk, (b + 1)·kSumChunk) in double (squares of floats
// are exact in double), thread i its vectors i, i + 256, ... in order, then block_sum.
constexpr int kSumThreads = 256, kSumVectorsPerThread = 8;
constexpr int64_t kSumChunk = int64_t(kSumThreads) * kSumVectorsPerThread * kVec;

__global__ void __launch_bounds__(kSumThreads) sum_squares_kernel(const float* __restrict__ x,
                                                                  int64_t n, double* __restrict__ partial) {
  __shared__ double scratch[kSumThreads / 32];
  const int64_t begin = int64_t(blockIdx.x) * kSumChunk;
  double acc = 0;
#pragma unroll
  for (int k = 0; k < kSumVectorsPerThread; ++k) {
    const int64_t i = begin + (int64_t(k) * kSumThreads + threadIdx.x) * kVec;
    if (i + kVec <= n) {
      float v[kVec];
      load_f32x8(x + i, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc = fma(double(v[e]), double(v[e]), acc);
    } else {
      for (int64_t j = i; j < n; ++j) acc = fma(double(x[j]), double(x[j]), acc);
    }
  }
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

constexpr int kFinalThreads = 1024;

// *out = Σ partial[p]: thread i adds parts i, i + 1024, ... in order, then block_sum.
__global__ void __launch_bounds__(kFinalThreads) sum_parts_kernel(const double* __restrict__ partial,
                                                                  int64_t parts, double* __restrict__ out) {
  __shared__ double scratch[kFinalThreads / 32];
  double acc = 0;
  for (int64_t p = threadIdx.x; p < parts; p += kFinalThreads) acc += partial[p];
  const double total = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = total;
}

uint16_t* bf16_data(const Tensor& t) { return static_cast<uint16_t*>(t.data()); }

}  // namespace

void add_partial_sums(float* out, const float* partial, int64_t parts, int64_t n) {
  if (parts == 0 || n == 0) return;
  add_partial_sums_kernel<<<unsigned((n + 31) / 32), dim3(32, 8), 0, current_stream()>>>(out, partial,
                                                                                         parts, n);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void add_into(Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  if (n == 0) return;
  add_into_kernel<<<flat_blocks(n), kFlatThreads, 0, current_stream()>>>(bf16_data(y), bf16_data(x), n);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void add_into_f32(Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  if (n == 0) return;
  add_into_f32_kernel<<<unsigned((n + kFlatThreads - 1) / kFlatThreads), kFlatThreads, 0, current_stream()>>>(
      y.data_as<float>(), x.data_as<float>(), n);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void add_bias(Tensor& y, const Tensor& b) {
  const int64_t T = y.dim(0), N = y.dim(1);
  if (T == 0 || N == 0) return;
  add_bias_kernel<<<row_grid(T, N / kVec), kRowThreads, 0, current_stream()>>>(
      bf16_data(y), b.data_as<float>(), T, N);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void bias_backward(Tensor& db, const Tensor& dy) {
  const int64_t T = dy.dim(0), N = dy.dim(1);
  const RowParts split(T);
  if (split.parts == 0 || N == 0) return;
  Tensor partial = Tensor::empty({split.parts, N}, DType::f32, Device::cuda);
  const dim3 grid(unsigned((N / kVec + kRowThreads - 1) / kRowThreads), unsigned(split.parts));
  column_sums_kernel<<<grid, kRowThreads, 0, current_stream()>>>(bf16_data(dy), T, N,
                                                                 split.rows_per_part,
                                                                 partial.data_as<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  add_partial_sums(db.data_as<float>(), partial.data_as<float>(), split.parts, N);
}

void convert(Tensor& dst, const Tensor& src) {
  const int64_t n = src.numel();
  if (n == 0) return;
  cudaStream_t stream = current_stream();
  if (dst.dtype() == src.dtype()) {
    if (dst.data() != src.data())
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (src.dtype() == DType::f32)
    f32_to_bf16_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(bf16_data(dst), src.data_as<float>(), n);
  else
    bf16_to_f32_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(dst.data_as<float>(), bf16_data(src), n);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

// The only host synchronization of these ops, one for all the tensors: the caller wants the
// numbers on the host.
std::vector<double> sum_squares(const std::vector<const Tensor*>& xs) {
  std::vector<int64_t> first_part(xs.size() + 1, 0);  // tensor i's partial sums start there
  for (size_t i = 0; i < xs.size(); ++i)
    first_part[i + 1] = first_part[i] + (xs[i]->numel() + kSumChunk - 1) / kSumChunk;
  const int64_t parts = first_part.back(), count = int64_t(xs.size());
  // Doubles, in i64 storage (Tensor has no f64 dtype): the partial sums, then the totals.
  Tensor scratch = Tensor::empty({parts + count}, DType::i64, Device::cuda);
  double* partial = static_cast<double*>(scratch.data());
  double* totals = partial + parts;
  cudaStream_t stream = current_stream();
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t n = xs[i]->numel(), mine = first_part[i + 1] - first_part[i];
    if (mine > 0) {
      sum_squares_kernel<<<unsigned(mine), kSumThreads, 0, stream>>>(xs[i]->data_as<float>(), n,
                                                                    partial + first_part[i]);
      LOCKSTEP_CUDA_CHECK_LAUNCH();
    }
    sum_parts_kernel<<<1, kFinalThreads, 0, stream>>>(partial + first_part[i], mine, totals + i);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
  std::vector<double> result(xs.size());
  LOCKSTEP_CUDA_CHECK(
      cudaMemcpyAsync(result.data(), totals, xs.size() * sizeof(double), cudaMemcpyDeviceToHost, stream));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

}  // namespace lockstep::cuda
