// ops/cuda/rmsnorm.cu — CUDA backend of ops/rmsnorm.h (bf16 activations, f32 w, rstd, dw).
//
// Forward: one block per row. The row is read once from memory to sum its squares and once more
// (an L1/L2 hit: this block has just read it) to normalize, so HBM sees one read of x and one write
// of y. At decode sizes (≤ 64 rows) a row's output is sliced over a few blocks, each summing the
// whole row (an L2 hit but for the first) and normalizing its slice. A row's sums run in an order
// fixed by the row width alone (thread i takes vectors i, i + n, ...; then block_sum), so a row
// gives the same bits whatever the batch.
//
// Backward: the rows are cut into RowParts (≤ 256 runs of consecutive rows, by the row count alone);
// one block per run does each row's dx like the forward (two reads of x and dy, one write of dx)
// and adds the run's dy·x̂ in row order into a shared-memory copy of its columns' dw, written out as
// that run's partial sums; add_partial_sums adds the runs to dw in a fixed order. No atomics: the
// same bits every run.
//
// rmsnorm_forward_fp8: for T ≤ quant::kRowsOnlyT rows only (decode), the forward's row kernel quantizes
// each row's y in place of storing it (one launch; the same rstd and y bits, so the same bytes).
// Otherwise the rstd pass of the forward (the same kernel, so the same rstd bits), then a
// tile kernel that recomputes y = bf16(x · rstd · w) with the forward's operations into a bf16
// Fragment and quantizes it with numerics/cuda/quantize_device.cuh, without storing y: the bytes of
// rmsnorm_forward followed by quantize_rows(_and_columns). HBM traffic per element: x read twice
// (2 × 2 bytes) plus the 1 or 2 fp8 bytes, against 2 + 2 (rmsnorm) + 2 + 2 (quantization) unfused.
//
// With a residual the row kernel reads x and the residual wherever it read x, adds them with
// add_into's operations (one fp32 add, one bf16 rounding) and writes the sum back into x once: the
// rstd pass as it reads (one block a row, each vector read by one thread only), the output pass
// before normalizing. A row sliced over several blocks is launched as one thread-block cluster
// (at most 8 blocks, the portable size), whose barrier after the sum keeps every block's reads of
// the row before any block's writes of the sum into it. The sums' order is still fixed by the row
// width alone, so the slice count changes no bits: those of add_into followed by the op.
#include <cooperative_groups.h>

#include <bit>

#include "core/cuda_check.h"
#include "core/cuda_launch.h"
#include "core/cuda_stream.h"
#include "core/dependent_launch.cuh"
#include "numerics/cuda/quantize_device.cuh"
#include "ops/cuda/vector.cuh"
#include "ops/rmsnorm_backends.h"

namespace lockstep::cuda {

namespace {

using quant::Bf16;

// Threads of a row's block: one vector each for narrow rows, at most kRowThreads.
int row_threads(int64_t C) {
  return int(std::min<int64_t>(kRowThreads, (C / kVec + 31) / 32 * 32));
}

// The operations that make rstd and y, shared by every kernel that computes them: _rn intrinsics
// are never contracted into FMAs, so they round the same way in every kernel (and like the CPU).
__device__ __forceinline__ float rstd_of(float sum_squares, int64_t C, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_squares, float(C)), eps)));
}
__device__ __forceinline__ void normalize(float (&v)[kVec], float rstd, const float (&w)[kVec]) {
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] = __fmul_rn(__fmul_rn(v[e], rstd), w[e]);
}

// The vector of x at p, plus the residual's when kResidual: its values, and its bf16 bits returned
// (with a residual: the sum, rounded as add_into rounds it, to store into x).
template <bool kResidual>
__device__ __forceinline__ uint4 load_input(const uint16_t* x, const uint16_t* residual, int64_t p,
                                            float (&a)[kVec]) {
  uint4 raw = *reinterpret_cast<const uint4*>(x + p);
  unpack_bf16x8(raw, a);
  if constexpr (kResidual) {
    float b[kVec];
    load_bf16x8(residual + p, b);
#pragma unroll
    for (int e = 0; e < kVec; ++e) a[e] = __fadd_rn(a[e], b[e]);
    raw = pack_bf16x8(a);
    unpack_bf16x8(raw, a);
  }
  return raw;
}

// What rmsnorm_rows_kernel writes besides rstd: nothing (the rstd pass of the fp8 tile kernel), y,
// or y's rowwise fp8 bytes and scales (rmsnorm_forward_fp8's rows for T ≤ quant::kRowsOnlyT: one
// kernel where the tile kernel would take 128-row tiles and a second launch).
enum class RowsOut { rstd, y, fp8 };

