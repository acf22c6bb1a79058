// ops/cuda/attention.cu — ops/attention.h on CUDA: bf16 tensors, head_dim 64 or 128, fp32 softmax
// and accumulation, bf16 tensor cores (mma.sync m16n8k16). Nothing of size [T, T] is materialized.
//
// Kernels:
//   fwd_kernel     FlashAttention-2 forward: a CTA of 4 warps takes 64 query rows of one q head (16
//                  a warp, the queries held in registers) and streams 64-key K/V tiles through
//                  double-buffered shared memory with an online softmax. It serves the training
//                  forward (keys from the packed qkv rows) and the paged path's multi-row sequences
//                  (prefill chunks; keys through the block table).
//   decode_kernel  flash-decoding for the paged path's one-row sequences: a CTA takes one
//                  partition of a sequence's context for all q heads of one kv head (the group's
//                  heads are the rows of a 16-row MMA tile, so each K/V byte is read once per
//                  group), its 4 warps splitting every 64-key tile. Long contexts are split into
//                  up to 8 partitions, the CTAs of one thread-block cluster, enough to fill the
//                  GPU; the cluster's first CTA merges their results through distributed shared
//                  memory (no second kernel: it was one more launch a layer in every decode step).
//                  From an e4m3 cache (ops/kv_fp8.h) its tiles arrive as bytes and each warp reads
//                  its MMA fragments from them, converted to f16 in registers (one instruction a
//                  pair, exact): f16 MMAs, the queries scaled by a power of two into f16's range, the
//                  scales applied to the scores and probabilities in fp32. The prefill kernel
//                  dequantizes on load instead.
//   bwd_kernel     FlashAttention-2 backward: bwd_prep_kernel computes Dᵢ = rowsum(dO ∘ O) and
//                  zeroes an f32 dQ accumulator; a bwd_kernel CTA takes 64 keys of one kv head (16 a
//                  warp, dK and dV in registers) and loops over the group's q heads and the 32-row
//                  query tiles at or after its keys, adding each tile's dQ into the accumulator with
//                  f32 atomics; bwd_dq_kernel rounds the accumulator into dqkv. dK and dV are
//                  deterministic; dQ is not (the order of the atomic adds varies from run to run,
//                  which changes the last bits). A deterministic dQ needs a second pass recomputing
//                  P and dP per query tile: 7 instead of 5 matrix products.
//   kv_cache_write_kernel  16-byte copies of each row's k and v heads to its slot (into an e4m3
//                  cache: kv_cache_write_fp8_kernel, a warp a head, quantized).
//
// Layout rules, written once (PTX ISA, "Matrix fragments for mma.m16n8k16"): lane l of a warp
// holds rows l/4 and l/4 + 8 and columns 2·(l%4), 2·(l%4) + 1 of a 16×8 f32 C fragment; a 16×16
// A fragment is 4 registers of bf16 pairs (rows l/4, l/4 + 8 × k 2·(l%4), +8); a 16×8 B fragment
// is 2 (k 2·(l%4), +8 × column l/4). Hence:
// - The C fragments of scores over two adjacent 8-key blocks are exactly the A fragment of their
//   probabilities over 16 keys: P goes from the softmax to the next MMA in registers.
// - ldmatrix (without .trans) of row-major K rows gives the B fragments of S = Q·Kᵀ, and with
//   .trans the B fragments of O += P·V from row-major V rows (likewise Q, dO, dS in the backward).
// - Shared tiles are rows of 16-byte chunks; chunk c of row r is stored at chunk c ^ (r % 8)
//   (c ^ (r/2 % 4) for 4-chunk rows), so the 8 rows an ldmatrix reads hit distinct banks.
//
// Index tensors (cu_seqlens, context lengths, block tables, slots) are read only on the device,
// and no read or write ever leaves a tensor on bad values: a malformed cu_seqlens (not from 0 to
// T, or decreasing) turns every output row into NaN, a context length or block id out of range
// turns that sequence's rows into NaN, and a kv_cache_write row with a slot out of range is not
// written.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cp_async.cuh"
#include "core/cuda_check.h"
#include "core/cuda_launch.h"
#include "core/cuda_stream.h"
#include "core/dependent_launch.cuh"
#include "core/device.h"
#include "numerics/cuda/quantize_device.cuh"
#include "ops/attention_backends.h"
#include "ops/cuda/kv_fp8.cuh"

namespace lockstep::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;  // 4 warps in every attention kernel
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 64;  // query rows of a forward CTA, keys of a backward CTA, keys a K/V tile
constexpr int kBwdRows = 32;   // query rows a backward step
constexpr int kGroupRows = 16; // q heads a decode CTA serves: the rows of one MMA tile
// K/V tiles in a decode CTA's ring: one in flight while one is used, and three CTAs an SM
// (kDecodeCtasPerSm: 70 KB of shared memory and ≤ 168 registers each). Measured at batch 64
// (bench_rollout, H200, 2026-11-21): 2 stages × 3 CTAs 7425 tokens/s in bf16 against 7203 for
// 3 stages × 2 CTAs — more warps to hide the latency of the MMA and softmax chains.
constexpr int kDecodeStages = 2;
constexpr int kDecodeCtasPerSm = 3;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr uint16_t kBf16NaN = 0x7fc0;

// ---- primitives ------------------------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// d += a · b (16×16 bf16 · 16×8 bf16, fp32 accumulate).
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same in f16 (the decode kernel's e4m3 cache path: e4m3 converts to f16 in one instruction).
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (nearest even), the first in the low half: one fragment register.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// 2^x (ex2.approx: relative error ~2^-22; 2^-inf = 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Element offset of chunk c (8 bf16) of row r in a swizzled tile of rows of kChunks chunks.
template <int kChunks>
__device__ __forceinline__ int swizzle(int r, int c) {
  static_assert(kChunks == 4 || kChunks == 8 || kChunks == 16);
  if constexpr (kChunks == 4) return (r * 4 + (c ^ (r / 2 % 4))) * 8;  // two rows per 128 bytes
  else return (r * kChunks + (c ^ (r % 8))) * 8;
}

// Rows 0 .. kRows−1 of a tile of D columns, row r from src(r) (a pointer to its first element, or
// nullptr for a row of zeros), issued as cp.async by the whole CTA; `fallback` is any readable
// address (a zero-filled copy reads nothing, but still names one).
template <int D, int kRows, class Src>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* fallback, Src src) {
  constexpr int kChunks = D / 8;
  static_assert(kRows * kChunks % kThreads == 0);
#pragma unroll
  for (int j = 0; j < kRows * kChunks / kThreads; ++j) {
    const int i = threadIdx.x + j * kThreads, r = i / kChunks, c = i % kChunks;
    const uint16_t* row = src(r);
    cp_async16(tile + swizzle<kChunks>(r, c), row ? row + c * 8 : fallback, row != nullptr);
  }
}

// The A fragment of rows row0 .. row0+15, columns 16·kk .. 16·kk+15 of a tile of D columns.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* tile, int row0, int kk) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, tile + swizzle<D / 8>(row0 + lane % 8 + lane / 8 % 2 * 8, 2 * kk + lane / 16));
}

// s (16 rows × kKeys) = A · (rows key0 .. key0+kKeys−1 of tile)ᵀ, A (16 × D) given by a(kk, frag)
// one 16-column step at a time: scores of queries against keys (or keys against queries).
template <int D, int kKeys, class AFragment>
__device__ __forceinline__ void multiply_transposed(float (&s)[kKeys / 8][4], AFragment a, const uint16_t* tile,
                                                    int key0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nb = 0; nb < kKeys / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t af[4];
    a(kk, af);
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      uint32_t b[4];  // keys 16·np .. +7 and +8 .. +15, columns 16·kk .. +15
      ldmatrix_x4(b, tile + swizzle<D / 8>(key0 + np * 16 + lane % 8 + lane / 16 * 8, 2 * kk + lane / 8 % 2));
      mma(s[2 * np], af, b[0], b[1]);
      mma(s[2 * np + 1], af, b[2], b[3]);
    }
  }
}

// A fragments held in registers (the queries of a forward warp), for multiply_transposed.
template <int D>
struct HeldA {
  uint32_t f[D / 16][4];
  __device__ __forceinline__ void load(const uint16_t* tile, int row0) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_a<D>(f[kk], tile, row0, kk);
  }
  __device__ __forceinline__ void operator()(int kk, uint32_t (&a)[4]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = f[kk][i];
  }
};

// o (16 rows × kCols) += p · (rows key0 .. key0+16·kSteps−1, columns col0 .. col0+kCols−1 of tile):
// probabilities times values. kChunks: the tile's row length in chunks.
template <int kChunks, int kSteps, int kCols>
__device__ __forceinline__ void multiply_accumulate(float (&o)[kCols / 8][4], const uint32_t (&p)[kSteps][4],
                                                    const uint16_t* tile, int key0, int col0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
    for (int dp = 0; dp < kCols / 16; ++dp) {
      uint32_t b[4];  // keys 16·kk .. +15, columns 16·dp .. +7 and +8 .. +15
      ldmatrix_x4_trans(b, tile + swizzle<kChunks>(key0 + kk * 16 + lane % 8 + lane / 8 % 2 * 8,
                                                   col0 / 8 + 2 * dp + lane / 16));
      mma(o[2 * dp], p[kk], b[0], b[1]);
      mma(o[2 * dp + 1], p[kk], b[2], b[3]);
    }
}

// The C fragments of 16 rows × 16·kSteps columns as bf16 (or f16) A fragments (the FA2 register
// reuse).
template <int kSteps, bool kF16 = false>
__device__ __forceinline__ void to_a_fragments(uint32_t (&a)[kSteps][4], const float (&c)[2 * kSteps][4]) {
  const auto pack = [](float lo, float hi) { return kF16 ? pack_f16(lo, hi) : pack_bf16(lo, hi); };
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    a[kk][0] = pack(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

// Online softmax of a warp's 16 rows (this lane's rows l/4 and l/4 + 8) in the log2 domain:
// x = score · scale · log2(e), m = max x so far, l = Σ 2^(x − m) over this lane's columns (the 4
// lanes of a row are summed once, at the end).
struct OnlineSoftmax {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  // Turns the scores s (masked ones −inf) into probabilities 2^(x − m) in place and rescales o,
  // the running Σ p·v, to the new maxima.
  template <int kKeys, int kCols>
  __device__ __forceinline__ void update(float (&s)[kKeys / 8][4], float (&o)[kCols / 8][4], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx * scale_log2);
      // A row that has seen no key yet (possible in a decode warp's slice) keeps p = 0, not NaN.
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2_approx(m[r] - base);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nb][2 * r + e];
          x = exp2_approx(fmaf(x, scale_log2, -base));
          sum += x;
        }
      l[r] = fmaf(l[r], alpha, sum);
#pragma unroll
      for (int nb = 0; nb < kCols / 8; ++nb) {
        o[nb][2 * r] *= alpha;
        o[nb][2 * r + 1] *= alpha;
      }
    }
  }

  // Sums l over the 4 lanes of each row.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
  }
};

