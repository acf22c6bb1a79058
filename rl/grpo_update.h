// rl/grpo_update.h — steps 3 to 5 of a GRPO step (rl/train.h) on groups that are already sampled
// and scored: advantages, old-policy (and reference) logprobs, and the PPO update. The loop calls
// it with the rollout's groups; tests call it with hand-built ones.
//
//   3. advantages: group_advantages (train/advantages.h) over the rewards of `groups`, with
//      loss.scale_rewards; every token of a response gets its sample's advantage.
//   4. old logprobs: the training forward at the rollout temperature (the proximal policy), or the
//      rollout's own with loss.reuse_rollout_logprobs (then the training forward runs only when
//      `check_reused_logprobs` asks, for the mismatch metrics); the reference's when `reference`
//      is given.
//   5. optim.ppo_epochs passes; each splits the sequences, in order, into optim.mini_batches
//      mini-batches of ⌊S·k/M⌋..⌊S·(k+1)/M⌋ (M = min(mini_batches, S)) and takes one optimizer
//      step per mini-batch; inside one, micro-batches of at most optim.micro_batch_tokens tokens
//      accumulate gradients, each normalized by the whole mini-batch's count
//      (train/policy_loss.h). TIS acts in every precision mode when loss.tis_cap > 0: the weight
//      min(exp(old − rollout), C) is exactly 1 where the two logprobs agree. A sparse model's
//      mini-batch loss also gets coef · its load-balancing loss (loss.router_aux_loss_coef) and
//      coef · its router z-loss (loss.router_z_coef), each micro-batch's weighted by its share of
//      the mini-batch's rows.
//
// Sparse models whose samples carry the rollout's routing (GeneratedSample::expert_ids): with
// model.routing_replay every training forward (steps 4 and 5; not the reference's) sends the tokens
// to the rollout's experts (TrainBatch::replay_experts).
//
// A mini-batch whose loss is not finite, or whose gradient is not (OptimizerStep::applied false),
// changes nothing: its gradients are zeroed and `optimizer_step` is not called for it, so the
// weights, the optimizer's moments, its step count and the learning-rate schedule stay where they
// were. `skipped` names the first such mini-batch's cause.
//
// No groups (dynamic sampling dropped them all): nothing happens, and the metrics are empty.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rl/run_config.h"
#include "dist/single_rank.h"
#include "model/transformer.h"
#include "train/layerwise_reduce.h"
#include "rl/metrics.h"
#include "rollout/engine.h"
#include "train/optimizer.h"

namespace lockstep {

// One prompt's samples and their rewards.
struct ScoredGroup {
  std::vector<int32_t> prompt;
  std::vector<GeneratedSample> samples;  // G ≥ 2, with the rollout's logprobs
  std::vector<float> rewards;            // G: the task reward plus any overlong penalty
};

// One optimizer step over this rank's accumulated gradients (in the loop: the data-parallel
// optimizer, train/data_parallel.h, which sums them over the ranks, with the rollout's weight
// copies).
using OptimizerStepFn = std::function<OptimizerStep(ModelParameters& params, ModelParameters& grads)>;

struct GrpoUpdate {
  // loss, entropy, kl_ref, clip_frac, clip_frac_dual, grad_norm, lr, the mismatch metrics and
  // tis_clip_frac (token means over the update; grad_norm and lr of the last applied step, NaN
  // when none was); optimizer_steps: the steps applied. The mismatch metrics (mismatch_abs,
  // mismatch_tokens_differ, mismatch_mult_prob_error, mismatch_k3: train/rollout_mismatch.h)
  // compare the training forward's recomputed logprobs with the rollout's; NaN, and no
  // mismatch series, where nothing was recomputed (reused logprobs, no check).
  Metrics metrics;
  // Sparse models also: router_aux_loss (the load-balancing loss, model/moe.h, row-weighted mean
  // over the update's forwards, whether or not loss.router_aux_loss_coef adds it to the loss);
  // router_z_loss (likewise, when loss.router_z_coef > 0); when the samples carry their routing,
  // routing_disagreement and routing_disagreement_layers (train/routing_disagreement.h: of the
  // response tokens the rollout ran, the share whose experts differ in any sparse layer, and the
  // share of (token, layer) pairs, against the router's own choices in the old-logprob recompute,
  // or with reused rollout logprobs in the first epoch's forwards).
  // mismatch_abs_by_position and mismatch_tokens_by_position (train/rollout_mismatch.h), bins of
  // run.mismatch_bin_tokens response positions; sparse models: expert_tokens_max and
  // expert_tokens_mean, per sparse layer, the most loaded expert's tokens and the mean over the
  // experts in the first PPO epoch's forwards (every sequence once; a token counts once per
  // expert it is routed to).
  MetricSeries series;
  std::string skipped;  // the cause of the first skipped mini-batch, or empty
  int64_t optimizer_steps = 0;
  double recompute_seconds = 0, update_seconds = 0;
};

// With several ranks (`comm`), `groups` are this rank's share of the batch: the global batch is the
// ranks' groups in rank order, and every rank calls grpo_update with the same config. Advantages,
// mini-batches, loss normalizers and metrics are those of the global batch; each rank computes
// the loss of its own sequences of each mini-batch, and `optimizer_step` sums the gradients over
// the ranks (train/data_parallel.h) and leaves every rank with the same weights. With one rank this is the
// single-process update, unchanged. `layerwise`: a sharded run's per-layer gradient
// reduce-scatter (train/layerwise_reduce.h; null: none), whose gradients a skipped mini-batch
// discards. When the model's passes run hooks (Transformer::has_pass_hooks: that reduce-scatter,
// or weight copies gathered per layer, train/sharded_weights.h) the ranks agree on the number of
// forwards of the old-logprob recompute and of micro-batches of each mini-batch, and make up for
// the passes they lack (Transformer::skip_forward, skip_backward).
// `check_reused_logprobs` (with loss.reuse_rollout_logprobs; the same on every rank): recompute
// the old logprobs too, only to measure the mismatch (rollout.exact_check_every).
GrpoUpdate grpo_update(const std::vector<ScoredGroup>& groups, const Config& config,
                       Transformer& model, Transformer* reference,
                       const OptimizerStepFn& optimizer_step, Communicator& comm = single_rank(),
                       LayerwiseReduce* layerwise = nullptr, bool check_reused_logprobs = false);

}  // namespace lockstep
