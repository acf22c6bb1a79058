// ops/cuda/swiglu.cu — CUDA backend of ops/swiglu.h (bf16 activations).
//
// Forward and backward are elementwise over [T, I]: each thread takes one 8-wide column vector and
// walks rows (vectors of gate, up and the output at the same column), 16-byte accesses throughout.
//
// swiglu_forward_fp8: a tile kernel over the output [T, I] in 128×128 tiles; it loads the gate and
// up tiles, computes the output with the forward's operations into a bf16 Fragment and quantizes it
// with numerics/cuda/quantize_device.cuh without storing it: the bytes of swiglu_forward followed by
// quantize_rows(_and_columns). HBM traffic per output element: 4 bytes read plus 1 or 2 fp8 bytes,
// against 4 + 2 (swiglu) + 2 + 2 (quantization) unfused. Rows only at T ≤ quant::kRowsOnlyT (decode),
// where 128-row tiles would be few or mostly padding: a thread per 8-wide output vector
// (quant::quantize_vector_rows), the same operations and bytes.
//
// From an E4M3 gate_up (the fp8 recompute path): the backward and the fused forward read the bytes
// and scales and dequantize in registers with dequantize's operations, instead of a dequantize pass
// writing a bf16 gate_up (4 bytes an output element) that both then read (4 + 4): 2 bytes read
// each.
#include "core/cuda_check.h"
#include "core/cuda_launch.h"
#include "core/cuda_stream.h"
#include "core/dependent_launch.cuh"
#include "numerics/cuda/quantize_device.cuh"
#include "ops/cuda/vector.cuh"
#include "ops/swiglu_backends.h"

namespace lockstep::cuda {

namespace {

using quant::Bf16;

// silu(g)·u with the operations of the CPU reference; _rn intrinsics are never contracted into
// FMAs, so every kernel that calls this rounds the same way.
__device__ __forceinline__ float silu_times(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// gate_up [T, 2I] -> out [T, I].
__global__ void swiglu_forward_kernel(uint16_t* __restrict__ out, const uint16_t* __restrict__ gate_up,
                                      int64_t T, int64_t I) {
  const int64_t c = (int64_t(blockIdx.x) * kRowThreads + threadIdx.x) * kVec;
  if (c >= I) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float g[kVec], u[kVec];
    load_bf16x8(gate_up + t * 2 * I + c, g);
    load_bf16x8(gate_up + t * 2 * I + I + c, u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[e] = silu_times(g[e], u[e]);
    store_bf16x8(out + t * I + c, g);
  }
}

// The gradients of silu(g)·u for the output gradient d, with the CPU reference's operations in its
// order (never contracted: _rn intrinsics), so both backward kernels round alike: g and u are
// replaced by dg and du.
__device__ __forceinline__ void swiglu_grad(float& g, float& u, float d) {
  const float denom = __fadd_rn(1.0f, expf(-g));
  const float s = __fdiv_rn(1.0f, denom), silu = __fdiv_rn(g, denom);
  const float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
  g = __fmul_rn(__fmul_rn(d, u), dsilu);
  u = __fmul_rn(d, silu);
}

// Eight E4M3 bytes (the first in the lowest byte) times their group's scale, rounded to bf16 as
// dequantize does (numerics/cuda/quantize.cu, the same operations) and widened back: the values the
// bf16 kernels read from dequantize's output.
__device__ __forceinline__ void dequantize_bf16x8(const uint2& bytes, float scale, float (&v)[kVec]) {
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const uint32_t word = e < 4 ? bytes.x : bytes.y;
    v[e] = round_to_bf16(e4m3_to_float(e4m3{uint8_t(word >> (8 * (e % 4)))}) * scale);
  }
}

__global__ void swiglu_backward_kernel(uint16_t* __restrict__ dgate_up, const uint16_t* __restrict__ dout,
                                       const uint16_t* __restrict__ gate_up, int64_t T, int64_t I) {
  const int64_t c = (int64_t(blockIdx.x) * kRowThreads + threadIdx.x) * kVec;
  if (c >= I) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float g[kVec], u[kVec], d[kVec];
    load_bf16x8(gate_up + t * 2 * I + c, g);
    load_bf16x8(gate_up + t * 2 * I + I + c, u);
    load_bf16x8(dout + t * I + c, d);
#pragma unroll
    for (int e = 0; e < kVec; ++e) swiglu_grad(g[e], u[e], d[e]);
    store_bf16x8(dgate_up + t * 2 * I + c, g);
    store_bf16x8(dgate_up + t * 2 * I + I + c, u);
  }
}

// swiglu_backward_kernel on an E4M3 gate_up: bytes q [T, 2I], scales [2I/128, T]. A thread's 8
// columns lie in one group (of the gate, and of the up projection).
__global__ void swiglu_backward_fp8_kernel(uint16_t* __restrict__ dgate_up, const uint16_t* __restrict__ dout,
                                           const uint8_t* __restrict__ q, const float* __restrict__ scales,
                                           int64_t T, int64_t I) {
  const int64_t c = (int64_t(blockIdx.x) * kRowThreads + threadIdx.x) * kVec;
  if (c >= I) return;
  const float* gate_scales = scales + c / quant::kTile * T;
  const float* up_scales = scales + (I + c) / quant::kTile * T;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float g[kVec], u[kVec], d[kVec];
    dequantize_bf16x8(*reinterpret_cast<const uint2*>(q + t * 2 * I + c), gate_scales[t], g);
    dequantize_bf16x8(*reinterpret_cast<const uint2*>(q + t * 2 * I + I + c), up_scales[t], u);
    load_bf16x8(dout + t * I + c, d);
#pragma unroll
    for (int e = 0; e < kVec; ++e) swiglu_grad(g[e], u[e], d[e]);
    store_bf16x8(dgate_up + t * 2 * I + c, g);
    store_bf16x8(dgate_up + t * 2 * I + I + c, u);
  }
}

