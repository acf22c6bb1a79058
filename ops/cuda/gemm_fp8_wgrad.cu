// ops/cuda/gemm_fp8_wgrad.cu — ops/cuda/gemm_fp8_wgrad.h: the fp8 WGrad with per-token-block scales
// on both operands. cuBLASLt's kernels for it (VEC128 × VEC128) stall the tensor cores at every
// 128-token block to apply the scales; here one warpgroup applies them while the other's wgmmas run.
//
// Work: a persistent grid (one CTA an SM) walks the 128 × kCols output tiles in groups of
// kGroupRows row blocks (the CTAs running together share operand blocks in L2). A CTA has three
// warpgroups: warpgroup 0 is the producer (one thread issues the copies; its registers go to the
// others with setmaxnreg), warpgroups 1 and 2 are consumers owning rows 0-63 and 64-127 of the tile.
// With kCluster = 2, the two CTAs of a cluster take vertically adjacent tiles and each loads half
// of their common x_t tile into both (TMA multicast).
//
// Pipeline: per token block kb, a stage holds the dy_t tile (128 rows × 128 tokens), the x_t tile
// (kCols rows × 128 tokens; rows past K zero-filled by TMA) and both blocks' scales. The producer
// loads a stage with two TMA tile copies (128-byte swizzled, ops/cuda/wgmma.cuh) and two bulk copies
// once the stage's `empty` barrier says both consumers are done with it; the copies complete its
// `full` barrier (transaction bytes). kStages stages in a ring, shared across tiles, so the next
// tile's loads start while the consumers store this one.
//
// Consumers: per token block and 128-column chunk, wgmma m64n128k32 (4 k32 steps) sums the block
// into a fresh fp32 partial, then acc += partial · (sdy[row] · sx[col]) — the CPU reference's order
// (one fma instead of its multiply and add). With kPartials = 2 the next block's wgmmas are issued
// before this block's partial is scaled, so a warpgroup keeps the tensor cores busy by itself; with
// 1, the other warpgroup's wgmmas overlap the scaling. With kARegs, a warpgroup reads its dy rows
// into registers once a block (ldmatrix) for all its chunks' wgmmas. Accumulators stay in registers for the whole
// token range and go straight to dw (float2 stores: 4 lanes write 32 contiguous bytes of a row);
// accumulating, they are added to dw's values, which a bulk L2 prefetch fetched during the tile's
// last token blocks.
#include "ops/cuda/gemm_fp8_wgrad.h"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>

#include "core/cp_async.cuh"
#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "core/device.h"
#include "ops/cuda/wgmma.cuh"

namespace lockstep::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 384;        // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kRows = 128;           // dw rows (N) of a tile: 64 a consumer warpgroup
constexpr int kBlockT = 128;         // tokens of a block: one 128-byte swizzled row of e4m3
constexpr int kChunk = 128;          // dw columns of one partial (m64n128)
constexpr int kGroupRows = 8;
constexpr int kPrefetchBlocks = 8;  // token blocks before a tile's end that its dw is prefetched
// 128 · 40 + 256 · 232 ≤ 64K registers: the consumers hold 64 partial and 64–128 accumulator floats.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;

template <int Cols, int Partials, int Stages, int Cluster, bool ARegs>
struct Config {
  static constexpr int kCols = Cols;  // dw columns (K) of a tile
  static constexpr int kChunks = Cols / kChunk;
  static constexpr int kPartials = Partials;
  static constexpr int kStages = Stages;
  // CTAs of a cluster: row blocks side by side, sharing the x_t tile (each loads 1/kCluster of it
  // for all of them, TMA multicast), which cuts the L2 → SM traffic.
  static constexpr int kCluster = Cluster;
  static constexpr int kXRows = Cols / Cluster;  // rows of the x_t tile a CTA loads
  // The dy_t tile read into registers once a token block (ldmatrix) rather than by every chunk's
  // wgmmas from shared memory, whose bandwidth the chunks share with TMA.
  static constexpr bool kARegs = ARegs;
  // A stage: the dy_t tile, then the x_t tile; after the stages, per stage: 128 dy scales, then
  // kCols x scales; then the barriers. The base is aligned to kSwizzleAtom inside the allocation.
  static constexpr int kXOffset = kRows * kBlockT;
  static constexpr int kStageBytes = kXOffset + kCols * kBlockT;
  static constexpr int kScalesOffset = kStages * kStageBytes;
  static constexpr int kScaleBytes = (kRows + kCols) * 4;
  static constexpr int kBarrierOffset = kScalesOffset + kStages * kScaleBytes;
  static constexpr int kSmem = kBarrierOffset + 2 * kStages * 8 + kSwizzleAtom;
  static_assert(kStageBytes % kSwizzleAtom == 0 && kXRows * kBlockT % kSwizzleAtom == 0 && kScaleBytes % 16 == 0);
  static_assert(kSmem <= 227 * 1024, "shared memory of one CTA an SM");
  static_assert(Partials == 1 || kChunks == 1, "two partials in flight fit next to one chunk of accumulators only");
  static_assert(Partials == 1 || !ARegs, "no registers for A next to two partials");
};

