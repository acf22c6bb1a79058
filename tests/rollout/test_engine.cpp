// The generation engine on the CPU: greedy generation is the step-by-step argmax of the training
// forward; every returned logprob equals the training forward's bit for bit (bf16, fp8), through
// chunked prefill, preemption and copy-on-write; preemption, prompt sharing and the company of
// other requests change no token; sampled frequencies follow the model's distribution; stop token
// ids and stop strings spanning token boundaries end samples where rollout/engine.h says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/dtypes.h"
#include "core/error.h"
#include "rollout/decode_graph.h"
#include "rollout/engine.h"
#include "tests/model/model_test_util.h"
#include "tests/rollout/rollout_test_util.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::engine_case_name;
using testing::EngineCase;
using testing::expect_error;
using testing::make_requests;
using testing::pack;
using testing::random_parameters;
using testing::random_sequences;
using testing::Sequences;
using testing::tiny_config;
using Results = std::vector<std::vector<GeneratedSample>>;

// Dimensions that are multiples of 128 (q + 2·kv = 256, I = 256), or (partial_blocks) multiples of
// 16 that leave fp8 partial 128-groups, GQA 3:1.
ModelConfig engine_config(bool partial_blocks = false) {
  if (partial_blocks) return testing::partial_blocks_config(ModelFamily::qwen3);
  return tiny_config(ModelFamily::qwen3, {.hidden = 128,
                                          .heads = 2,
                                          .kv_heads = 1,
                                          .head_dim = 64,
                                          .intermediate = 256,
                                          .layers = 2,
                                          .vocab = 301,
                                          .tied = true});
}

void expect_same(const Results& a, const Results& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size());
    for (size_t j = 0; j < a[r].size(); ++j) {
      EXPECT_EQ(a[r][j].tokens, b[r][j].tokens) << "request " << r << " sample " << j;
      EXPECT_EQ(a[r][j].finish_reason, b[r][j].finish_reason) << "request " << r << " sample " << j;
      ASSERT_EQ(a[r][j].logprobs.size(), b[r][j].logprobs.size());
      for (size_t i = 0; i < a[r][j].logprobs.size(); ++i)
        EXPECT_EQ(float_bits(a[r][j].logprobs[i]), float_bits(b[r][j].logprobs[i]))
            << "request " << r << " sample " << j << " token " << i;
    }
  }
}

// Every sample's logprobs against one training forward over all of them (prompt + tokens; row
// L − 1 + i gives the logprob of generated token i), at the request's temperature (1 for greedy).
void expect_training_logprobs(Transformer& model, const std::vector<GenerationRequest>& requests,
                              const Results& results) {
  std::vector<float> temperatures;
  for (const GenerationRequest& r : requests)
    if (std::find(temperatures.begin(), temperatures.end(), r.sampling.temperature) ==
        temperatures.end())
      temperatures.push_back(r.sampling.temperature);
  for (float temperature : temperatures) {
    Sequences seqs;
    for (size_t r = 0; r < requests.size(); ++r)
      if (requests[r].sampling.temperature == temperature)
        for (const GeneratedSample& s : results[r]) {
          seqs.push_back(requests[r].prompt);
          seqs.back().insert(seqs.back().end(), s.tokens.begin(), s.tokens.end());
        }
    const TrainForward f = model.forward(pack(seqs), temperature > 0 ? temperature : 1.0f, false);
    const float* logprob = f.logprob.data_as<float>();
    int64_t row = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
      if (requests[r].sampling.temperature != temperature) continue;
      const int64_t length = int64_t(requests[r].prompt.size());
      for (size_t j = 0; j < results[r].size(); ++j) {
        const GeneratedSample& s = results[r][j];
        ASSERT_EQ(s.logprobs.size(), s.tokens.size());
        for (size_t i = 0; i < s.tokens.size(); ++i)
          EXPECT_EQ(float_bits(s.logprobs[i]), float_bits(logprob[row + length - 1 + int64_t(i)]))
              << "request " << r << " sample " << j << " token " << i << ": " << s.logprobs[i]
              << " vs " << logprob[row + length - 1 + int64_t(i)];
        row += length + int64_t(s.tokens.size());
      }
    }
  }
}

