// Generation against a paged KV cache gives the training forward's logprobs bit for bit on the
// CPU, in every recipe, whatever the batch composition, block size and block placement; and the
// training forward's rows do not depend on how sequences are packed.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "core/dtypes.h"
#include "core/error.h"
#include "model/transformer.h"
#include "ops/lm_head.h"
#include "tests/model/model_test_util.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::i32_tensor;
using testing::pack;
using testing::random_parameters;
using testing::random_sequences;
using testing::Sequences;
using testing::tiny_config;

// Dimensions that are multiples of 128 (q + 2·kv = 256, I = 256), or (partial_blocks) multiples
// of 16 that leave fp8 partial 128-groups (testing::partial_blocks_config).
ModelConfig generation_config(ModelFamily family, bool partial_blocks = false) {
  if (partial_blocks) return testing::partial_blocks_config(family);
  return tiny_config(family, {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64,
                              .intermediate = 256, .layers = 2, .vocab = 301,
                              .tied = family == ModelFamily::qwen3});
}

// logprob of each sequence's tokens 1.. (row i predicts token i + 1), by the training forward.
std::vector<std::vector<float>> train_logprobs(Transformer& model, const Sequences& seqs,
                                               float temperature) {
  const TrainForward f = model.forward(pack(seqs), temperature, false);
  std::vector<std::vector<float>> out;
  int64_t row = 0;
  for (const auto& s : seqs) {
    out.emplace_back(f.logprob.data_as<float>() + row,
                     f.logprob.data_as<float>() + row + int64_t(s.size()) - 1);
    row += int64_t(s.size());
  }
  return out;
}

