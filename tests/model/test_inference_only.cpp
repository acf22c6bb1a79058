// An inference-only Transformer (TransformerOptions::trainable = false) computes what a trainable
// one of the same parameters computes, bit for bit, while holding no gradients and (bf16, fp8) no
// fp32 masters of the big tensors; backward() and refresh_weights() on it are clear errors.
#include <gtest/gtest.h>

#include "model/transformer.h"
#include "tests/io/io_test_helpers.h"
#include "tests/model/model_test_util.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::pack;
using testing::random_parameters;
using testing::random_sequences;
using testing::same_bytes;
using testing::tiny_config;

// Linear dimensions that are multiples of 128 (q + 2·kv = 256, I = 256).
ModelConfig config() {
  return tiny_config(ModelFamily::qwen3, {.hidden = 128, .heads = 2, .kv_heads = 1,
                                          .head_dim = 64, .intermediate = 256, .layers = 2,
                                          .vocab = 301, .tied = false});
}

class InferenceOnly : public ::testing::TestWithParam<Recipe> {};

TEST_P(InferenceOnly, SameOutputsNoGradientsNoMasters) {
  const ModelConfig c = config();
  Transformer trainable(c, random_parameters(c, 3), GetParam());
  Transformer infer(c, random_parameters(c, 3), GetParam(), {.trainable = false});
  const TrainBatch batch = pack(random_sequences({7, 12, 1}, c.vocab_size, 5));

  // Bit for bit: the released tensors must not be read by any forward path.
  const TrainForward a = trainable.forward(batch, 0.7f, false);
  const TrainForward b = infer.forward(batch, 0.7f, false);
  EXPECT_TRUE(same_bytes(a.logprob, b.logprob));
  EXPECT_TRUE(same_bytes(a.entropy, b.entropy));
  EXPECT_TRUE(same_bytes(trainable.hidden_states(batch), infer.hidden_states(batch)));

  EXPECT_EQ(infer.grads().numel(), 0);
  EXPECT_GT(trainable.grads().numel(), 0);
  const bool released = GetParam() != Recipe::fp32;  // fp32 GEMMs read the masters
  EXPECT_EQ(infer.params().embed.defined(), !released);
  EXPECT_EQ(infer.params().lm_head.defined(), !released);
  for (const LayerParameters& l : infer.params().layers) {
    EXPECT_EQ(l.qkv.defined(), !released);
    EXPECT_EQ(l.down.defined(), !released);
    EXPECT_TRUE(l.input_norm.defined() && l.q_norm.defined() && l.post_norm.defined());
  }
  EXPECT_TRUE(infer.params().final_norm.defined());
  if (GetParam() == Recipe::fp8) {  // Wᵀ is read by the backward only
    const WeightCopies w = infer.weight_copies("layers.1.gate_up");
    EXPECT_TRUE(w.fp8->w.data.defined());
    EXPECT_FALSE(w.fp8->wt.data.defined());
  }
}

TEST_P(InferenceOnly, BackwardIsAnError) {
  const ModelConfig c = config();
  Transformer model(c, random_parameters(c, 3), GetParam(), {.trainable = false});
  const TrainBatch batch = pack(random_sequences({5, 9}, c.vocab_size, 6));
  TrainForward f = model.forward(batch);
  Tensor dlogprob = Tensor::empty({f.logprob.numel()}, DType::f32);
  for (int64_t i = 0; i < dlogprob.numel(); ++i) dlogprob.data_as<float>()[i] = -0.1f;
  expect_error([&] { model.backward(f, dlogprob, Tensor()); },
               {"backward", "inference-only", "trainable = false"});
}

TEST_P(InferenceOnly, RefreshWeightsIsAnErrorOnceMastersAreReleased) {
  const ModelConfig c = config();
  Transformer model(c, random_parameters(c, 3), GetParam(), {.trainable = false});
  if (GetParam() == Recipe::fp32) {
    model.refresh_weights();  // kept masters: nothing was released
    return;
  }
  expect_error([&] { model.refresh_weights(); },
               {"refresh_weights", "inference-only", "released"});
}

INSTANTIATE_TEST_SUITE_P(Recipes, InferenceOnly,
                         ::testing::Values(Recipe::fp32, Recipe::bf16, Recipe::fp8),
                         [](const auto& info) { return std::string(recipe_name(info.param)); });

}  // namespace
}  // namespace lockstep
