// ops/cuda/gemm_fp8_pipelined.cu — ops/cuda/gemm_fp8_pipelined.h: the batch-invariant fp8 GEMM at
// training token counts, where it is compute bound. The arrangement follows DeepGEMM's sm90 fp8
// GEMM (deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh): a producer warp fills a ring of
// shared-memory stages with TMA, two consumer warpgroups sum them with wgmma, and while one
// promotes its partial (scales, FMAs) the other's wgmma keeps the tensor cores busy.
//
// Work: a tile is 128 weight rows (one 128×128 scale block per K block) × 128 tokens over the whole
// K range. The kernel is persistent, one CTA (3 warpgroups) an SM taking tile after tile, so the
// loads of a tile's first K blocks overlap the stores of the one before; the stores go straight
// from the accumulator fragments to out. Consumer warpgroup w sums weight rows 64w .. 64w+63 against
// the 128 tokens, wgmma m64n128k32 e4m3 → f32 with A = its weight rows, B = the tokens, both
// K-major and 128-byte swizzled in shared memory: the instruction, operands and step order of the
// weight-streaming kernel's 128-token tile (ops/cuda/gemm_fp8_stream_kernel.cuh), which the TMA's
// SWIZZLE_128B writes in the same layout (16-byte chunk c of row r at c ^ r%8, 1024-byte aligned).
//
// Bits: the weight-streaming kernel splits the K blocks `splits` ways (fp8_batch_invariant_splits,
// the shape's alone), sums each split's blocks into its own accumulator from zero, and adds the
// splits' accumulators in rank order. This kernel walks the same K blocks in order and keeps two
// accumulators: the current split's, started from zero at the split's first block, and the running
// total, which takes each split's accumulator when the split ends (total = acc for the first,
// total + acc after). Per element that is ((acc₀ + acc₁) + acc₂) + acc₃, the same fp32 operations
// in the same order, so the same bits.
//
// Pipeline: stage s holds a K block's weight tile (128 rows × 128 bytes), act tile (128 tokens ×
// 128 bytes; the TMA zero-fills tokens ≥ T) and scales (128 act scales, then the weight scale).
// full[s] completes when the TMA bytes have landed (expect_tx by lane 0) and every producer lane's
// cp.async of the scales has (cp.async.mbarrier.arrive.noinc, one arrival a lane); empty[s] when
// each of the 8 consumer warps has finished its wgmma on the stage and read its scales. The
// producer waits empty[s] before refilling s. The n-th K block a CTA loads (over all its tiles) goes
// to stage n % kStages, and its phase of either barrier has parity n / kStages % 2.
//
// Checked by tests/gpu/test_gemm_gpu.cpp (Fp8PipelinedGpu: the bits of gemm_fp8_streaming at
// Qwen3-8B / 1.7B FProp shapes); timed by `bench_gemm --exact`.
#include "ops/cuda/gemm_fp8_pipelined.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>

#include "core/cp_async.cuh"
#include "core/cuda_check.h"
#include "core/cuda_launch.h"
#include "core/dependent_launch.cuh"
#include "core/device.h"
#include "ops/cuda/gemm_fp8_small_t.h"
#include "ops/cuda/vector.cuh"
#include "ops/cuda/wgmma_e4m3.cuh"

