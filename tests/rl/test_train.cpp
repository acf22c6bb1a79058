// tests/rl/test_train.cpp — the RL loop end to end on the CPU backend with the builtin tiny model
// and the synthetic task: a resumed run reproduces the uninterrupted run's metrics bit for bit, and
// a short fixed-seed run of GRPO improves held-out accuracy over its SFT start.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "rl/train.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;

namespace fs = std::filesystem;

// A run folder of this process (ctest runs this file's tests in parallel processes, and two
// checkouts' runs may share /tmp), removed when the process ends.
fs::path fresh_dir(const std::string& name) {
  struct Made {
    std::vector<fs::path> dirs;
    ~Made() {
      for (const fs::path& d : dirs) fs::remove_all(d);
    }
  };
  static Made made;
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep_test_train_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  made.dirs.push_back(dir);
  return dir;
}

// Every metrics line without the timings (which differ run to run).
std::vector<std::string> metrics_without_times(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
    for (auto it = j.begin(); it != j.end();)
      it = it.key().starts_with("time_") || it.key() == "tokens_per_s" ? j.erase(it) : std::next(it);
    out.push_back(j.dump());
  }
  return out;
}

Config small_config(const fs::path& dir) {
  Config c;
  c.model.device = "cpu";
  c.model.builtin_layers = 1;
  c.sft.steps = 4;
  c.sft.batch_size = 8;
  c.run.steps = 4;
  c.run.eval_every = 2;
  c.run.eval_problems = 8;
  c.run.out_dir = dir.string();
  c.rollout.prompts_per_step = 4;
  c.rollout.samples_per_prompt = 4;
  c.rollout.max_new_tokens = 4;
  c.optim.mini_batches = 2;
  c.optim.micro_batch_tokens = 40;  // several micro-batches per mini-batch
  return c;
}

TEST(Train, ResumeReproducesTheUninterruptedRun) {
  for (const char* precision : {"fp8", "bf16", "fp8-rollout"}) {
    const fs::path a = fresh_dir(std::string("a_") + precision), b = fresh_dir(std::string("b_") + precision);
    Config ca = small_config(a), cb = small_config(b);
    ca.model.precision = cb.model.precision = precision;
    if (std::string(precision) == "fp8-rollout") ca.loss.tis_cap = cb.loss.tis_cap = 2;
    run_train(ca);

    // Interrupted once in SFT and once in GRPO, resumed each time.
    EXPECT_TRUE(run_train(cb, {.stop_after = [](int64_t step) { return step == -2; }, .before_optimizer_step = {}, .after_step = {}}).interrupted);
    cb.run.resume = true;
    EXPECT_TRUE(run_train(cb, {.stop_after = [](int64_t step) { return step == 2; }, .before_optimizer_step = {}, .after_step = {}}).interrupted);
    EXPECT_FALSE(run_train(cb).interrupted);

    for (const char* file : {"metrics.jsonl", "sft_metrics.jsonl"}) {
      const auto ma = metrics_without_times(a / file), mb = metrics_without_times(b / file);
      EXPECT_EQ(ma.size(), size_t(file == std::string("metrics.jsonl") ? 5 : 4)) << precision;
      EXPECT_EQ(ma, mb) << precision << " " << file;
    }
    EXPECT_TRUE(fs::exists(b / "checkpoint" / "model" / "model.safetensors"));
    EXPECT_TRUE(fs::exists(b / "checkpoint" / "model" / "tokenizer.json"));
  }
}

// The default job's recipe, shortened to 150 GRPO steps: held-out greedy accuracy after GRPO
// against after SFT, seed 1. Measured with this configuration on the CPU on 2026-11-28, with the
// LambdaLR warm-up of train/schedule.h (`lockstep train --run.steps=150 --run.eval_every=0
// --run.seed=N`): seed 1 0.445 -> 0.609, seed 2 0.609 -> 0.730, seed 3 0.816 -> 0.867 (256
// problems; SFT's end lands before or after the model "groks" addition depending on the seed,
// hence the spread). The margin asserted, +0.01 of accuracy, held for every seed tried; seed 1's
// run is deterministic on the CPU.
TEST(Train, GrpoImprovesHeldOutAccuracy) {
  Config c;
  c.model.device = "cpu";
  c.run.seed = 1;
  c.run.steps = 150;
  c.run.eval_every = 0;
  c.run.out_dir = fresh_dir("improves").string();
  c.run.log_every = 50;
  const TrainSummary s = run_train(c);
  std::printf("held-out greedy accuracy: after SFT %.4f, after GRPO %.4f\n", s.sft_accuracy,
              s.final_accuracy);
  EXPECT_GE(s.final_accuracy, s.sft_accuracy + 0.01);
}

