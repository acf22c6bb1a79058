// ops/cuda/gemm_fp8_small_t.cu — ops/cuda/gemm_fp8_small_t.h: the fp8 GEMM at decode token counts,
// which is weight-bandwidth bound: the kernel streams the weight once, several K blocks in flight
// per CTA, and sums each K block with wgmma on e4m3.
//
// Work: a 128-row block of the weight (one row of 128×128 scale blocks, so the weight scale is one
// number per K block) and a contiguous range of its K blocks is one warpgroup's. The K range is
// split `splits` ways (1, 2, 4 or 8, from the shape alone: enough CTAs for the SMs); the CTAs of one
// row block form a thread-block cluster and add their fp32 partial tiles through distributed
// shared memory in rank order (deterministic, no workspace, one kernel).
//
// Per K block, the warpgroup sums the block into a fresh fp32 partial tile (128 rows × 8·NT
// tokens), which is then multiplied by sx[t]·sw and added to the accumulator: the CPU reference's
// order of operations. Partials and accumulators have the D fragment layout of wgmma m64nN, f32
// (PTX ISA): lane l, g = l/4, q = l%4, element [m][n][e] is weight row 64m + 16·warp + g + 8·(e/2)
// and token 8n + 2q + e%2 (the warpgroup owns two m64 tiles; warp w holds rows 16w .. 16w+15 of
// each).
//
// Tiles: each K block's weight tile (128 rows × 128 bytes), act tile (8·NT tokens × 128 bytes,
// tokens ≥ T zero-filled) and scales go global → shared. The tiles are rows of eight 16-byte chunks,
// 128-byte swizzled: chunk c of row r sits at c ^ r%8, tiles 1024-byte aligned. That is the layout
// wgmma's SWIZZLE_128B K-major descriptors read and TMA's SWIZZLE_128B writes, and it spreads
// cp.async copies over all 32 banks.
//
// wgmma: m64nNk32 e4m3 × e4m3 → f32, A = 64 weight rows, B = N = 8·NT tokens, both K-major in
// shared memory (the only layout fp8 wgmma takes). A K block is 4 k32 steps a tile; step j starts
// 32 bytes into the swizzled rows (the hardware swizzles the address bits, hence the alignment), the
// first step overwrites the partial (scale-d = 0). cp.async copies are generic-proxy writes and
// wgmma reads through the async proxy: a fence.proxy.async orders them (TMA writes through the
// async proxy itself).
//
// Variants (gemm_fp8_small_t_set_variant), the same operations on every element, hence the same
// bits: they differ only in how the copies are scheduled.
//  0. cp.async by all 128 threads of a CTA, 3 or 4 stages deep (as many as leave room for three
//     CTAs an SM: with two, clusters of 8 CTAs fit only 30 at once on an H200, so the 32 clusters
//     of a 4096-row weight ran in two waves — ncu, session 5). Per K block: wait for this thread's
//     copies, fence, __syncthreads, refill the stage the previous block used, 8 wgmmas in one
//     group, wait, promote. The refill waits for the next block to land, so only stages − 1
//     blocks are in flight while the CTA waits for data.
//  1. 0 with one wgmma group a 64-row tile: tile 0 is promoted while tile 1's wgmmas run.
//  2. 1 with an mbarrier a stage that the copies complete (cp.async.mbarrier.arrive): every
//     stage is refilled as soon as the wgmmas that read it retire, so all stages are in flight
//     while the CTA waits. The scales get one slot more than the stages, so a refill never
//     overwrites the scales of the block being promoted.
//  3. 2 with the weight copies asking L2 for 256-byte segments: a row's next K block is then an
//     L2 hit, and DRAM serves 256 contiguous bytes a request.
//  4. Warp-specialized TMA: a producer warp loads a stage (the weight tile and the act tile by TMA,
//     which zero-fills tokens ≥ T; the scales by cp.async) once every consumer warp has released
//     it (`empty` barrier), completing its `full` barrier; a consumer warpgroup waits for `full`,
//     runs the wgmmas, releases the stage as soon as they retire, then promotes. The grid and
//     occupancy of variants 0–3 (3 stages at 32–64 tokens); at 64 tokens the two tiles go through
//     one partial, one after the other (registers: 13–15 warps an SM leave 128 a thread).
//  5. 4 with three consumer warpgroups a CTA on three consecutive row blocks (what three CTAs of
//     variant 4 do), sharing each K block's act tile, one CTA an SM: 4 stages of 48 KiB of weight,
//     192 KiB in flight an SM (variant 0: 96 at 32–64 tokens), a third of the act traffic. Same K
//     split (splits_for), so the clusters are ⌈row blocks / 3⌉ of `splits` CTAs at one an SM: fewer
//     SMs busy on small grids, and where the clusters do not all fit at once (e.g. 32 of 4 CTAs on
//     30 places) a second wave.
#include "ops/cuda/gemm_fp8_small_t.h"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "core/cp_async.cuh"
#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "core/device.h"
#include "core/mbarrier.cuh"
#include "ops/cuda/vector.cuh"

