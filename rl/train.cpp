// rl/train.cpp
#include "rl/train.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <numeric>

#include "core/device.h"
#include "core/error.h"
#include "dist/host_values.h"
#include "io/file_io.h"
#include "model/micro_batch.h"
#include "model/sft_loss.h"
#include "rl/checkpoint.h"
#include "rl/console.h"
#include "rl/dynamic_sampling.h"
#include "rl/eval.h"
#include "rl/grpo_update.h"
#include "rl/metrics.h"
#include "rl/packed_rows.h"
#include "rl/setup.h"
#include "rl/sharded_checkpoint.h"
#include "rollout/engine.h"
#include "tasks/verifier.h"
#include "train/data_parallel.h"
#include "train/layerwise_reduce.h"
#include "train/optimizer.h"
#include "train/overlong_penalty.h"
#include "train/sharded_optimizer.h"
#include "train/sharded_weights.h"

namespace lockstep {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) { g_interrupted = true; }

// SIGINT sets a flag the loop checks after each step; the previous handler comes back after.
class SigintGuard {
 public:
  SigintGuard() : previous_(std::signal(SIGINT, on_sigint)) { g_interrupted = false; }
  ~SigintGuard() { std::signal(SIGINT, previous_); }

 private:
  void (*previous_)(int);
};

OptimizerConfig optimizer_config(const OptimOptions& o, int64_t total_steps) {
  OptimizerConfig c;
  c.beta1 = float(o.beta1);
  c.beta2 = float(o.beta2);
  c.eps = float(o.eps);
  c.weight_decay = float(o.weight_decay);
  c.max_grad_norm = float(o.max_grad_norm);
  c.schedule.kind = o.schedule == "cosine" ? LrSchedule::Kind::cosine : LrSchedule::Kind::constant;
  c.schedule.peak_lr = float(o.lr);
  c.schedule.min_lr = float(o.min_lr);
  c.schedule.warmup_steps = o.warmup_steps;
  c.schedule.total_steps = std::max(total_steps, o.warmup_steps);
  return c;
}

// What a GPU allocation failing in each phase was for, and the settings that lower it (the error
// names them: core/device.h, MemoryPurpose).
MemoryPurpose model_memory() {
  return MemoryPurpose("the model (fp32 masters, gradients, weight copies) or its AdamW moments",
                       "a smaller model, or more GPUs (--gpus N; optim.shard_state splits the "
                       "optimizer state over them)");
}
MemoryPurpose kv_cache_memory(const Config& c) {
  return MemoryPurpose(detail::concat("the rollout's KV cache (rollout.kv_cache_fraction = ",
                                      c.rollout.kv_cache_fraction, " of the free memory)"),
                       "lower rollout.kv_cache_fraction");
}
MemoryPurpose rollout_memory() {
  return MemoryPurpose("the rollout's prefill and decode activations",
                       "lower rollout.kv_cache_fraction (the KV cache takes its share of the free "
                       "memory first)");
}
MemoryPurpose training_memory(const Config& c) {
  return MemoryPurpose(
      detail::concat("the training forward and backward of a micro-batch (optim.micro_batch_tokens = ",
                     c.optim.micro_batch_tokens, ")"),
      "lower optim.micro_batch_tokens, set model.recompute = true, or lower "
      "rollout.kv_cache_fraction (the KV cache keeps its memory through the step)");
}

// The engine's cache: every sample of a step resident at once (no preemption in normal runs); with
// several ranks, those of this rank's share of the prompts and of the evaluation problems.
EngineOptions engine_options(const Setup& s, int64_t max_prompt, int ranks) {
  EngineOptions e;
  e.block_size = s.config.rollout.block_size;
  const int64_t per_sequence = (max_prompt + s.config.rollout.max_new_tokens + e.block_size - 1) / e.block_size;
  const int64_t samples = s.config.rollout.prompts_per_step / ranks * s.config.rollout.samples_per_prompt;
  const int64_t eval = (s.config.run.eval_problems + ranks - 1) / ranks;
  e.num_blocks = per_sequence * std::max<int64_t>(samples, eval) + 1;
  e.max_step_sequences = std::max<int64_t>(256, samples);
  // A sparse model's routing goes with the samples (the routing-disagreement metric, routing replay).
  e.record_routing = s.model_config.moe.has_value();
  return e;
}

