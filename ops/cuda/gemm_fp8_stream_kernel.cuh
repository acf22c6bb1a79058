// ops/cuda/gemm_fp8_stream_kernel.cuh — the fp8 weight-streaming GEMM kernel shared by the dense
// launches (ops/cuda/gemm_fp8_small_t.cu: decoding, the batch-invariant FProp) and the grouped one
// (ops/cuda/gemm_fp8_grouped.cu: the experts of a mixture-of-experts layer). out[T, M] =
// act[T, K] · weight[M, K]ᵀ, the weight streamed once, 16-byte copies, several K blocks in flight per
// CTA, each K block summed with wgmma on e4m3.
//
// Work: a CTA (4 warps, one warpgroup) owns one 64-row block of the weight (half a row of 128×128
// scale blocks, so the weight scale is one number per K block) and a contiguous range of its K
// blocks. The K range is split `splits` ways (1, 2 or 4, from the shape alone: enough CTAs for the
// SMs); the CTAs of one row block form a thread-block cluster and add their fp32 partial tiles
// through distributed shared memory in rank order (deterministic, no workspace, one kernel).
// That reduction moves (splits − 1)·T·64·4 bytes a cluster, as much as the weight's bytes at 64
// tokens with 8 splits of 128-row blocks (the layout until 2026-11-21): a kernel with no epilogue
// at all was 17 µs a layer faster at Qwen3-8B's shapes and T = 64, and 64-row blocks split at
// most 4 ways took 95 µs a layer where 128-row blocks split 8 ways took 100
// (docs/benchmarks.md, decode shapes).
//
// Pipeline: each K block's weight tile (64 rows × 128 bytes), act tile (8·NT tokens × 128 bytes,
// tokens ≥ T zero-filled) and scales go global → shared by cp.async, 4 to 8 stages deep: as many
// as leave room for three CTAs an SM. (With two, clusters of 8 CTAs fit only 30 at once on an H200
// (ncu, 2026-11-21), so the 32 clusters of a 4096-row weight ran in two waves.) The tiles are
// rows of eight 16-byte chunks, 128-byte swizzled: chunk c of row r sits at c ^ r%8, tiles 1024-byte
// aligned. That is the layout wgmma's SWIZZLE_128B K-major descriptors read, and it spreads the
// copies over all 32 banks.
//
// Per K block, the kernel sums the block into a fresh fp32 partial tile (64 rows × 8·NT tokens),
// which is then multiplied by sx[t]·sw and added to the accumulator: the CPU reference's order of
// operations. Partials and accumulators have the D fragment layout of wgmma m64nN, f32 (PTX ISA):
// lane l, g = l/4, q = l%4, element [n][e] is weight row 16·warp + g + 8·(e/2) and token
// 8n + 2q + e%2 (warp w holds rows 16w .. 16w+15).
//
// wgmma: m64nNk32 e4m3 × e4m3 → f32, A = the 64 weight rows, B = N = 8·NT tokens, both K-major in
// shared memory (the only layout fp8 wgmma takes). A K block is 4 k32 steps; step j starts
// 32 bytes into the swizzled rows (the hardware swizzles the address bits, hence the alignment), the
// first step overwrites the partial (scale-d = 0). The copies are generic-proxy writes and wgmma
// reads through the async proxy, so every thread fences (fence.proxy.async) between its copies
// landing and the barrier that lets the warpgroup read them.
//
// Grouped (kGrouped): the weight holds `groups` matrices of M rows stacked, and the act's rows are
// sorted by group, group g owning rows [group_offsets[g], group_offsets[g + 1]). Token tiles are
// numbered group by group and never span two groups (a group's last tile may be partial); a CTA finds
// its tile's group in group_offsets (group_tile) and streams that group's rows of the weight; a CTA
// whose tile no group holds exits at once. No K split (clusters of one CTA): the groups' tiles fill
// the GPU. Everything else — the pipeline, the per-K-block promotion, the epilogue — is the dense
// kernel's, so a token's row is the bits the unsplit dense kernel gives it.
// Include only from CUDA sources.
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cp_async.cuh"
#include "core/cuda_launch.h"
#include "core/dependent_launch.cuh"
#include "ops/cuda/gemm_fp8_small_t.h"
#include "ops/cuda/vector.cuh"
#include "ops/cuda/wgmma_e4m3.cuh"

