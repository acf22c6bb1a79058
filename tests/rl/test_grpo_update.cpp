// The GRPO update (rl/grpo_update.h) and dynamic sampling (rl/dynamic_sampling.h) on hand-built
// batches: a tiny fp32 model (one layer, vocabulary 37) and two groups of G = 4 hand-written
// responses with chosen rewards. Each test's expected gradient is computed independently: one
// forward and backward of the model over the same sequences, with every response token's
// dlogprob set to the coefficient the loss's formula gives for it by hand (advantages from the
// rewards as written in each test, ratios from separate forwards), so a sign error, a sample given
// its neighbour's advantage, a wrong slice, normalizer or reference shows as a different gradient.
// Tolerance: the same fp32 model's gradient summed in another micro-batch split and order differs
// by rounding only (~1e-7 relative); 1e-5 relative over the whole gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "rl/checkpoint.h"
#include "rl/dynamic_sampling.h"
#include "rl/grpo_update.h"
#include "rl/train.h"
#include "tests/model/model_test_util.h"
#include "tests/rl/rl_test_util.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::pack;
using testing::random_parameters;
using testing::rel_error;
using testing::tiny_config;

constexpr double kTol = 1e-5;

// What a test's own optimizer returns for an applied step.
OptimizerStep applied_step(int64_t step) {
  OptimizerStep s;
  s.applied = true;
  s.step = step;
  return s;
}

struct Sequence {
  std::vector<int32_t> prompt, response;
};

// Two prompts, four responses each (lengths 1 to 4 tokens; ids < 37).
const std::vector<Sequence> kSequences = {
    {{1, 2, 3}, {7, 8}},  {{1, 2, 3}, {9}},       {{1, 2, 3}, {10, 11, 12}}, {{1, 2, 3}, {13, 14}},
    {{4, 5}, {15, 16, 17, 18}}, {{4, 5}, {19}}, {{4, 5}, {20, 21}},         {{4, 5}, {22, 23, 24}}};
const int64_t kGroupSize = 4;

// Group 0 rewards {1, 0, 0, 0}: mean 0.25, sample std sqrt((0.5625 + 3·0.0625)/3) = 0.5,
//   A = 0.75/(0.5 + 1e-6) = 1.4999970, −0.25/(0.5 + 1e-6) = −0.4999990 (×3).
// Group 1 rewards {1, 1, 0, 0}: mean 0.5, sample std sqrt(4·0.25/3) = 0.5773503,
//   A = ±0.5/(0.5773503 + 1e-6) = ±0.8660239.
const std::vector<float> kRewards = {1, 0, 0, 0, 1, 1, 0, 0};
const std::vector<double> kAdvantages = {1.4999970,  -0.4999990, -0.4999990, -0.4999990,
                                         0.8660239,  0.8660239,  -0.8660239, -0.8660239};

ModelConfig model_config() { return tiny_config(ModelFamily::qwen3, {.layers = 1}); }

std::unique_ptr<Transformer> tiny_model(uint64_t seed) {
  const ModelConfig c = model_config();
  return std::make_unique<Transformer>(c, random_parameters(c, seed), Recipe::fp32);
}

// Each sequence's response-token logprobs under `model` (one forward over all of them).
std::vector<std::vector<float>> response_logprobs(Transformer& model,
                                                  const std::vector<Sequence>& seqs) {
  testing::Sequences full;
  for (const Sequence& s : seqs) {
    full.push_back(s.prompt);
    full.back().insert(full.back().end(), s.response.begin(), s.response.end());
  }
  const std::vector<float> lp = testing::to_floats(model.forward(pack(full), 1.0f, false).logprob);
  std::vector<std::vector<float>> out;
  size_t row = 0;
  for (const Sequence& s : seqs) {
    out.emplace_back(lp.begin() + ptrdiff_t(row + s.prompt.size() - 1),
                     lp.begin() + ptrdiff_t(row + s.prompt.size() - 1 + s.response.size()));
    row += s.prompt.size() + s.response.size();
  }
  return out;
}

// The groups of `seqs` with `rewards` and the given rollout logprobs.
std::vector<ScoredGroup> groups_of(const std::vector<Sequence>& seqs, const std::vector<float>& rewards,
                                   const std::vector<std::vector<float>>& rollout_logprobs) {
  std::vector<ScoredGroup> groups;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (i % kGroupSize == 0) groups.push_back({seqs[i].prompt, {}, {}});
    groups.back().samples.push_back({seqs[i].response, rollout_logprobs[i], FinishReason::stop});
    groups.back().rewards.push_back(rewards[i]);
  }
  return groups;
}