struct Run {
  Communicator* comm;
  Setup setup;
  fs::path out_dir;
  RunState state;
  std::optional<SavedRun> saved;
  std::unique_ptr<Policy> policy;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<DataParallelOptimizer> optimizer;
  // With the state sharded over several ranks: the gradients reduce-scattered layer by layer.
  std::unique_ptr<LayerwiseReduce> layerwise;
  // With optim.shard_weights too: the trainer's layer weight copies kept by rows.
  std::unique_ptr<ShardedWeights> sharded_weights;
  std::unique_ptr<Evaluator> evaluator;
};

// `command` ("train", "sft") names the run on its first console line.
Run start_run(const Config& config, std::string_view command, Communicator& comm,
              const std::string& config_toml) {
  check_data_parallel(config, comm.size());
  Run run{&comm, make_setup(config, /*need_data=*/true), config.run.out_dir, {}, {}, {}, {}, {}, {}, {}, {}};
  if (config.optim.expert_parallel && comm.size() > 1) {
    const ModelConfig& mc = run.setup.model_config;
    LOCKSTEP_CHECK(mc.moe.has_value(), "optim.expert_parallel = true: the model has no experts (not a "
                   "sparse model)");
    check_expert_parallel(mc.moe->num_experts, comm.size());
  }
  if (comm.is_main()) fs::create_directories(run.out_dir);
  if (config.run.resume) {
    run.saved = find_checkpoint(run.out_dir);
    LOCKSTEP_CHECK(run.saved.has_value(), "run.resume: no checkpoint in ", run.out_dir.string(),
                   " (expected ", (run.out_dir / "checkpoint" / "state.json").string(), ")");
  }
  std::printf("%s\n", run_header(command, run.setup, config.model.path, config.run.out_dir).c_str());
  if (comm.size() > 1)
    std::printf("%d data-parallel ranks, %s: each generates "
                "%lld of the %lld prompts a step; rank 0 prints and writes %s\n",
                comm.size(), !config.optim.shard_state ? "weights and optimizer state replicated"
                : config.optim.shard_weights ? "fp32 masters, gradients, optimizer state and weight copies sharded, "
                                               "weight copies gathered per layer"
                                             : "fp32 masters, gradients and optimizer state sharded, weight copies gathered", (long long)(config.rollout.prompts_per_step / comm.size()),
                (long long)config.rollout.prompts_per_step, config.run.out_dir.c_str());
  if (config.optim.expert_parallel && comm.size() > 1)
    std::printf("expert parallelism: each rank owns %lld of the %lld experts of every sparse layer and "
                "runs them on every rank's tokens\n",
                (long long)(run.setup.model_config.moe->num_experts / comm.size()),
                (long long)run.setup.model_config.moe->num_experts);
  std::fflush(stdout);  // before the first step, in a log too
  if (run.saved) {
    run.state = run.saved->state;
    const RunState& st = run.state;
    std::printf("resuming from its checkpoint: SFT step %lld of %lld, GRPO step %lld of %lld\n",
                (long long)st.sft_step, (long long)config.sft.steps, (long long)st.step,
                (long long)config.run.steps);
    std::fflush(stdout);
  }
  if (comm.is_main() && !config_toml.empty())
    write_file_atomically((run.out_dir / "config.toml").string(), config_toml);
  {
    const MemoryPurpose purpose = model_memory();
    run.policy = std::make_unique<Policy>(
        run.setup, initial_parameters(run.setup, run.saved ? run.saved->model : fs::path()));
  }
  int64_t max_prompt = 1;
  for (const Problem& p : run.setup.test.head(config.run.eval_problems))
    max_prompt = std::max<int64_t>(max_prompt, int64_t(run.setup.prompt_tokens(p).size()));
  if (!run.setup.train.endless())
    for (int64_t i = 0; i < run.setup.train.size(); ++i)
      max_prompt = std::max<int64_t>(max_prompt, int64_t(run.setup.prompt_tokens(run.setup.train[i]).size()));
  else
    max_prompt = std::max<int64_t>(max_prompt, 32);
  {
    const MemoryPurpose purpose = kv_cache_memory(config);
    run.engine = std::make_unique<Engine>(run.policy->rollout(), engine_options(run.setup, max_prompt, comm.size()),
                                          run.setup.tokenizer.get());
  }
  run.evaluator = std::make_unique<Evaluator>(run.setup, *run.engine, comm);
  return run;
}

// With the trainer's copies kept by rows (optim.shard_weights), the step writes those itself: the
// copies named here are the whole ones still kept (a separate rollout model's).
AdamW::CopiesOf copies_of(Run& run) {
  return [&run](const std::string& name) {
    WeightCopies c = run.policy->copies(name);
    if (run.sharded_weights && run.sharded_weights->holds(name)) {
      const WeightCopies trainer = run.policy->trainer().weight_copies(name);
      if (c.bf16 == trainer.bf16) c.bf16 = nullptr;
      if (c.fp8 == trainer.fp8) c.fp8 = nullptr;
    }
    return c;
  };
}