// ---- packed sequences ------------------------------------------------------------------------

// Where tile `index` of the packed sequences lies. Tiles are numbered sequence by sequence, a
// sequence of n ≥ min_rows rows having ceil(n / kRows) of them (fewer rows: none); with kReverse
// they run from the sequence's last tile to its first (causal: the tiles with the most keys first).
struct TileSpot {
  int seq = -1;  // −1: there is no tile `index`
  int start = 0, rows = 0, tile = 0;
  bool valid = true;  // cu_seqlens runs from 0 to T without decreasing
};

// Every warp scans cu_seqlens on its own (S is small: a few to a few hundred sequences), checking
// all of it, so every CTA knows whether it is well formed.
template <int kRows, bool kReverse>
__device__ TileSpot locate_tile(const int32_t* cu, int S, int T, int index, int min_rows) {
  const int lane = threadIdx.x % 32;
  TileSpot spot;
  spot.valid = cu[0] == 0 && cu[S] == T;
  int before = 0;  // tiles of the sequences already scanned
  for (int base = 0; base < S; base += 32) {
    const int s = base + lane;
    const int a = s < S ? cu[s] : 0, b = s < S ? cu[s + 1] : 0;
    const bool ok = 0 <= a && a <= b && b <= T;
    spot.valid &= bool(__all_sync(0xffffffffu, ok));
    const int rows = ok ? b - a : 0;
    const int tiles = rows >= min_rows ? (rows + kRows - 1) / kRows : 0;
    int last = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, last, o);
      if (lane >= o) last += v;
    }
    const int first = before + last - tiles;
    const unsigned hit = __ballot_sync(0xffffffffu, index >= first && index < before + last);
    if (hit) {
      const int src = __ffs(hit) - 1;
      spot.seq = __shfl_sync(0xffffffffu, s, src);
      spot.start = __shfl_sync(0xffffffffu, a, src);
      spot.rows = __shfl_sync(0xffffffffu, rows, src);
      const int j = index - __shfl_sync(0xffffffffu, first, src);
      spot.tile = kReverse ? __shfl_sync(0xffffffffu, tiles, src) - 1 - j : j;
    }
    before += __shfl_sync(0xffffffffu, last, 31);
  }
  return spot;
}

// Rows blockIdx.x, + gridDim.x, ... < T of a [T, ld] tensor, columns col0 .. col0+cols−1, set to
// NaN: every CTA's share when cu_seqlens is malformed.
template <class Element>
__device__ void nan_rows(Element* x, int64_t ld, int64_t col0, int64_t cols, int T) {
  Element nan;
  if constexpr (sizeof(Element) == 2) nan = kBf16NaN;
  else nan = __int_as_float(0x7fc00000);
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x)
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) x[t * ld + col0 + c] = nan;
}

// ---- forward -----------------------------------------------------------------------------------

struct FwdArgs {
  const uint16_t* qkv;
  uint16_t* out;
  float* lse;          // [T, q_heads]; nullptr on the paged path
  const int32_t* cu;   // [S + 1]
  int S, T, q_heads, kv_heads, group;
  int64_t qkv_width, out_width;
  float scale_log2;
  int max_keys;  // keys a sequence may have: T (packed), max_blocks · block_size (paged)
  // The paged path's cache:
  const uint16_t* k_cache;
  const uint16_t* v_cache;
  const int32_t* block_tables;  // [S, max_blocks]
  const int32_t* context_lens;  // [S]
  int max_blocks, block_size, num_blocks;
  int64_t kv_width;
  int min_rows;  // the fewest rows of a sequence this kernel takes (paged: 2; one-row sequences
                 // are the decode kernels')
};

// Keys 0 .. count−1 of one kv head; offset(p) is the element offset of key p's row (the same for
// its k and its v), or −1 for a block id outside the cache (which sets `bad`).
struct PackedKeys {
  int64_t row0, ld;
  int count;
  __device__ int64_t offset(int p, bool&) const { return (row0 + p) * ld; }
};
struct PagedKeys {
  const int32_t* table;  // this sequence's row of block_tables
  int count, block_size, num_blocks;
  int64_t ld;  // kv_heads · head_dim
  __device__ int64_t offset(int p, bool& bad) const {
    const int32_t block = table[p / block_size];
    if (block < 0 || block >= num_blocks) {
      bad = true;
      return -1;
    }
    return (int64_t(block) * block_size + p % block_size) * ld;
  }
};

// Keys p0 .. p0+63 into the k and v tiles (zeros past the keys' count); k and v point at the kv
// head's first column.
template <int D, class Keys>
__device__ __forceinline__ void load_keys(uint16_t* sk, uint16_t* sv, const uint16_t* k, const uint16_t* v,
                                          const Keys& keys, int p0, bool& bad) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int j = 0; j < kTileRows * kChunks / kThreads; ++j) {
    const int i = threadIdx.x + j * kThreads, r = i / kChunks, c = i % kChunks, p = p0 + r;
    const int64_t offset = p < keys.count ? keys.offset(p, bad) : -1;
    cp_async16(sk + swizzle<kChunks>(r, c), offset >= 0 ? k + offset + c * 8 : k, offset >= 0);
    cp_async16(sv + swizzle<kChunks>(r, c), offset >= 0 ? v + offset + c * 8 : v, offset >= 0);
  }
}

// An e4m3 cache's scales (ops/attention.h: f32 [num_blocks, block_size, kv_heads]); a kernel
// parameter of its own, so that the bf16 kernels' arguments stay as they were.
struct CacheScales {
  const float* k;
  const float* v;
};

// load_keys from an e4m3 cache: keys p0 .. p0+63 dequantized (ops/kv_fp8.h: the bf16 values the
// training forward holds) into the k and v tiles with plain loads and stores, not cp.async (prefill
// chunks only, where this is not the time that matters); k and v point at the kv head's first byte
// (its scales at ks[offset / D] and vs[offset / D] for a key row at element offset `offset`).
template <int D, class Keys>
__device__ __forceinline__ void load_keys_fp8(uint16_t* sk, uint16_t* sv, const uint8_t* k, const uint8_t* v,
                                              const float* ks, const float* vs, const Keys& keys, int p0, bool& bad) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int j = 0; j < kTileRows * kChunks / kThreads; ++j) {
    const int i = threadIdx.x + j * kThreads, r = i / kChunks, c = i % kChunks, p = p0 + r;
    const int64_t offset = p < keys.count ? keys.offset(p, bad) : -1;
    uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
    if (offset >= 0) {
      kx = kv_fp8::dequantize8(*reinterpret_cast<const uint2*>(k + offset + c * 8), ks[offset / D]);
      vx = kv_fp8::dequantize8(*reinterpret_cast<const uint2*>(v + offset + c * 8), vs[offset / D]);
    }
    *reinterpret_cast<uint4*>(sk + swizzle<kChunks>(r, c)) = kx;
    *reinterpret_cast<uint4*>(sv + swizzle<kChunks>(r, c)) = vx;
  }
}

// One CTA per (64-row query tile, q head) item; on the paged path a CTA loops over items, since the
// grid is sized without knowing how many rows belong to multi-row sequences. kFp8Cache: the paged
// path's cache is e4m3 with scales cs.
template <int D, bool kPaged, bool kFp8Cache = false>
__global__ void __launch_bounds__(kThreads) fwd_kernel(const FwdArgs a, const CacheScales cs) {
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sq = smem;                          // [64, D] queries, then the output tile
  uint16_t* sk = sq + kTileRows * D;            // [2][64, D]
  uint16_t* sv = sk + 2 * kTileRows * D;        // [2][64, D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int item = blockIdx.x;; item += gridDim.x) {
    const TileSpot spot = locate_tile<kTileRows, true>(a.cu, a.S, a.T, item / a.q_heads, a.min_rows);
    if (!spot.valid) {
      nan_rows(a.out, a.out_width, 0, a.out_width, a.T);
      if (a.lse) nan_rows(a.lse, a.q_heads, 0, a.q_heads, a.T);
      return;
    }
    if (spot.seq < 0) return;
    const int h = item % a.q_heads, g = h / a.group, n = spot.rows, m0 = spot.tile * kTileRows;
    const uint16_t* q = a.qkv + int64_t(spot.start) * a.qkv_width + int64_t(h) * D;

    // The keys of the sequence's kv head g. Query row i sits at position keys.count − n + i (the
    // sequence's last positions) and attends keys 0 .. that position.
    const auto keys = [&] {
      if constexpr (kPaged)
        return PagedKeys{a.block_tables + int64_t(spot.seq) * a.max_blocks, a.context_lens[spot.seq],
                         a.block_size, a.num_blocks, a.kv_width};
      else return PackedKeys{spot.start, a.qkv_width, n};
    }();
    const uint16_t* k = kPaged ? a.k_cache + int64_t(g) * D : a.qkv + int64_t(a.q_heads + g) * D;
    const uint16_t* v = kPaged ? a.v_cache + int64_t(g) * D : a.qkv + int64_t(a.q_heads + a.kv_heads + g) * D;
    const int q_pos0 = keys.count - n;
    bool bad = keys.count < n || keys.count > a.max_keys;  // a context length out of range

    float o[D / 8][4] = {};
    OnlineSoftmax softmax;
    if (!bad) {
      const int q_first = q_pos0 + m0, q_last = q_pos0 + min(n, m0 + kTileRows) - 1;
      const int tiles = q_last / kTileRows + 1;
      auto load_stage = [&](int j) {
        if constexpr (kFp8Cache)
          load_keys_fp8<D>(sk + (j % 2) * kTileRows * D, sv + (j % 2) * kTileRows * D,
                           reinterpret_cast<const uint8_t*>(a.k_cache) + int64_t(g) * D,
                           reinterpret_cast<const uint8_t*>(a.v_cache) + int64_t(g) * D, cs.k + g, cs.v + g, keys,
                           j * kTileRows, bad);
        else
          load_keys<D>(sk + (j % 2) * kTileRows * D, sv + (j % 2) * kTileRows * D, k, v, keys, j * kTileRows, bad);
      };
      load_tile<D, kTileRows>(sq, q, [&](int r) {
        return m0 + r < n ? q + int64_t(m0 + r) * a.qkv_width : nullptr;
      });
      load_stage(0);
      cp_async_commit();
      HeldA<D> qa;
      for (int j = 0; j < tiles; ++j) {
        cp_async_wait<0>();
        __syncthreads();  // tile j visible to all; everyone is done with tile j − 1's buffers
        if (j + 1 < tiles) {
          load_stage(j + 1);
          cp_async_commit();
        }
        if (j == 0) qa.load(sq, warp * 16);
        float s[kTileRows / 8][4];
        multiply_transposed<D, kTileRows>(s, qa, sk + (j % 2) * kTileRows * D, 0);
        if (j * kTileRows + kTileRows - 1 > q_first) {  // keys past some query's position
#pragma unroll
          for (int nb = 0; nb < kTileRows / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = j * kTileRows + nb * 8 + lane % 4 * 2 + e % 2;
              const int pos = q_first + warp * 16 + lane / 4 + e / 2 * 8;
              if (key > pos) s[nb][e] = -INFINITY;
            }
        }
        softmax.update<kTileRows, D>(s, o, a.scale_log2);
        uint32_t p[kTileRows / 16][4];
        to_a_fragments<kTileRows / 16>(p, s);
        multiply_accumulate<kChunks, kTileRows / 16, D>(o, p, sv + (j % 2) * kTileRows * D, 0, 0);
      }
      softmax.finish();
    }
    bad = __syncthreads_or(bad);  // also: every warp is done with sq and the K/V buffers

    // The warp's 16 rows, normalized and rounded, through its rows of sq: 16-byte row stores.
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) inv[r] = bad ? __int_as_float(0x7fc00000) : 1.0f / softmax.l[r];
    const int r0 = warp * 16 + lane / 4;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      *reinterpret_cast<uint32_t*>(sq + swizzle<kChunks>(r0, nb) + lane % 4 * 2) =
          pack_bf16(o[nb][0] * inv[0], o[nb][1] * inv[0]);
      *reinterpret_cast<uint32_t*>(sq + swizzle<kChunks>(r0 + 8, nb) + lane % 4 * 2) =
          pack_bf16(o[nb][2] * inv[1], o[nb][3] * inv[1]);
    }
    __syncwarp();