class EngineRecipe : public ::testing::TestWithParam<EngineCase> {};

TEST_P(EngineRecipe, GreedyIsTheStepwiseArgmaxOfTheTrainingForward) {
  const ModelConfig config = engine_config(GetParam().partial_blocks);
  Transformer model(config, random_parameters(config, 21), GetParam().recipe, GetParam().options());
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 10;
  const auto requests = make_requests({5, 9, 17}, greedy, 1, config.vocab_size);
  Engine engine(model, {.num_blocks = 64, .block_size = 4});
  const Results results = engine.generate(requests);

  for (size_t r = 0; r < requests.size(); ++r) {
    std::vector<int32_t> seq = requests[r].prompt;
    for (int i = 0; i < greedy.max_new_tokens; ++i) {
      const Tensor h = model.hidden_states(pack({seq}));
      const Tensor logits = model.logits(h.rows(h.dim(0) - 1, h.dim(0)));
      const float* l = logits.data_as<float>();
      seq.push_back(int32_t(std::max_element(l, l + config.vocab_size) - l));
    }
    const std::vector<int32_t> expected(seq.begin() + ptrdiff_t(requests[r].prompt.size()),
                                        seq.end());
    EXPECT_EQ(results[r][0].tokens, expected) << "request " << r;
    EXPECT_EQ(results[r][0].finish_reason, FinishReason::length);
  }
  expect_training_logprobs(model, requests, results);
}

// Small cache and step budget: prompts are chunked, sequences preempted and recomputed, shared
// prompt blocks copied on write — and every logprob still equals the training forward's.
TEST_P(EngineRecipe, SampledLogprobsEqualTheTrainingForwardBitForBit) {
  const ModelConfig config = engine_config(GetParam().partial_blocks);
  Transformer model(config, random_parameters(config, 22), GetParam().recipe, GetParam().options());
  SamplingParams sampling;
  sampling.n = 3;
  sampling.temperature = 0.8f;
  sampling.top_k = 40;
  sampling.top_p = 0.95f;
  sampling.max_new_tokens = 12;
  auto requests = make_requests({7, 13, 4, 22, 10}, sampling, 2, config.vocab_size);
  requests[1].sampling.temperature = 1.3f;  // a second temperature in the same steps
  requests[3].sampling.top_k = 0;
  Engine engine(model, {.num_blocks = 14, .block_size = 4, .max_step_tokens = 16});
  const Results results = engine.generate(requests);
  EXPECT_GT(engine.stats().preemptions, 0);
  EXPECT_GT(engine.stats().block_copies, 0);
  for (const auto& samples : results)
    for (const GeneratedSample& s : samples) EXPECT_EQ(s.tokens.size(), 12u);
  expect_training_logprobs(model, requests, results);
}

INSTANTIATE_TEST_SUITE_P(Recipes, EngineRecipe,
                         ::testing::Values(EngineCase{Recipe::bf16}, EngineCase{Recipe::fp8},
                                           EngineCase{Recipe::bf16, true}, EngineCase{Recipe::fp8, true},
                                           EngineCase{Recipe::fp8, false, true}, EngineCase{Recipe::fp8, true, true},
                                           EngineCase{Recipe::bf16, false, true}),
                         [](const auto& info) { return engine_case_name(info.param); });