// Bytes of the weight copies the GEMMs read that this rank holds now: the models' (a separate
// rollout model shares the trainer's embedding and LM head) and the row copies.
int64_t weight_copy_bytes(Run& run) {
  Transformer& trainer = run.policy->trainer();
  int64_t bytes = trainer.weight_copy_bytes();
  if (&run.policy->rollout() != &trainer) bytes += run.policy->rollout().weight_copy_bytes(false);
  if (run.sharded_weights) bytes += run.sharded_weights->row_copy_bytes();
  return bytes;
}

// The trainer's whole weight copies for generation (the rollout, an evaluation) when they are kept
// by rows (optim.shard_weights) and the trainer rolls out: one all-gather at the start of the scope
// (the weight hand-over; its time added to `handover_seconds` when given), freed at its end.
class WholeWeights {
 public:
  explicit WholeWeights(Run& run, double* handover_seconds = nullptr) : run_(run) {
    if (!run.sharded_weights || &run.policy->rollout() != &run.policy->trainer()) return;
    const auto t0 = Clock::now();
    run.sharded_weights->gather_all();
    run.engine->weights_moved();  // fresh buffers: the decode graphs hold the old pointers
    if (handover_seconds) *handover_seconds += device_seconds_since(t0);
    gathered_ = true;
  }
  ~WholeWeights() {
    if (gathered_) run_.sharded_weights->drop_all();
  }
  WholeWeights(const WholeWeights&) = delete;
  WholeWeights& operator=(const WholeWeights&) = delete;

 private:
  Run& run_;
  bool gathered_ = false;
};

// The whole fp32 masters on every rank: the model's own, or (a collective) gathered from a sharded
// optimizer's rows when the model released them.
ModelParameters full_masters(Run& run) {
  Transformer& model = run.policy->trainer();
  if (!model.masters_released()) return model.params();
  ModelParameters full = ModelParameters::zeros(run.setup.model_config, run.setup.device);
  run.optimizer->gather_masters(full);
  return full;
}

// A fresh optimizer for a phase from the whole masters (resuming: with the checkpoint's moments);
// when it holds the masters, the models release theirs.
void start_optimizer(Run& run, const OptimizerConfig& config, bool resume) {
  const MemoryPurpose purpose = model_memory();
  if (run.sharded_weights) {  // the model's whole copies back, for the next optimizer's rows
    run.sharded_weights->gather_all();
    run.sharded_weights.reset();
  }
  const ModelParameters masters = full_masters(run);
  // Expert parallelism (several ranks): the trainer runs this rank's experts on every rank's rows,
  // and the optimizer owns them whole.
  const bool expert_parallel = run.setup.config.optim.expert_parallel && run.comm->size() > 1;
  if (expert_parallel) run.policy->trainer().set_expert_parallel(expert_parallel_over(*run.comm));
  run.optimizer = make_data_parallel_optimizer(masters, config, *run.comm, run.setup.config.optim.shard_state,
                                               expert_parallel);
  if (resume && is_sharded_checkpoint(run.saved->model))
    load_sharded_optimizer(run.saved->model, masters, *run.optimizer, run.state.optimizer_steps);
  else if (resume)
    load_optimizer(run.out_dir, masters, *run.optimizer, run.state.optimizer_steps);
  if (run.optimizer->holds_masters()) run.policy->release_masters();
  if (auto* sharded = dynamic_cast<ShardedAdamW*>(run.optimizer.get());
      sharded && run.comm->size() > 1 && run.setup.config.optim.reduce_per_layer)
    run.layerwise = std::make_unique<LayerwiseReduce>(run.policy->trainer(), *sharded);
  if (auto* sharded = dynamic_cast<ShardedAdamW*>(run.optimizer.get());
      sharded && run.comm->size() > 1 && run.setup.config.optim.shard_weights)
    run.sharded_weights = std::make_unique<ShardedWeights>(run.policy->trainer(), *sharded);
}

