// ops/cuda/gemm_fp8_grouped.cu — ops/gemm.h's gemm_fp8_grouped: the experts of a mixture-of-experts
// layer in one launch of the weight-streaming kernel (ops/cuda/gemm_fp8_stream_kernel.cuh, grouped).
//
// The layout is DeepGEMM's m-grouped contiguous one (deep_gemm/include/deep_gemm/scheduler/gemm.cuh):
// every expert's rows contiguous, each M tile (here a token tile: the kernel computes outᵀ tiles of
// 64 weight rows × 8·NT tokens) belonging to one expert. DeepGEMM's MGroupedContiguous names each
// row's expert in a per-row index, the experts' rows padded to its block height; its
// MGroupedContiguousWithPsumLayout takes the prefix-sum offsets and numbers each expert's blocks
// after the previous expert's, every expert starting at a block-aligned row. Here the tiles are
// numbered the same way from the offsets but start at the expert's first row, so the gathered rows
// need no padding and the MoE dispatch plan (model/moe.h) is used as it is; a CTA finds its tile's
// expert with a warp's prefix sum over the experts' tile counts.
//
// One tile width for the launch: the narrowest that holds the most loaded expert (8 .. 64 rows),
// else tiles of 128 (an expert with more rows has several). At decode token counts every expert
// has a few rows and the narrow tile wastes little of the tensor cores; a row's bits are the same
// at every width (the kernel's property), so they never depend on how the other experts are loaded.
// The kernel is launched without an early start: its tiles read the offsets first, and those must
// have landed. With the offsets on the device alone (a CUDA graph's decode step) the launch is sized
// for the most tiles they could take, and a tile that no expert holds exits at once.
//
// Checked by tests/gpu/test_gemm_gpu.cpp (Fp8GroupedGpu*); timed by `bench_gemm --grouped`.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cuda_check.h"
#include "ops/cuda/gemm_fp8_stream_kernel.cuh"
#include "ops/gemm_backends.h"

namespace lockstep::cuda {

namespace {

using namespace stream_kernel;

template <int NT, class Out>
void launch(const Args& a, int64_t token_tiles) {
  LOCKSTEP_CHECK(token_tiles <= 65535, "fp8 grouped GEMM: at most 65535 token tiles of ", 8 * NT, " rows, got ",
                 token_tiles);
  launch_config(1, a.M / kRows, Layout<NT>::kSmem, token_tiles).run(prepared_kernel<NT, Out, true>(), a);
}

// The tiles of width 8·NT that the experts' rows take, expert by expert.
int64_t tiles_of(const std::vector<int64_t>& offsets, int64_t width) {
  int64_t tiles = 0;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) tiles += (offsets[e + 1] - offsets[e] + width - 1) / width;
  return tiles;
}

template <class Out>
void launch_for_experts(const Args& a, const std::vector<int64_t>& offsets) {
  int64_t most = 0;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) most = std::max(most, offsets[e + 1] - offsets[e]);
  if (most == 0) return;  // no rows
  with_tile_width(most, [&](auto nt) {
    constexpr int kNT = decltype(nt)::value;
    launch<kNT, Out>(a, tiles_of(offsets, 8 * kNT));
  });
}

// The kernel's arguments for `experts` experts whose offsets are on the device.
Args grouped_args(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, int64_t experts, const Tensor& device_offsets) {
  const int64_t N = y.dim(1);
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(y.data()) % 16 == 0,
                 "fp8 grouped GEMM: the output must be 16-byte aligned, got ", y.describe(), " at ", y.data());
  LOCKSTEP_CHECK(N / kRows <= 65535 && experts <= (int64_t(1) << 30), "fp8 grouped GEMM: at most 65535 row blocks "
                 "and 2^30 experts, got ", w.data.describe(), " over ", experts, " experts");
  Args a{static_cast<const uint8_t*>(x.data.data()), x.scales.data_as<float>(),
         static_cast<const uint8_t*>(w.data.data()), w.scales.data_as<float>(), y.data(),
         x.rows(), N, x.cols(), w.scales.dim(1)};
  a.group_offsets = device_offsets.data_as<int64_t>();
  a.groups = int(experts);
  return a;
}

}  // namespace

void gemm_fp8_grouped(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, const std::vector<int64_t>& offsets,
                      const Tensor& device_offsets) {
  const Args a = grouped_args(y, x, w, int64_t(offsets.size()) - 1, device_offsets);
  if (y.dtype() == DType::f32) return launch_for_experts<float>(a, offsets);
  launch_for_experts<uint16_t>(a, offsets);
}

// The tile width from most_rows; R rows over E experts take at most ⌊R/W⌋ + min(E, R) tiles of width
// W (an expert of n > 0 rows takes ⌈n/W⌉ ≤ ⌊n/W⌋ + 1).
void gemm_fp8_grouped(Tensor& y, const Fp8Rows& x, const Fp8Blocks& w, int64_t most_rows,
                      const Tensor& device_offsets) {
  const int64_t experts = device_offsets.dim(0) - 1, rows = x.rows(), most = std::min(most_rows, rows);
  const Args a = grouped_args(y, x, w, experts, device_offsets);
  if (most == 0) return;
  with_tile_width(most, [&](auto nt) {
    constexpr int kNT = decltype(nt)::value;
    const int64_t tiles = rows / (8 * kNT) + std::min(experts, rows);
    if (y.dtype() == DType::f32) return launch<kNT, float>(a, tiles);
    launch<kNT, uint16_t>(a, tiles);
  });
}

}  // namespace lockstep::cuda
