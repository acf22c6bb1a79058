// ops/qkv_rope_backends.h — per-backend entry points for ops/qkv_rope.h; arguments are checked by
// ops/qkv_rope.cpp (the CUDA backend checks its own constraints: bf16, head_dim, alignment).
// Without q/k norm, q_norm and k_norm are undefined tensors and rstd, dq_norm and dk_norm are not
// touched. CUDA forward: with a KvCacheOut it also writes the cache (ops/qkv_rope.h's inference
// form; its arguments checked by check_kv_cache_write).
#pragma once

#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/head_layout.h"

namespace lockstep::cpu {
void qkv_rope_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& positions,
                      const Tensor& inv_freq, const Tensor& q_norm, const Tensor& k_norm,
                      const HeadLayout& layout, float eps);
void qkv_rope_backward(Tensor& dqkv, Tensor& dq_norm, Tensor& dk_norm, const Tensor& dout,
                       const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq,
                       const Tensor& q_norm, const Tensor& k_norm, const Tensor& rstd,
                       const HeadLayout& layout);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
struct KvCacheOut {
  const PagedKv& cache;
  const Tensor& slots;
};
void qkv_rope_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& positions,
                      const Tensor& inv_freq, const Tensor& q_norm, const Tensor& k_norm,
                      const HeadLayout& layout, float eps, const KvCacheOut* cache = nullptr);
void qkv_rope_backward(Tensor& dqkv, Tensor& dq_norm, Tensor& dk_norm, const Tensor& dout,
                       const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq,
                       const Tensor& q_norm, const Tensor& k_norm, const Tensor& rstd,
                       const HeadLayout& layout);
}  // namespace lockstep::cuda
