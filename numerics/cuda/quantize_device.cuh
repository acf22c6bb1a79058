// numerics/cuda/quantize_device.cuh — the device side of FP8 activation quantization, shared by the
// quantization kernels (numerics/cuda/quantize.cu), the fused producers that quantize what they
// compute without storing it (ops/cuda/rmsnorm.cu, ops/cuda/swiglu.cu) and the AdamW step that
// writes the fp8 weight blocks in its update pass (ops/cuda/adamw.cu, quantize_weight_tile). A producer fills a bf16
// Fragment with its output and hands it to quantize_tile_rows / quantize_tile_columns: the same code
// on the same bf16 values, so fused and unfused give identical bytes and scales.
//
// Work is split into 128×128 tiles (one group wide both ways). A thread holds 8 rows × 16 bytes of a
// tile in registers (Fragment), loaded with 16-byte loads; a half-warp (bf16) or a warp (f32) reads
// one 256/512-byte tile row. Blocks are persistent (persistent_grid) and walk the tiles in row-major
// order with the loads of the next tiles in flight while the current one is processed
// (for_each_tile): these kernels are memory-bound, and what keeps HBM busy is the bytes in flight
// per SM. The loads go through a ring of tiles in shared memory filled by cp.async, which costs no
// registers; a register prefetch one tile ahead was measured against it (docs/benchmarks.md): no
// better than 1 point anywhere, 7–8 points of copy bandwidth worse for the columns and f32 weights.
// Include only from CUDA sources.
#pragma once

#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "core/cp_async.cuh"
#include "core/cuda_check.h"
#include "core/cuda_launch.h"
#include "numerics/quantize.h"
#include "numerics/scale.h"

namespace lockstep::cuda::quant {

constexpr int kTile = 128;  // = kQuantGroup

__device__ __forceinline__ uint32_t component(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Four values times `inv`, rounded to E4M3 (first value in the lowest byte). The instruction is
// quantize_value's (cvt.rn.satfinite.e4m3x2.f32), used two lanes at a time: the same bytes.
__device__ __forceinline__ uint32_t pack4(float a, float b, float c, float d, float inv) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a * inv, b * inv), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c * inv, d * inv), __NV_SATFINITE, __NV_E4M3);
  return lo | hi << 16;
}

// A 4×4 byte transpose: out[j] holds byte j of a, b, c and d (a's in the lowest byte).
__device__ __forceinline__ void transpose4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t (&out)[4]) {
  const uint32_t ab01 = __byte_perm(a, b, 0x5140), ab23 = __byte_perm(a, b, 0x7362);
  const uint32_t cd01 = __byte_perm(c, d, 0x5140), cd23 = __byte_perm(c, d, 0x7362);
  out[0] = __byte_perm(ab01, cd01, 0x5410);
  out[1] = __byte_perm(ab01, cd01, 0x7632);
  out[2] = __byte_perm(ab23, cd23, 0x5410);
  out[3] = __byte_perm(ab23, cd23, 0x7632);
}

// The transposed byte tile in shared memory: tq[c][r] is the byte of tile row r, column c. Its
// 8-byte chunks are XOR-swizzled by (c / 8) % 16: the lanes of a warp write 8 bytes each to
// columns 8 (bf16) or 4 (f32) apart, which without the swizzle would all hit the same banks.
__device__ __forceinline__ int tq_offset(int c, int r) { return c * kTile + ((r / 8) ^ (c / 8 % 16)) * 8; }

// 16 bytes of row c of tq (tile rows 16·j .. 16·j + 15), undoing the swizzle: an odd swizzle
// swaps the two 8-byte halves of a 16-byte chunk.
__device__ __forceinline__ uint4 tq_row16(const uint8_t* tq, int c, int j) {
  const int s = c / 8 % 16;
  const uint4 v = *reinterpret_cast<const uint4*>(tq + c * kTile + (j ^ (s >> 1)) * 16);
  return s & 1 ? make_uint4(v.z, v.w, v.x, v.y) : v;
}