#pragma unroll
    for (int i = lane; i < 16 * kChunks; i += 32) {
      const int r = i / kChunks, c = i % kChunks, row = m0 + warp * 16 + r;
      if (row < n)
        *reinterpret_cast<uint4*>(a.out + int64_t(spot.start + row) * a.out_width + int64_t(h) * D + c * 8) =
            *reinterpret_cast<const uint4*>(sq + swizzle<kChunks>(warp * 16 + r, c));
    }
    if (a.lse && lane % 4 == 0)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = m0 + r0 + r * 8;
        if (row < n)
          a.lse[int64_t(spot.start + row) * a.q_heads + h] =
              bad ? __int_as_float(0x7fc00000) : (softmax.m[r] + log2f(softmax.l[r])) * kLn2;
      }
    __syncthreads();  // sq is the next item's query tile
  }
}

// ---- decode (paged, one-row sequences) --------------------------------------------------------

struct DecodeArgs {
  const uint16_t* qkv;
  uint16_t* out;
  const uint16_t* k_cache;
  const uint16_t* v_cache;
  const int32_t* block_tables;
  const int32_t* context_lens;
  const int32_t* cu;
  int S, T, q_heads, kv_heads, group, max_blocks, block_size, num_blocks, max_parts;
  int block_shift;  // log2(block_size) when a power of two (a shift for a division), else −1
  int64_t qkv_width, out_width;
  float scale_log2;
  bool one_row_each;  // attention_paged's promise: T = S, sequence s owns row s
};

// Keys per partition of a context of len positions split into at most max_parts partitions:
// whole 64-key tiles, so that len / span ≤ max_parts.
__device__ __forceinline__ int decode_span(int len, int max_parts) {
  const int per = (len + max_parts - 1) / max_parts;
  return (per + kTileRows - 1) / kTileRows * kTileRows;
}

// The row of a one-row sequence s, or −1 (a multi-row sequence, or a malformed cu_seqlens whose
// rows fwd_kernel turns into NaN afterwards). Under one_row_each only row s is s's: a sequence
// with other offsets gets −1 and decode_kernel makes row s NaN (fwd_kernel does not run).
__device__ __forceinline__ int decode_row(const int32_t* cu, int s, int T, bool one_row_each) {
  const int a = cu[s], b = cu[s + 1];
  if (one_row_each) return a == s && b == s + 1 ? s : -1;
  return 0 <= a && a <= b && b <= T && b - a == 1 ? a : -1;
}

constexpr int kMaxDecodeParts = 8;  // the portable cluster size

// decode_kernel<D, true>'s output: the rows quantized rowwise as quantize_rows does (e4m3 q
// [T, out_width], scales s [out_width / 128, T], fp32 amax/448 or pow2), instead of a.out. A kernel
// parameter of its own: DecodeArgs grown by these fields changed how the bf16 kernel compiles
// (162 registers instead of 164, other SASS), which cost 1–2% at batch 64 (H200, 2026-11-22).
struct QuantizedOut {
  uint8_t* q;
  float* s;
  bool pow2;
};

// Rowwise 1×128 quantization of 8 output values (bf16 bits in w) at column col of row t
// (quant::quantize_vector_rows: the 16 lanes of a half-warp hold one group's 128 columns in order,
// and every lane of the warp calls it).
__device__ __forceinline__ void store_quantized(const DecodeArgs& a, const QuantizedOut& qo, int64_t t, int64_t col,
                                                const uint4& w) {
  quant::quantize_vector_rows(w, true, qo.q + t * a.out_width + col, qo.s + col / quant::kTile * a.T + t, qo.pow2);
}

// Row t's columns of kv head g (the group's q heads), quantized NaN: a malformed sequence's.
template <int D>
__device__ __forceinline__ void store_quantized_nan_row(const DecodeArgs& a, const QuantizedOut& qo, int64_t t,
                                                        int g) {
  const uint32_t nan2 = uint32_t(kBf16NaN) * 0x10001u;
  for (int i = threadIdx.x; i < a.group * D / 8; i += kThreads)  // whole warps: group · D / 8 % 32 == 0
    store_quantized(a, qo, t, int64_t(g) * a.group * D + i * 8, make_uint4(nan2, nan2, nan2, nan2));
}

// Two e4m3 (the low 16 bits of w) as an f16 pair: exact, one instruction (cvt.rn.f16x2.e4m3x2).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | uint32_t(h.y) << 16;
}

// The decode kernel's e4m3 path reads its MMA fragments straight from the staged bytes (no
// conversion pass through shared memory: that round trip cost ~30% of the kernel at batch 64).
// Staged K and V rows are D bytes of 16-byte chunks, swizzled as bf16 tiles are (chunk c of row r
// at c ^ (r % 8)), so both reads below hit distinct banks.
//
// Q·Kᵀ: within every 32 columns the head dimension is permuted, the same way for Q and K (a dot
// product does not care): lane (g, t) takes key g's bytes 8t .. 8t + 7 of the 32 (one 8-byte load),
// which are its B fragments of two k16 steps (bytes 0–3, then 4–7); the queries' A fragments are
// loaded with the same permutation (queries_f16).
//
// P·V: ldmatrix.trans of the e4m3 rows as 16-bit units (pairs of adjacent columns) gives lane (g, t)
// keys 2t and 2t + 1 of unit g: the bytes of column 2g (even) and 2g + 1 (odd) of both keys, which
// a byte permute splits into the B fragments of two MMAs, one for the even columns and one for the
// odd. So output block j = 4q + 2p + e (q: 32 columns, p: their 16-column half, e: even or odd)
// holds columns 32q + 16p + 2n + e: lane (g, t)'s C fragments of blocks 4q + 2p and 4q + 2p + 1
// are columns 32q + 16p + 4t .. 4t + 3 of its rows.

// Byte offset of 16-byte chunk c of staged row r (rows of D bytes).
template <int D>
__device__ __forceinline__ int staged_chunk(int r, int c) {
  return swizzle<D / 16>(r, c) * 2;
}

// The queries' A fragments for the permuted Q·Kᵀ above, in f16 times 2^e, e chosen from their
// largest magnitude so that it lands below 2^15 (f16's range ends at 65504); returns 2^-e, which
// the scores are multiplied by. Every warp holds the same queries (so the same e).
template <int D>
__device__ __forceinline__ float queries_f16(HeldA<D>& qa, const uint16_t* sq) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint4 x[2][D / 32];  // rows g and g + 8: 8 bf16 at columns 32b + 8t
  uint32_t m = 0;  // abs_bits of the largest
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      x[r][b] = *reinterpret_cast<const uint4*>(sq + swizzle<D / 8>(g + 8 * r, 4 * b + t));
      m = max(m, kv_fp8::amax8(x[r][b]));
    }
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  // amax < 2^(exponent field − 126): e = 141 − field puts it below 2^15 (bounded for zeros, NaN).
  const int e = min(max(141 - int(m >> 23), -60), 60);
  const float up = ldexpf(1.0f, e);
  auto f16 = [&](uint32_t w) { return pack_f16(bf16_lo(w) * up, bf16_hi(w) * up); };
#pragma unroll
  for (int b = 0; b < D / 32; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // k16 step 2b + h: columns 32b + 8t + 4h .. + 3
      qa.f[2 * b + h][0] = f16(quant::component(x[0][b], 2 * h));
      qa.f[2 * b + h][1] = f16(quant::component(x[1][b], 2 * h));
      qa.f[2 * b + h][2] = f16(quant::component(x[0][b], 2 * h + 1));
      qa.f[2 * b + h][3] = f16(quant::component(x[1][b], 2 * h + 1));
    }
  return ldexpf(1.0f, -e);
}

// s (16 query rows × the warp's 16 keys) = Q · Kᵀ from the staged e4m3 K tile (unscaled), in four
// independent MMA chains (two a key block) for latency.
template <int D>
__device__ __forceinline__ void scores_fp8(float (&s)[2][4], const HeldA<D>& qa, const uint8_t* k_tile, int key0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float odd[2][4] = {};
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
    s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      const uint2 w =
          *reinterpret_cast<const uint2*>(k_tile + staged_chunk<D>(key0 + nb * 8 + g, 2 * b + t / 2) + t % 2 * 8);
      mma_f16(s[nb], qa.f[2 * b], e4m3x2_to_f16x2(w.x), e4m3x2_to_f16x2(w.x >> 16));
      mma_f16(odd[nb], qa.f[2 * b + 1], e4m3x2_to_f16x2(w.y), e4m3x2_to_f16x2(w.y >> 16));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) s[nb][i] += odd[nb][i];
  }
}

// o += p · V for the warp's 16 keys (key0 ..) of the staged e4m3 V tile (unscaled), o in the
// column order above.
template <int D>
__device__ __forceinline__ void accumulate_fp8(float (&o)[D / 8][4], const uint32_t (&p)[4], const uint8_t* v_tile,
                                               int key0) {
  const int lane = threadIdx.x % 32, m = lane / 8, i = lane % 8;
#pragma unroll
  for (int q = 0; q < D / 32; ++q) {
    uint32_t r[4];  // matrices: keys 0–7 and 8–15 of units 16q .. + 7, then of units 16q + 8 .. + 15
    ldmatrix_x4_trans(r, v_tile + staged_chunk<D>(key0 + m % 2 * 8 + i, 2 * q + m / 2));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mma_f16(o[4 * q + 2 * h], p, e4m3x2_to_f16x2(__byte_perm(r[2 * h], 0, 0x20)),
              e4m3x2_to_f16x2(__byte_perm(r[2 * h + 1], 0, 0x20)));
      mma_f16(o[4 * q + 2 * h + 1], p, e4m3x2_to_f16x2(__byte_perm(r[2 * h], 0, 0x31)),
              e4m3x2_to_f16x2(__byte_perm(r[2 * h + 1], 0, 0x31)));
    }
  }
}

