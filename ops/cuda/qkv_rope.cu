// ops/cuda/qkv_rope.cu — CUDA qkv_rope (ops/qkv_rope.h) for bf16 activations.
//
// A head is handled by a group of G lanes of one warp, G = the power of two ≥ head_dim / 16:
// lane j < head_dim / 16 of the group holds columns [8j, 8j + 8) of the head's first half and the
// same columns of its second half (the pairs RoPE rotates together), one 16-byte load each; the
// head's sums (RMSNorm) are butterfly shuffles within the group. A CTA takes whole token rows: it
// computes their cos/sin once into shared memory (one double sincos per angle, as the contract says,
// shared by all the row's heads), then its groups walk the rows' heads, coalesced (a warp reads
// 32/G consecutive heads). The forward at decode sizes (T ≤ kSmallT) instead spreads a row's heads
// over CTAs, one head a group, each CTA computing the row's table (the same code: the same bits).
// The math is the CPU reference's in fp32, rounded once to bf16 at the store; only the order of a
// head's sums and FMA contraction differ (a few fp32 ulps).
//
// dq_norm / dk_norm, deterministically (no float atomics): each thread sums its columns' dy·x̂ over
// the heads it handled, in order; the CTA adds its threads in a fixed order into one partial row;
// a second kernel adds the partial rows in a fixed order. A CTA always takes kBackwardRows rows,
// so the result depends on T only, not on the device.
//
// Positions are not read on the host: a negative one (invalid) rotates by NaN, so its row's q and k
// (and their gradients, and through them dq_norm / dk_norm) are NaN.
//
// The inference form stores each k and v head's output bits a second time, to the token's cache
// slot, as kv_cache_write (ops/cuda/attention.cu) does, or quantized (an e4m3 cache, ops/kv_fp8.h):
// a slot outside the cache is skipped.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_launch.h"
#include "core/cuda_stream.h"
#include "core/dependent_launch.cuh"
#include "ops/cuda/kv_fp8.cuh"
#include "ops/qkv_rope_backends.h"

namespace lockstep::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 256;
constexpr int kBackwardRows = 4;  // 4× fewer partial rows to add than one row a CTA
// Up to here (decode) the forward spreads a token's heads over CTAs. At 256 rather than 64 since
// 2026-11-22: a batch-256 decode step took the row kernel (256 CTAs, no early start) 5.1 µs a layer.
constexpr int64_t kSmallT = 256;

// This thread's place: lane j of group `index` (G lanes, aligned within the warp), one of `count`
// groups in the CTA. Lanes j ≥ head_dim / 16 (where G rounds up) hold zeros and store nothing.
struct Group {
  int G, j, index, count;
  unsigned mask;
  bool active;

  __device__ Group(int G_, int head_dim)
      : G(G_), j(int(threadIdx.x) % G_), index(int(threadIdx.x) / G_), count(kThreads / G_),
        mask((0xffffffffu >> (32 - G_)) << (threadIdx.x % 32 / G_ * G_)), active(j < head_dim / 16) {}

  // Σ v over the group's lanes. Butterfly: both lanes of a pair add the same two values (a + b is
  // b + a), so every lane ends with the same bits.
  __device__ float sum(float v) const {
    for (int o = 1; o < G; o <<= 1) v += __shfl_xor_sync(mask, v, o);
    return v;
  }
  __device__ uint32_t max(uint32_t v) const {
    for (int o = 1; o < G; o <<= 1) v = ::max(v, __shfl_xor_sync(mask, v, o));
    return v;
  }
};

