// ops/moe_route.h — the router of a sparse (mixture-of-experts) layer after its linear: which k of E
// experts each token goes to, and with what weight (transformers' Qwen3MoeSparseMoeBlock).
//
//   forward   probs [T, E]   = softmax(logits) in fp32: m = max, e = exp(z − m), p = e / Σe (the sum
//                              in expert order)
//             expert_ids [T, k] = the k largest probs in decreasing order; equal probs: the lower
//                              expert index first (a stable sort's order, as TensorFlow's top_k and
//                              ONNX TopK define it; torch.topk leaves the order of ties unspecified
//                              and its CPU kernel can pick a higher index, pytorch/pytorch#88184),
//                              so equal probabilities route alike on every backend; NaN never wins
//             weights [T, k]  = probs[t, expert_ids[t, j]], divided by their sum (in j order) when
//                              `normalize` (norm_topk_prob)
//             lse [T]         = m + log(Σe), the logits' logsumexp (optional: the router z-loss's)
//   weights   moe_route_weights: the weights of given expert_ids (routing replay: the rollout's
//             experts, weighted by this router's probs), computed as the forward computes them, so
//             that ids equal to the forward's give its weights bit for bit
//   backward  from dweights [T, k] and dprobs [T, E] (the load-balancing loss's; undefined: zero):
//             dp[e] = dprobs[e] + Σ_{j: id_j = e} (normalize ? (dw_j − Σ_i dw_i·w_i) / s : dw_j),
//             s = Σ_j probs[id_j];  dlogits[e] = p[e] · (dp[e] − Σ_m p[m]·dp[m])  (sums in index order)
//             and, with lse given, + z_scale · lse[t] · p[e]: the gradient of (z_scale / 2) · lse[t]²
//             (d lse / d logits = p), the router z-loss's
//
// logits, dlogits: f32 or bf16 (the recipe's activations); probs, weights, dweights, dprobs, lse:
// f32; expert_ids: i32. A row's results depend on that row alone. CUDA: one thread per token, the same
// operations in the same order as the CPU (expf instead of std::exp: bits may differ from the CPU's,
// but repeat run to run).
#pragma once

#include "core/tensor.h"

namespace lockstep {

void moe_route_forward(Tensor& probs, Tensor& expert_ids, Tensor& weights, const Tensor& logits,
                       bool normalize, Tensor* lse = nullptr);
// expert_ids: k distinct experts per token (checked on the CPU).
void moe_route_weights(Tensor& weights, const Tensor& probs, const Tensor& expert_ids, bool normalize);
void moe_route_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& dprobs,
                        const Tensor& probs, const Tensor& expert_ids, const Tensor& weights,
                        bool normalize, const Tensor& lse = Tensor(), float z_scale = 0);

}  // namespace lockstep