// The decode kernel's shared memory: the queries, then the K/V ring (bf16 tiles; or, from an e4m3
// cache, the staged bytes and scales of each tile); the merge reuses the bf16 ring's bytes.
// From an e4m3 cache the ring has 3 stages (two tiles in flight while one is used), which still fits
// 3 CTAs an SM; 4 stages measured 1% slower at batch 64 (H200, 2026-11-22).
template <int D, bool kFp8Cache>
struct DecodeSmem {
  static constexpr int kStages = kFp8Cache ? 3 : kDecodeStages;
  static constexpr int kQueries = kGroupRows * D * 2;
  static constexpr int kTileBytes = kTileRows * D * (kFp8Cache ? 1 : 2);  // one K (or V) tile in the ring
  static constexpr int kStageBytes = 2 * kTileBytes + (kFp8Cache ? 2 * kTileRows * 4 : 0);  // K, V (and scales)
  static constexpr int kRing = kStages * kStageBytes;
  static constexpr size_t kBytes = kQueries + std::max(kRing, 2 * kDecodeStages * kTileRows * D * 2);
};

// grid (max_parts, kv_heads, S) in clusters of (max_parts, 1, 1): one sequence's partitions for one
// kv head. A cluster leaves together or not at all: whether to is decided per sequence.
// kQuantized: the output goes to qo (decode_quantizes_output's steps; group · D / 8 a multiple of
// 32, so that the output loops below run whole warps, as the quantization's shuffles need).
// kFp8Cache: the cache is e4m3 with scales cs (ops/kv_fp8.h). Its bytes go through the ring as
// they are (half the bf16 tile's), and each warp reads its 16 keys' MMA fragments from them,
// converted to f16 in registers (exact, unscaled: scores_fp8, accumulate_fp8) for f16 MMAs; the
// scales, powers of two, are applied exactly in fp32 to the scores (k) and to the probabilities
// before they are rounded for P·V (v). Same math as the bf16 cache's path but for where the
// roundings fall (f16 P is finer than bf16's).
// kSmallGrid (bf16 cache; a grid of at most one CTA an SM, batch 1–2): both tiles of the ring are
// requested before the early-start wait, the step's own row (len − 1, which the RoPE kernel before
// this one writes) left out of them and read after the wait. At batch 1 a partition holds 1–3 tiles
// of a 512–1536-key context; the CTA has ~1.6 µs before its wait (the RoPE kernel's run). fp8 B = 1
// decode 337 / 337 tokens/s against 333 / 333, B = 2 662 / 662 against 653 / 654 (H200, 2026-11-27).
// A 4-tile ring with three tiles before the wait lost (B = 2 −8%): its 132 KB a CTA left no room
// for the next GEMM's CTAs, launched early beside it.
template <int D, bool kQuantized, bool kFp8Cache = false, bool kSmallGrid = false>
__global__ void __launch_bounds__(kThreads, kDecodeCtasPerSm) decode_kernel(const DecodeArgs a,
                                                                            const QuantizedOut qo,
                                                                            const CacheScales cs) {
  static_assert(!(kSmallGrid && kFp8Cache), "the small grid's early tiles are the bf16 cache's");
  // The bf16 cache's code is written as it was before the e4m3 cache came (if constexpr apart), so
  // that its kernels compile to the same SASS (scripts/dev/sass_diff.sh): their speed at batch 64 moved
  // by 1–2% with changes outside the main loop (H200, 2026-11-22).
  using Smem = DecodeSmem<D, kFp8Cache>;
  constexpr int kStages = Smem::kStages;
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sq = smem;                           // [16, D] the group's queries (rows ≥ group zero)
  uint16_t* sk = sq + kGroupRows * D;            // [kDecodeStages][64, D]
  uint16_t* sv = sk + kDecodeStages * kTileRows * D;  // [kDecodeStages][64, D]
  // e4m3: over the same memory, the ring of stages (K tile, V tile as e4m3 [64, D] rows, swizzled
  // like bf16 tiles; then the tile's 64 K scales and 64 V scales).
  uint8_t* ring = reinterpret_cast<uint8_t*>(sk);
  auto k_stage = [&](int j) { return ring + (j % kStages) * Smem::kStageBytes; };
  auto v_stage = [&](int j) { return k_stage(j) + Smem::kTileBytes; };
  auto stage_scales = [&](int j) { return reinterpret_cast<float*>(k_stage(j) + 2 * Smem::kTileBytes); };
  const int part = blockIdx.x, g = blockIdx.y, s = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Until the early-start wait below, only the step's uploaded inputs are read (cu_seqlens, context
  // lengths, block tables: core/early_start.h): the row, the partition and tile 0's cache blocks;
  // and tile 0 itself when it holds only earlier steps' keys (below).
  const int t = decode_row(a.cu, s, a.T, a.one_row_each);
  const int context = t >= 0 ? a.context_lens[s] : 0;
  const bool context_ok = context >= 1 && context <= a.max_blocks * a.block_size;
  const int len = context_ok ? context : 0;  // no keys read for a row that ends up NaN
  const int span = context_ok ? decode_span(len, a.max_parts) : kTileRows, parts = (len + span - 1) / span;
  // A CTA past the sequence's last partition reads no keys but stays for the cluster's barriers.
  const int p_begin = min(part * span, len), p_end = min(len, p_begin + span);
  const int tiles = (p_end - p_begin + kTileRows - 1) / kTileRows;

  const int32_t* table = a.block_tables + int64_t(s) * a.max_blocks;
  const int64_t ld = int64_t(a.kv_heads) * D;
  const uint16_t* k = a.k_cache + int64_t(g) * D;
  const uint16_t* v = a.v_cache + int64_t(g) * D;
  bool bad = false;
  // This thread copies 16-byte chunk c0 of rows row0 + kRowStep·i of every K/V tile (load_keys'
  // split); from an e4m3 cache (D / 16 chunks a row), the threads of chunks 0 and 1 also copy those
  // rows' K and V scales. Their cache blocks are read from the block table one tile ahead of the
  // copies: read right before them, the table's latency stalled every warp once a tile (ncu: ~1/3
  // issue slots used).
  constexpr int kRowChunks = kFp8Cache ? D / 16 : kChunks;
  constexpr int kRowsPerThread = kTileRows * kRowChunks / kThreads, kRowStep = kThreads / kRowChunks;
  const int row0 = threadIdx.x / kRowChunks, c0 = threadIdx.x % kRowChunks;
  auto block_of = [&](int p) { return a.block_shift >= 0 ? p >> a.block_shift : p / a.block_size; };
  int32_t blocks[kRowsPerThread];
  auto fetch_blocks = [&](int j) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int p = p_begin + j * kTileRows + row0 + kRowStep * i;
      blocks[i] = j < tiles && p < p_end ? table[block_of(p)] : 0;
    }
  };
  fetch_blocks(0);
  // Tile j's copies (zeros past p_end), then tile j + 1's blocks; under kSmallGrid, not the row at
  // position skip.
  auto load_stage = [&](int j, [[maybe_unused]] int skip = -1) {
    if (j < tiles) {
      if constexpr (kFp8Cache) {
        const uint8_t* k8 = reinterpret_cast<const uint8_t*>(a.k_cache) + int64_t(g) * D;  // the kv head's bytes
        const uint8_t* v8 = reinterpret_cast<const uint8_t*>(a.v_cache) + int64_t(g) * D;
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          const int r = row0 + kRowStep * i, p = p_begin + j * kTileRows + r, block = blocks[i];
          int64_t slot = -1;
          if (p < p_end) {
            if (block < 0 || block >= a.num_blocks) bad = true;
            else slot = int64_t(block) * a.block_size + (p - block_of(p) * a.block_size);
          }
          cp_async16(k_stage(j) + staged_chunk<D>(r, c0), slot >= 0 ? k8 + slot * ld + c0 * 16 : k8, slot >= 0);
          cp_async16(v_stage(j) + staged_chunk<D>(r, c0), slot >= 0 ? v8 + slot * ld + c0 * 16 : v8, slot >= 0);
          if (c0 < 2) {
            const float* src = c0 == 0 ? cs.k : cs.v;
            cp_async4(stage_scales(j) + c0 * kTileRows + r, slot >= 0 ? src + slot * a.kv_heads + g : src, slot >= 0);
          }
        }
      } else {
      uint16_t* k_tile = sk + (j % kDecodeStages) * kTileRows * D;
      uint16_t* v_tile = sv + (j % kDecodeStages) * kTileRows * D;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int r = row0 + kRowStep * i, p = p_begin + j * kTileRows + r, block = blocks[i];
        if (kSmallGrid && p == skip) continue;  // no copy at all: the row is stored after the wait
        int64_t offset = -1;
        if (p < p_end) {
          if (block < 0 || block >= a.num_blocks) bad = true;
          else offset = (int64_t(block) * a.block_size + (p - block_of(p) * a.block_size)) * ld + c0 * 8;
        }
        cp_async16(k_tile + swizzle<kChunks>(r, c0), offset >= 0 ? k + offset : k, offset >= 0);
        cp_async16(v_tile + swizzle<kChunks>(r, c0), offset >= 0 ? v + offset : v, offset >= 0);
      }
      }
    }
    cp_async_commit();  // also when empty: group j is tile j's
    fetch_blocks(j + 1);
  };
  // Tile 0's K/V rows too when none of them is this step's: those come from earlier steps, while the
  // step writes only the row at len − 1 (the RoPE kernel before this one). +0.8% fp8 tokens/s at
  // batch 1, +0.2% at 64 (H200, 2026-11-22).
  // Under kSmallGrid both ring tiles, without the step's row.
  const bool tile0_early = tiles > 0 && min(p_begin + kTileRows, p_end) <= len - 1;
  [[maybe_unused]] int early = 0;  // kSmallGrid: the tiles requested before the wait (≤ 2)
  if constexpr (kSmallGrid) {
    // The loop's first wait (for all copies but the newest kStages − 2 groups) then also covers the
    // queries, committed after these tiles.
    static_assert(kStages == 2);
    for (; early < min(tiles, kStages); ++early) load_stage(early, len - 1);
  } else {
    if (tile0_early) load_stage(0);
  }

  wait_for_previous_kernel();  // launched with an early start in decode steps (core/early_start.h)
  let_next_kernel_start();
  if (t < 0) {
    if (a.one_row_each && part == 0) {
      if constexpr (kQuantized) {
        store_quantized_nan_row<D>(a, qo, s, g);
      } else {
        uint16_t* row = a.out + int64_t(s) * a.out_width + int64_t(g) * a.group * D;
        for (int i = threadIdx.x; i < a.group * D; i += kThreads) row[i] = kBf16NaN;
      }
    }
    return;
  }
  uint16_t* out = a.out + int64_t(t) * a.out_width + int64_t(g) * a.group * D;  // (unused if kQuantized)
  if (!context_ok) {
    if (part == 0) {
      if constexpr (kQuantized) store_quantized_nan_row<D>(a, qo, t, g);
      else for (int i = threadIdx.x; i < a.group * D; i += kThreads) out[i] = kBf16NaN;
    }
    return;
  }
  const uint16_t* q = a.qkv + int64_t(t) * a.qkv_width + int64_t(g) * a.group * D;
  load_tile<D, kGroupRows>(sq, q, [&](int r) { return r < a.group ? q + int64_t(r) * D : nullptr; });
  cp_async_commit();  // the queries: a group of their own, older than tile 1's, so waited for with tile 0
  if constexpr (kSmallGrid) {
    // The step's row, if an early tile left it out: its 16-byte chunks by the threads whose row and
    // chunk they are in load_stage's split, stored before the loop's first barrier.
    const int r_now = len - 1 - p_begin;
    if (0 <= r_now && r_now < early * kTileRows && r_now % kTileRows % kRowStep == row0) {
      const int block = table[block_of(len - 1)];
      if (block < 0 || block >= a.num_blocks) {
        bad = true;
      } else {
        const int64_t slot = int64_t(block) * a.block_size + (len - 1 - block_of(len - 1) * a.block_size);
        const int64_t offset = slot * ld + c0 * 8;
        const int at = r_now / kTileRows * kTileRows * D + swizzle<kChunks>(r_now % kTileRows, c0);
        *reinterpret_cast<uint4*>(sk + at) = *reinterpret_cast<const uint4*>(k + offset);
        *reinterpret_cast<uint4*>(sv + at) = *reinterpret_cast<const uint4*>(v + offset);
      }
    }
  } else {
    for (int j = tile0_early ? 1 : 0; j < kStages - 1; ++j) load_stage(j);
  }

  float o[D / 8][4] = {};
  OnlineSoftmax softmax;
  HeldA<D> qa;
  // e4m3 cache: the scores' factor undoing the queries' f16 scaling, and the largest V scale this
  // warp has seen (o is kept divided by it: the probabilities times the V scales over it stay ≤ 1
  // for f16; it only grows, by powers of two, so the rescales are exact and rare).
  [[maybe_unused]] float q_down = 1.0f, v_top = 0.0f;
  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<kStages - 2>();  // tile j has landed (this thread's copies) ...
    __syncthreads();               // ... everyone's; and everyone is done with tile j − 1
    if (!kSmallGrid || j + kStages - 1 >= early) load_stage(j + kStages - 1);  // into tile j − 1's buffers
    else cp_async_commit();  // (kSmallGrid: tile j + 1 came before the wait)
    if (!kFp8Cache && j == 0) qa.load(sq, 0);
    // This warp's 16 keys of the tile.
    float sc[2][4];
    if constexpr (kFp8Cache) {
      if (j == 0) q_down = queries_f16<D>(qa, sq);
      scores_fp8<D>(sc, qa, k_stage(j), warp * 16);
      // This lane's keys (warp · 16 + nb · 8 + lane % 4 · 2 + e % 2) times their scales.
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const float2 f = *reinterpret_cast<const float2*>(stage_scales(j) + warp * 16 + nb * 8 + lane % 4 * 2);
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nb][e] *= (e % 2 ? f.y : f.x) * q_down;
      }
    } else {
      multiply_transposed<D, 16>(sc, qa, sk + (j % kDecodeStages) * kTileRows * D, warp * 16);
    }
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (p_begin + j * kTileRows + warp * 16 + nb * 8 + lane % 4 * 2 + e % 2 >= p_end) sc[nb][e] = -INFINITY;
    softmax.update<16, D>(sc, o, a.scale_log2);
    uint32_t p[1][4];
    if constexpr (kFp8Cache) {
      // Σ p · (e4m3 · scale) = v_top · Σ (p · scale / v_top) · e4m3; l keeps Σ p.
      float2 f[2];
      float top = 0.0f;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        f[nb] = *reinterpret_cast<const float2*>(stage_scales(j) + kTileRows + warp * 16 + nb * 8 + lane % 4 * 2);
        top = fmaxf(top, fmaxf(f[nb].x, f[nb].y));
      }
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));  // the 16 keys' largest (lanes ≡ mod 4 hold
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));  // the same keys)
      if (top > v_top) {  // warp-uniform
        const float r = v_top / top;
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[nb][e] *= r;
        v_top = top;
      }
      const float down = v_top > 0.0f ? 1.0f / v_top : 0.0f;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nb][e] *= (e % 2 ? f[nb].y : f[nb].x) * down;
      to_a_fragments<1, true>(p, sc);
      accumulate_fp8<D>(o, p[0], v_stage(j), warp * 16);
    } else {
      to_a_fragments<1>(p, sc);
      multiply_accumulate<kChunks, 1, D>(o, p, sv + (j % kDecodeStages) * kTileRows * D, warp * 16, 0);
    }
  }
  if constexpr (kFp8Cache) {
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nb][e] *= v_top;
  }
  softmax.finish();
  bad = __syncthreads_or(bad);  // also: the K/V buffers are free for the merge below

  // Merge the 4 warps' (m, l, o) through shared memory (f32 [4][16][D] over the K buffers).
  static_assert(kWarps * 16 * D * sizeof(float) <= kDecodeStages * kTileRows * D * sizeof(uint16_t));
  float* so = reinterpret_cast<float*>(sk);
  float* sm = reinterpret_cast<float*>(sv);  // [4][16]
  float* sl = sm + kWarps * 16;              // [4][16]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = lane / 4 + r * 8;
    if constexpr (kFp8Cache) {  // accumulate_fp8's column order
#pragma unroll
      for (int q = 0; q < D / 8; q += 2)
        *reinterpret_cast<float4*>(so + (warp * 16 + row) * D + q * 8 + lane % 4 * 4) =
            make_float4(o[q][2 * r], o[q + 1][2 * r], o[q][2 * r + 1], o[q + 1][2 * r + 1]);
    } else {
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
      *reinterpret_cast<float2*>(so + (warp * 16 + row) * D + nb * 8 + lane % 4 * 2) =
          make_float2(o[nb][2 * r], o[nb][2 * r + 1]);
    }
    if (lane % 4 == 0) {
      sm[warp * 16 + row] = softmax.m[r];
      sl[warp * 16 + row] = softmax.l[r];
    }
  }
  // This CTA's merged (m, l, Σ p·v) of each row, unnormalized, for the cluster's merge.
  float* po = sl + kWarps * 16;     // [16][D]
  float* pm = po + kGroupRows * D;  // [16]
  float* pl = pm + kGroupRows;      // [16]
  int* pbad = reinterpret_cast<int*>(pl + kGroupRows);
  static_assert((2 * kWarps * 16 + (D + 2) * kGroupRows + 1) * sizeof(float) <=
                kDecodeStages * kTileRows * D * sizeof(uint16_t), "sm … pbad fit over the V buffers");
  __syncthreads();
  if (part < parts) {
    for (int i = threadIdx.x; i < a.group * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, sm[w * 16 + r]);
      float l = 0.0f, acc[8] = {};
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2_approx(sm[w * 16 + r] - m);  // 0 for a warp without keys (m = −inf)
        l = fmaf(sl[w * 16 + r], f, l);
        const float* x = so + (w * 16 + r) * D + c * 8;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = fmaf(x[e], f, acc[e]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) po[r * D + c * 8 + e] = acc[e];
      if (c == 0) pm[r] = m, pl[r] = l;
    }
    if (threadIdx.x == 0) *pbad = bad;
  }
  const cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every partition's result written (release / acquire)
  if (part == 0) {
    // o = Σ_p 2^(m_p − M) · Σ p·v_p / Σ_p 2^(m_p − M) · l_p over the partitions, in rank order; a bad
    // block table in any partition makes the row NaN. The loops over the partitions are unrolled
    // so that all their reads of the other CTAs' shared memory are in flight at once, not one
    // round trip after another.
    for (int i = threadIdx.x; i < a.group * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      float mp[kMaxDecodeParts], lp[kMaxDecodeParts];
      float4 xp[kMaxDecodeParts][2];
      bool any_bad = false;
#pragma unroll
      for (int q = 0; q < kMaxDecodeParts; ++q) {
        const bool in = q < parts;
        mp[q] = in ? cluster.map_shared_rank(pm, q)[r] : -INFINITY;
        lp[q] = in ? cluster.map_shared_rank(pl, q)[r] : 0.0f;
        any_bad |= in && *cluster.map_shared_rank(pbad, q) != 0;
        const float4* x = reinterpret_cast<const float4*>(cluster.map_shared_rank(po, in ? q : 0) + r * D + c * 8);
        xp[q][0] = in ? x[0] : float4{};
        xp[q][1] = in ? x[1] : float4{};
      }
      float m = -INFINITY;
#pragma unroll
      for (int q = 0; q < kMaxDecodeParts; ++q) m = fmaxf(m, mp[q]);
      float l = 0.0f, acc[8] = {};
#pragma unroll
      for (int q = 0; q < kMaxDecodeParts; ++q) {
        if (q >= parts) break;
        const float f = exp2_approx(mp[q] - m);
        l = fmaf(lp[q], f, l);
        const float4 x0 = xp[q][0], x1 = xp[q][1];
        acc[0] = fmaf(x0.x, f, acc[0]), acc[1] = fmaf(x0.y, f, acc[1]), acc[2] = fmaf(x0.z, f, acc[2]);
        acc[3] = fmaf(x0.w, f, acc[3]), acc[4] = fmaf(x1.x, f, acc[4]), acc[5] = fmaf(x1.y, f, acc[5]);
        acc[6] = fmaf(x1.z, f, acc[6]), acc[7] = fmaf(x1.w, f, acc[7]);
      }
      const float inv = any_bad ? __int_as_float(0x7fc00000) : 1.0f / l;
      uint4 w;
      w.x = pack_bf16(acc[0] * inv, acc[1] * inv);
      w.y = pack_bf16(acc[2] * inv, acc[3] * inv);
      w.z = pack_bf16(acc[4] * inv, acc[5] * inv);
      w.w = pack_bf16(acc[6] * inv, acc[7] * inv);
      if constexpr (kQuantized) store_quantized(a, qo, t, int64_t(g) * a.group * D + i * 8, w);
      else *reinterpret_cast<uint4*>(out + r * D + c * 8) = w;
    }
  }
  cluster.sync();  // no CTA leaves (freeing its shared memory) while the first still reads it
}

