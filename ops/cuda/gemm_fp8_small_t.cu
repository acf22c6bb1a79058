// ops/cuda/gemm_fp8_small_t.cu — ops/cuda/gemm_fp8_small_t.h: the fp8 GEMM at decode token counts,
// which is weight-bandwidth bound: the kernel streams the weight once, 16-byte copies, several K
// blocks in flight per CTA.
//
// Work: a CTA (4 warps) owns one 128-row block of the weight (one row of 128×128 scale blocks, so
// the weight scale is one number per K block) and a contiguous range of its K blocks. The K range
// is split `splits` ways (1, 2, 4 or 8, from the shape alone: enough CTAs for the SMs); the CTAs
// of one row block form a thread-block cluster and add their fp32 partial tiles through
// distributed shared memory in rank order (deterministic, no workspace, one kernel).
//
// Pipeline: each K block's weight tile (128 rows × 128 bytes), act tile (8·NT tokens × 128 bytes,
// tokens ≥ T zero-filled) and scales go global → shared by cp.async, kStages deep. A warp owns 32
// weight rows (two m16 tiles) and all 8·NT tokens (NT n8 tiles). Per K block and tile, 8 chained
// mma.sync.m16n8k16 (weight = A, act = B) sum the block into a fresh fp32 partial, which is then
// multiplied by sx[t]·sw and added to the accumulator: the CPU reference's order of operations.
//
// Why f16 MMAs: Hopper has no fp8 mma.sync (ptxas turns mma.m16n8k32.e4m3 into two f16 MMAs from
// zero plus four FADDs); e4m3 widens to f16 exactly (cvt.f16x2.e4m3x2), so we widen and chain.
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16", f16): lane l, g = l/4, q = l%4.
// A: a0 = row g, k 2q, 2q+1; a1 = row g+8, same k; a2 = row g, k 2q+8, 2q+9; a3 = row g+8, same.
// B: b0 = k 2q, 2q+1 of column g; b1 = k 2q+8, 2q+9. C: c0, c1 = row g, columns 2q, 2q+1; c2, c3 =
// row g+8. A sum over k does not care which physical k sits at which MMA position as long as A
// and B agree, so lane q reads two 16-byte chunks of each of its rows — bytes [16q, 16q+16) and
// [64+16q, 64+16q+16) of the 128-byte K block — and each 4-byte word of them feeds one MMA: its
// bytes 0, 1 (widened) as a0 / a1 / b0, bytes 2, 3 as a2 / a3 / b1. The weight and act words of
// one MMA hold the same 16 k, and the 8 MMAs of a block cover its 128 k once.
//
// Shared tiles are rows of eight 16-byte chunks; chunk c of row r sits at c ^ 4(r%2), so the 8
// lanes of a quarter-warp (rows g, g+1 × chunks q) hit 32 distinct banks.
#include "ops/cuda/gemm_fp8_small_t.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/cuda/vector.cuh"
#include "ops/gemm_backends.h"

namespace lockstep::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;     // 4 warps
constexpr int kRows = 128;        // weight rows of a CTA: one row of scale blocks
constexpr int kWarpRows = 32;     // two m16 tiles a warp
constexpr int kBlockK = 128;      // bytes of a K block (e4m3)
constexpr int kMaxSplits = 8;     // the portable cluster size
constexpr int kMaxTokens = 64;    // NT = 8
constexpr int kStages = 4;
static_assert(kRows == (kThreads / 32) * kWarpRows);

constexpr int round_up_int(int x, int m) { return (x + m - 1) / m * m; }

template <int NT>
struct Layout {
  static constexpr int kTokens = 8 * NT;
  static constexpr int kActOffset = kRows * kBlockK;
  static constexpr int kActScaleOffset = kActOffset + kTokens * kBlockK;
  static constexpr int kWeightScaleOffset = kActScaleOffset + kTokens * 4;
  static constexpr int kStageBytes = round_up_int(kWeightScaleOffset + 16, 128);
  // After the main loop the stages hold the CTA's partial tile, token-major, rows padded to
  // kRedStride floats so the fragment stores hit distinct banks.
  static constexpr int kRedStride = kRows + 4;
  static constexpr int kSmem = std::max(kStages * kStageBytes, kTokens * kRedStride * 4);
  static_assert(2 * (kSmem + 1024) <= 228 * 1024, "two CTAs an SM");
};