namespace lockstep::cuda {

namespace {

constexpr int kRows = kFp8PipelinedRows;      // two wgmma m64 tiles, one a consumer warpgroup
constexpr int kTokens = kFp8PipelinedTokens;  // wgmma n128, shared by the consumers
constexpr int kNT = kTokens / 8;              // n-fragments of a partial (wgmma_e4m3's NT)
constexpr int kBlockK = 128;                  // bytes of a K block (e4m3): one swizzled row
constexpr int kConsumers = 2;
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr int kThreads = kConsumerThreads + 128;  // the producer warpgroup last; one warp of it works
constexpr int kConsumerWarps = kConsumerThreads / 32;
// Registers a thread (setmaxnreg): the producer needs few; each consumer thread holds three
// 64-float fragments (partial, split accumulator, total). 128·40 + 256·232 ≤ 65536.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;

// The shared memory of a CTA: the stages' tiles, then their scales, then the barriers.
constexpr int kActOffset = kRows * kBlockK;                  // in a stage, after the weight tile
constexpr int kStageBytes = kActOffset + kTokens * kBlockK;  // 32 KiB
constexpr int kScaleBytes = kTokens * 4 + 16;                // 128 act scales, the weight scale, padding
constexpr int kMaxSmem = 227 * 1024;                         // an sm_90 CTA's dynamic shared memory
constexpr int kStages = kMaxSmem / (kStageBytes + kScaleBytes + 16);
constexpr int kScalesOffset = kStages * kStageBytes;
constexpr int kBarriersOffset = kScalesOffset + kStages * kScaleBytes;
constexpr int kSmem = kBarriersOffset + 2 * kStages * 8;
static_assert(kStages >= 4, "stages in flight while both consumers work");
static_assert(kStageBytes % kSwizzleAtom == 0 && kActOffset % kSwizzleAtom == 0);
static_assert(kSmem <= kMaxSmem);
static_assert(kConsumerRegisters * kConsumerThreads + kProducerRegisters * 128 <= 65536);

struct Args {
  const float* act_scales;     // [K/128, T]
  const float* weight_scales;  // [M/128, ld_weight_scales]
  void* out;                   // [T, M]
  int64_t T, M, K, ld_weight_scales;
  int splits;                  // fp8_batch_invariant_splits(M, K)
};

// mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier").
__device__ __forceinline__ void barrier_init(uint32_t bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival, and `bytes` more transaction bytes expected in this phase (the TMA's).
__device__ __forceinline__ void barrier_arrive_expect_bytes(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One arrival once this thread's earlier cp.async copies have landed (counted in the init count).
__device__ __forceinline__ void barrier_arrive_after_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void barrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// The 128 × 128-byte box of `map` at (byte k, row), into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, int k, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(k), "r"(row), "r"(bar)
      : "memory");
}

// The CTA's tiles: row blocks in groups of kGroupRowBlocks, each group's tiles token tile by token
// tile, so that the tiles in work at once share a few row blocks of the weight and a few token
// tiles (both read from L2 mostly, the weight's and the act's bytes from DRAM about once each).
constexpr int64_t kGroupRowBlocks = 8;

struct Tile {
  int64_t row0, first;  // its first weight row and token
  int tokens;           // its tokens: 128, or fewer in the last token tile
};

__device__ __forceinline__ Tile tile_of(int64_t index, const Args& a) {
  const int64_t row_blocks = a.M / kRows, token_tiles = (a.T + kTokens - 1) / kTokens;
  const int64_t group = index / (kGroupRowBlocks * token_tiles), local = index % (kGroupRowBlocks * token_tiles);
  const int64_t rows_in_group = min(kGroupRowBlocks, row_blocks - group * kGroupRowBlocks);
  const int64_t first = local / rows_in_group * kTokens;
  return {(group * kGroupRowBlocks + local % rows_in_group) * kRows, first, int(min(int64_t(kTokens), a.T - first))};
}

// The producer warp: the CTA's tiles' K blocks in order, the n-th into stage n % kStages once the
// consumers have released it.
__device__ __forceinline__ void produce(const CUtensorMap& weight_map, const CUtensorMap& act_map, const Args& a,
                                        uint8_t* smem, int64_t tiles) {
  const int lane = threadIdx.x % 32, kblocks = int(a.K / kBlockK);
  const uint32_t base = smem_address(smem), bars = base + kBarriersOffset;
  int64_t n = 0;  // K blocks issued
  for (int64_t index = blockIdx.x; index < tiles; index += gridDim.x) {
    const Tile tile = tile_of(index, a);
    const float* weight_scales = a.weight_scales + tile.row0 / 128 * a.ld_weight_scales;
    for (int kb = 0; kb < kblocks; ++kb, ++n) {
      const int s = int(n % kStages);
      const uint32_t full = bars + 8 * s, empty = bars + 8 * (kStages + s);
      barrier_wait(empty, uint32_t(n / kStages & 1) ^ 1);  // a fresh barrier's "previous" phase counts as done
      const uint32_t stage = base + s * kStageBytes;
      if (lane == 0) {
        barrier_arrive_expect_bytes(full, kStageBytes);
        tma_load(stage, weight_map, kb * kBlockK, int(tile.row0), full);
        tma_load(stage + kActOffset, act_map, kb * kBlockK, int(tile.first), full);
      }
      uint8_t* scales = smem + kScalesOffset + s * kScaleBytes;
      const float* act_scales = a.act_scales + int64_t(kb) * a.T + tile.first;
#pragma unroll
      for (int j = 0; j < kTokens / 32; ++j) {
        const int t = lane + 32 * j;
        cp_async4(scales + 4 * t, t < tile.tokens ? act_scales + t : a.act_scales, t < tile.tokens);
      }
      if (lane == 0) cp_async4(scales + 4 * kTokens, weight_scales + kb, true);
      barrier_arrive_after_copies(full);
    }
  }
  // Stays until the consumers have released the last stages, so that no copy of this warp is in
  // flight when it exits.
  for (int64_t i = n > kStages ? n - kStages : 0; i < n; ++i)
    barrier_wait(bars + 8 * (kStages + i % kStages), uint32_t(i / kStages & 1));
}

// out[t][r] = v for one element; bf16 rounded to nearest even by the instruction of
// gemm_fp8_stream_kernel.cuh's store4 (cvt.rn.bf16x2.f32), its low half.
__device__ __forceinline__ void store1(float* out, float v) { *out = v; }
__device__ __forceinline__ void store1(uint16_t* out, float v) { *out = uint16_t(pack_bf16x2(v, 0.0f) & 0xFFFF); }

// Persistent: CTA c takes tiles c, c + gridDim.x, ... (tile_of's order), 3 warpgroups: consumers
// 0 and 1, the producer 2. The producer runs up to kStages K blocks ahead, into the next tile too,
// so the consumers' stores of one tile overlap the loads of the next.
template <class Out>
__global__ void __launch_bounds__(kThreads, 1)
    pipelined_kernel(const __grid_constant__ CUtensorMap weight_map, const __grid_constant__ CUtensorMap act_map,
                     const Args a) {
  // TMA's 128-byte swizzle and the wgmma descriptors need 1024-byte aligned tiles.
  extern __shared__ __align__(kSwizzleAtom) uint8_t smem[];
  const int tid = threadIdx.x, warpgroup = tid / 128, lane = tid % 32;
  const int64_t tiles = a.M / kRows * ((a.T + kTokens - 1) / kTokens);
  const uint32_t base = smem_address(smem), bars = base + kBarriersOffset;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(bars + 8 * s, 1 + 32);                      // full: expect_tx + a lane's copies each
      barrier_init(bars + 8 * (kStages + s), kConsumerWarps);  // empty: a consumer warp each
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
  }
  __syncthreads();
  wait_for_previous_kernel();
  let_next_kernel_start();

  if (warpgroup == kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (tid / 32 == kConsumerWarps) produce(weight_map, act_map, a, smem, tiles);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));