// 8 bf16 of one 16-byte word widened to fp32 (exact).
__device__ __forceinline__ void unpack8(const uint4& u, float (&x)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[2 * k] = __uint_as_float(w[k] << 16);
    x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

// 8 bf16 (one 16-byte load) widened to fp32.
__device__ __forceinline__ void load8(const uint16_t* src, float (&x)[8]) {
  unpack8(*reinterpret_cast<const uint4*>(src), x);
}

// 8 fp32 values (two 16-byte loads: norm weights, cos/sin tables).
__device__ __forceinline__ void load8(const float* src, float (&x)[8]) {
  const float4 lo = *reinterpret_cast<const float4*>(src);
  const float4 hi = *reinterpret_cast<const float4*>(src + 4);
  x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
}

// 8 values rounded to bf16 (nearest even, as the CPU's write_f32), as one 16-byte word.
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = float_to_bf16(x[2 * k]).bits | uint32_t(float_to_bf16(x[2 * k + 1]).bits) << 16;
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void store8(uint16_t* dst, const float (&x)[8]) {
  *reinterpret_cast<uint4*>(dst) = pack8(x);
}

__device__ __forceinline__ void copy8(uint16_t* dst, const uint16_t* src) {
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}

// cos and sin of the rotation angles of rows row0 .. row0 + rows − 1 (row r's at [r·half, r·half +
// half)), as ops/qkv_rope.h states. All threads of the CTA take part; sync before reading.
__device__ void rope_tables(const int32_t* positions, const float* inv_freq, int64_t row0, int rows,
                            int half, float* cos_t, float* sin_t) {
  for (int i = threadIdx.x; i < rows * half; i += kThreads) {
    const int32_t position = positions[row0 + i / half];
    const float angle = float(position) * inv_freq[i % half];
    double s, c;
    sincos(double(angle), &s, &c);
    const float nan = bits_float(0x7fc00000u);
    cos_t[i] = position < 0 ? nan : float(c);
    sin_t[i] = position < 0 ? nan : float(s);
  }
}

// (a[k], b[k]) -> (a·c − b·s, b·c + a·s); the inverse rotation (the backward) negates s.
template <bool kInverse>
__device__ __forceinline__ void rotate(float (&a)[8], float (&b)[8], const float* cos_row,
                                       const float* sin_row) {
  float c[8], s[8];
  load8(cos_row, c);
  load8(sin_row, s);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float x = a[k], y = b[k], sk = kInverse ? -s[k] : s[k];
    a[k] = x * c[k] - y * sk;
    b[k] = y * c[k] + x * sk;
  }
}

// The forward kernels' arguments.
struct ForwardArgs {
  const uint16_t* qkv;
  uint16_t* out;
  float* rstd;  // null without the norm
  const int32_t* positions;
  const float* inv_freq;
  const float* q_norm;
  const float* k_norm;
  int q_heads, kv_heads, head_dim, G;
  float eps;
  // The inference form's cache [capacity, kv_heads, head_dim] each (bf16; or e4m3, with the scales
  // below), and each row's slot; null without.
  void* k_cache;
  void* v_cache;
  const int32_t* slots;
  int64_t capacity;
  float* k_scale;  // an e4m3 cache's scales [capacity, kv_heads] (the last fields: the bf16 kernels
  float* v_scale;  // compile as before)
};

// A lane's two chunks (columns [8j, 8j + 8) of each half) of kv head g of token t, as out holds
// them, to the token's slot of a bf16 `cache` when the op has a cache and the slot is inside it.
__device__ __forceinline__ void write_cache(const ForwardArgs& args, void* cache, int64_t t, int g,
                                            int j, const uint4& lo, const uint4& hi) {
  if (cache == nullptr) return;
  const int64_t slot = args.slots[t];
  if (slot < 0 || slot >= args.capacity) return;
  uint16_t* dst = static_cast<uint16_t*>(cache) + (slot * args.kv_heads + g) * args.head_dim + 8 * j;
  *reinterpret_cast<uint4*>(dst) = lo;
  *reinterpret_cast<uint4*>(dst + args.head_dim / 2) = hi;
}

// The same into an e4m3 cache, quantized by ops/kv_fp8.h's rule (the head's amax over the group's
// lanes; zeros in inactive lanes): the k (is_k) or v cache and its scales. Every lane of the group
// calls it.
__device__ __forceinline__ void write_cache_fp8(const ForwardArgs& args, const Group& group, bool is_k, int64_t t,
                                                int g, const uint4& lo, const uint4& hi) {
  const int64_t slot = args.slots[t];
  if (slot < 0 || slot >= args.capacity) return;
  const int64_t head = slot * args.kv_heads + g;
  const float scale = kv_fp8_scale(group.max(max(kv_fp8::amax8(lo), kv_fp8::amax8(hi))));
  const float inv = inverse_scale(scale);
  if (group.active) {
    uint8_t* dst = static_cast<uint8_t*>(is_k ? args.k_cache : args.v_cache) + head * args.head_dim + 8 * group.j;
    *reinterpret_cast<uint2*>(dst) = kv_fp8::quantize8(lo, inv);
    *reinterpret_cast<uint2*>(dst + args.head_dim / 2) = kv_fp8::quantize8(hi, inv);
  }
  if (group.j == 0) (is_k ? args.k_scale : args.v_scale)[head] = scale;
}

