// ops/cuda/softmax_fold.cuh — the per-row softmax fold of ops/lm_head.h on CUDA, for kernels that
// give a CTA of kThreads a row of logits: a row is walked in kVocabChunk chunks, each held in
// registers (four 16-byte loads per thread), and folded into running (max, sum, shifted) as the
// CPU's fold_span does; the CTA's max and sums are reduced by xor shuffles and then over the warps
// in a fixed order, so every thread ends with the same statistics, the same on every run.
//
// Shared by ops/cuda/lm_head.cu (the forward's fold and logits_logprob) and ops/cuda/sample.cu, so
// the sampler's logprobs equal logits_logprob's bit for bit.
#pragma once

#include <cstdint>

#include "ops/lm_head.h"

namespace lockstep::cuda {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 4;                                       // fp32 per 16-byte load
constexpr int kLoads = int(kVocabChunk) / (kThreads * kVec);  // 16-byte loads per thread and chunk
static_assert(kVocabChunk % (kThreads * kVec) == 0);

__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The CTA's max (NaNs ignored, as fmaxf), the same in every thread. smem: kWarps floats.
__device__ __forceinline__ float block_max(float v, float* smem) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  float r = smem[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) r = fmaxf(r, smem[w]);
  __syncthreads();  // smem is written again by the next reduction
  return r;
}

// The CTA's sums of a and of b, the same in every thread. smem: kWarps float2.
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* smem) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = make_float2(a, b);
  __syncthreads();
  float2 r = smem[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {
    r.x += smem[w].x;
    r.y += smem[w].y;
  }
  __syncthreads();
  return r;
}

struct Smem {
  float max[kWarps];
  float2 sum[kWarps];
};

// A row's softmax statistics over the vocabulary folded so far (ops/cpu/lm_head.cpp's RowFold):
// max z, sum = Σ exp(z − max), shifted = Σ exp(z − max)·(z − max); z_target: the target's z, NaN
// until its chunk is folded.
struct RowFold {
  float max = -INFINITY, sum = 0.0f, shifted = 0.0f, z_target = NAN;
};

// A thread's share of row[0, n), n ≤ kVocabChunk: element (i·kThreads + thread)·kVec + j in
// x[i][j] (coalesced 16-byte loads when the row is 16-byte aligned), −inf past n.
__device__ __forceinline__ void load_chunk(float (&x)[kLoads][kVec], const float* row, int n) {
  const bool vector = aligned16(row);
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int v = (i * kThreads + int(threadIdx.x)) * kVec;
    if (vector && v + kVec <= n) {
      const float4 q = *reinterpret_cast<const float4*>(row + v);
      x[i][0] = q.x;
      x[i][1] = q.y;
      x[i][2] = q.z;
      x[i][3] = q.w;
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) x[i][j] = v + j < n ? row[v + j] : -INFINITY;
    }
  }
}

// body(x, v0) for each chunk [v0, v0 + kVocabChunk) of row[0, V) in increasing v0, x as
// load_chunk leaves it; called by every thread of the CTA, so body may synchronize. The next
// chunk's loads are issued before body runs (and first waited for when they are moved into x), so
// a CTA keeps memory busy through its reductions.
template <class Body>
__device__ __forceinline__ void for_each_chunk(const float* row, int64_t V, Body&& body) {
  auto width = [&](int64_t v0) { return int(V - v0 < kVocabChunk ? V - v0 : kVocabChunk); };
  float x[kLoads][kVec], next[kLoads][kVec];
  load_chunk(x, row, width(0));
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const bool more = v0 + kVocabChunk < V;
    if (more) load_chunk(next, row + v0 + kVocabChunk, width(v0 + kVocabChunk));
    body(x, v0);
    if (!more) break;
#pragma unroll
    for (int i = 0; i < kLoads; ++i)
#pragma unroll
      for (int j = 0; j < kVec; ++j) x[i][j] = next[i][j];
  }
}

// The max z = x·inv_t of a chunk loaded by load_chunk, the same in every thread.
__device__ __forceinline__ float chunk_max_z(const float (&x)[kLoads][kVec], float inv_t,
                                             Smem& smem) {
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kLoads; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) m = fmaxf(m, x[i][j]);
  // Rounded scaling by inv_t > 0 is monotonic, so this is the max of the z; + 0 makes a −0 max +0.
  return block_max(m, smem.max) * inv_t + 0.0f;
}

// Raises f's max to a chunk's max z m when m is larger, rescaling the sums so far.
__device__ __forceinline__ void raise_max(RowFold& f, float m) {
  if (m > f.max) {
    if (f.sum > 0.0f) {
      const float shift = f.max - m, scale = expf(shift);
      f.shifted = (f.shifted + f.sum * shift) * scale;
      f.sum *= scale;
    }
    f.max = m;
  }
}

// A chunk's (Σ exp(z − max), Σ exp(z − max)·(z − max)), the same in every thread.
__device__ __forceinline__ float2 chunk_sums(const float (&x)[kLoads][kVec], float inv_t,
                                             float max, Smem& smem) {
  float s = 0.0f, d = 0.0f;
#pragma unroll
  for (int i = 0; i < kLoads; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float zm = x[i][j] * inv_t - max, e = expf(zm);
      s += e;
      d = fmaf(e, e > 0.0f ? zm : 0.0f, d);  // an e of 0 (−inf past n) adds 0, not 0·(−inf)
    }
  return block_sum2(s, d, smem.sum);
}

// Folds the z = x·inv_t of a chunk loaded by load_chunk into f, as the CPU's fold_span: rescale
// once if the chunk raises the max, then add its terms. Called by every thread of the CTA with the
// same f. Its three steps are separate functions so that ops/cuda/sample.cu can run them in
// different CTAs and replay the fold from their results with the same bits.
__device__ __forceinline__ void fold_chunk(RowFold& f, const float (&x)[kLoads][kVec], float inv_t,
                                           Smem& smem) {
  raise_max(f, chunk_max_z(x, inv_t, smem));
  const float2 r = chunk_sums(x, inv_t, f.max, smem);
  f.sum += r.x;
  f.shifted += r.y;
}

// The logprob z − lse of a logit x of the folded row, rounded step by step as the CPU's
// write_outputs (no contraction into an fma).
__device__ __forceinline__ float fold_logprob(const RowFold& f, float x, float inv_t) {
  const float row_lse = __fadd_rn(f.max, logf(f.sum));
  return __fsub_rn(__fmul_rn(x, inv_t), row_lse);
}

}  // namespace lockstep::cuda
