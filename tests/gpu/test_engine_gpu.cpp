// tests/gpu/test_engine_gpu.cpp — the generation engine with the model on the GPU
// (rollout/engine.h): sampling and copy-on-write on the device, the KV cache sized from free GPU
// memory, decode steps replayed from CUDA graphs (rollout/decode_graph.h).
//
// The CUDA forward rounds differently from the CPU's (tests/gpu/test_model_gpu.cpp), so tokens are
// not compared with a CPU run; the GPU's tokens are checked against the CPU model instead. Each
// greedy token is an argmax of the CPU logits up to 0.05 (a bf16 forward moves logits of order 1
// by ~1e-2). The logprobs match the CPU training forward of the generated sequences to the model
// test's logprob tolerance doubled (bf16 2e-2, fp8 8e-2 relative L2): the paged inference forward
// adds its own rounding to the training forward's.
//
// Graphs on and off must give the same tokens and logprobs bit for bit (both pad decode steps to
// the same buckets, so every kernel runs on the same shapes and values): compared exactly, over
// steps whose bucket shrinks as sequences finish, copy-on-write in decode steps, preemption, and a
// second generate() that replays the graphs captured by the first.
#include <gtest/gtest.h>

#include <algorithm>

#include "../model/model_test_util.h"
#include "../rollout/rollout_test_util.h"
#include "../test_util.h"
#include "core/dtypes.h"
#include "rollout/engine.h"

namespace lockstep::testing {
namespace {

// Relative L2 error of the engine's logprobs against the CPU training forward's over the same
// sequences (prompt + generated tokens, at each request's temperature, 1 when greedy).
double logprob_error(Transformer& cpu_model, const std::vector<GenerationRequest>& requests,
                     const std::vector<std::vector<GeneratedSample>>& results) {
  std::vector<double> engine, forward;
  for (size_t r = 0; r < requests.size(); ++r) {
    const float temperature = requests[r].sampling.temperature;
    const size_t length = requests[r].prompt.size();
    for (const GeneratedSample& s : results[r]) {
      EXPECT_EQ(s.logprobs.size(), s.tokens.size());
      std::vector<int32_t> seq = requests[r].prompt;
      seq.insert(seq.end(), s.tokens.begin(), s.tokens.end());
      const TrainForward f = cpu_model.forward(pack({seq}), temperature > 0 ? temperature : 1.0f,
                                               false);
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        engine.push_back(s.logprobs[i]);
        forward.push_back(f.logprob.data_as<float>()[length - 1 + i]);
      }
    }
  }
  return rel_error(engine, forward);
}

TEST(EngineGpu, GreedyTokensAreCpuArgmaxes) {
  LOCKSTEP_REQUIRE_GPU();
  const ModelConfig c = gpu_tiny_config();
  const ModelParameters init = random_parameters(c, 31);
  Transformer gpu_model(c, init.copy_to(Device::cuda), Recipe::bf16);
  Transformer cpu_model(c, init, Recipe::bf16);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 12;
  const auto requests = make_requests({5, 40, 17}, greedy, 1, gpu_tiny_config().vocab_size);
  Engine engine(gpu_model, {.num_blocks = 64, .block_size = 16});
  const auto results = engine.generate(requests);

  for (size_t r = 0; r < requests.size(); ++r) {
    const GeneratedSample& s = results[r][0];
    ASSERT_EQ(s.tokens.size(), 12u);
    std::vector<int32_t> seq = requests[r].prompt;
    seq.insert(seq.end(), s.tokens.begin(), s.tokens.end());
    const Tensor logits = cpu_model.logits(cpu_model.hidden_states(pack({seq})));
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const float* row = logits.data_as<float>() + (requests[r].prompt.size() - 1 + i) * c.vocab_size;
      const float best = *std::max_element(row, row + c.vocab_size);
      EXPECT_GE(row[s.tokens[i]], best - 0.05f) << "request " << r << " token " << i;
    }
  }
  EXPECT_LE(logprob_error(cpu_model, requests, results), 2e-2);
}