// tq to dst (row c of tq at dst + c * ld): 8 lanes per 128-byte row, so each warp stores 4 lines.
// kPartial: only rows c < rows (a tile cut by the end of the transposed matrix's rows).
template <int kThreads, bool kPartial = false>
__device__ __forceinline__ void store_transposed(const uint8_t* tq, uint8_t* dst, int64_t ld, int rows = kTile) {
#pragma unroll
  for (int n = 0; n < kTile * kTile / 16 / kThreads; ++n) {
    const int i = n * kThreads + threadIdx.x, c = i / 8, j = i % 8;
    if (!kPartial || c < rows) *reinterpret_cast<uint4*>(dst + c * ld + j * 16) = tq_row16(tq, c, j);
  }
}

// The thread's slots in a stage of for_each_tile's ring (shared memory), filled asynchronously one
// 16-byte word at a time: word w of a Tile (an aggregate of uint4 words, such as Fragments) from
// src, or zeros when !valid (src is then any readable address and is not read).
template <int kThreads>
struct StageSlots {
  uint4* first;  // the thread's word 0; word w at first[w * kThreads], so a warp's 16-byte
                 // accesses to one word are consecutive (conflict-free)
  __device__ void operator()(int w, const void* src, bool valid) const {
    cp_async16(first + w * kThreads, src, valid);
  }
};

// A thread's share of a 128×128 tile: 8 consecutive rows × kVec consecutive columns, one 16-byte
// load per row. bf16 (uint16_t): 16 lanes per tile row, 256 threads; f32: 32 lanes, 512 threads.
template <class In>
struct Fragment {
  static constexpr int kVec = 16 / sizeof(In);
  static constexpr int kLanesPerRow = kTile / kVec;
  static constexpr int kRows = 8;
  static constexpr int kThreads = kLanesPerRow * kTile / kRows;
  uint4 raw[kRows];

  __device__ static int row0() { return threadIdx.x / kLanesPerRow * kRows; }
  __device__ static int col0() { return threadIdx.x % kLanesPerRow * kVec; }

  // The thread's share of tile (r_begin, c_begin) of src [rows, ld] to words word0 .. word0 + 7 of
  // its slots `to` (row p to word word0 + p); rows past `rows` read as zeros.
  __device__ static void load(const StageSlots<kThreads>& to, int word0, const In* src, int64_t ld,
                              int64_t rows, int64_t r_begin, int64_t c_begin) {
#pragma unroll
    for (int p = 0; p < kRows; ++p) {
      const int64_t r = r_begin + row0() + p;
      to(word0 + p, r < rows ? src + r * ld + c_begin + col0() : src, r < rows);
    }
  }
  // load of a matrix whose columns end at `cols` (a multiple of kVec) inside the tile: columns
  // past it read as zeros too (a partial group, numerics/quantize.h).
  __device__ static void load_partial(const StageSlots<kThreads>& to, int word0, const In* src, int64_t ld,
                                      int64_t rows, int64_t cols, int64_t r_begin, int64_t c_begin) {
    const bool col_valid = c_begin + col0() < cols;
#pragma unroll
    for (int p = 0; p < kRows; ++p) {
      const int64_t r = r_begin + row0() + p;
      const bool valid = r < rows && col_valid;
      to(word0 + p, valid ? src + r * ld + c_begin + col0() : src, valid);
    }
  }

  // The value at (row p, column c) widened to fp32 (exact: bf16 is the upper half of an fp32).
  __device__ float at(int p, int c) const {
    if constexpr (kVec == 4) {
      return __uint_as_float(component(raw[p], c));
    } else {
      const uint32_t w = component(raw[p], c / 2);
      return __uint_as_float(c % 2 ? w & 0xffff0000u : w << 16);
    }
  }

  // Magnitudes: m maxed with the magnitudes of a 32-bit word's values, compared as integers like
  // abs_bits does (NaN above infinity). A bf16's magnitude bits order like its fp32's, so bf16
  // values are compared two at a time (max.u16x2) and only widened by unpack_magnitude.
  __device__ static uint32_t max_magnitude(uint32_t m, uint32_t word) {
    if constexpr (kVec == 4) return max(m, word & 0x7fffffffu);
    else return __vmaxu2(m, word & 0x7fff7fffu);
  }
  __device__ static uint32_t unpack_magnitude(uint32_t m) {
    if constexpr (kVec == 4) return m;
    else return max(m << 16, m & 0xffff0000u);
  }

