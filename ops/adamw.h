// ops/adamw.h — one AdamW step (decoupled weight decay, Loshchilov & Hutter) on an fp32 master
// tensor, with the gradient multiplied first by `grad_scale` (the clipping factor):
//
//   g  = grad · grad_scale
//   m  = β1·m + (1 − β1)·g
//   v  = β2·v + (1 − β2)·g²
//   p -= lr · ( (m / (1 − β1^step)) / (sqrt(v / (1 − β2^step)) + eps) + weight_decay · p )
//
// param, m, v, grad: f32 of one shape. step counts from 1. fp32 math, elementwise.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace lockstep {

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWHyper& hyper,
                int64_t step, float grad_scale);

}  // namespace lockstep
