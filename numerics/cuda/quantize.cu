// numerics/cuda/quantize.cu — FP8 quantization kernels. Memory-bound: each reads its input once
// with 16-byte loads and writes every output once; bytes and scales equal the CPU reference's.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "numerics/quantize_backends.h"
#include "numerics/scale.h"

namespace lockstep::cuda {

namespace {

constexpr int kTile = 128;     // = kQuantGroup: a tile is one group wide in both directions
constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

__device__ __forceinline__ float bf16_lo(uint32_t packed) { return __uint_as_float(packed << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t packed) { return __uint_as_float(packed & 0xffff0000u); }

__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* scratch /* [kThreads/32] */) {
  v = __reduce_max_sync(0xffffffffu, v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) m = max(m, scratch[i]);
  return m;
}

// One 128×128 tile of x (bf16 [T, K]) per block: 128 tokens × one 128-wide feature group.
// Rowwise: each token's group -> q [T, K], s [K/128, T]. Columnwise: each feature's 128 tokens ->
// qt [K, Tp], st [Tp/128, K]. Tokens past T read as zeros (the columnwise padding).
template <bool kRows, bool kCols>
__global__ void __launch_bounds__(kThreads) quantize_tile_kernel(
    const uint16_t* __restrict__ x, int64_t T, int64_t K, uint8_t* __restrict__ q,
    float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st, int64_t Tp,
    bool pow2) {
  constexpr int kPad = 8;  // 16 bytes per row: keeps rows 16-byte aligned, shifts banks
  __shared__ alignas(16) uint16_t tile[kTile][kTile + kPad];
  __shared__ uint32_t col_amax[2][kTile];
  const int64_t t0 = int64_t(blockIdx.x) * kTile, k0 = int64_t(blockIdx.y) * kTile;
  const int tid = threadIdx.x;

  // Load: 16 threads per 256-byte row, 16 rows per pass; all loads issued before any store.
  constexpr int kPasses = kTile * kTile * 2 / 16 / kThreads;  // 8
  uint4 v[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int r = p * 16 + tid / 16, c = (tid % 16) * 8;
    v[p] = t0 + r < T ? *reinterpret_cast<const uint4*>(x + (t0 + r) * K + k0 + c)
                      : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int p = 0; p < kPasses; ++p)
    *reinterpret_cast<uint4*>(&tile[p * 16 + tid / 16][(tid % 16) * 8]) = v[p];
  __syncthreads();

  if constexpr (kRows) {
    // A warp per 16 tokens; a lane holds 4 of the token's 128 values.
    const int warp = tid / 32, lane = tid % 32;
    for (int i = 0; i < 16; ++i) {
      const int r = warp * 16 + i;
      if (t0 + r >= T) break;
      const uint2 raw = *reinterpret_cast<const uint2*>(&tile[r][lane * 4]);
      const float f[4] = {bf16_lo(raw.x), bf16_hi(raw.x), bf16_lo(raw.y), bf16_hi(raw.y)};
      uint32_t amax = max(max(abs_bits(f[0]), abs_bits(f[1])), max(abs_bits(f[2]), abs_bits(f[3])));
      amax = __reduce_max_sync(0xffffffffu, amax);
      const float scale = group_scale(amax, pow2), inv = inverse_scale(scale);
      const uint32_t packed = uint32_t(quantize_value(f[0], inv)) |
                              uint32_t(quantize_value(f[1], inv)) << 8 |
                              uint32_t(quantize_value(f[2], inv)) << 16 |
                              uint32_t(quantize_value(f[3], inv)) << 24;
      *reinterpret_cast<uint32_t*>(q + (t0 + r) * K + k0 + lane * 4) = packed;
      if (lane == 0) s[int64_t(blockIdx.y) * T + t0 + r] = scale;
    }
  }

  if constexpr (kCols) {
    // A thread per (feature, half of the tokens); a warp reads 32 neighbouring features of one
    // token row, so shared-memory reads are conflict-free.
    const int c = tid % kTile, h = tid / kTile;
    uint32_t amax = 0;
    for (int i = 0; i < 64; ++i)
      amax = max(amax, abs_bits(__uint_as_float(uint32_t(tile[h * 64 + i][c]) << 16)));
    col_amax[h][c] = amax;
    __syncthreads();
    const float scale = group_scale(max(col_amax[0][c], col_amax[1][c]), pow2);
    const float inv = inverse_scale(scale);
    uint8_t* dst = qt + (k0 + c) * Tp + t0 + h * 64;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t w[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int r = h * 64 + j * 16 + m * 4;
        w[m] = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b)
          w[m] |= uint32_t(quantize_value(__uint_as_float(uint32_t(tile[r + b][c]) << 16), inv))
                  << (8 * b);
      }
      *reinterpret_cast<uint4*>(dst + j * 16) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    if (h == 0) st[int64_t(blockIdx.x) * K + k0 + c] = scale;
  }
}

// Rowwise only: no shared memory, a half-warp per (token, group), 16 bytes per lane. Items are
// ordered group-major, so item i writes scale i (the VEC128 layout) and the stores coalesce.
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(
    const uint16_t* __restrict__ x, int64_t T, int64_t K, uint8_t* __restrict__ q,
    float* __restrict__ s, bool pow2) {
  const int64_t item = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 16;
  if (item >= T * (K / kTile)) return;  // uniform across the half-warp
  const int64_t g = item / T, r = item % T;
  const int lane = threadIdx.x % 16;
  const uint4 v = *reinterpret_cast<const uint4*>(x + r * K + g * kTile + lane * 8);
  const float f[8] = {bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y),
                      bf16_lo(v.z), bf16_hi(v.z), bf16_lo(v.w), bf16_hi(v.w)};
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = max(amax, abs_bits(f[i]));
  amax = __reduce_max_sync(0xffffu << (threadIdx.x & 16), amax);
  const float scale = group_scale(amax, pow2), inv = inverse_scale(scale);
  uint2 packed;
  packed.x = uint32_t(quantize_value(f[0], inv)) | uint32_t(quantize_value(f[1], inv)) << 8 |
             uint32_t(quantize_value(f[2], inv)) << 16 | uint32_t(quantize_value(f[3], inv)) << 24;
  packed.y = uint32_t(quantize_value(f[4], inv)) | uint32_t(quantize_value(f[5], inv)) << 8 |
             uint32_t(quantize_value(f[6], inv)) << 16 | uint32_t(quantize_value(f[7], inv)) << 24;
  *reinterpret_cast<uint2*>(q + r * K + g * kTile + lane * 8) = packed;
  if (lane == 0) s[item] = scale;
}

