// ops/lm_head_backends.h — per-backend entry points for ops/lm_head.h; arguments are checked by
// ops/lm_head.cpp. CUDA: h and w bf16; target values unchecked (ops/lm_head.h says what they give).
#pragma once

#include "core/tensor.h"

namespace lockstep::cpu {
void lm_head_logprob_forward(Tensor& logprob, Tensor& entropy, Tensor& lse, const Tensor& h,
                             const Tensor& w, const Tensor& targets, float temperature,
                             Tensor* kept_logits);
// dlogprob, dentropy: undefined tensors read as zeros; kept_logits: null = recompute.
void lm_head_logprob_backward(Tensor& dh, Tensor& dw, const Tensor& dlogprob,
                              const Tensor& dentropy, const Tensor& h, const Tensor& w,
                              const Tensor& targets, const Tensor& lse, const Tensor& entropy,
                              float temperature, const Tensor* kept_logits);
void lm_head_logits(Tensor& logits, const Tensor& h, const Tensor& w);
void logits_logprob(Tensor& logprob, Tensor& entropy, const Tensor& logits, const Tensor& targets,
                    float temperature);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
// dlogprob, dentropy: undefined tensors read as zeros; kept_logits: null = recompute.
void lm_head_logprob_forward(Tensor& logprob, Tensor& entropy, Tensor& lse, const Tensor& h,
                             const Tensor& w, const Tensor& targets, float temperature,
                             Tensor* kept_logits);
void lm_head_logprob_backward(Tensor& dh, Tensor& dw, const Tensor& dlogprob,
                              const Tensor& dentropy, const Tensor& h, const Tensor& w,
                              const Tensor& targets, const Tensor& lse, const Tensor& entropy,
                              float temperature, const Tensor* kept_logits);
void lm_head_logits(Tensor& logits, const Tensor& h, const Tensor& w);
void logits_logprob(Tensor& logprob, Tensor& entropy, const Tensor& logits, const Tensor& targets,
                    float temperature);
}  // namespace lockstep::cuda
