// tests/dist/test_data_parallel.cpp — data-parallel GRPO and SFT (rl/train.h) on N ranks against
// the same run on one rank with the same global batch. Run by CTest under `mpirun -np 2` and
// `-np 3` (tests/CMakeLists.txt); alone, the N-rank run is the 1-rank run and the tests still
// check it against a second one.
//
// The runs: the builtin model (one layer) on the CPU, six prompts × four samples a step, rewards
// with DAPO's overlong penalty over the whole budget, so that responses of different lengths get
// different rewards and every step has a gradient (the untrained model is rarely right).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/host_values.h"
#include "dist/world.h"
#include "rl/grpo_update.h"
#include "rl/train.h"
#include "rollout/engine.h"
#include "tests/dist/test_world.h"
#include "tests/model/model_test_util.h"

using namespace lockstep;

namespace {

namespace fs = std::filesystem;

using lockstep::testing::world;

Config tiny_run(const std::string& name) {
  Config c;
  c.model.device = "cpu";
  c.model.builtin_layers = 1;
  c.sft.steps = 0;
  c.run.steps = 3;
  c.run.eval_every = 0;
  c.run.eval_problems = 5;
  // getppid(): mpirun's process for every rank, and another for each test run beside it.
  c.run.out_dir = (fs::temp_directory_path() /
                   ("lockstep_test_dp_" + name + "_" + std::to_string(getppid()))).string();
  c.rollout.prompts_per_step = 6;  // divides among 1, 2 and 3 ranks
  c.rollout.samples_per_prompt = 4;
  c.rollout.max_new_tokens = 4;
  c.loss.overlong_buffer = 4;
  c.loss.overlong_penalty = 0.5;
  c.optim.micro_batch_tokens = 24;  // several micro-batches per rank and mini-batch
  return c;
}

// FNV-1a over every parameter's bytes, in ModelParameters::for_each's order.
uint64_t weights_hash(const ModelParameters& p) {
  uint64_t h = 1469598103934665603ull;
  p.for_each([&](const std::string&, const Tensor& t) {
    const auto* b = static_cast<const unsigned char*>(t.data());
    for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  });
  return h;
}

struct Recorded {
  std::vector<uint64_t> hashes;   // after each step (SFT's, then GRPO's)
  std::vector<float> weights;     // every parameter at the end, in for_each's order
  std::vector<nlohmann::json> metrics;  // metrics.jsonl (rank 0)
};

// `config` run on `comm`: rank 0 writes config.run.out_dir (emptied first).
Recorded record(Config config, Communicator& comm, const std::string& suffix) {
  config.run.out_dir += suffix;
  if (comm.is_main()) fs::remove_all(config.run.out_dir);
  comm.barrier();
  Recorded r;
  TrainHooks hooks;
  hooks.after_step = [&](int64_t, const ModelParameters& p) {
    r.hashes.push_back(weights_hash(p));
    r.weights.clear();
    p.for_each([&](const std::string&, const Tensor& t) {
      r.weights.insert(r.weights.end(), t.data_as<float>(), t.data_as<float>() + t.numel());
    });
  };
  run_train(config, hooks, comm);
  if (comm.is_main()) {
    std::ifstream in(fs::path(config.run.out_dir) / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) r.metrics.push_back(nlohmann::json::parse(line));
    fs::remove_all(config.run.out_dir);
  }
  return r;
}

// Every rank's hash after each step is rank 0's.
void expect_identical_on_every_rank(Communicator& comm, const std::vector<uint64_t>& hashes) {
  std::vector<double> halves;  // 32-bit halves: exact in a double
  for (uint64_t h : hashes) {
    halves.push_back(double(h >> 32));
    halves.push_back(double(h & 0xffffffffu));
  }
  const std::vector<double> all = gather_over_ranks(comm, std::span<const double>(halves));
  ASSERT_EQ(all.size(), halves.size() * size_t(comm.size()));
  for (int r = 1; r < comm.size(); ++r)
    for (size_t i = 0; i < halves.size(); ++i)
      EXPECT_EQ(all[size_t(r) * halves.size() + i], all[i])
          << "rank " << r << " holds other weights than rank 0 after step " << i / 2 + 1;
}

// Metrics that are the same sums in any order (counts, or computed from the gathered rows).
const char* kExactMetrics[] = {"accuracy", "answer_found", "response_length", "groups_kept",
                               "rollout_batches", "overlong_frac", "mismatch_abs",
                               "mismatch_tokens_differ", "mismatch_mult_prob_error", "mismatch_k3",
                               "grad_norm", "lr", "skipped", "mismatch_abs_by_position",
                               "mismatch_tokens_by_position"};
// Metrics summed in double over micro-batches and then over ranks: another order than one rank's
// running sum, so they agree to the double's rounding (relative 1e-12 covers a few dozen terms).
const char* kSummedMetrics[] = {"reward_mean", "loss", "entropy", "kl_ref", "clip_frac",
                                "clip_frac_dual", "tis_clip_frac"};

// grad_norm_exact: false for a sharded optimizer state, whose ‖g‖ adds the Σ g² of a tensor cut
// between ranks in parts (train/sharded_optimizer.h): it agrees to 1e-14 relative there.
void expect_same_metrics(const std::vector<nlohmann::json>& n_ranks,
                         const std::vector<nlohmann::json>& one_rank, bool grad_norm_exact = true) {
  ASSERT_EQ(n_ranks.size(), one_rank.size());
  for (size_t s = 0; s < n_ranks.size(); ++s) {
    for (const char* key : kExactMetrics) {
      ASSERT_EQ(n_ranks[s].contains(key), one_rank[s].contains(key)) << key;
      if (!grad_norm_exact && std::string(key) == "grad_norm") {
        const double a = n_ranks[s][key], b = one_rank[s][key];
        EXPECT_NEAR(a, b, 1e-14 * std::fabs(b)) << key << ", step " << s + 1;
      } else if (n_ranks[s].contains(key)) {
        EXPECT_EQ(n_ranks[s][key], one_rank[s][key]) << key << ", step " << s + 1;
      }
    }
    for (const char* key : kSummedMetrics) {
      ASSERT_EQ(n_ranks[s].contains(key), one_rank[s].contains(key)) << key;
      if (!n_ranks[s].contains(key) || n_ranks[s][key].is_null()) continue;
      const double a = n_ranks[s][key], b = one_rank[s][key];
      EXPECT_NEAR(a, b, 1e-12 * std::max(1.0, std::fabs(b))) << key << ", step " << s + 1;
    }
  }
}

// Runs `c` on comm's ranks and then (rank 0) on one rank: the ranks hold the same weights after
// every step, the one-rank run's bits, which change; the metrics agree (expect_same_metrics with
// `grad_norm_exact`). `metrics` (if given) gets the N-rank run's metrics (rank 0 records them).
void expect_ranks_equal_one_rank(Communicator& comm, const Config& c, bool grad_norm_exact,
                                 std::vector<nlohmann::json>* metrics = nullptr) {
  const Recorded n = record(c, comm, "_ranks");
  expect_identical_on_every_rank(comm, n.hashes);
  ASSERT_EQ(n.hashes.size(), 3u);
  if (metrics) *metrics = n.metrics;
  if (comm.is_main()) {
    const Recorded one = record(c, single_rank(), "_one");
    EXPECT_EQ(n.hashes, one.hashes);
    expect_same_metrics(n.metrics, one.metrics, grad_norm_exact);
    EXPECT_NE(n.hashes.front(), n.hashes.back()) << "the weights never changed: nothing was tested";
  }
  comm.barrier();
}

// (scale_rewards, aggregation, optim.shard_state): the default, and batch std scaling (the std of
// every rank's rewards) with the sequence-mean normalizer (the mini-batch's sequence count over all
// ranks); each with the optimizer state sharded over the ranks and replicated.
class DataParallelExact
    : public ::testing::TestWithParam<std::tuple<const char*, const char*, bool>> {};

TEST_P(DataParallelExact, GrpoEqualsOneRankBitForBit) {
  // mini_batches = N: each optimizer step's mini-batch is one rank's share of the batch, so its
  // gradient comes from that rank's micro-batches alone, as on one rank, and the sum over the
  // ranks adds exact zeros: the weights are the same bits after every step. With the state
  // sharded the gradients are reduce-scattered after each micro-batch's backward, layer by layer,
  // and summed over the micro-batches in the shard (train/layerwise_reduce.h): one rank's
  // micro-batches add in another order there, so the sharded cases take one micro-batch a
  // mini-batch (the several-micro-batch case agrees within rounding: the test below).
  Communicator& comm = world();
  const auto [scaling, aggregation, shard_state] = GetParam();
  Config c = tiny_run(std::string("exact_") + scaling + "_" + (shard_state ? "sharded_" : "") +
                      std::to_string(comm.size()));
  c.optim.mini_batches = comm.size();
  c.optim.shard_state = shard_state;
  if (shard_state) c.optim.micro_batch_tokens = 4096;
  c.loss.scale_rewards = scaling;
  c.loss.aggregation = aggregation;
  std::vector<nlohmann::json> metrics;
  expect_ranks_equal_one_rank(comm, c, !shard_state || comm.size() == 1, &metrics);
  double grad_norm = 0;
  for (const nlohmann::json& m : metrics) grad_norm += m["grad_norm"].get<double>();
  if (comm.is_main()) {
    EXPECT_GT(grad_norm, 0) << "no gradient in any step: nothing was tested";
  }
}

INSTANTIATE_TEST_SUITE_P(Losses, DataParallelExact,
                         ::testing::Values(std::tuple{"group", "token-mean", true},
                                           std::tuple{"batch", "sequence-mean", true},
                                           std::tuple{"group", "token-mean", false},
                                           std::tuple{"batch", "sequence-mean", false}),
                         [](const auto& info) {
                           std::string name = std::string(std::get<0>(info.param)) + "_" +
                                              std::get<1>(info.param) +
                                              (std::get<2>(info.param) ? "_sharded" : "_replicated");
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// optim.shard_weights (train/sharded_weights.h): the weight copies the GEMMs read are kept by rows
// and gathered per layer and before each generation; gathering moves bytes, so the run is the one
// with whole copies on every rank, bit for bit: the same weights after every step (SFT's and
// GRPO's; the phase change rebuilds the row copies) on every rank, and the same metrics, the last
// step's evaluation included; between steps each rank holds fewer bytes of copies
// (weight_copies_gb). Two layers, so that a layer is gathered beside another's compute; every
// precision mode (fp8-rollout: the rollout model keeps its whole fp8 copies, the trainer's bf16
// ones are sharded).
class ShardedWeightsExact : public ::testing::TestWithParam<const char*> {};

TEST_P(ShardedWeightsExact, TrainingEqualsWholeCopiesBitForBit) {
  Communicator& comm = world();
  Config c = tiny_run(std::string("shard_weights_") + GetParam() + "_" + std::to_string(comm.size()));
  c.model.precision = GetParam();
  c.model.builtin_layers = 2;
  c.sft.steps = 1;
  c.sft.batch_size = 6;
  c.run.steps = 2;
  const Recorded whole = record(c, comm, "_whole");
  c.optim.shard_weights = true;
  const Recorded sharded = record(c, comm, "_sharded");
  expect_identical_on_every_rank(comm, sharded.hashes);
  ASSERT_EQ(sharded.hashes.size(), 3u);  // 1 SFT step, 2 GRPO steps
  EXPECT_EQ(sharded.hashes, whole.hashes);
  EXPECT_NE(sharded.hashes.front(), sharded.hashes.back()) << "the weights never changed: nothing was tested";
  if (comm.is_main()) {
    ASSERT_EQ(sharded.metrics.size(), whole.metrics.size());
    for (size_t s = 0; s < whole.metrics.size(); ++s)
      for (const auto& [key, value] : whole.metrics[s].items()) {
        if (key.starts_with("time_") || key == "tokens_per_s" || key == "weight_copies_gb") continue;
        EXPECT_EQ(sharded.metrics[s][key], value) << key << ", step " << s + 1;
      }
    const double held = sharded.metrics.back()["weight_copies_gb"];
    const double full = whole.metrics.back()["weight_copies_gb"];
    if (comm.size() > 1) {
      EXPECT_LT(held, full);
    } else {
      EXPECT_EQ(held, full);
    }
    std::printf("%s, %d ranks: %.0f bytes of weight copies per rank between steps, %.0f without "
                "optim.shard_weights\n", GetParam(), comm.size(), held * 1e9, full * 1e9);
  }
  comm.barrier();
}

INSTANTIATE_TEST_SUITE_P(Precisions, ShardedWeightsExact, ::testing::Values("bf16", "fp8", "fp8-rollout"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(DataParallel, ShardedStateReducedOncePerStepEqualsOneRankBitForBit) {
  // optim.reduce_per_layer = false: each rank sums its micro-batches' gradients whole, in the order
  // one rank does, and reduce-scatters the sum once per optimizer step; with one rank's share per
  // mini-batch (as above) the other ranks add exact zeros, so even several micro-batches a
  // mini-batch give one rank's bits.
  Communicator& comm = world();
  Config c = tiny_run("per_step_sharded_" + std::to_string(comm.size()));
  c.optim.mini_batches = comm.size();
  c.optim.shard_state = true;
  c.optim.reduce_per_layer = false;  // (tiny_run's micro-batches: several a mini-batch)
  expect_ranks_equal_one_rank(comm, c, comm.size() == 1);
}

TEST(DataParallel, SftAndGrpoAcrossRanksEqualOneRankWithinRounding) {
  // One mini-batch a step, and SFT before (its batch of 5 split unevenly): every optimizer step
  // sums gradients of every rank, in another order than one rank's running sum over its
  // micro-batches, so the N-rank gradient differs from the 1-rank one by f32 rounding (relative
  // ~1e-7 of the summed magnitudes). In bf16: each token's contribution to a weight gradient is the
  // same product whatever the batch, only the order of the f32 sums changes. (Not in fp8, whose
  // WGrad scales groups of 128 tokens: another split of the batch into micro-batches quantizes
  // differently; the bit-exact test above covers fp8 with splits that coincide.)
  // AdamW turns a gradient element into an update of at most ~lr (m̂/√v̂ is near ±1 in the first
  // steps); a relative rounding difference δ in the gradient moves it by about δ·lr, except where
  // the element is itself rounding noise around 0, where the two updates can differ by up to 2·lr.
  // Bounds: every weight within 2·lr·steps, 99.9% within 1e-4·lr·steps (δ ~1e-4 would already be
  // far beyond f32 rounding; 2 and 3 ranks measured 4e-9 and 7e-9 at most, ≤ 4e-6·lr). The per-step metrics
  // agree to 1e-5 relative: the rollouts are the same tokens unless a sampled token flips, which
  // weights this close do not cause in 5 steps.
  Communicator& comm = world();
  Config c = tiny_run("summed_" + std::to_string(comm.size()));
  c.sft.steps = 2;
  c.sft.batch_size = 5;  // uneven shares on 2 and 3 ranks
  c.optim.mini_batches = 1;
  c.model.precision = "bf16";
  const Recorded n = record(c, comm, "_ranks");
  expect_identical_on_every_rank(comm, n.hashes);
  ASSERT_EQ(n.hashes.size(), 5u);  // 2 SFT steps, 3 GRPO steps
  if (comm.is_main()) {
    const Recorded one = record(c, single_rank(), "_one");
    ASSERT_EQ(n.weights.size(), one.weights.size());
    const int steps = 5;
    const double lr = std::max(c.optim.lr, c.sft.lr), bound = 2 * lr * steps, bulk = 1e-4 * lr * steps;
    size_t within_bulk = 0;
    double worst = 0;
    for (size_t i = 0; i < n.weights.size(); ++i) {
      const double d = std::fabs(double(n.weights[i]) - double(one.weights[i]));
      worst = std::max(worst, d);
      within_bulk += d <= bulk;
    }
    EXPECT_LE(worst, bound);
    EXPECT_GE(double(within_bulk), 0.999 * double(n.weights.size())) << "worst " << worst;
    std::printf("%d ranks vs 1: largest weight difference %.3g (lr %.3g), %.4f of the weights within %.3g\n",
                comm.size(), worst, lr, double(within_bulk) / double(n.weights.size()), bulk);
    ASSERT_EQ(n.metrics.size(), one.metrics.size());
    for (size_t s = 0; s < n.metrics.size(); ++s) {
      for (const char* key : {"accuracy", "response_length", "groups_kept"})
        EXPECT_EQ(n.metrics[s][key], one.metrics[s][key]) << key << ", step " << s + 1;
      for (const char* key : {"loss", "entropy", "grad_norm", "reward_mean"}) {
        const double a = n.metrics[s][key], b = one.metrics[s][key];
        EXPECT_NEAR(a, b, 1e-5 * std::max(1.0, std::fabs(b))) << key << ", step " << s + 1;
      }
    }
  }
  comm.barrier();
}

TEST(DataParallel, CheckpointsResumeAcrossRankCounts) {
  // GRPO with the optimizer state sharded: N ranks stop after step 2 (a checkpoint) and N ranks,
  // then one rank, resume for step 3; one rank stops after step 2 and N ranks resume. All end with
  // the weights of the uninterrupted N-rank run (mini_batches = N and one micro-batch each: the
  // same bits as one rank, as above).
  Communicator& comm = world();
  Config c = tiny_run("resume_" + std::to_string(comm.size()));
  c.optim.mini_batches = comm.size();
  c.optim.micro_batch_tokens = 4096;
  c.optim.shard_state = true;
  const Recorded full = record(c, comm, "_full");
  ASSERT_EQ(full.hashes.size(), 3u);
  const TrainHooks stop_at_2{.stop_after = [](int64_t step) { return step == 2; },
                             .before_optimizer_step = {}, .after_step = {}};
  uint64_t last = 0;
  TrainHooks keep_last;
  keep_last.after_step = [&](int64_t, const ModelParameters& p) { last = weights_hash(p); };
  Config resumed = c;
  resumed.run.resume = true;

  // N → N (each rank reads its own shard's moments) and N → 1 (the whole masters and moments put
  // together from the N shard files), from one checkpoint.
  c.run.out_dir = resumed.run.out_dir = tiny_run("resume_" + std::to_string(comm.size())).run.out_dir + "_n_to_1";
  if (comm.is_main()) fs::remove_all(c.run.out_dir);
  comm.barrier();
  EXPECT_TRUE(run_train(c, stop_at_2, comm).interrupted);
  comm.barrier();
  const fs::path saved = fs::path(c.run.out_dir) / "checkpoint";
  const fs::path kept = fs::path(c.run.out_dir + "_kept");
  if (comm.is_main()) {
    EXPECT_EQ(fs::exists(saved / "shards"), comm.size() > 1) << "each rank writes its own shard";
    fs::remove_all(kept);
    fs::copy(saved, kept, fs::copy_options::recursive);
  }
  comm.barrier();
  last = 0;
  EXPECT_FALSE(run_train(resumed, keep_last, comm).interrupted);
  EXPECT_EQ(last, full.hashes.back()) << comm.size() << " ranks -> " << comm.size();
  expect_identical_on_every_rank(comm, {last});
  comm.barrier();
  if (comm.is_main()) {
    fs::remove_all(saved);
    fs::rename(kept, saved);
    last = 0;
    EXPECT_FALSE(run_train(resumed, keep_last, single_rank()).interrupted);
    EXPECT_EQ(last, full.hashes.back()) << comm.size() << " ranks -> 1";
    fs::remove_all(c.run.out_dir);
  }
  comm.barrier();

  // 1 → N
  c.run.out_dir = resumed.run.out_dir = tiny_run("resume_" + std::to_string(comm.size())).run.out_dir + "_1_to_n";
  if (comm.is_main()) {
    fs::remove_all(c.run.out_dir);
    EXPECT_TRUE(run_train(c, stop_at_2, single_rank()).interrupted);
  }
  comm.barrier();
  last = 0;
  EXPECT_FALSE(run_train(resumed, keep_last, comm).interrupted);
  EXPECT_EQ(last, full.hashes.back()) << "1 rank -> " << comm.size();
  expect_identical_on_every_rank(comm, {last});
  comm.barrier();
  if (comm.is_main()) fs::remove_all(c.run.out_dir);
}

// A sparse model's router metrics over the ranks' shares of a batch equal one rank's over the
// whole batch: the routing-disagreement counts exactly (the trainer's first router perturbed after
// the rollout, so that they are not 0), the z-loss within the double sums' rounding; with replay.
TEST(DataParallel, MoeRoutingMetricsAreThoseOfTheWholeBatch) {
  Communicator& comm = world();
  const ModelConfig mc = lockstep::testing::tiny_config(ModelFamily::qwen3_moe, {.layers = 3});
  const ModelParameters params = lockstep::testing::random_parameters(mc, 31);
  Transformer rollout(mc, params.copy_to(Device::cpu), Recipe::fp32);
  Transformer trainer(mc, params.copy_to(Device::cpu), Recipe::fp32);
  Tensor& router = trainer.params().layers[0].router;
  for (int64_t i = 0; i < router.numel(); ++i) router.data_as<float>()[i] *= i % 3 == 0 ? -1.0f : 1.0f;
  trainer.refresh_weights();

  Engine engine(rollout, {.num_blocks = 256, .block_size = 4, .record_routing = true});
  std::vector<GenerationRequest> requests(6);  // divides among 1, 2 and 3 ranks
  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].prompt = {int32_t(1 + r), int32_t(2 + r), 3};
    requests[r].sampling.n = 2;
    requests[r].sampling.max_new_tokens = 4;
    requests[r].sampling.seed = 40 + r;
  }
  const auto samples = engine.generate(requests);
  std::vector<ScoredGroup> all;
  for (size_t r = 0; r < requests.size(); ++r) all.push_back({requests[r].prompt, samples[r], {float(r % 2), 0.0f}});
  const size_t share = all.size() / size_t(comm.size());
  const std::vector<ScoredGroup> mine(all.begin() + ptrdiff_t(share * size_t(comm.rank())),
                                      all.begin() + ptrdiff_t(share * size_t(comm.rank() + 1)));
  Config c;
  c.rollout.max_new_tokens = 4;
  c.optim.micro_batch_tokens = 16;
  c.loss.router_z_coef = 0.01;
  c.model.routing_replay = true;
  const OptimizerStepFn no_step = [](ModelParameters&, ModelParameters& grads) {
    grads.zero();
    OptimizerStep s;
    s.applied = true;
    return s;
  };
  const Metrics n = grpo_update(mine, c, trainer, nullptr, no_step, comm).metrics;
  if (comm.is_main()) {
    const Metrics one = grpo_update(all, c, trainer, nullptr, no_step, single_rank()).metrics;
    EXPECT_GT(metric(one, "routing_disagreement"), 0.0);
    for (const char* key : {"routing_disagreement", "routing_disagreement_layers"})
      EXPECT_EQ(metric(n, key), metric(one, key)) << key;
    EXPECT_NEAR(metric(n, "router_z_loss"), metric(one, "router_z_loss"), 1e-12 * metric(one, "router_z_loss"));
  }
  comm.barrier();
}

TEST(DataParallel, PromptsMustDivideAmongTheRanks) {
  Config c = tiny_run("indivisible");
  c.rollout.prompts_per_step = 5;
  try {
    check_data_parallel(c, 2);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollout.prompts_per_step = 5 does not divide among 2 ranks"),
              std::string::npos) << e.what();
  }
  c.rollout.prompts_per_step = 6;
  c.loss.dynamic_sampling = true;
  EXPECT_THROW(check_data_parallel(c, 3), Error);
  EXPECT_NO_THROW(check_data_parallel(c, 1));
}

}  // namespace