template <class In> struct Vec16;
template <> struct Vec16<float> {
  static constexpr int n = 4;
  __device__ static void unpack(uint4 v, float* f) {
    f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
  }
};
template <> struct Vec16<uint16_t> {  // bf16
  static constexpr int n = 8;
  __device__ static void unpack(uint4 v, float* f) {
    f[0] = bf16_lo(v.x); f[1] = bf16_hi(v.x); f[2] = bf16_lo(v.y); f[3] = bf16_hi(v.y);
    f[4] = bf16_lo(v.z); f[5] = bf16_hi(v.z); f[6] = bf16_lo(v.w); f[7] = bf16_hi(v.w);
  }
};

// One 128×128 block of W [N, K] per CUDA block: amax, then the block's bytes to q (row-major) and,
// through shared memory, to qt [K, N] (the transposed copy DGrad reads).
template <class In>
__global__ void __launch_bounds__(kThreads) quantize_weight_kernel(
    const In* __restrict__ w, int64_t N, int64_t K, uint8_t* __restrict__ q, float* __restrict__ s,
    int64_t ld_s, uint8_t* __restrict__ qt, float* __restrict__ st, int64_t ld_st, bool pow2) {
  constexpr int kVec = Vec16<In>::n;
  constexpr int kLanesPerRow = kTile / kVec;
  constexpr int kRowsPerPass = kThreads / kLanesPerRow;
  constexpr int kPasses = kTile / kRowsPerPass;
  __shared__ alignas(16) uint8_t tq[kTile][kTile + 16];
  __shared__ uint32_t scratch[kThreads / 32];
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int tid = threadIdx.x, lr = tid / kLanesPerRow, lc = (tid % kLanesPerRow) * kVec;

  float f[kPasses][kVec];
  uint4 raw[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p)
    raw[p] = *reinterpret_cast<const uint4*>(w + (r0 + p * kRowsPerPass + lr) * K + c0 + lc);
  uint32_t amax = 0;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    Vec16<In>::unpack(raw[p], f[p]);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = max(amax, abs_bits(f[p][i]));
  }
  const float scale = group_scale(block_max(amax, scratch), pow2), inv = inverse_scale(scale);