// With the masters sharded over several ranks each rank writes its rows (rl/sharded_checkpoint.h);
// else rank 0 writes the whole masters and moments (a sharded optimizer's gathered first).
// run.checkpoint_every = -1 writes nothing (timing runs of large models).
void save(Run& run) {
  if (run.setup.config.run.checkpoint_every < 0) return;
  const auto* sharded = dynamic_cast<const ShardedAdamW*>(run.optimizer.get());
  if (sharded && run.comm->size() > 1) {
    save_sharded_checkpoint(run.out_dir, run.setup.model_config, *run.comm, *sharded, run.state,
                            run.setup.tokenizer_dir);
    return;
  }
  const ModelParameters params = full_masters(run);
  const DataParallelOptimizer::Moments moments = run.optimizer->full_moments(params);
  if (!run.comm->is_main()) return;
  save_checkpoint(run.out_dir, run.setup.model_config, params, moments, run.state,
                  run.setup.tokenizer_dir);
}

// Why an SFT step's update was skipped, or empty.
std::string check_finite(double loss, const OptimizerStep& step) {
  if (!std::isfinite(loss)) return "loss";
  if (!step.applied) return "gradient of " + step.nonfinite_grad;
  return "";
}

// ---- SFT ------------------------------------------------------------------------------------

Metrics sft_step(Run& run, int64_t step) {
  const Setup& s = run.setup;
  const SftOptions& o = s.config.sft;
  PackedRows rows;
  // This rank's share of the batch; the loss is normalized by the tokens of the whole batch.
  const Communicator& comm = *run.comm;
  const int64_t first = o.batch_size * comm.rank() / comm.size();
  const int64_t last = o.batch_size * (comm.rank() + 1) / comm.size();
  for (int64_t i = first; i < last; ++i) {
    const Problem p = s.train.draw(uint64_t(s.config.run.seed), step * o.batch_size + i);
    rows.add(s.prompt_tokens(p), s.tokenizer->encode(s.sft_target(p), false), {});
  }
  Transformer& model = run.policy->trainer();
  const double tokens = sum_over_ranks(*run.comm, std::accumulate(rows.mask.begin(), rows.mask.end(), 0.0));
  double loss = 0;
  const std::vector<SequenceRange> micro_batches = plan_micro_batches(rows.lengths, s.config.optim.micro_batch_tokens);
  // The ranks agree on the number of passes first (each reduces gradients, or gathers weights,
  // layer by layer): one with fewer micro-batches makes up for the others' after its own.
  const double passes = model.has_pass_hooks() ? max_over_ranks(*run.comm, double(micro_batches.size())) : 0;
  for (const SequenceRange& r : micro_batches) {
    size_t offset = 0;
    const TrainBatch b = slice_batch(rows, r.first, r.last, model.config().vocab_size, model.device(), offset);
    TrainForward f = model.forward(b);
    const std::vector<float> lp = host_floats(f.logprob);
    Tensor dlogprob = Tensor::empty({int64_t(lp.size())}, DType::f32);
    for (size_t t = 0; t < lp.size(); ++t) {
      const float m = rows.mask[offset + t];
      loss -= m * double(lp[t]) / tokens;
      dlogprob.data_as<float>()[t] = -m / float(tokens);
    }
    model.backward(f, dlogprob.to(model.device()), Tensor());
  }
  for (double k = double(micro_batches.size()); k < passes; ++k) {
    model.skip_forward();
    model.skip_backward();
  }
  loss = sum_over_ranks(*run.comm, loss);
  // A non-finite loss never reaches the optimizer (weights, moments, step count and schedule
  // stay); AdamW itself skips a non-finite gradient.
  OptimizerStep opt;
  opt.grad_norm = NAN;
  if (std::isfinite(loss)) {
    opt = run.optimizer->step(model.params(), model.grads(), copies_of(run));
  } else {
    model.grads().zero();
    if (run.layerwise) run.layerwise->discard();
  }
  const std::string skipped = check_finite(loss, opt);
  return {{"loss", loss}, {"lr", opt.applied ? opt.lr : NAN}, {"grad_norm", opt.grad_norm},
          {"skipped", skipped.empty() ? 0.0 : 1.0}};
}

// ---- GRPO -----------------------------------------------------------------------------------

// The weight hand-over: the copies the rollout reads (rl/setup.h Policy::copies) are written by the
// optimizer step, so its time is part of `update`; `handover` is the share of it a sharded
// optimizer spends gathering the updated weights (0 with replicated masters, whose update pass
// writes the copies in place). With the copies sharded too (optim.shard_weights) the step writes
// rows only, and `handover` is the all-gather of the whole copies before the rollout instead.
struct StepTimes {
  double rollout = 0, scoring = 0, recompute = 0, update = 0, handover = 0;
};