struct GluTile {
  Bf16 gate, up;
};

// for_each_tile's ring depth (quantize_device.cuh): one tile (gate and up, 64 KB) in flight a block
// while the current one is computed, two blocks an SM: 16 warps to hide the latency of the division
// and exp chains.
constexpr int kRingStages = 1;

template <bool kColumnwise>
__global__ void __launch_bounds__(Bf16::kThreads, 2) swiglu_quantize_kernel(
    const uint16_t* __restrict__ gate_up, int64_t T, int64_t I, uint8_t* __restrict__ q,
    float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st, int64_t Tp, bool pow2) {
  extern __shared__ uint4 ring[];
  __shared__ quant::ColumnScratch scratch;
  const auto load = [&](const auto& to, int64_t t0, int64_t k0) {
    Bf16::load(to, 0, gate_up, 2 * I, T, t0, k0);
    Bf16::load(to, Bf16::kRows, gate_up + I, 2 * I, T, t0, k0);
  };
  // Padding rows (past T) load as zeros and give silu(0)·0 = 0: the zero padding.
  const auto compute = [&](GluTile& tile, int64_t t0, int64_t k0) {
#pragma unroll
    for (int p = 0; p < Bf16::kRows; ++p) {
      float g[kVec], u[kVec];
      unpack_bf16x8(tile.gate.raw[p], g);
      unpack_bf16x8(tile.up.raw[p], u);
#pragma unroll
      for (int e = 0; e < kVec; ++e) g[e] = silu_times(g[e], u[e]);
      tile.gate.raw[p] = pack_bf16x8(g);
    }
    quant::quantize_tile_rows(tile.gate, t0, k0, T, I, q, s, pow2);
    if constexpr (kColumnwise) quant::quantize_tile_columns(tile.gate, t0, k0, I, Tp, qt, st, pow2, scratch);
  };
  quant::for_each_tile<GluTile, Bf16::kThreads, kRingStages>(T, I, ring, load, compute);
}