// Head h of token t, whose group lane holds the raw bf16 of its columns [8j, 8j + 8) of each half in
// ra and rb (zeros in inactive lanes): a q or k head normalized (kNorm) and rotated with the token's
// cos/sin table, a v head copied; to out at col (and its rstd; k and v heads to the cache too).
// Every lane of the group calls it.
template <bool kNorm, bool kFp8Cache>
__device__ __forceinline__ void forward_head(const ForwardArgs& args, const Group& group, int64_t t, int h,
                                             int64_t col, const uint4& ra, const uint4& rb,
                                             const float* cos_t, const float* sin_t) {
  const int half = args.head_dim / 2, qk_heads = args.q_heads + args.kv_heads;
  if (h >= qk_heads) {  // a v head: copied
    if (group.active) {
      *reinterpret_cast<uint4*>(args.out + col) = ra;
      *reinterpret_cast<uint4*>(args.out + col + half) = rb;
      if constexpr (!kFp8Cache) write_cache(args, args.v_cache, t, h - qk_heads, group.j, ra, rb);
    }
    if constexpr (kFp8Cache) write_cache_fp8(args, group, false, t, h - qk_heads, ra, rb);
    return;
  }
  float a[8], b[8];
  unpack8(ra, a);
  unpack8(rb, b);
  if constexpr (kNorm) {
    float squares = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) squares += a[k] * a[k] + b[k] * b[k];
    const float r = 1.0f / sqrtf(group.sum(squares) / float(args.head_dim) + args.eps);
    if (group.active) {
      const float* w = (h < args.q_heads ? args.q_norm : args.k_norm) + 8 * group.j;
      float wa[8], wb[8];
      load8(w, wa);
      load8(w + half, wb);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        a[k] = a[k] * r * wa[k];
        b[k] = b[k] * r * wb[k];
      }
    }
    if (group.j == 0) args.rstd[t * qk_heads + h] = r;
  }
  if constexpr (kFp8Cache) {
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (group.active) {
      rotate<false>(a, b, cos_t + 8 * group.j, sin_t + 8 * group.j);
      lo = pack8(a), hi = pack8(b);
      *reinterpret_cast<uint4*>(args.out + col) = lo;
      *reinterpret_cast<uint4*>(args.out + col + half) = hi;
    }
    if (h >= args.q_heads) write_cache_fp8(args, group, true, t, h - args.q_heads, lo, hi);
  } else if (group.active) {
    rotate<false>(a, b, cos_t + 8 * group.j, sin_t + 8 * group.j);
    const uint4 lo = pack8(a), hi = pack8(b);
    *reinterpret_cast<uint4*>(args.out + col) = lo;
    *reinterpret_cast<uint4*>(args.out + col + half) = hi;
    if (h >= args.q_heads) write_cache(args, args.k_cache, t, h - args.q_heads, group.j, lo, hi);
  }
}

// The raw bf16 of a head's two column chunks for this lane (zeros where it has none).
__device__ __forceinline__ void load_head(const ForwardArgs& args, int64_t col, bool load, uint4& ra, uint4& rb) {
  ra = rb = make_uint4(0, 0, 0, 0);
  if (!load) return;
  ra = *reinterpret_cast<const uint4*>(args.qkv + col);
  rb = *reinterpret_cast<const uint4*>(args.qkv + col + args.head_dim / 2);
}

// One token row a CTA (T > kSmallT): its groups walk the row's heads.
template <bool kNorm, bool kFp8Cache = false>
__global__ void __launch_bounds__(kThreads) qkv_rope_forward_kernel(ForwardArgs args) {
  __shared__ alignas(16) float cos_t[kMaxHeadDim / 2], sin_t[kMaxHeadDim / 2];
  const int64_t t = blockIdx.x;
  const int heads = args.q_heads + 2 * args.kv_heads;
  rope_tables(args.positions, args.inv_freq, t, 1, args.head_dim / 2, cos_t, sin_t);
  __syncthreads();
  const Group group(args.G, args.head_dim);
  for (int h = group.index; h < heads; h += group.count) {
    const int64_t col = (t * heads + h) * args.head_dim + 8 * group.j;  // the second half at col + half
    uint4 ra, rb;
    load_head(args, col, group.active, ra, rb);
    forward_head<kNorm, kFp8Cache>(args, group, t, h, col, ra, rb, cos_t, sin_t);
  }
}

