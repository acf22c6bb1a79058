// Routing that stays on-policy in the GRPO update (rl/grpo_update.h) of a sparse model: the
// routing-disagreement metric and routing replay (and the router z-loss's place in the loss), on
// rollouts of the engine (rollout/engine.h)
// from a tiny Qwen3-MoE on the CPU (sparse layers 0 and 2), where rollout and training compute the
// same function. The metric's expected values are counted here from separate training forwards;
// replay's expected gradient is one forward and backward with the rollout's experts replayed and
// every response token's dlogprob set to −A/N by hand (as test_grpo_update.cpp does; tolerance
// 1e-5 relative: another micro-batch split only reorders fp32 sums).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "rl/grpo_update.h"
#include "rollout/engine.h"
#include "tests/model/model_test_util.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::pack;
using testing::random_parameters;
using testing::rel_error;

constexpr double kTol = 1e-5;
constexpr int64_t kLayers = 2, kK = 2;  // sparse layers, experts per token

// Widths the fp8 recipe takes (multiples of 16); layer 1 dense.
ModelConfig moe_config() {
  return testing::tiny_config(ModelFamily::qwen3_moe, {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64,
                                                       .intermediate = 256, .layers = 3, .vocab = 301});
}

// Group 0 rewards {1, 0, 0, 0}: A = 1.4999970, −0.4999990 (×3); group 1 {1, 1, 0, 0}: A =
// ±0.8660239 (test_grpo_update.cpp derives them).
const std::vector<std::vector<float>> kRewards = {{1, 0, 0, 0}, {1, 1, 0, 0}};
const std::vector<double> kAdvantages = {1.4999970, -0.4999990, -0.4999990, -0.4999990,
                                         0.8660239, 0.8660239,  -0.8660239, -0.8660239};

// Two prompts × four samples of `model`, with their routing.
std::vector<ScoredGroup> roll_out(Transformer& model) {
  Engine engine(model, {.num_blocks = 64, .block_size = 4, .record_routing = true});
  std::vector<GenerationRequest> requests(2);
  requests[0].prompt = {1, 2, 3};
  requests[1].prompt = {4, 5, 6, 7};
  for (size_t r = 0; r < 2; ++r) {
    requests[r].sampling.n = 4;
    requests[r].sampling.temperature = 1.0f;
    requests[r].sampling.max_new_tokens = 5;
    requests[r].sampling.seed = 11 + r;
  }
  const auto samples = engine.generate(requests);
  std::vector<ScoredGroup> groups;
  for (size_t r = 0; r < 2; ++r) groups.push_back({requests[r].prompt, samples[r], kRewards[r]});
  return groups;
}

struct Packed {
  testing::Sequences seqs;  // prompt + response
  Tensor replay;            // the rollout's routing, TrainBatch::replay_experts
};

Packed packed(const std::vector<ScoredGroup>& groups) {
  Packed p;
  std::vector<std::vector<int32_t>> rows;  // per row: kLayers · kK ids, or -1s
  for (const ScoredGroup& g : groups)
    for (const GeneratedSample& s : g.samples) {
      p.seqs.push_back(g.prompt);
      p.seqs.back().insert(p.seqs.back().end(), s.tokens.begin(), s.tokens.end());
      const size_t n = p.seqs.back().size();
      for (size_t t = 0; t < n; ++t)
        rows.push_back(t + 1 < n ? std::vector<int32_t>(s.expert_ids.begin() + ptrdiff_t(t * kLayers * kK),
                                                        s.expert_ids.begin() + ptrdiff_t((t + 1) * kLayers * kK))
                                 : std::vector<int32_t>(kLayers * kK, -1));
    }
  const int64_t T = int64_t(rows.size());
  p.replay = Tensor::empty({kLayers, T, kK}, DType::i32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = 0; l < kLayers; ++l)
      std::copy_n(rows[size_t(t)].begin() + l * kK, kK, p.replay.data_as<int32_t>() + (l * T + t) * kK);
  return p;
}

