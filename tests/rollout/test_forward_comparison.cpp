// rollout/forward_comparison.h on the CPU: the rollout's rows equal the training forward's at every
// op of every layer (prompt rows through chunked prefill, generated rows through decode steps,
// training rows through several micro-batches), and so do the logprobs; a planted difference (a
// rollout whose KV cache is e4m3 against a training forward that keeps k and v in bf16) is
// reported, first at the attention of layer 0, with the ops before it still equal; sequences
// preempted for want of cache and recomputed keep the same bits.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "rollout/forward_comparison.h"
#include "tests/model/model_test_util.h"

namespace lockstep {
namespace {

using testing::random_parameters;
using testing::random_sequences;
using testing::tiny_config;

// Widths of whole fp8 groups (q + 2·kv = 256, I = 256), GQA 2:1.
ModelConfig comparison_config() {
  return tiny_config(ModelFamily::qwen3, {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64,
                                          .intermediate = 256, .layers = 2, .vocab = 301});
}

// Prompts of 5, 19 and 12 tokens, 6 new tokens each, 8 tokens a step (prompts prefilled in chunks
// that end inside them), the first two sequences tapped, training micro-batches of at most 20
// tokens (sequence 0 in one, sequence 1 alone in the next: the tapped rows of both are matched).
constexpr int64_t kNewTokens = 6;
const std::vector<int> kPromptLengths = {5, 19, 12};

ForwardComparisonOptions options() {
  return {.new_tokens = kNewTokens, .step_tokens = 8, .temperature = 1.0f, .seed = 3,
          .tapped_sequences = 2, .train_tokens = 20};
}

struct Case {
  Recipe recipe;
  bool fp8_kv_cache;
};

class ForwardComparisonCpu : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardComparisonCpu, EveryOpAndLogprobIsBitIdentical) {
  const ModelConfig c = comparison_config();
  Transformer model(c, random_parameters(c, 1), GetParam().recipe,
                    {.fp8_kv_cache = GetParam().fp8_kv_cache});
  const auto prompts = random_sequences(kPromptLengths, c.vocab_size, 2);
  const ForwardComparison r = compare_rollout_forward(model, model, prompts, options());

  // Every op of both layers and the final norm, prompt and generated rows of each.
  const std::vector<std::string> layer_ops = {"input", "attn_norm", "qkv", "qk_norm_rope",
                                              "attention", "o_proj", "mlp_norm", "gate_up",
                                              "swiglu", "down"};
  const std::set<std::string> fp8_inputs = {"attn_norm", "attention", "mlp_norm", "swiglu"};
  ASSERT_EQ(r.ops.size(), 2 * (layer_ops.size() * 2 + 1));
  const int64_t prompt_rows = 5 + 19, generated_rows = 2 * (kNewTokens - 1);
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const OpComparison& op = r.ops[i];
    const size_t k = i / 2;
    const bool final_norm = k == 2 * layer_ops.size();
    EXPECT_EQ(op.layer, final_norm ? 2 : int64_t(k / layer_ops.size()));
    EXPECT_EQ(op.op, final_norm ? "final_norm" : layer_ops[k % layer_ops.size()]);
    EXPECT_EQ(op.decode, i % 2 == 1);
    const std::string what = std::to_string(op.layer) + " " + op.op + (op.decode ? " gen" : " prompt");
    // The rollout's final norm runs on each chunk's last row only.
    if (op.decode) EXPECT_EQ(op.rows, generated_rows) << what;
    else if (final_norm) EXPECT_GE(op.rows, 2) << what;
    else EXPECT_EQ(op.rows, prompt_rows) << what;
    EXPECT_EQ(op.rows_equal, op.rows) << what;
    EXPECT_EQ(op.max_abs_diff, 0.0) << what;
    EXPECT_FALSE(op.forms_differ) << what;
    EXPECT_EQ(op.codes_differ, 0) << what;
    const bool fp8_input = GetParam().recipe == Recipe::fp8 && fp8_inputs.contains(op.op);
    EXPECT_EQ(op.codes > 0, fp8_input) << what;
  }
  EXPECT_EQ(r.logprobs.tokens, 3 * kNewTokens);
  EXPECT_EQ(r.logprobs.not_equal, 0);
  EXPECT_EQ(r.logprobs.max_abs_diff, 0.0);
  // Every generated token of the tapped sequences had an equal LM-head input.
  EXPECT_EQ(r.head_logprobs.tokens, 2 * kNewTokens);
  EXPECT_EQ(r.head_logprobs.not_equal, 0);
  EXPECT_FALSE(r.graphs_run);
}