namespace lockstep::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;         // 4 warps: one warpgroup
constexpr int kRows = 128;            // weight rows of a warpgroup: one row of scale blocks
constexpr int kBlockK = 128;          // bytes of a K block (e4m3): one swizzled row
constexpr int kMaxSplits = 8;         // the portable cluster size
constexpr int kCtasPerSm = 3;
constexpr int kSwizzleAtom = 1024;    // 8 rows × 128 bytes: every tile starts on one
// After the main loop the shared memory holds the partial tiles, token-major, rows padded to
// kRedStride floats so the fragment stores hit distinct banks.
constexpr int kRedStride = kRows + 4;

const char* const kVariantNames[kFp8SmallTVariants] = {
    "cp.async, a CTA barrier a K block",
    "+ a wgmma group a tile",
    "+ mbarrier ring, early refill",
    "+ L2 256-byte prefetch",
    "TMA, producer warp, 1 row block a CTA",
    "TMA, producer warp, 3 row blocks a CTA",
};

// Variants 0–3: one warpgroup a CTA, kCtasPerSm CTAs an SM. kRing: variants 2 and 3.
template <int NT, bool kRing = false>
struct Layout {
  static constexpr int kTokens = 8 * NT;
  // A stage: the weight tile, then the act tile.
  static constexpr int kActOffset = kRows * kBlockK;
  static constexpr int kStageBytes = kActOffset + kTokens * kBlockK;
  // A scale slot: kTokens act scales, then the weight scale (padded to 16 bytes).
  static constexpr int kScaleBytes = kTokens * 4 + 16;
  // kRing: a `full` barrier a stage, and one scale slot more than stages.
  static constexpr int kBarrierBytes = kRing ? 8 : 0;
  static constexpr int kExtraSlots = kRing ? 1 : 0;
  // Up to 4 stages, as many as kCtasPerSm CTAs an SM leave room for (228 KiB, 1 KiB reserved each).
  static constexpr int kStages =
      std::min(4, (228 * 1024 / kCtasPerSm - 1024 - kExtraSlots * kScaleBytes) /
                      (kStageBytes + kScaleBytes + kBarrierBytes));
  static constexpr int kSlots = kStages + kExtraSlots;
  // After the stages, the scale slots, then the barriers.
  static constexpr int kScalesOffset = kStages * kStageBytes;
  static constexpr int kBarrierOffset = kScalesOffset + kSlots * kScaleBytes;
  static constexpr int kSmem = std::max(kBarrierOffset + kStages * kBarrierBytes, kTokens * kRedStride * 4);
  static_assert(kStageBytes % kSwizzleAtom == 0 && kScaleBytes % 16 == 0);
  static_assert(kStages >= 3, "a stage in use, two in flight");
  static_assert(kCtasPerSm * (kSmem + 1024) <= 228 * 1024);
};

// Variants 4 and 5: kGroups consumer warpgroups (one a 128-row block, 1 or 3) and a producer
// warp a CTA, kCtasPerSm / kGroups CTAs an SM.
template <int NT, int kGroups>
struct WsLayout {
  static_assert(kGroups == 1 || kGroups == kCtasPerSm);
  static constexpr int kCtaThreads = kGroups * kThreads + 32;
  static constexpr int kCtas = kCtasPerSm / kGroups;  // an SM
  static constexpr int kTokens = 8 * NT;
  // A stage: kGroups weight tiles, then the act tile they share.
  static constexpr int kActOffset = kGroups * kRows * kBlockK;
  static constexpr int kStageBytes = kActOffset + kTokens * kBlockK;
  // Scale slots as in Layout (kGroups weight scales), one more than stages; then `full` and
  // `empty` barriers a stage. The base is aligned to kSwizzleAtom inside the allocation.
  static constexpr int kScaleBytes = kTokens * 4 + 16;
  static constexpr int kStages = std::min(4, (228 * 1024 / kCtas - 1024 - kSwizzleAtom - kScaleBytes) /
                                                 (kStageBytes + kScaleBytes + 16));
  static constexpr int kSlots = kStages + 1;
  static constexpr int kScalesOffset = kStages * kStageBytes;
  static constexpr int kBarrierOffset = kScalesOffset + kSlots * kScaleBytes;
  static constexpr int kSmem = kBarrierOffset + 2 * kStages * 8 + kSwizzleAtom;
  static_assert(kStageBytes % kSwizzleAtom == 0 && kScaleBytes % 16 == 0 && kGroups <= 4);
  static_assert(kStages >= 3, "a stage in use, two in flight");
  static_assert(kCtas * (kSmem + 1024) <= 228 * 1024);
  static_assert(kGroups * kTokens * kRedStride * 4 <= kScalesOffset, "the partial tiles fit in the stages");
};