// The problems of rollout batch `draw` of step `step`: draw 0 is the run's stream (problems
// step·B .. step·B + B − 1); dynamic sampling's further draws k ≥ 1 walk streams of their own,
// offset by k·2^40 (a fresh shuffle of a dataset, further synthetic problems), so that a resumed
// run draws the same problems without keeping any state.
int64_t problem_index(int64_t step, int64_t draw, int64_t b, int64_t i) {
  return (draw << 40) + step * b + i;
}

// `series` gets the step's list-valued metrics (the mismatch by response position).
Metrics grpo_step(Run& run, Transformer* reference, int64_t step, const TrainHooks& hooks,
                  StepTimes& times, std::string& skipped, MetricSeries& series) {
  const Setup& s = run.setup;
  const RolloutOptions& ro = s.config.rollout;
  const LossOptions& lo = s.config.loss;
  const int64_t g = ro.samples_per_prompt, b = ro.prompts_per_step;
  // This rank's prompts: [mine, mine + b / N) of the batch (check_data_parallel: N divides b).
  Communicator& comm = *run.comm;
  const int64_t share = b / comm.size(), mine = share * comm.rank();

  // 1. rollout, 2. scoring (with dynamic sampling: more batches until B groups differ)
  double samples_drawn = 0, reward_sum = 0, correct = 0, found = 0, response_tokens = 0, overlong = 0;
  const auto draw = [&](int64_t draw) {
    auto t0 = Clock::now();
    std::vector<Problem> problems;
    std::vector<GenerationRequest> requests;
    for (int64_t i = mine; i < mine + share; ++i) {
      problems.push_back(s.train.draw(uint64_t(s.config.run.seed), problem_index(step, draw, b, i)));
      GenerationRequest r;
      r.prompt = s.prompt_tokens(problems.back());
      r.sampling.n = g;
      r.sampling.temperature = float(ro.temperature);
      r.sampling.top_p = float(ro.top_p);
      r.sampling.top_k = ro.top_k;
      r.sampling.max_new_tokens = ro.max_new_tokens;
      r.sampling.stop_token_ids = s.stop_token_ids;
      r.sampling.stop_strings = ro.stop;
      r.sampling.seed = uint64_t(s.config.run.seed) * 1000003u + uint64_t(step) * 65537u +
                        uint64_t(i) + (uint64_t(draw) << 32);
      requests.push_back(std::move(r));
    }
    std::vector<std::vector<GeneratedSample>> samples;
    {
      const MemoryPurpose purpose = rollout_memory();
      samples = run.engine->generate(requests);
    }
    times.rollout += device_seconds_since(t0);
    t0 = Clock::now();
    std::vector<ScoredGroup> groups(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      groups[i].prompt = requests[i].prompt;
      for (const GeneratedSample& sample : samples[i]) {
        const std::string text = s.tokenizer->decode(sample.tokens, /*skip_special_tokens=*/true);
        const double correctness = answer_reward(text, problems[i].answer);
        const double penalty = lo.overlong_buffer > 0
            ? overlong_penalty(int64_t(sample.tokens.size()), ro.max_new_tokens, lo.overlong_buffer,
                               lo.overlong_penalty)
            : 0.0;
        groups[i].rewards.push_back(float(correctness + penalty));
        samples_drawn += 1;
        reward_sum += correctness + penalty;
        correct += correctness == 1.0 ? 1 : 0;
        found += answer_found(text) ? 1 : 0;
        response_tokens += double(sample.tokens.size());
        overlong += penalty < 0 ? 1 : 0;
      }
      groups[i].samples = std::move(samples[i]);
    }
    times.scoring += device_seconds_since(t0);
    return groups;
  };
  const CollectedGroups collected = [&] {
    const WholeWeights whole(run, &times.handover);
    return collect_groups(b, lo.dynamic_sampling ? lo.dynamic_sampling_max_draws : 1,
                          lo.dynamic_sampling, draw);
  }();

  // The whole batch's sums (every rank's samples).
  const std::vector<double> sums = sum_over_ranks(
      comm, {samples_drawn, reward_sum, correct, found, response_tokens, overlong,
             double(collected.kept.size())});
  const double n = sums[0];
  Metrics m = {{"reward_mean", sums[1] / n},
               {"accuracy", sums[2] / n},
               {"answer_found", sums[3] / n},
               {"response_length", sums[4] / n},
               {"groups_kept", sums[6]},
               {"rollout_batches", double(collected.draws)}};
  if (lo.overlong_buffer > 0) m.emplace_back("overlong_frac", sums[5] / n);

  // 3.-5. advantages, old logprobs, PPO update
  const OptimizerStepFn optimizer_step = [&](ModelParameters& params, ModelParameters& grads) {
    if (hooks.before_optimizer_step) hooks.before_optimizer_step(grads);
    const OptimizerStep step = run.optimizer->step(params, grads, copies_of(run));
    times.handover += step.handover_seconds;
    return step;
  };
  const MemoryPurpose purpose = training_memory(s.config);
  // Reused rollout logprobs are checked against a recompute at the first step and every
  // rollout.exact_check_every-th after it.
  const bool check = lo.reuse_rollout_logprobs && ro.exact_check_every > 0 && step % ro.exact_check_every == 0;
  const GrpoUpdate u =
      grpo_update(collected.kept, s.config, run.policy->trainer(), reference, optimizer_step, comm,
                  run.layerwise.get(), check);
  times.recompute = u.recompute_seconds;
  times.update = u.update_seconds;
  skipped = u.skipped;
  series = u.series;
  m.insert(m.end(), u.metrics.begin(), u.metrics.end());
  return m;
}

