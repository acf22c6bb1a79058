// ops/cuda/lm_head.cu — the fused LM head on CUDA (ops/lm_head.h): the CPU reference's walk of the
// vocabulary in kVocabChunk chunks, with cuBLASLt GEMMs (ops/gemm.h) and these kernels between.
//
// Forward, per chunk: gemm_fprop writes the chunk's fp32 logits [T, n] to scratch, and one CTA
// per row folds them into the row's running (max, sum, shifted, z_target), kept in an fp32 [T, 4]
// scratch from chunk to chunk; the last chunk's fold writes logprob, entropy and lse.
// Backward, per chunk: the logits again, one CTA per row turns them into bf16 dz/temperature, then
// cuBLASLt adds dz·w_chunk into an fp32 dh (beta = 1 after the first chunk) and dzᵀ·h into dw's
// rows of the chunk; a bf16 dh is rounded once at the end.
//
// A CTA of 256 threads holds a row's chunk (4096 fp32: four 16-byte loads per thread) in
// registers, so each logit is read from memory once although the fold needs the chunk's max before
// its sums. The max and the sums are reduced by xor shuffles (both partners add the same two
// values) and then over the 8 warps in a fixed order: every thread of the CTA ends with the same
// statistics, the same on every run. logits_logprob runs the same fold over the same chunks, so
// for equal logits it gives the forward's bits (the GEMMs of lm_head_logits and of a chunk may
// still round a logit differently).
//
// Target ids are never read on the host. A target outside [0, V) matches no logit: its row's
// z_target stays NaN (forward, logits_logprob: logprob NaN) and its row of dz is NaN (backward:
// its row of dh and all of dw NaN), which the trainer's non-finite check catches.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/gemm.h"
#include "ops/lm_head.h"
#include "ops/lm_head_backends.h"

namespace lockstep::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 4;                                       // fp32 per 16-byte load
constexpr int kLoads = int(kVocabChunk) / (kThreads * kVec);  // 16-byte loads per thread and chunk
static_assert(kVocabChunk % (kThreads * kVec) == 0);
constexpr int kPack = 8;  // fp32 values read per bf16 16-byte store (dz, dh)