struct Args {
  const uint8_t* act;           // e4m3 [T, K]
  const float* act_scales;      // [K/128, T]
  const uint8_t* weight;        // e4m3 [M, K]
  const float* weight_scales;   // [M/128, ld_weight_scales]
  void* out;                    // [T, M]
  int64_t T, M, K, ld_weight_scales;
};

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
// 16 (4) bytes global -> shared, asynchronously; zeros (and no read) when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// d += a · b: 16×16 f16 · 16×8 f16, fp32 accumulate.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four e4m3 (bytes 0..3 of v) as two f16 pairs (exact: f16 holds every e4m3 value): bytes 0, 1 in
// lo (byte 0 in the low half), bytes 2, 3 in hi.
struct F16x4 {
  uint32_t lo, hi;
};
__device__ __forceinline__ F16x4 to_f16(uint32_t v) {
  F16x4 r;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(r.lo), "=r"(r.hi)
      : "r"(v));
  return r;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Cluster barriers: the first publishes this CTA's shared-memory writes to the cluster (release /
// acquire); the second only keeps every CTA's shared memory alive until the others have read it.
__device__ __forceinline__ void cluster_sync_publish() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// Byte offset of 16-byte chunk c of row r in a swizzled tile of 128-byte rows.
__device__ __forceinline__ int chunk_offset(int r, int c) { return r * kBlockK + ((c ^ (r & 1) * 4) << 4); }

// Where this thread's cp.async copies come from and go to: chunk tid % 8 of weight rows tid/8 + 16j
// and of act rows (tokens) tid/8 + 16j, so that eight consecutive threads copy one row's 128
// bytes (one cache line). Pointers at K block 0, advanced by kBlockK a block: kept this small so
// the copies cost few registers next to the accumulators.
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

// Issues the cp.async copies of K block kb into stage `s` (one commit group, committed by the caller).
template <int NT>
__device__ __forceinline__ void load_stage(uint8_t* s, const Copier& cp, const Args& a, int64_t row0, int kb) {
  using L = Layout<NT>;
  const int tid = threadIdx.x;
  const uint8_t* w = cp.weight + kb * kBlockK;
#pragma unroll
  for (int j = 0; j < kRows / 16; ++j, w += cp.stride) cp_async16(s + cp.dst + j * 16 * kBlockK, w, true);
  const uint8_t* x = cp.act + kb * kBlockK;
#pragma unroll
  for (int j = 0; j < (L::kTokens + 15) / 16; ++j, x += cp.stride) {
    const int t = cp.token + 16 * j;
    if (t < L::kTokens) cp_async16(s + L::kActOffset + cp.dst + j * 16 * kBlockK, t < a.T ? x : a.act, t < a.T);
  }
  if (tid < L::kTokens)
    cp_async4(s + L::kActScaleOffset + tid * 4, tid < a.T ? cp.act_scale + kb * a.T : a.act_scales, tid < a.T);
  if (tid == 0)
    cp_async4(s + L::kWeightScaleOffset, a.weight_scales + row0 / kRows * a.ld_weight_scales + kb, true);
}

