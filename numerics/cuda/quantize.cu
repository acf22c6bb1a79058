// numerics/cuda/quantize.cu — FP8 quantization kernels; bytes and scales equal the CPU reference's.
//
// They are memory-bound (each reads its input once and writes every output once), so they are
// built to keep HBM busy (docs/benchmarks.md has the numbers):
// - Every kernel works on 128×128 tiles, a thread's share held in a Fragment
//   (numerics/cuda/quantize_device.cuh, which also has the swizzled transposed stores).
// - Blocks are persistent (as many as fit on the device) and walk the tiles in row-major order,
//   loading the next tile while quantizing the current one, so the loads of each SM never stop
//   (a block that loads only after it has finished its arithmetic leaves the memory idle).
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "numerics/cuda/quantize_device.cuh"
#include "numerics/quantize_backends.h"
#include "numerics/scale.h"

namespace lockstep::cuda {

namespace {

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// Calls process(fragment, r_begin, c_begin) on every 128×128 tile of src [rows, cols] that falls to
// this block (tiles b, b + gridDim.x, ... in row-major order, so the blocks in flight read one
// contiguous band), with the next tile's loads issued before the current tile is processed.
template <class In, class Process>
__device__ __forceinline__ void for_each_tile(const In* src, int64_t rows, int64_t cols, Process&& process) {
  const int64_t tiles_c = cols / kTile, tiles = (rows + kTile - 1) / kTile * tiles_c;
  int64_t tile = blockIdx.x;
  if (tile >= tiles) return;  // the whole block
  Fragment<In> cur, next;
  cur.load(src, cols, rows, tile / tiles_c * kTile, tile % tiles_c * kTile);
  for (; tile < tiles; tile += gridDim.x) {
    const int64_t following = tile + gridDim.x;
    if (following < tiles) next.load(src, cols, rows, following / tiles_c * kTile, following % tiles_c * kTile);
    process(cur, tile / tiles_c * kTile, tile % tiles_c * kTile);
    cur = next;
  }
}

// Enough persistent blocks to fill the device (capped by the work): occupancy × SMs, queried once.
// (One device per process: the SM count is that of the device current at the first call.)
template <auto kKernel>
unsigned persistent_grid(int threads, int64_t tiles) {
  static const int64_t resident = [threads] {
    int device = 0, sms = 0, per_sm = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
    LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    LOCKSTEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, 0));
    return int64_t(sms) * std::max(per_sm, 1);
  }();
  return unsigned(std::min(tiles, resident));
}

using Bf16 = Fragment<uint16_t>;

// x bf16 [T, K]. Rowwise: each token's 128-feature groups -> q [T, K], s [K/128, T]. Columnwise:
// each feature's groups of 128 tokens -> qt [K, Tp], st [Tp/128, K], tokens past T read as zeros
// (the columnwise padding).
template <bool kRowwise, bool kColumnwise>
__global__ void __launch_bounds__(Bf16::kThreads, 2) quantize_activation_kernel(
    const uint16_t* __restrict__ x, int64_t T, int64_t K, uint8_t* __restrict__ q,
    float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st, int64_t Tp,
    bool pow2) {
  constexpr int kWarps = Bf16::kThreads / 32;
  __shared__ alignas(16) uint8_t tq[kTile * kTile];
  __shared__ alignas(16) uint32_t col_partial[kWarps][kTile / 2];  // magnitudes, 2 features a word
  __shared__ alignas(16) float col_inv[kTile];
  const int tid = threadIdx.x, r0 = Bf16::row0(), c0 = Bf16::col0();

  for_each_tile<uint16_t>(x, T, K, [&](const Bf16& f, int64_t t0, int64_t k0) {
    if constexpr (kRowwise) {
      // A token's group is one half-warp's 16 lanes, which share 8 tokens. Lane j < 8 of the
      // half-warp computes the scale of token j (two divisions a lane, not two per token) and
      // passes the inverse around; tokens past T (zeros) are quantized but not stored.
      const int lane = tid % 16, first = tid & 16;
      const unsigned half = 0xffffu << first;
      uint32_t amax = 0;
#pragma unroll
      for (int p = 0; p < Bf16::kRows; ++p) {
        const uint32_t m = __reduce_max_sync(half, f.row_amax(p));
        if (p == lane % Bf16::kRows) amax = m;
      }
      const float scale = group_scale(amax, pow2), inv = inverse_scale(scale);
#pragma unroll
      for (int p = 0; p < Bf16::kRows; ++p) {
        const float row_inv = __shfl_sync(half, inv, first + p);
        if (t0 + r0 + p < T) f.store_row(q + (t0 + r0 + p) * K + k0 + c0, p, row_inv);
      }
      if (lane < Bf16::kRows && t0 + r0 + lane < T) s[k0 / kTile * T + t0 + r0 + lane] = scale;
    }
    if constexpr (kColumnwise) {
      // Column magnitudes: the thread's 8 rows, its partner half-warp's (lane ^ 16), then the
      // warps through shared memory; 128 threads turn the 128 column maxima into scales.
      uint32_t m[4] = {0, 0, 0, 0};
#pragma unroll
      for (int p = 0; p < Bf16::kRows; ++p)
#pragma unroll
        for (int w = 0; w < 4; ++w) m[w] = Bf16::max_magnitude(m[w], component(f.raw[p], w));
#pragma unroll
      for (int w = 0; w < 4; ++w) m[w] = __vmaxu2(m[w], __shfl_xor_sync(0xffffffffu, m[w], 16));
      if (tid % 32 < 16)
        *reinterpret_cast<uint4*>(&col_partial[tid / 32][c0 / 2]) = make_uint4(m[0], m[1], m[2], m[3]);
      __syncthreads();
      if (tid < kTile) {
        uint32_t pair = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) pair = __vmaxu2(pair, col_partial[w][tid / 2]);
        const float scale = group_scale(tid % 2 ? pair & 0xffff0000u : pair << 16, pow2);
        col_inv[tid] = inverse_scale(scale);
        st[t0 / kTile * K + k0 + tid] = scale;
      }
      __syncthreads();
#pragma unroll
      for (int c = 0; c < Bf16::kVec; ++c) f.store_column(tq, c, col_inv[c0 + c]);
      __syncthreads();
      store_transposed<Bf16::kThreads>(tq, qt + k0 * Tp + t0, Tp);
    }
  });
}