using Variant0 = Config<256, 1, 4, 1, false>;
using Variant1 = Config<128, 2, 6, 1, false>;
using Variant2 = Config<128, 1, 6, 1, false>;
using Variant3 = Config<256, 1, 4, 2, false>;
using Variant4 = Config<128, 2, 6, 2, false>;
using Variant5 = Config<256, 1, 4, 1, true>;
using Variant6 = Config<256, 1, 4, 2, true>;
const char* const kVariantNames[kFp8WgradVariants] = {
    "128x256 1 partial 4 stages",
    "128x128 2 partials 6 stages",
    "128x128 1 partial 6 stages",
    "128x256 1 partial 4 stages, x multicast to 2 CTAs",
    "128x128 2 partials 6 stages, x multicast to 2 CTAs",
    "128x256 1 partial 4 stages, dy in registers",
    "128x256 1 partial 4 stages, dy in registers, x multicast to 2 CTAs"};

struct Args {
  const float* dy_scales;  // [kblocks, n]
  const float* x_scales;   // [kblocks, k]
  float* dw;               // [n, k]
  int n, k, kblocks;
  int row_blocks, col_blocks;  // of the cluster tiles (kCluster · 128 rows × kCols)
  bool accumulate;
};

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// The producer's arrival, announcing the bytes its copies will complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// The arrival of a thread of the cluster on CTA `cta`'s barrier at bar's offset.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// Waits until the barrier's phase of this parity has completed (a fresh barrier is in phase 0, so
// parity 1 passes at once). Cluster scope where other CTAs' arrivals release their reads.
template <bool ClusterScope = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    if constexpr (ClusterScope)
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_address(bar)), "r"(parity)
          : "memory");
    else
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_address(bar)), "r"(parity)
          : "memory");
  } while (!done);
}

// Tile (x: token, y: row) of a 2-D tensor map → shared memory, completing `bar`'s transaction bytes.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(smem_address(dst)),
      "l"(map), "r"(x), "r"(y), "r"(smem_address(bar))
      : "memory");
}
// Likewise into the shared memory of every CTA of the cluster in `ctas` (a bit mask), at dst's
// offset, completing the transaction bytes of the barrier at bar's offset in each.
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar,
                                                   uint16_t ctas) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_address(dst)),
      "l"(map), "r"(x), "r"(y), "r"(smem_address(bar)), "h"(ctas)
      : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) global → shared, likewise.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

// Asks for `bytes` (a multiple of 16, from a 16-byte aligned address) of global memory in L2.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

struct Tile {
  int row0, col0;  // this CTA's
  int chunks;      // 128-column chunks inside dw: kChunks, fewer at the right edge
  bool rows_valid; // false: a cluster's CTA past the last row block (it loads x_t for the others)
};

// This CTA's tile of cluster tile i of the walk: groups of kGroupRows row blocks (of the cluster
// tiles), column-major inside a group.
template <class C>
__device__ __forceinline__ Tile tile_at(int i, const Args& a) {
  const int per_group = kGroupRows * a.col_blocks, group = i / per_group, first = group * kGroupRows;
  const int rows = min(kGroupRows, a.row_blocks - first), j = i - group * per_group;
  const int row0 = ((first + j % rows) * C::kCluster + int(blockIdx.x) % C::kCluster) * kRows, col0 = j / rows * C::kCols;
  return {row0, col0, min(C::kCols, a.k - col0) / kChunk, row0 < a.n};
}