struct Args {
  const uint8_t* act;           // e4m3 [T, K]
  const float* act_scales;      // [K/128, T]
  const uint8_t* weight;        // e4m3 [M, K]
  const float* weight_scales;   // [M/128, ld_weight_scales]
  void* out;                    // [T, M]
  int64_t T, M, K, ld_weight_scales;
};

// This CTA's K blocks: split blockIdx.x of gridDim.x.
struct KRange {
  int first, count;
};
__device__ __forceinline__ KRange k_range(const Args& a) {
  const int split = blockIdx.x, splits = gridDim.x, kblocks = int(a.K / kBlockK);
  const int first = split * kblocks / splits;
  return {first, (split + 1) * kblocks / splits - first};
}

// The shared-memory descriptor of a K-major e4m3 tile for wgmma (PTX ISA, "Matrix Descriptor
// Format"): start address >> 4 (bits 0-13); leading byte offset (16-29) unused with a swizzle, 1 as
// CUTLASS sets it; stride byte offset (32-45) 1024 >> 4, from one 8-row group to the next; base
// offset (49-51) 0, the tiles being 1024-byte aligned; layout (62-63) 1 = SWIZZLE_128B.
__device__ __forceinline__ uint64_t tile_descriptor(uint32_t address) {
  return uint64_t(address >> 4 & 0x3FFF) | uint64_t(1) << 16 | uint64_t(kSwizzleAtom >> 4) << 32 | uint64_t(1) << 62;
}

// d = (accumulate ? d : 0) + A · Bᵀ over 32 k: A 64 weight rows (descriptor a), B 8·NT tokens
// (descriptor b), d[n][e] in the wgmma D layout of the header comment. Asynchronous: d is written
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

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of the warpgroup's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// This thread's generic-proxy view of shared memory (cp.async copies it waited for, its own or
// through a barrier) before its async-proxy accesses (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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
template <int NT>
__device__ __forceinline__ void pin_registers(float (&p)[2][NT][4]) {
  pin_registers<NT>(p[0]);
  pin_registers<NT>(p[1]);
}

// Cluster barriers: the first publishes this CTA's shared-memory writes to the cluster (release /
// acquire); the second only keeps every CTA's shared memory alive until the others have read it.
__device__ __forceinline__ void cluster_sync_publish() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ int chunk_offset(int r, int c) { return r * kBlockK + ((c ^ (r & 7)) << 4); }

// Where this thread's cp.async copies come from and go to: chunk tid % 8 of weight rows tid/8 + 16j
// and of act rows (tokens) tid/8 + 16j, so that eight consecutive threads copy one row's 128
// bytes (one cache line); rows 16 apart share the swizzle. Pointers at K block 0, advanced by
// kBlockK a block: kept this small so the copies cost few registers next to the accumulators.
struct Copier {
  const uint8_t* weight;  // row row0 + tid/8
  const uint8_t* act;     // token tid/8
  const float* act_scale; // token tid (when tid < T)
  int64_t stride;         // 16 rows of either operand
  int dst;                // byte offset of the chunk in the first row of a tile
  int token;              // tid/8
};

__device__ __forceinline__ Copier copier(const Args& a, int64_t row0) {
  const int tid = threadIdx.x, r = tid / 8, c = tid % 8;
  return {a.weight + (row0 + r) * a.K + c * 16, a.act + r * a.K + c * 16, a.act_scales + tid, 16 * a.K,
          chunk_offset(r, c), r};
}

// Issues this thread's cp.async copies of K block kb into a stage's tiles and a scale slot.
// kPrefetch: the weight copies ask L2 for 256-byte segments.
template <int NT, bool kPrefetch = false>
__device__ __forceinline__ void load_stage(uint8_t* tiles, uint8_t* scales, const Copier& cp, const Args& a,
                                           int64_t row0, int kb) {
  constexpr int kTokens = 8 * NT;
  const int tid = threadIdx.x;
  const uint8_t* w = cp.weight + kb * kBlockK;
#pragma unroll
  for (int j = 0; j < kRows / 16; ++j, w += cp.stride) {
    if constexpr (kPrefetch)
      cp_async16_l2_256(tiles + cp.dst + j * 16 * kBlockK, w, true);
    else
      cp_async16(tiles + cp.dst + j * 16 * kBlockK, w, true);
  }
  const uint8_t* x = cp.act + kb * kBlockK;
#pragma unroll
  for (int j = 0; j < (kTokens + 15) / 16; ++j, x += cp.stride) {
    const int t = cp.token + 16 * j;
    if (t < kTokens) cp_async16(tiles + kRows * kBlockK + cp.dst + j * 16 * kBlockK, t < a.T ? x : a.act, t < a.T);
  }
  if (tid < kTokens) cp_async4(scales + tid * 4, tid < a.T ? cp.act_scale + kb * a.T : a.act_scales, tid < a.T);
  if (tid == 0) cp_async4(scales + kTokens * 4, a.weight_scales + row0 / kRows * a.ld_weight_scales + kb, true);
}

// The K block's 4 k32 steps of one m64 tile into p (`weight`: the tile's first row).
template <int NT>
__device__ __forceinline__ void issue_tile(uint32_t weight, uint32_t act, float (&p)[NT][4]) {
#pragma unroll
  for (int j = 0; j < kBlockK / 32; ++j)
    wgmma_e4m3<NT>(p, tile_descriptor(weight + 32 * j), tile_descriptor(act + 32 * j), j > 0);
}

// acc += p · sx[t] · sw for one m64 tile, the scales of a slot: the act scales, then weight
// scale `group`.
template <int NT>
__device__ __forceinline__ void add_scaled(float (&acc)[NT][4], const float (&p)[NT][4], const uint8_t* scales,
                                           int q, int group) {
  const float sw = reinterpret_cast<const float*>(scales)[8 * NT + group];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float2 sx = *reinterpret_cast<const float2*>(scales + (8 * n + 2 * q) * 4);
    const float s0 = sx.x * sw, s1 = sx.y * sw;
    acc[n][0] = fmaf(p[n][0], s0, acc[n][0]);
    acc[n][1] = fmaf(p[n][1], s1, acc[n][1]);
    acc[n][2] = fmaf(p[n][2], s0, acc[n][2]);
    acc[n][3] = fmaf(p[n][3], s1, acc[n][3]);
  }
}