// The engine tests' model: the small Qwen3, or (partial_blocks) SmolLM2-135M's layer shapes.
ModelConfig config_of(const EngineCase& c) { return c.partial_blocks ? gpu_partial_blocks_config() : gpu_tiny_config(); }

class EngineGpuRecipe : public ::testing::TestWithParam<EngineCase> {};

// A small cache and step budget: chunked prefill, preemption and copy-on-write on the device.
TEST_P(EngineGpuRecipe, SampledLogprobsMatchTheCpuForward) {
  LOCKSTEP_REQUIRE_GPU();
  const ModelConfig c = config_of(GetParam());
  const ModelParameters init = random_parameters(c, 32);
  Transformer gpu_model(c, init.copy_to(Device::cuda), GetParam().recipe, GetParam().options());
  Transformer cpu_model(c, init, GetParam().recipe, GetParam().options());
  SamplingParams sampling;
  sampling.n = 4;
  sampling.temperature = 0.9f;
  sampling.top_k = 50;
  sampling.top_p = 0.9f;
  sampling.max_new_tokens = 10;
  auto requests = make_requests({7, 13, 22, 10}, sampling, 2, c.vocab_size);
  requests[1].sampling.temperature = 1.3f;
  requests[2].sampling.top_k = 0;
  Engine engine(gpu_model, {.num_blocks = 24, .block_size = 4, .max_step_tokens = 24});
  const auto results = engine.generate(requests);
  EXPECT_GT(engine.stats().preemptions, 0);
  EXPECT_GT(engine.stats().block_copies, 0);
  for (const auto& samples : results)
    for (const GeneratedSample& s : samples) {
      EXPECT_EQ(s.tokens.size(), 10u);
      for (int32_t t : s.tokens) EXPECT_TRUE(t >= 0 && t < c.vocab_size) << t;
    }
  EXPECT_LE(logprob_error(cpu_model, requests, results), GetParam().recipe == Recipe::bf16 ? 2e-2 : 8e-2);
}

INSTANTIATE_TEST_SUITE_P(Recipes, EngineGpuRecipe,
                         ::testing::Values(EngineCase{Recipe::bf16}, EngineCase{Recipe::fp8},
                                           EngineCase{Recipe::bf16, true}, EngineCase{Recipe::fp8, true},
                                           EngineCase{Recipe::fp8, false, true}, EngineCase{Recipe::bf16, true, true}),
                         [](const auto& info) { return engine_case_name(info.param); });

using Results = std::vector<std::vector<GeneratedSample>>;

void expect_identical(const Results& a, const Results& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size()) << what;
    for (size_t j = 0; j < a[r].size(); ++j) {
      const GeneratedSample &x = a[r][j], &y = b[r][j];
      EXPECT_EQ(x.tokens, y.tokens) << what << ": request " << r << " sample " << j;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << what << ": request " << r << " sample " << j;
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << what;
      for (size_t i = 0; i < x.logprobs.size(); ++i)
        EXPECT_EQ(float_bits(x.logprobs[i]), float_bits(y.logprobs[i]))
            << what << ": request " << r << " sample " << j << " token " << i << ": "
            << x.logprobs[i] << " vs " << y.logprobs[i];
    }
  }
}

// Requests of different lengths and samplers (greedy, top-k, top-p; n = 2, so forked samples
// copy the prompt's last block in their first decode step): the 12 sequences decode together,
// then fewer as they finish — 12, 10, 8, 6, 4, 2, 1 — through every bucket of max_step_sequences
// = 12 (12, 8, 4, 2, 1), 29 decode steps in all.
std::vector<GenerationRequest> shrinking_requests(int64_t vocab) {
  SamplingParams sampling;
  sampling.n = 2;
  sampling.temperature = 0.8f;
  sampling.top_k = 40;
  sampling.top_p = 0.95f;
  auto requests = make_requests({6, 19, 3, 11, 30, 9, 14}, sampling, 4, vocab);
  const int64_t lengths[] = {2, 5, 9, 14, 20, 24, 30};
  for (size_t r = 0; r < requests.size(); ++r) requests[r].sampling.max_new_tokens = lengths[r];
  requests[0].sampling.temperature = 0;
  requests[2].sampling.top_k = 0;
  requests[3].sampling.top_p = 1;
  requests[5].sampling.n = requests[6].sampling.n = 1;
  return requests;
}