template <class C>
__device__ void produce(uint8_t* smem, uint64_t* full, uint64_t* empty, const CUtensorMap* dy_map,
                        const CUtensorMap* x_map, const Args& a) {
  const int rank = int(blockIdx.x) % C::kCluster;
  int it = 0;  // blocks loaded so far: stage it % kStages, in its (it / kStages)-th round
  for (int t = blockIdx.x / C::kCluster; t < a.row_blocks * a.col_blocks; t += gridDim.x / C::kCluster) {
    const Tile tile = tile_at<C>(t, a);
    // Scales inside the tensors only (the tile copies are zero-filled past its end).
    const int dy_scales = tile.rows_valid ? kRows : 0, x_scales = tile.chunks * kChunk;
    for (int kb = 0; kb < a.kblocks; ++kb, ++it) {
      const int s = it % C::kStages;
      // (Cluster: once every CTA's consumers are done with the stage, which the x_t copy refills.)
      mbar_wait<(C::kCluster > 1)>(&empty[s], (it / C::kStages & 1) ^ 1);
      uint8_t* stage = smem + s * C::kStageBytes;
      float* scales = reinterpret_cast<float*>(smem + C::kScalesOffset + s * C::kScaleBytes);
      mbar_arrive_expect_tx(&full[s], C::kStageBytes + (dy_scales + x_scales) * 4);
      tma_load(stage, dy_map, kb * kBlockT, tile.row0, &full[s]);
      if constexpr (C::kCluster == 1)
        tma_load(stage + C::kXOffset, x_map, kb * kBlockT, tile.col0, &full[s]);
      else
        tma_load_multicast(stage + C::kXOffset + rank * C::kXRows * kBlockT, x_map, kb * kBlockT,
                           tile.col0 + rank * C::kXRows, &full[s], (1 << C::kCluster) - 1);
      if (dy_scales) bulk_load(scales, a.dy_scales + int64_t(kb) * a.n + tile.row0, dy_scales * 4, &full[s]);
      bulk_load(scales + kRows, a.x_scales + int64_t(kb) * a.k + tile.col0, x_scales * 4, &full[s]);
    }
  }
}

// The A fragments (ops/cuda/wgmma.cuh) of the 4 k32 steps of this warpgroup's 64 dy rows in the
// stage, with ldmatrix (8 rows × 16 bytes a matrix): lane l addresses row 16·warp + l%8 + 8·(l/8 % 2),
// 16-byte chunk 2j + l/16 of step j, so that matrix i is register i of the layout.
using AFragments = uint32_t[kBlockT / 32][4];

template <class C>
__device__ __forceinline__ void load_a(AFragments& a, const uint8_t* stage, int wg) {
  const int lane = threadIdx.x % 32, row = 64 * wg + threadIdx.x % 128 / 32 * 16 + lane % 8 + 8 * (lane / 8 % 2);
  const uint32_t base = smem_address(stage) + row * kBlockT;
#pragma unroll
  for (int j = 0; j < kBlockT / 32; ++j)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[j][0]), "=r"(a[j][1]), "=r"(a[j][2]), "=r"(a[j][3])
                 : "r"(base + (((2 * j + lane / 16) ^ (row % 8)) << 4))
                 : "memory");
}

// p = Σ over the stage's 128 tokens of this warpgroup's 64 dy rows × x rows of chunk c (asynchronous:
// one wgmma group, the first k32 step overwriting p). `a`: the dy rows' fragments when kARegs.
template <class C>
__device__ __forceinline__ void issue_partial(float (&p)[16][4], const uint8_t* stage, int wg, int c,
                                              const AFragments& a) {
  const uint32_t dy = smem_address(stage) + wg * 64 * kBlockT, x = smem_address(stage) + C::kXOffset + c * kChunk * kBlockT;
  pin_registers(p);  // the previous block's reads of p come first
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < kBlockT / 32; ++j) {
    if constexpr (C::kARegs)
      wgmma_e4m3_rs(p, a[j], tile_descriptor(x + 32 * j), j > 0);
    else
      wgmma_e4m3<16>(p, tile_descriptor(dy + 32 * j), tile_descriptor(x + 32 * j), j > 0);
  }
  wgmma_commit();
}