// Every gradient element of `p`, in for_each order, as doubles.
std::vector<double> flatten(ModelParameters& p) {
  std::vector<double> out;
  p.for_each([&](const std::string&, Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.data_as<float>()[i]);
  });
  return out;
}

// The gradient of Σ_s Σ_j coeff[s][j]·lp(response token j of sequence s) under `model`, by one
// forward and backward over `seqs` (model's gradients are zeroed first and after).
std::vector<double> expected_gradient(Transformer& model, const std::vector<Sequence>& seqs,
                                      const std::vector<std::vector<double>>& coeff) {
  testing::Sequences full;
  std::vector<float> d;
  for (size_t s = 0; s < seqs.size(); ++s) {
    full.push_back(seqs[s].prompt);
    full.back().insert(full.back().end(), seqs[s].response.begin(), seqs[s].response.end());
    for (size_t i = 0; i < full.back().size(); ++i) {
      const bool response = i + 1 >= seqs[s].prompt.size() && i + 1 < full.back().size();
      d.push_back(response ? float(coeff[s][i + 1 - seqs[s].prompt.size()]) : 0.0f);
    }
  }
  model.grads().zero();
  TrainForward f = model.forward(pack(full), 1.0f);
  Tensor dlogprob = Tensor::empty({int64_t(d.size())}, DType::f32);
  std::copy(d.begin(), d.end(), dlogprob.data_as<float>());
  model.backward(f, dlogprob, Tensor());
  std::vector<double> g = flatten(model.grads());
  model.grads().zero();
  return g;
}

// Coefficients c·A_s for every response token of sequences [first, last) (others 0).
std::vector<std::vector<double>> coefficients(const std::vector<double>& adv, size_t first, size_t last,
                                              const std::function<double(size_t s)>& scale) {
  std::vector<std::vector<double>> c;
  for (size_t s = 0; s < kSequences.size(); ++s)
    c.emplace_back(kSequences[s].response.size(),
                   s >= first && s < last ? -adv[s] * scale(s) : 0.0);
  return c;
}

double response_tokens(size_t first, size_t last) {
  double n = 0;
  for (size_t s = first; s < last; ++s) n += double(kSequences[s].response.size());
  return n;
}

Config update_config() {
  Config c;
  c.rollout.max_new_tokens = 6;
  c.optim.micro_batch_tokens = 8;  // several micro-batches per mini-batch
  return c;
}

// Records each step's gradient and leaves the weights as they are (so every ratio stays 1).
struct GradientRecorder {
  std::vector<std::vector<double>> steps;
  OptimizerStepFn fn() {
    return [this](ModelParameters&, ModelParameters& grads) {
      steps.push_back(flatten(grads));
      grads.zero();
      return applied_step(int64_t(steps.size()));
    };
  }
};