// Many requests of different lengths, n and max_new_tokens through a cache a fraction of their
// size: the same tokens and logprobs as with room for everything.
TEST(Engine, PreemptionChangesNoToken) {
  const ModelConfig config = engine_config();
  Transformer model(config, random_parameters(config, 23), Recipe::bf16);
  SamplingParams sampling;
  sampling.temperature = 1.0f;
  auto requests = make_requests({3, 30, 8, 17, 5, 12, 25, 9, 14, 6, 21, 11}, sampling, 3, engine_config().vocab_size);
  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].sampling.max_new_tokens = 4 + int64_t(r % 5) * 2;
    requests[r].sampling.n = 1 + int64_t(r % 3);
  }
  Engine roomy(model, {.num_blocks = 256, .block_size = 4});
  const Results reference = roomy.generate(requests);
  EXPECT_EQ(roomy.stats().preemptions, 0);

  Engine tight(
      model, {.num_blocks = 12, .block_size = 4, .max_step_tokens = 24, .max_step_sequences = 10});
  const Results results = tight.generate(requests);
  EXPECT_GT(tight.stats().preemptions, 5);
  expect_same(results, reference);
  for (size_t r = 0; r < requests.size(); ++r)
    for (const GeneratedSample& s : results[r])
      EXPECT_EQ(int64_t(s.tokens.size()), requests[r].sampling.max_new_tokens);
  expect_training_logprobs(model, requests, results);
}

// n = 4 samples of prompts ending mid-block (10 tokens, blocks of 4) and at a block boundary (8):
// shared or not, the same samples; shared, the prompt is computed once and the partial block copied
// for all writers but the last.
TEST(Engine, PromptSharingChangesNoToken) {
  const ModelConfig config = engine_config();
  Transformer model(config, random_parameters(config, 24), Recipe::bf16);
  SamplingParams sampling;
  sampling.n = 4;
  sampling.max_new_tokens = 6;
  const auto requests = make_requests({10, 8}, sampling, 4, engine_config().vocab_size);

  Engine separate(model, {.num_blocks = 64, .block_size = 4, .share_prompts = false});
  const Results reference = separate.generate(requests);
  EXPECT_EQ(separate.stats().tokens_computed, 4 * (10 + 8) + 2 * 4 * 5);
  EXPECT_EQ(separate.stats().block_copies, 0);

  Engine shared(model, {.num_blocks = 64, .block_size = 4});
  expect_same(shared.generate(requests), reference);
  EXPECT_EQ(shared.stats().tokens_computed, (10 + 8) + 2 * 4 * 5);
  EXPECT_EQ(shared.stats().block_copies, 3);

  Engine shared_tight(model, {.num_blocks = 9, .block_size = 4, .max_step_tokens = 6});
  expect_same(shared_tight.generate(requests), reference);
  EXPECT_GT(shared_tight.stats().preemptions, 0);
}

TEST(Engine, ARequestAloneOrAmongOthersGivesTheSameSamples) {
  const ModelConfig config = engine_config();
  Transformer model(config, random_parameters(config, 25), Recipe::fp8);
  SamplingParams sampling;
  sampling.n = 2;
  sampling.top_p = 0.9f;
  sampling.max_new_tokens = 8;
  const auto crowd = make_requests({6, 19, 11, 3, 15, 9, 12}, sampling, 5, engine_config().vocab_size);
  Engine engine(model, {.num_blocks = 24, .block_size = 4, .max_step_tokens = 20});
  const Results together = engine.generate(crowd);
  for (size_t r : {0, 3, 6}) {
    const Results alone = engine.generate({crowd[r]});
    expect_same(alone, {together[r]});
  }
}

// 4000 samples of one token from one prompt (one shared prefill): the frequencies follow
// softmax(logits / τ) of the training forward's last row (χ², 1e-3 tail).
TEST(Engine, SampledFrequenciesFollowTheModel) {
  const ModelConfig config = tiny_config(ModelFamily::qwen3);  // 37 tokens
  Transformer model(config, random_parameters(config, 26), Recipe::fp32);
  const std::vector<int32_t> prompt = random_sequences({7}, config.vocab_size, 6)[0];
  SamplingParams sampling;
  sampling.n = 4000;
  sampling.temperature = 0.9f;
  sampling.max_new_tokens = 1;
  Engine engine(model, {.num_blocks = 4, .block_size = 4});
  const Results results = engine.generate({{prompt, sampling}});

  std::vector<int64_t> counts(size_t(config.vocab_size), 0);
  for (const GeneratedSample& s : results[0]) ++counts[size_t(s.tokens.at(0))];
  const Tensor h = model.hidden_states(pack({prompt}));
  const Tensor logits = model.logits(h.rows(h.dim(0) - 1, h.dim(0)));
  std::vector<double> probs(size_t(config.vocab_size));
  double max = -INFINITY, total = 0;
  for (int64_t v = 0; v < config.vocab_size; ++v)
    max = std::max(max, double(logits.data_as<float>()[v]) / sampling.temperature);
  for (int64_t v = 0; v < config.vocab_size; ++v)
    total += probs[size_t(v)] =
        std::exp(double(logits.data_as<float>()[v]) / sampling.temperature - max);
  for (double& p : probs) p /= total;
  const auto chi2 = testing::chi_square(counts, probs);
  EXPECT_LT(chi2.statistic, chi2.critical()) << "dof " << chi2.dof;
  EXPECT_GT(chi2.dof, 10);
}