// acc += p · sdy[row] · sx[col]: rows r, r + 8 of the tile, columns of chunk c.
template <class C>
__device__ __forceinline__ void add_scaled(float (&acc)[16][4], const float (&p)[16][4], const float* scales, int r,
                                           int q, int c) {
  const float s0 = scales[r], s1 = scales[r + 8];
  const float* sx = scales + kRows + c * kChunk + 2 * q;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const float2 x = *reinterpret_cast<const float2*>(sx + 8 * n);
    acc[n][0] = fmaf(p[n][0], s0 * x.x, acc[n][0]);
    acc[n][1] = fmaf(p[n][1], s0 * x.y, acc[n][1]);
    acc[n][2] = fmaf(p[n][2], s1 * x.x, acc[n][2]);
    acc[n][3] = fmaf(p[n][3], s1 * x.y, acc[n][3]);
  }
}

// A warp is done with a stage: its lanes' scale reads are ordered before the arrival (on the
// stage's barrier in every CTA of the cluster, whose x_t copies refill it).
template <class C>
__device__ __forceinline__ void release(uint64_t* empty) {
  __syncwarp();
  const int lane = threadIdx.x % 32;
  if constexpr (C::kCluster == 1) {
    if (lane == 0) mbar_arrive(empty);
  } else if (lane < C::kCluster) {
    mbar_arrive_cluster(empty, lane);
  }
}