TEST(GrpoUpdate, EverySequenceGetsItsOwnAdvantageInEveryAggregation) {
  // One mini-batch, ratio 1: ∂loss/∂lp = −A_s·weight, with weight (train/policy_loss.h)
  // token-mean 1/N (N = 17 response tokens), sequence-mean 1/(S·n_s) (S = 8),
  // sequence-mean-token-sum 1/S, token-sum-norm 1/(S·L) (L = max_new_tokens = 6).
  auto model = tiny_model(1);
  const auto rollout = response_logprobs(*model, kSequences);
  const auto groups = groups_of(kSequences, kRewards, rollout);
  const double n = response_tokens(0, 8), s_count = 8, l = 6;
  const std::vector<std::pair<std::string, std::function<double(size_t)>>> cases = {
      {"token-mean", [&](size_t) { return 1 / n; }},
      {"sequence-mean", [&](size_t s) { return 1 / (s_count * double(kSequences[s].response.size())); }},
      {"sequence-mean-token-sum", [&](size_t) { return 1 / s_count; }},
      {"token-sum-norm", [&](size_t) { return 1 / (s_count * l); }}};
  for (const auto& [aggregation, weight] : cases) {
    Config c = update_config();
    c.loss.aggregation = aggregation;
    GradientRecorder rec;
    const GrpoUpdate u = grpo_update(groups, c, *model, nullptr, rec.fn());
    ASSERT_EQ(rec.steps.size(), 1u) << aggregation;
    EXPECT_EQ(u.optimizer_steps, 1);
    EXPECT_TRUE(u.skipped.empty());
    const auto expected = expected_gradient(*model, kSequences, coefficients(kAdvantages, 0, 8, weight));
    EXPECT_LE(rel_error(rec.steps[0], expected), kTol) << aggregation;
    EXPECT_EQ(metric(u.metrics, "mismatch_abs"), 0.0);  // the rollout logprobs are the model's
  }
  // The comparison sees the bugs it is there for: a flipped advantage, or a sample given its
  // neighbour's, changes the expected gradient far beyond the tolerance.
  Config c = update_config();
  GradientRecorder rec;
  grpo_update(groups, c, *model, nullptr, rec.fn());
  std::vector<double> flipped = kAdvantages, swapped = kAdvantages;
  flipped[4] = -flipped[4];
  std::swap(swapped[1], swapped[0]);
  const auto token_mean = [&](size_t) { return 1 / n; };
  EXPECT_GT(rel_error(rec.steps[0], expected_gradient(*model, kSequences, coefficients(flipped, 0, 8, token_mean))), 0.05);
  EXPECT_GT(rel_error(rec.steps[0], expected_gradient(*model, kSequences, coefficients(swapped, 0, 8, token_mean))), 0.05);
}

TEST(GrpoUpdate, MiniBatchesAreConsecutiveSlicesEachWithItsOwnTokenCount) {
  // 8 sequences in 3 mini-batches: [0, 2), [2, 5), [5, 8) (⌊8k/3⌋); 2 PPO epochs with unchanged
  // weights repeat them. Token-mean over each mini-batch's own response tokens.
  auto model = tiny_model(1);
  const auto groups = groups_of(kSequences, kRewards, response_logprobs(*model, kSequences));
  Config c = update_config();
  c.optim.mini_batches = 3;
  c.optim.ppo_epochs = 2;
  GradientRecorder rec;
  const GrpoUpdate u = grpo_update(groups, c, *model, nullptr, rec.fn());
  ASSERT_EQ(rec.steps.size(), 6u);
  EXPECT_EQ(u.optimizer_steps, 6);
  const std::pair<size_t, size_t> slices[] = {{0, 2}, {2, 5}, {5, 8}};
  for (size_t k = 0; k < 6; ++k) {
    const auto [first, last] = slices[k % 3];
    const double n = response_tokens(first, last);
    const auto expected = expected_gradient(
        *model, kSequences, coefficients(kAdvantages, first, last, [&](size_t) { return 1 / n; }));
    EXPECT_LE(rel_error(rec.steps[k], expected), kTol) << "optimizer step " << k;
  }
}

TEST(GrpoUpdate, SecondEpochUsesTheRatioToTheOldPolicy) {
  // Plain SGD (θ ← θ − 0.01·g) between the epochs: the second epoch's gradient is
  // −A_s·R_t/N with R_t = exp(lp_new − lp_old), lp_old the first epoch's policy, lp_new the
  // updated one, both from separate forwards here; every R_t stays inside [0.8, 1.2] (checked),
  // so no clip acts.
  auto model = tiny_model(1);
  const auto old_lp = response_logprobs(*model, kSequences);
  const auto groups = groups_of(kSequences, kRewards, old_lp);
  Config c = update_config();
  c.optim.ppo_epochs = 2;
  std::vector<std::vector<double>> steps;
  const OptimizerStepFn sgd = [&](ModelParameters& params, ModelParameters& grads) {
    steps.push_back(flatten(grads));
    std::vector<Tensor*> p, g;
    params.for_each([&](const std::string&, Tensor& t) { p.push_back(&t); });
    grads.for_each([&](const std::string&, Tensor& t) { g.push_back(&t); });
    for (size_t i = 0; i < p.size(); ++i)
      for (int64_t j = 0; j < p[i]->numel(); ++j)
        p[i]->data_as<float>()[j] -= 0.01f * g[i]->data_as<float>()[j];
    grads.zero();
    model->refresh_weights();
    return applied_step(int64_t(steps.size()));
  };
  const GrpoUpdate u = grpo_update(groups, c, *model, nullptr, sgd);
  ASSERT_EQ(steps.size(), 2u);
  // The weights now hold two SGD steps; redo the first to get the second epoch's policy.
  auto replay = tiny_model(1);
  const double n = response_tokens(0, 8);
  const auto first = expected_gradient(*replay, kSequences,
                                       coefficients(kAdvantages, 0, 8, [&](size_t) { return 1 / n; }));
  EXPECT_LE(rel_error(steps[0], first), kTol);
  size_t i = 0;
  replay->params().for_each([&](const std::string&, Tensor& t) {
    for (int64_t j = 0; j < t.numel(); ++j) t.data_as<float>()[j] -= 0.01f * float(steps[0][i++]);
  });
  replay->refresh_weights();
  const auto new_lp = response_logprobs(*replay, kSequences);
  std::vector<std::vector<double>> coeff;
  double moved = 0;
  for (size_t s = 0; s < kSequences.size(); ++s) {
    coeff.emplace_back();
    for (size_t j = 0; j < kSequences[s].response.size(); ++j) {
      const double ratio = std::exp(double(new_lp[s][j]) - double(old_lp[s][j]));
      ASSERT_GT(ratio, 0.8);
      ASSERT_LT(ratio, 1.2);
      moved = std::max(moved, std::abs(ratio - 1));
      coeff.back().push_back(-kAdvantages[s] * ratio / n);
    }
  }
  EXPECT_GT(moved, 1e-3);  // the ratio did move: the test distinguishes R from 1
  EXPECT_LE(rel_error(steps[1], expected_gradient(*replay, kSequences, coeff)), kTol);
  EXPECT_EQ(u.optimizer_steps, 2);
}

