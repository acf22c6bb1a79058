// tests/dist/test_expert_parallel.cpp — expert parallelism (model/expert_parallel.h) on N ranks
// against the same ranks without it: each rank trains a tiny Qwen3-MoE on its own batches. The
// run without it sums the gradients over the ranks (train/data_parallel.h's ReplicatedAdamW); the
// one with it steps with the replicated optimizer too, or with ShardedAdamW owning each expert
// whole on its rank (train/shard_plan.h), reduced once a step or layer by layer in the backward
// (train/layerwise_reduce.h), or with the weight copies kept by rows too (train/sharded_weights.h:
// then no rank holds another rank's experts in training, checked inside each sparse layer). Run by
// CTest alone (one rank: every row stays) and under `mpirun -np 2` and `-np 3`
// (tests/CMakeLists.txt); 4 ranks work too (tests/dist/mpirun.sh 4 build-cpu-only/tests/test_dist
// --gtest_filter='*Expert*').
//
// Besides plain micro-batches, the ranks run different numbers of passes (one rank a forward alone
// and a second micro-batch that the others skip, a backward skipped on one rank): with expert
// parallelism the skipped passes still serve the others' rows (Transformer::skip_forward).
//
// What must agree, and how closely:
//   - the first forward's logprobs, bit for bit: a row's expert GEMMs do not depend on the other
//     rows (ops/gemm.h), so running them on the owner changes no bit;
//   - the first backward's summed gradients of everything but the experts, bit for bit (the router,
//     attention and embedding see the same row gradients), and each expert's gradient on its owner
//     within kWGradTol of the summed one: with expert parallelism its WGrad sums every rank's rows
//     at once, instead of each rank's rows and then the ranks in order (another order of the same
//     products); the other ranks' copies of it stay exactly zero;
//   - the losses and every weight after a few AdamW steps within the drift that rounding
//     difference leaves (kStepTol below).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "dist/host_values.h"
#include "model/expert_parallel.h"
#include "rl/grpo_update.h"
#include "rollout/engine.h"
#include "tests/dist/test_world.h"
#include "tests/model/model_test_util.h"
#include "tests/test_util.h"
#include "train/data_parallel.h"
#include "train/layerwise_reduce.h"
#include "train/sharded_optimizer.h"
#include "train/sharded_weights.h"

using namespace lockstep;