template <class C>
__device__ void consume(uint8_t* smem, uint64_t* full, uint64_t* empty, const Args& a, int wg) {
  const int tid = threadIdx.x % 128, warp = tid / 32, g = tid % 32 / 4, q = tid % 4;
  const int r = 64 * wg + 16 * warp + g;  // this thread's rows of a tile: r and r + 8
  auto stage = [&](int j) { return smem + j % C::kStages * C::kStageBytes; };
  auto scales = [&](int j) {
    return reinterpret_cast<const float*>(smem + C::kScalesOffset + j % C::kStages * C::kScaleBytes);
  };
  auto wait_full = [&](int j) { mbar_wait(&full[j % C::kStages], j / C::kStages & 1); };
  int base = 0;  // blocks consumed before this tile (the producer's count); a.kblocks ≥ 1
  for (int t = blockIdx.x / C::kCluster; t < a.row_blocks * a.col_blocks; t += gridDim.x / C::kCluster, base += a.kblocks) {
    const Tile tile = tile_at<C>(t, a);
    float* out = a.dw + int64_t(tile.row0 + r) * a.k + tile.col0 + 2 * q;  // chunk c, n: + kChunk c + 8n
    float acc[C::kChunks][16][4] = {};
    // Accumulating: kPrefetchBlocks before the end, warpgroup 0 has the tile's dw rows fetched into
    // L2 (one bulk prefetch a row), for the epilogue's loads.
    const int prefetch_kb = a.accumulate ? max(0, a.kblocks - kPrefetchBlocks) : -1;
    auto prefetch = [&](int kb) {
      if (kb == prefetch_kb && wg == 0 && tile.rows_valid)
        bulk_prefetch_l2(a.dw + int64_t(tile.row0 + tid) * a.k + tile.col0, tile.chunks * kChunk * 4);
    };

    float p[C::kPartials][16][4];
    AFragments dy_frags;  // (kARegs)
    if constexpr (C::kPartials == 1) {
      for (int kb = 0; kb < a.kblocks; ++kb) {
        const int j = base + kb;
        prefetch(kb);
        wait_full(j);
        if constexpr (C::kARegs) load_a<C>(dy_frags, stage(j), wg);
#pragma unroll
        for (int c = 0; c < C::kChunks; ++c)
          if (c < tile.chunks) {
            issue_partial<C>(p[0], stage(j), wg, c, dy_frags);
            wgmma_wait<0>();
            pin_registers(p[0]);
            add_scaled<C>(acc[c], p[0], scales(j), r, q, c);
          }
        release<C>(&empty[j % C::kStages]);
      }
    } else {
      // Block kb + 1's wgmmas are issued before block kb's partial is scaled. Written so that one
      // group (p[0]'s) is in flight at every loop edge, whatever the path: otherwise ptxas, unable
      // to tell which group may still write which registers, serializes every wgmma.
      auto scale_block = [&](float (&p)[16][4], int kb) {
        prefetch(kb);
        pin_registers(p);
        add_scaled<C>(acc[0], p, scales(base + kb), r, q, 0);
        release<C>(&empty[(base + kb) % C::kStages]);
      };
      auto issue_block = [&](float (&p)[16][4], int kb) {
        wait_full(base + kb);
        issue_partial<C>(p, stage(base + kb), wg, 0, dy_frags);
      };
      issue_block(p[0], 0);
      int kb = 0;
      for (; kb + 2 < a.kblocks; kb += 2) {
        issue_block(p[1], kb + 1);
        wgmma_wait<1>();
        scale_block(p[0], kb);
        issue_block(p[0], kb + 2);
        wgmma_wait<1>();
        scale_block(p[1], kb + 1);
      }
      if (kb + 1 < a.kblocks) {
        issue_block(p[1], kb + 1);
        wgmma_wait<1>();
        scale_block(p[0], kb);
        wgmma_wait<0>();
        scale_block(p[1], kb + 1);
      } else {
        wgmma_wait<0>();
        scale_block(p[0], kb);
      }
    }

    if (!tile.rows_valid) continue;
    // dw (+)= acc, the CPU reference's order: all loads first, so that they are in flight together.
    if (a.accumulate)
#pragma unroll
      for (int c = 0; c < C::kChunks; ++c)
        if (c < tile.chunks)
#pragma unroll
          for (int n = 0; n < 16; ++n) {
            const float2 v0 = *reinterpret_cast<const float2*>(out + c * kChunk + 8 * n),
                         v1 = *reinterpret_cast<const float2*>(out + c * kChunk + 8 * n + 8 * int64_t(a.k));
            acc[c][n][0] += v0.x, acc[c][n][1] += v0.y, acc[c][n][2] += v1.x, acc[c][n][3] += v1.y;
          }
#pragma unroll
    for (int c = 0; c < C::kChunks; ++c)
      if (c < tile.chunks)
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          *reinterpret_cast<float2*>(out + c * kChunk + 8 * n) = make_float2(acc[c][n][0], acc[c][n][1]);
          *reinterpret_cast<float2*>(out + c * kChunk + 8 * n + 8 * int64_t(a.k)) =
              make_float2(acc[c][n][2], acc[c][n][3]);
        }
  }
}

template <class C>
__global__ void __launch_bounds__(kThreads, 1)
    wgrad_kernel(const __grid_constant__ CUtensorMap dy_map, const __grid_constant__ CUtensorMap x_map, const Args a) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + (kSwizzleAtom - smem_address(smem_raw) % kSwizzleAtom) % kSwizzleAtom;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kBarrierOffset);
  uint64_t* empty = full + C::kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps * C::kCluster);
    }
    // The barriers' initialization, visible to the async proxy (TMA) before any copy uses them.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (C::kCluster == 1)
    __syncthreads();
  else
    cg::this_cluster().sync();  // the other CTAs' copies and arrivals find the barriers ready
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (threadIdx.x == 0) produce<C>(smem, full, empty, &dy_map, &x_map, a);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    consume<C>(smem, full, empty, a, wg - 1);
  }
  // No CTA exits (its shared memory gone) while the others may still arrive on its barriers.
  if constexpr (C::kCluster > 1) cg::this_cluster().sync();
}

// cuTensorMapEncodeTiled from the driver, found at run time (the build links no libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const auto fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    LOCKSTEP_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    LOCKSTEP_CHECK(found == cudaDriverEntryPointSuccess && f, "fp8 WGrad: the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The map of e4m3 data [rows, Tp] that copies boxes of `box_rows` rows × 128 tokens, 128-byte
// swizzled; rows past the end read as zeros.
CUtensorMap tile_map(const Tensor& data, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(data.dim(1)), cuuint64_t(data.dim(0))};
  const cuuint64_t strides[1] = {cuuint64_t(data.dim(1))};  // bytes from one row to the next
  const cuuint32_t box[2] = {kBlockT, cuuint32_t(box_rows)}, element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, data.data(), dims, strides, box,
                                    element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LOCKSTEP_CHECK(r == CUDA_SUCCESS, "fp8 WGrad: cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for ",
                 data.describe());
  return map;
}

