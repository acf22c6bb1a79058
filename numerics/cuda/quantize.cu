// numerics/cuda/quantize.cu — FP8 quantization kernels; bytes and scales equal the CPU reference's.
//
// They are memory-bound (each reads its input once and writes every output once), so they are
// built to keep HBM busy (docs/benchmarks.md has the numbers). The tile machinery they share with
// the fused producers is in numerics/cuda/quantize_device.cuh:
// - Every kernel works on 128×128 tiles, 16-byte loads, persistent blocks whose loads run ahead of
//   the quantization: two tiles a block in flight through a cp.async ring in shared memory.
// - The transposed outputs go through a shared-memory byte tile whose layout is swizzled so that
//   the 8-byte column writes and the 16-byte row reads are free of bank conflicts; every global
//   store is a full 128-byte line per 8 lanes (transposed) or per half-warp (rowwise).
// - Amax of bf16 data compares two values per instruction on their raw magnitude bits; a token's
//   128-feature group spans a half-warp, whose 8 token maxima are reduce-scattered (8 shuffles).
// - Rows only at T ≤ kRowsOnlyT (decode) skips the tiles, few or mostly padding there: a thread per 8-wide
//   vector, a half-warp per group (quantize_vector_rows).
// - Widths with a partial 128-group (numerics/quantize.h) run the kPartial instantiations: loads past
//   the valid columns read zeros, which the rowwise stores write as the padding; the columnwise and
//   transposed stores skip the rows past them. The whole-group instantiations are the code as it was.
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_launch.h"
#include "core/cuda_stream.h"
#include "core/dependent_launch.cuh"
#include "numerics/cuda/quantize_device.cuh"
#include "numerics/quantize_backends.h"
#include "numerics/scale.h"

