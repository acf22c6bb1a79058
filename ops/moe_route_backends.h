// ops/moe_route_backends.h — per-backend entry points for ops/moe_route.h; arguments are checked by
// ops/moe_route.cpp.
#pragma once

#include "core/tensor.h"

namespace lockstep::cpu {
void moe_route_forward(Tensor& probs, Tensor& expert_ids, Tensor& weights, const Tensor& logits,
                       bool normalize, Tensor* lse);
void moe_route_weights(Tensor& weights, const Tensor& probs, const Tensor& expert_ids, bool normalize);
void moe_route_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& dprobs,
                        const Tensor& probs, const Tensor& expert_ids, const Tensor& weights,
                        bool normalize, const Tensor& lse, float z_scale);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void moe_route_forward(Tensor& probs, Tensor& expert_ids, Tensor& weights, const Tensor& logits,
                       bool normalize, Tensor* lse);
void moe_route_weights(Tensor& weights, const Tensor& probs, const Tensor& expert_ids, bool normalize);
void moe_route_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& dprobs,
                        const Tensor& probs, const Tensor& expert_ids, const Tensor& weights,
                        bool normalize, const Tensor& lse, float z_scale);
}  // namespace lockstep::cuda