  __device__ uint32_t row_amax(int p) const {
    uint32_t m = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) m = max_magnitude(m, component(raw[p], w));
    return unpack_magnitude(m);
  }
  __device__ uint32_t amax() const {
    uint32_t m = 0;
#pragma unroll
    for (int p = 0; p < kRows; ++p)
#pragma unroll
      for (int w = 0; w < 4; ++w) m = max_magnitude(m, component(raw[p], w));
    return unpack_magnitude(m);
  }

  // Bytes of row p, columns 4·i .. 4·i + 3, quantized with `inv`.
  __device__ uint32_t pack(int p, int i, float inv) const {
    return pack4(at(p, 4 * i), at(p, 4 * i + 1), at(p, 4 * i + 2), at(p, 4 * i + 3), inv);
  }
  // Row p quantized, to dst (the row's first column): kVec bytes.
  __device__ void store_row(uint8_t* dst, int p, float inv) const {
    if constexpr (kVec == 4) *reinterpret_cast<uint32_t*>(dst) = pack(p, 0, inv);
    else *reinterpret_cast<uint2*>(dst) = make_uint2(pack(p, 0, inv), pack(p, 1, inv));
  }
  // Column c quantized (8 bytes, one per row), into the transposed tile.
  __device__ void store_column(uint8_t* tq, int c, float inv) const {
    *reinterpret_cast<uint2*>(tq + tq_offset(col0() + c, row0())) =
        make_uint2(pack4(at(0, c), at(1, c), at(2, c), at(3, c), inv),
                   pack4(at(4, c), at(5, c), at(6, c), at(7, c), inv));
  }
  // One scale for the whole fragment: each value is quantized once, its bytes stored to the
  // rows at dst (row p at dst + p * ld; kPartial: rows p < valid_rows only) and, transposed in
  // registers, to tq's columns.
  template <bool kPartial = false>
  __device__ void store_rows_and_columns(uint8_t* dst, int64_t ld, uint8_t* tq, float inv,
                                         int64_t valid_rows = kRows) const {
    uint32_t rows[kRows][kVec / 4];
#pragma unroll
    for (int p = 0; p < kRows; ++p) {
#pragma unroll
      for (int i = 0; i < kVec / 4; ++i) rows[p][i] = pack(p, i, inv);
      if (kPartial && p >= valid_rows) continue;
      if constexpr (kVec == 4) *reinterpret_cast<uint32_t*>(dst + p * ld) = rows[p][0];
      else *reinterpret_cast<uint2*>(dst + p * ld) = make_uint2(rows[p][0], rows[p][1]);
    }
#pragma unroll
    for (int i = 0; i < kVec / 4; ++i) {
      uint32_t top[4], bottom[4];  // columns 4·i + j: bytes of rows 0–3 and of rows 4–7
      transpose4(rows[0][i], rows[1][i], rows[2][i], rows[3][i], top);
      transpose4(rows[4][i], rows[5][i], rows[6][i], rows[7][i], bottom);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        *reinterpret_cast<uint2*>(tq + tq_offset(col0() + 4 * i + j, row0())) = make_uint2(top[j], bottom[j]);
    }
  }
};

using Bf16 = Fragment<uint16_t>;

// ---- The tile loop --------------------------------------------------------------------------

// Bytes of dynamic shared memory for_each_tile's ring of kStages tiles takes.
template <class Tile, int kThreads>
constexpr size_t ring_bytes(int stages) {
  return size_t(stages) * sizeof(Tile) * kThreads;
}

