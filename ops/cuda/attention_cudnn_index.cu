// ops/cuda/attention_cudnn_index.cu — see ops/cuda/attention_cudnn_index.h. Both kernels are tiny:
// one block walks the S + 1 offsets (a few hundred at most in training); the fill exits at once
// unless cu_seqlens was invalid.
#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/cuda/attention_cudnn_index.h"

namespace lockstep::cudnn {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kFillBlocks = 264;  // two per SM of an H100/H200: only the error path fills

struct RowElements {
  int64_t k[3];
};

__global__ void __launch_bounds__(kThreads)
    sdpa_index_kernel(SdpaIndex index, const int32_t* cu, int64_t sequences, int64_t batch,
                      int64_t rows, RowElements row_elements) {
  // Valid when c[0] = 0, c never decreases and c[S] = rows: then 0 ≤ c[s] ≤ rows everywhere, and
  // every sequence's rows lie inside the tensors.
  bool bad = false;
  for (int64_t s = threadIdx.x; s <= sequences; s += kThreads) {
    const int32_t c = cu[s];
    bad |= (s == 0 ? c != 0 : c < cu[s - 1]) || (s == sequences && c != rows);
  }
  bad = __syncthreads_or(bad);
  for (int64_t b = threadIdx.x; b <= batch; b += kThreads) {
    const int64_t start = bad ? 0 : cu[b < sequences ? b : sequences];
    for (int k = 0; k < 3; ++k) index.offsets[k][b] = start * row_elements.k[k];
    if (b < batch) index.seq_len[b] = bad || b >= sequences ? 0 : cu[b + 1] - cu[b];
  }
  if (threadIdx.x == 0) *index.invalid = bad;
}

__global__ void __launch_bounds__(kThreads)
    fill_if_invalid_kernel(const int32_t* invalid, FillRanges ranges) {
  if (*invalid == 0) return;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int r = 0; r < 2; ++r) {
    uint32_t* data = static_cast<uint32_t*>(ranges.data[r]);
    for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < ranges.words[r]; i += stride)
      data[i] = 0xFFFFFFFFu;
  }
}

}  // namespace

void make_sdpa_index(const SdpaIndex& index, const int32_t* cu_seqlens, int64_t sequences,
                     int64_t batch, int64_t rows, const int64_t (&row_elements)[3]) {
  const RowElements elements{{row_elements[0], row_elements[1], row_elements[2]}};
  sdpa_index_kernel<<<1, kThreads, 0, current_stream()>>>(index, cu_seqlens, sequences, batch, rows,
                                                          elements);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void fill_if_invalid(const int32_t* invalid, const FillRanges& ranges) {
  const int64_t words = std::max(ranges.words[0], ranges.words[1]);
  if (words == 0) return;
  const int64_t blocks = std::min((words + kThreads - 1) / kThreads, kFillBlocks);
  fill_if_invalid_kernel<<<unsigned(blocks), kThreads, 0, current_stream()>>>(invalid, ranges);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cudnn
