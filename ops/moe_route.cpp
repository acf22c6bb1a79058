// ops/moe_route.cpp — argument checks and backend dispatch for ops/moe_route.h.
#include "ops/moe_route.h"

#include "ops/act_check.h"
#include "ops/moe_route_backends.h"

namespace lockstep {

namespace {

// logits [T, E] (it sets the device); expert_ids, weights [T, k]: returns k.
int64_t check_routing(const Tensor& logits, const Tensor& probs, const Tensor& expert_ids,
                      const Tensor& weights, const char* op) {
  const std::string name(op);
  check_act(logits, (name + ": logits").c_str(), logits.device(), logits.shape());
  LOCKSTEP_CHECK(logits.rank() == 2 && logits.dim(1) > 0, op,
                 ": logits: expected a 2-D tensor [T, E], got ", logits.describe());
  const Device d = logits.device();
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_tensor(probs, (name + ": probs").c_str(), DType::f32, d);
  check_shape(probs, (name + ": probs").c_str(), {T, E});
  check_tensor(expert_ids, (name + ": expert_ids").c_str(), DType::i32, d);
  LOCKSTEP_CHECK(expert_ids.rank() == 2 && expert_ids.dim(0) == T && expert_ids.dim(1) >= 1 &&
                     expert_ids.dim(1) <= E,
                 op, ": expert_ids: expected [T, k] with 1 <= k <= E = ", E, ", got ",
                 expert_ids.describe());
  const int64_t k = expert_ids.dim(1);
  check_tensor(weights, (name + ": weights").c_str(), DType::f32, d);
  check_shape(weights, (name + ": weights").c_str(), {T, k});
  return k;
}

// expert_ids on the CPU: each in [0, E), no expert twice in a row.
void check_expert_ids(const Tensor& expert_ids, int64_t E, const char* op) {
  const int64_t k = expert_ids.dim(1);
  const int32_t* ids = expert_ids.data_as<int32_t>();
  for (int64_t i = 0; i < expert_ids.numel(); ++i) {
    LOCKSTEP_CHECK(ids[i] >= 0 && ids[i] < E, op, ": expert_ids[", i / k, ", ", i % k, "] = ", ids[i],
                   " is not an expert of [0, ", E, ")");
    for (int64_t j = i - i % k; j < i; ++j)
      LOCKSTEP_CHECK(ids[j] != ids[i], op, ": expert_ids[", i / k, "] names expert ", ids[i], " twice");
  }
}

}  // namespace

void moe_route_forward(Tensor& probs, Tensor& expert_ids, Tensor& weights, const Tensor& logits,
                       bool normalize, Tensor* lse) {
  check_routing(logits, probs, expert_ids, weights, "moe_route_forward");
  if (lse) {
    check_tensor(*lse, "moe_route_forward: lse", DType::f32, logits.device());
    check_shape(*lse, "moe_route_forward: lse", {logits.dim(0)});
  }
  if (logits.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    return cuda::moe_route_forward(probs, expert_ids, weights, logits, normalize, lse);
#else
    LOCKSTEP_NO_CUDA_OP("moe_route_forward");
#endif
  }
  cpu::moe_route_forward(probs, expert_ids, weights, logits, normalize, lse);
}

void moe_route_weights(Tensor& weights, const Tensor& probs, const Tensor& expert_ids, bool normalize) {
  const Device d = probs.device();
  check_tensor(probs, "moe_route_weights: probs", DType::f32, d);
  LOCKSTEP_CHECK(probs.rank() == 2 && probs.dim(1) > 0, "moe_route_weights: probs: expected [T, E], got ",
                 probs.describe());
  const int64_t T = probs.dim(0), E = probs.dim(1);
  check_tensor(expert_ids, "moe_route_weights: expert_ids", DType::i32, d);
  LOCKSTEP_CHECK(expert_ids.rank() == 2 && expert_ids.dim(0) == T && expert_ids.dim(1) >= 1 &&
                     expert_ids.dim(1) <= E,
                 "moe_route_weights: expert_ids: expected [T, k] with 1 <= k <= E = ", E, ", got ",
                 expert_ids.describe());
  check_tensor(weights, "moe_route_weights: weights", DType::f32, d);
  check_shape(weights, "moe_route_weights: weights", expert_ids.shape());
  if (d == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    return cuda::moe_route_weights(weights, probs, expert_ids, normalize);
#else
    LOCKSTEP_NO_CUDA_OP("moe_route_weights");
#endif
  }
  check_expert_ids(expert_ids, E, "moe_route_weights");
  cpu::moe_route_weights(weights, probs, expert_ids, normalize);
}

void moe_route_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& dprobs,
                        const Tensor& probs, const Tensor& expert_ids, const Tensor& weights,
                        bool normalize, const Tensor& lse, float z_scale) {
  check_routing(dlogits, probs, expert_ids, weights, "moe_route_backward");
  const Device d = dlogits.device();
  check_tensor(dweights, "moe_route_backward: dweights", DType::f32, d);
  check_shape(dweights, "moe_route_backward: dweights", weights.shape());
  if (dprobs.defined()) {
    check_tensor(dprobs, "moe_route_backward: dprobs", DType::f32, d);
    check_shape(dprobs, "moe_route_backward: dprobs", probs.shape());
  }
  if (lse.defined()) {
    check_tensor(lse, "moe_route_backward: lse", DType::f32, d);
    check_shape(lse, "moe_route_backward: lse", {probs.dim(0)});
  }
  if (d == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    return cuda::moe_route_backward(dlogits, dweights, dprobs, probs, expert_ids, weights, normalize,
                                    lse, z_scale);
#else
    LOCKSTEP_NO_CUDA_OP("moe_route_backward");
#endif
  }
  check_expert_ids(expert_ids, probs.dim(1), "moe_route_backward");
  cpu::moe_route_backward(dlogits, dweights, dprobs, probs, expert_ids, weights, normalize, lse, z_scale);
}

}  // namespace lockstep
