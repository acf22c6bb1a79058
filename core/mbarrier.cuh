// core/mbarrier.cuh — shared-memory barriers (mbarrier, sm_90) and the copies that complete them:
// cp.async (core/cp_async.cuh) and TMA tile copies (cp.async.bulk.tensor). Used by the pipelines of
// ops/cuda/gemm_fp8_small_t.cu.
//
// A barrier has a phase; it completes when its expected count of arrivals has arrived and, for
// TMA, its expected transaction bytes have landed; waiting threads then see every write the
// arrivals and copies released (acquire). A fresh barrier is in phase 0: a wait for parity 1
// passes at once (the phase "before" it counts as complete), so a consumer ring's `empty` barriers
// need no first round of arrivals.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/cp_async.cuh"

namespace lockstep::cuda {

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
// After the initializations, before any copy (async proxy) may use the barriers; a CTA barrier
// must still follow before other threads use them.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// One arrival that also announces `bytes` of TMA copies still to land.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// One arrival, made when every cp.async this thread issued so far has landed (the barrier's count
// includes it: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// The box of a 2-D tensor map at (x: innermost, y) → shared memory at dst, completing bar's
// transaction bytes (the whole box, parts outside the tensor zero-filled).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(smem_address(dst)),
      "l"(map), "r"(x), "r"(y), "r"(smem_address(bar))
      : "memory");
}

}  // namespace lockstep::cuda