namespace lockstep::cuda::stream_kernel {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;         // 4 warps: one warpgroup
constexpr int kRows = kFp8SmallTRows;  // weight rows of a CTA: one wgmma m64 tile
constexpr int kBlockK = 128;          // bytes of a K block (e4m3): one swizzled row
constexpr int kMaxSplits = 4;         // CTAs a cluster (the reduction's traffic grows with it)
constexpr int kCtasPerSm = 3;

template <int NT>
struct Layout {
  static constexpr int kTokens = 8 * NT;
  // CTAs an SM: kCtasPerSm, but two for the 128-token tile (its partial and accumulator tiles
  // take 128 registers a thread; a third CTA would leave too few for the rest).
  static constexpr int kCtas = NT > 8 ? 2 : kCtasPerSm;
  // A stage: the weight tile, then the act tile.
  static constexpr int kActOffset = kRows * kBlockK;
  static constexpr int kStageBytes = kActOffset + kTokens * kBlockK;
  static constexpr int kScaleBytes = kTokens * 4 + 16;  // per stage: kTokens act scales, the weight scale
  // Up to 8 stages, as many as kCtas CTAs an SM leave room for (228 KiB, 1 KiB reserved each).
  static constexpr int kStages = std::min(8, (228 * 1024 / kCtas - 1024) / (kStageBytes + kScaleBytes));
  // After the stages, the scales of every stage.
  static constexpr int kScalesOffset = kStages * kStageBytes;
  // After the main loop the shared memory holds the CTA's partial tile, token-major, rows padded to
  // kRedStride floats so the fragment stores hit distinct banks.
  static constexpr int kRedStride = kRows + 4;
  static constexpr int kSmem = std::max(kScalesOffset + kStages * kScaleBytes, kTokens * kRedStride * 4);
  static_assert(kStageBytes % kSwizzleAtom == 0);
  static_assert(kStages >= 3, "a stage in use, two in flight");
  static_assert(kCtas * (kSmem + 1024) <= 228 * 1024);
};

struct Args {
  const uint8_t* act;           // e4m3 [T, K]
  const float* act_scales;      // [K/128, T]
  const uint8_t* weight;        // e4m3 [M, K] (grouped: [groups · M, K], the groups' matrices stacked)
  const float* weight_scales;   // [M/128, ld_weight_scales] (grouped: [groups · M/128, …])
  void* out;                    // [T, M]
  int64_t T, M, K, ld_weight_scales;
  const int64_t* group_offsets = nullptr;  // grouped: groups + 1 row offsets into act and out
  int groups = 0;
};

// The tokens of this CTA: tile blockIdx.z of 8·NT tokens (one tile when T ≤ 8·NT).
struct TokenTile {
  int64_t first;  // its first token
  int count;      // its tokens: 8·NT, or fewer in the last tile
  int group;      // grouped: the group they belong to
};

// Grouped: tile blockIdx.z of the tiles of 8·NT rows numbered group by group. Each warp finds it
// alone, 32 groups at a time: lane l takes group g0 + l, its tile count is prefix-summed across the
// lanes, and the lane whose tiles hold blockIdx.z tells the others where they start. Count 0 if no
// group holds it (a launch sized for more tiles than the offsets take): the CTA exits.
template <int NT>
__device__ __forceinline__ TokenTile group_tile(const Args& a) {
  constexpr int kTokens = 8 * NT;
  const int lane = threadIdx.x % 32, tile = int(blockIdx.z);
  int tiles_before = 0;  // the tiles of groups [0, g0)
  for (int g0 = 0; g0 < a.groups; g0 += 32) {
    const int g = g0 + lane;
    const int64_t begin = g < a.groups ? a.group_offsets[g] : 0, end = g < a.groups ? a.group_offsets[g + 1] : 0;
    const int tiles = int((end - begin + kTokens - 1) / kTokens);
    int through = tiles;  // the tiles of groups [g0, g]
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(~0u, through, d);
      if (lane >= d) through += v;
    }
    const int start = tiles_before + through - tiles;
    const unsigned holder = __ballot_sync(~0u, tile >= start && tile < start + tiles);
    if (holder != 0) {
      const int l = __ffs(int(holder)) - 1;
      const int64_t first = __shfl_sync(~0u, begin, l) + int64_t(tile - __shfl_sync(~0u, start, l)) * kTokens;
      return {first, int(min(int64_t(kTokens), __shfl_sync(~0u, end, l) - first)), g0 + l};
    }
    tiles_before += __shfl_sync(~0u, through, 31);
  }
  return {0, 0, 0};
}