// Whether step `step` of `total` gets a line that stays: at every evaluation and the last step,
// and every run.log_every steps (0: when no evaluation comes, every twentieth of the phase).
bool shows_line(const RunOptions& r, int64_t step, int64_t total, bool evaluated) {
  if (evaluated || step == total) return true;
  if (r.log_every > 0) return step % r.log_every == 0;
  return r.eval_every == 0 && step % std::max<int64_t>(1, total / 20) == 0;
}

std::vector<std::string> eval_fields(const Metrics& m) {
  return {metric_field("eval greedy", metric(m, "eval_accuracy_greedy")),
          metric_field("sampled", metric(m, "eval_accuracy_sampled"))};
}

std::vector<std::string> sft_fields(const Metrics& m) {
  std::vector<std::string> f = {metric_field("loss", metric(m, "loss"))};
  for (std::string& e : eval_fields(m)) f.push_back(std::move(e));
  f.push_back(metric_field("grad norm", metric(m, "grad_norm")));
  return f;
}

std::vector<std::string> grpo_fields(const Metrics& m) {
  std::vector<std::string> f = {metric_field("reward", metric(m, "reward_mean"))};
  for (std::string& e : eval_fields(m)) f.push_back(std::move(e));
  for (auto [label, key] : {std::pair{"len", "response_length"}, {"entropy", "entropy"},
                            {"mismatch", "mismatch_abs"}, {"differ", "mismatch_tokens_differ"},
                            {"tok/s", "tokens_per_s"}})
    f.push_back(metric_field(label, metric(m, key)));
  return f;
}

void add_eval(Run& run, Metrics& m, Progress& progress, int64_t done) {
  progress.update(done, {"evaluating " + std::to_string(run.evaluator->count(run.setup.config.run.eval_problems)) +
                         " problems"},
                  /*now=*/true);
  const WholeWeights whole(run);
  const EvalResult e = run.evaluator->evaluate(run.setup.config.run.eval_problems);
  m.emplace_back("eval_accuracy_greedy", e.greedy);
  m.emplace_back("eval_accuracy_sampled", e.sampled);
}

// Every rank stops when one was interrupted (each checks at the same step).
bool should_stop(Communicator& comm, const TrainHooks& hooks, int64_t step) {
  return any_rank(comm, g_interrupted) || (hooks.stop_after && hooks.stop_after(step));
}

// The SFT phase; returns false when interrupted (a checkpoint was written).
bool sft_phase(Run& run, const TrainHooks& hooks, TrainSummary& summary) {
  const Config& c = run.setup.config;
  if (run.state.sft_step >= c.sft.steps) return true;
  OptimOptions o = c.optim;
  o.lr = c.sft.lr;
  o.warmup_steps = c.sft.warmup_steps;
  o.schedule = "constant";
  start_optimizer(run, optimizer_config(o, c.sft.steps), run.saved && run.state.sft_step > 0);
  std::optional<MetricsLog> log;
  if (run.comm->is_main()) log.emplace(run.out_dir / "sft_metrics.jsonl", run.state.sft_step);
  Progress progress("sft", c.sft.steps, run.state.sft_step);
  while (run.state.sft_step < c.sft.steps) {
    const auto t0 = Clock::now();
    Metrics m;
    {
      const MemoryPurpose purpose = training_memory(c);
      m = sft_step(run, run.state.sft_step);
    }
    ++run.state.sft_step;
    run.state.optimizer_steps = run.optimizer->steps();
    m.emplace_back("time_step", max_over_ranks(*run.comm, device_seconds_since(t0)));
    const bool last = run.state.sft_step == c.sft.steps;
    const bool evaluated = last || (c.run.eval_every > 0 && run.state.sft_step % c.run.eval_every == 0);
    if (evaluated) add_eval(run, m, progress, run.state.sft_step);
    if (last) summary.sft_accuracy = metric(m, "eval_accuracy_greedy");
    if (log) log->write(run.state.sft_step, m);
    if (hooks.after_step) hooks.after_step(-run.state.sft_step, full_masters(run));
    progress.update(run.state.sft_step, {metric_field("loss", metric(m, "loss"))});
    if (shows_line(c.run, run.state.sft_step, c.sft.steps, evaluated))
      progress.line(run.state.sft_step, sft_fields(m));
    if (!last && should_stop(*run.comm, hooks, -run.state.sft_step)) {
      save(run);
      summary.interrupted = true;
      return false;
    }
  }
  run.state.optimizer_steps = 0;  // the GRPO optimizer starts afresh
  return true;
}

