// model/moe.h — what a sparse (mixture-of-experts) layer needs besides its ops (ops/moe_route.h,
// ops/moe_combine.h): its weights in the recipe's form, the plan that sends tokens to experts, what
// the training forward keeps, and the router statistics of a batch (expert load, the
// load-balancing loss).
//
// The sparse MLP of one layer (model/transformer_moe.cpp), T tokens, E experts, top k:
//   logits [T, E] = n · gateᵀ                      the router, in the recipe's activation dtype
//                                                  (fp8 recipe: bf16, as in the bf16 recipe)
//   probs, ids, w = moe_route_forward(logits)      softmax in fp32, top-k, norm_topk_prob
//   rows [T·k, H] = n[token_of_row]                the tokens gathered by expert (plan_moe_dispatch)
//   rows[e's]     = down_e(swiglu(gate_up_e(rows[e's])))   the recipe's linear layers per expert
//                                                  (fp8: 1×128 / 128×128 blocks; one grouped GEMM
//                                                  over every expert for each projection)
//   out [T, H]    = Σ_j w_j · rows[slots[t, j]]     moe_combine_forward
// Every step treats a token independently of the others (a row's GEMM result does not depend on
// the other rows, ops/gemm.h), so a token gets the same bits in any batch: the rollout (one token
// per sequence) and the training forward compute the same function, bit for bit on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/expert_parallel.h"
#include "model/linear.h"

namespace lockstep {

// The fp8 copies of one projection of E experts (each W [N, K]) in one buffer, so that
// gemm_fp8_grouped (ops/gemm.h) reads them as they are: all.w [E·N, K] and all.wt [E·K, N] as
// Fp8Blocks (wt undefined where only a forward runs), expert e's in rows [e·N, (e + 1)·N) and
// [e·K, (e + 1)·K), its scales in block rows [e·⌈N/128⌉, …) and [e·⌈K/128⌉, …). Each expert's
// LinearWeight::fp8 is expert(e), a view: whatever writes the copies (LinearWeight::refresh, the
// optimizer's pass, a ZeRO-3 gather) writes them in place, into the stack. (Where N or K is not a
// multiple of 128 the views are just as valid; the grouped GEMM then cannot read the stack, and the
// model runs its per-expert loop.) A stack may hold a stretch of the experts only, [first, first +
// experts): with expert parallelism and ZeRO-3 a rank's own (train/sharded_weights.h).
struct StackedFp8Weight {
  Fp8Weight all;
  int64_t first = 0, experts = 0;

  static StackedFp8Weight empty(int64_t first, int64_t experts, int64_t n, int64_t k, Device device,
                                bool with_transpose);
  bool holds(int64_t e) const { return e >= first && e < first + experts; }
  // Views of experts [from, from + count)'s rows (wt undefined when all.wt is); they must be held.
  Fp8Weight range(int64_t from, int64_t count) const;
  Fp8Weight expert(int64_t e) const { return range(e, 1); }
};

struct MoeWeights {
  LinearWeight router;                      // [E, H]: fp32 recipe fp32, else a bf16 copy
  std::vector<LinearWeight> gate_up, down;  // per expert, the model's recipe
  // fp8 recipe: the experts' copies, gate_up[e].fp8 and down[e].fp8 views of them (empty while
  // the copies are dropped, train/sharded_weights.h).
  StackedFp8Weight gate_up_fp8, down_fp8;   // [E·2Im, H] (Wᵀ [E·H, 2Im]); [E·H, Im] (Wᵀ [E·Im, H])