#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    uint8_t b[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) b[i] = quantize_value(f[p][i], inv);
    const int r = p * kRowsPerPass + lr;
    if constexpr (kVec == 4) {
      const uint32_t packed = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
      *reinterpret_cast<uint32_t*>(q + (r0 + r) * K + c0 + lc) = packed;
      *reinterpret_cast<uint32_t*>(&tq[r][lc]) = packed;
    } else {
      uint2 packed;
      packed.x = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
      packed.y = uint32_t(b[4]) | uint32_t(b[5]) << 8 | uint32_t(b[6]) << 16 | uint32_t(b[7]) << 24;
      *reinterpret_cast<uint2*>(q + (r0 + r) * K + c0 + lc) = packed;
      *reinterpret_cast<uint2*>(&tq[r][lc]) = packed;
    }
  }
  __syncthreads();

  // Transposed: a thread per (column, half of the rows) writes 64 bytes of one row of qt.
  const int c = tid % kTile, h = tid / kTile;
  uint8_t* dst = qt + (c0 + c) * N + r0 + h * 64;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t v[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int r = h * 64 + j * 16 + m * 4;
      v[m] = uint32_t(tq[r][c]) | uint32_t(tq[r + 1][c]) << 8 | uint32_t(tq[r + 2][c]) << 16 |
             uint32_t(tq[r + 3][c]) << 24;
    }
    *reinterpret_cast<uint4*>(dst + j * 16) = make_uint4(v[0], v[1], v[2], v[3]);
  }
  if (tid == 0) {
    s[blockIdx.y * ld_s + blockIdx.x] = scale;
    st[blockIdx.x * ld_st + blockIdx.y] = scale;
  }
}

__global__ void dequantize_rows_kernel(const uint8_t* q, const float* s, int64_t rows, int64_t cols,
                                       float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  out[i] = e4m3_to_float(e4m3{q[i]}) * s[(c / kTile) * rows + r];
}

__global__ void dequantize_blocks_kernel(const uint8_t* q, const float* s, int64_t rows,
                                         int64_t cols, int64_t ld_s, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  out[i] = e4m3_to_float(e4m3{q[i]}) * s[(r / kTile) * ld_s + c / kTile];
}

__global__ void first_nonfinite_kernel(const float* s, int64_t n, unsigned long long* first) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && abs_bits(s[i]) >= kInfBits) atomicMin(first, (unsigned long long)i);
}

void check_aligned(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t.data()) % 16 == 0, what,
                 ": CUDA quantization needs 16-byte aligned data, got ", t.describe(), " at ",
                 t.data());
}

}  // namespace

