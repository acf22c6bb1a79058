// core/cp_async.cuh — asynchronous global → shared copies (cp.async, sm_80+), shared by the kernels
// that stream tiles through shared memory (numerics/cuda/quantize_device.cuh, ops/cuda/attention.cu,
// ops/cuda/gemm_fp8_small_t.cu). Each thread commits its own copies in groups and waits for them;
// a block barrier is still needed before other threads read what it copied.
#pragma once

#include <cstdint>

namespace lockstep::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// 16 (4) bytes global → shared, cached in L2 only (in L1 too); zeros, and no read of src, when
// !valid (src must still be an address, any).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace lockstep::cuda
