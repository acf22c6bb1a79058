// ops/cuda/swiglu.cu — CUDA backend of ops/swiglu.h (bf16 activations).
//
// Forward and backward are elementwise over [T, I]: each thread takes one 8-wide column vector and
// walks rows (vectors of gate, up and the output at the same column), 16-byte accesses throughout.
//
// swiglu_forward_fp8: a tile kernel over the output [T, I] in 128×128 tiles; it loads the gate and
// up tiles, computes the output with the forward's operations into a bf16 Fragment and quantizes it
// with numerics/cuda/quantize_device.cuh without storing it: the bytes of swiglu_forward followed by
// quantize_rows(_and_columns). HBM traffic per output element: 4 bytes read plus 1 or 2 fp8 bytes,
// against 4 + 2 (swiglu) + 2 + 2 (quantization) unfused.
#include "core/cuda_check.h"
#include "core/cuda_stream.h"
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
    for (int e = 0; e < kVec; ++e) {
      const float denom = 1.0f + expf(-g[e]);
      const float s = 1.0f / denom, silu = g[e] / denom;
      const float dsilu = s * (1.0f + g[e] * (1.0f - s));
      g[e] = d[e] * u[e] * dsilu;
      u[e] = d[e] * silu;
    }
    store_bf16x8(dgate_up + t * 2 * I + c, g);
    store_bf16x8(dgate_up + t * 2 * I + I + c, u);
  }
}

struct GluTile {
  Bf16 gate, up;
};

// Ring: one tile (gate and up, 64 KB) in flight a block while the current one is computed, two
// blocks an SM: 16 warps to hide the latency of the division and exp chains. Register prefetch:
// two GluTiles a thread, too many registers for two blocks an SM, so one, which still keeps a
// 64 KB tile of loads in flight.
constexpr int kRingStages = 1;

template <bool kColumnwise, int kStages>
__global__ void __launch_bounds__(Bf16::kThreads, kStages > 0 ? 2 : 1) swiglu_quantize_kernel(
    const uint16_t* __restrict__ gate_up, int64_t T, int64_t I, uint8_t* __restrict__ q,
    float* __restrict__ s, uint8_t* __restrict__ qt, float* __restrict__ st, int64_t Tp, bool pow2) {
  extern __shared__ uint4 ring[];
  __shared__ quant::ColumnScratch scratch;
  const auto load = [&](const auto& to, int64_t t0, int64_t k0) {
    Bf16::load(to, 0, gate_up, 2 * I, T, t0, k0);
    Bf16::load(to, Bf16::kRows, gate_up + I, 2 * I, T, t0, k0);
  };
  // Padding rows (past T) load as zeros and give silu(0)·0 = 0: the zero padding.
  quant::for_each_tile<GluTile, Bf16::kThreads, kStages>(T, I, ring, load, [&](GluTile& tile, int64_t t0, int64_t k0) {
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
  });
}

const uint16_t* bf16_data(const Tensor& t) { return static_cast<const uint16_t*>(t.data()); }
uint16_t* bf16_data(Tensor& t) { return static_cast<uint16_t*>(t.data()); }

template <bool kColumnwise>
void launch_quantize(const Tensor& gate_up, Fp8Rows& rows, Fp8Rows* cols, bool pow2) {
  const int64_t T = gate_up.dim(0), I = gate_up.dim(1) / 2, Tp = round_up(T, quant::kTile);
  const int64_t tiles = Tp / quant::kTile * (I / quant::kTile);
  if (tiles == 0) return;
  quant::with_tile_loop<kRingStages>([&](auto stages) {
    constexpr int kStages = decltype(stages)::value;
    constexpr auto kernel = swiglu_quantize_kernel<kColumnwise, kStages>;
    constexpr size_t smem = quant::ring_bytes<GluTile, Bf16::kThreads>(kStages);
    kernel<<<quant::persistent_grid<kernel>(Bf16::kThreads, smem, tiles), Bf16::kThreads, smem, current_stream()>>>(
        bf16_data(gate_up), T, I, static_cast<uint8_t*>(rows.data.data()), rows.scales.data_as<float>(),
        cols ? static_cast<uint8_t*>(cols->data.data()) : nullptr,
        cols ? cols->scales.data_as<float>() : nullptr, Tp, pow2);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  });
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

}  // namespace lockstep::cuda