// On the CPU the rollout's logprobs equal the training forward's bit for bit, in fp8 and bf16 and
// with the fp8 KV cache: the mismatch metric is exactly 0 at every step, and so is the mismatch by
// response position in every bin. A random model (no SFT) writes all max_new_tokens = 8 tokens
// mostly, so bins of 3 positions give three bins: 0-2, 3-5, 6-7; the bins' tokens add up to the
// step's response tokens.
TEST(Train, MismatchIsExactlyZeroInEveryPositionBin) {
  for (const auto& [precision, kv_cache] : {std::pair{"fp8", "fp8"}, {"fp8", "bf16"}, {"bf16", "bf16"}}) {
    SCOPED_TRACE(std::string(precision) + " with the " + kv_cache + " KV cache");
    const fs::path dir = fresh_dir(std::string("zero_mismatch_") + precision + "_" + kv_cache);
    Config c = small_config(dir);
    c.model.precision = precision;
    c.model.kv_cache = kv_cache;
    c.sft.steps = 0;
    c.rollout.max_new_tokens = 8;
    c.run.mismatch_bin_tokens = 3;
    c.run.steps = 2;
    c.run.eval_every = 0;
    run_train(c);
    int steps = 0;
    size_t most_bins = 0;
    std::ifstream in(dir / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j.contains("mismatch_abs")) continue;
      EXPECT_EQ(j["mismatch_abs"].get<double>(), 0.0) << line;
      const auto by_position = j.at("mismatch_abs_by_position").get<std::vector<double>>();
      const auto tokens = j.at("mismatch_tokens_by_position").get<std::vector<double>>();
      ASSERT_EQ(by_position.size(), tokens.size()) << line;
      ASSERT_LE(tokens.size(), 3u) << line;
      for (double v : by_position) EXPECT_EQ(v, 0.0) << line;
      double counted = 0;
      for (double t : tokens) counted += t;
      const double samples = double(c.rollout.prompts_per_step * c.rollout.samples_per_prompt);
      EXPECT_EQ(counted, j["response_length"].get<double>() * samples) << line;
      most_bins = std::max(most_bins, tokens.size());
      ++steps;
    }
    EXPECT_EQ(steps, 2);
    EXPECT_EQ(most_bins, 3u);
  }
}

