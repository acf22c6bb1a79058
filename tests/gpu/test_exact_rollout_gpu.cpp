// The exact rollout mode on the GPU: with the batch-invariant forward kernels (the exact mode's op
// settings), the rollout's rows equal the training forward's at every op and every generated token's
// logprob equals the training forward's, bit for bit, as on the CPU (tests/rollout/
// test_forward_comparison.cpp) — for random mixes of batch sizes, prompt lengths and prefill chunk
// sizes, a cache small enough to preempt, bf16 and fp8, with the bf16 and the e4m3 KV cache, with and without CUDA graphs
// (rollout/forward_comparison.h). Models: the GPU tests' tiny Qwen3 (head_dim 128, GQA 2) and
// SmolLM2-135M's layer shapes (partial fp8 blocks, GQA 3), random weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "tests/test_util.h"
#include "ops/forward_kernels.h"
#include "rollout/forward_comparison.h"
#include "tests/model/model_test_util.h"

namespace lockstep {
namespace {

using testing::gpu_partial_blocks_config;
using testing::gpu_tiny_config;
using testing::random_parameters;
using testing::random_sequences;

struct Case {
  std::string name;
  ModelConfig config;
  Recipe recipe;
  bool fp8_kv_cache;
};

std::vector<Case> cases() {
  std::vector<Case> list;
  for (const auto& [name, config] : {std::pair{std::string("tiny"), gpu_tiny_config()},
                                     std::pair{std::string("smollm2_shapes"), gpu_partial_blocks_config()}})
    for (const Recipe recipe : {Recipe::bf16, Recipe::fp8})
      for (const bool kv8 : {false, true})
        list.push_back({name + (recipe == Recipe::fp8 ? "_fp8" : "_bf16") + (kv8 ? "_kv8" : ""), config, recipe, kv8});
  return list;
}

class ExactRolloutGpu : public ::testing::TestWithParam<Case> {};

TEST_P(ExactRolloutGpu, EveryOpAndLogprobBitIdenticalForRandomMixes) {
  LOCKSTEP_REQUIRE_GPU();
  const Case& c = GetParam();
  const ExactForwardScope exact;
  Transformer model(c.config, random_parameters(c.config, 5).copy_to(Device::cuda), c.recipe,
                    {.fp8_kv_cache = c.fp8_kv_cache});
  std::mt19937_64 rng(11);
  // Batch sizes, prompt lengths and step budgets (prefill chunks end inside prompts, decode steps
  // share steps with later prompts' chunks at the smaller budgets).
  // The last mix has a cache of 40 blocks of 16 tokens, too small for its 24 sequences at once: the
  // engine preempts and recomputes some (their generated tokens so far as prefill rows).
  struct Mix {
    int batch;
    int64_t step_tokens, cache_blocks = 0;
  };
  const std::vector<Mix> mixes = {{1, 2048}, {5, 16}, {33, 64}, {12, 4096}, {24, 256, 40}};
  for (const auto& [batch, step_tokens, cache_blocks] : mixes) {
    std::uniform_int_distribution<int> length(3, 150);
    std::vector<int> lengths;
    for (int i = 0; i < batch; ++i) lengths.push_back(length(rng));
    const auto prompts = random_sequences(lengths, c.config.vocab_size, rng());
    const ForwardComparisonOptions options{.new_tokens = 12, .step_tokens = std::max<int64_t>(step_tokens, batch),
                                           .temperature = 1.0f, .seed = rng(), .tapped_sequences = 3,
                                           .train_tokens = 512, .cuda_graphs = true,
                                           .cache_blocks = cache_blocks};
    const ForwardComparison r = compare_rollout_forward(model, model, prompts, options);
    const std::string mix = "batch " + std::to_string(batch) + ", step budget " + std::to_string(step_tokens);
    for (const OpComparison& op : r.ops) {
      const std::string what = mix + ": layer " + std::to_string(op.layer) + " " + op.op + (op.decode ? " (generated)" : " (prompt)");
      EXPECT_EQ(op.rows_equal, op.rows) << what;
      EXPECT_EQ(op.codes_differ, 0) << what;
      EXPECT_FALSE(op.forms_differ) << what;
    }
    if (cache_blocks > 0) EXPECT_GT(r.preemptions, 0) << mix << ": nothing was preempted";
    EXPECT_EQ(r.logprobs.tokens, int64_t(batch) * options.new_tokens) << mix;
    EXPECT_EQ(r.logprobs.not_equal, 0) << mix << ": mean |dlogp| " << r.logprobs.mean_abs_diff;
    ASSERT_TRUE(r.graphs_run) << mix;
    EXPECT_EQ(r.graph_logprobs.not_equal, 0) << mix << " (CUDA graphs)";
    EXPECT_EQ(r.graph_tokens_differ, 0) << mix << " (CUDA graphs)";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ExactRolloutGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace lockstep