// T ≤ kSmallT (decode): one head a group, grid (T, ⌈heads / groups a CTA⌉), so that a token's heads
// spread over CTAs (one CTA a token left T = 1 on one SM, each group walking two heads in turn), and
// the head's loads are issued before the table's sincos and overlap it.
template <bool kNorm, bool kFp8Cache = false>
__global__ void __launch_bounds__(kThreads) qkv_rope_forward_heads_kernel(ForwardArgs args) {
  __shared__ alignas(16) float cos_t[kMaxHeadDim / 2], sin_t[kMaxHeadDim / 2];
  const int64_t t = blockIdx.x;
  const int heads = args.q_heads + 2 * args.kv_heads;
  const Group group(args.G, args.head_dim);
  const int h = int(blockIdx.y) * group.count + group.index;
  const int64_t col = (t * heads + h) * args.head_dim + 8 * group.j;
  // Launched with an early start in decode steps (core/early_start.h): the token's sincos table
  // (from its position, a step input no kernel of the step writes) is made while the kernel before
  // still runs; its output, this kernel's input, is read after the wait.
  rope_tables(args.positions, args.inv_freq, t, 1, args.head_dim / 2, cos_t, sin_t);
  wait_for_previous_kernel();
  let_next_kernel_start();
  uint4 ra, rb;
  load_head(args, col, h < heads && group.active, ra, rb);
  __syncthreads();
  if (h < heads) forward_head<kNorm, kFp8Cache>(args, group, t, h, col, ra, rb, cos_t, sin_t);  // whole groups
}

// kBackwardRows token rows a CTA. With kNorm, writes the CTA's Σ dy·x̂ to partial[blockIdx.x]:
// [0, head_dim) over its q heads, [head_dim, 2·head_dim) over its k heads.
template <bool kNorm>
__global__ void __launch_bounds__(kThreads) qkv_rope_backward_kernel(
    const uint16_t* __restrict__ dout, const uint16_t* __restrict__ qkv, uint16_t* __restrict__ dqkv,
    const float* __restrict__ rstd, const int32_t* __restrict__ positions,
    const float* __restrict__ inv_freq, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float* __restrict__ partial, int64_t T, int q_heads,
    int kv_heads, int head_dim, int G) {
  __shared__ alignas(16) float cos_t[kBackwardRows * kMaxHeadDim / 2];
  __shared__ alignas(16) float sin_t[kBackwardRows * kMaxHeadDim / 2];
  const int64_t row0 = int64_t(blockIdx.x) * kBackwardRows;
  const int rows = int(min(int64_t(kBackwardRows), T - row0));
  const int half = head_dim / 2, qk_heads = q_heads + kv_heads, heads = qk_heads + kv_heads;
  rope_tables(positions, inv_freq, row0, rows, half, cos_t, sin_t);
  __syncthreads();
  const Group group(G, head_dim);
  // Σ dy·x̂ of this lane's columns over its q heads and its k heads: [0, 8) first half, [8, 16) second.
  float dq[16] = {}, dk[16] = {};
  for (int r = 0; r < rows; ++r) {
    const int64_t t = row0 + r;
    for (int h = group.index; h < heads; h += group.count) {
      const int64_t col = (t * heads + h) * head_dim + 8 * group.j;
      if (h >= qk_heads) {  // a v head: the gradient passes through
        if (group.active) {
          copy8(dqkv + col, dout + col);
          copy8(dqkv + col + half, dout + col + half);
        }
        continue;
      }
      float a[8] = {}, b[8] = {};  // the gradient of the head before its rotation
      if (group.active) {
        load8(dout + col, a);
        load8(dout + col + half, b);
        rotate<true>(a, b, cos_t + r * half + 8 * group.j, sin_t + r * half + 8 * group.j);
      }
      if constexpr (kNorm) {
        // ops/cpu/rms_row.h's rms_normalize_backward: x̂ = x·rstd, dw += g·x̂, g ← w·g,
        // dx = rstd·(g − x̂·mean(x̂·g)).
        const float r_std = rstd[t * qk_heads + h];
        const bool is_q = h < q_heads;
        float xa[8] = {}, xb[8] = {}, dot = 0;
        if (group.active) {
          load8(qkv + col, xa);
          load8(qkv + col + half, xb);
          const float* w = (is_q ? q_norm : k_norm) + 8 * group.j;
          float wa[8], wb[8];
          load8(w, wa);
          load8(w + half, wb);
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            xa[k] *= r_std;
            xb[k] *= r_std;
            if (is_q) {
              dq[k] += a[k] * xa[k];
              dq[8 + k] += b[k] * xb[k];
            } else {
              dk[k] += a[k] * xa[k];
              dk[8 + k] += b[k] * xb[k];
            }
            a[k] *= wa[k];
            b[k] *= wb[k];
            dot += xa[k] * a[k] + xb[k] * b[k];
          }
        }
        const float mean = group.sum(dot) / float(head_dim);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          a[k] = r_std * (a[k] - xa[k] * mean);
          b[k] = r_std * (b[k] - xb[k] * mean);
        }
      }
      if (group.active) {
        store8(dqkv + col, a);
        store8(dqkv + col + half, b);
      }
    }
  }
  if constexpr (kNorm) {
    // The warp's groups hold the same columns: a butterfly over them, then the warps in order.
    __shared__ alignas(16) float warp_sums[kThreads / 32][2 * kMaxHeadDim];
    for (int o = G; o < 32; o <<= 1)
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        dq[i] += __shfl_xor_sync(0xffffffffu, dq[i], o);
        dk[i] += __shfl_xor_sync(0xffffffffu, dk[i], o);
      }
    float* sums = warp_sums[threadIdx.x / 32];
    if (group.index % (32 / G) == 0 && group.active) {  // the warp's first group
      float* q = sums + 8 * group.j;
      float* k = sums + head_dim + 8 * group.j;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        q[i] = dq[i];
        q[half + i] = dq[8 + i];
        k[i] = dk[i];
        k[half + i] = dk[8 + i];
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * head_dim; c += kThreads) {
      float sum = 0;
      for (int w = 0; w < kThreads / 32; ++w) sum += warp_sums[w][c];
      partial[int64_t(blockIdx.x) * 2 * head_dim + c] = sum;
    }
  }
}