// Feeds every sequence through the paged inference path in steps of 1–3 new tokens per sequence
// (prompt chunks and single-token decodes mixed in one batch, sequences joining at random steps),
// and returns the logprob of each token after the first, from each step's last row.
std::vector<std::vector<float>> generation_logprobs(Transformer& model, const Sequences& seqs,
                                                    int64_t block_size, float temperature,
                                                    uint64_t seed) {
  const int64_t max_len = 64, blocks_per_seq = (max_len + block_size - 1) / block_size;
  const int64_t num_seqs = int64_t(seqs.size());
  KvCache cache(model.config(), model.kv_cache_dtype(), num_seqs * blocks_per_seq, block_size);
  // Blocks handed out in a shuffled order, so no sequence's blocks are contiguous.
  std::vector<int32_t> pool(static_cast<size_t>(cache.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<std::vector<int32_t>> table(seqs.size());
  for (int64_t s = 0; s < num_seqs; ++s)
    table[size_t(s)].assign(pool.begin() + s * blocks_per_seq, pool.begin() + (s + 1) * blocks_per_seq);

  std::vector<std::vector<float>> out(seqs.size());
  std::vector<size_t> done(seqs.size(), 0);  // tokens already in the cache
  std::uniform_int_distribution<int> chunk(1, 3), join(0, 2);
  while (true) {
    std::vector<int32_t> tokens, positions, slots, cu{0}, context, tables, last;
    std::vector<size_t> members;
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (done[s] + 1 >= seqs[s].size() || join(rng) == 0) continue;  // finished, or sits out
      const size_t n = std::min(size_t(chunk(rng)), seqs[s].size() - 1 - done[s]);
      for (size_t i = done[s]; i < done[s] + n; ++i) {
        tokens.push_back(seqs[s][i]);
        positions.push_back(int32_t(i));
        slots.push_back(int32_t(table[s][i / size_t(block_size)] * block_size +
                                int64_t(i) % block_size));
      }
      done[s] += n;
      cu.push_back(int32_t(tokens.size()));
      last.push_back(int32_t(tokens.size()) - 1);
      context.push_back(int32_t(done[s]));
      tables.insert(tables.end(), table[s].begin(), table[s].end());
      members.push_back(s);
    }
    if (members.empty()) {
      bool finished = true;
      for (size_t s = 0; s < seqs.size(); ++s) finished &= done[s] + 1 >= seqs[s].size();
      if (finished) break;
      continue;
    }
    InferBatch batch{i32_tensor(tokens), i32_tensor(positions), i32_tensor(slots), i32_tensor(cu),
                     i32_tensor(context), i32_tensor(tables), i32_tensor(last)};
    batch.block_tables = batch.block_tables.reshape({int64_t(members.size()), blocks_per_seq});
    const Tensor logits = model.logits(model.forward_infer(batch, cache));
    std::vector<int32_t> targets;
    for (size_t s : members) targets.push_back(seqs[s][done[s]]);
    Tensor logprob = Tensor::empty({int64_t(members.size())}, DType::f32);
    Tensor entropy = Tensor::empty({int64_t(members.size())}, DType::f32);
    logits_logprob(logprob, entropy, logits, i32_tensor(targets), temperature);
    for (size_t m = 0; m < members.size(); ++m) {
      // Only a chunk's last row reaches the head: the rows before it stay NaN in this run.
      std::vector<float>& row = out[members[m]];
      row.resize(done[members[m]], std::nanf(""));
      row[done[members[m]] - 1] = logprob.data_as<float>()[m];
    }
  }
  return out;
}

struct Case {
  Recipe recipe;
  ModelFamily family;
  bool fp8_kv_cache = false;
  bool partial_blocks = false;
};

class Generation : public ::testing::TestWithParam<Case> {};

TEST_P(Generation, LogprobsEqualTrainingForwardBitForBit) {
  const auto [recipe, family, fp8_kv_cache, partial_blocks] = GetParam();
  const ModelConfig config = generation_config(family, partial_blocks);
  Transformer model(config, random_parameters(config, 11), recipe, {.fp8_kv_cache = fp8_kv_cache});
  const Sequences seqs = random_sequences({9, 14, 2, 21}, config.vocab_size, 12);
  const float temperature = 0.7f;
  const auto train = train_logprobs(model, seqs, temperature);

  int compared = 0;
  for (int64_t block_size : {1, 4, 16}) {
    for (uint64_t seed : {1, 2}) {
      const auto gen = generation_logprobs(model, seqs, block_size, temperature, seed);
      for (size_t s = 0; s < seqs.size(); ++s) {
        ASSERT_EQ(gen[s].size(), train[s].size());
        for (size_t i = 0; i < gen[s].size(); ++i) {
          if (std::isnan(gen[s][i])) continue;  // inside a multi-token chunk: not a last row
          EXPECT_EQ(float_bits(gen[s][i]), float_bits(train[s][i]))
              << "sequence " << s << " token " << i + 1 << ": " << gen[s][i] << " vs "
              << train[s][i] << " (block size " << block_size << ")";
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 60);  // most positions were a last row at some point
}

TEST_P(Generation, TrainingRowsDoNotDependOnPacking) {
  const auto [recipe, family, fp8_kv_cache, partial_blocks] = GetParam();
  const ModelConfig config = generation_config(family, partial_blocks);
  Transformer model(config, random_parameters(config, 13), recipe, {.fp8_kv_cache = fp8_kv_cache});
  const Sequences seqs = random_sequences({9, 14, 2, 21}, config.vocab_size, 14);
  const auto together = train_logprobs(model, seqs, 1.0f);
  const Sequences reversed(seqs.rbegin(), seqs.rend());
  const auto backwards = train_logprobs(model, reversed, 1.0f);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto alone = train_logprobs(model, {seqs[s]}, 1.0f);
    for (size_t i = 0; i < together[s].size(); ++i) {
      EXPECT_EQ(float_bits(alone[0][i]), float_bits(together[s][i]))
          << "sequence " << s << " token " << i;
      EXPECT_EQ(float_bits(backwards[seqs.size() - 1 - s][i]), float_bits(together[s][i]));
    }
  }
}

// last_rows repeats cu_seqlens_q for the GPU's sake; on the CPU a disagreement is an error.
TEST(Generation, RefusesLastRowsThatAreNotTheLastRows) {
  const ModelConfig config = generation_config(ModelFamily::qwen3);
  Transformer model(config, random_parameters(config, 15), Recipe::fp32);
  KvCache cache(config, model.kv_cache_dtype(), 4, 4);
  InferBatch batch{i32_tensor({3, 5, 7}), i32_tensor({0, 1, 0}), i32_tensor({0, 1, 4}),
                   i32_tensor({0, 2, 3}), i32_tensor({2, 1}),    i32_tensor({0, 1}),
                   i32_tensor({1, 2})};
  batch.block_tables = batch.block_tables.reshape({2, 1});
  EXPECT_EQ(model.forward_infer(batch, cache).dim(0), 2);
  batch.last_rows = i32_tensor({0, 2});
  expect_error([&] { model.forward_infer(batch, cache); }, "last_rows[0] = 0, but the sequence's last row is 1");
}

// A model whose training forward does not round k and v as an e4m3 cache does cannot use one (and
// the other way round): rollout and training would compute different functions.
TEST(Generation, RefusesACacheOfAnotherDtype) {
  const ModelConfig config = generation_config(ModelFamily::qwen3);
  Transformer plain(config, random_parameters(config, 15), Recipe::bf16);
  Transformer fp8_kv(config, random_parameters(config, 15), Recipe::bf16, {.fp8_kv_cache = true});
  EXPECT_EQ(fp8_kv.kv_cache_dtype(), DType::e4m3);
  InferBatch batch{i32_tensor({3}), i32_tensor({0}), i32_tensor({0}), i32_tensor({0, 1}),
                   i32_tensor({1}), i32_tensor({0}), i32_tensor({0})};
  batch.block_tables = batch.block_tables.reshape({1, 1});
  KvCache e4m3_cache(config, DType::e4m3, 2, 4), bf16_cache(config, DType::bf16, 2, 4);
  expect_error([&] { plain.forward_infer(batch, e4m3_cache); }, {"KV cache in e4m3", "bf16", "fp8_kv_cache"});
  expect_error([&] { fp8_kv.forward_infer(batch, bf16_cache); }, {"KV cache in bf16", "e4m3"});
  EXPECT_EQ(fp8_kv.forward_infer(batch, e4m3_cache).dim(0), 1);
}

// fp8 takes linear widths that are multiples of 16 (partial 128-groups); others are refused when
// the model is made, naming the weight.
TEST(Generation, Fp8RefusesWidthsThatAreNoMultipleOf16) {
  const ModelConfig config = tiny_config(ModelFamily::qwen3, {.hidden = 136, .heads = 2, .kv_heads = 1, .head_dim = 64,
                                                               .intermediate = 256, .layers = 1, .vocab = 301});
  expect_error([&] { Transformer model(config, random_parameters(config, 1), Recipe::fp8); },
               {"the fp8 recipe needs linear layers whose dimensions are multiples of 16", "[256, 136]"});
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, Generation,
    ::testing::Values(Case{Recipe::fp32, ModelFamily::qwen3}, Case{Recipe::bf16, ModelFamily::qwen3},
                      Case{Recipe::fp8, ModelFamily::qwen3}, Case{Recipe::bf16, ModelFamily::qwen2},
                      Case{Recipe::fp8, ModelFamily::llama}, Case{Recipe::fp32, ModelFamily::qwen2, true},
                      Case{Recipe::bf16, ModelFamily::qwen3, true}, Case{Recipe::fp8, ModelFamily::llama, true},
                      // Widths with partial fp8 128-groups, GQA 3:1 (SmolLM2-like).
                      Case{Recipe::fp8, ModelFamily::qwen3, false, true}, Case{Recipe::bf16, ModelFamily::llama, false, true},
                      Case{Recipe::fp8, ModelFamily::qwen2, true, true},
                      // Sparse (Qwen3-MoE: 8 experts, top-2, a dense second layer).
                      Case{Recipe::fp32, ModelFamily::qwen3_moe}, Case{Recipe::bf16, ModelFamily::qwen3_moe},
                      Case{Recipe::fp8, ModelFamily::qwen3_moe}, Case{Recipe::fp8, ModelFamily::qwen3_moe, true, true}),
    [](const auto& info) {
      return std::string(recipe_name(info.param.recipe)) + "_" +
             std::string(model_type_name(info.param.family)) + (info.param.fp8_kv_cache ? "_fp8_kv_cache" : "") +
             (info.param.partial_blocks ? "_partial_blocks" : "");
    });

}  // namespace
}  // namespace lockstep