// Calls process(tile, r_begin, c_begin) on every 128×128 tile of a [rows, cols] matrix that falls
// to this block (tiles b, b + gridDim.x, ... in row-major order, so the blocks in flight read one
// contiguous band); load(slots, r_begin, c_begin) puts the thread's share of a tile into `slots`
// (StageSlots<kThreads>). The loads run ahead of the processing, so that the memory never waits for
// the arithmetic: `ring` (dynamic shared memory, ring_bytes<Tile, kThreads>(kStages)) holds the next
// kStages tiles, filled by cp.async: kStages tiles in flight a block while the current one, copied
// into registers, is processed, for one Tile of registers. Each thread copies and reads back only
// its own words, so the ring needs no block barrier.
// Every thread of the block calls it. process may modify its tile.
template <class Tile, int kThreads, int kStages, class Load, class Process>
__device__ __forceinline__ void for_each_tile(int64_t rows, int64_t cols, uint4* ring, Load&& load,
                                              Process&& process) {
  static_assert(sizeof(Tile) % sizeof(uint4) == 0 && kStages >= 1);
  const int64_t tiles_c = cols / kTile, tiles = (rows + kTile - 1) / kTile * tiles_c;
  const int64_t stride = gridDim.x;
  int64_t tile = blockIdx.x;
  if (tile >= tiles) return;  // the whole block
  const auto row_of = [&](int64_t t) { return t / tiles_c * kTile; };
  const auto col_of = [&](int64_t t) { return t % tiles_c * kTile; };
  constexpr int kWords = sizeof(Tile) / sizeof(uint4);
  uint4* const mine = ring + threadIdx.x;
  // One commit per tile, empty past the last, so that "all but the newest kStages - 1 groups
  // complete" always means "the oldest tile has landed".
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    const int64_t t = tile + s * stride;
    if (t < tiles) load(StageSlots<kThreads>{mine + s * kWords * kThreads}, row_of(t), col_of(t));
    cp_async_commit();
  }
  for (int s = 0; tile < tiles; tile += stride, s = s + 1 == kStages ? 0 : s + 1) {
    cp_async_wait<kStages - 1>();
    uint4* const stage = mine + s * kWords * kThreads;
    Tile cur;
#pragma unroll
    for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(&cur)[w] = stage[w * kThreads];
    __syncwarp();  // orders this thread's reads of the stage before the refill's writes to it
    const int64_t refill = tile + kStages * stride;
    if (refill < tiles) load(StageSlots<kThreads>{stage}, row_of(refill), col_of(refill));
    cp_async_commit();
    process(cur, row_of(tile), col_of(tile));
  }
}

// Enough persistent blocks to fill the device (core/cuda_launch.h), capped by the work; `smem` is a
// constant of the kernel.
template <auto kKernel>
unsigned persistent_grid(int threads, size_t smem, int64_t tiles) {
  return unsigned(std::min(tiles, int64_t(resident_blocks<kKernel>(threads, smem))));
}

// ---- Quantizing a tile ------------------------------------------------------------------------

// Rowwise 1×128 quantization of tile (t0, k0) of a bf16 activation [T, K], held in f by all
// Bf16::kThreads threads of the block: bytes to q [T, K], scales to s [K/128, T]. Tile rows past T
// are quantized but not stored. (A K with a partial group: K here is the stored width, and f holds
// zeros past the valid columns, which are stored as the padding.)
__device__ __forceinline__ void quantize_tile_rows(const Bf16& f, int64_t t0, int64_t k0, int64_t T,
                                                   int64_t K, uint8_t* q, float* s, bool pow2) {
  // A token's group is one half-warp's 16 lanes, which share 8 tokens. The 8 token maxima are
  // reduce-scattered over the half-warp: each exchange (lanes 8, 4, 2 apart) halves the tokens a
  // lane holds, the lane with the bit set keeping the upper half, and a last one (lanes 1 apart)
  // completes the max, so lanes 2j and 2j + 1 end with token j's: 8 shuffles in all. Each lane
  // then computes its token's scale (two divisions) and the inverses are passed around.
  const int tid = threadIdx.x, r0 = Bf16::row0(), c0 = Bf16::col0();
  const int lane = tid % 16, first = tid & 16;
  uint32_t m[Bf16::kRows];
#pragma unroll
  for (int p = 0; p < Bf16::kRows; ++p) m[p] = f.row_amax(p);
#pragma unroll
  for (int n = Bf16::kRows / 2; n >= 1; n /= 2) {
    const bool upper = lane & (2 * n);
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const uint32_t keep = upper ? m[i + n] : m[i], send = upper ? m[i] : m[i + n];
      m[i] = max(keep, __shfl_xor_sync(0xffffffffu, send, 2 * n));
    }
  }
  const uint32_t amax = max(m[0], __shfl_xor_sync(0xffffffffu, m[0], 1));
  const float scale = group_scale(amax, pow2), inv = inverse_scale(scale);
#pragma unroll
  for (int p = 0; p < Bf16::kRows; ++p) {
    const float row_inv = __shfl_sync(0xffffffffu, inv, first + 2 * p);
    if (t0 + r0 + p < T) f.store_row(q + (t0 + r0 + p) * K + k0 + c0, p, row_inv);
  }
  if (lane % 2 == 0 && t0 + r0 + lane / 2 < T) s[k0 / kTile * T + t0 + r0 + lane / 2] = scale;
}