TEST(GrpoUpdate, ReuseRolloutLogprobsMakesThemTheOldPolicy) {
  // Rollout logprobs 0.1 above the model's: with reuse, old = rollout and R = e^−0.1 = 0.9048374
  // (inside the clip), so ∂ = −A·0.9048374/N, and the mismatch is not measured (NaN) unless the
  // step checks, which recomputes the logprobs for the metrics only (the gradient stays); without
  // reuse, old is recomputed (R = 1). Measured, the mismatch reads the 0.1 on every token.
  auto model = tiny_model(1);
  auto rollout = response_logprobs(*model, kSequences);
  for (auto& seq : rollout)
    for (float& x : seq) x += 0.1f;
  const auto groups = groups_of(kSequences, kRewards, rollout);
  const double n = response_tokens(0, 8);
  for (const auto& [reuse, check] : {std::pair{true, false}, {true, true}, {false, false}}) {
    SCOPED_TRACE(::testing::Message() << "reuse " << reuse << ", check " << check);
    Config c = update_config();
    c.loss.reuse_rollout_logprobs = reuse;
    GradientRecorder rec;
    const GrpoUpdate u = grpo_update(groups, c, *model, nullptr, rec.fn(), single_rank(), nullptr, check);
    const double r = reuse ? 0.9048374 : 1.0;
    const auto expected = expected_gradient(
        *model, kSequences, coefficients(kAdvantages, 0, 8, [&](size_t) { return r / n; }));
    EXPECT_LE(rel_error(rec.steps.at(0), expected), kTol);
    if (reuse && !check) {
      EXPECT_TRUE(std::isnan(metric(u.metrics, "mismatch_abs")));
      EXPECT_TRUE(std::isnan(metric(u.metrics, "mismatch_tokens_differ")));
      EXPECT_TRUE(u.series.empty());
    } else {
      EXPECT_NEAR(metric(u.metrics, "mismatch_abs"), 0.1, 1e-6);
      EXPECT_EQ(metric(u.metrics, "mismatch_tokens_differ"), n);
    }
  }
}

TEST(GrpoUpdate, TruncatedImportanceSamplingActsWhereverLogprobsDiffer) {
  // Rollout logprobs log 3 below the recomputed ones: ρ = exp(old − rollout) = 3 > C = 2, so
  // w = 2 and ∂ = −2·A/N on every token; tis_clip_frac = 1. No precision mode is involved: the
  // weight acts wherever the two logprobs differ.
  auto model = tiny_model(1);
  auto rollout = response_logprobs(*model, kSequences);
  for (auto& seq : rollout)
    for (float& x : seq) x -= float(std::log(3.0));
  const auto groups = groups_of(kSequences, kRewards, rollout);
  Config c = update_config();
  c.loss.tis_cap = 2;
  GradientRecorder rec;
  const GrpoUpdate u = grpo_update(groups, c, *model, nullptr, rec.fn());
  const double n = response_tokens(0, 8);
  const auto expected = expected_gradient(
      *model, kSequences, coefficients(kAdvantages, 0, 8, [&](size_t) { return 2 / n; }));
  EXPECT_LE(rel_error(rec.steps.at(0), expected), kTol);
  EXPECT_EQ(metric(u.metrics, "tis_clip_frac"), 1.0);
}