// dq_norm[c] += Σ_b partial[b][c], dk_norm[c] += Σ_b partial[b][head_dim + c], in a fixed order:
// lane c of warp w sums the rows b ≡ w (mod 32) in order, then warp 0 adds the 32 warps' sums.
// 32 partial columns a CTA.
__global__ void __launch_bounds__(1024) add_partials_kernel(const float* __restrict__ partial,
                                                            int64_t blocks, int head_dim,
                                                            float* __restrict__ dq_norm,
                                                            float* __restrict__ dk_norm) {
  __shared__ float sums[32][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c = blockIdx.x * 32 + lane;  // < 2·head_dim: head_dim is a multiple of 16
  float sum = 0;
  for (int64_t b = warp; b < blocks; b += 32) sum += partial[b * 2 * head_dim + c];
  sums[warp][lane] = sum;
  __syncthreads();
  if (warp != 0) return;
  float total = 0;
  for (int w = 0; w < 32; ++w) total += sums[w][lane];
  if (c < head_dim) dq_norm[c] += total;
  else dk_norm[c - head_dim] += total;
}

void check_aligned(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(reinterpret_cast<uintptr_t>(t.data()) % 16 == 0, what,
                 ": CUDA qkv_rope needs 16-byte aligned data, got ", t.describe(), " at ", t.data());
}

void check_bf16(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(t.dtype() == DType::bf16, what, ": CUDA qkv_rope takes bf16 activations, got ",
                 t.describe());
  check_aligned(t, what);
}

// The CUDA constraints beyond the op's own checks; returns G (see Group).
int check_cuda_layout(const char* op, const HeadLayout& layout, const Tensor& q_norm,
                      const Tensor& k_norm) {
  LOCKSTEP_CHECK(layout.head_dim % 16 == 0 && layout.head_dim <= kMaxHeadDim, op,
                 ": CUDA qkv_rope needs head_dim a multiple of 16, at most ", kMaxHeadDim, ", got ",
                 layout.head_dim);
  if (q_norm.defined()) {
    check_aligned(q_norm, "qkv_rope: q_norm");
    check_aligned(k_norm, "qkv_rope: k_norm");
  }
  int G = 1;
  while (G < layout.head_dim / 16) G *= 2;
  return G;
}

const float* floats_or_null(const Tensor& t) { return t.defined() ? t.data_as<float>() : nullptr; }
const uint16_t* bf16_bits(const Tensor& t) { return static_cast<const uint16_t*>(t.data()); }
uint16_t* bf16_bits(Tensor& t) { return static_cast<uint16_t*>(t.data()); }

}  // namespace

