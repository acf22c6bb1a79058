// tests/gpu/test_sharded_weights_gpu.cpp — train/sharded_weights.h (ZeRO-3's weight copies) on one
// GPU per rank (NCCL), against a model on the same GPU that keeps its whole copies: gathering moves
// bytes, so everything computed from the gathered copies must be the whole model's bits — the
// training forward's logprobs and the backward's gradients with each layer gathered before its use
// (the next one beside it, on the gather stream), twice, so that the second pass runs on memory the
// first freed; and the engine's generation from gather_all()'s copies, decode steps replayed from
// CUDA graphs, again after drop_all() and a fresh gather_all() (Engine::weights_moved). Under
// `mpirun -np 2` and `-np 4` with the collectives' tests (test_dist_gpu).
#include <gtest/gtest.h>

#include <algorithm>

#include "rollout/engine.h"
#include "tests/gpu/rank_gpu.h"
#include "tests/model/model_test_util.h"
#include "tests/rollout/rollout_test_util.h"
#include "tests/test_util.h"
#include "train/sharded_optimizer.h"
#include "train/sharded_weights.h"

namespace lockstep {
namespace {

using testing::same_bytes;
using testing::world;

// Four layers whose matrices the plan cuts inside on 2 and 4 ranks; a small gather bucket, so that
// a layer's gather takes several collectives.
ModelConfig four_layers() {
  return testing::tiny_config(ModelFamily::qwen3, {.hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 128,
                                                   .intermediate = 768, .layers = 4, .vocab = 1000});
}
constexpr int64_t kBucketNumel = int64_t(1) << 14;

class ShardedWeightsGpu : public ::testing::TestWithParam<Recipe> {};

TEST_P(ShardedWeightsGpu, TrainingPassesAndGenerationEqualTheWholeModel) {
  REQUIRE_RANK_GPU();
  Communicator& comm = world();
  const Recipe recipe = GetParam();
  const ModelConfig config = four_layers();
  const ModelParameters init = testing::random_parameters(config, 17);
  Transformer whole(config, init.copy_to(Device::cuda), recipe);
  Transformer model(config, init.copy_to(Device::cuda), recipe);
  ShardedAdamW optimizer(model.params(), OptimizerConfig{}, comm, kBucketNumel);
  model.release_masters();
  ShardedWeights weights(model, optimizer);

  const TrainBatch host = testing::pack(testing::random_sequences({70, 300, 9, 130}, config.vocab_size, 5));
  const TrainBatch batch{host.tokens.to(Device::cuda), host.targets.to(Device::cuda),
                         host.cu_seqlens.to(Device::cuda)};
  Tensor dlogprob = Tensor::empty({host.tokens.dim(0)}, DType::f32);
  std::fill_n(dlogprob.data_as<float>(), dlogprob.numel(), 0.25f);
  dlogprob = dlogprob.to(Device::cuda);
  TrainForward g = whole.forward(batch);
  whole.backward(g, dlogprob, Tensor());
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE("pass " + std::to_string(pass));
    model.grads().for_each([](const std::string&, Tensor& t) { t.fill_bytes(0); });
    TrainForward f = model.forward(batch);
    EXPECT_TRUE(same_bytes(f.logprob, g.logprob));
    EXPECT_TRUE(same_bytes(f.entropy, g.entropy));
    model.backward(f, dlogprob, Tensor());
    EXPECT_EQ(testing::first_different_gradient(model, whole), "");
    EXPECT_EQ(model.weight_copy_bytes(false), 0);
  }

  // Generation from the gathered copies, graphs on; then from a second gather at new addresses.
  SamplingParams sampling;
  sampling.temperature = 1;
  sampling.max_new_tokens = 24;
  const auto requests = testing::make_requests({5, 40, 17, 3}, sampling, 3, config.vocab_size);
  Engine reference(whole, {.num_blocks = 64, .block_size = 16});
  const auto expected = reference.generate(requests);
  weights.gather_all();
  Engine engine(model, {.num_blocks = 64, .block_size = 16});
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("generation " + std::to_string(round));
    if (round == 1) {
      weights.drop_all();
      Tensor spacer = Tensor::empty({1 << 20}, DType::f32, Device::cuda);  // new addresses for the copies
      weights.gather_all();
      engine.weights_moved();
    }
    const auto got = engine.generate(requests);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(got[r][0].tokens, expected[r][0].tokens) << "request " << r;
      EXPECT_EQ(got[r][0].logprobs, expected[r][0].logprobs) << "request " << r;
    }
  }
  weights.drop_all();
  comm.barrier();
}

INSTANTIATE_TEST_SUITE_P(Recipes, ShardedWeightsGpu, ::testing::Values(Recipe::bf16, Recipe::fp8),
                         [](const auto& info) { return std::string(recipe_name(info.param)); });

}  // namespace
}  // namespace lockstep