// ---- decode in the training forward's order (paged, one-row sequences) --------------------------

// A one-row sequence's attention with fwd_kernel's arithmetic, so that a decode row equals the
// training forward's row of the same token bit for bit (the exact rollout mode; decode_kernel's
// context partitions are merged in another order). A CTA takes one (kv head, sequence): the
// group's q heads are rows of warp 0's 16-row MMA tile (fwd_kernel's warps hold 16 query rows of
// one head; an MMA row's result depends on that row alone), and it walks the whole context in
// fwd_kernel's 64-key tiles with its online softmax, in the same order; warps 1–3 only copy the
// tiles. fwd_kernel on the decode rows (one CTA a q head, one real row in 64) reads each K/V byte
// once per q head and runs 64 times the MMAs; this reads it once per group. Not split over the
// context: a long context at a small batch is one CTA's serial walk.
template <int D, bool kFp8Cache>
__global__ void __launch_bounds__(kThreads)
    decode_exact_kernel(const FwdArgs a, const CacheScales cs, const bool one_row_each) {
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sq = smem;                     // [16, D] the group's queries, then its output rows
  uint16_t* sk = sq + kGroupRows * D;      // [2][64, D]
  uint16_t* sv = sk + 2 * kTileRows * D;   // [2][64, D]
  const int g = blockIdx.x, s = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = decode_row(a.cu, s, a.T, one_row_each);
  if (t < 0) {  // decode_kernel's rule: under one_row_each row s is s's, made NaN
    if (one_row_each) {
      uint16_t* row = a.out + int64_t(s) * a.out_width + int64_t(g) * a.group * D;
      for (int i = threadIdx.x; i < a.group * D; i += kThreads) row[i] = kBf16NaN;
    }
    return;
  }
  const PagedKeys keys{a.block_tables + int64_t(s) * a.max_blocks, a.context_lens[s], a.block_size, a.num_blocks,
                       a.kv_width};
  bool bad = keys.count < 1 || keys.count > a.max_keys;  // a context length out of range
  float o[D / 8][4] = {};
  OnlineSoftmax softmax;
  if (!bad) {
    const int pos = keys.count - 1, tiles = pos / kTileRows + 1;  // the row's position: the last key
    const uint16_t* q = a.qkv + int64_t(t) * a.qkv_width + int64_t(g) * a.group * D;
    auto load_stage = [&](int j) {
      if constexpr (kFp8Cache)
        load_keys_fp8<D>(sk + (j % 2) * kTileRows * D, sv + (j % 2) * kTileRows * D,
                         reinterpret_cast<const uint8_t*>(a.k_cache) + int64_t(g) * D,
                         reinterpret_cast<const uint8_t*>(a.v_cache) + int64_t(g) * D, cs.k + g, cs.v + g, keys,
                         j * kTileRows, bad);
      else
        load_keys<D>(sk + (j % 2) * kTileRows * D, sv + (j % 2) * kTileRows * D, a.k_cache + int64_t(g) * D,
                     a.v_cache + int64_t(g) * D, keys, j * kTileRows, bad);
    };
    load_tile<D, kGroupRows>(sq, q, [&](int r) { return r < a.group ? q + int64_t(r) * D : nullptr; });
    load_stage(0);
    cp_async_commit();
    HeldA<D> qa;
    for (int j = 0; j < tiles; ++j) {
      cp_async_wait<0>();
      __syncthreads();  // tile j visible to all; everyone is done with tile j − 1's buffers
      if (j + 1 < tiles) {
        load_stage(j + 1);
        cp_async_commit();
      }
      if (warp != 0) continue;
      if (j == 0) qa.load(sq, 0);
      float sc[kTileRows / 8][4];
      multiply_transposed<D, kTileRows>(sc, qa, sk + (j % 2) * kTileRows * D, 0);
      if (j * kTileRows + kTileRows - 1 > pos) {  // keys past the row's position (fwd_kernel's mask)
#pragma unroll
        for (int nb = 0; nb < kTileRows / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (j * kTileRows + nb * 8 + lane % 4 * 2 + e % 2 > pos) sc[nb][e] = -INFINITY;
      }
      softmax.update<kTileRows, D>(sc, o, a.scale_log2);
      uint32_t p[kTileRows / 16][4];
      to_a_fragments<kTileRows / 16>(p, sc);
      multiply_accumulate<kChunks, kTileRows / 16, D>(o, p, sv + (j % 2) * kTileRows * D, 0, 0);
    }
    if (warp == 0) softmax.finish();
  }
  bad = __syncthreads_or(bad);  // also: every warp is done with the K/V buffers
  if (warp != 0) return;

  // The group's rows, normalized and rounded as fwd_kernel does, through sq: 16-byte row stores.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) inv[r] = bad ? __int_as_float(0x7fc00000) : 1.0f / softmax.l[r];
  const int r0 = lane / 4;
#pragma unroll
  for (int nb = 0; nb < D / 8; ++nb) {
    *reinterpret_cast<uint32_t*>(sq + swizzle<kChunks>(r0, nb) + lane % 4 * 2) =
        pack_bf16(o[nb][0] * inv[0], o[nb][1] * inv[0]);
    *reinterpret_cast<uint32_t*>(sq + swizzle<kChunks>(r0 + 8, nb) + lane % 4 * 2) =
        pack_bf16(o[nb][2] * inv[1], o[nb][3] * inv[1]);
  }
  __syncwarp();
  uint16_t* out = a.out + int64_t(t) * a.out_width + int64_t(g) * a.group * D;
  for (int i = lane; i < kGroupRows * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks;
    if (r < a.group)
      *reinterpret_cast<uint4*>(out + int64_t(r) * D + c * 8) = *reinterpret_cast<const uint4*>(sq + swizzle<kChunks>(r, c));
  }
}

// ---- backward ----------------------------------------------------------------------------------

struct BwdArgs {
  const uint16_t* qkv;
  const uint16_t* dout;
  const float* lse;   // [T, q_heads]
  const float* dsum;  // [T, q_heads]: rowsum(dO ∘ O)
  float* dq;          // [T, q_heads, D] accumulator
  uint16_t* dqkv;
  const int32_t* cu;
  int S, T, q_heads, kv_heads, group;
  int64_t qkv_width;
  float scale, scale_log2;
};

// dsum[i] = Σ_c dout[i, c] · out[i, c] over the T · q_heads head rows; dq zeroed. D/8 lanes a row.
template <int D>
__global__ void bwd_prep_kernel(const uint16_t* dout, const uint16_t* out, float* dsum, float* dq, int64_t rows) {
  constexpr int kLanes = D / 8;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, row = i / kLanes;
  const int c = int(i % kLanes);
  float sum = 0.0f;
  if (row < rows) {
    const uint4 x = *reinterpret_cast<const uint4*>(dout + row * D + c * 8);
    const uint4 y = *reinterpret_cast<const uint4*>(out + row * D + c * 8);
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sum = fmaf(bf16_lo(xs[e]), bf16_lo(ys[e]), sum);
      sum = fmaf(bf16_hi(xs[e]), bf16_hi(ys[e]), sum);
    }
    float4* z = reinterpret_cast<float4*>(dq + row * D + c * 8);
    z[0] = z[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (row < rows && c == 0) dsum[row] = sum;
}

// dqkv's q columns = dq · scale, rounded to bf16. One thread per 8 columns.
template <int D>
__global__ void bwd_dq_kernel(const float* dq, uint16_t* dqkv, int64_t rows, int q_heads, int64_t qkv_width,
                              float scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, row = i / (D / 8);
  if (row >= rows) return;
  const int c = int(i % (D / 8));
  const float4* x = reinterpret_cast<const float4*>(dq + row * D + c * 8);
  const float4 u = x[0], w = x[1];
  const int64_t t = row / q_heads, h = row % q_heads;
  *reinterpret_cast<uint4*>(dqkv + t * qkv_width + h * D + c * 8) =
      make_uint4(pack_bf16(u.x * scale, u.y * scale), pack_bf16(u.z * scale, u.w * scale),
                 pack_bf16(w.x * scale, w.y * scale), pack_bf16(w.z * scale, w.w * scale));
}

// One CTA per (64-key tile, kv head). Warp w owns keys 16w .. 16w+15 of the tile. Per step (q head
// h of the group, 32-row query tile), with Sᵀ and dPᵀ in the key-major orientation:
//   Sᵀ = K·Qᵀ, Pᵀ = 2^(Sᵀ·scale·log2e − lse·log2e) (0 where key > query or past the sequence),
//   dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − Dᵢ), dV += Pᵀ·dO, dK += dSᵀ·Q,
//   dSᵀ → shared memory, dQ(32 × D) = dS·K: warp w the rows 16·(w%2), columns D/2·(w/2), added
//   into the f32 accumulator with atomics.
template <int D>
__global__ void __launch_bounds__(kThreads) bwd_kernel(const BwdArgs a) {
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sk = smem;                         // [64, D]
  uint16_t* sv = sk + kTileRows * D;           // [64, D]
  uint16_t* sq = sv + kTileRows * D;           // [2][32, D]
  uint16_t* sdo = sq + 2 * kBwdRows * D;       // [2][32, D]
  uint16_t* sds = sdo + 2 * kBwdRows * D;      // [64, 32] dSᵀ
  float* slse = reinterpret_cast<float*>(sds + kTileRows * kBwdRows);  // [2][32]
  float* sdsum = slse + 2 * kBwdRows;          // [2][32]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int item = blockIdx.x, g = item % a.kv_heads;

  const TileSpot spot = locate_tile<kTileRows, false>(a.cu, a.S, a.T, item / a.kv_heads, 1);
  if (!spot.valid) {
    nan_rows(a.dq, int64_t(a.q_heads) * D, 0, int64_t(a.q_heads) * D, a.T);
    nan_rows(a.dqkv, a.qkv_width, int64_t(a.q_heads) * D, int64_t(2) * a.kv_heads * D, a.T);
    return;
  }
  if (spot.seq < 0) return;
  const int n = spot.rows, k0 = spot.tile * kTileRows;
  const int64_t start = spot.start;
  const uint16_t* qkv = a.qkv + start * a.qkv_width;
  const int64_t k_col = int64_t(a.q_heads + g) * D, v_col = int64_t(a.q_heads + a.kv_heads + g) * D;
  const int64_t dout_width = int64_t(a.q_heads) * D;

  // Steps: the group's heads, each over query tiles k0/32 .. ceil(n/32)−1.
  const int qt0 = k0 / kBwdRows, per_head = (n + kBwdRows - 1) / kBwdRows - qt0, steps = a.group * per_head;
  auto load_step = [&](int it) {
    const int h = g * a.group + it / per_head, q0 = (qt0 + it % per_head) * kBwdRows, buf = it % 2;
    load_tile<D, kBwdRows>(sq + buf * kBwdRows * D, qkv, [&](int r) {
      return q0 + r < n ? qkv + int64_t(q0 + r) * a.qkv_width + int64_t(h) * D : nullptr;
    });
    const uint16_t* dout = a.dout + start * dout_width + int64_t(h) * D;
    load_tile<D, kBwdRows>(sdo + buf * kBwdRows * D, dout, [&](int r) {
      return q0 + r < n ? dout + int64_t(q0 + r) * dout_width : nullptr;
    });
    if (threadIdx.x < 2 * kBwdRows) {
      const int r = threadIdx.x % kBwdRows;
      const float* src = (threadIdx.x < kBwdRows ? a.lse : a.dsum) + (start + q0 + r) * a.q_heads + h;
      float* dst = (threadIdx.x < kBwdRows ? slse : sdsum) + buf * kBwdRows + r;
      cp_async4(dst, q0 + r < n ? src : a.lse, q0 + r < n);
    }
  };
  load_tile<D, kTileRows>(sk, qkv, [&](int r) {
    return k0 + r < n ? qkv + int64_t(k0 + r) * a.qkv_width + k_col : nullptr;
  });
  load_tile<D, kTileRows>(sv, qkv, [&](int r) {
    return k0 + r < n ? qkv + int64_t(k0 + r) * a.qkv_width + v_col : nullptr;
  });
  load_step(0);
  cp_async_commit();

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int key_lo = k0 + warp * 16 + lane / 4;  // this lane's keys: key_lo and key_lo + 8
  for (int it = 0; it < steps; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // step it visible; every warp is done with step it − 1 (and with sds)
    if (it + 1 < steps) {
      load_step(it + 1);
      cp_async_commit();
    }
    const int h = g * a.group + it / per_head, q0 = (qt0 + it % per_head) * kBwdRows, buf = it % 2;
    const uint16_t* q = sq + buf * kBwdRows * D;
    const uint16_t* dout = sdo + buf * kBwdRows * D;

    float st[kBwdRows / 8][4], dpt[kBwdRows / 8][4];
    multiply_transposed<D, kBwdRows>(st, [&](int kk, uint32_t (&f)[4]) { load_a<D>(f, sk, warp * 16, kk); }, q, 0);
    multiply_transposed<D, kBwdRows>(dpt, [&](int kk, uint32_t (&f)[4]) { load_a<D>(f, sv, warp * 16, kk); }, dout, 0);
    const bool mask = q0 < k0 + kTileRows - 1 || q0 + kBwdRows > n;
#pragma unroll
    for (int nb = 0; nb < kBwdRows / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nb * 8 + lane % 4 * 2 + e % 2, query = q0 + col, key = key_lo + e / 2 * 8;
        const float lse = slse[buf * kBwdRows + col] * kLog2e;
        float p = exp2_approx(fmaf(st[nb][e], a.scale_log2, -lse));
        if (mask && (key > query || query >= n)) p = 0.0f;
        st[nb][e] = p;
        dpt[nb][e] = p * (dpt[nb][e] - sdsum[buf * kBwdRows + col]);
      }
    {
      uint32_t pa[kBwdRows / 16][4];
      to_a_fragments<kBwdRows / 16>(pa, st);
      multiply_accumulate<kChunks, kBwdRows / 16, D>(dv, pa, dout, 0, 0);
      to_a_fragments<kBwdRows / 16>(pa, dpt);
      multiply_accumulate<kChunks, kBwdRows / 16, D>(dk, pa, q, 0, 0);
    }
#pragma unroll
    for (int nb = 0; nb < kBwdRows / 8; ++nb) {
      const int r = warp * 16 + lane / 4;
      *reinterpret_cast<uint32_t*>(sds + swizzle<4>(r, nb) + lane % 4 * 2) = pack_bf16(dpt[nb][0], dpt[nb][1]);
      *reinterpret_cast<uint32_t*>(sds + swizzle<4>(r + 8, nb) + lane % 4 * 2) = pack_bf16(dpt[nb][2], dpt[nb][3]);
    }
    __syncthreads();

    // dQ rows 16·(w%2) .. +15 of the step, columns D/2·(w/2) .. +D/2−1; dS A fragments come from
    // the key-major dSᵀ by ldmatrix.trans.
    float dq[D / 16][4] = {};
#pragma unroll
    for (int kk = 0; kk < kTileRows / 16; ++kk) {
      uint32_t ds[1][4];
      ldmatrix_x4_trans(ds[0], sds + swizzle<4>(kk * 16 + lane / 16 * 8 + lane % 8, warp % 2 * 2 + lane / 8 % 2));
      multiply_accumulate<kChunks, 1, D / 2>(dq, ds, sk, kk * 16, warp / 2 * (D / 2));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + warp % 2 * 16 + lane / 4 + r * 8;
      if (row < n) {
        float* dst = a.dq + ((start + row) * a.q_heads + h) * D + warp / 2 * (D / 2) + lane % 4 * 2;
#pragma unroll
        for (int nb = 0; nb < D / 16; ++nb)
          atomicAdd(reinterpret_cast<float2*>(dst + nb * 8), make_float2(dq[nb][2 * r], dq[nb][2 * r + 1]));
      }
    }
  }
  __syncthreads();  // every warp is done reading sk: it and sv now stage dK and dV

  const int r0 = warp * 16 + lane / 4;
#pragma unroll
  for (int nb = 0; nb < D / 8; ++nb) {
    const int c = lane % 4 * 2;
    *reinterpret_cast<uint32_t*>(sk + swizzle<kChunks>(r0, nb) + c) = pack_bf16(dk[nb][0] * a.scale, dk[nb][1] * a.scale);
    *reinterpret_cast<uint32_t*>(sk + swizzle<kChunks>(r0 + 8, nb) + c) = pack_bf16(dk[nb][2] * a.scale, dk[nb][3] * a.scale);
    *reinterpret_cast<uint32_t*>(sv + swizzle<kChunks>(r0, nb) + c) = pack_bf16(dv[nb][0], dv[nb][1]);
    *reinterpret_cast<uint32_t*>(sv + swizzle<kChunks>(r0 + 8, nb) + c) = pack_bf16(dv[nb][2], dv[nb][3]);
  }
  __syncwarp();
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks, key = k0 + warp * 16 + r;
    if (key >= n) continue;
    uint16_t* row = a.dqkv + (start + key) * a.qkv_width;
    *reinterpret_cast<uint4*>(row + k_col + c * 8) = *reinterpret_cast<const uint4*>(sk + swizzle<kChunks>(warp * 16 + r, c));
    *reinterpret_cast<uint4*>(row + v_col + c * 8) = *reinterpret_cast<const uint4*>(sv + swizzle<kChunks>(warp * 16 + r, c));
  }
}

// ---- kv cache write ----------------------------------------------------------------------------

// One thread per 16-byte chunk of a row's k and v heads (chunks = kv_width / 8 of each).
__global__ void kv_cache_write_kernel(uint16_t* k_cache, uint16_t* v_cache, const uint16_t* qkv,
                                      const int32_t* slots, int64_t T, int64_t qkv_width, int64_t k_col,
                                      int64_t v_col, int64_t chunks, int64_t capacity) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * 2 * chunks) return;
  const int64_t t = i / (2 * chunks), c = i % (2 * chunks), slot = slots[t];
  if (slot < 0 || slot >= capacity) return;
  const bool is_v = c >= chunks;
  const int64_t col = c % chunks * 8;
  *reinterpret_cast<uint4*>((is_v ? v_cache : k_cache) + slot * chunks * 8 + col) =
      *reinterpret_cast<const uint4*>(qkv + t * qkv_width + (is_v ? v_col : k_col) + col);
}