  // fp8 recipe: allocates both stacks of experts [first, first + count) (the Wᵀ ones too with
  // `with_transpose`) and points each of those experts' LinearWeight::fp8 at its rows.
  void stack_fp8_copies(int64_t hidden, int64_t moe_intermediate, Device device, bool with_transpose,
                        int64_t first, int64_t count);
};

// Which rows of the gathered tensor each expert owns: the (token, j) pairs sorted by expert, then
// by token (ops/moe_dispatch.h, on the ids' device).
struct MoeDispatch {
  std::vector<int64_t> offsets;  // E + 1 host values: expert e owns rows [offsets[e], offsets[e + 1])
                                 // (empty when planned on the device alone)
  Tensor device_offsets;         // i64 [E + 1], the same on the ids' device
  Tensor token_of_row;           // i32 [T·k], on the ids' device
  Tensor slots;                  // i32 [T, k]: the row of (t, j), on the ids' device
};

// expert_ids: i32 [T, k] (ops/moe_route.h), on any device. With `read_back` the offsets are also
// copied to the host (the per-expert loops and the bf16 grouped GEMM size their GEMMs there); without,
// nothing is read back (the grouped fp8 GEMM takes device offsets alone: a CUDA graph's decode step).
MoeDispatch plan_moe_dispatch(const Tensor& expert_ids, int64_t num_experts, bool read_back = true);

// What the training forward of a sparse MLP keeps for its backward.
struct MoeActivations {
  Tensor hn;                               // the normed input [T, H] (the router's WGrad input)
  Tensor probs, expert_ids, weights;       // ops/moe_route.h (expert_ids: the ones used, replayed or not)
  Tensor lse;                              // f32 [T]: the router logits' logsumexp (router z-loss)
  MoeDispatch dispatch;
  Tensor rows;                             // the experts' outputs [T·k, H], by dispatch row
  // With expert parallelism (model/expert_parallel.h; else empty): the rows' route to this rank's
  // experts and back. The expert tensors below are then of the rows this rank received.
  ExpertParallelRoute expert_parallel;
  Tensor gate_up;                          // the SwiGLU input [rows, 2·Im], by dispatch row
  Tensor grouped_offsets;                  // i64 on the GPU: the grouped fp8 GEMMs' offsets (else undefined)
  // Per expert (empty: no tokens), what keep_for_backward leaves (fp8: the columnwise copies of
  // the expert's rows alone, whose 128-token blocks must not straddle experts).
  std::vector<LinearInput> gate_up_in, down_in;
};

// What one sparse layer's router did with a batch (host values).
struct RouterStats {
  // i32 [T, k] on the host: each token's experts as this router ranks them, best first (with routing
  // replay: what it would have chosen; the tokens went to the replayed experts).
  Tensor expert_ids;
  std::vector<int64_t> expert_tokens;  // [E]: tokens sent to each expert
  std::vector<double> prob_sums;       // [E]: Σ_t probs[t, e]
  double lse_square_sum = 0;           // Σ_t lse_t², lse_t = logsumexp of token t's router logits
                                       // (a training forward kept for the backward; else 0)
};

// transformers' load_balancing_loss_func over every sparse layer of a batch (the layers' rows
// concatenated, no padding mask): with N = Σ_layers T, C_e = Σ_layers expert_tokens[e] and
// P_e = Σ_layers prob_sums[e],
//   loss = E · Σ_e (C_e / N) · (P_e / N)
// (k for perfectly even routing, E when every token puts all its probability on the same k
// experts). 0 without layers.
double load_balancing_loss(const std::vector<RouterStats>& routing);
// d loss / d probs[t, e] of any layer and token: E · C_e / N² (the counts are not differentiable).
std::vector<double> load_balancing_gradient(const std::vector<RouterStats>& routing);

// ST-MoE's router z-loss over every sparse layer of a batch (the layers' rows concatenated, as
// load_balancing_loss pools them): with N = Σ_layers T, z = Σ_layers lse_square_sum / N. Its
// gradient w.r.t. a token's logits is (2 / N) · lse_t · probs[t] (d lse / d logits = softmax). 0
// without layers.
double router_z_loss(const std::vector<RouterStats>& routing);

// Tokens per expert of one layer: the most loaded expert's count and the mean (T·k / E).
struct ExpertLoad {
  int64_t max_tokens = 0;
  double mean_tokens = 0;
};
ExpertLoad expert_load(const RouterStats& stats);

}  // namespace lockstep
