// rl/run_config.h — the settings of a run: one struct per section of the `lockstep` command's TOML
// configuration (cli/config.h reads, checks and writes them), with the defaults of the small
// default job (the builtin tiny model learning synthetic arithmetic on a few CPU cores). The RL
// loop (rl/train.h) runs from them.
//
// Enumerated settings (precision, device, format, chat_template, scale_rewards, aggregation,
// kl_estimator, schedule) are held as their validated strings; the code that uses one maps it to
// its enum. Floats are doubles so that cli/config.h's to_toml and load_config round-trip exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

struct ModelOptions {
  std::string path = "builtin";  // Hugging Face checkpoint folder, or "builtin"
  std::string precision = "fp8";  // "fp8" | "bf16" | "fp8-rollout"
  std::string device = "auto";    // "auto" | "cpu" | "cuda"
  std::string kv_cache = "bf16";  // "bf16" | "fp8" (TransformerOptions::fp8_kv_cache)
  bool recompute = false;
  bool dither_masters = false;  // model/parameters.h's dither_within_bf16_rounding on load
  bool routing_replay = false;  // sparse models: training replays the rollout's experts
  int64_t builtin_hidden = 128;
  int64_t builtin_layers = 2;
  bool operator==(const ModelOptions&) const = default;
};

struct DataOptions {
  std::string train = "synthetic";     // JSONL path, "synthetic" or "word-problems"
  std::string test = "synthetic";      // JSONL path, "synthetic" or "word-problems"
  std::string format = "auto";         // "auto" | "gsm8k" | "jsonl"
  bool skip_bad_lines = false;
  int64_t synthetic_level = 1;         // ≥ 1
  int64_t word_problem_steps = 2;      // 1..3: most operations of a "word-problems" problem
  // "auto" (the checkpoint's own template, else plain text) | "model" | "none" | "chatml" |
  // "qwen3-no-think" | "llama3"
  std::string chat_template = "auto";
  std::string system_prompt;
  bool enable_thinking = false;        // the template variable (Qwen3: false closes an empty thought)
  bool operator==(const DataOptions&) const = default;
};

struct RolloutOptions {
  int64_t prompts_per_step = 32;   // B
  int64_t samples_per_prompt = 8;  // G ≥ 2
  double temperature = 1.0;        // > 0
  double top_p = 1.0;              // (0, 1]
  int64_t top_k = 0;               // 0: off
  int64_t max_new_tokens = 6;
  std::vector<std::string> stop;
  double kv_cache_fraction = 0.5;  // (0, 1]
  int64_t block_size = 16;
  // The exact forward kernels (ops/forward_kernels.h): the rollout's logprobs are the training
  // forward's bit for bit, so the old-logprob recompute can be skipped (load_config makes exact
  // imply loss.reuse_rollout_logprobs unless that key is given).
  bool exact = false;
  // With reused rollout logprobs: the first step and every N-th after it recompute them anyway
  // and log how far they are (mismatch_abs, mismatch_tokens_differ); 0: never.
  int64_t exact_check_every = 10;
  bool operator==(const RolloutOptions&) const = default;
};

struct LossOptions {
  std::string scale_rewards = "group";     // "group" | "batch" | "none" (Dr.GRPO)
  double clip_low = 0.2;                   // [0, 1)
  double clip_high = 0.2;                  // ≥ 0
  double clip_ratio_c = 3.0;               // 0: off, else > 1
  // "token-mean" | "sequence-mean" | "sequence-mean-token-sum" | "token-sum-norm"
  std::string aggregation = "token-mean";
  double kl_coef = 0.0;                    // ≥ 0
  std::string kl_estimator = "k3";         // "k1" | "k3"
  double tis_cap = 0.0;                    // 0: off, else ≥ 1
  bool adaptive_clip = false;
  bool dynamic_sampling = false;
  int64_t dynamic_sampling_max_draws = 10;  // ≥ 1
  int64_t overlong_buffer = 0;              // 0: off
  double overlong_penalty = 1.0;            // ≥ 0
  bool reuse_rollout_logprobs = false;
  double router_aux_loss_coef = -1;         // sparse models; -1: the model's config.json
  double router_z_coef = 0;                 // sparse models: ST-MoE's router z-loss
  bool operator==(const LossOptions&) const = default;
};

struct OptimOptions {
  double lr = 2e-4;
  double min_lr = 0.0;               // ≤ lr
  std::string schedule = "constant";  // "constant" | "cosine"
  int64_t warmup_steps = 0;
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double max_grad_norm = 1.0;  // 0: no clipping
  int64_t ppo_epochs = 1;
  int64_t mini_batches = 1;
  int64_t micro_batch_tokens = 4096;
  // With several ranks: each keeps the AdamW moments of its own rows only (train/data_parallel.h).
  bool shard_state = true;
  bool reduce_per_layer = true;
  bool shard_weights = false;
  // Sparse models: rank r owns experts [r·E/N, (r+1)·E/N) whole; tokens reach them by all-to-all.
  bool expert_parallel = false;
  bool operator==(const OptimOptions&) const = default;
};

struct SftOptions {
  int64_t steps = 900;
  double lr = 2e-3;
  int64_t batch_size = 64;  // sequences
  int64_t warmup_steps = 50;
  bool operator==(const SftOptions&) const = default;
};

struct RunOptions {
  int64_t steps = 300;
  int64_t seed = 1;
  std::string out_dir = "runs/default";
  int64_t eval_every = 25;        // 0: off
  int64_t eval_problems = 256;     // 0: the whole test set
  int64_t checkpoint_every = 0;   // 0: only at the end; -1: never
  bool resume = false;
  int64_t max_skipped_steps = 3;  // consecutive non-finite steps before the run stops
  int64_t log_every = 0;  // 0: lines at evaluations (rl/console.h)
  int64_t mismatch_bin_tokens = 256;  // response positions per bin of mismatch_abs_by_position
  bool operator==(const RunOptions&) const = default;
};

struct GenerateOptions {
  std::string prompt;
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0: greedy
  int64_t n = 1;
  bool operator==(const GenerateOptions&) const = default;
};

struct ExportOptions {
  std::string out;              // empty: run.out_dir/export
  std::string format = "fp8";   // "fp8" (block-FP8, the fp8 recipe's E4M3 weights) | "bf16"
  bool operator==(const ExportOptions&) const = default;
};

struct Config {
  ModelOptions model;
  DataOptions data;
  RolloutOptions rollout;
  LossOptions loss;
  OptimOptions optim;
  SftOptions sft;
  RunOptions run;
  GenerateOptions generate;
  ExportOptions export_;  // [export]; `export` is a C++ keyword
  bool operator==(const Config&) const = default;
};

}  // namespace lockstep
