// ops/cuda/moe_route.cu — CUDA backend of ops/moe_route.h.
//
// One thread per token, the CPU reference's loops as they are: E is at most a few hundred (Qwen3-MoE:
// 128) and k at most 8, so a token's work is a few thousand flops against the GEMMs' millions; a
// warp-per-token version is for when a profile says this matters. probs is the thread's scratch:
// the softmax is written there first and read back for the top-k passes and the backward.
#include <cuda_bf16.h>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#include "ops/moe_route_backends.h"

namespace lockstep::cuda {

namespace {

constexpr int kThreads = 128;

template <class In>
__device__ __forceinline__ float load(const In* p, int64_t i);
template <>
__device__ __forceinline__ float load<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float load<uint16_t>(const uint16_t* p, int64_t i) {
  return __uint_as_float(uint32_t(p[i]) << 16);
}

__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(uint16_t* p, int64_t i, float v) {
  p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <class In>
__global__ void __launch_bounds__(kThreads) route_forward_kernel(
    float* __restrict__ probs, int32_t* __restrict__ expert_ids, float* __restrict__ weights,
    float* __restrict__ lse, const In* __restrict__ logits, int64_t T, int64_t E, int64_t k,
    bool normalize) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  float* p = probs + t * E;
  float m = load(logits, t * E);
  for (int64_t e = 1; e < E; ++e) m = fmaxf(m, load(logits, t * E + e));
  float sum = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float x = expf(load(logits, t * E + e) - m);
    p[e] = x;
    sum += x;
  }
  for (int64_t e = 0; e < E; ++e) p[e] = __fdiv_rn(p[e], sum);
  if (lse) lse[t] = m + logf(sum);

  // k passes of "the largest not yet taken" (taken: the ids already written, k <= 8 in practice).
  int32_t* ids = expert_ids + t * k;
  float* w = weights + t * k;
  float picked = 0;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= ids[i] == e;
      if (taken) continue;
      if (best < 0 || p[e] > p[best] || (isnan(p[best]) && !isnan(p[e]))) best = e;
    }
    ids[j] = int32_t(best);
    w[j] = p[best];
    picked += p[best];
  }
  if (normalize)
    for (int64_t j = 0; j < k; ++j) w[j] = __fdiv_rn(w[j], picked);
}

// The forward's weights of given ids: the same operations in the same order.
__global__ void __launch_bounds__(kThreads) route_weights_kernel(
    float* __restrict__ weights, const float* __restrict__ probs, const int32_t* __restrict__ expert_ids,
    int64_t T, int64_t E, int64_t k, bool normalize) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  const float* p = probs + t * E;
  const int32_t* ids = expert_ids + t * k;
  float* w = weights + t * k;
  float picked = 0;
  for (int64_t j = 0; j < k; ++j) {
    w[j] = p[ids[j]];
    picked += p[ids[j]];
  }
  if (normalize)
    for (int64_t j = 0; j < k; ++j) w[j] = __fdiv_rn(w[j], picked);
}

template <class Out>
__global__ void __launch_bounds__(kThreads) route_backward_kernel(
    Out* __restrict__ dlogits, const float* __restrict__ dweights, const float* __restrict__ dprobs,
    const float* __restrict__ probs, const int32_t* __restrict__ expert_ids,
    const float* __restrict__ weights, const float* __restrict__ lse, float z_scale, int64_t T,
    int64_t E, int64_t k, bool normalize) {
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  const float* p = probs + t * E;
  const int32_t* ids = expert_ids + t * k;
  const float* w = weights + t * k;
  const float* dw = dweights + t * k;
  // dp[e] is needed twice (the dot product, then the output): computed on the fly each time.
  float s = 0, wdot = 0;
  if (normalize) {
    for (int64_t j = 0; j < k; ++j) s += p[ids[j]];
    for (int64_t j = 0; j < k; ++j) wdot += dw[j] * w[j];
  }
  auto dp = [&](int64_t e) {
    float v = dprobs ? dprobs[t * E + e] : 0.0f;
    for (int64_t j = 0; j < k; ++j)
      if (ids[j] == e) v += normalize ? __fdiv_rn(dw[j] - wdot, s) : dw[j];
    return v;
  };
  float dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += p[e] * dp(e);
  const float z = lse ? z_scale * lse[t] : 0.0f;
  for (int64_t e = 0; e < E; ++e) {
    float d = p[e] * (dp(e) - dot);
    if (lse) d += z * p[e];
    store(dlogits, t * E + e, d);
  }
}

unsigned blocks(int64_t T) { return unsigned((T + kThreads - 1) / kThreads); }

}  // namespace

void moe_route_forward(Tensor& probs, Tensor& expert_ids, Tensor& weights, const Tensor& logits,
                       bool normalize, Tensor* lse) {
  const int64_t T = logits.dim(0), E = logits.dim(1), k = expert_ids.dim(1);
  if (T == 0) return;
  cudaStream_t stream = current_stream();
  float* lse_out = lse ? lse->data_as<float>() : nullptr;
  if (logits.dtype() == DType::f32) {
    route_forward_kernel<<<blocks(T), kThreads, 0, stream>>>(
        probs.data_as<float>(), expert_ids.data_as<int32_t>(), weights.data_as<float>(), lse_out,
        logits.data_as<float>(), T, E, k, normalize);
  } else {
    route_forward_kernel<<<blocks(T), kThreads, 0, stream>>>(
        probs.data_as<float>(), expert_ids.data_as<int32_t>(), weights.data_as<float>(), lse_out,
        static_cast<const uint16_t*>(logits.data()), T, E, k, normalize);
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void moe_route_weights(Tensor& weights, const Tensor& probs, const Tensor& expert_ids, bool normalize) {
  const int64_t T = probs.dim(0), E = probs.dim(1), k = expert_ids.dim(1);
  if (T == 0) return;
  route_weights_kernel<<<blocks(T), kThreads, 0, current_stream()>>>(
      weights.data_as<float>(), probs.data_as<float>(), expert_ids.data_as<int32_t>(), T, E, k, normalize);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void moe_route_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& dprobs,
                        const Tensor& probs, const Tensor& expert_ids, const Tensor& weights,
                        bool normalize, const Tensor& lse, float z_scale) {
  const int64_t T = probs.dim(0), E = probs.dim(1), k = expert_ids.dim(1);
  if (T == 0) return;
  const float* dp = dprobs.defined() ? dprobs.data_as<float>() : nullptr;
  const float* l = lse.defined() ? lse.data_as<float>() : nullptr;
  cudaStream_t stream = current_stream();
  if (dlogits.dtype() == DType::f32) {
    route_backward_kernel<<<blocks(T), kThreads, 0, stream>>>(
        dlogits.data_as<float>(), dweights.data_as<float>(), dp, probs.data_as<float>(),
        expert_ids.data_as<int32_t>(), weights.data_as<float>(), l, z_scale, T, E, k, normalize);
  } else {
    route_backward_kernel<<<blocks(T), kThreads, 0, stream>>>(
        static_cast<uint16_t*>(dlogits.data()), dweights.data_as<float>(), dp, probs.data_as<float>(),
        expert_ids.data_as<int32_t>(), weights.data_as<float>(), l, z_scale, T, E, k, normalize);
  }
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep::cuda
