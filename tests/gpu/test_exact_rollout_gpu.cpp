// The exact rollout mode on the GPU: with the batch-invariant forward kernels (the exact mode's op
// settings), the rollout's rows equal the training forward's at every op and every generated token's
// logprob equals the training forward's, bit for bit, as on the CPU (tests/rollout/
// test_forward_comparison.cpp) — for random mixes of batch sizes, prompt lengths and prefill chunk
// sizes, a cache small enough to preempt, bf16 and fp8, with the bf16 and the e4m3 KV cache, with and without CUDA graphs
// (rollout/forward_comparison.h). Models: the GPU tests' tiny Qwen3 (head_dim 128, GQA 2),
// SmolLM2-135M's layer shapes (partial fp8 blocks, GQA 3) and a tiny Qwen3-MoE (top-2 of 8 experts
// in one of its two layers; hidden and Im 256, so that fp8 runs the grouped expert GEMMs, and its
// decode steps are captured), random weights. And a sparse model's routing as the engine records it
// from its decode graphs: the training forward's.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "tests/test_util.h"
#include "ops/forward_kernels.h"
#include "rollout/engine.h"
#include "rollout/forward_comparison.h"
#include "tests/model/model_test_util.h"

namespace lockstep {
namespace {

using testing::gpu_partial_blocks_config;
using testing::gpu_tiny_config;
using testing::random_parameters;
using testing::random_sequences;

ModelConfig gpu_moe_config() {
  return testing::tiny_config(ModelFamily::qwen3_moe, {.hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 128,
                                                       .intermediate = 512, .layers = 2, .vocab = 1000});
}

struct Case {
  std::string name;
  ModelConfig config;
  Recipe recipe;
  bool fp8_kv_cache;
};

std::vector<Case> cases() {
  std::vector<Case> list;
  for (const auto& [name, config] : {std::pair{std::string("tiny"), gpu_tiny_config()},
                                     std::pair{std::string("smollm2_shapes"), gpu_partial_blocks_config()},
                                     std::pair{std::string("moe"), gpu_moe_config()}})
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
    if (cache_blocks > 0) {
      EXPECT_GT(r.preemptions, 0) << mix << ": nothing was preempted";
    }
    EXPECT_EQ(r.logprobs.tokens, int64_t(batch) * options.new_tokens) << mix;
    EXPECT_EQ(r.logprobs.not_equal, 0) << mix << ": mean |dlogp| " << r.logprobs.mean_abs_diff;
    ASSERT_TRUE(r.graphs_run) << mix;
    EXPECT_EQ(r.graph_logprobs.not_equal, 0) << mix << " (CUDA graphs)";
    EXPECT_EQ(r.graph_tokens_differ, 0) << mix << " (CUDA graphs)";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ExactRolloutGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The fp8 sparse model's decode steps run from CUDA graphs (the grouped expert GEMMs read the
// routing's offsets on the device) and still record each token's experts: with the exact mode,
// those of the training forward of the whole sequence, for every generated and prompt token, shared
// prompts and preemption included (a cache of 24 blocks of 4 tokens for 6 sequences of up to 34).
TEST(MoeDecodeGraphGpu, RecordsTheTrainingForwardsRouting) {
  LOCKSTEP_REQUIRE_GPU();
  const ModelConfig config = gpu_moe_config();
  const ExactForwardScope exact;
  Transformer model(config, random_parameters(config, 5).copy_to(Device::cuda), Recipe::fp8);
  ASSERT_TRUE(model.decode_reads_nothing_back());
  for (int64_t blocks : {64, 24}) {
    SCOPED_TRACE("cache blocks " + std::to_string(blocks));
    Engine engine(model, {.num_blocks = blocks, .block_size = 4, .record_routing = true});
    std::vector<GenerationRequest> requests;
    for (const auto& prompt : random_sequences({7, 19}, config.vocab_size, 8)) {
      GenerationRequest q;
      q.prompt = prompt;
      q.sampling.n = 3;
      q.sampling.max_new_tokens = 15;
      q.sampling.seed = 9;
      requests.push_back(q);
    }
    const auto results = engine.generate(requests);
    EXPECT_GT(engine.stats().decode_steps, 0) << "no decode step ran from the decode graph";
    if (blocks == 24) {
      EXPECT_GT(engine.stats().preemptions, 0) << "nothing was preempted";
    }
    const int64_t k = config.moe->num_experts_per_tok;
    for (size_t r = 0; r < requests.size(); ++r)
      for (const GeneratedSample& s : results[r]) {
        testing::Sequences seq = {requests[r].prompt};
        seq[0].insert(seq[0].end(), s.tokens.begin(), s.tokens.end());
        const TrainBatch host = testing::pack(seq);
        const TrainForward f = model.forward({host.tokens.to(Device::cuda), host.targets.to(Device::cuda),
                                              host.cu_seqlens.to(Device::cuda)});
        const int64_t n = int64_t(seq[0].size());
        ASSERT_EQ(int64_t(s.expert_ids.size()), (n - 1) * k);  // one sparse layer
        const int32_t* want = f.routing[0].expert_ids.data_as<int32_t>();
        EXPECT_TRUE(std::equal(s.expert_ids.begin(), s.expert_ids.end(), want))
            << "request " << r << ": the recorded routing is not the training forward's";
      }
  }
}

}  // namespace
}  // namespace lockstep