// swiglu_quantize_kernel's rows for T ≤ quant::kRowsOnlyT: one 8-wide output vector a thread (vector i
// of the [T, I] output), grouped by quant::quantize_vector_rows; the same operations on the same
// values, so the same bytes.
__global__ void __launch_bounds__(quant::kSmallThreads) swiglu_quantize_rows_small_kernel(
    const uint16_t* __restrict__ gate_up, int64_t T, int64_t I, uint8_t* __restrict__ q,
    float* __restrict__ s, bool pow2) {
  wait_for_previous_kernel();  // launched with an early start in decode steps (core/early_start.h)
  let_next_kernel_start();
  const int64_t i = int64_t(blockIdx.x) * quant::kSmallThreads + threadIdx.x;
  const int64_t t = i / (I / kVec), c = i % (I / kVec) * kVec;
  const bool valid = t < T;
  uint4 raw = make_uint4(0, 0, 0, 0);
  if (valid) {
    float g[kVec], u[kVec];
    load_bf16x8(gate_up + t * 2 * I + c, g);
    load_bf16x8(gate_up + t * 2 * I + I + c, u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[e] = silu_times(g[e], u[e]);
    raw = pack_bf16x8(g);
  }
  quant::quantize_vector_rows(raw, valid, q + t * I + c, s + c / quant::kTile * T + t, pow2);
}

// swiglu_quantize_kernel on an E4M3 gate_up (bytes [T, 2I], scales [2I/128, T]): the tile of the
// output it quantizes, (blockIdx.x / (I/128), blockIdx.x % (I/128)), is computed from the dequantized
// gate and up values, so the bytes are those of dequantize followed by swiglu_forward_fp8. One tile a
// block, its loads (a thread's 8 rows × 8 bytes of gate and of up, and their scales) all issued first.
template <bool kColumnwise>
__global__ void __launch_bounds__(Bf16::kThreads, 2) swiglu_quantize_fp8_kernel(
    const uint8_t* __restrict__ gate_up, const float* __restrict__ gate_up_scales, int64_t T, int64_t I,
    uint8_t* __restrict__ q, float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st,
    int64_t Tp, bool pow2) {
  __shared__ quant::ColumnScratch scratch;
  const int64_t tiles_k = I / quant::kTile;
  const int64_t t0 = blockIdx.x / tiles_k * quant::kTile, k0 = blockIdx.x % tiles_k * quant::kTile;
  const int64_t r0 = t0 + Bf16::row0(), c0 = k0 + Bf16::col0();
  const float* gate_scales = gate_up_scales + k0 / quant::kTile * T;
  const float* up_scales = gate_up_scales + (I + k0) / quant::kTile * T;
  uint2 gate[Bf16::kRows], up[Bf16::kRows];
  float gate_scale[Bf16::kRows], up_scale[Bf16::kRows];
#pragma unroll
  for (int p = 0; p < Bf16::kRows; ++p) {  // padding rows (past T) read as zeros, as in the bf16 kernel
    const bool in = r0 + p < T;
    const uint8_t* row = gate_up + (r0 + p) * 2 * I + c0;
    gate[p] = in ? *reinterpret_cast<const uint2*>(row) : make_uint2(0, 0);
    up[p] = in ? *reinterpret_cast<const uint2*>(row + I) : make_uint2(0, 0);
    gate_scale[p] = in ? gate_scales[r0 + p] : 0.0f;
    up_scale[p] = in ? up_scales[r0 + p] : 0.0f;
  }
  Bf16 f;
#pragma unroll
  for (int p = 0; p < Bf16::kRows; ++p) {
    float g[kVec], u[kVec];
    dequantize_bf16x8(gate[p], gate_scale[p], g);
    dequantize_bf16x8(up[p], up_scale[p], u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[e] = silu_times(g[e], u[e]);
    f.raw[p] = pack_bf16x8(g);
  }
  quant::quantize_tile_rows(f, t0, k0, T, I, q, s, pow2);
  if constexpr (kColumnwise) quant::quantize_tile_columns(f, t0, k0, I, Tp, qt, st, pow2, scratch);
}

const uint16_t* bf16_data(const Tensor& t) { return static_cast<const uint16_t*>(t.data()); }
uint16_t* bf16_data(Tensor& t) { return static_cast<uint16_t*>(t.data()); }

template <bool kColumnwise>
void launch_quantize(const Tensor& gate_up, Fp8Rows& rows, Fp8Rows* cols, bool pow2) {
  const int64_t T = gate_up.dim(0), I = gate_up.dim(1) / 2, Tp = round_up(T, quant::kTile);
  const int64_t tiles = Tp / quant::kTile * (I / quant::kTile);
  if (tiles == 0) return;
  if (!kColumnwise && T <= quant::kRowsOnlyT) {
    LaunchConfig(dim3(quant::small_grid(T * I / kVec)), dim3(quant::kSmallThreads), 0)
        .early_start_in_scope()
        .run(swiglu_quantize_rows_small_kernel, bf16_data(gate_up), T, I, static_cast<uint8_t*>(rows.data.data()),
             rows.scales.data_as<float>(), pow2);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  constexpr auto kernel = swiglu_quantize_kernel<kColumnwise>;
  constexpr size_t smem = quant::ring_bytes<GluTile, Bf16::kThreads>(kRingStages);
  kernel<<<quant::persistent_grid<kernel>(Bf16::kThreads, smem, tiles), Bf16::kThreads, smem, current_stream()>>>(
      bf16_data(gate_up), T, I, static_cast<uint8_t*>(rows.data.data()), rows.scales.data_as<float>(),
      cols ? static_cast<uint8_t*>(cols->data.data()) : nullptr, cols ? cols->scales.data_as<float>() : nullptr,
      Tp, pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

template <bool kColumnwise>
void launch_quantize_fp8(const Fp8Rows& gate_up, Fp8Rows& rows, Fp8Rows* cols, bool pow2) {
  const int64_t T = gate_up.rows(), I = gate_up.cols() / 2, Tp = round_up(T, quant::kTile);
  const int64_t tiles = Tp / quant::kTile * (I / quant::kTile);
  if (tiles == 0) return;
  swiglu_quantize_fp8_kernel<kColumnwise><<<unsigned(tiles), Bf16::kThreads, 0, current_stream()>>>(
      static_cast<const uint8_t*>(gate_up.data.data()), gate_up.scales.data_as<float>(), T, I,
      static_cast<uint8_t*>(rows.data.data()), rows.scales.data_as<float>(),
      cols ? static_cast<uint8_t*>(cols->data.data()) : nullptr,
      cols ? cols->scales.data_as<float>() : nullptr, Tp, pow2);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swiglu_forward(Tensor& out, const Tensor& gate_up) {
  const int64_t T = gate_up.dim(0), I = out.dim(1);
  if (T == 0 || I == 0) return;
  swiglu_forward_kernel<<<row_grid(T, I / kVec), kRowThreads, 0, current_stream()>>>(
      bf16_data(out), bf16_data(gate_up), T, I);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  const int64_t T = gate_up.dim(0), I = dout.dim(1);
  if (T == 0 || I == 0) return;
  swiglu_backward_kernel<<<row_grid(T, I / kVec), kRowThreads, 0, current_stream()>>>(
      bf16_data(dgate_up), bf16_data(dout), bf16_data(gate_up), T, I);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void swiglu_forward_fp8(Fp8Rows& out_rows, Fp8Rows* out_cols, const Tensor& gate_up, bool pow2) {
  if (out_cols) launch_quantize<true>(gate_up, out_rows, out_cols, pow2);
  else launch_quantize<false>(gate_up, out_rows, nullptr, pow2);
}

void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Fp8Rows& gate_up) {
  const int64_t T = gate_up.rows(), I = dout.dim(1);
  if (T == 0 || I == 0) return;
  swiglu_backward_fp8_kernel<<<row_grid(T, I / kVec), kRowThreads, 0, current_stream()>>>(
      bf16_data(dgate_up), bf16_data(dout), static_cast<const uint8_t*>(gate_up.data.data()),
      gate_up.scales.data_as<float>(), T, I);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void swiglu_forward_fp8(Fp8Rows& out_rows, Fp8Rows* out_cols, const Fp8Rows& gate_up, bool pow2) {
  if (out_cols) launch_quantize_fp8<true>(gate_up, out_rows, out_cols, pow2);
  else launch_quantize_fp8<false>(gate_up, out_rows, nullptr, pow2);
}

}  // namespace lockstep::cuda