// W [N, K] (f32 or bf16) in 128×128 blocks: q [N, K] row-major and, through shared memory, the
// transposed copy qt [K, N] that DGrad reads; one scale per block in s and (transposed) st.
template <class In>
__global__ void __launch_bounds__(Fragment<In>::kThreads, 512 / Fragment<In>::kThreads) quantize_weight_kernel(
    const In* __restrict__ w, int64_t N, int64_t K, Fp8WeightOut out, bool pow2) {
  using Frag = Fragment<In>;
  __shared__ alignas(16) uint8_t tq[kTile * kTile];
  __shared__ uint32_t warp_max[Frag::kThreads / 32];
  for_each_tile<In>(w, N, K, [&](const Frag& f, int64_t n0, int64_t k0) {
    quantize_weight_tile(f, n0, k0, N, K, out, pow2, tq, warp_max);
  });
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

template <bool kRowwise, bool kColumnwise>
void launch_activation(int64_t tiles, const uint16_t* x, int64_t T, int64_t K, uint8_t* q, float* s,
                       uint8_t* qt, float* st, int64_t Tp, bool pow2) {
  constexpr auto kernel = quantize_activation_kernel<kRowwise, kColumnwise>;
  kernel<<<persistent_grid<kernel>(Bf16::kThreads, tiles), Bf16::kThreads, 0, current_stream()>>>(
      x, T, K, q, s, qt, st, Tp, pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

template <class In>
void launch_weight(const Tensor& w, Fp8Weight& out, bool pow2) {
  using Frag = Fragment<In>;
  constexpr auto kernel = quantize_weight_kernel<In>;
  const int64_t N = w.dim(0), K = w.dim(1), tiles = (N / kTile) * (K / kTile);
  if (tiles == 0) return;
  kernel<<<persistent_grid<kernel>(Frag::kThreads, tiles), Frag::kThreads, 0, current_stream()>>>(
      static_cast<const In*>(w.data()), N, K, fp8_weight_out(out), pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize_rows_and_columns(Fp8Rows* out, Fp8Rows* out_t, const Tensor& x, bool pow2) {
  check_aligned(x, "quantize: x");
  if (out) check_aligned(out->data, "quantize: out");
  if (out_t) check_aligned(out_t->data, "quantize: out_t");
  const int64_t T = x.dim(0), K = x.dim(1), Tp = round_up(T, kTile);
  const int64_t tiles = (Tp / kTile) * (K / kTile);
  if (tiles == 0) return;
  const auto* xp = static_cast<const uint16_t*>(x.data());
  auto* q = out ? static_cast<uint8_t*>(out->data.data()) : nullptr;
  auto* s = out ? out->scales.data_as<float>() : nullptr;
  auto* qt = out_t ? static_cast<uint8_t*>(out_t->data.data()) : nullptr;
  auto* st = out_t ? out_t->scales.data_as<float>() : nullptr;
  if (out && out_t) launch_activation<true, true>(tiles, xp, T, K, q, s, qt, st, Tp, pow2);
  else if (out) launch_activation<true, false>(tiles, xp, T, K, q, s, qt, st, Tp, pow2);
  else launch_activation<false, true>(tiles, xp, T, K, q, s, qt, st, Tp, pow2);
}

void quantize_weight(Fp8Weight& out, const Tensor& w, bool pow2) {
  check_aligned(w, "quantize_weight: w");
  check_aligned(out.w.data, "quantize_weight: out.w");
  check_aligned(out.wt.data, "quantize_weight: out.wt");
  if (w.dtype() == DType::f32) launch_weight<float>(w, out, pow2);
  else launch_weight<uint16_t>(w, out, pow2);
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