// A resumed run whose checkpoint is past every step asked for: nothing to do.
bool already_complete(const Run& run, TrainSummary& summary) {
  const Config& c = run.setup.config;
  if (!run.saved || run.state.sft_step < c.sft.steps || run.state.step < c.run.steps) return false;
  summary.already_complete = true;
  const fs::path log = run.out_dir / (c.run.steps > 0 ? "metrics.jsonl" : "sft_metrics.jsonl");
  summary.final_accuracy = last_logged(log, "eval_accuracy_greedy");
  return true;
}

// The GPU memory of the step, the largest over the ranks (GB): the tensors' high-water mark
// (model, optimizer state, KV cache, activations) and what the device has in use at the end (the
// pool's cached blocks, CUDA graphs' arenas, library workspaces and NCCL's buffers too).
void add_gpu_memory(Communicator& comm, Metrics& m) {
  const DeviceMemoryStats stats = device_memory_stats();
  m.emplace_back("gpu_memory_peak_gb", max_over_ranks(comm, double(stats.peak) * 1e-9));
  m.emplace_back("gpu_memory_used_gb", max_over_ranks(comm, double(stats.total - stats.free) * 1e-9));
}

}  // namespace

void check_data_parallel(const Config& config, int ranks) {
  if (ranks == 1) return;
  const int64_t b = config.rollout.prompts_per_step;
  LOCKSTEP_CHECK(b % ranks == 0, "rollout.prompts_per_step = ", b, " does not divide among ", ranks,
                 " ranks: each rank generates an equal share of the prompts (a prompt's samples on "
                 "one rank); choose a multiple of ", ranks);
  LOCKSTEP_CHECK(!config.loss.dynamic_sampling, "loss.dynamic_sampling is not supported with several "
                 "ranks yet (", ranks, " ranks): run it on one");
  LOCKSTEP_CHECK(!config.optim.shard_weights || config.optim.shard_state, "optim.shard_weights = true "
                 "needs optim.shard_state = true (the weight copies are sharded as the fp32 masters are)");
  LOCKSTEP_CHECK(!config.optim.expert_parallel || config.optim.shard_state, "optim.expert_parallel = true "
                 "needs optim.shard_state = true (each expert's masters, moments and gradient live on its rank)");
}