// Variant 0's K block: p[m] = Σ over the block of weight rows 64m .. 64m+63 × the tokens, both
// tiles' steps in one wgmma group, then a wait for all of them (their shared reads included, so
// the stage may be refilled after the next barrier); then acc += p · scales.
template <int NT>
__device__ __forceinline__ void sum_block_one_group(uint32_t weight, uint32_t act, const uint8_t* scales, int q,
                                                    float (&p)[2][NT][4], float (&acc)[2][NT][4]) {
  pin_registers(p);  // the last block's reads of p come first
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < kBlockK / 32; ++j)
#pragma unroll
    for (int m = 0; m < 2; ++m)
      wgmma_e4m3<NT>(p[m], tile_descriptor(weight + 64 * kBlockK * m + 32 * j), tile_descriptor(act + 32 * j), j > 0);
  wgmma_commit();
  wgmma_wait<0>();
  pin_registers(p);
  add_scaled<NT>(acc[0], p[0], scales, q, 0);
  add_scaled<NT>(acc[1], p[1], scales, q, 0);
}

// The same with one wgmma group a tile: tile 0 is promoted while tile 1's wgmmas run. `retired()`
// runs once both groups are done (this warp's reads of the stage's tiles with them), before tile 1
// is promoted. `group`: which weight scale of the slot.
template <int NT, class Retired>
__device__ __forceinline__ void sum_block(uint32_t weight, uint32_t act, const uint8_t* scales, int q, int group,
                                          float (&p)[2][NT][4], float (&acc)[2][NT][4], Retired retired) {
  pin_registers(p);  // the last block's reads of p come first
  wgmma_fence();
  issue_tile<NT>(weight, act, p[0]);
  wgmma_commit();
  issue_tile<NT>(weight + 64 * kBlockK, act, p[1]);
  wgmma_commit();
  wgmma_wait<1>();
  pin_registers(p[0]);
  add_scaled<NT>(acc[0], p[0], scales, q, group);
  wgmma_wait<0>();
  pin_registers(p[1]);
  retired();
  add_scaled<NT>(acc[1], p[1], scales, q, group);
}

// The same, one tile at a time through a single partial tile p (half the registers: variant 4 at
// 64 tokens, whose 13 warps get 128 registers each).
template <int NT, class Retired>
__device__ __forceinline__ void sum_block_serial(uint32_t weight, uint32_t act, const uint8_t* scales, int q,
                                                 int group, float (&p)[NT][4], float (&acc)[2][NT][4],
                                                 Retired retired) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    pin_registers(p);  // the last tile's reads of p come first
    wgmma_fence();
    issue_tile<NT>(weight + 64 * kBlockK * m, act, p);
    wgmma_commit();
    wgmma_wait<0>();
    pin_registers(p);
    if (m == 1) retired();
    add_scaled<NT>(acc[m], p, scales, q, group);
  }
}