namespace {

using lockstep::testing::world;

// 12 experts (top 2): they split over 1, 2, 3 and 4 ranks. Two layers, the second dense. Widths
// multiples of 8 (hidden 16, experts of 16): the bf16 recipe's grouped expert GEMMs run.
ModelConfig ep_config() {
  ModelConfig c = lockstep::testing::tiny_config(ModelFamily::qwen3_moe, {.intermediate = 32});
  c.moe->num_experts = 12;
  return c;
}

// The same with widths of 128 (hidden, experts): the fp8 recipe's grouped expert GEMMs run.
ModelConfig ep_config_fp8() {
  ModelConfig c = lockstep::testing::tiny_config(ModelFamily::qwen3_moe, {.hidden = 128, .heads = 2, .kv_heads = 1,
                                                                          .head_dim = 64, .intermediate = 256});
  c.moe->num_experts = 12;
  return c;
}

// Relative to the largest |g| of the tensor: f32 sums of a few dozen products in another order.
constexpr double kWGradTol = 1e-5;
// After the steps: AdamW's first steps move a weight by about lr · g / |g| whatever |g| is, so a
// gradient that differs by rounding moves it by much less than lr; 3e-3 · lr bounds that drift
// through three steps here (measured on 2, 3 and 4 ranks: at most 7.6e-6 = 7.6e-4 · lr, in bf16;
// a gradient element near 0 can take another AdamW direction).
constexpr float kLr = 1e-2f;
constexpr double kStepTol = 3e-3 * kLr;

struct TrainRun {
  std::vector<std::vector<float>> first_logprobs;  // [step 0 only]
  ModelParameters first_grads;                     // summed over the ranks, after the first backward
  ModelParameters local_first_grads;               // this rank's, before the sum
  std::vector<double> losses;                      // per step, summed over the ranks
  ModelParameters params;                          // after the steps
};

// sharded_weights: ShardedAdamW, reduced layer by layer, and the weight copies kept by rows
// (train/sharded_weights.h, ZeRO-3): a rank then never holds another rank's experts in training.
enum class Optimizer { replicated, sharded, sharded_layerwise, sharded_weights };

TrainRun train(Communicator& comm, Recipe recipe, bool expert_parallel, Optimizer kind, int steps,
               const ModelConfig& mc = ep_config()) {
  Transformer model(mc, lockstep::testing::random_parameters(mc, 7), recipe);
  if (expert_parallel)
    model.set_expert_parallel({comm.rank(), comm.size(),
                               [&comm](const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                                       std::span<const int64_t> recv_rows) {
                                 comm.all_to_all(send, send_rows, recv, recv_rows);
                               }});
  OptimizerConfig oc;
  oc.schedule.peak_lr = kLr;
  std::unique_ptr<DataParallelOptimizer> optimizer;
  std::unique_ptr<LayerwiseReduce> layerwise;
  std::unique_ptr<ShardedWeights> sharded_weights;
  if (kind == Optimizer::replicated) {
    optimizer = std::make_unique<ReplicatedAdamW>(model.params(), oc, comm);
  } else {
    auto sharded = std::make_unique<ShardedAdamW>(model.params(), oc, comm, ShardedAdamW::kDefaultBucketNumel,
                                                  /*experts_owned=*/true);
    if (kind != Optimizer::sharded) layerwise = std::make_unique<LayerwiseReduce>(model, *sharded);
    if (kind == Optimizer::sharded_weights) {
      model.release_masters();
      sharded_weights = std::make_unique<ShardedWeights>(model, *sharded);
    }
    optimizer = std::move(sharded);
  }
  // The copies the step writes: the model's, except those kept by rows (the step writes the rows).
  const AdamW::CopiesOf copies = [&](const std::string& name) {
    return sharded_weights && sharded_weights->holds(name) ? WeightCopies{} : model.weight_copies(name);
  };
  // With the copies kept by rows: inside each sparse layer the model holds this rank's experts'
  // copies and no other's.
  int64_t layers_checked = 0;
  if (sharded_weights)
    model.set_activation_tap([&](int64_t layer, std::string_view op, const LinearInput&) {
      if (op != "mlp_norm" || !mc.is_moe_layer(layer)) return;
      const int64_t per_rank = mc.moe->num_experts / comm.size();
      for (int64_t e = 0; e < mc.moe->num_experts; ++e) {
        const std::string name = "layers." + std::to_string(layer) + ".experts." + std::to_string(e) + ".down";
        const WeightCopies c = model.weight_copies(name);
        EXPECT_EQ(c.bf16 ? c.bf16->defined() : c.fp8->w.data.defined(), e / per_rank == comm.rank()) << name;
      }
      ++layers_checked;
    });
  TrainRun run;
  int64_t forwards = 0;
  // Each rank its own tokens (so the ranks route differently and rows cross), lengths differing.
  const auto batch_of = [&](uint64_t seed) {
    return lockstep::testing::pack(lockstep::testing::random_sequences({5 + comm.rank(), 7, 3}, mc.vocab_size,
                                                                       seed + uint64_t(comm.rank())));
  };
  // A micro-batch's forward and (with `backward`) backward; returns its loss, −Σ logprob.
  const auto micro_batch = [&](uint64_t seed, bool backward, std::vector<float>* logprobs = nullptr) {
    TrainForward fwd = model.forward(batch_of(seed));
    ++forwards;
    const int64_t t = fwd.logprob.dim(0);
    Tensor dlogprob = Tensor::empty({t}, DType::f32);
    double loss = 0;
    for (int64_t i = 0; i < t; ++i) {
      loss -= fwd.logprob.data_as<float>()[i];
      dlogprob.data_as<float>()[i] = -1.0f / 64;
    }
    if (logprobs) *logprobs = lockstep::testing::to_floats(fwd.logprob);
    if (backward) model.backward(fwd, dlogprob, Tensor(), /*load_balancing_weight=*/0.01, /*router_z_weight=*/0.001);
    else model.skip_backward(&fwd);  // (no-op without pass hooks)
    return loss;
  };
  for (int step = 0; step < steps; ++step) {
    double loss = 0;
    if (step == 0) run.first_logprobs.emplace_back();
    loss += micro_batch(uint64_t(100 * step), true, step == 0 ? &run.first_logprobs.back() : nullptr);
    if (step == 1) {
      // Rank 0 runs a forward alone (an old-policy logprob pass) and a second micro-batch; the
      // others skip them (with expert parallelism: passes of one token that serve rank 0's rows).
      if (comm.rank() == 0) {
        (void)model.forward(batch_of(7), 1.0f, /*for_backward=*/false);
        ++forwards;
        loss += micro_batch(1000, true);
      } else {
        model.skip_forward();
        model.skip_forward();
        model.skip_backward();
        forwards += 2;
      }
    }
    // The last rank's backward of a second micro-batch is skipped (a non-finite loss would be):
    // its rows count for nothing there, the other ranks' count.
    if (step == 2) {
      const bool last = comm.rank() == comm.size() - 1;
      const double extra = micro_batch(2000, !last);
      if (!last) loss += extra;
    }
    run.losses.push_back(sum_over_ranks(comm, loss));
    if (step == 0 && !layerwise) {
      run.local_first_grads = model.grads().copy_to(Device::cpu);
      run.first_grads = model.grads().copy_to(Device::cpu);
      sum_gradients_over_ranks(comm, run.first_grads);
    }
    const OptimizerStep s = optimizer->step(model.params(), model.grads(), copies);
    EXPECT_TRUE(s.applied);
  }
  if (sharded_weights) {
    EXPECT_EQ(layers_checked, forwards);  // one sparse layer a forward
  }
  if (optimizer->holds_masters()) {
    run.params = ModelParameters::zeros(mc);
    optimizer->gather_masters(run.params);
  } else {
    run.params = model.params().copy_to(Device::cpu);
  }
  return run;
}

bool is_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }
int64_t expert_of(const std::string& name) {
  const size_t at = name.find(".experts.") + 9;
  return std::stoll(name.substr(at, name.find('.', at) - at));
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, double(std::fabs(t.data_as<float>()[i])));
  return m;
}

