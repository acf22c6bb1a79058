// rl/grpo_update.cpp
#include "rl/grpo_update.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <span>

#include "core/device.h"
#include "core/error.h"
#include "dist/host_values.h"
#include "rl/packed_rows.h"
#include "train/advantages.h"
#include "train/policy_loss.h"
#include "train/rollout_mismatch.h"
#include "train/routing_disagreement.h"

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;

RewardScaling reward_scaling(const std::string& s) {
  return s == "batch" ? RewardScaling::batch : s == "none" ? RewardScaling::none : RewardScaling::group;
}

LossAggregation aggregation(const std::string& s) {
  if (s == "sequence-mean") return LossAggregation::sequence_mean;
  if (s == "sequence-mean-token-sum") return LossAggregation::sequence_mean_token_sum;
  if (s == "token-sum-norm") return LossAggregation::token_sum_norm;
  return LossAggregation::token_mean;
}

PolicyLossConfig loss_config(const Config& c) {
  const LossOptions& o = c.loss;
  PolicyLossConfig p;
  p.clip_low = float(o.clip_low);
  p.clip_high = float(o.clip_high);
  p.clip_ratio_c = float(o.clip_ratio_c);
  p.aggregation = aggregation(o.aggregation);
  p.kl_coef = float(o.kl_coef);
  p.kl_estimator = o.kl_estimator == "k1" ? KlEstimator::k1 : KlEstimator::k3;
  p.tis_cap = float(o.tis_cap);
  p.adaptive_clip = o.adaptive_clip;
  p.max_response_tokens = double(c.rollout.max_new_tokens);
  return p;
}

// The load-balancing loss's weight for a sparse model: loss.router_aux_loss_coef, or (-1) what
// transformers' Qwen3MoeForCausalLM adds: config.json's router_aux_loss_coef when
// output_router_logits is true, else nothing. 0 for dense models.
double router_aux_coef(const Config& c, const ModelConfig& model) {
  if (!model.moe) return 0;
  if (c.loss.router_aux_loss_coef >= 0) return c.loss.router_aux_loss_coef;
  return model.moe->output_router_logits ? model.moe->router_aux_loss_coef : 0;
}

// Tokens routed to each expert of each sparse layer, summed over forwards (layer-major; sized by
// the config, so that every rank sums vectors of one length).
struct ExpertCounts {
  size_t layers = 0, experts = 0;
  std::vector<double> tokens;
  explicit ExpertCounts(const ModelConfig& c) {
    layers = size_t(c.sparse_layers());
    experts = c.moe ? size_t(c.moe->num_experts) : 0;
    tokens.assign(layers * experts, 0.0);
  }
  void add(const std::vector<RouterStats>& routing) {
    for (size_t l = 0; l < routing.size(); ++l)
      for (size_t e = 0; e < experts; ++e) tokens[l * experts + e] += double(routing[l].expert_tokens[e]);
  }
};

// The rows whose routing the disagreement metric compares: those whose token was generated and
// run through the model by the rollout (a row predicting response position p ≥ 1 holds the
// response's token p − 1; the last row's token was never run).
std::vector<uint8_t> generated_rows(const PackedRows& rows) {
  std::vector<uint8_t> counted(rows.tokens.size());
  for (size_t t = 0; t < counted.size(); ++t) counted[t] = rows.response_position[t] >= 1;
  return counted;
}

}  // namespace