template <int NT, bool kGrouped>
__device__ __forceinline__ TokenTile token_tile(const Args& a) {
  if constexpr (kGrouped) return group_tile<NT>(a);
  const int64_t first = int64_t(blockIdx.z) * (8 * NT);
  return {first, int(min(int64_t(8 * NT), a.T - first)), 0};
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

__device__ __forceinline__ Copier copier(const Args& a, int64_t row0, const TokenTile& tile) {
  const int tid = threadIdx.x, r = tid / 8, c = tid % 8;
  return {a.weight + (row0 + r) * a.K + c * 16, a.act + (tile.first + r) * a.K + c * 16,
          a.act_scales + tile.first + tid, 16 * a.K, chunk_offset(r, c), r};
}

// Issues the cp.async copies of K block kb into a stage: load_weight the weight tile and its
// scale, load_act the act tile and scales (one commit group together, committed by the caller).
// Apart, because the weight may be read before the kernel that wrote the act has ended.
template <int NT>
__device__ __forceinline__ void load_weight(uint8_t* tiles, uint8_t* scales, const Copier& cp, const Args& a,
                                            int64_t row0, int kb) {
  const uint8_t* w = cp.weight + kb * kBlockK;
#pragma unroll
  for (int j = 0; j < kRows / 16; ++j, w += cp.stride) cp_async16(tiles + cp.dst + j * 16 * kBlockK, w, true);
  if (threadIdx.x == 0)  // the weight scale of the 128-row block holding the CTA's rows
    cp_async4(scales + Layout<NT>::kTokens * 4, a.weight_scales + row0 / 128 * a.ld_weight_scales + kb, true);
}

template <int NT>
__device__ __forceinline__ void load_act(uint8_t* tiles, uint8_t* scales, const Copier& cp, const Args& a,
                                         int tokens, int kb) {
  using L = Layout<NT>;
  const int tid = threadIdx.x;
  const uint8_t* x = cp.act + kb * kBlockK;
#pragma unroll
  for (int j = 0; j < (L::kTokens + 15) / 16; ++j, x += cp.stride) {
    const int t = cp.token + 16 * j;
    if (t < L::kTokens) cp_async16(tiles + L::kActOffset + cp.dst + j * 16 * kBlockK, t < tokens ? x : a.act, t < tokens);
  }
  if (tid < L::kTokens)
    cp_async4(scales + tid * 4, tid < tokens ? cp.act_scale + kb * a.T : a.act_scales, tid < tokens);
}

// p = Σ over the K block in `tiles` of the weight rows × the tokens (wgmma_e4m3.cuh).
template <int NT>
__device__ __forceinline__ void partial_wgmma(const uint8_t* tiles, float (&p)[NT][4]) {
  const uint32_t weight = smem_address(tiles);
  wgmma_k_block<NT>(weight, weight + Layout<NT>::kActOffset, p);
}

__device__ __forceinline__ void store4(float* out, const float4& v) { *reinterpret_cast<float4*>(out) = v; }
__device__ __forceinline__ void store4(uint16_t* out, const float4& v) {
  *reinterpret_cast<uint2*>(out) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

// Grid (splits, M/kRows, token tiles), clusters of (splits, 1, 1): blockIdx.x is the rank in the
// cluster. Grouped: splits 1, and the token tiles of every group.
template <int NT, class Out, bool kGrouped = false>
__global__ void __launch_bounds__(kThreads, Layout<NT>::kCtas) small_t_kernel(const Args a) {
  using L = Layout<NT>;
  // The swizzle needs 1024-byte aligned tiles. (The compiler takes this alignment as given; on
  // sm_90 dynamic shared memory starts at 1024, after the reserved kilobyte.)
  extern __shared__ __align__(kSwizzleAtom) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, g = tid % 32 / 4, q = tid % 4;
  const int split = blockIdx.x, splits = gridDim.x;
  const int64_t row0 = int64_t(blockIdx.y) * kRows;
  const int kblocks = int(a.K / kBlockK), kb0 = split * kblocks / splits;
  const int count = (split + 1) * kblocks / splits - kb0;
  constexpr int kStages = L::kStages;
  auto tiles = [&](int i) { return smem + i % kStages * L::kStageBytes; };
  auto scales = [&](int i) { return smem + L::kScalesOffset + i % kStages * L::kScaleBytes; };

  const TokenTile tile = token_tile<NT, kGrouped>(a);
  if constexpr (kGrouped) {
    if (tile.count == 0) return;  // past the experts' tiles (a launch sized for the most they may take)
  }
  // The CTA's first row in the (stacked) weight; row0 is its first output column.
  const int64_t weight_row0 = kGrouped ? tile.group * a.M + row0 : row0;
  const Copier cp = copier(a, weight_row0, tile);
  float acc[NT][4] = {}, p[NT][4] = {};
  // Launched early (core/early_start.h), the kernel requests its first stages' weight tiles while
  // the kernel before it (which writes the act) still runs: all of them from 16 tokens on, two at up
  // to 8. There that kernel (RMSNorm, SwiGLU: one or a few rows) is latency-bound and the requests of
  // every resident CTA queue ahead of its own reads: with all 7 stages the norms took 5.1 and 6.8 µs
  // a layer instead of 3.3 and 3.0, with none the GEMMs lost what the norms won; two stages hide
  // the GEMM's first DRAM round trip and little more (fp8 B = 1 decode, H200, 2026-11-22: 334–335
  // tokens/s with two, 326 with none, 321 with all; one to three stages alike within noise).
  constexpr int kStagesBeforeWait = NT > 1 ? kStages - 1 : 2;
#pragma unroll
  for (int i = 0; i < kStagesBeforeWait; ++i)
    if (i < count) load_weight<NT>(tiles(i), scales(i), cp, a, weight_row0, kb0 + i);
  wait_for_previous_kernel();
  let_next_kernel_start();  // its CTAs wait, resident, for this kernel's end instead of launching after it
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i >= kStagesBeforeWait && i < count) load_weight<NT>(tiles(i), scales(i), cp, a, weight_row0, kb0 + i);
    if (i < count) load_act<NT>(tiles(i), scales(i), cp, a, tile.count, kb0 + i);
    cp_async_commit();
  }
  for (int i = 0; i < count; ++i) {
    cp_async_wait<kStages - 2>();  // K block i has landed (this thread's copies) ...
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();               // ... everyone's; and everyone is done with block i - 1
    const int next = i + kStages - 1;  // into the stage block i - 1 used
    if (next < count) {
      load_weight<NT>(tiles(next), scales(next), cp, a, weight_row0, kb0 + next);
      load_act<NT>(tiles(next), scales(next), cp, a, tile.count, kb0 + next);
    }
    cp_async_commit();
    partial_wgmma<NT>(tiles(i), p);
    add_scaled<NT>(acc, p, reinterpret_cast<const float*>(scales(i)),
                   *reinterpret_cast<const float*>(scales(i) + L::kTokens * 4), q);
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages become the partial tile

  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(8 * n + 2 * q + e % 2) * L::kRedStride + 16 * warp + g + e / 2 * 8] = acc[n][e];
  cluster_sync_publish();  // every partial tile of the cluster written
  const cg::cluster_group cluster = cg::this_cluster();

  // This CTA's share of the output: rows [split, split + 1) · kRows/splits of every token, summed
  // over the cluster's partial tiles in rank order, 4 rows at a time. Every rank's load is issued
  // before the first add: one distributed-shared-memory latency per item, not one per rank.
  const int rows = kRows / splits, quads = rows / 4;
  Out* out = static_cast<Out*>(a.out) + tile.first * a.M;
  for (int i = tid; i < tile.count * quads; i += kThreads) {
    const int t = i / quads, r = split * rows + i % quads * 4;
    float4 v[kMaxSplits];
#pragma unroll
    for (int rank = 0; rank < kMaxSplits; ++rank)
      if (rank < splits)
        v[rank] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, rank) + t * L::kRedStride + r);
    float4 sum = v[0];