// The first backward's gradients summed over the ranks (the header says what must agree).
void expect_same_first_gradients(const TrainRun& ep, const TrainRun& all, Communicator& comm) {
  const int64_t per_rank = ep_config().moe->num_experts / comm.size();
  std::vector<Tensor> got, local;
  ep.first_grads.for_each([&](const std::string&, const Tensor& t) { got.push_back(t); });
  ep.local_first_grads.for_each([&](const std::string&, const Tensor& t) { local.push_back(t); });
  size_t i = 0;
  int experts_checked = 0;
  all.first_grads.for_each([&](const std::string& name, const Tensor& w) {
    const Tensor &g = got[i], &l = local[i];
    ++i;
    if (!is_expert(name)) {
      EXPECT_EQ(std::memcmp(w.data(), g.data(), w.nbytes()), 0) << name;
      return;
    }
    const bool mine = expert_of(name) / per_rank == comm.rank();
    const double scale = max_abs(w), tol = kWGradTol * scale;
    if (scale > 0) ++experts_checked;
    for (int64_t j = 0; j < w.numel(); ++j) {
      ASSERT_NEAR(g.data_as<float>()[j], w.data_as<float>()[j], tol) << name << " element " << j;
      if (!mine) {
        ASSERT_EQ(l.data_as<float>()[j], 0.0f) << name << ": another rank's expert has a gradient here";
      }
    }
  });
  EXPECT_GT(experts_checked, 0) << "no expert had a gradient: nothing was tested";
}

// The largest |a − b| over every weight.
double largest_difference(const ModelParameters& a, const ModelParameters& b) {
  std::vector<Tensor> bs;
  b.for_each([&](const std::string&, const Tensor& t) { bs.push_back(t); });
  size_t i = 0;
  double largest = 0;
  a.for_each([&](const std::string&, const Tensor& t) {
    const Tensor& w = bs[i++];
    for (int64_t j = 0; j < t.numel(); ++j)
      largest = std::max(largest, std::fabs(double(t.data_as<float>()[j]) - w.data_as<float>()[j]));
  });
  return largest;
}

