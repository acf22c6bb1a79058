// rl/train.h — the RL loop (`lockstep train`) and supervised fine-tuning (`lockstep sft`).
//
// `train`: when sft.steps > 0, SFT on the training problems first (the default job's warm start),
// then run.steps GRPO steps. One GRPO step:
//   1. rollout: B problems (Problems::draw of the run seed and the step) × G samples each, through
//      the rollout engine (rollout/engine.h) of the policy's rollout model;
//   2. scoring: reward 1 for a correct final answer (tasks/verifier.h), else 0;
//   2. scoring: reward 1 for a correct final answer (tasks/verifier.h), else 0, plus DAPO's
//      overlong penalty when loss.overlong_buffer > 0 (train/overlong_penalty.h); with dynamic
//      sampling, groups whose rewards are all equal are dropped and further batches of B prompts
//      are drawn until B groups differ, at most loss.dynamic_sampling_max_draws batches
//      (rl/dynamic_sampling.h; metrics groups_kept, rollout_batches);
//   3.-5. advantages, old-policy (and reference) logprobs, and ppo_epochs × mini_batches optimizer
//      steps over micro-batches (rl/grpo_update.h, train/policy_loss.h);
//   6. weight hand-over to the rollout model: inside the optimizer's update pass, which writes the
//      weight copies the rollout reads (rl/setup.h Policy::copies).
// A non-finite loss or gradient never reaches the weights: that optimizer step is not taken at all
// (weights, moments, step count and learning-rate schedule stay as they were) and the metrics say
// where the first non-finite value appeared; after run.max_skipped_steps consecutive steps with a
// skipped update the run stops with an error. Held-out evaluation (greedy and sampled pass@1) every
// run.eval_every steps and at the end. Checkpoints (rl/checkpoint.h) every run.checkpoint_every
// steps, at the end, and on SIGINT (then the run returns early); run.resume continues from the
// checkpoint in run.out_dir exactly, and says where it resumed; resuming a run whose checkpoint is
// past every step asked for runs nothing (TrainSummary::already_complete).
//
// Outputs in run.out_dir: metrics.jsonl (GRPO), sft_metrics.jsonl, config.toml, checkpoint/.
//
// Several ranks (`comm`, dist/world.h; data parallel with replicated weights, as PyTorch's DDP):
// every rank holds the whole model and optimizer state. A GRPO step's B prompts are split into
// contiguous shares of B / N (B must divide by N), a prompt's G samples all on one rank, each
// drawn with the seed of its place in the whole batch; rewards are scored where they were drawn,
// advantages and metrics are those of the whole batch, and the gradients are summed over the
// ranks before each optimizer step (rl/grpo_update.h), which every rank applies alike. SFT splits
// its batch the same way (the loss normalized by the global token count), evaluation splits the
// problems. Rank 0 alone writes run.out_dir (metrics, config, checkpoints); every rank reads a
// checkpoint to resume. The ranks stop together (SIGINT on any rank stops them all at the end of
// the step).
#pragma once

#include <cstdint>
#include <functional>

#include "rl/run_config.h"
#include "dist/single_rank.h"
#include "model/parameters.h"

namespace lockstep {

struct TrainHooks {
  // Called after each completed step (SFT steps count negative: -1, -2, ...); returning true stops
  // the run as SIGINT does (checkpoint, return). For tests.
  std::function<bool(int64_t step)> stop_after;
  // Called with this rank's accumulated gradients (before the sum over the ranks) before each
  // GRPO optimizer step (a test plants a non-finite value there).
  std::function<void(ModelParameters& grads)> before_optimizer_step;
  // Called with the whole fp32 masters after each completed step (numbered as stop_after's;
  // gathered on every rank from a sharded optimizer's rows). For tests.
  std::function<void(int64_t step, const ModelParameters& params)> after_step;
};

struct TrainSummary {
  double sft_accuracy = 0;    // greedy held-out accuracy after SFT (NaN without SFT)
  double final_accuracy = 0;  // greedy held-out accuracy at the end
  bool interrupted = false;
  // run.resume found a checkpoint past every step asked for: nothing ran. final_accuracy is then
  // the last greedy accuracy in the run's metrics log (NaN when it has none).
  bool already_complete = false;
};

// `config_toml`: the configuration as TOML (cli/config.h's to_toml), written to
// run.out_dir/config.toml by the main rank once the run has started (`lockstep plot` reads its
// bins there); empty: no file.
TrainSummary run_train(const Config& config, const TrainHooks& hooks = {},
                       Communicator& comm = single_rank(), const std::string& config_toml = {});
// SFT only (`lockstep sft`): sft.steps steps, then a checkpoint.
TrainSummary run_sft(const Config& config, const TrainHooks& hooks = {},
                     Communicator& comm = single_rank(), const std::string& config_toml = {});

// Whether `config` can run on `ranks` data-parallel ranks: an error saying what does not divide or
// is not supported yet (checked before launching, and by every rank).
void check_data_parallel(const Config& config, int ranks);

}  // namespace lockstep