namespace lockstep::cuda {

namespace {

using namespace quant;

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

constexpr int kRingStages = 2;  // for_each_tile's tiles in flight a block

// x bf16 [T, K]. Rowwise: each token's 128-feature groups -> q [T, K], s [K/128, T]. Columnwise:
// each feature's groups of 128 tokens -> qt [K, Tp], st [Tp/128, K], tokens past T read as zeros
// (the columnwise padding). 64 KB of tiles in flight a block, two blocks an SM (three for the rows
// alone, which need no scratch). kPartial: K % 128 != 0; the tiles cover the stored width Kp, q is
// [T, Kp] and features past K read as zeros.
template <bool kRowwise, bool kColumnwise, bool kPartial = false>
__global__ void __launch_bounds__(Bf16::kThreads, kColumnwise ? 2 : 3) quantize_activation_kernel(
    const uint16_t* __restrict__ x, int64_t T, int64_t K, uint8_t* __restrict__ q,
    float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st, int64_t Tp,
    bool pow2) {
  extern __shared__ uint4 ring[];
  __shared__ ColumnScratch scratch;
  const int64_t Kp = kPartial ? (K + kTile - 1) / kTile * kTile : K;
  for_each_tile<Bf16, Bf16::kThreads, kRingStages>(
      T, Kp, ring,
      [&](const auto& to, int64_t t0, int64_t k0) {
        if constexpr (kPartial) Bf16::load_partial(to, 0, x, K, T, K, t0, k0);
        else Bf16::load(to, 0, x, K, T, t0, k0);
      },
      [&](const Bf16& f, int64_t t0, int64_t k0) {
        if constexpr (kRowwise) quantize_tile_rows(f, t0, k0, T, Kp, q, s, pow2);
        if constexpr (kColumnwise) quantize_tile_columns<kPartial>(f, t0, k0, K, Tp, qt, st, pow2, scratch);
      });
}

// quantize_activation_kernel's rows for T ≤ kRowsOnlyT: one 8-wide vector of x a thread (vector i of
// [T, K]), grouped by quantize_vector_rows.
// kPartial: vector i of [T, Kp] (the stored width), those past K read as zeros and stored as the
// padding.
template <bool kPartial = false>
__global__ void __launch_bounds__(kSmallThreads) quantize_rows_small_kernel(
    const uint16_t* __restrict__ x, int64_t T, int64_t K, uint8_t* __restrict__ q, float* __restrict__ s,
    bool pow2) {
  wait_for_previous_kernel();  // launched with an early start in decode steps (core/early_start.h)
  let_next_kernel_start();
  const int64_t Kp = kPartial ? (K + kTile - 1) / kTile * kTile : K;
  const int64_t i = int64_t(blockIdx.x) * kSmallThreads + threadIdx.x;
  const int64_t t = i / (Kp / 8), c = i % (Kp / 8) * 8;
  const bool valid = t < T;
  const bool load = valid && (!kPartial || c < K);
  const uint4 raw = load ? *reinterpret_cast<const uint4*>(x + t * K + c) : make_uint4(0, 0, 0, 0);
  quantize_vector_rows(raw, valid, q + t * Kp + c, s + c / kTile * T + t, pow2);
}

// W [N, K] (f32 or bf16) in 128×128 blocks: q [N, K] row-major and, through shared memory, the
// transposed copy qt [K, N] that DGrad reads; one scale per block in s and (transposed) st.
// 2 tiles in flight a block (f32: 128 KB, one block of 512 threads an SM; bf16: 64 KB, two).
// kPartial: N or K % 128 != 0 (quantize_weight_tile's kPartial).
template <class In, bool kPartial = false>
__global__ void __launch_bounds__(Fragment<In>::kThreads, 512 / Fragment<In>::kThreads) quantize_weight_kernel(
    const In* __restrict__ w, int64_t N, int64_t K, Fp8WeightOut out, bool pow2) {
  using Frag = Fragment<In>;
  extern __shared__ uint4 ring[];
  __shared__ alignas(16) uint8_t tq[kTile * kTile];
  __shared__ uint32_t warp_max[Frag::kThreads / 32];
  const auto load = [&](const auto& to, int64_t n0, int64_t k0) {
    if constexpr (kPartial) Frag::load_partial(to, 0, w, K, N, K, n0, k0);
    else Frag::load(to, 0, w, K, N, n0, k0);
  };
  const int64_t Kp = kPartial ? (K + kTile - 1) / kTile * kTile : K;
  for_each_tile<Frag, Frag::kThreads, kRingStages>(N, Kp, ring, load, [&](const Frag& f, int64_t n0, int64_t k0) {
    quantize_weight_tile<In, kPartial>(f, n0, k0, N, K, out, pow2, tq, warp_max);
  });
}

// out [rows, cols]: float, or bf16 as its bits (uint16_t); q's rows are ld_q bytes apart.
template <class Out>
__global__ void dequantize_rows_kernel(const uint8_t* q, int64_t ld_q, const float* s, int64_t rows, int64_t cols,
                                       Out* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const float v = e4m3_to_float(e4m3{q[r * ld_q + c]}) * s[(c / kTile) * rows + r];
  if constexpr (std::is_same_v<Out, float>) out[i] = v;
  else out[i] = float_to_bf16(v).bits;
}

__global__ void dequantize_blocks_kernel(const uint8_t* q, int64_t ld_q, const float* s, int64_t rows,
                                         int64_t cols, int64_t ld_s, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  out[i] = e4m3_to_float(e4m3{q[r * ld_q + c]}) * s[(r / kTile) * ld_s + c / kTile];
}

// Wᵀ's bytes from W's through a 32×32 tile in shared memory (both reads and writes coalesced):
// block (x, y) writes qt[j0 .. j0+32, i0 .. i0+32), i along N, j along K; the padding columns of
// Wᵀ (i >= N) are quantized zeros of their block's scale.
constexpr int kTransposeTile = 32, kTransposeRows = 8;
__global__ void transpose_weight_blocks_kernel(const uint8_t* __restrict__ q, int64_t kp, const float* __restrict__ s,
                                               int64_t ld, int64_t n, int64_t k, uint8_t* __restrict__ qt, int64_t np) {
  __shared__ uint8_t tile[kTransposeTile][kTransposeTile + 1];
  const int64_t i0 = int64_t(blockIdx.x) * kTransposeTile, j0 = int64_t(blockIdx.y) * kTransposeTile;
  for (int r = threadIdx.y; r < kTransposeTile; r += kTransposeRows) {
    const int64_t i = i0 + r, j = j0 + threadIdx.x;
    if (i < n && j < k) tile[r][threadIdx.x] = q[i * kp + j];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < kTransposeTile; r += kTransposeRows) {
    const int64_t j = j0 + r, i = i0 + threadIdx.x;
    if (j >= k || i >= np) continue;
    qt[j * np + i] = i < n ? tile[threadIdx.x][r] : quantize_value(0.0f, inverse_scale(s[(i / kTile) * ld + j / kTile]));
  }
}

// st [kb_rows, ld_t] from s [nb, ld]: block (bj, bi) of Wᵀ is block (bi, bj) of W; the rest 0.
__global__ void transpose_block_scales_kernel(const float* s, int64_t ld, int64_t nb, int64_t kb, float* st,
                                              int64_t ld_t) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= kb * ld_t) return;
  const int64_t bj = t / ld_t, bi = t % ld_t;
  st[t] = bi < nb ? s[bi * ld + bj] : 0.0f;
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

template <bool kRowwise, bool kColumnwise, bool kPartial>
void launch_activation(int64_t tiles, const uint16_t* x, int64_t T, int64_t K, uint8_t* q, float* s,
                       uint8_t* qt, float* st, int64_t Tp, bool pow2) {
  constexpr auto kernel = quantize_activation_kernel<kRowwise, kColumnwise, kPartial>;
  constexpr size_t smem = ring_bytes<Bf16, Bf16::kThreads>(kRingStages);
  kernel<<<persistent_grid<kernel>(Bf16::kThreads, smem, tiles), Bf16::kThreads, smem, current_stream()>>>(
      x, T, K, q, s, qt, st, Tp, pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

template <class In, bool kPartial>
void launch_weight(const Tensor& w, Fp8Weight& out, bool pow2) {
  using Frag = Fragment<In>;
  const int64_t N = w.dim(0), K = w.dim(1), tiles = ((N + kTile - 1) / kTile) * ((K + kTile - 1) / kTile);
  if (tiles == 0) return;
  constexpr auto kernel = quantize_weight_kernel<In, kPartial>;
  constexpr size_t smem = ring_bytes<Frag, Frag::kThreads>(kRingStages);
  kernel<<<persistent_grid<kernel>(Frag::kThreads, smem, tiles), Frag::kThreads, smem, current_stream()>>>(
      static_cast<const In*>(w.data()), N, K, fp8_weight_out(out), pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}


const uint16_t* xp_of(const Tensor& x) { return static_cast<const uint16_t*>(x.data()); }

// quantize_rows_and_columns's launch for a K with (kPartial) or without a partial group.
template <bool kPartial>
void activation(Fp8Rows* out, Fp8Rows* out_t, int64_t T, int64_t K, int64_t Tp, int64_t tiles,
                const uint16_t* xp, bool pow2) {
  auto* q = out ? static_cast<uint8_t*>(out->data.data()) : nullptr;
  auto* s = out ? out->scales.data_as<float>() : nullptr;
  auto* qt = out_t ? static_cast<uint8_t*>(out_t->data.data()) : nullptr;
  auto* st = out_t ? out_t->scales.data_as<float>() : nullptr;
  if (out && out_t) {
    launch_activation<true, true, kPartial>(tiles, xp, T, K, q, s, qt, st, Tp, pow2);
  } else if (out && T <= kRowsOnlyT) {
    LaunchConfig(dim3(small_grid(T * round_up(K, kTile) / 8)), dim3(kSmallThreads), 0)
        .early_start_in_scope()
        .run(quantize_rows_small_kernel<kPartial>, xp, T, K, q, s, pow2);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  } else if (out) {
    launch_activation<true, false, kPartial>(tiles, xp, T, K, q, s, qt, st, Tp, pow2);
  } else {
    launch_activation<false, true, kPartial>(tiles, xp, T, K, q, s, qt, st, Tp, pow2);
  }
}

}  // namespace

void quantize_rows_and_columns(Fp8Rows* out, Fp8Rows* out_t, const Tensor& x, bool pow2) {
  check_aligned(x, "quantize: x");
  if (out) check_aligned(out->data, "quantize: out");
  if (out_t) check_aligned(out_t->data, "quantize: out_t");
  const int64_t T = x.dim(0), K = x.dim(1), Tp = round_up(T, kTile), Kp = round_up(K, kTile);
  const int64_t tiles = (Tp / kTile) * (Kp / kTile);
  if (tiles == 0) return;
  if (K % kTile) return activation<true>(out, out_t, T, K, Tp, tiles, xp_of(x), pow2);
  activation<false>(out, out_t, T, K, Tp, tiles, xp_of(x), pow2);
}

void quantize_weight(Fp8Weight& out, const Tensor& w, bool pow2) {
  check_aligned(w, "quantize_weight: w");
  check_aligned(out.w.data, "quantize_weight: out.w");
  check_aligned(out.wt.data, "quantize_weight: out.wt");
  const bool partial = w.dim(0) % kTile || w.dim(1) % kTile;
  if (w.dtype() == DType::f32) {
    if (partial) launch_weight<float, true>(w, out, pow2);
    else launch_weight<float, false>(w, out, pow2);
  } else {
    if (partial) launch_weight<uint16_t, true>(w, out, pow2);
    else launch_weight<uint16_t, false>(w, out, pow2);
  }
}

void transpose_weight_blocks(Fp8Weight& w) {
  const int64_t n = w.w.rows(), k = w.wt.rows(), kp = w.w.cols(), np = w.wt.cols();
  const int64_t nb = (n + kTile - 1) / kTile, kb = (k + kTile - 1) / kTile;
  const int64_t ld = w.w.scales.dim(1), ld_t = w.wt.scales.dim(1);
  if (n == 0 || k == 0) return;
  const auto* q = static_cast<const uint8_t*>(w.w.data.data());
  const float* s = w.w.scales.data_as<float>();
  transpose_weight_blocks_kernel<<<dim3(unsigned(np / kTransposeTile), unsigned((k + kTransposeTile - 1) / kTransposeTile)),
                                   dim3(kTransposeTile, kTransposeRows), 0, current_stream()>>>(
      q, kp, s, ld, n, k, static_cast<uint8_t*>(w.wt.data.data()), np);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  transpose_block_scales_kernel<<<blocks_for(kb * ld_t, 256), 256, 0, current_stream()>>>(
      s, ld, nb, kb, w.wt.scales.data_as<float>(), ld_t);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void dequantize_rows(Tensor& out, const Fp8Rows& q) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto* qd = static_cast<const uint8_t*>(q.data.data());
  if (out.dtype() == DType::f32)
    dequantize_rows_kernel<<<blocks_for(n, 256), 256, 0, current_stream()>>>(
        qd, q.cols(), q.scales.data_as<float>(), q.rows(), out.dim(1), out.data_as<float>());
  else
    dequantize_rows_kernel<<<blocks_for(n, 256), 256, 0, current_stream()>>>(
        qd, q.cols(), q.scales.data_as<float>(), q.rows(), out.dim(1), static_cast<uint16_t*>(out.data()));
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void dequantize_blocks(Tensor& out, const Fp8Blocks& q) {
  const int64_t n = out.numel();
  if (n == 0) return;
  dequantize_blocks_kernel<<<blocks_for(n, 256), 256, 0, current_stream()>>>(
      static_cast<const uint8_t*>(q.data.data()), q.cols(), q.scales.data_as<float>(), q.rows(), out.dim(1),
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