TEST(GrpoUpdate, KlPenaltyReadsTheReferenceModel) {
  // A reference with other weights, β = 0.1, k3: ∂ = (−A_s + β·(1 − exp(ref_t − lp_t)))/N, ref
  // and lp from separate forwards here; the kl_ref metric is the token mean of
  // exp(ref − lp) − (ref − lp) − 1.
  auto model = tiny_model(1), reference = tiny_model(2);
  const auto lp = response_logprobs(*model, kSequences), ref = response_logprobs(*reference, kSequences);
  const auto groups = groups_of(kSequences, kRewards, lp);
  Config c = update_config();
  c.loss.kl_coef = 0.1;
  GradientRecorder rec;
  const GrpoUpdate u = grpo_update(groups, c, *model, reference.get(), rec.fn());
  const double n = response_tokens(0, 8);
  std::vector<std::vector<double>> coeff;
  double kl = 0;
  for (size_t s = 0; s < kSequences.size(); ++s) {
    coeff.emplace_back();
    for (size_t j = 0; j < kSequences[s].response.size(); ++j) {
      const double x = double(ref[s][j]) - double(lp[s][j]);
      coeff.back().push_back((-kAdvantages[s] + 0.1 * (1 - std::exp(x))) / n);
      kl += std::exp(x) - x - 1;
    }
  }
  EXPECT_GT(kl / n, 1e-2);  // the reference does differ
  EXPECT_LE(rel_error(rec.steps.at(0), expected_gradient(*model, kSequences, coeff)), kTol);
  EXPECT_NEAR(metric(u.metrics, "kl_ref"), kl / n, 1e-6);
}

// Parameters and both moments, bit for bit.
std::vector<double> state_of(Transformer& model, const AdamW& opt) {
  std::vector<double> s = flatten(model.params());
  ModelParameters m = opt.first_moment(), v = opt.second_moment();
  for (double x : flatten(m)) s.push_back(x);
  for (double x : flatten(v)) s.push_back(x);
  return s;
}

TEST(GrpoUpdate, NonFiniteMiniBatchChangesNothing) {
  // Run A: a good update, one whose loss is NaN (a NaN old logprob, reused from the rollout),
  // one whose gradient is planted non-finite, then a good one. Run B: the two good updates only.
  // A skipped update must leave weights, moments, step count and schedule exactly as they were,
  // so A and B end bit for bit equal, with 2 optimizer steps each and the second step's lr.
  Config c = update_config();
  c.loss.reuse_rollout_logprobs = true;
  // A schedule that moves every step: cosine over 4 steps from 0.01.
  OptimizerConfig oc{.schedule = {.kind = LrSchedule::Kind::cosine, .peak_lr = 1e-2f, .total_steps = 4}};
  auto a = tiny_model(1), b = tiny_model(1);
  const auto rollout = response_logprobs(*a, kSequences);
  const auto good = groups_of(kSequences, kRewards, rollout);
  auto bad_rollout = rollout;
  bad_rollout[3][0] = NAN;
  const auto bad = groups_of(kSequences, kRewards, bad_rollout);
  AdamW opt_a(a->params(), oc), opt_b(b->params(), oc);
  bool plant = false;
  std::vector<float> lrs;
  const OptimizerStepFn step_a = [&](ModelParameters& p, ModelParameters& g) {
    if (plant) g.embed.data_as<float>()[5] = INFINITY;
    const OptimizerStep s = opt_a.step(p, g);
    if (s.applied) lrs.push_back(s.lr);
    a->refresh_weights();
    return s;
  };
  const OptimizerStepFn step_b = [&](ModelParameters& p, ModelParameters& g) {
    const OptimizerStep s = opt_b.step(p, g);
    b->refresh_weights();
    return s;
  };
  EXPECT_TRUE(grpo_update(good, c, *a, nullptr, step_a).skipped.empty());
  const std::vector<double> after_one = state_of(*a, opt_a);
  const GrpoUpdate nan_loss = grpo_update(bad, c, *a, nullptr, step_a);
  EXPECT_EQ(nan_loss.skipped, "loss");
  EXPECT_EQ(nan_loss.optimizer_steps, 0);
  EXPECT_EQ(state_of(*a, opt_a), after_one);
  EXPECT_EQ(opt_a.steps(), 1);
  EXPECT_TRUE(std::isnan(metric(nan_loss.metrics, "lr")));
  for (double x : flatten(a->grads())) ASSERT_EQ(x, 0.0);  // nothing carried into the next step
  plant = true;
  const GrpoUpdate nan_grad = grpo_update(good, c, *a, nullptr, step_a);
  plant = false;
  EXPECT_EQ(nan_grad.skipped, "gradient of embed");
  EXPECT_EQ(state_of(*a, opt_a), after_one);
  EXPECT_EQ(opt_a.steps(), 1);
  grpo_update(good, c, *a, nullptr, step_a);
  grpo_update(good, c, *b, nullptr, step_b);
  grpo_update(good, c, *b, nullptr, step_b);
  EXPECT_EQ(opt_a.steps(), 2);
  EXPECT_EQ(state_of(*a, opt_a), state_of(*b, opt_b));
  // The schedule did not advance on the skipped steps: cosine over 4 steps, step 2 at
  // 0.01·(1 + cos(π/4))/2 = 0.0085355339.
  ASSERT_EQ(lrs.size(), 2u);
  EXPECT_FLOAT_EQ(lrs[0], 0.01f);
  EXPECT_NEAR(lrs[1], 0.0085355339, 1e-9);
}