// The disagreement metric counted by hand: the rows of generated tokens the rollout ran, a
// (token, layer) pair differing when the sets of experts do.
std::pair<double, double> expected_disagreement(Transformer& model, const std::vector<ScoredGroup>& groups,
                                                bool replay) {
  const Packed p = packed(groups);
  TrainBatch batch = pack(p.seqs);
  if (replay) batch.replay_experts = p.replay;
  const TrainForward f = model.forward(batch, 1.0f, false);
  double tokens = 0, tokens_differ = 0, pairs = 0, pairs_differ = 0;
  int64_t row = 0;
  for (const ScoredGroup& g : groups)
    for (const GeneratedSample& s : g.samples) {
      const int64_t n = int64_t(g.prompt.size() + s.tokens.size());
      for (int64_t t = int64_t(g.prompt.size()); t + 1 < n; ++t) {
        bool differs = false;
        for (int64_t l = 0; l < kLayers; ++l) {
          const int32_t* a = s.expert_ids.data() + (t * kLayers + l) * kK;
          const int32_t* b = f.routing[size_t(l)].expert_ids.data_as<int32_t>() + (row + t) * kK;
          const bool same = (a[0] == b[0] && a[1] == b[1]) || (a[0] == b[1] && a[1] == b[0]);
          pairs += 1;
          pairs_differ += !same;
          differs = differs || !same;
        }
        tokens += 1;
        tokens_differ += differs;
      }
      row += n;
    }
  return {tokens_differ / tokens, pairs_differ / pairs};
}

std::vector<double> flatten(ModelParameters& p) {
  std::vector<double> out;
  p.for_each([&](const std::string&, Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.data_as<float>()[i]);
  });
  return out;
}

// The gradient of −Σ_s A_s/N · Σ_response lp + z_weight · router_z_loss under `model`, with the
// rollout's experts replayed or not, from one forward over the whole batch.
std::vector<double> expected_gradient(Transformer& model, const std::vector<ScoredGroup>& groups, bool replay,
                                      double z_weight = 0, double* z = nullptr) {
  const Packed p = packed(groups);
  std::vector<float> d;
  double n = 0;
  size_t s = 0;
  for (const ScoredGroup& g : groups)
    for (const GeneratedSample& sample : g.samples) {
      const size_t len = g.prompt.size() + sample.tokens.size();
      for (size_t i = 0; i < len; ++i) {
        const bool response = i + 1 >= g.prompt.size() && i + 1 < len;
        d.push_back(response ? float(-kAdvantages[s]) : 0.0f);
      }
      n += double(sample.tokens.size());
      ++s;
    }
  for (float& x : d) x = float(x / n);
  TrainBatch batch = pack(p.seqs);
  if (replay) batch.replay_experts = p.replay;
  model.grads().zero();
  TrainForward f = model.forward(batch, 1.0f);
  if (z) *z = router_z_loss(f.routing);
  Tensor dlogprob = Tensor::empty({int64_t(d.size())}, DType::f32);
  std::copy(d.begin(), d.end(), dlogprob.data_as<float>());
  model.backward(f, dlogprob, Tensor(), 0, z_weight);
  std::vector<double> g = flatten(model.grads());
  model.grads().zero();
  return g;
}

struct Update {
  Metrics metrics;
  std::vector<double> gradient;  // the one optimizer step's, the weights left as they were
};

Update update(Transformer& model, const std::vector<ScoredGroup>& groups, bool replay, bool reuse = false,
              double z_coef = 0) {
  Config c;
  c.loss.router_z_coef = z_coef;
  c.rollout.max_new_tokens = 5;
  c.optim.micro_batch_tokens = 16;  // several micro-batches
  c.model.routing_replay = replay;
  c.loss.reuse_rollout_logprobs = reuse;
  Update u;
  const OptimizerStepFn step = [&](ModelParameters&, ModelParameters& grads) {
    u.gradient = flatten(grads);
    grads.zero();
    OptimizerStep s;
    s.applied = true;
    return s;
  };
  u.metrics = grpo_update(groups, c, model, nullptr, step).metrics;
  return u;
}

// Where the rollout and the training forward compute the same function (the CPU, every recipe):
// no token disagrees, whether the training routing comes from the old-logprob recompute or (reused
// rollout logprobs) the update's forwards, and replay changes no bit.
TEST(RoutingOnPolicy, NoDisagreementAndReplayChangesNothingWhereRolloutEqualsTraining) {
  for (Recipe recipe : {Recipe::fp32, Recipe::fp8}) {
    Transformer model(moe_config(), random_parameters(moe_config(), 21), recipe);
    const std::vector<ScoredGroup> groups = roll_out(model);
    for (bool reuse : {false, true}) {
      const Update plain = update(model, groups, false, reuse), replayed = update(model, groups, true, reuse);
      for (const Update* u : {&plain, &replayed}) {
        EXPECT_EQ(metric(u->metrics, "routing_disagreement"), 0.0) << recipe_name(recipe);
        EXPECT_EQ(metric(u->metrics, "routing_disagreement_layers"), 0.0) << recipe_name(recipe);
        // (Reused logprobs are not compared with a recompute: the mismatch is then not measured.)
        if (!reuse) {
          EXPECT_EQ(metric(u->metrics, "mismatch_abs"), 0.0) << recipe_name(recipe);
        }
      }
      EXPECT_EQ(plain.gradient, replayed.gradient) << recipe_name(recipe) << " reuse " << reuse;
    }
  }
}