// The llama3-style test tokenizer: ids below 301 are bytes and merges, each decoding to ≥ 1 byte.
Tokenizer test_tokenizer() {
  const std::string dir = LOCKSTEP_TEST_DATA;
  return Tokenizer::from_files(dir + "/tokenizer_llama3_style.json",
                               dir + "/tokenizer_llama3_style_config.json");
}

TEST(Engine, StopTokenIdsAndStopStringsSpanningTokens) {
  const ModelConfig config = engine_config();
  Transformer model(config, random_parameters(config, 27), Recipe::bf16);
  const Tokenizer tokenizer = test_tokenizer();
  SamplingParams sampling;
  sampling.max_new_tokens = 24;
  const GenerationRequest base = make_requests({9}, sampling, 7, engine_config().vocab_size)[0];
  Engine engine(model, {.num_blocks = 32, .block_size = 4}, &tokenizer);
  const GeneratedSample free_run = engine.generate({base})[0][0];
  ASSERT_EQ(free_run.tokens.size(), 24u);

  // The run stopped early is the free run cut after token `last`.
  auto expect_cut = [&](const GenerationRequest& request, size_t last, const std::string& what) {
    const GeneratedSample s = engine.generate({request})[0][0];
    const std::vector<int32_t> want(free_run.tokens.begin(),
                                    free_run.tokens.begin() + ptrdiff_t(last) + 1);
    EXPECT_EQ(s.tokens, want) << what;
    EXPECT_EQ(s.finish_reason, FinishReason::stop) << what;
    ASSERT_EQ(s.logprobs.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(float_bits(s.logprobs[i]), float_bits(free_run.logprobs[i])) << what;
  };

  GenerationRequest by_id = base;
  by_id.sampling.stop_token_ids = {free_run.tokens[9], 300};
  const size_t first_id = size_t(std::find_first_of(free_run.tokens.begin(), free_run.tokens.end(),
                                                    by_id.sampling.stop_token_ids.begin(),
                                                    by_id.sampling.stop_token_ids.end()) -
                                 free_run.tokens.begin());
  expect_cut(by_id, first_id, "stop token id");

  // Byte offsets where each generated token's text starts.
  std::string text;
  std::vector<size_t> starts;
  for (int32_t t : free_run.tokens) {
    starts.push_back(text.size());
    text += tokenizer.decode(std::span<const int32_t>(&t, 1));
  }
  auto token_of_byte = [&](size_t byte) {
    return size_t(std::upper_bound(starts.begin(), starts.end(), byte) - starts.begin()) - 1;
  };
  for (size_t k : {4, 11, 17}) {
    // The last byte of token k, all of token k + 1, the first byte of token k + 2.
    const std::string stop = text.substr(starts[k + 1] - 1, starts[k + 2] - starts[k + 1] + 2);
    const size_t match = text.find(stop), last = token_of_byte(match + stop.size() - 1);
    EXPECT_GT(last, token_of_byte(match)) << "the stop string spans tokens";
    GenerationRequest by_string = base;
    by_string.sampling.stop_strings = {"never in this text \x01", stop};
    expect_cut(by_string, last, "stop string '" + stop + "' at token " + std::to_string(k));
  }

  // The prompt's text does not count: a string found only there never stops generation.
  const std::string prompt_text = tokenizer.decode(base.prompt);
  std::string prompt_only;
  for (size_t n = 2; n <= prompt_text.size() && prompt_only.empty(); ++n)
    for (size_t at = 0; at + n <= prompt_text.size() && prompt_only.empty(); ++at)
      if (text.find(prompt_text.substr(at, n)) == std::string::npos)
        prompt_only = prompt_text.substr(at, n);
  ASSERT_FALSE(prompt_only.empty());
  GenerationRequest in_prompt = base;
  in_prompt.sampling.stop_strings = {prompt_only};
  const GeneratedSample s = engine.generate({in_prompt})[0][0];
  EXPECT_EQ(s.tokens, free_run.tokens);
  EXPECT_EQ(s.finish_reason, FinishReason::length);
}

TEST(Engine, RefusesBadRequestsNamingTheField) {
  const ModelConfig config = engine_config();
  Transformer model(config, random_parameters(config, 28), Recipe::bf16);
  Engine engine(model, {.num_blocks = 4, .block_size = 4});
  SamplingParams sampling;
  sampling.max_new_tokens = 4;
  const GenerationRequest good = make_requests({5}, sampling, 8, engine_config().vocab_size)[0];
  auto bad = [&](auto change, const std::string& part) {
    std::vector<GenerationRequest> requests = {good, good};
    change(requests[1]);
    expect_error([&] { engine.generate(requests); }, "request 1: " + part);
  };
  bad([](GenerationRequest& r) { r.prompt.clear(); }, "the prompt is empty");
  bad([](GenerationRequest& r) { r.prompt[2] = 301; }, "prompt[2] = 301 is outside the vocabulary");
  bad([](GenerationRequest& r) { r.sampling.n = 0; }, "n must be");
  bad([](GenerationRequest& r) { r.sampling.temperature = -1; }, "temperature");
  bad([](GenerationRequest& r) { r.sampling.top_p = 0; }, "top_p");
  bad([](GenerationRequest& r) { r.sampling.top_k = -2; }, "top_k");
  bad([](GenerationRequest& r) { r.sampling.max_new_tokens = 0; }, "max_new_tokens");
  bad([](GenerationRequest& r) { r.sampling.stop_strings = {"x"}; },
      "stop_strings need a tokenizer");
  bad([](GenerationRequest& r) { r.sampling.max_new_tokens = 13; },
      "the prompt (5 tokens) and max_new_tokens (13) need more than the KV cache's 16");
  expect_error([&] { Engine(model, {.num_blocks = 0}); }, "num_blocks");
  expect_error([&] { Engine(model, {.num_blocks = 4, .memory_fraction = 0.5}); },
               "set either num_blocks > 0 or memory_fraction");
  expect_error([&] { Engine(model, {.memory_fraction = 1.5}); }, "memory_fraction in (0, 1]");
  expect_error([&] { Engine(model, {.memory_fraction = 0.5}); },
               "the model is on the CPU: set num_blocks");
  // 5 + 12 − 1 = 16 tokens fill the 16 slots exactly: accepted.
  GenerationRequest fits = good;
  fits.sampling.max_new_tokens = 12;
  EXPECT_EQ(engine.generate({fits})[0][0].tokens.size(), 12u);
}

// The decode graph's buckets (rollout/decode_graph.h): powers of two to 16, then ×1.5 and ×4/3
// in turn, cut at max_sequences, which is always the last.
TEST(DecodeGraph, Buckets) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(DecodeGraph::buckets(1), V({1}));
  EXPECT_EQ(DecodeGraph::buckets(5), V({1, 2, 4, 5}));
  EXPECT_EQ(DecodeGraph::buckets(16), V({1, 2, 4, 8, 16}));
  EXPECT_EQ(DecodeGraph::buckets(100), V({1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100}));
  EXPECT_EQ(DecodeGraph::buckets(256),
            V({1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256}));
  EXPECT_EQ(DecodeGraph::buckets(512).back(), 512);
  EXPECT_EQ(DecodeGraph::buckets(512).end()[-2], 384);
}

}  // namespace
}  // namespace lockstep
