// ops/cuda/lm_head.cu — the fused LM head on CUDA (ops/lm_head.h): the CPU reference's walk of the
// vocabulary in kVocabChunk chunks, with cuBLASLt GEMMs (ops/gemm.h) and these kernels between.
//
// Forward, per chunk: gemm_fprop writes the chunk's fp32 logits [T, n] to scratch (or to the kept
// logits), and one CTA per row folds them into the row's running (max, sum, shifted, z_target),
// kept in an fp32 [T, 4] scratch from chunk to chunk; the last chunk's fold writes logprob, entropy
// and lse. Backward, per chunk: the logits again (or the kept ones), one CTA per row turns them
// into bf16 dz/temperature, then cuBLASLt adds dz·w_chunk into an fp32 dh (beta = 1 after the
// first chunk) and dzᵀ·h into dw's rows of the chunk; a bf16 dh is rounded once at the end.
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
#include "ops/cuda/softmax_fold.cuh"
#include "ops/forward_kernels.h"
#include "ops/gemm.h"
#include "ops/lm_head.h"
#include "ops/lm_head_backends.h"

namespace lockstep::cuda {

namespace {

constexpr int kPack = 8;  // fp32 values read per bf16 16-byte store (dz, dh)

// Rounded step by step as the CPU's write_outputs and as fold_logprob (no contraction into fmas),
// so the forward, logits_logprob and the sampler (ops/cuda/sample.cu) agree bit for bit.
__device__ void write_outputs(const RowFold& f, int64_t t, float* logprob, float* entropy,
                              float* lse) {
  const float log_sum = logf(f.sum), row_lse = __fadd_rn(f.max, log_sum);
  logprob[t] = __fsub_rn(f.z_target, row_lse);
  entropy[t] = __fsub_rn(log_sum, __fdiv_rn(f.shifted, f.sum));
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
  if (target >= 0 && target < n) f.z_target = __fmul_rn(row[target], inv_t);
  if (last) write_outputs(f, t, logprob, entropy, lse);
  else state[t] = make_float4(f.max, f.sum, f.shifted, f.z_target);
}

// CTA t folds row t of logits [T, V], chunk by chunk (for_each_chunk keeps the next chunk's loads
// in flight through the reductions: at sampling time T is small and each CTA walks the whole
// vocabulary).
__global__ void __launch_bounds__(kThreads)
    logits_logprob_kernel(const float* logits, int64_t V, const int32_t* targets, float inv_t,
                          float* logprob, float* entropy) {
  __shared__ Smem smem;
  const int64_t t = blockIdx.x;
  const float* row = logits + t * V;
  RowFold f;
  for_each_chunk(row, V, [&](const float (&x)[kLoads][kVec], int64_t) { fold_chunk(f, x, inv_t, smem); });
  if (threadIdx.x != 0) return;
  const int64_t target = targets[t];
  if (target >= 0 && target < V) f.z_target = __fmul_rn(row[target], inv_t);
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

// The logits [T, n] of the chunk at v0 in kept logits (ops/lm_head.h: chunk-major).
Tensor kept_chunk(const Tensor& kept, int64_t T, int64_t v0, int64_t n) {
  return Tensor::view_of(kept.data_as<float>() + T * v0, {T, n}, DType::f32, Device::cuda);
}

}  // namespace

void lm_head_logprob_forward(Tensor& logprob, Tensor& entropy, Tensor& lse, const Tensor& h,
                             const Tensor& w, const Tensor& targets, float temperature,
                             Tensor* kept_logits) {
  const int64_t T = h.dim(0), V = w.dim(0);
  if (T == 0) return;
  const Tensor scratch =
      kept_logits ? Tensor() : Tensor::empty({T * std::min(V, kVocabChunk)}, DType::f32, Device::cuda);
  const Tensor state = V > kVocabChunk ? Tensor::empty({T, 4}, DType::f32, Device::cuda) : Tensor();
  const float inv_t = 1.0f / temperature;
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const int64_t n = std::min(kVocabChunk, V - v0);
    Tensor chunk = kept_logits ? kept_chunk(*kept_logits, T, v0, n) : chunk_view(scratch, T, n);
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
                              float temperature, const Tensor* kept_logits) {
  const int64_t T = h.dim(0), H = h.dim(1), V = w.dim(0);
  if (T == 0) return;  // dh is empty and dw gains nothing
  const int64_t max_n = std::min(V, kVocabChunk);
  const Tensor scratch = kept_logits ? Tensor() : Tensor::empty({T * max_n}, DType::f32, Device::cuda);
  const Tensor dz_buffer = Tensor::empty({T * max_n}, DType::bf16, Device::cuda);
  Tensor dh_sum = dh.dtype() == DType::f32 ? dh : Tensor::empty({T, H}, DType::f32, Device::cuda);
  const float inv_t = 1.0f / temperature;
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const int64_t n = std::min(kVocabChunk, V - v0);
    const Tensor w_chunk = w.rows(v0, v0 + n);
    Tensor chunk = kept_logits ? kept_chunk(*kept_logits, T, v0, n) : chunk_view(scratch, T, n);
    if (!kept_logits) gemm_fprop(chunk, h, w_chunk);
    Tensor dz = chunk_view(dz_buffer, T, n);
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

// Under the exact forward kernels (ops/forward_kernels.h) the logits are made chunk by chunk by the
// forward's GEMMs (the same weight rows [v0, v0 + n), hence the same algorithm at any T, gemm.cu's
// make_exact_plan), each copied into its columns: the rollout's logits of a row are then the
// training forward's bits, where one GEMM over the whole vocabulary is a shape of its own.
void lm_head_logits(Tensor& logits, const Tensor& h, const Tensor& w) {
  if (!exact_forward()) return gemm_fprop(logits, h, w);
  const int64_t T = h.dim(0), V = w.dim(0);
  if (T == 0) return;
  const Tensor scratch = Tensor::empty({T * std::min(V, kVocabChunk)}, DType::f32, Device::cuda);
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const int64_t n = std::min(kVocabChunk, V - v0);
    Tensor chunk = chunk_view(scratch, T, n);
    gemm_fprop(chunk, h, w.rows(v0, v0 + n));
    LOCKSTEP_CUDA_CHECK(cudaMemcpy2DAsync(logits.data_as<float>() + v0, size_t(V) * sizeof(float),
                                          chunk.data(), size_t(n) * sizeof(float), size_t(n) * sizeof(float),
                                          size_t(T), cudaMemcpyDeviceToDevice, current_stream()));
  }
}

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