std::string case_name(Recipe recipe, Optimizer kind) {
  const char* kinds[] = {"replicated", "sharded", "sharded_layerwise", "sharded_weights"};
  return std::string(recipe_name(recipe)) + "_" + kinds[int(kind)];
}

class ExpertParallelTraining : public ::testing::TestWithParam<std::tuple<Recipe, Optimizer>> {};

TEST_P(ExpertParallelTraining, EqualsEveryRankRunningEveryExpert) {
  Communicator& comm = world();
  const int steps = 3;
  const auto [recipe, kind] = GetParam();
  const TrainRun ep = train(comm, recipe, true, kind, steps);
  const TrainRun all = train(comm, recipe, false, Optimizer::replicated, steps);

  ASSERT_EQ(ep.first_logprobs, all.first_logprobs);
  for (int s = 0; s < steps; ++s)
    EXPECT_NEAR(ep.losses[size_t(s)], all.losses[size_t(s)], 1e-4 * std::fabs(all.losses[size_t(s)])) << "step " << s;
  // (Reduced layer by layer, no rank holds the summed gradient.)
  if (kind == Optimizer::replicated || kind == Optimizer::sharded) expect_same_first_gradients(ep, all, comm);
  const double largest = largest_difference(ep.params, all.params);
  EXPECT_LE(largest, kStepTol);
  // The weights moved (by about lr a step): the comparison is not of untouched weights.
  EXPECT_GT(largest_difference(ep.params, lockstep::testing::random_parameters(ep_config(), 7)), 0.5 * kLr);
  if (comm.is_main())
    std::printf("%d ranks: largest weight difference after %d steps %.3g (lr %.3g)\n", comm.size(), steps,
                largest, double(kLr));
}

INSTANTIATE_TEST_SUITE_P(RecipesAndOptimizers, ExpertParallelTraining,
                         ::testing::Values(std::tuple{Recipe::fp32, Optimizer::replicated},
                                           std::tuple{Recipe::bf16, Optimizer::replicated},
                                           std::tuple{Recipe::fp32, Optimizer::sharded},
                                           std::tuple{Recipe::bf16, Optimizer::sharded_layerwise},
                                           std::tuple{Recipe::bf16, Optimizer::sharded_weights}),
                         [](const auto& info) { return case_name(std::get<0>(info.param), std::get<1>(info.param)); });

// rl/grpo_update.h's update with expert parallelism: each rank's share of a batch of rollouts, in
// micro-batches of few tokens (so the ranks have different numbers of them and skip passes), the
// old logprobs recomputed (forwards alone), the router z-loss on: the loss and the gradient
// summed over the ranks agree with the same update without it (the same tolerances as above).
// fp8, ZeRO-3: each rank holds only its own experts' stacked copies (model/moe.h) and the grouped
// fp8 GEMMs read that stretch; the first forward's logprobs equal the run without expert
// parallelism bit for bit (a row's expert GEMMs do not depend on the other rows). (The gradients
// are not compared: an expert's 128-token WGrad blocks hold every rank's rows at once here, so its
// fp8 gradient differs by quantization, not rounding.)
TEST(ExpertParallel, Fp8ZeroThreeForwardEqualsEveryRankRunningEveryExpert) {
  Communicator& comm = world();
  const ModelConfig mc = ep_config_fp8();
  ASSERT_TRUE(Transformer(mc, lockstep::testing::random_parameters(mc, 7), Recipe::fp8).grouped_fp8_experts());
  const TrainRun ep = train(comm, Recipe::fp8, true, Optimizer::sharded_weights, 1, mc);
  const TrainRun all = train(comm, Recipe::fp8, false, Optimizer::replicated, 1, mc);
  ASSERT_EQ(ep.first_logprobs, all.first_logprobs);
}