__device__ __forceinline__ void store4(float* out, const float4& v) { *reinterpret_cast<float4*>(out) = v; }
__device__ __forceinline__ void store4(uint16_t* out, const float4& v) {
  *reinterpret_cast<uint2*>(out) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

// Writes a warpgroup's accumulators into its partial tile in shared memory, token-major.
template <int NT>
__device__ __forceinline__ void store_partial(float* red, const float (&acc)[2][NT][4]) {
  const int warp = threadIdx.x % kThreads / 32, g = threadIdx.x % 32 / 4, q = threadIdx.x % 4;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        red[(8 * n + 2 * q + e % 2) * kRedStride + 64 * m + 16 * warp + g + e / 2 * 8] = acc[m][n][e];
}

// After cluster_sync_publish: this CTA's share of the output — rows [split, split + 1) ·
// 128/splits of each of its `groups` row blocks (partial tile g at red + g · tile_floats, rows
// row0 + 128g ..), every token — summed over the cluster's partial tiles in rank order, 4 rows at a
// time, by `threads` threads. Every rank's load is issued before the first add: one
// distributed-shared-memory latency per item, not one per rank.
template <class Out>
__device__ __forceinline__ void reduce_cluster(const Args& a, float* red, int tile_floats, int64_t row0, int groups,
                                               int threads) {
  const int split = blockIdx.x, splits = gridDim.x;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rows = kRows / splits, quads = rows / 4, per_group = int(a.T) * quads;
  Out* out = static_cast<Out*>(a.out);
  for (int i = threadIdx.x; i < groups * per_group; i += threads) {
    const int group = i / per_group, t = i % per_group / quads, r = split * rows + i % quads * 4;
    const int offset = group * tile_floats + t * kRedStride + r;
    float4 v[kMaxSplits];
#pragma unroll
    for (int rank = 0; rank < kMaxSplits; ++rank)
      if (rank < splits) v[rank] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, rank) + offset);
    float4 sum = v[0];
#pragma unroll
    for (int rank = 1; rank < kMaxSplits; ++rank)
      if (rank < splits) sum.x += v[rank].x, sum.y += v[rank].y, sum.z += v[rank].z, sum.w += v[rank].w;
    store4(out + t * a.M + row0 + group * kRows + r, sum);
  }
}

// Variants 0-3: the epilogue, once the stages are free (the partial tile overlays them).
template <int NT, class Out>
__device__ __forceinline__ void finish_one_group(const Args& a, uint8_t* smem, const float (&acc)[2][NT][4],
                                                 int64_t row0) {
  float* red = reinterpret_cast<float*>(smem);
  store_partial<NT>(red, acc);
  cluster_sync_publish();  // every partial tile of the cluster written
  reduce_cluster<Out>(a, red, 0, row0, 1, kThreads);
  cluster_sync_relaxed();  // no CTA leaves (freeing its shared memory) while another still reads it
}

// Variants 0 and 1. Grid (splits, M/128), clusters of (splits, 1, 1): blockIdx.x is the rank in
// the cluster.
template <int NT, class Out, bool kTileGroups>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) small_t_kernel(const Args a) {
  using L = Layout<NT>;
  // The swizzle needs 1024-byte aligned tiles. (The compiler takes this alignment as given; on
  // sm_90 dynamic shared memory starts at 1024, after the reserved kilobyte.)
  extern __shared__ __align__(kSwizzleAtom) uint8_t smem[];
  const int q = threadIdx.x % 4;
  const int64_t row0 = int64_t(blockIdx.y) * kRows;
  const KRange k = k_range(a);
  constexpr int kStages = L::kStages;
  auto tiles = [&](int i) { return smem + i % kStages * L::kStageBytes; };
  auto scales = [&](int i) { return smem + L::kScalesOffset + i % kStages * L::kScaleBytes; };

  const Copier cp = copier(a, row0);
  float acc[2][NT][4] = {}, p[2][NT][4] = {};
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < k.count) load_stage<NT>(tiles(i), scales(i), cp, a, row0, k.first + i);
    cp_async_commit();
  }
  for (int i = 0; i < k.count; ++i) {
    cp_async_wait<kStages - 2>();  // K block i has landed (this thread's copies) ...
    fence_proxy_async();
    __syncthreads();               // ... everyone's; and everyone is done with block i - 1
    const int next = i + kStages - 1;  // into the stage block i - 1 used
    if (next < k.count) load_stage<NT>(tiles(next), scales(next), cp, a, row0, k.first + next);
    cp_async_commit();
    const uint32_t weight = smem_address(tiles(i));
    if constexpr (kTileGroups)
      sum_block<NT>(weight, weight + L::kActOffset, scales(i), q, 0, p, acc, [] {});
    else
      sum_block_one_group<NT>(weight, weight + L::kActOffset, scales(i), q, p, acc);
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages become the partial tile
  finish_one_group<NT, Out>(a, smem, acc, row0);
}