// Every parameter's bits after each GRPO step of `config`, and metrics.jsonl's GRPO lines.
struct ExactRun {
  std::vector<std::vector<float>> weights;
  std::vector<nlohmann::json> metrics;
};
ExactRun run_recorded(const Config& config) {
  ExactRun r;
  TrainHooks hooks;
  hooks.after_step = [&](int64_t step, const ModelParameters& p) {
    if (step < 1) return;
    r.weights.emplace_back();
    p.for_each([&](const std::string&, const Tensor& t) {
      r.weights.back().insert(r.weights.back().end(), t.data_as<float>(), t.data_as<float>() + t.numel());
    });
  };
  run_train(config, hooks);
  std::ifstream in(fs::path(config.run.out_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) r.metrics.push_back(nlohmann::json::parse(line));
  return r;
}

// On the CPU the rollout's logprobs are the training forward's bit for bit, so a run with
// rollout.exact, which reuses them as the old policy's instead of recomputing them
// (loss.reuse_rollout_logprobs, which load_config makes exact imply), trains the same weights bit
// for bit as the default run that recomputes them, at every step. Its check steps
// (rollout.exact_check_every = 1: every step) recompute them anyway and measure a mismatch of
// exactly 0 with no token differing; without checks the mismatch is not measured (null).
TEST(Train, ExactRolloutTrainsTheSameWeightsWithoutTheRecompute) {
  for (const char* precision : {"fp8", "bf16"}) {
    SCOPED_TRACE(precision);
    Config recompute = small_config(fresh_dir(std::string("exact_off_") + precision));
    recompute.model.precision = precision;
    recompute.sft.steps = 0;
    recompute.run.steps = 3;
    recompute.run.eval_every = 0;
    Config checked = recompute, unchecked = recompute;
    for (Config* c : {&checked, &unchecked}) {
      c->rollout.exact = true;
      c->loss.reuse_rollout_logprobs = true;
    }
    checked.rollout.exact_check_every = 1;
    checked.run.out_dir = fresh_dir(std::string("exact_checked_") + precision).string();
    unchecked.rollout.exact_check_every = 0;
    unchecked.run.out_dir = fresh_dir(std::string("exact_unchecked_") + precision).string();

    const ExactRun a = run_recorded(recompute), b = run_recorded(checked), c = run_recorded(unchecked);
    ASSERT_EQ(a.weights.size(), 3u);
    EXPECT_EQ(b.weights, a.weights);
    EXPECT_EQ(c.weights, a.weights);
    EXPECT_NE(a.weights.front(), a.weights.back());  // the steps did train
    ASSERT_EQ(b.metrics.size(), 3u);
    ASSERT_EQ(c.metrics.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(a.metrics[i].at("mismatch_abs").get<double>(), 0.0);
      EXPECT_EQ(b.metrics[i].at("mismatch_abs").get<double>(), 0.0);
      EXPECT_EQ(b.metrics[i].at("mismatch_tokens_differ").get<double>(), 0.0);
      EXPECT_EQ(b.metrics[i].at("mismatch_k3").get<double>(), 0.0);
      EXPECT_EQ(b.metrics[i].at("reward_mean"), a.metrics[i].at("reward_mean"));
      EXPECT_TRUE(c.metrics[i].at("mismatch_abs").is_null());
      EXPECT_TRUE(c.metrics[i].at("mismatch_tokens_differ").is_null());
      EXPECT_FALSE(c.metrics[i].contains("mismatch_abs_by_position"));
    }
  }
}

// Check steps are the first and every exact_check_every-th after it: steps 1 and 3 of 4 at 2.
TEST(Train, ExactCheckEveryPicksTheCheckedSteps) {
  Config c = small_config(fresh_dir("exact_check_every"));
  c.sft.steps = 0;
  c.run.eval_every = 0;
  c.rollout.exact = true;
  c.loss.reuse_rollout_logprobs = true;
  c.rollout.exact_check_every = 2;
  const ExactRun r = run_recorded(c);
  ASSERT_EQ(r.metrics.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(r.metrics[i].at("mismatch_abs").is_null(), i % 2 == 1) << "step " << i + 1;
}

// A run resumed after its last step runs nothing, logs nothing more, and reports the accuracy its
// log ended with.
TEST(Train, ResumingACompleteRunRunsNothing) {
  const fs::path dir = fresh_dir("complete");
  Config c = small_config(dir);
  c.run.steps = 2;
  const TrainSummary first = run_train(c);
  EXPECT_FALSE(first.already_complete);
  const auto logged = metrics_without_times(dir / "metrics.jsonl");
  c.run.resume = true;
  const TrainSummary again = run_train(c);
  EXPECT_TRUE(again.already_complete);
  EXPECT_FALSE(again.interrupted);
  EXPECT_EQ(again.final_accuracy, first.final_accuracy);
  EXPECT_FALSE(std::isnan(again.final_accuracy));
  EXPECT_EQ(metrics_without_times(dir / "metrics.jsonl"), logged);
  // More steps asked for: the run goes on.
  c.run.steps = 3;
  const TrainSummary more = run_train(c);
  EXPECT_FALSE(more.already_complete);
  EXPECT_EQ(metrics_without_times(dir / "metrics.jsonl").size(), logged.size() + 1);
}

TEST(Train, ResumeWithoutACheckpointIsAnError) {
  Config c = small_config(fresh_dir("no_checkpoint"));
  c.run.resume = true;
  expect_error([&] { run_train(c); }, "no checkpoint");
}

}  // namespace
}  // namespace lockstep