  const int warp = tid / 32 % 4, g = lane / 4, q = lane % 4;
  const int kblocks = int(a.K / kBlockK);
  float p[kNT][4] = {}, acc[kNT][4], total[kNT][4] = {};
  int64_t n = 0;  // K blocks consumed
  for (int64_t index = blockIdx.x; index < tiles; index += gridDim.x) {
    const Tile tile = tile_of(index, a);
    int kb = 0;
    for (int split = 0; split < a.splits; ++split) {
      const int end = (split + 1) * kblocks / a.splits;  // gemm_fp8_streaming's split boundaries
#pragma unroll
      for (int i = 0; i < kNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
      for (; kb < end; ++kb, ++n) {
        const int s = int(n % kStages);
        barrier_wait(bars + 8 * s, uint32_t(n / kStages & 1));
        const uint32_t stage = base + s * kStageBytes;
        wgmma_k_block<kNT>(stage + warpgroup * 64 * kBlockK, stage + kActOffset, p);
        const float* scales = reinterpret_cast<const float*>(smem + kScalesOffset + s * kScaleBytes);
        add_scaled<kNT>(acc, p, scales, scales[kTokens], q);
        __syncwarp();
        if (lane == 0) barrier_arrive(bars + 8 * (kStages + s));
      }
#pragma unroll
      for (int i = 0; i < kNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) total[i][e] = split == 0 ? acc[i][e] : total[i][e] + acc[i][e];
    }
    // Straight from the fragments: for each (i, e), a warp writes 4 tokens × 8 consecutive rows.
    Out* out = static_cast<Out*>(a.out) + tile.first * a.M + tile.row0 + warpgroup * 64 + 16 * warp + g;
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 8 * i + 2 * q + e % 2;
        if (t < tile.tokens) store1(out + t * a.M + e / 2 * 8, total[i][e]);
      }
  }
}

template <class Out>
auto prepared_kernel() {
  constexpr auto kernel = pipelined_kernel<Out>;
  allow_dynamic_smem<kernel>(kSmem);
  return kernel;
}

// cuTensorMapEncodeTiled, from the driver through the runtime (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    LOCKSTEP_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    LOCKSTEP_CHECK(found == cudaDriverEntryPointSuccess && f != nullptr,
                   "fp8 pipelined GEMM: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The TMA map of e4m3 rows [rows, K] (K bytes a row), read in 128-row × 128-byte boxes,
// 128-byte swizzled; rows past the end read as zeros.
CUtensorMap rows_map(const void* data, int64_t rows, int64_t K) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)}, strides[1] = {cuuint64_t(K)};
  const cuuint32_t box[2] = {kBlockK, 128}, element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims, strides, box,
                                    element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LOCKSTEP_CHECK(r == CUDA_SUCCESS, "fp8 pipelined GEMM: cuTensorMapEncodeTiled failed (", int(r), ") for [", rows,
                 ", ", K, "] e4m3 at ", data);
  return map;
}

}  // namespace