TrainSummary run_train(const Config& config, const TrainHooks& hooks, Communicator& comm,
                       const std::string& config_toml) {
  SigintGuard sigint;
  Run run = start_run(config, "train", comm, config_toml);
  TrainSummary summary{NAN, NAN, false};
  if (already_complete(run, summary)) return summary;
  if (!sft_phase(run, hooks, summary)) return summary;
  // The SFT model, before RL, when SFT ran here (a run resumed after SFT has that checkpoint).
  if (run.optimizer && run.state.step == 0) save(run);

  const Config& c = run.setup.config;
  const int64_t optimizer_steps = c.run.steps * c.optim.ppo_epochs * c.optim.mini_batches;
  start_optimizer(run, optimizer_config(c.optim, optimizer_steps), run.saved && run.state.step > 0);
  // A frozen reference for the KL penalty: the weights the RL phase starts from.
  std::unique_ptr<Transformer> reference;
  if (c.loss.kl_coef > 0) {
    LOCKSTEP_CHECK(run.state.step == 0, "loss.kl_coef > 0: resuming after RL steps is not "
                   "supported (the reference weights are not in the checkpoint)");
    reference = std::make_unique<Transformer>(
        run.setup.model_config, full_masters(run).copy_to(run.setup.device),
        run.policy->trainer().recipe(),
        TransformerOptions{.trainable = false, .fp8_kv_cache = c.model.kv_cache == "fp8"});
  }
  std::optional<MetricsLog> log;
  if (comm.is_main()) log.emplace(run.out_dir / "metrics.jsonl", run.state.step);
  Progress progress("grpo", c.run.steps, run.state.step);
  if (run.state.step == 0 && c.run.eval_every > 0 && c.run.steps > 0) {
    Metrics m;
    add_eval(run, m, progress, 0);
    if (log) log->write(0, m);
    progress.line(0, grpo_fields(m));
  }
  while (run.state.step < c.run.steps) {
    const auto t0 = Clock::now();
    const double collectives0 = comm.collective_seconds();
    if (run.setup.device == Device::cuda) reset_peak_device_memory();
    StepTimes times;
    std::string skipped;
    MetricSeries series;
    Metrics m = grpo_step(run, reference.get(), run.state.step, hooks, times, skipped, series);
    ++run.state.step;
    run.state.optimizer_steps = run.optimizer->steps();
    // The step takes as long as its slowest rank; so does each phase.
    const double total = max_over_ranks(comm, device_seconds_since(t0));
    times.rollout = max_over_ranks(comm, times.rollout);
    times.scoring = max_over_ranks(comm, times.scoring);
    times.recompute = max_over_ranks(comm, times.recompute);
    times.update = max_over_ranks(comm, times.update);
    times.handover = max_over_ranks(comm, times.handover);
    const double collectives = max_over_ranks(comm, comm.collective_seconds() - collectives0);
    for (auto [name, value] : std::initializer_list<std::pair<const char*, double>>{
             {"time_rollout", times.rollout}, {"time_scoring", times.scoring},
             {"time_recompute", times.recompute}, {"time_update", times.update},
             {"time_handover", times.handover}, {"time_collectives", collectives},
             {"time_step", total},
             {"tokens_per_s", metric(m, "response_length") * double(c.rollout.prompts_per_step * c.rollout.samples_per_prompt) * metric(m, "rollout_batches") / total}})
      m.emplace_back(name, value);
    if (run.setup.device == Device::cuda) add_gpu_memory(comm, m);
    m.emplace_back("weight_copies_gb", max_over_ranks(comm, double(weight_copy_bytes(run)) * 1e-9));
    run.state.consecutive_skips = skipped.empty() ? 0 : run.state.consecutive_skips + 1;
    m.emplace_back("skipped", skipped.empty() ? 0.0 : 1.0);
    const bool last = run.state.step == c.run.steps;
    const bool evaluated = last || (c.run.eval_every > 0 && run.state.step % c.run.eval_every == 0);
    if (evaluated) add_eval(run, m, progress, run.state.step);
    if (last) summary.final_accuracy = metric(m, "eval_accuracy_greedy");
    if (log) log->write(run.state.step, m, series);
    if (hooks.after_step) hooks.after_step(run.state.step, full_masters(run));
    if (!skipped.empty())
      progress.line(run.state.step, {"step skipped: non-finite " + skipped});
    progress.update(run.state.step, {metric_field("reward", metric(m, "reward_mean"))});
    if (shows_line(c.run, run.state.step, c.run.steps, evaluated))
      progress.line(run.state.step, grpo_fields(m));
    LOCKSTEP_CHECK(run.state.consecutive_skips <= c.run.max_skipped_steps, "stopping: ",
                   run.state.consecutive_skips, " consecutive steps were skipped for non-finite values (last: ",
                   skipped, "); see ", (run.out_dir / "metrics.jsonl").string());
    if (last || (c.run.checkpoint_every > 0 && run.state.step % c.run.checkpoint_every == 0)) save(run);
    if (!last && should_stop(comm, hooks, run.state.step)) {
      save(run);
      summary.interrupted = true;
      return summary;
    }
  }
  return summary;
}

TrainSummary run_sft(const Config& config, const TrainHooks& hooks, Communicator& comm,
                     const std::string& config_toml) {
  Config c = config;
  c.run.steps = 0;
  SigintGuard sigint;
  Run run = start_run(c, "sft", comm, config_toml);
  TrainSummary summary{NAN, NAN, false};
  if (already_complete(run, summary)) return summary;
  if (!sft_phase(run, hooks, summary)) return summary;
  save(run);
  summary.final_accuracy = summary.sft_accuracy;
  return summary;
}

}  // namespace lockstep