// Variants 2 and 3: the grid and work of small_t_kernel; block i in stage i % kStages and scale
// slot i % kSlots.
template <int NT, class Out, bool kPrefetch>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) small_t_ring_kernel(const Args a) {
  using L = Layout<NT, true>;
  extern __shared__ __align__(kSwizzleAtom) uint8_t smem[];  // (aligned as in small_t_kernel)
  const int q = threadIdx.x % 4;
  const int64_t row0 = int64_t(blockIdx.y) * kRows;
  const KRange k = k_range(a);
  constexpr int kStages = L::kStages;
  auto tiles = [&](int i) { return smem + i % kStages * L::kStageBytes; };
  auto scales = [&](int i) { return smem + L::kScalesOffset + i % L::kSlots * L::kScaleBytes; };
  // full[s]: phase j completes when every thread's copies of block j · kStages + s have landed.
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s], kThreads);
    mbar_init_fence();
  }
  __syncthreads();

  const Copier cp = copier(a, row0);
  auto load = [&](int i) {
    load_stage<NT, kPrefetch>(tiles(i), scales(i), cp, a, row0, k.first + i);
    cp_async_mbar_arrive(&full[i % kStages]);
  };
#pragma unroll
  for (int i = 0; i < kStages; ++i)
    if (i < k.count) load(i);
  float acc[2][NT][4] = {}, p[2][NT][4] = {};
  for (int i = 0; i < k.count; ++i) {
    mbar_wait(&full[i % kStages], i / kStages & 1);
    fence_proxy_async();  // the copies, seen through the barrier, before the wgmmas read them
    const uint32_t weight = smem_address(tiles(i));
    sum_block<NT>(weight, weight + L::kActOffset, scales(i), q, 0, p, acc, [&] {
      // Every warp's wgmmas of block i have retired: its stage takes block i + kStages. (The scale
      // slot that takes is block i - 1's, promoted by every thread before this barrier.)
      __syncthreads();
      if (i + kStages < k.count) load(i + kStages);
    });
  }
  __syncthreads();  // every thread done with the stages, which become the partial tile
  finish_one_group<NT, Out>(a, smem, acc, row0);
}

// Variants 4 and 5. Grid (splits, ⌈M/128 / kGroups⌉), clusters of (splits, 1, 1): blockIdx.x is
// the rank in the cluster; warpgroup g < kGroups owns rows row0 + 128g .. (if inside the weight);
// warp 4·kGroups is the producer.
template <int NT, class Out, int kGroups>
__global__ void __launch_bounds__(WsLayout<NT, kGroups>::kCtaThreads, WsLayout<NT, kGroups>::kCtas)
    small_t_ws_kernel(const __grid_constant__ CUtensorMap weight_map, const __grid_constant__ CUtensorMap act_map,
                      const Args a) {
  using L = WsLayout<NT, kGroups>;
  constexpr int kStages = L::kStages;
  // Two 64-token partial tiles and the accumulators take more than the 128 registers a thread
  // gets (an SM sub-partition's 16K registers over its 4 warps).
  constexpr bool kSerialTiles = NT == 8;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + (kSwizzleAtom - smem_address(smem_raw) % kSwizzleAtom) % kSwizzleAtom;
  auto stage = [&](int i) { return smem + i % kStages * L::kStageBytes; };
  auto scales = [&](int i) { return smem + L::kScalesOffset + i % L::kSlots * L::kScaleBytes; };
  // full[s]: phase j completes when block j · kStages + s has landed (the producer's expect-tx
  // arrival, the TMA bytes, and its 32 lanes' cp.async arrivals); empty[s]: when every consumer
  // warp is done with that block's tiles.
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  uint64_t* empty = full + kStages;
  const int group = threadIdx.x / kThreads, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t(blockIdx.y) * kGroups * kRows;
  const int groups = int(std::min<int64_t>(kGroups, a.M / kRows - int64_t(blockIdx.y) * kGroups));
  const KRange k = k_range(a);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1 + 32);
      mbar_init(&empty[s], 4 * groups);
    }
    mbar_init_fence();
  }
  __syncthreads();

  float acc[2][NT][4] = {};
  if (group == kGroups) {
    for (int i = 0; i < k.count; ++i) {
      const int s = i % kStages, kb = k.first + i;
      mbar_wait(&empty[s], (i / kStages & 1) ^ 1);  // block i - kStages released (at once in the first round)
      if (lane == 0) {
        mbar_arrive_expect_tx(&full[s], (groups * kRows + L::kTokens) * kBlockK);
        for (int g = 0; g < groups; ++g)
          tma_load_2d(stage(i) + g * kRows * kBlockK, &weight_map, kb * kBlockK, int(row0) + g * kRows, &full[s]);
        tma_load_2d(stage(i) + L::kActOffset, &act_map, kb * kBlockK, 0, &full[s]);  // tokens ≥ T read as 0
      }
      // The slot last held block i - kSlots, promoted before its consumers released block
      // i - kStages.
      uint8_t* slot = scales(i);
      for (int t = lane; t < L::kTokens; t += 32)
        cp_async4(slot + t * 4, t < a.T ? a.act_scales + kb * a.T + t : a.act_scales, t < a.T);
      if (lane < groups)
        cp_async4(slot + (L::kTokens + lane) * 4, a.weight_scales + (row0 / kRows + lane) * a.ld_weight_scales + kb,
                  true);
      cp_async_mbar_arrive(&full[s]);
    }
  } else if (group < groups) {
    const int q = threadIdx.x % 4;
    float p[kSerialTiles ? 1 : 2][NT][4] = {};
    for (int i = 0; i < k.count; ++i) {
      const int s = i % kStages;
      mbar_wait(&full[s], i / kStages & 1);
      const uint32_t act = smem_address(stage(i)) + L::kActOffset;
      const uint32_t weight = smem_address(stage(i)) + group * kRows * kBlockK;
      auto release = [&] {
        __syncwarp();  // (every lane's scale reads of earlier blocks too)
        if (lane == 0) mbar_arrive(&empty[s]);
      };
      if constexpr (kSerialTiles)
        sum_block_serial<NT>(weight, act, scales(i), q, group, p[0], acc, release);
      else
        sum_block<NT>(weight, act, scales(i), q, group, p, acc, release);
    }
  }
  __syncthreads();  // every consumer done with the stages, which become the partial tiles
  float* red = reinterpret_cast<float*>(smem);
  constexpr int kTileFloats = L::kTokens * kRedStride;
  if (group < groups) store_partial<NT>(red + group * kTileFloats, acc);
  cluster_sync_publish();
  reduce_cluster<Out>(a, red, kTileFloats, row0, groups, L::kCtaThreads);
  cluster_sync_relaxed();
}

