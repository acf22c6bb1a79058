// ops/cuda/moe_dispatch.cu — CUDA backend of ops/moe_dispatch.h: the stable counting sort in one
// block, nothing read back (a decode step's routing stays on the GPU and can be captured).
//
// Counting: every thread adds its rows to the experts' counts in shared memory. Prefix sum: warp 0,
// 32 experts at a time. Placing: the block takes kThreads rows (t, j) at a time; in each warp, the
// lanes of one expert find one another (__match_any_sync) and a lane's rank among them; then warp
// by warp, in order, each lane reads its expert's next free row and the expert's lowest lane moves
// it past the warp's rows of that expert. So the rows of an expert follow (t, j) order, as on the
// CPU. Sizes: a decode step of 256 tokens, top 8, is 2,048 rows (two passes); a prefill chunk of
// 8,192 tokens 64 passes of kWarps barriers each.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/moe_dispatch_backends.h"

namespace lockstep::cuda {

namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) dispatch_kernel(int64_t* __restrict__ offsets,
                                                            int32_t* __restrict__ token_of_row,
                                                            int32_t* __restrict__ slots,
                                                            const int32_t* __restrict__ ids, int rows, int k,
                                                            int E) {
  extern __shared__ int shared[];
  int* count = shared;      // [E]: rows of each expert
  int* next = shared + E;   // [E]: each expert's next free row
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  auto expert = [&](int i) { return min(max(ids[i], 0), E - 1); };
  for (int e = tid; e < E; e += kThreads) count[e] = 0;
  __syncthreads();
  for (int i = tid; i < rows; i += kThreads) atomicAdd(&count[expert(i)], 1);
  __syncthreads();
  if (warp == 0) {
    int before = 0;  // rows of experts [0, e0)
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane, n = e < E ? count[e] : 0;
      int through = n;  // rows of experts [e0, e]
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(~0u, through, d);
        if (lane >= d) through += v;
      }
      if (e < E) {
        next[e] = before + through - n;
        offsets[e] = before + through - n;
      }
      before += __shfl_sync(~0u, through, 31);
    }
    if (lane == 0) offsets[E] = rows;
  }
  __syncthreads();
  for (int base = 0; base < rows; base += kThreads) {
    const int i = base + tid;
    const bool valid = i < rows;
    const int e = valid ? expert(i) : E + lane;  // past the rows: a key of its own
    const unsigned same = __match_any_sync(~0u, e);
    const int rank = __popc(same & ((1u << lane) - 1));
    int first = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (warp == w && valid) {
        first = next[e];
        __syncwarp(same);
        if (rank == 0) next[e] = first + __popc(same);
      }
      __syncthreads();
    }
    if (valid) {
      const int row = first + rank;
      token_of_row[row] = i / k;
      slots[i] = row;
    }
  }
}

}  // namespace

void moe_dispatch(Tensor& offsets, Tensor& token_of_row, Tensor& slots, const Tensor& expert_ids) {
  const int rows = int(expert_ids.numel()), k = int(expert_ids.dim(1)), E = int(offsets.dim(0) - 1);
  dispatch_kernel<<<1, kThreads, size_t(2 * E) * sizeof(int), current_stream()>>>(
      offsets.data_as<int64_t>(), token_of_row.data_as<int32_t>(), slots.data_as<int32_t>(),
      expert_ids.data_as<int32_t>(), rows, k, E);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