// rstd[r] for row r = blockIdx.x of x [R, C], and what kOut says. fp8: y's bytes to q [R, C], its
// scales to s [C/128, R]; the 16 vectors of a 128-column group fall to one half-warp (vector v to
// thread v % blockDim.x, a multiple of 32), which quant::quantize_vector_rows needs.
// gridDim.y slices a row's output (decode sizes, row_slices): each of its blocks computes the
// row's rstd (the same code, the same bits; the first one stores it) and writes the vectors
// blockIdx.y·blockDim.x + i·gridDim.y·blockDim.x + threadIdx.x.
// kResidual: x += residual first (the sums written into x); gridDim.y > 1 only in a cluster of the
// row's gridDim.y blocks. x is read and written, so neither const nor __restrict__.
template <RowsOut kOut, bool kResidual>
__global__ void __launch_bounds__(kRowThreads) rmsnorm_rows_kernel(
    uint16_t* x, const uint16_t* __restrict__ residual, const float* __restrict__ w, int64_t R,
    int64_t C, float eps, float* __restrict__ rstd, uint16_t* __restrict__ y, uint8_t* __restrict__ q,
    float* __restrict__ s, bool pow2) {
  __shared__ float scratch[kRowThreads / 32];
  const int64_t r = blockIdx.x, vectors = C / kVec;
  const int64_t first = int64_t(blockIdx.y) * blockDim.x, stride = int64_t(gridDim.y) * blockDim.x;
  // Launched with an early start in decode steps (core/early_start.h): the weight vectors this
  // thread scales below are prefetched into L1 while the kernel before still runs (a step writes
  // no weight); x and the residual are read after the wait.
  if constexpr (kOut != RowsOut::rstd)
    for (int64_t v = first + threadIdx.x; v < vectors; v += stride)
      asm volatile("prefetch.global.L1 [%0];\n" ::"l"(w + v * kVec));
  wait_for_previous_kernel();
  let_next_kernel_start();
  uint16_t* xr = x + r * C;
  const uint16_t* res = kResidual ? residual + r * C : nullptr;
  float sum = 0;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float a[kVec];
    const uint4 sum_bits = load_input<kResidual>(xr, res, v * kVec, a);
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum = fmaf(a[e], a[e], sum);
    // The rstd pass has one block a row and no second pass: this thread alone reads this vector.
    if constexpr (kResidual && kOut == RowsOut::rstd) *reinterpret_cast<uint4*>(xr + v * kVec) = sum_bits;
  }
  const float rs = rstd_of(block_sum(sum, scratch), C, eps);
  if (threadIdx.x == 0 && blockIdx.y == 0) rstd[r] = rs;
  // Below, thread i of this block writes sums over vectors that thread i of every block of the row
  // has read above. With one block that is thread i itself; otherwise the cluster's barrier.
  if constexpr (kResidual && kOut != RowsOut::rstd)
    if (gridDim.y > 1) cooperative_groups::this_cluster().sync();
  if constexpr (kOut == RowsOut::y) {
    for (int64_t v = first + threadIdx.x; v < vectors; v += stride) {
      float a[kVec], wv[kVec];
      const uint4 sum_bits = load_input<kResidual>(xr, res, v * kVec, a);
      if constexpr (kResidual) *reinterpret_cast<uint4*>(xr + v * kVec) = sum_bits;
      load_f32x8(w + v * kVec, wv);
      normalize(a, rs, wv);
      store_bf16x8(y + r * C + v * kVec, a);
    }
  }
  if constexpr (kOut == RowsOut::fp8) {
    for (int64_t v0 = first; v0 < vectors; v0 += stride) {  // uniform: every lane reaches the shuffles
      const int64_t v = v0 + threadIdx.x;
      const bool valid = v < vectors;  // a whole half-warp's: vectors is a multiple of 16
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (valid) {
        float a[kVec], wv[kVec];
        const uint4 sum_bits = load_input<kResidual>(xr, res, v * kVec, a);
        if constexpr (kResidual) *reinterpret_cast<uint4*>(xr + v * kVec) = sum_bits;
        load_f32x8(w + v * kVec, wv);
        normalize(a, rs, wv);
        raw = pack_bf16x8(a);
      }
      quant::quantize_vector_rows(raw, valid, q + r * C + v * kVec, s + v * kVec / quant::kTile * R + r, pow2);
    }
  }
}