INSTANTIATE_TEST_SUITE_P(Recipes, ForwardComparisonCpu,
                         ::testing::Values(Case{Recipe::fp32, false}, Case{Recipe::bf16, false},
                                           Case{Recipe::bf16, true}, Case{Recipe::fp8, false},
                                           Case{Recipe::fp8, true}),
                         [](const auto& info) {
                           return std::string(recipe_name(info.param.recipe)) +
                                  (info.param.fp8_kv_cache ? "_fp8_kv" : "_bf16_kv");
                         });

// A cache too small for every sequence at once: the engine preempts the newest and recomputes them
// later (their generated tokens so far as prefill rows), and the bits stay the training forward's.
TEST(ForwardComparison, PreemptedSequencesKeepEveryRowAndLogprob) {
  const ModelConfig c = comparison_config();
  for (const Recipe recipe : {Recipe::bf16, Recipe::fp8}) {
    Transformer model(c, random_parameters(c, 1), recipe, {.fp8_kv_cache = recipe == Recipe::fp8});
    ForwardComparisonOptions o = options();
    o.block_size = 4;
    o.cache_blocks = 8;  // the three sequences need 3 + 7 + 5 blocks of 4 tokens
    const ForwardComparison r =
        compare_rollout_forward(model, model, random_sequences(kPromptLengths, c.vocab_size, 2), o);
    const std::string what(recipe_name(recipe));
    EXPECT_GT(r.preemptions, 0) << what << ": nothing was preempted, nothing tested";
    for (const OpComparison& op : r.ops) EXPECT_EQ(op.rows_equal, op.rows) << what << " " << op.layer << " " << op.op;
    EXPECT_EQ(r.logprobs.tokens, 3 * kNewTokens) << what;
    EXPECT_EQ(r.logprobs.not_equal, 0) << what;
  }
}

const OpComparison& find_op(const ForwardComparison& r, int64_t layer, const std::string& op,
                            bool decode) {
  for (const OpComparison& c : r.ops)
    if (c.layer == layer && c.op == op && c.decode == decode) return c;
  throw std::runtime_error("no comparison of layer " + std::to_string(layer) + " " + op);
}

TEST(ForwardComparison, APlantedDifferenceIsReportedFromTheOpWhereItStarts) {
  const ModelConfig c = comparison_config();
  const ModelParameters params = random_parameters(c, 1);
  Transformer rollout(c, params.copy_to(Device::cpu), Recipe::bf16, {.fp8_kv_cache = true});
  Transformer training(c, params.copy_to(Device::cpu), Recipe::bf16, {.fp8_kv_cache = false});
  const auto prompts = random_sequences(kPromptLengths, c.vocab_size, 2);
  const ForwardComparison r = compare_rollout_forward(rollout, training, prompts, options());

  for (bool decode : {false, true}) {
    for (const char* op : {"input", "attn_norm", "qkv", "qk_norm_rope"}) {
      const OpComparison& same = find_op(r, 0, op, decode);
      EXPECT_GT(same.rows, 0) << op;
      EXPECT_EQ(same.rows_equal, same.rows) << op;
    }
    // The paged attention reads e4m3 k/v, the training attention bf16 ones.
    const OpComparison& attention = find_op(r, 0, "attention", decode);
    EXPECT_LT(attention.rows_equal, attention.rows);
    EXPECT_GT(attention.max_abs_diff, 0.0);
    const OpComparison& last = find_op(r, 1, "down", decode);
    EXPECT_LT(last.rows_equal, last.rows);
  }
  EXPECT_EQ(r.logprobs.tokens, 3 * kNewTokens);
  EXPECT_GT(r.logprobs.not_equal, 0);
  EXPECT_GT(r.logprobs.mean_abs_diff, 0.0);
}

TEST(ForwardComparison, RefusesABatchThatNoDecodeStepHolds) {
  const ModelConfig c = comparison_config();
  Transformer model(c, random_parameters(c, 1), Recipe::bf16);
  ForwardComparisonOptions o = options();
  o.step_tokens = 2;
  try {
    compare_rollout_forward(model, model, random_sequences(kPromptLengths, c.vocab_size, 2), o);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("must hold a decode step of all 3 sequences"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep
