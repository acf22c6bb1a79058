// tests/dist/test_sharded_weights.cpp — train/sharded_weights.h (ZeRO-3's weight copies) on N
// ranks against a model that keeps its whole copies, in bf16 and fp8: between uses a rank holds
// only the copies of its own rows (bytes counted against the plan, and summing to one model's over
// the ranks); a training forward holds at most two layers' whole copies at any op; the forward's
// logprobs and the backward's gradients (fp8's DGrad reading the remade Wᵀ) are the whole model's
// bits; gather_all() makes the whole model's copies byte for byte (fp8: W, no Wᵀ) and drop_all()
// frees them; a sparse fp8 model's expert copies stay views of their layer's stacks through the
// step's hand-over and the gathers (ShardedWeightsMoe). Run under `mpirun -np 2` and `-np 3`
// (tests/CMakeLists.txt); alone, one rank, which owns every row.
//
// The model: three Qwen3 layers whose matrices are whole fp8 blocks (hidden 128, qkv 256 rows,
// gate_up 768) so that the plan cuts inside them on 2 and 3 ranks.
#include <gtest/gtest.h>

#include <algorithm>

#include "dist/host_values.h"
#include "tests/dist/test_world.h"
#include "tests/model/model_test_util.h"
#include "tests/test_util.h"
#include "train/sharded_optimizer.h"
#include "train/sharded_weights.h"

namespace lockstep {
namespace {

using testing::same_bytes;
using testing::world;

ModelConfig three_layers() {
  return testing::tiny_config(ModelFamily::qwen3, {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64,
                                                   .intermediate = 384, .layers = 3, .vocab = 64});
}

bool is_layer_matrix(const std::string& name) {
  return name.starts_with("layers.") &&
         (name.ends_with(".qkv") || name.ends_with(".o") || name.ends_with(".gate_up") || name.ends_with(".down"));
}

// Bytes of the copies of an [n, k] weight a rank keeps by rows: bf16 rows, or fp8 W's E4M3 bytes
// and f32 scales of its 128×128 blocks (scale rows padded to 4 columns, numerics/quantize.h).
int64_t row_copy_bytes(Recipe recipe, int64_t n, int64_t k) {
  if (recipe == Recipe::bf16) return n * k * 2;
  const int64_t col_blocks = (k + 127) / 128;
  return n * k + (n + 127) / 128 * ((col_blocks + 3) / 4 * 4) * 4;
}

class ShardedWeightsTest : public ::testing::TestWithParam<Recipe> {};

TEST_P(ShardedWeightsTest, RanksKeepTheirRowsAndGatherTheWholeModelsBits) {
  Communicator& comm = world();
  const Recipe recipe = GetParam();
  const ModelConfig config = three_layers();
  Transformer whole(config, testing::random_parameters(config, 11), recipe);
  Transformer model(config, testing::random_parameters(config, 11), recipe);
  ShardedAdamW optimizer(model.params(), OptimizerConfig{}, comm);
  model.release_masters();
  ShardedWeights weights(model, optimizer);

  // Between uses: only this rank's rows, as the plan gives them; over the ranks, one model's.
  const ShardPlan& plan = optimizer.plan();
  int64_t expected = 0, one_model = 0;
  for (const ShardPiece& p : plan.pieces[size_t(comm.rank())]) {
    const ShardedTensor& t = plan.tensors[size_t(p.tensor)];
    if (is_layer_matrix(t.name)) expected += row_copy_bytes(recipe, p.row_end - p.row_begin, t.shape[1]);
  }
  for (const ShardedTensor& t : plan.tensors)
    if (is_layer_matrix(t.name)) one_model += row_copy_bytes(recipe, t.shape[0], t.shape[1]);
  EXPECT_EQ(model.weight_copy_bytes(/*embedding_and_head=*/false), 0);
  EXPECT_EQ(weights.row_copy_bytes(), expected);
  EXPECT_EQ(sum_over_ranks(comm, double(weights.row_copy_bytes())), double(one_model));
  EXPECT_LT(expected, one_model * 2 / comm.size() + 1) << "a rank keeps more than its share";

  // A training forward and backward: at most two layers' whole copies at any op, the whole
  // model's logprobs and gradients bit for bit, nothing whole left after.
  const int64_t layer_bytes = whole.weight_copy_bytes(false) / config.num_hidden_layers;
  int64_t most = 0;
  model.set_activation_tap([&](int64_t, std::string_view, const LinearInput&) {
    most = std::max(most, model.weight_copy_bytes(false));
  });
  const TrainBatch batch = testing::pack(testing::random_sequences({5, 9, 3}, config.vocab_size, 3));
  TrainForward f = model.forward(batch), g = whole.forward(batch);
  EXPECT_GT(most, 0);
  EXPECT_LE(most, 2 * layer_bytes);
  EXPECT_TRUE(same_bytes(f.logprob, g.logprob));
  EXPECT_TRUE(same_bytes(f.entropy, g.entropy));
  Tensor dlogprob = Tensor::empty({batch.tokens.dim(0)}, DType::f32);
  std::fill_n(dlogprob.data_as<float>(), dlogprob.numel(), 0.25f);
  model.backward(f, dlogprob, Tensor());
  whole.backward(g, dlogprob, Tensor());
  EXPECT_LE(most, 2 * layer_bytes);
  EXPECT_EQ(testing::first_different_gradient(model, whole), "");
  EXPECT_EQ(model.weight_copy_bytes(false), 0);

  // The rollout's hand-over: every copy whole, the whole model's bytes (fp8: W, without the Wᵀ
  // only a backward reads).
  weights.gather_all();
  EXPECT_EQ(model.weight_copy_bytes(false), one_model);
  for (const ShardedTensor& t : plan.tensors) {
    if (!is_layer_matrix(t.name)) continue;
    const WeightCopies a = model.weight_copies(t.name), b = whole.weight_copies(t.name);
    if (recipe == Recipe::bf16) {
      EXPECT_TRUE(same_bytes(*a.bf16, *b.bf16)) << t.name;
    } else {
      EXPECT_TRUE(same_bytes(a.fp8->w.data, b.fp8->w.data)) << t.name;
      EXPECT_TRUE(same_bytes(a.fp8->w.scales, b.fp8->w.scales)) << t.name;
      EXPECT_FALSE(a.fp8->wt.data.defined()) << t.name;
    }
  }
  weights.drop_all();
  EXPECT_EQ(model.weight_copy_bytes(false), 0);
  EXPECT_EQ(weights.row_copy_bytes(), expected);
}

INSTANTIATE_TEST_SUITE_P(Recipes, ShardedWeightsTest, ::testing::Values(Recipe::bf16, Recipe::fp8),
                         [](const auto& info) { return std::string(recipe_name(info.param)); });

// A sparse model in fp8 whose experts run as grouped GEMMs (hidden and Im 128), their copies views
// of one stack per projection (model/moe.h). The optimizer's hand-over writes the whole copies
// through the views (this rank's W rows, the gathered rest, Wᵀ remade). With ZeRO-3 the layer
// gathers allocate the stacks and fill them: the forward and backward give the whole model's bits,
// and after a step gather_all's copies are fresh copies of the updated masters. (Each expert's
// copy against a fresh LinearWeight of its master: tests/model/model_test_util.h.)
TEST(ShardedWeightsMoe, ExpertCopiesStayViewsOfTheirStacks) {
  Communicator& comm = world();
  const ModelConfig config = testing::tiny_config(
      ModelFamily::qwen3_moe,
      {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64, .intermediate = 256, .layers = 2, .vocab = 64});
  const ModelParameters start = testing::random_parameters(config, 21), gradient = testing::random_parameters(config, 22);
  auto updated_masters = [&](ShardedAdamW& optimizer) {
    ModelParameters full = ModelParameters::zeros(config);
    optimizer.gather_masters(full);
    EXPECT_FALSE(same_bytes(full.layers[0].experts[5].gate_up, start.layers[0].experts[5].gate_up)) << "no update";
    return full;
  };
  {  // Whole copies, written by the step's hand-over.
    Transformer model(config, start.copy_to(Device::cpu), Recipe::fp8);
    ASSERT_TRUE(model.grouped_fp8_experts());
    ShardedAdamW optimizer(model.params(), OptimizerConfig{}, comm);
    model.release_masters();
    ModelParameters g = gradient.copy_to(Device::cpu);
    ASSERT_TRUE(optimizer.step(model.params(), g, [&](const std::string& n) { return model.weight_copies(n); }).applied);
    EXPECT_EQ(testing::expert_copies_mismatch(model, updated_masters(optimizer), true), "");
  }
  {  // ZeRO-3.
    Transformer whole(config, start.copy_to(Device::cpu), Recipe::fp8);
    Transformer model(config, start.copy_to(Device::cpu), Recipe::fp8);
    ShardedAdamW optimizer(model.params(), OptimizerConfig{}, comm);
    model.release_masters();
    ShardedWeights weights(model, optimizer);
    const TrainBatch batch = testing::pack(testing::random_sequences({5, 9, 3}, config.vocab_size, 23));
    TrainForward f = model.forward(batch), g = whole.forward(batch);
    EXPECT_TRUE(same_bytes(f.logprob, g.logprob));
    const Tensor dlogprob = testing::random_tensor({batch.tokens.dim(0)}, DType::f32, 24);
    model.backward(f, dlogprob, Tensor());
    whole.backward(g, dlogprob, Tensor());
    EXPECT_EQ(testing::first_different_gradient(model, whole), "");
    ModelParameters step_gradient = gradient.copy_to(Device::cpu);
    // (The step writes the row copies itself; it is given the whole ones still kept: the embedding's.)
    const auto whole_copies = [&](const std::string& n) { return weights.holds(n) ? WeightCopies{} : model.weight_copies(n); };
    ASSERT_TRUE(optimizer.step(model.params(), step_gradient, whole_copies).applied);
    weights.gather_all();
    EXPECT_EQ(testing::expert_copies_mismatch(model, updated_masters(optimizer), false), "");
    weights.drop_all();
    EXPECT_EQ(model.weight_copy_bytes(false), 0);
  }
}

}  // namespace
}  // namespace lockstep