TEST(GrpoUpdate, NoGroupsNoUpdate) {
  auto model = tiny_model(1);
  GradientRecorder rec;
  const GrpoUpdate u = grpo_update({}, update_config(), *model, nullptr, rec.fn());
  EXPECT_TRUE(rec.steps.empty());
  EXPECT_TRUE(u.metrics.empty());
  EXPECT_EQ(u.optimizer_steps, 0);
}

// A group of two samples with the given rewards; its prompt is {id} to tell groups apart.
ScoredGroup group(int32_t id, float r0, float r1) {
  return {{id}, {{{1}, {0.0f}, FinishReason::stop}, {{2}, {0.0f}, FinishReason::stop}}, {r0, r1}};
}

std::vector<int32_t> ids_of(const CollectedGroups& c) {
  std::vector<int32_t> ids;
  for (const ScoredGroup& g : c.kept) ids.push_back(g.prompt[0]);
  return ids;
}

TEST(DynamicSampling, RefillsUntilEnoughGroupsDiffer) {
  // Draw 0: groups 10 {1,1}, 11 {0,1}, 12 {0,0}; draw 1: 20 {1,0}, 21 {1,1}, 22 {0,1}; then
  // every group equal.
  int calls = 0;
  const auto draw = [&](int64_t d) {
    ++calls;
    if (d == 0) return std::vector<ScoredGroup>{group(10, 1, 1), group(11, 0, 1), group(12, 0, 0)};
    if (d == 1) return std::vector<ScoredGroup>{group(20, 1, 0), group(21, 1, 1), group(22, 0, 1)};
    return std::vector<ScoredGroup>{group(30 + int32_t(d), 1, 1)};
  };
  CollectedGroups c = collect_groups(3, 10, true, draw);
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{11, 20, 22}));
  EXPECT_EQ(c.draws, 2);
  c = collect_groups(2, 10, true, draw);  // trimmed to the batch size
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{11, 20}));
  EXPECT_EQ(c.draws, 2);
  c = collect_groups(3, 1, true, draw);  // the bound on draws: a short batch
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{11}));
  EXPECT_EQ(c.draws, 1);
  c = collect_groups(3, 10, false, draw);  // no filter: one draw, every group
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(c.draws, 1);
  calls = 0;
  const auto all_equal = [&](int64_t d) {
    ++calls;
    return std::vector<ScoredGroup>{group(int32_t(d), 0, 0), group(int32_t(d), 1, 1)};
  };
  c = collect_groups(2, 4, true, all_equal);  // every group dropped, every draw spent
  EXPECT_TRUE(c.kept.empty());
  EXPECT_EQ(c.draws, 4);
  EXPECT_EQ(calls, 4);
  expect_error([&] { collect_groups(2, 0, true, all_equal); }, "max_draws = 0");
}