GrpoUpdate grpo_update(const std::vector<ScoredGroup>& groups, const Config& config,
                       Transformer& model, Transformer* reference,
                       const OptimizerStepFn& optimizer_step, Communicator& comm,
                       LayerwiseReduce* layerwise, bool check_reused_logprobs) {
  GrpoUpdate out;
  const LossOptions& lo = config.loss;
  const OptimOptions& oo = config.optim;
  const int64_t budget = oo.micro_batch_tokens;
  const float temperature = float(config.rollout.temperature);

  // The global batch is the ranks' groups in rank order; this rank's sequences are
  // [lo_seq, lo_seq + local) of it.
  const std::vector<double> group_counts = gather_over_ranks(comm, std::vector{double(groups.size())});
  const int64_t global_groups = int64_t(std::accumulate(group_counts.begin(), group_counts.end(), 0.0));
  if (global_groups == 0) return out;

  // 3. advantages, one per sequence (over the global batch: loss.scale_rewards = batch takes the
  // std of every rank's rewards)
  size_t g = 0;
  for (const ScoredGroup& group : groups) g = std::max(g, group.samples.size());
  g = size_t(max_over_ranks(comm, double(g)));
  std::vector<float> rewards;
  PackedRows rows;
  for (size_t i = 0; i < groups.size(); ++i) {
    const ScoredGroup& group = groups[i];
    LOCKSTEP_CHECK(group.samples.size() == g && group.rewards.size() == g, "grpo_update: group ", i,
                   " has ", group.samples.size(), " samples and ", group.rewards.size(),
                   " rewards, expected ", g, " (as every group of the batch)");
    rewards.insert(rewards.end(), group.rewards.begin(), group.rewards.end());
    for (const GeneratedSample& sample : group.samples)
      rows.add(group.prompt, sample.tokens, sample.logprobs, sample.expert_ids);
  }
  const size_t local = rows.sequences();
  size_t lo_seq = 0;
  for (int r = 0; r < comm.rank(); ++r) lo_seq += size_t(group_counts[size_t(r)]) * g;
  const std::vector<float> global_advantage = group_advantages(
      gather_over_ranks(comm, std::span<const float>(rewards)), int64_t(g),
      GroupAdvantageConfig{.scaling = reward_scaling(lo.scale_rewards)});
  const std::vector<float> seq_advantage(global_advantage.begin() + ptrdiff_t(lo_seq),
                                         global_advantage.begin() + ptrdiff_t(lo_seq + local));

  // Sparse models: routing replay sends the training forwards' tokens to the rollout's experts;
  // the rows' own router choices (of the old-logprob recompute, else of the first epoch's update
  // forwards) go to the routing-disagreement metric when the rollout recorded its routing.
  const int64_t replay_k = config.model.routing_replay ? model.config().moe->num_experts_per_tok : 0;
  // (Decided alike on every rank: the metric's sums are collective.)
  const bool disagreement = model.config().moe && max_over_ranks(comm, double(rows.routing_width)) > 0;
  std::vector<int32_t> router_experts;

  // 4. old-policy (and reference) logprobs. Reused from the rollout, they are recomputed only on
  // a check step, for the mismatch metrics: the update reads the rollout's either way. When the
  // passes run hooks, as many forwards on every rank (agreed on before any: the hooks'
  // collectives interleave with them).
  auto t0 = Clock::now();
  const bool recompute = !lo.reuse_rollout_logprobs || check_reused_logprobs;
  const double forwards = double(plan_micro_batches(rows.lengths, budget).size());
  const double most_forwards =
      recompute && model.has_pass_hooks() ? max_over_ranks(comm, forwards) : 0;
  std::vector<float> recomputed;
  if (recompute)
    recomputed = forward_logprobs(model, rows, budget, temperature, replay_k,
                                  disagreement && !lo.reuse_rollout_logprobs ? &router_experts : nullptr);
  for (double k = forwards; k < most_forwards; ++k) model.skip_forward();
  const std::vector<float>& old_logprob = lo.reuse_rollout_logprobs ? rows.rollout_logprob : recomputed;
  std::vector<float> ref_logprob;
  if (reference) ref_logprob = forward_logprobs(*reference, rows, budget, temperature);
  out.recompute_seconds = device_seconds_since(t0);
  if (!recompute) {
    // Nothing to compare the rollout's logprobs with: not measured at this step.
    out.metrics = {{"mismatch_abs", NAN}, {"mismatch_tokens_differ", NAN},
                   {"mismatch_mult_prob_error", NAN}, {"mismatch_k3", NAN}};
  } else {
    // The mismatch metrics of the global batch: every rank's rows, in rank order.
    const std::vector<float> old_all = gather_over_ranks(comm, std::span<const float>(recomputed));
    const std::vector<float> rollout_all = gather_over_ranks(comm, std::span<const float>(rows.rollout_logprob));
    const std::vector<float> mask_all = gather_over_ranks(comm, std::span<const float>(rows.mask));
    const std::vector<double> position_all = gather_over_ranks(
        comm, std::span<const double>(std::vector<double>(rows.response_position.begin(),
                                                          rows.response_position.end())));
    const std::vector<int64_t> positions(position_all.begin(), position_all.end());
    const RolloutMismatch mismatch = rollout_mismatch(old_all, rollout_all, mask_all);
    const MismatchByPosition by_position = rollout_mismatch_by_position(
        old_all, rollout_all, mask_all, positions, config.run.mismatch_bin_tokens);
    out.series = {{"mismatch_abs_by_position", by_position.mean_abs_diff},
                  {"mismatch_tokens_by_position", by_position.tokens}};
    out.metrics = {{"mismatch_abs", mismatch.mean_abs_diff},
                   {"mismatch_tokens_differ", mismatch.tokens_differ},
                   {"mismatch_mult_prob_error", mismatch.mult_prob_error},
                   {"mismatch_k3", mismatch.kl_k3}};
  }

  // Response tokens of every sequence of the global batch (the token-mean normalizer).
  std::vector<double> local_tokens(local, 0.0);
  for (size_t q = 0; q < local; ++q)
    for (int32_t t = rows.cu[q]; t < rows.cu[q + 1]; ++t) local_tokens[q] += rows.mask[size_t(t)];
  const std::vector<double> sequence_tokens = gather_over_ranks(comm, std::span<const double>(local_tokens));

  // 5. PPO update: mini-batches of whole sequences of the global batch, each rank's part of one
  // in micro-batches; each optimizer step sums the ranks' gradients (train/data_parallel.h) and
  // leaves every rank with the same weights.
  t0 = Clock::now();
  PolicyLossConfig cfg = loss_config(config);
  const size_t sequences = sequence_tokens.size();
  const int64_t minis = std::min<int64_t>(oo.mini_batches, int64_t(sequences));
  double loss_sum = 0, clip = 0, clip_dual = 0, kl_ref = 0, tis_clip = 0, entropy = 0, counted = 0;
  // Sparse models: the load-balancing loss, each micro-batch's weighted by its share of the
  // mini-batch's rows (so a mini-batch adds coef · its rows' loss, as one forward would); and the
  // expert load of the first epoch (every sequence once).
  const double aux_coef = router_aux_coef(config, model.config());
  const double z_coef = model.config().moe ? lo.router_z_coef : 0.0;
  double aux_sum = 0, aux_rows = 0, z_sum = 0;
  ExpertCounts expert_counts(model.config());
  double grad_norm = NAN, lr = NAN;
  for (int64_t epoch = 0; epoch < oo.ppo_epochs; ++epoch) {
    for (int64_t mb = 0; mb < minis; ++mb) {
      const size_t global_first = sequences * size_t(mb) / size_t(minis);
      const size_t global_last = sequences * size_t(mb + 1) / size_t(minis);
      const double tokens = std::accumulate(sequence_tokens.begin() + ptrdiff_t(global_first),
                                            sequence_tokens.begin() + ptrdiff_t(global_last), 0.0);
      cfg.normalizer = cfg.aggregation == LossAggregation::token_mean ? tokens
                                                                      : double(global_last - global_first);
      // This rank's sequences of the mini-batch (possibly none).
      const size_t first = std::clamp(global_first, lo_seq, lo_seq + local) - lo_seq;
      const size_t last = std::clamp(global_last, lo_seq, lo_seq + local) - lo_seq;
      double mini_loss = 0;
      const auto lengths = std::span<const int64_t>(rows.lengths).subspan(first, last - first);
      const double local_rows = double(std::accumulate(lengths.begin(), lengths.end(), int64_t(0)));
      const double mini_rows = aux_coef > 0 || z_coef > 0 ? sum_over_ranks(comm, local_rows) : 0;
      const std::vector<SequenceRange> micro_batches = plan_micro_batches(lengths, budget);
      // The ranks agree on the number of passes first (each reduces gradients, or gathers weights,
      // layer by layer): one with fewer micro-batches makes up for the others' after its own.
      const double passes = model.has_pass_hooks() ? max_over_ranks(comm, double(micro_batches.size())) : 0;
      for (const SequenceRange& r : micro_batches) {
        size_t offset = 0;
        const TrainBatch b = slice_batch(rows, first + r.first, first + r.last,
                                         model.config().vocab_size, model.device(), offset, replay_k);
        TrainForward f = model.forward(b, temperature);
        if (disagreement && lo.reuse_rollout_logprobs && epoch == 0) append_router_experts(router_experts, f.routing);
        const std::vector<float> lp = host_floats(f.logprob), ent = host_floats(f.entropy);
        const size_t len = lp.size();
        std::vector<int32_t> cu;
        for (size_t q = first + r.first; q <= first + r.last; ++q)
          cu.push_back(rows.cu[q] - int32_t(offset));
        auto sub = [&](const std::vector<float>& v) {
          return v.empty() ? std::span<const float>() : std::span<const float>(v).subspan(offset, len);
        };
        PolicyLossInputs in;
        in.logprob = lp;
        in.old_logprob = sub(old_logprob);
        if (cfg.tis_cap > 0) in.rollout_logprob = sub(rows.rollout_logprob);
        if (reference) in.ref_logprob = sub(ref_logprob);
        in.entropy = ent;
        in.mask = sub(rows.mask);
        in.cu_seqlens = cu;
        in.advantage = std::span<const float>(seq_advantage).subspan(first + r.first, r.last - r.first);
        const PolicyLoss pl = policy_loss(in, cfg);
        mini_loss += pl.loss;
        double aux_weight = 0, z_weight = 0;
        if (!f.routing.empty()) {
          const double aux = load_balancing_loss(f.routing);
          aux_sum += aux * double(len);
          aux_rows += double(len);
          if (epoch == 0) expert_counts.add(f.routing);
          if (aux_coef > 0) {
            aux_weight = aux_coef * double(len) / mini_rows;
            mini_loss += aux_weight * aux;
          }
          if (z_coef > 0) {
            const double z = router_z_loss(f.routing);
            z_sum += z * double(len);
            z_weight = z_coef * double(len) / mini_rows;
            mini_loss += z_weight * z;
          }
        }
        if (std::isfinite(pl.loss))
          model.backward(f, pl.dlogprob.to(model.device()), Tensor(), aux_weight, z_weight);
        else model.skip_backward(&f);
        clip += (pl.clip_frac_low + pl.clip_frac_high) * pl.tokens;
        clip_dual += pl.clip_frac_dual * pl.tokens;
        kl_ref += pl.kl_ref * pl.tokens;
        tis_clip += pl.tis_clip_frac * pl.tokens;
        entropy += pl.entropy_mean * pl.tokens;
        counted += pl.tokens;
      }
      for (double k = double(micro_batches.size()); k < passes; ++k) {
        model.skip_forward();
        model.skip_backward();
      }
      // Every rank decides alike: the mini-batch's loss over all ranks (non-finite on one rank,
      // non-finite everywhere) and the summed gradient.
      mini_loss = sum_over_ranks(comm, mini_loss);
      loss_sum += mini_loss;
      // A non-finite mini-batch never reaches the optimizer: no moments, no step count, no
      // schedule advance (verl skips optimizer.step()); its gradients are dropped.
      std::string why;
      if (!std::isfinite(mini_loss)) {
        model.grads().zero();
        if (layerwise) layerwise->discard();
        why = "loss";
      } else {
        const OptimizerStep opt = optimizer_step(model.params(), model.grads());
        if (opt.applied) {
          grad_norm = opt.grad_norm;
          lr = opt.lr;
          ++out.optimizer_steps;
        } else {
          why = "gradient of " + opt.nonfinite_grad;
        }
      }
      if (!why.empty() && out.skipped.empty()) out.skipped = why;
    }
  }
  out.update_seconds = device_seconds_since(t0);

  const std::vector<double> sums =
      sum_over_ranks(comm, {clip, clip_dual, kl_ref, tis_clip, entropy, counted});
  const double c = std::max(sums[5], 1.0);
  Metrics m = {{"loss", loss_sum / double(minis * oo.ppo_epochs)},
               {"entropy", sums[4] / c},
               {"kl_ref", sums[2] / c},
               {"clip_frac", sums[0] / c},
               {"clip_frac_dual", sums[1] / c},
               {"grad_norm", grad_norm},
               {"lr", lr}};
  m.insert(m.end(), out.metrics.begin(), out.metrics.end());
  m.emplace_back("tis_clip_frac", sums[3] / c);
  if (model.config().moe) {
    const std::vector<double> aux = sum_over_ranks(comm, {aux_sum, aux_rows, z_sum});
    m.emplace_back("router_aux_loss", aux[0] / std::max(aux[1], 1.0));
    if (z_coef > 0) m.emplace_back("router_z_loss", aux[2] / std::max(aux[1], 1.0));
    if (disagreement) {
      const int64_t k = model.config().moe->num_experts_per_tok;
      RoutingDisagreement d;  // none on a rank without rows
      if (rows.routing_width > 0)
        d = routing_disagreement(rows.rollout_experts, router_experts, generated_rows(rows),
                                 rows.routing_width / k, k);
      const std::vector<double> all = sum_over_ranks(
          comm, {double(d.tokens), double(d.tokens_differ), double(d.pairs), double(d.pairs_differ)});
      m.emplace_back("routing_disagreement", all[1] / std::max(all[0], 1.0));
      m.emplace_back("routing_disagreement_layers", all[3] / std::max(all[2], 1.0));
    }
    // Per sparse layer: the most loaded expert's tokens and the mean over experts.
    const std::vector<double> counts = sum_over_ranks(comm, expert_counts.tokens);
    std::vector<double> most, mean;
    for (size_t l = 0; l < expert_counts.layers; ++l) {
      const auto layer = counts.begin() + ptrdiff_t(l * expert_counts.experts);
      most.push_back(*std::max_element(layer, layer + ptrdiff_t(expert_counts.experts)));
      mean.push_back(std::accumulate(layer, layer + ptrdiff_t(expert_counts.experts), 0.0) /
                     double(expert_counts.experts));
    }
    out.series.emplace_back("expert_tokens_max", std::move(most));
    out.series.emplace_back("expert_tokens_mean", std::move(mean));
  }
  out.metrics = std::move(m);
  return out;
}

}  // namespace lockstep