// Into an e4m3 cache (ops/kv_fp8.h): a warp a row's k or v head (the k heads, then the v heads, as
// qkv holds them from column k_col on), lane i < D / 8 quantizing its columns [8i, 8i + 8).
template <int D>
__global__ void kv_cache_write_fp8_kernel(uint8_t* k_cache, uint8_t* v_cache, float* k_scale, float* v_scale,
                                          const uint16_t* qkv, const int32_t* slots, int64_t heads, int kv_heads,
                                          int64_t qkv_width, int64_t k_col, int64_t capacity) {
  const int64_t head = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // the same for the warp
  if (head >= heads) return;
  const int64_t t = head / (2 * kv_heads), slot = slots[t];
  const int h = int(head % (2 * kv_heads)), lane = threadIdx.x % 32;
  if (slot < 0 || slot >= capacity) return;
  const bool active = lane < D / 8, is_v = h >= kv_heads;
  const uint4 w = active ? *reinterpret_cast<const uint4*>(qkv + t * qkv_width + k_col + int64_t(h) * D + lane * 8)
                         : make_uint4(0, 0, 0, 0);
  const float scale = kv_fp8::warp_head_scale(w);
  const int64_t dst = slot * kv_heads + h % kv_heads;
  if (active)
    *reinterpret_cast<uint2*>((is_v ? v_cache : k_cache) + dst * D + lane * 8) = kv_fp8::quantize8(w, inverse_scale(scale));
  if (lane == 0) (is_v ? v_scale : k_scale)[dst] = scale;
}