// ---- The loop (rl/train.h) on the builtin model: tiny runs, no SFT ---------------------------

namespace fs = std::filesystem;

Config tiny_run(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_test_grpo_update_" + name);
  fs::remove_all(dir);
  return testing::tiny_grpo_run(dir);
}

TEST(TrainLoop, MaxSkippedStepsStopsTheRun) {
  // Every optimizer step gets a non-finite gradient: steps 1 and 2 are skipped and tolerated
  // (max_skipped_steps = 2), step 3 is the third in a row and stops the run.
  Config c = tiny_run("max_skipped");
  c.run.steps = 5;
  c.run.max_skipped_steps = 2;
  TrainHooks hooks;
  int planted = 0;
  hooks.before_optimizer_step = [&](ModelParameters& grads) {
    grads.final_norm.data_as<float>()[0] = NAN;
    ++planted;
  };
  expect_error([&] { run_train(c, hooks); },
               {"stopping: 3 consecutive steps were skipped", "gradient of final_norm"});
  EXPECT_EQ(planted, 3);
  std::ifstream in(fs::path(c.run.out_dir) / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines)
    EXPECT_EQ(nlohmann::json::parse(line)["skipped"].get<double>(), 1.0) << line;
  EXPECT_EQ(lines, 3);
  // One good step in between resets the count: skipped, good, skipped, skipped runs through.
  c = tiny_run("max_skipped_reset");
  c.run.steps = 4;
  c.run.max_skipped_steps = 2;
  int step = 0;
  hooks.before_optimizer_step = [&](ModelParameters& grads) {
    if (++step != 2) grads.final_norm.data_as<float>()[0] = NAN;
  };
  EXPECT_NO_THROW(run_train(c, hooks));
}

TEST(TrainLoop, DynamicSamplingAndOverlongPenaltyInTheMetrics) {
  // Dynamic sampling with at most 3 rollout batches a step: a batch short of B = 2 groups means
  // every draw was spent. The overlong buffer is the whole budget (3 tokens), penalty 0.5, so a
  // response of L tokens scores −0.5·L/3 on top of its correctness: reward_mean = accuracy −
  // response_length/6 exactly, and every response (L ≥ 1) is penalized.
  Config c = tiny_run("dynamic_sampling");
  c.loss.dynamic_sampling = true;
  c.loss.dynamic_sampling_max_draws = 3;
  c.loss.overlong_buffer = 3;
  c.loss.overlong_penalty = 0.5;
  run_train(c);
  std::ifstream in(fs::path(c.run.out_dir) / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const double batches = j["rollout_batches"], kept = j["groups_kept"];
    EXPECT_GE(batches, 1) << line;
    EXPECT_LE(batches, 3) << line;
    EXPECT_LE(kept, 2) << line;
    if (kept < 2) {
      EXPECT_EQ(batches, 3) << line;
    }
    const double accuracy = j["accuracy"], length = j["response_length"], reward = j["reward_mean"];
    EXPECT_NEAR(reward, accuracy - length / 6, 1e-6) << line;
    EXPECT_EQ(j["overlong_frac"].get<double>(), 1.0) << line;
  }
  EXPECT_EQ(lines, 3);
}

TEST(TrainLoop, CheckpointEverySavesAtItsSteps) {
  // checkpoint_every = 2 over 3 steps: after step 1 no checkpoint, after 2 and 3 (the last) one
  // at that step.
  Config c = tiny_run("checkpoint_every");
  c.run.checkpoint_every = 2;
  std::vector<int64_t> seen;
  TrainHooks hooks;
  hooks.stop_after = [&](int64_t) {
    const auto saved = find_checkpoint(c.run.out_dir);
    seen.push_back(saved ? saved->state.step : -1);
    return false;
  };
  run_train(c, hooks);
  EXPECT_EQ(seen, (std::vector<int64_t>{-1, 2}));  // stop_after is not asked after the last step
  const auto saved = find_checkpoint(c.run.out_dir);
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->state.step, 3);
}

TEST(TrainLoop, CheckpointEveryMinusOneSavesNothing) {
  Config c = tiny_run("checkpoint_never");
  c.run.checkpoint_every = -1;
  run_train(c);
  EXPECT_FALSE(find_checkpoint(c.run.out_dir).has_value());
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(c.run.out_dir) / "metrics.jsonl"));
}

}  // namespace
}  // namespace lockstep