// Block p: rows [p·rows_per_part, ...) of dx, and their Σ dy·x̂ into partial[p, :].
// Dynamic shared memory: C floats, this run's dw, touched by each thread for its own columns only:
// elements 0–3 of vector v at lo[v], 4–7 at hi[v], so consecutive threads access consecutive 16
// bytes (no bank conflicts).
__global__ void __launch_bounds__(kRowThreads) rmsnorm_backward_kernel(
    uint16_t* dx, float* __restrict__ partial, const uint16_t* dy, const uint16_t* x,
    const float* __restrict__ w, const float* __restrict__ rstd, int64_t R, int64_t C,
    int64_t rows_per_part) {
  extern __shared__ float4 dw_shared[];
  __shared__ float scratch[kRowThreads / 32];
  const int64_t vectors = C / kVec, begin = blockIdx.x * rows_per_part;
  const int64_t end = std::min(R, begin + rows_per_part);
  float4* lo = dw_shared;
  float4* hi = dw_shared + vectors;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) lo[v] = hi[v] = make_float4(0, 0, 0, 0);

  for (int64_t r = begin; r < end; ++r) {
    const float rs = rstd[r];
    // x̂ = x·rstd, g = w·dy; dx = rstd·(g − x̂·mean(x̂·g)).
    float dot = 0;
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      float xv[kVec], gv[kVec], wv[kVec];
      load_bf16x8(x + r * C + v * kVec, xv);
      load_bf16x8(dy + r * C + v * kVec, gv);
      load_f32x8(w + v * kVec, wv);
      float d[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float xhat = xv[e] * rs;
        d[e] = gv[e] * xhat;
        dot = fmaf(xhat, wv[e] * gv[e], dot);
      }
      float4 a = lo[v], b = hi[v];
      a.x += d[0], a.y += d[1], a.z += d[2], a.w += d[3];
      b.x += d[4], b.y += d[5], b.z += d[6], b.w += d[7];
      lo[v] = a, hi[v] = b;
    }
    const float mean = block_sum(dot, scratch) / float(C);
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      float xv[kVec], gv[kVec], wv[kVec];
      load_bf16x8(x + r * C + v * kVec, xv);
      load_bf16x8(dy + r * C + v * kVec, gv);
      load_f32x8(w + v * kVec, wv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) gv[e] = rs * (wv[e] * gv[e] - xv[e] * rs * mean);
      store_bf16x8(dx + r * C + v * kVec, gv);  // after this thread's reads: dx may alias x or dy
    }
  }
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float4* out = reinterpret_cast<float4*>(partial + blockIdx.x * C + v * kVec);
    out[0] = lo[v];
    out[1] = hi[v];
  }
}

// for_each_tile's ring depth (quantize_device.cuh): 64 KB of x in flight a block, two blocks an SM
// (three for the rows alone, which need no scratch).
constexpr int kRingStages = 2;

// The tile of x is what the tile loop prefetches; its 8 rows' rstd and 8 columns' w (L2-resident,
// a few bytes a thread) are read at the start of processing.
template <bool kColumnwise>
__global__ void __launch_bounds__(Bf16::kThreads, kColumnwise ? 2 : 3) rmsnorm_quantize_kernel(
    const uint16_t* __restrict__ x, const float* __restrict__ rstd, const float* __restrict__ w,
    int64_t T, int64_t K, uint8_t* __restrict__ q, float* __restrict__ s, uint8_t* __restrict__ qt,
    float* __restrict__ st, int64_t Tp, bool pow2) {
  extern __shared__ uint4 ring[];
  __shared__ quant::ColumnScratch scratch;
  const int r0 = Bf16::row0(), c0 = Bf16::col0();
  const auto load = [&](const auto& to, int64_t t0, int64_t k0) { Bf16::load(to, 0, x, K, T, t0, k0); };
  quant::for_each_tile<Bf16, Bf16::kThreads, kRingStages>(T, K, ring, load, [&](Bf16& f, int64_t t0, int64_t k0) {
    float wv[kVec];
    load_f32x8(w + k0 + c0, wv);
#pragma unroll
    for (int p = 0; p < Bf16::kRows; ++p) {
      if (t0 + r0 + p >= T) continue;  // padding rows stay zero
      float v[kVec];
      unpack_bf16x8(f.raw[p], v);
      normalize(v, rstd[t0 + r0 + p], wv);
      f.raw[p] = pack_bf16x8(v);
    }
    quant::quantize_tile_rows(f, t0, k0, T, K, q, s, pow2);
    if constexpr (kColumnwise) quant::quantize_tile_columns(f, t0, k0, K, Tp, qt, st, pow2, scratch);
  });
}

const uint16_t* bf16_data(const Tensor& t) { return static_cast<const uint16_t*>(t.data()); }

// Blocks a row's output is sliced over: at decode sizes (R ≤ kSlicedRows) one vector a thread, so
// that R = 1 is not one block walking the row; larger batches have blocks enough, and one a row
// reads the row from memory once.
constexpr int64_t kSlicedRows = 64;
unsigned row_slices(int64_t R, int64_t C) {
  return R <= kSlicedRows ? unsigned((C / kVec + row_threads(C) - 1) / row_threads(C)) : 1;
}

// The most blocks a row is sliced over with a residual: the portable cluster size.
constexpr unsigned kMaxClusterSlices = 8;