void qkv_rope_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& positions,
                      const Tensor& inv_freq, const Tensor& q_norm, const Tensor& k_norm,
                      const HeadLayout& layout, float eps, const KvCacheOut* cache) {
  const int G = check_cuda_layout("qkv_rope_forward", layout, q_norm, k_norm);
  check_bf16(qkv, "qkv_rope_forward: qkv");
  check_bf16(out, "qkv_rope_forward: out");
  const int64_t T = qkv.dim(0);
  if (T == 0) return;
  const bool norm = q_norm.defined(), fp8 = cache && cache->cache.fp8();
  const ForwardArgs args{bf16_bits(qkv), bf16_bits(out), norm ? rstd.data_as<float>() : nullptr,
                         positions.data_as<int32_t>(), inv_freq.data_as<float>(), floats_or_null(q_norm),
                         floats_or_null(k_norm), int(layout.q_heads), int(layout.kv_heads),
                         int(layout.head_dim), G, eps,
                         cache ? cache->cache.k.data() : nullptr,
                         cache ? cache->cache.v.data() : nullptr,
                         cache ? cache->slots.data_as<int32_t>() : nullptr,
                         cache ? cache->cache.k.dim(0) * cache->cache.k.dim(1) : 0,
                         fp8 ? cache->cache.k_scale.data_as<float>() : nullptr,
                         fp8 ? cache->cache.v_scale.data_as<float>() : nullptr};
  if (T <= kSmallT) {
    const int64_t heads = layout.q_heads + 2 * layout.kv_heads, per_cta = kThreads / G;
    const auto kernel = fp8 ? (norm ? qkv_rope_forward_heads_kernel<true, true> : qkv_rope_forward_heads_kernel<false, true>)
                            : (norm ? qkv_rope_forward_heads_kernel<true> : qkv_rope_forward_heads_kernel<false>);
    LaunchConfig(dim3(unsigned(T), unsigned((heads + per_cta - 1) / per_cta)), dim3(kThreads), 0)
        .early_start_in_scope()
        .run(kernel, args);
  } else {
    const auto kernel = fp8 ? (norm ? qkv_rope_forward_kernel<true, true> : qkv_rope_forward_kernel<false, true>)
                            : (norm ? qkv_rope_forward_kernel<true> : qkv_rope_forward_kernel<false>);
    kernel<<<unsigned(T), kThreads, 0, current_stream()>>>(args);
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void qkv_rope_backward(Tensor& dqkv, Tensor& dq_norm, Tensor& dk_norm, const Tensor& dout,
                       const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq,
                       const Tensor& q_norm, const Tensor& k_norm, const Tensor& rstd,
                       const HeadLayout& layout) {
  const int G = check_cuda_layout("qkv_rope_backward", layout, q_norm, k_norm);
  check_bf16(dout, "qkv_rope_backward: dout");
  check_bf16(qkv, "qkv_rope_backward: qkv");
  check_bf16(dqkv, "qkv_rope_backward: dqkv");
  const int64_t T = qkv.dim(0), d = layout.head_dim;
  if (T == 0) return;
  const bool norm = q_norm.defined();
  const int64_t blocks = (T + kBackwardRows - 1) / kBackwardRows;
  Tensor partial = norm ? Tensor::empty({blocks, 2 * d}, DType::f32, Device::cuda) : Tensor();
  cudaStream_t stream = current_stream();
  const auto kernel = norm ? qkv_rope_backward_kernel<true> : qkv_rope_backward_kernel<false>;
  kernel<<<unsigned(blocks), kThreads, 0, stream>>>(
      bf16_bits(dout), bf16_bits(qkv), bf16_bits(dqkv), norm ? rstd.data_as<float>() : nullptr,
      positions.data_as<int32_t>(), inv_freq.data_as<float>(), floats_or_null(q_norm),
      floats_or_null(k_norm), norm ? partial.data_as<float>() : nullptr, T, int(layout.q_heads),
      int(layout.kv_heads), int(d), G);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  if (!norm) return;
  add_partials_kernel<<<unsigned(2 * d / 32), 1024, 0, stream>>>(
      partial.data_as<float>(), blocks, int(d), dq_norm.data_as<float>(), dk_norm.data_as<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
