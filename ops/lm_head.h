// ops/lm_head.h — the language-model head fused with log-softmax: per-token logprob of a target
// and entropy, without ever holding [T, V] logits.
//
//   z[t, v]     = (h[t] · w[v]) / temperature            fp32 (h, w: f32 or bf16, fp32 products)
//   lse[t]      = log Σ_v exp(z[t, v])
//   logprob[t]  = z[t, targets[t]] − lse[t]
//   entropy[t]  = lse[t] − Σ_v p[t, v] · z[t, v],   p = exp(z − lse)
//
// The vocabulary is walked in chunks of kVocabChunk: each chunk's logits are computed by GEMM,
// folded into a running (m = max z, s = Σexp(z − m), d = Σexp(z − m)·(z − m)) per row in
// increasing v (rescaled when m grows), and dropped; entropy = log s − d/s adds two non-negative
// terms. logits_logprob applies the same fold to full logits rows (the rollout's sampling logits),
// so on the CPU both give identical bits for identical logits, and lm_head_logits' elements equal
// the logits the forward folds.
//
// Backward (recomputes each chunk's logits, unless the forward kept them): with dlogprob[t],
// dentropy[t] (either may be undefined = zero),
//   dz[t, v] = dlogprob[t] · (1[v = targets[t]] − p) + dentropy[t] · (−p · (log p + entropy[t]))
//   dh += dz · w / temperature    (dh f32/bf16 [T, H], overwritten)
//   dw += dzᵀ · h / temperature   (dw f32 [V, H], accumulates)
// dz / temperature is rounded to h's dtype before the two GEMMs (bf16 GEMM operands in the bf16
// recipe; f32 stays f32); dh is summed over the chunks in fp32 and rounded once.
//
// h: [T, H]; w: [V, H]; targets: i32 [T] in [0, V); logprob, entropy, lse: f32 [T].
//
// Kept logits: given `kept_logits` (f32 [T·V] on h's device), the forward also stores each chunk's
// logits there and the backward reads them instead of recomputing them — one of the backward's
// three [T, V, H] GEMMs saved for T·V·4 bytes held from forward to backward (5 GB at 8192 tokens
// and Qwen3's vocabulary), with the same bits either way. Chunk c (v0 = c·kVocabChunk, n wide)
// is a row-major [T, n] block at offset T·v0: each chunk's GEMM writes one contiguous block.
//
// On CUDA (ops/cuda/lm_head.cu) h and w are bf16, and the same chunked fold runs on cuBLASLt
// logits: results differ from the CPU's by GEMM and reduction order (~1e-6 relative), and
// logits_logprob equals the forward bit for bit only where the two GEMMs round the logits alike —
// always under the exact forward kernels (ops/forward_kernels.h), where lm_head_logits runs the
// forward's chunk GEMMs and each runs one algorithm at every T: a row's logprob, entropy and lse
// are then the same bits in a batch of any size, through either path.
// Targets on CUDA are not checked (that would need a host sync): a target outside [0, V) gives a
// NaN logprob, and in the backward a NaN row of dh and NaN in dw.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace lockstep {

constexpr int64_t kVocabChunk = 4096;

void lm_head_logprob_forward(Tensor& logprob, Tensor& entropy, Tensor& lse, const Tensor& h,
                             const Tensor& w, const Tensor& targets, float temperature,
                             Tensor* kept_logits = nullptr);

void lm_head_logprob_backward(Tensor& dh, Tensor& dw, const Tensor& dlogprob,
                              const Tensor& dentropy, const Tensor& h, const Tensor& w,
                              const Tensor& targets, const Tensor& lse, const Tensor& entropy,
                              float temperature, const Tensor* kept_logits = nullptr);

// logits f32 [T, V] = h · wᵀ (not divided by a temperature): for sampling a few rows.
void lm_head_logits(Tensor& logits, const Tensor& h, const Tensor& w);

// The forward's fold over given logits rows: logprob/entropy of targets under logits / temperature.
void logits_logprob(Tensor& logprob, Tensor& entropy, const Tensor& logits, const Tensor& targets,
                    float temperature);

}  // namespace lockstep
