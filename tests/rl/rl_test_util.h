// Helpers of the tests of the GRPO loop (rl/train.h).
#pragma once

#include <filesystem>

#include "cli/config.h"

namespace lockstep::testing {

// Three GRPO steps of the one-layer builtin model on the CPU, no SFT, no evaluation between steps:
// 2 prompts × 2 samples of at most 3 tokens, writing under `out_dir`.
inline Config tiny_grpo_run(const std::filesystem::path& out_dir) {
  Config c;
  c.model.device = "cpu";
  c.model.builtin_layers = 1;
  c.sft.steps = 0;
  c.run.steps = 3;
  c.run.eval_every = 0;
  c.run.eval_problems = 4;
  c.run.out_dir = out_dir.string();
  c.rollout.prompts_per_step = 2;
  c.rollout.samples_per_prompt = 2;
  c.rollout.max_new_tokens = 3;
  return c;
}

}  // namespace lockstep::testing