TEST(ExpertParallel, GrpoUpdateEqualsTheUpdateWithoutIt) {
  Communicator& comm = world();
  const ModelConfig mc = ep_config();
  const ModelParameters params = lockstep::testing::random_parameters(mc, 31);
  Transformer rollout(mc, params.copy_to(Device::cpu), Recipe::fp32);
  Engine engine(rollout, {.num_blocks = 256, .block_size = 4, .record_routing = true});
  std::vector<GenerationRequest> requests(12);  // divides among 1, 2, 3 and 4 ranks
  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].prompt = {int32_t(1 + r), int32_t(2 + r), 3};
    requests[r].sampling.n = 2;
    requests[r].sampling.max_new_tokens = 2 + int(r % 5);
    requests[r].sampling.seed = 40 + r;
  }
  const auto samples = engine.generate(requests);
  const size_t share = requests.size() / size_t(comm.size());
  std::vector<ScoredGroup> mine;
  for (size_t r = share * size_t(comm.rank()); r < share * size_t(comm.rank() + 1); ++r)
    mine.push_back({requests[r].prompt, samples[r], {float(r % 2), float((r + 1) % 3)}});
  Config c;
  c.rollout.max_new_tokens = 6;
  c.optim.micro_batch_tokens = 12 + 4 * comm.rank();  // another count of micro-batches per rank
  c.loss.router_z_coef = 0.01;

  const auto update = [&](bool expert_parallel, ModelParameters& summed) {
    Transformer trainer(mc, params.copy_to(Device::cpu), Recipe::fp32);
    if (expert_parallel) trainer.set_expert_parallel(expert_parallel_over(comm));
    const OptimizerStepFn capture = [&](ModelParameters&, ModelParameters& grads) {
      summed = grads.copy_to(Device::cpu);
      sum_gradients_over_ranks(comm, summed);
      grads.zero();
      OptimizerStep s;
      s.applied = true;
      return s;
    };
    return metric(grpo_update(mine, c, trainer, nullptr, capture, comm).metrics, "loss");
  };
  ModelParameters with, without;
  const double loss_with = update(true, with), loss_without = update(false, without);
  EXPECT_NEAR(loss_with, loss_without, 1e-9 * std::fabs(loss_without));
  std::vector<Tensor> got;
  with.for_each([&](const std::string&, const Tensor& t) { got.push_back(t); });
  size_t i = 0;
  without.for_each([&](const std::string& name, const Tensor& w) {
    const Tensor& g = got[i++];
    if (!is_expert(name)) {
      EXPECT_EQ(std::memcmp(w.data(), g.data(), w.nbytes()), 0) << name;
      return;
    }
    const double tol = kWGradTol * max_abs(w);
    for (int64_t j = 0; j < w.numel(); ++j) ASSERT_NEAR(g.data_as<float>()[j], w.data_as<float>()[j], tol) << name;
  });
  EXPECT_GT(max_abs(without.layers[0].router), 0.0) << "no gradient: nothing was tested";
}

using lockstep::testing::expect_error;

TEST(ExpertParallel, BadSetupsAreClearErrors) {
  const ModelConfig mc = ep_config();
  Transformer model(mc, lockstep::testing::random_parameters(mc, 7), Recipe::fp32);
  const auto nothing = [](const Tensor&, std::span<const int64_t>, Tensor&, std::span<const int64_t>) {};
  expect_error([&] { model.set_expert_parallel({0, 5, nothing}); },
               "expert parallelism (optim.expert_parallel): 12 experts do not split evenly over 5 ranks");
  expect_error([&] { model.set_expert_parallel({2, 2, nothing}); }, "set_expert_parallel: rank 2 of 2");
  const ModelConfig dense = lockstep::testing::tiny_config(ModelFamily::qwen3);
  Transformer dense_model(dense, lockstep::testing::random_parameters(dense, 7), Recipe::fp32);
  expect_error([&] { dense_model.set_expert_parallel({0, 1, nothing}); },
               "set_expert_parallel: the model has no sparse layers");
  // A skipped backward is a real one (its experts serve the other ranks' rows): of a forward.
  model.set_expert_parallel({0, 2, nothing});
  expect_error([&] { model.skip_backward(); },
               "skip_backward: with expert parallelism it backpropagates a forward: the skipped one");
}

}  // namespace