// Without a columnwise copy (inference), up to kRowsOnlyT token rows take rows-only kernels without
// the tile loop: one thread holds one 8-value vector of a token row, and the 16 lanes of each
// half-warp one 128-value group, in order. At T ≤ 64 a 128×128 tile is mostly padding rows, whose
// work (and persistent grid) dominated (ncu of decode steps, H200, 2026-11-21); at batch 256 the
// tile kernels had 2 row tiles, too few CTAs to stream their bytes (the SwiGLU's at 1.2 TB/s,
// docs/results/decode_trace_b256_fp8_h200_2026-11-22.txt): with the rows kernels up to 256 rows
// instead of 64, fp8 decode at B = 128 ran 2.9% faster, at B = 256 0.7% (H200, 2026-11-22,
// docs/results/rollout_rows_only_256_h200_2026-11-22.txt).
constexpr int64_t kRowsOnlyT = 256;
constexpr int kSmallThreads = 128;  // a block of the small-T kernels: more blocks, more SMs at T = 1

// Blocks of kSmallThreads for `vectors` 8-wide vectors, one a thread.
inline unsigned small_grid(int64_t vectors) { return unsigned((vectors + kSmallThreads - 1) / kSmallThreads); }

// Rowwise 1×128 quantization of the group held by this half-warp, 8 bf16 values a lane in raw (lane
// i % 16 holds the group's values 8·(i % 16) ..): the lane's 8 bytes to q, the group's scale to *s
// (by the group's first lane). The amax, scale and bytes are quantize_tile_rows's (the same helpers
// on the same values; a maximum does not depend on the order). Every lane of the warp calls it; a
// half-warp without a group passes valid = false and stores nothing.
__device__ __forceinline__ void quantize_vector_rows(const uint4& raw, bool valid, uint8_t* q, float* s,
                                                     bool pow2) {
  uint32_t m = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w) m = Bf16::max_magnitude(m, component(raw, w));
  m = Bf16::unpack_magnitude(m);
#pragma unroll
  for (int o = 8; o >= 1; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float scale = group_scale(m, pow2), inv = inverse_scale(scale);
  if (!valid) return;
  Bf16 f;
  f.raw[0] = raw;
  f.store_row(q, 0, inv);
  if (threadIdx.x % 16 == 0) *s = scale;
}

// Shared memory of quantize_tile_columns.
struct ColumnScratch {
  alignas(16) uint8_t tq[kTile * kTile];
  alignas(16) uint32_t col_partial[Bf16::kThreads / 32][kTile / 2];  // magnitudes, 2 features a word
  alignas(16) float col_inv[kTile];
};

// Columnwise 128×1 quantization of tile (t0, k0) of a bf16 activation [T, K] held in f (tile rows
// past T must hold zeros: the padding): bytes to qt [K, Tp], scales to st [Tp/128, K]. Every thread
// of the block calls it (it synchronizes the block). kPartial: K ends inside the tile; its features
// past K (zeros in f) are neither stored nor given a scale.
template <bool kPartial = false>
__device__ __forceinline__ void quantize_tile_columns(const Bf16& f, int64_t t0, int64_t k0, int64_t K,
                                                      int64_t Tp, uint8_t* qt, float* st, bool pow2,
                                                      ColumnScratch& scratch) {
  // Column magnitudes: the thread's 8 rows, its partner half-warp's (lane ^ 16), then the
  // warps through shared memory; 128 threads turn the 128 column maxima into scales.
  constexpr int kWarps = Bf16::kThreads / 32;
  const int tid = threadIdx.x, c0 = Bf16::col0();
  uint32_t m[4] = {0, 0, 0, 0};
#pragma unroll
  for (int p = 0; p < Bf16::kRows; ++p)
#pragma unroll
    for (int w = 0; w < 4; ++w) m[w] = Bf16::max_magnitude(m[w], component(f.raw[p], w));
#pragma unroll
  for (int w = 0; w < 4; ++w) m[w] = __vmaxu2(m[w], __shfl_xor_sync(0xffffffffu, m[w], 16));
  if (tid % 32 < 16)
    *reinterpret_cast<uint4*>(&scratch.col_partial[tid / 32][c0 / 2]) = make_uint4(m[0], m[1], m[2], m[3]);
  __syncthreads();
  if (tid < kTile) {
    uint32_t pair = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) pair = __vmaxu2(pair, scratch.col_partial[w][tid / 2]);
    const float scale = group_scale(tid % 2 ? pair & 0xffff0000u : pair << 16, pow2);
    scratch.col_inv[tid] = inverse_scale(scale);
    if (!kPartial || k0 + tid < K) st[t0 / kTile * K + k0 + tid] = scale;
  }
  __syncthreads();
