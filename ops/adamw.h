// ops/adamw.h — one AdamW step (decoupled weight decay, Loshchilov & Hutter) on an fp32 master
// tensor, with the gradient multiplied first by `grad_scale` (the clipping factor):
//
//   g  = grad · grad_scale
//   m  = β1·m + (1 − β1)·g
//   v  = β2·v + (1 − β2)·g²
//   p -= lr · ( (m / (1 − β1^step)) / (sqrt(v / (1 − β2^step)) + eps) + weight_decay · p )
//
// param, m, v, grad: f32 of one shape, on one device. step counts from 1. fp32 math, elementwise;
// the CPU and CUDA backends give identical bits, NaN payloads aside (ops/adamw_element.h; the bias
// corrections are computed once on the host, in double, then used in fp32).
//
// The step can also write the copies of the updated param that the GEMMs read, in the same pass
// over it on CUDA (WeightCopies): the result is exactly adamw_step followed by
//   convert(*bf16, param)                        bf16: bf16 of param's shape
//   quantize_weight(*fp8, param, fp8_format)     fp8: param [N, K], N and K multiples of 16
//                                                (CUDA fuses it where they are multiples of 128)
// Either pointer may be null. Params of other shapes (norm weights, embeddings) take the bf16 copy
// or none. CUDA tensors must be 16-byte aligned (as Tensor::empty allocates them).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep {

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

struct WeightCopies {
  Tensor* bf16 = nullptr;
  Fp8Weight* fp8 = nullptr;
  ScaleFormat fp8_format = ScaleFormat::fp32;
};

void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWHyper& hyper,
                int64_t step, float grad_scale, const WeightCopies& copies = {});

}  // namespace lockstep