// The kernel, its dynamic shared memory allowed once.
template <auto kKernel, int kSmem>
auto prepared() {
  static const bool done = [] {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)done;
  return kKernel;
}

cudaLaunchConfig_t launch_config(dim3 grid, int threads, int smem, cudaLaunchAttribute& cluster) {
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = grid.x;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(smem);
  config.stream = current_stream();
  config.attrs = &cluster;
  config.numAttrs = 1;
  return config;
}

// CTAs in clusters of `splits` that the GPU holds at once, for variant 0's 64-token kernel (every
// token count has the same occupancy, kCtasPerSm an SM, and launches the same grid).
int resident_ctas(int splits) {
  static int cached[kMaxSplits + 1] = {};
  if (cached[splits] == 0) {
    cudaLaunchAttribute cluster{};
    const cudaLaunchConfig_t config =
        launch_config(dim3(unsigned(splits), 1), kThreads, Layout<8>::kSmem, cluster);
    int clusters = 0;
    LOCKSTEP_CUDA_CHECK(cudaOccupancyMaxActiveClusters(
        &clusters, prepared<small_t_kernel<8, uint16_t, false>, Layout<8>::kSmem>(), &config));
    cached[splits] = clusters * splits;
  }
  return cached[splits];
}

// K splits: doubled while the CTAs do not yet fill every SM kCtasPerSm times, every split keeps at
// least one K block, the cluster is not full, and all of the doubled grid's clusters fit on the GPU
// at once (a second wave would double the time). A function of the shape alone, never of T (nor
// of the variant), so that a token's sum is the same at every batch size.
int splits_for(int64_t M, int64_t K) {
  const int64_t row_blocks = M / kRows, kblocks = K / kBlockK;
  int splits = 1;
  while (2 * splits <= kMaxSplits && row_blocks * splits < kCtasPerSm * device_sm_count() && 2 * splits <= kblocks &&
         row_blocks * 2 * splits <= resident_ctas(2 * splits))
    splits *= 2;
  return splits;
}

template <class Kernel, class... Params>
void launch_clusters(Kernel kernel, dim3 grid, int threads, int smem, const Params&... params) {
  cudaLaunchAttribute cluster{};
  const cudaLaunchConfig_t config = launch_config(grid, threads, smem, cluster);
  LOCKSTEP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params...));
}

// cuTensorMapEncodeTiled from the driver, found at run time (the build links no libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const auto fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    LOCKSTEP_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    LOCKSTEP_CHECK(found == cudaDriverEntryPointSuccess && f,
                   "fp8 small-T GEMM: the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The map of e4m3 data [rows, cols] (16-byte aligned, cols a multiple of 16) that copies boxes of
