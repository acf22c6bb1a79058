// ops/sample.h — drawing tokens from logits rows, and each token's logprob: the rollout engine's
// sampler (rollout/engine.h), on the device the logits are on.
//
// Draw d reads logits row l = logits[specs[d].row] (f32 [V]) under its temperature τ, top_k,
// top_p and Philox key (seed, stream, position). For τ > 0, with z = l / τ:
//   w     = exp(z − max z)                   the sampling weights (π = w / Σw)
//   order = the ids sorted by logit descending, equal logits by increasing id (−0 equals +0)
//   kept  = the first top_k ids of `order` (all when top_k = 0 or ≥ V); then, when top_p < 1, the
//           shortest prefix of those whose Σw reaches top_p · Σ_{first top_k} w
//   u     = philox_uniform53(philox_at(seed, stream, position)), in (0, 1] (core/philox.h)
//   token = the first kept id v in increasing id order with Σ_{kept v' ≤ v} w(v') ≥ u · Σ_kept w.
// τ = 0 is greedy: the lowest id of largest logit (top_k, top_p and the key are unused).
// A token is a function of its row and its spec alone: the same whatever else is drawn.
//
// logprobs[d] = logits_logprob (ops/lm_head.h) of the token in its row under τ (1 when greedy):
// after temperature, before truncation. On the CPU it is that op's fold and equals the training
// forward's bit for bit.
//
// A row holding a NaN, or whose max z is not finite (a diverged model), gives token −1 and logprob
// NaN; so does, on CUDA, a spec whose values are out of range (they are checked on the host only
// for CPU tensors, where they throw).
//
// On CUDA (ops/cuda/sample.cu) the weights are z = l · (1/τ), expf, and are summed as exact
// integers (w rounded to multiples of 2^-44): the kept set and the token are the CPU's except when
// a sum lands within float rounding of a boundary (in practice never; tests count such draws),
// and a weight below 2^-45 counts as zero (a probability below ~3e-14 relative to the largest).
// The logprob is the CUDA logits_logprob fold (≈ 1e-6 from the CPU's).
//
// logits: f32 [S, V], 0 < V ≤ kMaxSampleVocab; specs: i64 [D, kSampleSpecWords], row d holding the
// bytes of a SampleSpec (sample_specs_tensor); tokens: i32 [D]; logprobs: f32 [D]; one device.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace lockstep {

struct SampleSpec {
  uint64_t seed = 0, stream = 0, position = 0;  // the Philox key of the draw
  int32_t row = 0;                              // in [0, S)
  float temperature = 1.0f;                     // finite, ≥ 0; 0 = greedy
  float top_p = 1.0f;                           // (0, 1]
  int32_t top_k = 0;                            // ≥ 0; 0 = no limit
};
static_assert(sizeof(SampleSpec) == 40 && alignof(SampleSpec) == 8);

constexpr int64_t kSampleSpecWords = int64_t(sizeof(SampleSpec) / 8);
// Ids take 19 bits in the CUDA kernel's sort keys (Qwen's 151936 fits with room).
constexpr int kSampleIdBits = 19;
constexpr int64_t kMaxSampleVocab = int64_t(1) << kSampleIdBits;

// The specs as the op reads them: i64 [specs.size(), kSampleSpecWords] on the CPU.
Tensor sample_specs_tensor(std::span<const SampleSpec> specs);

void sample_tokens(Tensor& tokens, Tensor& logprobs, const Tensor& logits, const Tensor& specs);

}  // namespace lockstep