__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The CTA's max (NaNs ignored, as fmaxf), the same in every thread. smem: kWarps floats.
__device__ float block_max(float v, float* smem) {
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
__device__ float2 block_sum2(float a, float b, float2* smem) {
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

// Folds the z = x·inv_t of a chunk loaded by load_chunk into f, as the CPU's fold_span: rescale
// once if the chunk raises the max, then add its terms. Called by every thread of the CTA with the
// same f.
__device__ void fold_chunk(RowFold& f, const float (&x)[kLoads][kVec], float inv_t, Smem& smem) {
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kLoads; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) m = fmaxf(m, x[i][j]);
  // Rounded scaling by inv_t > 0 is monotonic, so this is the max of the z; + 0 makes a −0 max +0.
  m = block_max(m, smem.max) * inv_t + 0.0f;
  if (m > f.max) {
    if (f.sum > 0.0f) {
      const float shift = f.max - m, scale = expf(shift);
      f.shifted = (f.shifted + f.sum * shift) * scale;
      f.sum *= scale;
    }
    f.max = m;
  }
  float s = 0.0f, d = 0.0f;
#pragma unroll
  for (int i = 0; i < kLoads; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float zm = x[i][j] * inv_t - f.max, e = expf(zm);
      s += e;
      d = fmaf(e, e > 0.0f ? zm : 0.0f, d);  // an e of 0 (−inf past n) adds 0, not 0·(−inf)
    }
  const float2 r = block_sum2(s, d, smem.sum);
  f.sum += r.x;
  f.shifted += r.y;
}

__device__ void write_outputs(const RowFold& f, int64_t t, float* logprob, float* entropy,
                              float* lse) {
  const float log_sum = logf(f.sum), row_lse = f.max + log_sum;
  logprob[t] = f.z_target - row_lse;
  entropy[t] = log_sum - f.shifted / f.sum;
  if (lse) lse[t] = row_lse;
}

// CTA t folds row t of a chunk's logits [T, n] (vocabulary [v0, v0 + n)) into state[t], starting
// from an empty fold when `first`; the `last` chunk writes the outputs instead of the state.
__global__ void __launch_bounds__(kThreads)
    fold_chunk_kernel(const float* logits, int n, int64_t v0, const int32_t* targets, float inv_t,
                      float4* state, bool first, bool last, float* logprob, float* entropy,
                      float* lse) {
  __shared__ Smem smem;
  const int64_t t = blockIdx.x;
  const float* row = logits + t * n;
  float x[kLoads][kVec];
  load_chunk(x, row, n);
  RowFold f;
  if (!first) {
    const float4 s = state[t];
    f = {s.x, s.y, s.z, s.w};
  }
  fold_chunk(f, x, inv_t, smem);
  if (threadIdx.x != 0) return;
  const int64_t target = targets[t] - v0;
  if (target >= 0 && target < n) f.z_target = row[target] * inv_t;
  if (last) write_outputs(f, t, logprob, entropy, lse);
  else state[t] = make_float4(f.max, f.sum, f.shifted, f.z_target);
}

// CTA t folds row t of logits [T, V], chunk by chunk. The next chunk's loads are issued before the
// current chunk is folded (and first waited for when it is moved into x after the fold), so a CTA
// keeps memory busy through its reductions: at sampling time T is small and each CTA walks the
// whole vocabulary.
__global__ void __launch_bounds__(kThreads)
    logits_logprob_kernel(const float* logits, int64_t V, const int32_t* targets, float inv_t,
                          float* logprob, float* entropy) {
  __shared__ Smem smem;
  const int64_t t = blockIdx.x;
  const float* row = logits + t * V;
  auto width = [&](int64_t v0) { return int(V - v0 < kVocabChunk ? V - v0 : kVocabChunk); };
  RowFold f;
  float x[kLoads][kVec], next[kLoads][kVec];
  load_chunk(x, row, width(0));
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const bool more = v0 + kVocabChunk < V;
    if (more) load_chunk(next, row + v0 + kVocabChunk, width(v0 + kVocabChunk));
    fold_chunk(f, x, inv_t, smem);
    if (!more) break;
#pragma unroll
    for (int i = 0; i < kLoads; ++i)
#pragma unroll
      for (int j = 0; j < kVec; ++j) x[i][j] = next[i][j];
  }
  if (threadIdx.x != 0) return;
  const int64_t target = targets[t];
  if (target >= 0 && target < V) f.z_target = row[target] * inv_t;
  write_outputs(f, t, logprob, entropy, nullptr);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// CTA t: dz[t, v] = (dlogprob·(1[v = target] − p) + dentropy·(−p·(log p + entropy))) / temperature
// in bf16 for the chunk's logits [T, n] (vocabulary [v0, v0 + n)); dlogprob, dentropy: null reads
// as zero. All NaN for a target outside [0, V).
__global__ void __launch_bounds__(kThreads)
    dz_kernel(const float* logits, int n, int64_t v0, int64_t V, const int32_t* targets,
              const float* lse, const float* entropy, const float* dlogprob,
              const float* dentropy, float inv_t, __nv_bfloat16* dz) {
  const int64_t t = blockIdx.x;
  const float* row = logits + t * n;
  __nv_bfloat16* out = dz + t * n;
  const float row_lse = lse[t], ent = entropy[t];
  const float dlp = dlogprob ? dlogprob[t] : 0.0f, dent = dentropy ? dentropy[t] : 0.0f;
  const int64_t target = targets[t];
  const bool bad = target < 0 || target >= V;
  const int64_t local_target = target - v0;
  auto grad = [&](float logit, int v) {
    const float log_p = logit * inv_t - row_lse, p = expf(log_p);
    const float is_target = v == local_target ? 1.0f : 0.0f;
    return bad ? NAN : (dlp * (is_target - p) + dent * (-p * (log_p + ent))) * inv_t;
  };
  const bool vector = aligned16(row) && aligned16(out);
  for (int v = int(threadIdx.x) * kPack; v < n; v += kThreads * kPack) {
    if (vector && v + kPack <= n) {
      const float4 a = *reinterpret_cast<const float4*>(row + v);
      const float4 b = *reinterpret_cast<const float4*>(row + v + 4);
      *reinterpret_cast<uint4*>(out + v) = make_uint4(
          pack_bf16x2(grad(a.x, v), grad(a.y, v + 1)), pack_bf16x2(grad(a.z, v + 2), grad(a.w, v + 3)),
          pack_bf16x2(grad(b.x, v + 4), grad(b.y, v + 5)), pack_bf16x2(grad(b.z, v + 6), grad(b.w, v + 7)));
    } else {
      for (int j = v; j < v + kPack && j < n; ++j) out[j] = __float2bfloat16_rn(grad(row[j], j));
    }
  }
}

// dst[0, count) = src rounded to bf16 (nearest even); `vector`: both 16-byte aligned.
__global__ void __launch_bounds__(kThreads)
    round_to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t count, bool vector) {
  const int64_t i = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kPack;
  if (vector && i + kPack <= count) {
    const float4 a = *reinterpret_cast<const float4*>(src + i);
    const float4 b = *reinterpret_cast<const float4*>(src + i + 4);
    *reinterpret_cast<uint4*>(dst + i) = make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w),
                                                    pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w));
  } else {
    for (int64_t j = i; j < i + kPack && j < count; ++j) dst[j] = __float2bfloat16_rn(src[j]);
  }
}

