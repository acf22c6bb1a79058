// rl/grpo_update.cpp
#include "rl/grpo_update.h"

#include <chrono>
#include <cmath>
#include <numeric>
#include <span>

#include "core/device.h"
#include "core/error.h"
#include "rl/packed_rows.h"
#include "train/advantages.h"
#include "train/policy_loss.h"
#include "train/rollout_mismatch.h"

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

}  // namespace

GrpoUpdate grpo_update(const std::vector<ScoredGroup>& groups, const Config& config,
                       Transformer& model, Transformer* reference,
                       const OptimizerStepFn& optimizer_step) {
  GrpoUpdate out;
  if (groups.empty()) return out;
  const LossOptions& lo = config.loss;
  const OptimOptions& oo = config.optim;
  const int64_t budget = oo.micro_batch_tokens;
  const float temperature = float(config.rollout.temperature);

  // 3. advantages, one per sequence
  const size_t g = groups[0].samples.size();
  std::vector<float> rewards;
  PackedRows rows;
  for (size_t i = 0; i < groups.size(); ++i) {
    const ScoredGroup& group = groups[i];
    LOCKSTEP_CHECK(group.samples.size() == g && group.rewards.size() == g, "grpo_update: group ", i,
                   " has ", group.samples.size(), " samples and ", group.rewards.size(),
                   " rewards, group 0 has ", g);
    rewards.insert(rewards.end(), group.rewards.begin(), group.rewards.end());
    for (const GeneratedSample& sample : group.samples)
      rows.add(group.prompt, sample.tokens, sample.logprobs);
  }
  const std::vector<float> seq_advantage = group_advantages(
      rewards, int64_t(g), GroupAdvantageConfig{.scaling = reward_scaling(lo.scale_rewards)});

  // 4. old-policy (and reference) logprobs
  auto t0 = Clock::now();
  const std::vector<float> old_logprob =
      lo.reuse_rollout_logprobs ? rows.rollout_logprob
                                : forward_logprobs(model, rows, budget, temperature);
  std::vector<float> ref_logprob;
  if (reference) ref_logprob = forward_logprobs(*reference, rows, budget, temperature);
  out.recompute_seconds = device_seconds_since(t0);
  const RolloutMismatch mismatch = rollout_mismatch(old_logprob, rows.rollout_logprob, rows.mask);
  const MismatchByPosition by_position =
      rollout_mismatch_by_position(old_logprob, rows.rollout_logprob, rows.mask, rows.response_position,
                                   config.run.mismatch_bin_tokens);
  out.series = {{"mismatch_abs_by_position", by_position.mean_abs_diff},
                {"mismatch_tokens_by_position", by_position.tokens}};

  // 5. PPO update: mini-batches of whole sequences, micro-batches inside.
  t0 = Clock::now();
  PolicyLossConfig cfg = loss_config(config);
  const size_t sequences = rows.sequences();
  const int64_t minis = std::min<int64_t>(oo.mini_batches, int64_t(sequences));
  double loss_sum = 0, clip = 0, clip_dual = 0, kl_ref = 0, tis_clip = 0, entropy = 0, counted = 0;
  double grad_norm = NAN, lr = NAN;
  for (int64_t epoch = 0; epoch < oo.ppo_epochs; ++epoch) {
    for (int64_t mb = 0; mb < minis; ++mb) {
      const size_t first = sequences * size_t(mb) / size_t(minis);
      const size_t last = sequences * size_t(mb + 1) / size_t(minis);
      double tokens = 0;
      for (size_t t = size_t(rows.cu[first]); t < size_t(rows.cu[last]); ++t) tokens += rows.mask[t];
      cfg.normalizer = cfg.aggregation == LossAggregation::token_mean ? tokens : double(last - first);
      double mini_loss = 0;
      const auto lengths = std::span<const int64_t>(rows.lengths).subspan(first, last - first);
      for (const SequenceRange& r : plan_micro_batches(lengths, budget)) {
        size_t offset = 0;
        const TrainBatch b = slice_batch(rows, first + r.first, first + r.last,
                                         model.config().vocab_size, model.device(), offset);
        TrainForward f = model.forward(b, temperature);
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
        if (std::isfinite(pl.loss)) model.backward(f, pl.dlogprob.to(model.device()), Tensor());
        clip += (pl.clip_frac_low + pl.clip_frac_high) * pl.tokens;
        clip_dual += pl.clip_frac_dual * pl.tokens;
        kl_ref += pl.kl_ref * pl.tokens;
        tis_clip += pl.tis_clip_frac * pl.tokens;
        entropy += pl.entropy_mean * pl.tokens;
        counted += pl.tokens;
      }
      loss_sum += mini_loss;
      // A non-finite mini-batch never reaches the optimizer: no moments, no step count, no
      // schedule advance (verl skips optimizer.step()); its gradients are dropped.
      std::string why;
      if (!std::isfinite(mini_loss)) {
        model.grads().zero();
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

  const double c = std::max(counted, 1.0);
  out.metrics = {{"loss", loss_sum / double(minis * oo.ppo_epochs)},
                 {"entropy", entropy / c},
                 {"kl_ref", kl_ref / c},
                 {"clip_frac", clip / c},
                 {"clip_frac_dual", clip_dual / c},
                 {"grad_norm", grad_norm},
                 {"lr", lr},
                 {"mismatch_abs", mismatch.mean_abs_diff},
                 {"mismatch_mult_prob_error", mismatch.mult_prob_error},
                 {"mismatch_k3", mismatch.kl_k3},
                 {"tis_clip_frac", tis_clip / c}};
  return out;
}

}  // namespace lockstep