// With a residual a row's slices form a cluster of a power-of-two size (the shapes every Hopper
// cluster launch takes; a block past the row's end only helps sum it). Without: row_slices.
unsigned slices_of(int64_t R, int64_t C, bool residual) {
  const unsigned slices = row_slices(R, C);
  return residual ? std::min(std::bit_ceil(slices), kMaxClusterSlices) : slices;
}

template <RowsOut kOut>
void launch_rows(Tensor& x, const Tensor* residual, const Tensor& w, float eps, Tensor& rstd,
                 uint16_t* y, Fp8Rows* rows = nullptr, bool pow2 = false) {
  const int64_t R = x.dim(0), C = x.dim(1);
  if (R == 0) return;
  const unsigned slices = kOut == RowsOut::rstd ? 1 : slices_of(R, C, residual != nullptr);
  // A row's CTAs form a cluster when a residual's sums are written back.
  LaunchConfig launch(dim3(unsigned(R), slices), dim3(unsigned(row_threads(C))), 0,
                      residual && slices > 1 ? std::optional(dim3(1, slices, 1)) : std::nullopt);
  launch.early_start_in_scope();
  const auto kernel = residual ? rmsnorm_rows_kernel<kOut, true> : rmsnorm_rows_kernel<kOut, false>;
  launch.run(
      kernel, static_cast<uint16_t*>(x.data()),
      residual ? static_cast<const uint16_t*>(residual->data()) : nullptr, w.data_as<float>(), R, C,
      eps, rstd.data_as<float>(), y, rows ? static_cast<uint8_t*>(rows->data.data()) : nullptr,
      rows ? rows->scales.data_as<float>() : nullptr, pow2);
}

template <bool kColumnwise>
void launch_quantize(const Tensor& x, const Tensor& rstd, const Tensor& w, Fp8Rows& rows,
                     Fp8Rows* cols, bool pow2) {
  const int64_t T = x.dim(0), K = x.dim(1), Tp = round_up(T, quant::kTile);
  const int64_t tiles = Tp / quant::kTile * (K / quant::kTile);
  constexpr auto kernel = rmsnorm_quantize_kernel<kColumnwise>;
  constexpr size_t smem = quant::ring_bytes<Bf16, Bf16::kThreads>(kRingStages);
  kernel<<<quant::persistent_grid<kernel>(Bf16::kThreads, smem, tiles), Bf16::kThreads, smem, current_stream()>>>(
      bf16_data(x), rstd.data_as<float>(), w.data_as<float>(), T, K, static_cast<uint8_t*>(rows.data.data()),
      rows.scales.data_as<float>(), cols ? static_cast<uint8_t*>(cols->data.data()) : nullptr,
      cols ? cols->scales.data_as<float>() : nullptr, Tp, pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd, Tensor& x, const Tensor* residual, const Tensor& w,
                     float eps) {
  launch_rows<RowsOut::y>(x, residual, w, eps, rstd, static_cast<uint16_t*>(y.data()));
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  const int64_t R = x.dim(0), C = x.dim(1);
  const RowParts split(R);
  if (split.parts == 0) return;
  const size_t shared = size_t(C) * sizeof(float);
  constexpr size_t kMaxShared = 192 * 1024;  // below Hopper's 227 KB per block
  LOCKSTEP_CHECK(shared <= kMaxShared, "rmsnorm_backward: the CUDA kernel takes rows of at most ",
                 kMaxShared / sizeof(float), " columns, got ", x.describe());
  if (shared > 48 * 1024)  // more than the default needs an opt-in
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
  Tensor partial = Tensor::empty({split.parts, C}, DType::f32, Device::cuda);
  rmsnorm_backward_kernel<<<unsigned(split.parts), row_threads(C), shared, current_stream()>>>(
      static_cast<uint16_t*>(dx.data()), partial.data_as<float>(), bf16_data(dy), bf16_data(x),
      w.data_as<float>(), rstd.data_as<float>(), R, C, split.rows_per_part);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  add_partial_sums(dw.data_as<float>(), partial.data_as<float>(), split.parts, C);
}

void rmsnorm_forward_fp8(Fp8Rows& y_rows, Fp8Rows* y_cols, Tensor& rstd, Tensor& x,
                         const Tensor* residual, const Tensor& w, float eps, bool pow2) {
  if (x.dim(0) == 0) return;
  if (!y_cols && x.dim(0) <= quant::kRowsOnlyT) {
    launch_rows<RowsOut::fp8>(x, residual, w, eps, rstd, nullptr, &y_rows, pow2);
    return;
  }
  launch_rows<RowsOut::rstd>(x, residual, w, eps, rstd, nullptr);  // x holds the sums after it
  if (y_cols) launch_quantize<true>(x, rstd, w, y_rows, y_cols, pow2);
  else launch_quantize<false>(x, rstd, w, y_rows, nullptr, pow2);
}

}  // namespace lockstep::cuda
