// ops/cuda/wgmma_e4m3.cuh — the pieces of the fp8 weight × token GEMMs that must round alike in
// every kernel that computes gemm_fp8_batch_invariant's bits (ops/cuda/gemm_fp8_stream_kernel.cuh, the
// weight-streaming kernel; ops/cuda/gemm_fp8_pipelined.cu, the pipelined one for many tokens): the
// wgmma m64nNk32 e4m3 instruction on 128-byte-swizzled K-major tiles, a K block's sum by 4 such
// steps in K order, the first overwriting the partial (wgmma_k_block), and the promotion of the
// K block's fp32 partial into the accumulator; an element's sum does not depend on N (the tile's
// token width) nor on the token's column in it. Partials and accumulators have the D fragment layout of wgmma m64nN,
// f32 (PTX ISA): lane l, g = l/4, q = l%4, element [n][e] is weight row 16·warp + g + 8·(e/2) of the
// warpgroup's 64 and token 8n + 2q + e%2 (warp w of the warpgroup holds rows 16w .. 16w+15).
// Include only from CUDA sources.
#pragma once

#include <cstdint>

namespace lockstep::cuda {

constexpr int kSwizzleAtom = 1024;  // 8 rows × 128 bytes: every tile starts on one

// The shared-memory descriptor of a K-major e4m3 tile for wgmma (PTX ISA, "Matrix Descriptor
// Format"): start address >> 4 (bits 0-13); leading byte offset (16-29) unused with a swizzle, 1 as
// CUTLASS sets it; stride byte offset (32-45) 1024 >> 4, from one 8-row group to the next; base
// offset (49-51) 0, the tiles being 1024-byte aligned; layout (62-63) 1 = SWIZZLE_128B.
__device__ __forceinline__ uint64_t tile_descriptor(uint32_t address) {
  return uint64_t(address >> 4 & 0x3FFF) | uint64_t(1) << 16 | uint64_t(kSwizzleAtom >> 4) << 32 | uint64_t(1) << 62;
}

// d = (accumulate ? d : 0) + A · Bᵀ over 32 k: A 64 weight rows (descriptor a), B 8·NT tokens
// (descriptor b), d[n][e] in the D layout above. Asynchronous: d is written
// when wgmma.wait_group says so.
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
  } else if constexpr (NT == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : LOCKSTEP_D(0), LOCKSTEP_D(1), LOCKSTEP_D(2), LOCKSTEP_D(3), LOCKSTEP_D(4), LOCKSTEP_D(5),
          LOCKSTEP_D(6), LOCKSTEP_D(7), LOCKSTEP_D(8), LOCKSTEP_D(9), LOCKSTEP_D(10), LOCKSTEP_D(11),
          LOCKSTEP_D(12), LOCKSTEP_D(13), LOCKSTEP_D(14), LOCKSTEP_D(15)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  } else {
    static_assert(NT == 8);
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
        "%31}, %32, %33, p, 1, 1;\n}\n"
        : LOCKSTEP_D(0), LOCKSTEP_D(1), LOCKSTEP_D(2), LOCKSTEP_D(3), LOCKSTEP_D(4), LOCKSTEP_D(5),
          LOCKSTEP_D(6), LOCKSTEP_D(7)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  }
#undef LOCKSTEP_D
}

// Keeps the compiler from moving accesses to p across the wgmma fence / wait next to it: p's
// registers belong to the tensor cores in between.
template <int NT>
__device__ __forceinline__ void pin_registers(float (&p)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(p[n][e])::"memory");
}

// p = Σ over one K block (128 bytes of e4m3) of 64 weight rows × 8·NT tokens, the tiles at shared
// addresses `weight` and `act` (K-major, 128-byte swizzled): 4 k32 steps in K order, the first
// overwriting p, in flight together, then a wait for all of them (their shared reads included, so
// the stage may be refilled after the next barrier). Every kernel of gemm_fp8_batch_invariant sums
// a K block through this function.
template <int NT>
__device__ __forceinline__ void wgmma_k_block(uint32_t weight, uint32_t act, float (&p)[NT][4]) {
  pin_registers(p);  // the last block's reads of p come first
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int j = 0; j < 4; ++j)
    wgmma_e4m3<NT>(p, tile_descriptor(weight + 32 * j), tile_descriptor(act + 32 * j), j > 0);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  pin_registers(p);
}

// acc += p · (sx[t] · sw): sx the act scales of the partial's tokens (8·NT of them, 8-byte aligned),
// sw the weight scale of its K block. The product of the scales is rounded first, then one FMA per
// element (the CPU reference, ops/cpu/gemm.cpp, multiplies in the same order but rounds p · s before
// adding). Every kernel of gemm_fp8_batch_invariant promotes through this function.
template <int NT>
__device__ __forceinline__ void add_scaled(float (&acc)[NT][4], const float (&p)[NT][4], const float* sx_tokens,
                                           float sw, int q) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float2 sx = *reinterpret_cast<const float2*>(sx_tokens + 8 * n + 2 * q);
    const float s0 = sx.x * sw, s1 = sx.y * sw;
    float* a = acc[n];
    a[0] = fmaf(p[n][0], s0, a[0]);
    a[1] = fmaf(p[n][1], s1, a[1]);
    a[2] = fmaf(p[n][2], s0, a[2]);
    a[3] = fmaf(p[n][3], s1, a[3]);
  }
}

}  // namespace lockstep::cuda
