// ops/cuda/kv_fp8.cu — round_kv_to_fp8 (ops/kv_fp8.h) on CUDA: a warp a k or v head, lane i < head_dim/8
// holding its columns [8i, 8i + 8) (one 16-byte load); the head's amax is a warp max.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/cuda/kv_fp8.cuh"
#include "ops/kv_fp8_backends.h"

namespace lockstep::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) round_kv_kernel(uint16_t* qkv, int64_t heads, int kv_heads, int head_dim,
                                                            int64_t width, int64_t k_offset) {
  const int64_t head = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;  // whole warps: the same for all lanes
  if (head >= heads) return;
  const int lane = threadIdx.x % 32;
  const bool active = lane < head_dim / 8;
  uint16_t* x = qkv + head / (2 * kv_heads) * width + k_offset + head % (2 * kv_heads) * head_dim + lane * 8;
  const uint4 w = active ? *reinterpret_cast<const uint4*>(x) : make_uint4(0, 0, 0, 0);
  const float scale = kv_fp8::warp_head_scale(w);
  if (active) *reinterpret_cast<uint4*>(x) = kv_fp8::dequantize8(kv_fp8::quantize8(w, inverse_scale(scale)), scale);
}

}  // namespace

void round_kv_to_fp8(Tensor& qkv, const HeadLayout& layout) {
  const int64_t heads = qkv.dim(0) * 2 * layout.kv_heads;
  if (heads == 0) return;
  round_kv_kernel<<<unsigned((heads * 32 + kThreads - 1) / kThreads), kThreads, 0, current_stream()>>>(
      static_cast<uint16_t*>(qkv.data()), heads, int(layout.kv_heads), int(layout.head_dim), layout.qkv_width(),
      layout.k_offset());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