// Logits (f32) or dz (bf16) [T, n] of a chunk, in a scratch buffer sized for the largest chunk.
Tensor chunk_view(const Tensor& buffer, int64_t T, int64_t n) {
  return Tensor::view_of(buffer.data(), {T, n}, buffer.dtype(), Device::cuda);
}

}  // namespace

void lm_head_logprob_forward(Tensor& logprob, Tensor& entropy, Tensor& lse, const Tensor& h,
                             const Tensor& w, const Tensor& targets, float temperature) {
  const int64_t T = h.dim(0), V = w.dim(0);
  if (T == 0) return;
  const Tensor logits = Tensor::empty({T * std::min(V, kVocabChunk)}, DType::f32, Device::cuda);
  const Tensor state = V > kVocabChunk ? Tensor::empty({T, 4}, DType::f32, Device::cuda) : Tensor();
  const float inv_t = 1.0f / temperature;
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const int64_t n = std::min(kVocabChunk, V - v0);
    Tensor chunk = chunk_view(logits, T, n);
    gemm_fprop(chunk, h, w.rows(v0, v0 + n));
    fold_chunk_kernel<<<unsigned(T), kThreads, 0, current_stream()>>>(
        chunk.data_as<float>(), int(n), v0, targets.data_as<int32_t>(), inv_t,
        static_cast<float4*>(state.data()), v0 == 0, v0 + n == V, logprob.data_as<float>(),
        entropy.data_as<float>(), lse.data_as<float>());
    LOCKSTEP_CUDA_CHECK_LAUNCH();
  }
}

void lm_head_logprob_backward(Tensor& dh, Tensor& dw, const Tensor& dlogprob,
                              const Tensor& dentropy, const Tensor& h, const Tensor& w,
                              const Tensor& targets, const Tensor& lse, const Tensor& entropy,
                              float temperature) {
  const int64_t T = h.dim(0), H = h.dim(1), V = w.dim(0);
  if (T == 0) return;  // dh is empty and dw gains nothing
  const int64_t max_n = std::min(V, kVocabChunk);
  const Tensor logits = Tensor::empty({T * max_n}, DType::f32, Device::cuda);
  const Tensor dz_buffer = Tensor::empty({T * max_n}, DType::bf16, Device::cuda);
  Tensor dh_sum = dh.dtype() == DType::f32 ? dh : Tensor::empty({T, H}, DType::f32, Device::cuda);
  const float inv_t = 1.0f / temperature;
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const int64_t n = std::min(kVocabChunk, V - v0);
    const Tensor w_chunk = w.rows(v0, v0 + n);
    Tensor chunk = chunk_view(logits, T, n), dz = chunk_view(dz_buffer, T, n);
    gemm_fprop(chunk, h, w_chunk);
    dz_kernel<<<unsigned(T), kThreads, 0, current_stream()>>>(
        chunk.data_as<float>(), int(n), v0, V, targets.data_as<int32_t>(), lse.data_as<float>(),
        entropy.data_as<float>(), dlogprob.defined() ? dlogprob.data_as<float>() : nullptr,
        dentropy.defined() ? dentropy.data_as<float>() : nullptr, inv_t,
        static_cast<__nv_bfloat16*>(dz.data()));
    LOCKSTEP_CUDA_CHECK_LAUNCH();
    gemm_dgrad(dh_sum, dz, w_chunk, v0 > 0);
    Tensor dw_chunk = dw.rows(v0, v0 + n);
    gemm_wgrad(dw_chunk, dz, h, true);
  }
  if (dh.dtype() == DType::f32) return;
  const int64_t count = T * H;
  const float* src = dh_sum.data_as<float>();
  auto* dst = static_cast<__nv_bfloat16*>(dh.data());
  const unsigned blocks = unsigned((count + kThreads * kPack - 1) / (kThreads * kPack));
  round_to_bf16_kernel<<<blocks, kThreads, 0, current_stream()>>>(
      src, dst, count, aligned16(src) && aligned16(dst));
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void lm_head_logits(Tensor& logits, const Tensor& h, const Tensor& w) { gemm_fprop(logits, h, w); }

void logits_logprob(Tensor& logprob, Tensor& entropy, const Tensor& logits, const Tensor& targets,
                    float temperature) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
  if (T == 0) return;
  logits_logprob_kernel<<<unsigned(T), kThreads, 0, current_stream()>>>(
      logits.data_as<float>(), V, targets.data_as<int32_t>(), 1.0f / temperature,
      logprob.data_as<float>(), entropy.data_as<float>());
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
