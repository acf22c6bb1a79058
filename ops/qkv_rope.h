// ops/qkv_rope.h — prepares the fused q/k/v projection for attention (out of place):
//
//   q and k heads: optional RMSNorm over head_dim (Qwen3's q_norm / k_norm, weights f32 [head_dim],
//                  the same eps and math as ops/rmsnorm.h), then rotary position embedding;
//   v heads:       copied unchanged.
//
// RoPE, Hugging Face's rotate_half convention: for i < d/2 (d = head_dim),
//   angle = float(position) · inv_freq[i]                        (one fp32 product, as HF)
//   c, s  = float(cos(double(angle))), float(sin(double(angle)))  (correctly rounded on any device)
//   (x[i], x[i + d/2]) -> (x[i]·c − x[i + d/2]·s,  x[i + d/2]·c + x[i]·s)
// The backward applies the inverse rotation, then the RMSNorm backward.
//
// qkv, out, dout, dqkv: f32 or bf16 [T, layout.qkv_width()] (ops/head_layout.h).
// positions: i32 [T]. inv_freq: f32 [head_dim / 2] (rope_inv_freq below).
// q_norm, k_norm: f32 [head_dim], or both undefined (no norm; then rstd is not used).
// rstd: f32 [T, q_heads + kv_heads], written by forward (q heads first), read by backward.
// dq_norm, dk_norm: f32 [head_dim], accumulate (deterministically: the same bits on every run).
//
// CUDA: bf16 activations, head_dim a multiple of 16 up to 256, data 16-byte aligned (as
// Tensor::empty allocates it). Positions are not checked there (that would need a host sync): a
// negative position makes its row's q and k outputs (backward: their gradients, and dq_norm,
// dk_norm) NaN. Results match the CPU's up to the order of the sums and FMA contraction (a few
// fp32 ulps before the one rounding to bf16).
//
// The inference form (with a cache and slots) also writes out's k and v heads into the paged KV
// cache: the bytes (and, into an fp8 cache, the scales) of kv_cache_write(cache, out, slots, layout)
// after the op (ops/attention.h: its arguments, checks and skipping of slots outside the cache), on
// CUDA from the op's own kernel.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/head_layout.h"

namespace lockstep {

void qkv_rope_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& positions,
                      const Tensor& inv_freq, const Tensor& q_norm, const Tensor& k_norm,
                      const HeadLayout& layout, float eps);

void qkv_rope_forward(Tensor& out, Tensor& rstd, const PagedKv& cache, const Tensor& slots, const Tensor& qkv,
                      const Tensor& positions, const Tensor& inv_freq, const Tensor& q_norm,
                      const Tensor& k_norm, const HeadLayout& layout, float eps);

void qkv_rope_backward(Tensor& dqkv, Tensor& dq_norm, Tensor& dk_norm, const Tensor& dout,
                       const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq,
                       const Tensor& q_norm, const Tensor& k_norm, const Tensor& rstd,
                       const HeadLayout& layout);

// Llama 3.1 long-context frequency scaling (rope_scaling.rope_type == "llama3").
struct RopeScaling {
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  double original_max_position_embeddings = 8192;
};

// inv_freq[i] = 1 / theta^(2i / head_dim), computed in fp32 as Hugging Face does, then (when
// given) the Llama-3 scaling of transformers' _compute_llama3_parameters. f32 [head_dim / 2], CPU.
Tensor rope_inv_freq(int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling);

}  // namespace lockstep