// A planted difference: the trainer's first router is perturbed after the rollout. The metric
// counts the tokens whose experts the trainer's router changes; with replay the update trains on
// the rollout's experts (its gradient is the replayed forward's, not the plain one), and the
// metric counts what the trainer's router would have chosen under the replayed earlier layers.
TEST(RoutingOnPolicy, PlantedRouterDifferenceIsMeasuredAndReplayTrainsOnTheRolloutsExperts) {
  const ModelConfig config = moe_config();
  const ModelParameters params = random_parameters(config, 22);
  Transformer rollout(config, params.copy_to(Device::cpu), Recipe::fp32);
  Transformer trainer(config, params.copy_to(Device::cpu), Recipe::fp32);
  Tensor& router = trainer.params().layers[0].router;
  const Tensor noise = testing::random_tensor(router.shape(), DType::f32, 23);
  for (int64_t i = 0; i < router.numel(); ++i) router.data_as<float>()[i] += 0.1f * noise.data_as<float>()[i];
  trainer.refresh_weights();
  const std::vector<ScoredGroup> groups = roll_out(rollout);

  for (bool replay : {false, true}) {
    const auto [tokens, pairs] = expected_disagreement(trainer, groups, replay);
    EXPECT_GT(pairs, 0.0);
    const Update u = update(trainer, groups, replay);
    EXPECT_EQ(metric(u.metrics, "routing_disagreement"), tokens) << "replay " << replay;
    EXPECT_EQ(metric(u.metrics, "routing_disagreement_layers"), pairs) << "replay " << replay;
    std::printf("replay %d: routing_disagreement %.3f, by layer %.3f, mismatch_abs %.3g\n", int(replay), tokens,
                pairs, metric(u.metrics, "mismatch_abs"));
    const std::vector<double> want = expected_gradient(trainer, groups, /*replay=*/true);
    if (replay) EXPECT_LE(rel_error(u.gradient, want), kTol);
    else EXPECT_GT(rel_error(u.gradient, want), 1e-3);  // the test tells the two apart
  }
}

// loss.router_z_coef adds coef · the batch's router z-loss to the loss (each micro-batch's z weighted
// by its share of the rows: the whole batch's z), and logs it; without it no router_z_loss metric.
TEST(RoutingOnPolicy, RouterZLossJoinsTheLossAndTheMetrics) {
  Transformer model(moe_config(), random_parameters(moe_config(), 25), Recipe::fp32);
  const std::vector<ScoredGroup> groups = roll_out(model);
  double z = 0;
  const std::vector<double> want = expected_gradient(model, groups, false, 0.5, &z);
  const Update u = update(model, groups, false, false, 0.5);
  EXPECT_LE(rel_error(u.gradient, want), kTol);
  EXPECT_GT(rel_error(u.gradient, expected_gradient(model, groups, false)), 1e-3);  // z does move it
  EXPECT_NEAR(metric(u.metrics, "router_z_loss"), z, 1e-12 * z);  // sums in another order
  const Metrics off = update(model, groups, false).metrics;
  EXPECT_TRUE(std::none_of(off.begin(), off.end(), [](const auto& m) { return m.first == "router_z_loss"; }));
}

TEST(RoutingOnPolicy, ReplayWithoutRecordedRoutingIsAnError) {
  Transformer model(moe_config(), random_parameters(moe_config(), 24), Recipe::fp32);
  std::vector<ScoredGroup> groups = roll_out(model);
  for (ScoredGroup& g : groups)
    for (GeneratedSample& s : g.samples) s.expert_ids.clear();
  testing::expect_error([&] { update(model, groups, true); }, {"routing replay", "recorded"});
}

}  // namespace
}  // namespace lockstep