#pragma unroll
    for (int rank = 1; rank < kMaxSplits; ++rank)
      if (rank < splits) sum.x += v[rank].x, sum.y += v[rank].y, sum.z += v[rank].z, sum.w += v[rank].w;
    store4(out + t * a.M + row0 + r, sum);
  }
  cluster_sync_relaxed();  // no CTA leaves (freeing its shared memory) while another still reads it
}

template <int NT, class Out, bool kGrouped = false>
auto prepared_kernel() {
  constexpr auto kernel = small_t_kernel<NT, Out, kGrouped>;
  allow_dynamic_smem<kernel>(Layout<NT>::kSmem);
  return kernel;
}

// Grid (splits, row blocks, token tiles) in clusters of (splits, 1, 1).
inline LaunchConfig launch_config(int splits, int64_t row_blocks, int smem, int64_t token_tiles = 1) {
  return LaunchConfig(dim3(unsigned(splits), unsigned(row_blocks), unsigned(token_tiles)), dim3(kThreads),
                      size_t(smem), dim3(unsigned(splits), 1, 1));
}

// fn(std::integral_constant<int, NT>()) for the token tile of the narrowest width that holds
// `tokens` up to 64, else for tiles of 128 (NT = 16). A token's sum is the same at every width.
template <class Fn>
void with_tile_width(int64_t tokens, Fn&& fn) {
  if (tokens <= 8) return fn(std::integral_constant<int, 1>());
  if (tokens <= 16) return fn(std::integral_constant<int, 2>());
  if (tokens <= 32) return fn(std::integral_constant<int, 4>());
  if (tokens <= 64) return fn(std::integral_constant<int, 8>());
  fn(std::integral_constant<int, 16>());
}

}  // namespace lockstep::cuda::stream_kernel