// acc[m][n] += (Σ over the K block of the warp's rows m × tokens n) · sx[t] · sw, from stage `s`:
// per (m, n) tile 8 chained m16n8k16 MMAs into a fresh fp32 partial, then one scaled add. The 2·NT
// tiles' MMAs are independent of each other, which hides their latency.
template <int NT>
__device__ __forceinline__ void mma_stage(const uint8_t* s, float (&acc)[2][NT][4], int warp, int g, int q) {
  using L = Layout<NT>;
  float p[2][NT][4] = {};
#pragma unroll
  for (int c = 0; c < 2; ++c) {  // chunk q + 4c of each row
    F16x4 w[2][2][4];            // [m tile][row g, g + 8][word]
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 v = *reinterpret_cast<const uint4*>(s + chunk_offset(warp * kWarpRows + m * 16 + h * 8 + g, q + 4 * c));
#pragma unroll
        for (int i = 0; i < 4; ++i) w[m][h][i] = to_f16(word(v, i));
      }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const uint4 v = *reinterpret_cast<const uint4*>(s + L::kActOffset + chunk_offset(8 * n + g, q + 4 * c));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const F16x4 x = to_f16(word(v, i));
#pragma unroll
        for (int m = 0; m < 2; ++m)
          mma_f16(p[m][n], w[m][0][i].lo, w[m][1][i].lo, w[m][0][i].hi, w[m][1][i].hi, x.lo, x.hi);
      }
    }
  }
  const float sw = *reinterpret_cast<const float*>(s + L::kWeightScaleOffset);
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float2 sx = *reinterpret_cast<const float2*>(s + L::kActScaleOffset + (8 * n + 2 * q) * 4);
    const float s0 = sx.x * sw, s1 = sx.y * sw;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      float* a = acc[m][n];
      a[0] = fmaf(p[m][n][0], s0, a[0]);
      a[1] = fmaf(p[m][n][1], s1, a[1]);
      a[2] = fmaf(p[m][n][2], s0, a[2]);
      a[3] = fmaf(p[m][n][3], s1, a[3]);
    }
  }
}

__device__ __forceinline__ void store4(float* out, const float4& v) { *reinterpret_cast<float4*>(out) = v; }
__device__ __forceinline__ void store4(uint16_t* out, const float4& v) {
  *reinterpret_cast<uint2*>(out) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

// Grid (splits, M/128), clusters of (splits, 1, 1): blockIdx.x is the rank in the cluster.
template <int NT, class Out>
__global__ void __launch_bounds__(kThreads) small_t_kernel(const Args a) {
  using L = Layout<NT>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, g = tid % 32 / 4, q = tid % 4;
  const int split = blockIdx.x, splits = gridDim.x;
  const int64_t row0 = int64_t(blockIdx.y) * kRows;
  const int kblocks = int(a.K / kBlockK), kb0 = split * kblocks / splits;
  const int count = (split + 1) * kblocks / splits - kb0;

  const Copier cp = copier(a, row0);
  float acc[2][NT][4] = {};
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < count) load_stage<NT>(smem + i * L::kStageBytes, cp, a, row0, kb0 + i);
    cp_async_commit();
  }
  for (int i = 0; i < count; ++i) {
    cp_async_wait<kStages - 2>();  // K block i has landed (this thread's copies) ...
    __syncthreads();               // ... everyone's; and everyone is done with block i - 1
    const int next = i + kStages - 1;  // into the stage block i - 1 used
    if (next < count) load_stage<NT>(smem + next % kStages * L::kStageBytes, cp, a, row0, kb0 + next);
    cp_async_commit();
    mma_stage<NT>(smem + i % kStages * L::kStageBytes, acc, warp, g, q);
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages become the partial tile

  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        red[(8 * n + 2 * q + e % 2) * L::kRedStride + warp * kWarpRows + m * 16 + g + e / 2 * 8] = acc[m][n][e];
  cluster_sync_publish();  // every partial tile of the cluster written
  const cg::cluster_group cluster = cg::this_cluster();

  // This CTA's share of the output: rows [split, split + 1) · 128/splits of every token, summed
  // over the cluster's partial tiles in rank order, 4 rows at a time.
  const int rows = kRows / splits, quads = rows / 4;
  Out* out = static_cast<Out*>(a.out);
  for (int i = tid; i < a.T * quads; i += kThreads) {
    const int t = i / quads, r = split * rows + i % quads * 4;
    float4 sum = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, 0) + t * L::kRedStride + r);
    for (int rank = 1; rank < splits; ++rank) {
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, rank) + t * L::kRedStride + r);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    store4(out + t * a.M + row0 + r, sum);
  }
  cluster_sync_relaxed();  // no CTA leaves (freeing its shared memory) while another still reads it
}