// box_rows rows × 128 bytes, 128-byte swizzled; rows past the end read as zeros. Host only, no
// synchronization: encoded per call (the act buffer changes between calls).
CUtensorMap tile_map(const void* data, int64_t rows, int64_t cols, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols)};  // bytes from one row to the next
  const cuuint32_t box[2] = {kBlockK, cuuint32_t(box_rows)}, element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims, strides,
                                    box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LOCKSTEP_CHECK(r == CUDA_SUCCESS, "fp8 small-T GEMM: cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for [",
                 rows, ", ", cols, "] e4m3 at ", data);
  return map;
}

template <int NT, class Out, int kGroups>
void launch_ws(const Args& a, int splits) {
  using L = WsLayout<NT, kGroups>;
  const CUtensorMap weight_map = tile_map(a.weight, a.M, a.K, kRows);
  const CUtensorMap act_map = tile_map(a.act, a.T, a.K, 8 * NT);
  const dim3 grid(unsigned(splits), unsigned((a.M / kRows + kGroups - 1) / kGroups));
  launch_clusters(prepared<small_t_ws_kernel<NT, Out, kGroups>, L::kSmem>(), grid, L::kCtaThreads, L::kSmem, weight_map,
                  act_map, a);
}

template <int NT, class Out>
void launch(const Args& a, int splits, int variant) {
  const dim3 grid(unsigned(splits), unsigned(a.M / kRows));
  switch (variant) {
    case 0:
      return launch_clusters(prepared<small_t_kernel<NT, Out, false>, Layout<NT>::kSmem>(), grid, kThreads,
                             Layout<NT>::kSmem, a);
    case 1:
      return launch_clusters(prepared<small_t_kernel<NT, Out, true>, Layout<NT>::kSmem>(), grid, kThreads,
                             Layout<NT>::kSmem, a);
    case 2:
      return launch_clusters(prepared<small_t_ring_kernel<NT, Out, false>, Layout<NT, true>::kSmem>(), grid,
                             kThreads, Layout<NT, true>::kSmem, a);
    case 3:
      return launch_clusters(prepared<small_t_ring_kernel<NT, Out, true>, Layout<NT, true>::kSmem>(), grid,
                             kThreads, Layout<NT, true>::kSmem, a);
    case 4:
      return launch_ws<NT, Out, 1>(a, splits);
    default:
      return launch_ws<NT, Out, kCtasPerSm>(a, splits);
  }
}

template <class Out>
void launch_for_tokens(const Args& a, int splits, int variant) {
  if (a.T <= 8) return launch<1, Out>(a, splits, variant);
  if (a.T <= 16) return launch<2, Out>(a, splits, variant);
  if (a.T <= 32) return launch<4, Out>(a, splits, variant);
  launch<8, Out>(a, splits, variant);
}

void check_variant(int variant) {
  LOCKSTEP_CHECK(variant >= 0 && variant < kFp8SmallTVariants, "fp8 small-T GEMM: variant 0 .. ",
                 kFp8SmallTVariants - 1, ", got ", variant);
}

// LOCKSTEP_SMALL_T_VARIANT, read once: a variant number, default 0.
std::atomic<int>& variant_setting() {
  static std::atomic<int> setting{[] {
    const char* env = std::getenv("LOCKSTEP_SMALL_T_VARIANT");
    if (!env) return 0;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    LOCKSTEP_CHECK(*env && !*end && v >= 0 && v < kFp8SmallTVariants,
                   "LOCKSTEP_SMALL_T_VARIANT: expected a variant 0 .. ", kFp8SmallTVariants - 1, ", got '", env, "'");
    return int(v);
  }()};
  return setting;
}

}  // namespace

int gemm_fp8_small_t_set_variant(int variant) {
  check_variant(variant);
  return variant_setting().exchange(variant);
}

const char* gemm_fp8_small_t_variant_name(int variant) {
  check_variant(variant);
  return kVariantNames[variant];
}

void gemm_fp8_small_t(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  const int64_t T = act.rows(), K = act.cols(), M = weight.rows();
  LOCKSTEP_CHECK(T >= 1 && T <= kFp8SmallTMaxTokens, "fp8 small-T GEMM: 1 .. ", kFp8SmallTMaxTokens,
                 " tokens, got ", T);
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(out.data()) % 16 == 0,
                 "fp8 small-T GEMM: the output must be 16-byte aligned, got ", out.describe(), " at ", out.data());
  LOCKSTEP_CHECK(M / kRows <= 65535, "fp8 small-T GEMM: at most 65535 row blocks, got ", weight.data.describe());
  const Args a{static_cast<const uint8_t*>(act.data.data()), act.scales.data_as<float>(),
               static_cast<const uint8_t*>(weight.data.data()), weight.scales.data_as<float>(), out.data(),
               T, M, K, weight.scales.dim(1)};
  const int splits = splits_for(M, K), variant = variant_setting().load();
  if (out.dtype() == DType::f32) return launch_for_tokens<float>(a, splits, variant);
  launch_for_tokens<uint16_t>(a, splits, variant);
}

}  // namespace lockstep::cuda