bool fp8_pipelined_pays(int64_t T, int64_t M) {
  return T >= kFp8PipelinedMinTokens && M % kRows == 0 &&
         M / kRows * ((T + kTokens - 1) / kTokens) >= device_sm_count();
}

void gemm_fp8_pipelined(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  const int64_t T = act.rows(), K = act.cols(), M = weight.rows();
  LOCKSTEP_CHECK(T >= 1 && T <= INT32_MAX && M <= INT32_MAX,
                 "fp8 pipelined GEMM: 1 .. 2^31 − 1 tokens and weight rows (TMA coordinates), got ", T, " and ", M);
  LOCKSTEP_CHECK(((out.dtype() == DType::f32 || out.dtype() == DType::bf16) && out.shape() == Shape{T, M}),
                 "fp8 pipelined GEMM: the output must be f32 or bf16 [", T, ", ", M, "], got ", out.describe());
  LOCKSTEP_CHECK(M % kRows == 0, "fp8 pipelined GEMM: the weight's rows must be a multiple of ", kRows, ", got ",
                 weight.data.describe());
  LOCKSTEP_CHECK(K % kBlockK == 0 && weight.cols() == K, "fp8 pipelined GEMM: act ", act.data.describe(),
                 " and weight ", weight.data.describe(), " must have the same K, a multiple of ", kBlockK);
  for (const void* p : {out.data(), act.data.data(), weight.data.data()})
    LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "fp8 pipelined GEMM: out ", out.describe(), ", act ",
                   act.data.describe(), " and weight ", weight.data.describe(), " must be 16-byte aligned");
  const Args a{act.scales.data_as<float>(), weight.scales.data_as<float>(), out.data(), T, M, K,
               weight.scales.dim(1), fp8_batch_invariant_splits(M, K)};
  const CUtensorMap weight_map = rows_map(weight.data.data(), M, K), act_map = rows_map(act.data.data(), T, K);
  const int64_t tiles = M / kRows * ((T + kTokens - 1) / kTokens);
  const int64_t ctas = std::min<int64_t>(tiles, device_sm_count());  // one an SM (its shared memory)
  LaunchConfig launch{dim3(unsigned(ctas)), dim3(kThreads), size_t(kSmem)};
  launch.early_start_in_scope();
  if (out.dtype() == DType::f32) return launch.run(prepared_kernel<float>(), weight_map, act_map, a);
  launch.run(prepared_kernel<uint16_t>(), weight_map, act_map, a);
}

}  // namespace lockstep::cuda
