// rl/setup.h — what every subcommand builds from the run configuration (rl/run_config.h): the device,
// the model (the builtin tiny model or a Hugging Face checkpoint), the tokenizer, the problems and
// how a problem becomes prompt tokens, and the policy in the run's precision mode.
//
// Precision modes (docs/architecture.md): `bf16` and `fp8` train and roll out with one Transformer (the rollout
// reads the very weight copies the optimizer step refreshed); `fp8-rollout` trains in bf16 and rolls
// out with a second Transformer over the same fp32 masters whose fp8 weights are re-quantized at
// each hand-over — the popular, off-policy baseline kept for comparison.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rl/run_config.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "tasks/dataset.h"
#include "tasks/synthetic.h"
#include "tasks/word_problems.h"

namespace lockstep {

// A dataset, or a generated task, the synthetic arithmetic or the word problems (problems made on
// demand: an endless supply).
class Problems {
 public:
  static Problems loaded(std::vector<Problem> problems);
  static Problems synthetic(uint64_t seed, int level, SyntheticSplit split);
  static Problems word_problems(uint64_t seed, int max_steps, SyntheticSplit split);

  bool endless() const { return synthetic_.has_value(); }
  int64_t size() const;  // endless: INT64_MAX
  const Problem& operator[](int64_t i) const;  // loaded only
  // Problem `i` of a run's stream: the generated task's i-th, or the dataset walked in a fresh
  // seeded shuffle each epoch.
  Problem draw(uint64_t seed, int64_t i) const;
  // The first `n` problems (the whole set when n is 0 or larger) for evaluation.
  std::vector<Problem> head(int64_t n) const;

 private:
  std::vector<Problem> problems_;
  struct Synthetic {
    enum class Task { arithmetic, word_problems } task;
    uint64_t seed;
    int level;  // the arithmetic's level, or the word problems' max_steps
    SyntheticSplit split;
  };
  std::optional<Synthetic> synthetic_;
};

struct Setup {
  Config config;
  Device device = Device::cpu;
  ModelConfig model_config;
  std::filesystem::path tokenizer_dir;  // copied into checkpoints
  std::unique_ptr<Tokenizer> tokenizer;
  // The checkpoint's own chat template when data.chat_template is "auto" (and it has one) or "model".
  std::shared_ptr<const ChatTemplate> chat_template;
  std::vector<int32_t> stop_token_ids;  // end of a response
  Problems train, test;

  // The prompt of a problem: the chat template's render of [system prompt,] user message with the
  // generation prompt (ids with add_special_tokens=false), or the plain text (with the tokenizer's
  // special tokens, for a Hugging Face checkpoint) when there is no template.
  std::vector<int32_t> prompt_tokens(const Problem& problem) const;
  // The SFT target text of a problem: its worked solution (word problems) or the answer, then the
  // end token.
  std::string sft_target(const Problem& problem) const;
};

// Checks and resolves the config (device, model config, tokenizer, data). `need_data`: load the
// train/test sets (not for `generate`). Writes the builtin model's tokenizer under run.out_dir.
Setup make_setup(const Config& config, bool need_data);

// The fp32 masters to start from: a checkpoint's, the Hugging Face checkpoint's, or the builtin
// model's seeded initialization; on the setup's device.
ModelParameters initial_parameters(const Setup& setup, const std::filesystem::path& checkpoint_model);

class Policy {
 public:
  Policy(const Setup& setup, ModelParameters params);
  Transformer& trainer() { return *train_; }
  Transformer& rollout() { return rollout_ ? *rollout_ : *train_; }
  // The weight copies an optimizer step writes with the master `name`: the trainer's, and the
  // rollout model's fp8 copy when separate (the hand-over happens inside the update pass).
  WeightCopies copies(const std::string& name);
  // Both models drop the fp32 masters their GEMMs do not read: a sharded optimizer holds them and
  // writes every copy (Transformer::release_masters).
  void release_masters();

 private:
  std::unique_ptr<Transformer> train_, rollout_;
};

}  // namespace lockstep