int sm_count() {
  static const int sms = [] {
    int device = 0, n = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
    LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return sms;
}

// K splits: doubled until the CTAs fill every SM twice (two CTAs fit an SM), a split keeps at
// least one K block, or the cluster is full. A function of the shape alone, never of T, so that a
// token's sum is the same at every batch size.
int splits_for(int64_t M, int64_t K) {
  const int64_t row_blocks = M / kRows, kblocks = K / kBlockK;
  int splits = 1;
  while (splits < kMaxSplits && row_blocks * splits < 2 * sm_count() && 2 * splits <= kblocks) splits *= 2;
  return splits;
}

template <int NT, class Out>
void launch(const Args& a, int splits) {
  constexpr auto kernel = small_t_kernel<NT, Out>;
  static const bool prepared = [] {
    LOCKSTEP_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<NT>::kSmem));
    return true;
  }();
  (void)prepared;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = unsigned(splits);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(splits), unsigned(a.M / kRows));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = Layout<NT>::kSmem;
  config.stream = current_stream();
  config.attrs = &cluster;
  config.numAttrs = 1;
  LOCKSTEP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a));
}

template <class Out>
void launch_for_tokens(const Args& a, int splits) {
  if (a.T <= 8) return launch<1, Out>(a, splits);
  if (a.T <= 16) return launch<2, Out>(a, splits);
  if (a.T <= 32) return launch<4, Out>(a, splits);
  launch<8, Out>(a, splits);
}

// The token limit: LOCKSTEP_FP8_SMALL_T (0 .. 64, 0 = cuBLASLt always) or 64, until
// gemm_set_fp8_small_t changes it.
std::atomic<int>& max_tokens() {
  static std::atomic<int> limit = [] {
    const char* env = std::getenv("LOCKSTEP_FP8_SMALL_T");
    if (!env) return kMaxTokens;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    LOCKSTEP_CHECK(*env && !*end && v >= 0 && v <= kMaxTokens, "LOCKSTEP_FP8_SMALL_T: expected a token count from 0 "
                   "(always cuBLASLt) to ", kMaxTokens, ", got '", env, "'");
    return int(v);
  }();
  return limit;
}

}  // namespace

int gemm_set_fp8_small_t(int tokens) {
  LOCKSTEP_CHECK(tokens >= 0 && tokens <= kMaxTokens, "gemm_set_fp8_small_t: expected 0 .. ", kMaxTokens,
                 " tokens, got ", tokens);
  return max_tokens().exchange(tokens);
}

bool fp8_small_t_takes(int64_t tokens) { return tokens >= 1 && tokens <= max_tokens().load(); }

void gemm_fp8_small_t(Tensor& out, const Fp8Rows& act, const Fp8Blocks& weight) {
  const int64_t T = act.rows(), K = act.cols(), M = weight.rows();
  LOCKSTEP_CHECK(T >= 1 && T <= kMaxTokens, "fp8 small-T GEMM: 1 .. ", kMaxTokens, " tokens, got ", T);
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(out.data()) % 16 == 0,
                 "fp8 small-T GEMM: the output must be 16-byte aligned, got ", out.describe(), " at ", out.data());
  LOCKSTEP_CHECK(M / kRows <= 65535, "fp8 small-T GEMM: at most 65535 row blocks, got ", weight.data.describe());
  const Args a{static_cast<const uint8_t*>(act.data.data()), act.scales.data_as<float>(),
               static_cast<const uint8_t*>(weight.data.data()), weight.scales.data_as<float>(), out.data(),
               T, M, K, weight.scales.dim(1)};
  const int splits = splits_for(M, K);
  if (out.dtype() == DType::f32) return launch_for_tokens<float>(a, splits);
  launch_for_tokens<uint16_t>(a, splits);
}

}  // namespace lockstep::cuda
