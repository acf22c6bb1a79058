// ops/cuda/wgmma.cuh — Hopper warpgroup MMA on e4m3 (sm_90a), shared by the fp8 GEMM kernels of
// ours (ops/cuda/gemm_fp8_small_t.cu, ops/cuda/gemm_fp8_wgrad.cu).
//
// Operands: K-major e4m3 tiles in shared memory, rows of 128 bytes (one 128-wide K block),
// 128-byte swizzled: 16-byte chunk c of row r sits at chunk c ^ r%8; tiles start 1024-byte aligned
// (kSwizzleAtom). That is what TMA's SWIZZLE_128B writes and what wgmma's SWIZZLE_128B K-major
// descriptors read. A k32 step j of a block starts 32·j bytes into the rows (the hardware swizzles
// the address bits, hence the alignment).
//
// Accumulators: the D fragment of wgmma m64nN f32 (PTX ISA), d[n][e] of lane l (g = l/4,
// q = l%4) of warp w of the warpgroup is row 16·w + g + 8·(e/2), column 8·n + 2·q + e%2.
// wgmma is asynchronous: its registers belong to the tensor cores from the issuing wgmma until
// wgmma_wait says the group is done, and pin_registers keeps the compiler from moving other
// accesses to them across those points.
#pragma once

#include <cstdint>

namespace lockstep::cuda {

constexpr int kSwizzleAtom = 1024;  // 8 rows × 128 bytes

// The shared-memory descriptor of a K-major e4m3 tile (PTX ISA, "Matrix Descriptor Format"):
// start address >> 4 (bits 0-13); leading byte offset (16-29) unused with a swizzle, 1 as CUTLASS
// sets it; stride byte offset (32-45) 1024 >> 4, from one 8-row group to the next; base offset
// (49-51) 0, the tiles being 1024-byte aligned; layout (62-63) 1 = SWIZZLE_128B.
__device__ __forceinline__ uint64_t tile_descriptor(uint32_t address) {
  return uint64_t(address >> 4 & 0x3FFF) | uint64_t(1) << 16 | uint64_t(kSwizzleAtom >> 4) << 32 | uint64_t(1) << 62;
}

// d = (accumulate ? d : 0) + A · Bᵀ over 32 k: A 64 rows (descriptor a), B 8·NT rows (descriptor
// b), d in the D fragment layout above.
template <int NT>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[NT][4], uint64_t a, uint64_t b, bool accumulate) {
#define LOCKSTEP_D(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
  if constexpr (NT == 1) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
        : LOCKSTEP_D(0)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  } else if constexpr (NT == 2) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, "
        "1;\n}\n"
        : LOCKSTEP_D(0), LOCKSTEP_D(1)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  } else if constexpr (NT == 4) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
        : LOCKSTEP_D(0), LOCKSTEP_D(1), LOCKSTEP_D(2), LOCKSTEP_D(3)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  } else if constexpr (NT == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
        "%31}, %32, %33, p, 1, 1;\n}\n"
        : LOCKSTEP_D(0), LOCKSTEP_D(1), LOCKSTEP_D(2), LOCKSTEP_D(3), LOCKSTEP_D(4), LOCKSTEP_D(5),
          LOCKSTEP_D(6), LOCKSTEP_D(7)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  } else {
    static_assert(NT == 16);
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
        "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
        "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : LOCKSTEP_D(0), LOCKSTEP_D(1), LOCKSTEP_D(2), LOCKSTEP_D(3), LOCKSTEP_D(4), LOCKSTEP_D(5),
          LOCKSTEP_D(6), LOCKSTEP_D(7), LOCKSTEP_D(8), LOCKSTEP_D(9), LOCKSTEP_D(10), LOCKSTEP_D(11),
          LOCKSTEP_D(12), LOCKSTEP_D(13), LOCKSTEP_D(14), LOCKSTEP_D(15)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  }
#undef LOCKSTEP_D
}

// The same with A from registers: a[i] holds bytes k = 4q .. 4q+3 + 16·(i/2) of row 16·w + g + 8·(i%2)
// (warp w, lane l, g = l/4, q = l%4: the layout of mma.m16n8k32's A, per warp; CUTLASS's
// ALayout_64x32), B 128 rows (descriptor b).
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
#define LOCKSTEP_D(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : LOCKSTEP_D(0), LOCKSTEP_D(1), LOCKSTEP_D(2), LOCKSTEP_D(3), LOCKSTEP_D(4), LOCKSTEP_D(5),
        LOCKSTEP_D(6), LOCKSTEP_D(7), LOCKSTEP_D(8), LOCKSTEP_D(9), LOCKSTEP_D(10), LOCKSTEP_D(11),
        LOCKSTEP_D(12), LOCKSTEP_D(13), LOCKSTEP_D(14), LOCKSTEP_D(15)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
#undef LOCKSTEP_D
}

// Before the first wgmma of a group: orders the warpgroup's earlier register and shared-memory
// accesses before the tensor cores' (PTX: required when the accumulators were touched since).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of the warpgroup's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accesses to d across the wgmma fence / wait next to it.
template <int NT>
__device__ __forceinline__ void pin_registers(float (&d)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
}

}  // namespace lockstep::cuda