class EngineGpuGraphs : public ::testing::TestWithParam<EngineCase> {};

TEST_P(EngineGpuGraphs, ChangeNoTokenOrLogprob) {
  LOCKSTEP_REQUIRE_GPU();
  const ModelConfig c = config_of(GetParam());
  Transformer model(c, random_parameters(c, 34).copy_to(Device::cuda), GetParam().recipe, GetParam().options());
  const auto requests = shrinking_requests(c.vocab_size);
  const EngineOptions options{.num_blocks = 64, .block_size = 8, .max_step_sequences = 12};
  EngineOptions eager_options = options;
  eager_options.cuda_graphs = false;
  Engine eager(model, eager_options), graphs(model, options);
  const Results expected = eager.generate(requests);
  expect_identical(graphs.generate(requests), expected, "graphs");
  expect_identical(graphs.generate(requests), expected, "graphs, replayed by a second generate");
  EXPECT_EQ(graphs.stats().decode_steps, 2 * 29);
  EXPECT_EQ(graphs.stats().decode_steps, 2 * eager.stats().decode_steps);
  EXPECT_GT(graphs.stats().block_copies, 0);
  for (const auto& samples : expected)
    for (const GeneratedSample& s : samples)
      for (int32_t t : s.tokens) EXPECT_TRUE(t >= 0 && t < c.vocab_size) << t;
}

// A small cache: sequences are preempted and recomputed between decode steps.
TEST_P(EngineGpuGraphs, ChangeNothingUnderPreemption) {
  LOCKSTEP_REQUIRE_GPU();
  const ModelConfig c = config_of(GetParam());
  Transformer model(c, random_parameters(c, 35).copy_to(Device::cuda), GetParam().recipe, GetParam().options());
  SamplingParams sampling;
  sampling.n = 3;
  sampling.temperature = 1.1f;
  sampling.max_new_tokens = 12;
  const auto requests = make_requests({7, 13, 22, 10}, sampling, 5, c.vocab_size);
  const EngineOptions options{.num_blocks = 20, .block_size = 4, .max_step_tokens = 24};
  EngineOptions eager_options = options;
  eager_options.cuda_graphs = false;
  Engine eager(model, eager_options), graphs(model, options);
  const Results expected = eager.generate(requests);
  expect_identical(graphs.generate(requests), expected, "graphs");
  EXPECT_GT(graphs.stats().preemptions, 0);
  EXPECT_EQ(graphs.stats().preemptions, eager.stats().preemptions);
  EXPECT_GT(graphs.stats().decode_steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Recipes, EngineGpuGraphs,
                         ::testing::Values(EngineCase{Recipe::bf16}, EngineCase{Recipe::fp8},
                                           EngineCase{Recipe::fp8, true}, EngineCase{Recipe::fp8, false, true},
                                           EngineCase{Recipe::fp8, true, true}),
                         [](const auto& info) { return engine_case_name(info.param); });

TEST(EngineGpu, MemoryFractionSizesTheCache) {
  LOCKSTEP_REQUIRE_GPU();
  const ModelConfig c = gpu_tiny_config();
  Transformer model(c, random_parameters(c, 33).copy_to(Device::cuda), Recipe::bf16);
  const int64_t block = KvCache::block_bytes(c, model.kv_cache_dtype(), 16);
  const DeviceMemoryStats before = device_memory_stats();
  Engine engine(model, {.memory_fraction = 0.02, .block_size = 16});
  const double expected = 0.02 * double(before.free) / double(block);
  EXPECT_NEAR(double(engine.num_blocks()), expected, 0.01 * expected + 1);
  EXPECT_GE(device_memory_stats().in_use, before.in_use + size_t(engine.num_blocks() * block));
  SamplingParams sampling;
  sampling.max_new_tokens = 4;
  EXPECT_EQ(engine.generate(make_requests({9}, sampling, 3, c.vocab_size))[0][0].tokens.size(), 4u);
}

}  // namespace
}  // namespace lockstep::testing