template <class C>
void launch(const Fp8Rows& dy_t, const Fp8Rows& x_t, Args a) {
  constexpr auto kernel = wgrad_kernel<C>;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = C::kCluster;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(C::kCluster);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = C::kSmem;
  config.stream = current_stream();
  config.attrs = &cluster;
  config.numAttrs = C::kCluster > 1 ? 1 : 0;
  // A persistent grid: as many clusters as fit on the GPU at once (one CTA an SM).
  static const int max_clusters = [&] {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    int n = device_sm_count();
    if (C::kCluster > 1) LOCKSTEP_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &config));
    LOCKSTEP_CHECK(n > 0, "fp8 WGrad: no cluster of ", C::kCluster, " CTAs fits on this GPU");
    return n;
  }();
  a.row_blocks = int(a.n / kRows + C::kCluster - 1) / C::kCluster;
  a.col_blocks = (a.k + C::kCols - 1) / C::kCols;
  const CUtensorMap dy_map = tile_map(dy_t.data, kRows), x_map = tile_map(x_t.data, C::kXRows);
  config.gridDim = dim3(unsigned(C::kCluster * std::min(a.row_blocks * a.col_blocks, max_clusters)));
  LOCKSTEP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, dy_map, x_map, a));
}

void check_aligned(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t.data()) % 16 == 0, "fp8 WGrad: ", what,
                 " must be 16-byte aligned, got ", t.describe(), " at ", t.data());
}

}  // namespace

const char* fp8_wgrad_variant_name(int variant) {
  LOCKSTEP_CHECK(variant >= 0 && variant < kFp8WgradVariants, "fp8 WGrad: variant 0 .. ", kFp8WgradVariants - 1,
                 ", got ", variant);
  return kVariantNames[variant];
}

void gemm_fp8_wgrad(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate, int variant) {
  (void)fp8_wgrad_variant_name(variant);
  const int64_t N = dy_t.rows(), K = x_t.rows(), Tp = dy_t.cols();
  LOCKSTEP_CHECK(N % kRows == 0 && K % kChunk == 0 && Tp % kBlockT == 0 && x_t.cols() == Tp,
                 "fp8 WGrad: expected dy_t [N, Tp] and x_t [K, Tp] with N, K, Tp multiples of 128, got ",
                 dy_t.data.describe(), " and ", x_t.data.describe());
  LOCKSTEP_CHECK(N < (int64_t(1) << 31) && K < (int64_t(1) << 31) && Tp < (int64_t(1) << 31),
                 "fp8 WGrad: dimensions must fit in int, got ", dy_t.data.describe(), " and ", x_t.data.describe());
  check_aligned(dy_t.data, "dy_t.data");
  check_aligned(x_t.data, "x_t.data");
  check_aligned(dy_t.scales, "dy_t.scales");
  check_aligned(x_t.scales, "x_t.scales");
  check_aligned(dw, "dw");
  if (Tp == 0) {  // no tokens (a tensor map cannot have an empty dimension)
    if (!accumulate) dw.fill_bytes(0);
    return;
  }
  const Args a{dy_t.scales.data_as<float>(), x_t.scales.data_as<float>(), dw.data_as<float>(), int(N), int(K),
               int(Tp / kBlockT), 0, 0, accumulate};
  switch (variant) {
    case 0: return launch<Variant0>(dy_t, x_t, a);
    case 1: return launch<Variant1>(dy_t, x_t, a);
    case 2: return launch<Variant2>(dy_t, x_t, a);
    case 3: return launch<Variant3>(dy_t, x_t, a);
    case 4: return launch<Variant4>(dy_t, x_t, a);
    case 5: return launch<Variant5>(dy_t, x_t, a);
    default: return launch<Variant6>(dy_t, x_t, a);
  }
}

}  // namespace lockstep::cuda
