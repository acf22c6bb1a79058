// ops/cuda/block_copy.cu — ops/block_copy.h on CUDA: one kernel for every (pair, tensor), up to
// kMaxTensors tensors a launch (their base pointers travel as a kernel argument, so nothing is
// uploaded). CTA (pair, tensor) copies one block with 16-byte loads and stores when the block size
// and the tensors allow, bytes otherwise.
#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/block_copy_backends.h"

namespace lockstep::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTensors = 128;  // 1 KiB of pointers: well inside the kernel argument limit

struct TensorBases {
  char* base[kMaxTensors];
};

__global__ void __launch_bounds__(kThreads)
    copy_blocks_kernel(TensorBases tensors, const int32_t* pairs, int64_t blocks,
                       int64_t block_bytes, bool vector) {
  const int64_t pair = blockIdx.x;
  const int32_t src = pairs[2 * pair], dst = pairs[2 * pair + 1];
  if (dst < 0 || dst >= blocks) return;
  const bool good = src >= 0 && src < blocks;
  char* base = tensors.base[blockIdx.y];
  char* out = base + dst * block_bytes;
  const char* in = base + (good ? src : dst) * block_bytes;
  if (vector) {
    const uint4 poison = make_uint4(~0u, ~0u, ~0u, ~0u);
    for (int64_t i = threadIdx.x; i < block_bytes / 16; i += kThreads)
      reinterpret_cast<uint4*>(out)[i] = good ? reinterpret_cast<const uint4*>(in)[i] : poison;
  } else {
    for (int64_t i = threadIdx.x; i < block_bytes; i += kThreads)
      out[i] = good ? in[i] : char(0xFF);
  }
}

}  // namespace

void copy_blocks(std::span<Tensor> tensors, const Tensor& pairs) {
  const int64_t blocks = tensors[0].dim(0), count = pairs.dim(0);
  if (blocks == 0) return;  // no dst is inside [0, N)
  LOCKSTEP_CHECK(count <= INT32_MAX, "copy_blocks: ", count,
                 " pairs are more than one launch takes");
  const int64_t block_bytes = int64_t(tensors[0].nbytes()) / blocks;
  for (size_t first = 0; first < tensors.size(); first += kMaxTensors) {
    const size_t n = std::min(tensors.size() - first, size_t(kMaxTensors));
    TensorBases bases{};
    bool vector = block_bytes % 16 == 0;
    for (size_t i = 0; i < n; ++i) {
      bases.base[i] = static_cast<char*>(tensors[first + i].data());
      vector = vector && reinterpret_cast<uintptr_t>(bases.base[i]) % 16 == 0;
    }
    copy_blocks_kernel<<<dim3(unsigned(count), unsigned(n)), kThreads, 0, current_stream()>>>(
        bases, pairs.data_as<int32_t>(), blocks, block_bytes, vector);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace lockstep::cuda