#pragma unroll
  for (int c = 0; c < Bf16::kVec; ++c) f.store_column(scratch.tq, c, scratch.col_inv[c0 + c]);
  __syncthreads();
  store_transposed<Bf16::kThreads, kPartial>(scratch.tq, qt + k0 * Tp + t0, Tp, (K - k0 < kTile ? int(K - k0) : kTile));
}

template <int kWarps>
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* scratch /* [kWarps] */) {
  v = __reduce_max_sync(0xffffffffu, v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) m = max(m, scratch[i]);
  return m;
}

// Where quantize_weight_tile writes: an Fp8Weight's pointers (W [N, K] and Wᵀ [K, N]).
struct Fp8WeightOut {
  uint8_t* q;    // W's bytes [N, K]
  float* s;      // W's scales, rows of ld_s
  int64_t ld_s;
  uint8_t* qt;   // Wᵀ's bytes [K, N]
  float* st;     // Wᵀ's scales, rows of ld_st
  int64_t ld_st;
};

inline Fp8WeightOut fp8_weight_out(Fp8Weight& w) {
  return {static_cast<uint8_t*>(w.w.data.data()), w.w.scales.data_as<float>(), w.w.scales.dim(1),
          static_cast<uint8_t*>(w.wt.data.data()), w.wt.scales.data_as<float>(), w.wt.scales.dim(1)};
}

// The block (n0, k0) of W [N, K], held by the CTA's fragments f, quantized with one scale: its
// bytes to W and (through tq) to Wᵀ, its scale to both tables, and a scale row's zero padding by
// the row's last block. Every thread of the CTA (Fragment<In>::kThreads) calls it; it synchronizes
// the CTA, and the caller may reuse tq and warp_max (Fragment<In>::kThreads / 32 words) afterwards
// only past its next __syncthreads.
// kPartial: N or K may end inside the block (f holds zeros past them, Fragment::load_partial): W is
// stored [N, Kp] and Wᵀ [K, Np] (numerics/quantize.h), the block's rows past N are not stored to
// W nor its columns past K to Wᵀ, and its padding columns are (quantized zeros).
template <class In, bool kPartial = false>
__device__ __forceinline__ void quantize_weight_tile(const Fragment<In>& f, int64_t n0, int64_t k0,
                                                     int64_t N, int64_t K, const Fp8WeightOut& out,
                                                     bool pow2, uint8_t* tq, uint32_t* warp_max) {
  using Frag = Fragment<In>;
  const int64_t Kp = kPartial ? (K + kTile - 1) / kTile * kTile : K;
  const int64_t Np = kPartial ? (N + kTile - 1) / kTile * kTile : N;
  const float scale = group_scale(block_max<Frag::kThreads / 32>(f.amax(), warp_max), pow2);
  const float inv = inverse_scale(scale);
  f.template store_rows_and_columns<kPartial>(out.q + (n0 + Frag::row0()) * Kp + k0 + Frag::col0(), Kp, tq,
                                              inv, N - n0 - Frag::row0());
  if (threadIdx.x == 0) {
    out.s[n0 / kTile * out.ld_s + k0 / kTile] = scale;
    out.st[k0 / kTile * out.ld_st + n0 / kTile] = scale;
    // Scale rows are padded to 4 blocks with zeros; a row's last block writes them.
    if (k0 + kTile == Kp)
      for (int64_t b = Kp / kTile; b < out.ld_s; ++b) out.s[n0 / kTile * out.ld_s + b] = 0;
    if (n0 + kTile == Np)
      for (int64_t b = Np / kTile; b < out.ld_st; ++b) out.st[k0 / kTile * out.ld_st + b] = 0;
  }
  __syncthreads();
  store_transposed<Frag::kThreads, kPartial>(tq, out.qt + k0 * Np + n0, Np, (K - k0 < kTile ? int(K - k0) : kTile));
}

}  // namespace lockstep::cuda::quant