void quantize_rows_and_columns(Fp8Rows* out, Fp8Rows* out_t, const Tensor& x, bool pow2) {
  check_aligned(x, "quantize: x");
  if (out) check_aligned(out->data, "quantize: out");
  if (out_t) check_aligned(out_t->data, "quantize: out_t");
  const int64_t T = x.dim(0), K = x.dim(1), Tp = round_up(T, kTile);
  if (T == 0) return;
  const dim3 grid(unsigned(Tp / kTile), unsigned(K / kTile));
  const auto* xp = static_cast<const uint16_t*>(x.data());
  auto* q = out ? static_cast<uint8_t*>(out->data.data()) : nullptr;
  auto* s = out ? out->scales.data_as<float>() : nullptr;
  auto* qt = out_t ? static_cast<uint8_t*>(out_t->data.data()) : nullptr;
  auto* st = out_t ? out_t->scales.data_as<float>() : nullptr;
  cudaStream_t stream = current_stream();
  if (out && out_t)
    quantize_tile_kernel<true, true><<<grid, kThreads, 0, stream>>>(xp, T, K, q, s, qt, st, Tp, pow2);
  else if (out)
    quantize_rows_kernel<<<blocks_for(T * (K / kTile) * 16, kThreads), kThreads, 0, stream>>>(
        xp, T, K, q, s, pow2);
  else
    quantize_tile_kernel<false, true><<<grid, kThreads, 0, stream>>>(xp, T, K, q, s, qt, st, Tp, pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void quantize_weight(Fp8Weight& out, const Tensor& w, bool pow2) {
  check_aligned(w, "quantize_weight: w");
  const int64_t N = w.dim(0), K = w.dim(1);
  cudaStream_t stream = current_stream();
  // The scale rows are padded to 4 blocks; the padding must read as 0.
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out.w.scales.data(), 0, out.w.scales.nbytes(), stream));
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(out.wt.scales.data(), 0, out.wt.scales.nbytes(), stream));
  const dim3 grid(unsigned(K / kTile), unsigned(N / kTile));
  auto* q = static_cast<uint8_t*>(out.w.data.data());
  auto* qt = static_cast<uint8_t*>(out.wt.data.data());
  float* s = out.w.scales.data_as<float>();
  float* st = out.wt.scales.data_as<float>();
  const int64_t ld_s = out.w.scales.dim(1), ld_st = out.wt.scales.dim(1);
  if (w.dtype() == DType::f32)
    quantize_weight_kernel<float><<<grid, kThreads, 0, stream>>>(
        w.data_as<float>(), N, K, q, s, ld_s, qt, st, ld_st, pow2);
  else
    quantize_weight_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(w.data()), N, K, q, s, ld_s, qt, st, ld_st, pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void dequantize_rows(Tensor& out, const Fp8Rows& q) {
  const int64_t n = q.data.numel();
  if (n == 0) return;
  dequantize_rows_kernel<<<blocks_for(n, 256), 256, 0, current_stream()>>>(
      static_cast<const uint8_t*>(q.data.data()), q.scales.data_as<float>(), q.rows(), q.cols(),
      out.data_as<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void dequantize_blocks(Tensor& out, const Fp8Blocks& q) {
  const int64_t n = q.data.numel();
  if (n == 0) return;
  dequantize_blocks_kernel<<<blocks_for(n, 256), 256, 0, current_stream()>>>(
      static_cast<const uint8_t*>(q.data.data()), q.scales.data_as<float>(), q.rows(), q.cols(),
      q.scales.dim(1), out.data_as<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

int64_t first_nonfinite(const Tensor& scales) {
  const int64_t n = scales.numel();
  if (n == 0) return -1;
  cudaStream_t stream = current_stream();
  Tensor first = Tensor::empty({1}, DType::i64, Device::cuda);
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(first.data(), 0xff, 8, stream));
  first_nonfinite_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(
      scales.data_as<float>(), n, static_cast<unsigned long long*>(first.data()));
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  unsigned long long result;
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(&result, first.data(), 8, cudaMemcpyDeviceToHost, stream));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result == ~0ull ? -1 : int64_t(result);
}

}  // namespace lockstep::cuda