// ---- host --------------------------------------------------------------------------------------

template <int D>
constexpr size_t kFwdSmem = 5 * kTileRows * D * sizeof(uint16_t);  // q, 2 × (k, v)
template <int D>
constexpr size_t kBwdSmem = (4 * kTileRows * D + kTileRows * kBwdRows) * sizeof(uint16_t) + 4 * kBwdRows * sizeof(float);

template <class T>
T* data(const Tensor& t) {
  return static_cast<T*>(t.data());
}

template <class F>
void with_head_dim(int64_t head_dim, F&& f) {
  // ops/attention.cpp admits 64 and 128 only.
  if (head_dim == 64) f(std::integral_constant<int, 64>());
  else f(std::integral_constant<int, 128>());
}

int to_int(int64_t v, const char* what) {
  LOCKSTEP_CHECK(v <= INT32_MAX, what, " (", v, ") exceeds the CUDA attention kernels' 32-bit range");
  return int(v);
}

unsigned blocks(int64_t threads, int per_block) { return unsigned((threads + per_block - 1) / per_block); }

// Query tiles of 64 rows (or key tiles) over packed sequences: at most T/64 rounded up, plus one
// partial tile per sequence.
int64_t tile_bound(int64_t T, int64_t S) { return (T + kTileRows - 1) / kTileRows + S; }

