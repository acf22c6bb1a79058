// model/sft_loss.h — supervised fine-tuning cross-entropy from per-token logprobs:
//
//   loss = −Σ_t mask[t] · logprob[t] / Σ_t mask[t]        dloss/dlogprob[t] = −mask[t] / Σ mask
//
// mask: f32 [T] (1 for tokens the loss counts, 0 for prompt tokens and the last row of each
// sequence; other non-negative weights allowed). logprob from Transformer::forward.
#pragma once

#include "core/tensor.h"

namespace lockstep {

struct SftLoss {
  double loss = 0;
  double tokens = 0;  // Σ mask
  Tensor dlogprob;    // f32 [T], for Transformer::backward
};

SftLoss sft_loss(const Tensor& logprob, const Tensor& mask);

}  // namespace lockstep