FwdArgs fwd_args(uint16_t* out, const Tensor& qkv, const Tensor& cu, const HeadLayout& layout) {
  FwdArgs a{};
  a.qkv = data<const uint16_t>(qkv);
  a.out = out;
  a.cu = data<const int32_t>(cu);
  a.S = to_int(cu.dim(0) - 1, "sequences");
  a.T = to_int(qkv.dim(0), "rows T");
  a.q_heads = int(layout.q_heads);
  a.kv_heads = int(layout.kv_heads);
  a.group = int(layout.group());
  a.qkv_width = layout.qkv_width();
  a.out_width = layout.q_width();
  a.scale_log2 = float(1.0 / std::sqrt(double(layout.head_dim))) * kLog2e;
  a.min_rows = 1;
  return a;
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                       const HeadLayout& layout) {
  if (qkv.dim(0) == 0) return;
  FwdArgs a = fwd_args(data<uint16_t>(out), qkv, cu_seqlens, layout);
  a.lse = data<float>(lse);
  a.max_keys = a.T;
  const int items = to_int(tile_bound(a.T, a.S) * a.q_heads, "attention_forward: CTAs");
  with_head_dim(layout.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    allow_dynamic_smem<fwd_kernel<D, false>>(kFwdSmem<D>);
    fwd_kernel<D, false><<<items, kThreads, kFwdSmem<D>, current_stream()>>>(a, CacheScales{});
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  });
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const HeadLayout& layout) {
  const int64_t T = qkv.dim(0), rows = T * layout.q_heads;
  if (T == 0) return;
  const Tensor dsum = Tensor::empty({T, layout.q_heads}, DType::f32, Device::cuda);
  const Tensor dq = Tensor::empty({T, layout.q_heads, layout.head_dim}, DType::f32, Device::cuda);
  BwdArgs a{};
  a.qkv = data<const uint16_t>(qkv);
  a.dout = data<const uint16_t>(dout);
  a.lse = data<const float>(lse);
  a.dsum = data<const float>(dsum);
  a.dq = data<float>(dq);
  a.dqkv = data<uint16_t>(dqkv);
  a.cu = data<const int32_t>(cu_seqlens);
  a.S = to_int(cu_seqlens.dim(0) - 1, "sequences");
  a.T = to_int(T, "rows T");
  a.q_heads = int(layout.q_heads);
  a.kv_heads = int(layout.kv_heads);
  a.group = int(layout.group());
  a.qkv_width = layout.qkv_width();
  a.scale = float(1.0 / std::sqrt(double(layout.head_dim)));
  a.scale_log2 = a.scale * kLog2e;
  const int items = to_int(tile_bound(a.T, a.S) * a.kv_heads, "attention_backward: CTAs");
  with_head_dim(layout.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    constexpr int kBlock = 256;
    bwd_prep_kernel<D><<<blocks(rows * (D / 8), kBlock), kBlock, 0, current_stream()>>>(
        data<const uint16_t>(dout), data<const uint16_t>(out), data<float>(dsum), a.dq, rows);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    allow_dynamic_smem<bwd_kernel<D>>(kBwdSmem<D>);
    bwd_kernel<D><<<items, kThreads, kBwdSmem<D>, current_stream()>>>(a);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    bwd_dq_kernel<D><<<blocks(rows * (D / 8), kBlock), kBlock, 0, current_stream()>>>(
        a.dq, a.dqkv, rows, a.q_heads, a.qkv_width, a.scale);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  });
}

void kv_cache_write(const PagedKv& cache, const Tensor& qkv, const Tensor& slots, const HeadLayout& layout) {
  const int64_t T = qkv.dim(0), chunks = layout.kv_width() / 8, capacity = cache.k.dim(0) * cache.k.dim(1);
  if (T == 0) return;
  constexpr int kBlock = 256;
  if (cache.fp8()) {
    const int64_t heads = T * 2 * layout.kv_heads;
    with_head_dim(layout.head_dim, [&](auto d) {
      constexpr int D = decltype(d)::value;
      kv_cache_write_fp8_kernel<D><<<blocks(heads * 32, kBlock), kBlock, 0, current_stream()>>>(
          data<uint8_t>(cache.k), data<uint8_t>(cache.v), data<float>(cache.k_scale), data<float>(cache.v_scale),
          data<const uint16_t>(qkv), data<const int32_t>(slots), heads, int(layout.kv_heads), layout.qkv_width(),
          layout.k_offset(), capacity);
    });
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    return;
  }
  kv_cache_write_kernel<<<blocks(T * 2 * chunks, kBlock), kBlock, 0, current_stream()>>>(
      data<uint16_t>(cache.k), data<uint16_t>(cache.v), data<const uint16_t>(qkv), data<const int32_t>(slots), T,
      layout.qkv_width(), layout.k_offset(), layout.v_offset(), chunks, capacity);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

namespace {

// Partitions per one-row sequence (a power of two, the cluster size): the most, up to
// kMaxDecodeParts, with which S · kv_heads · partitions CTAs fill the GPU at most about 4 times
// over (batch 1 at long contexts is bandwidth-bound only if many SMs stream K/V; more, shorter
// partitions only add waves of clusters), and no more than the longest possible context has
// 64-key tiles. The kernel splits each context by its own length (decode_span), so short
// contexts in a long-capacity table still spread out.
int decode_parts(int64_t S, int64_t kv_heads, int64_t max_keys) {
  const int64_t heads = S * kv_heads;
  const int64_t want = (4 * int64_t(device_sm_count()) + heads - 1) / std::max<int64_t>(heads, 1);
  const int64_t most = std::min<int64_t>({want, kMaxDecodeParts, (max_keys + kTileRows - 1) / kTileRows});
  int parts = 1;
  while (2 * parts <= most) parts *= 2;
  return parts;
}

// attention_paged with its output in bf16 (out), or quantized (quantized: decode steps only).
// decode_as_prefill: one-row sequences go through decode_exact_kernel (not decode_kernel): each row
// then sums its keys in the order the training forward's fwd_kernel does.
void paged(uint16_t* out, const QuantizedOut* quantized, const Tensor& qkv, const PagedKv& cache,
           const Tensor& block_tables, const Tensor& cu_seqlens_q, const Tensor& context_lens,
           const HeadLayout& layout, bool one_row_each, bool decode_as_prefill = false) {
  if (qkv.dim(0) == 0) return;
  FwdArgs a = fwd_args(out, qkv, cu_seqlens_q, layout);
  a.min_rows = 2;  // one-row sequences: decode_kernel, or decode_exact_kernel
  a.k_cache = data<const uint16_t>(cache.k);  // e4m3 bytes in an fp8 cache: the kernels cast
  a.v_cache = data<const uint16_t>(cache.v);
  const CacheScales scales =
      cache.fp8() ? CacheScales{data<const float>(cache.k_scale), data<const float>(cache.v_scale)} : CacheScales{};
  a.block_tables = data<const int32_t>(block_tables);
  a.context_lens = data<const int32_t>(context_lens);
  a.max_blocks = to_int(block_tables.dim(1), "block_tables' blocks per sequence");
  a.block_size = to_int(cache.k.dim(1), "block_size");
  a.num_blocks = to_int(cache.k.dim(0), "num_blocks");
  a.max_keys = to_int(int64_t(a.max_blocks) * a.block_size, "max_blocks · block_size");
  a.kv_width = layout.kv_width();

  DecodeArgs d{};
  d.qkv = a.qkv;
  d.out = a.out;
  d.k_cache = a.k_cache;
  d.v_cache = a.v_cache;
  d.block_tables = a.block_tables;
  d.context_lens = a.context_lens;
  d.cu = a.cu;
  d.S = a.S;
  d.T = a.T;
  d.q_heads = a.q_heads;
  d.kv_heads = a.kv_heads;
  d.group = a.group;
  d.max_blocks = a.max_blocks;
  d.block_size = a.block_size;
  d.num_blocks = a.num_blocks;
  d.block_shift = std::has_single_bit(unsigned(a.block_size)) ? std::countr_zero(unsigned(a.block_size)) : -1;
  d.qkv_width = a.qkv_width;
  d.out_width = a.out_width;
  d.scale_log2 = a.scale_log2;
  d.one_row_each = one_row_each;
  d.max_parts = decode_parts(a.S, a.kv_heads, a.max_keys);
  LOCKSTEP_CHECK(a.S <= 65535, "attention_paged: the CUDA decode kernel takes at most 65535 sequences, got ", a.S);
  const int items = to_int(tile_bound(a.T, a.S) * a.q_heads, "attention_paged: CTAs");

  auto run = [&](auto dim, auto fp8_cache) {
    constexpr int D = decltype(dim)::value;
    constexpr bool kFp8Cache = decltype(fp8_cache)::value;
    // One-row sequences first: fwd_kernel, which takes the multi-row ones, also overwrites every
    // row with NaN when cu_seqlens_q is malformed, and must come last for that.
    if (a.S > 0 && decode_as_prefill) {
      constexpr auto exact = decode_exact_kernel<D, kFp8Cache>;
      constexpr size_t smem = (kGroupRows + 4 * kTileRows) * D * sizeof(uint16_t);
      allow_dynamic_smem<exact>(smem);
      exact<<<dim3(unsigned(a.kv_heads), unsigned(a.S)), kThreads, smem, current_stream()>>>(a, scales, one_row_each);
      LOCKSTEP_CUDA_CHECK_LAUNCH();
    } else if (a.S > 0) {
      // A grid of at most one CTA an SM requests both ring tiles early (bf16 cache only): at batch 64
      // both in flight was slower (H200, 2026-11-21).
      const bool small_grid = int64_t(d.max_parts) * a.kv_heads * a.S <= device_sm_count();
      auto launch = [&](auto small) {
        constexpr bool kSmallGrid = decltype(small)::value;
        constexpr auto bf16_out = decode_kernel<D, false, kFp8Cache, kSmallGrid>;
        constexpr auto fp8_out = decode_kernel<D, true, kFp8Cache, kSmallGrid>;
        constexpr size_t smem = DecodeSmem<D, kFp8Cache>::kBytes;
        allow_dynamic_smem<bf16_out>(smem);
        allow_dynamic_smem<fp8_out>(smem);
        LaunchConfig(dim3(unsigned(d.max_parts), unsigned(a.kv_heads), unsigned(a.S)), dim3(kThreads), smem,
                     dim3(unsigned(d.max_parts), 1, 1))
            .early_start_in_scope()
            .run(quantized ? fp8_out : bf16_out, d, quantized ? *quantized : QuantizedOut{}, scales);
      };
      if constexpr (kFp8Cache) launch(std::false_type());
      else if (small_grid) launch(std::true_type());
      else launch(std::false_type());
    }
    if (one_row_each) return;  // no multi-row sequence; the decode kernels NaN misplaced rows themselves
    // Persistent CTAs: how many rows belong to multi-row sequences is known only on the device.
    constexpr auto fwd = fwd_kernel<D, true, kFp8Cache>;
    const int resident = resident_blocks<fwd>(kThreads, kFwdSmem<D>);
    fwd<<<std::min(items, resident), kThreads, kFwdSmem<D>, current_stream()>>>(a, scales);
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  };
  with_head_dim(layout.head_dim, [&](auto dim) {
    if (cache.fp8()) run(dim, std::true_type());
    else run(dim, std::false_type());
  });
}

}  // namespace

void attention_paged(Tensor& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                     const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout,
                     bool one_row_each, bool decode_as_prefill) {
  paged(data<uint16_t>(out), nullptr, qkv, cache, block_tables, cu_seqlens_q, context_lens, layout,
        one_row_each, decode_as_prefill);
}

// The quantized output spares the quantize launch after the attention (1.1 µs a layer at batch 1:
// fp8 B = 1 decode 327 / 328 tokens/s against 325 / 326, H200, 2026-11-22); it is used where the
// decode grid fits on the GPU at once: at batch 64 a first version made the kernel slower than
// kernel + quantize (91.9 against 85.7 + 2.6 µs a layer).
bool decode_quantizes_output(int64_t sequences, const HeadLayout& layout, int64_t max_keys) {
  return layout.group() * layout.head_dim % 256 == 0 &&
         sequences * layout.kv_heads * decode_parts(sequences, layout.kv_heads, max_keys) <=
             kDecodeCtasPerSm * int64_t(device_sm_count());
}

void attention_paged_fp8(Fp8Rows& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                         const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout, bool pow2) {
  const QuantizedOut quantized{static_cast<uint8_t*>(out.data.data()), out.scales.data_as<float>(), pow2};
  paged(nullptr, &quantized, qkv, cache, block_tables, cu_seqlens_q, context_lens, layout, true);
}

}  // namespace lockstep::cuda
