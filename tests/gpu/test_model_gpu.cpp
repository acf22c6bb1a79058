// tests/gpu/test_model_gpu.cpp — one full training step of a small Qwen3-style model on the GPU
// against the CPU backend (same parameters, same tokens, same recipe): logprobs, entropies, loss,
// every parameter's gradient, the weights after an AdamW step and the update itself. Also
// micro-batching: two micro-batches accumulate the same gradients as one batch.
//
// The two backends sum in different orders (cuBLASLt tiles, attention tiles, reductions), so
// bf16 intermediates round differently and, in fp8, some E4M3 codes flip by one step; the
// tolerances (step_compare.h) are relative L2 errors per tensor.
#include <gtest/gtest.h>

#include "../model/model_test_util.h"
#include "../model/step_compare.h"
#include "../test_util.h"
#include "ops/adamw.h"

namespace lockstep::testing {
namespace {

struct StepResult {
  Tensor logprob, entropy;
  double loss = 0;
  ModelParameters grads, weights;
};

// forward + SFT loss + backward over `seqs` split at `split` (sequences [0, split) and
// [split, end) as two micro-batches; split = size: one batch), then one AdamW step.
StepResult run_step(Device d, Recipe recipe, const ModelConfig& c, const ModelParameters& init,
                    const Sequences& seqs, size_t split) {
  Transformer model(c, init.copy_to(d), recipe);
  StepResult r;
  int64_t counted = 0;
  for (const auto& s : seqs) counted += int64_t(s.size()) - 1;
  std::vector<float> logprob, entropy;
  for (auto [first, last] : {std::pair{size_t(0), split}, std::pair{split, seqs.size()}}) {
    if (first == last) continue;
    const TrainBatch host = pack(Sequences(seqs.begin() + first, seqs.begin() + last));
    const TrainBatch b{host.tokens.to(d), host.targets.to(d), host.cu_seqlens.to(d)};
    TrainForward f = model.forward(b);
    const Tensor lp = f.logprob.to(Device::cpu), ent = f.entropy.to(Device::cpu);
    // SFT loss over every row but each sequence's last, normalized over the whole step.
    Tensor dlogprob = Tensor::zeros({lp.numel()}, DType::f32);
    int64_t row = 0;
    for (size_t s = first; s < last; ++s) {
      for (size_t i = 0; i + 1 < seqs[s].size(); ++i, ++row) {
        r.loss -= lp.data_as<float>()[row] / double(counted);
        dlogprob.data_as<float>()[row] = -1.0f / float(counted);
      }
      ++row;
    }
    model.backward(f, dlogprob.to(d), Tensor());
    logprob.insert(logprob.end(), lp.data_as<float>(), lp.data_as<float>() + lp.numel());
    entropy.insert(entropy.end(), ent.data_as<float>(), ent.data_as<float>() + ent.numel());
  }
  r.logprob = Tensor::empty({int64_t(logprob.size())}, DType::f32);
  std::copy(logprob.begin(), logprob.end(), r.logprob.data_as<float>());
  r.entropy = Tensor::empty({int64_t(entropy.size())}, DType::f32);
  std::copy(entropy.begin(), entropy.end(), r.entropy.data_as<float>());
  r.grads = model.grads().copy_to(Device::cpu);

  ModelParameters m = ModelParameters::zeros(c, d), v = ModelParameters::zeros(c, d);
  std::vector<Tensor*> ps, gs, ms, vs;
  model.params().for_each([&](const std::string&, Tensor& t) { ps.push_back(&t); });
  model.grads().for_each([&](const std::string&, Tensor& t) { gs.push_back(&t); });
  m.for_each([&](const std::string&, Tensor& t) { ms.push_back(&t); });
  v.for_each([&](const std::string&, Tensor& t) { vs.push_back(&t); });
  AdamWHyper hyper;
  hyper.weight_decay = 0.1f;
  for (size_t i = 0; i < ps.size(); ++i) adamw_step(*ps[i], *ms[i], *vs[i], *gs[i], hyper, 1, 1.0f);
  r.weights = model.params().copy_to(Device::cpu);
  return r;
}

// One training step on both backends at config c (the checks of ModelStepGpu.MatchesCpu).
void expect_step_matches_cpu(Recipe recipe, const ModelConfig& c) {
  const ModelParameters init = random_parameters(c, 3);
  const Sequences seqs = random_sequences({130, 1, 77, 256}, c.vocab_size, 5);
  const StepResult cpu = run_step(Device::cpu, recipe, c, init, seqs, seqs.size());
  const StepResult gpu = run_step(Device::cuda, recipe, c, init, seqs, seqs.size());
  const StepTolerance tol = step_tolerance(recipe);

  EXPECT_LE(rel_error(to_double(gpu.logprob), to_double(cpu.logprob)), tol.logprob);
  EXPECT_LE(rel_error(to_double(gpu.entropy), to_double(cpu.entropy)), tol.logprob);
  EXPECT_NEAR(gpu.loss, cpu.loss, tol.logprob * std::abs(cpu.loss));
  const auto [grad_error, grad_name] = worst_rel_error(gpu.grads, cpu.grads);
  EXPECT_LE(grad_error, tol.grads) << "worst gradient: " << grad_name;
  const StepErrors e = step_errors(gpu.weights, cpu.weights, init);
  EXPECT_LE(e.weights.first, tol.weights) << "worst weight: " << e.weights.second;
  EXPECT_LE(e.update.first, tol.update) << "worst update: " << e.update.second;
}

class ModelStepGpu : public ::testing::TestWithParam<Recipe> {};

TEST_P(ModelStepGpu, MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  expect_step_matches_cpu(GetParam(), gpu_tiny_config());
}

// SmolLM2-135M's layer shapes (hidden 576, qkv 960, I 1536; 9 q heads over 3 kv heads of 64):
// fp8's partial 128-groups and blocks in every GEMM, quantizer and producer, GQA 3:1 attention.
TEST_P(ModelStepGpu, MatchesCpuWithPartialBlocks) {
  LOCKSTEP_REQUIRE_GPU();
  expect_step_matches_cpu(GetParam(), gpu_partial_blocks_config());
}

// A Qwen3-MoE layer stack (8 experts of 192, one dense layer): the router, the gather by expert,
// the expert GEMMs (Im 192: not whole 128-blocks, so fp8 runs the per-expert loop, bf16 its grouped
// GEMMs) and the weighted
// combine on the GPU against the CPU. Every token goes to
// every expert (k = E): a near-tie between two experts' probabilities, which the two backends can
// round apart, then changes only the order of the combine, not which experts run.
TEST_P(ModelStepGpu, MoeMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  ModelConfig c = tiny_config(ModelFamily::qwen3_moe, {.hidden = 256, .heads = 4, .kv_heads = 2,
                                                       .head_dim = 128, .intermediate = 384,
                                                       .layers = 2, .vocab = 1000});
  c.moe->num_experts_per_tok = c.moe->num_experts;
  expect_step_matches_cpu(GetParam(), c);
}

// The grouped expert GEMMs (model/transformer_moe.cpp; fp8: hidden and Im multiples of 128, here
// 256 each): one gemm_fp8_grouped per projection and per DGrad on the GPU. Against the CPU as
// MoeMatchesCpu (k = E: every expert 464 rows, a partial 128-token tile each), and, in fp8 and bf16
// (gemm_bf16_grouped_*), against the GPU's per-expert loop (TransformerOptions::grouped_experts off)
// under top-2 routing: one sparse layer, so both runs route the same tokens (uneven experts),
// within the recipe's step tolerances.
TEST(ModelStepGpuFp8, MoeGroupedExpertsMatchCpuAndThePerExpertLoop) {
  LOCKSTEP_REQUIRE_GPU();
  const ModelConfig c = tiny_config(ModelFamily::qwen3_moe, {.hidden = 256, .heads = 4, .kv_heads = 2,
                                                             .head_dim = 128, .intermediate = 512,
                                                             .layers = 2, .vocab = 1000});
  ModelConfig every_expert = c;
  every_expert.moe->num_experts_per_tok = c.moe->num_experts;
  expect_step_matches_cpu(Recipe::fp8, every_expert);

  const ModelParameters init = random_parameters(c, 11);
  const TrainBatch host = pack(random_sequences({130, 1, 77, 256}, c.vocab_size, 12));
  const TrainBatch batch{host.tokens.to(Device::cuda), host.targets.to(Device::cuda), host.cu_seqlens.to(Device::cuda)};
  const Tensor dlogprob = random_tensor({host.tokens.numel()}, DType::f32, 13).to(Device::cuda);
  struct Run {
    Tensor logprob, expert_ids;
    ModelParameters grads;
  };
  for (Recipe recipe : {Recipe::fp8, Recipe::bf16}) {
    SCOPED_TRACE(recipe_name(recipe));
    auto run = [&](bool grouped) {
      Transformer model(c, init.copy_to(Device::cuda), recipe, {.grouped_experts = grouped});
      EXPECT_EQ(recipe == Recipe::fp8 ? model.grouped_fp8_experts() : model.grouped_bf16_experts(), grouped);
      TrainForward f = model.forward(batch);
      Run r{f.logprob.to(Device::cpu), f.routing[0].expert_ids, {}};
      model.backward(f, dlogprob, Tensor());
      r.grads = model.grads().copy_to(Device::cpu);
      return r;
    };
    const Run grouped = run(true), loop = run(false);
    ASSERT_TRUE(same_bytes(grouped.expert_ids, loop.expert_ids)) << "the sparse layer routed differently";
    const StepTolerance tol = step_tolerance(recipe);
    EXPECT_LE(rel_error(to_double(grouped.logprob), to_double(loop.logprob)), tol.logprob);
    const auto [grad_error, grad_name] = worst_rel_error(grouped.grads, loop.grads);
    EXPECT_LE(grad_error, tol.grads) << "worst gradient: " << grad_name;
  }
}

// Routing replay of the router's own choices on the GPU (top-2 of 8): the same logprobs and
// gradients, bit for bit, as without replay (moe_route_weights recomputes the forward's weights with
// the forward's operations), the router z-loss's gradient included.
TEST_P(ModelStepGpu, MoeReplayOfTheRoutersOwnChoicesGivesTheSameBits) {
  LOCKSTEP_REQUIRE_GPU();
  const ModelConfig c = tiny_config(ModelFamily::qwen3_moe, {.hidden = 256, .heads = 4, .kv_heads = 2,
                                                             .head_dim = 128, .intermediate = 384,
                                                             .layers = 3, .vocab = 1000});
  const ModelParameters init = random_parameters(c, 7);
  const TrainBatch batch = pack(random_sequences({130, 1, 77}, c.vocab_size, 8));
  const Tensor a = random_tensor({batch.tokens.numel()}, DType::f32, 9);
  auto run = [&](bool replay) {
    Transformer model(c, init.copy_to(Device::cuda), GetParam());
    TrainBatch b{batch.tokens.to(Device::cuda), batch.targets.to(Device::cuda), batch.cu_seqlens.to(Device::cuda), {}};
    if (replay) {
      const TrainForward own = model.forward(b, 1.0f, false);
      const int64_t T = b.tokens.numel(), k = c.moe->num_experts_per_tok;
      b.replay_experts = Tensor::empty({int64_t(own.routing.size()), T, k}, DType::i32);
      for (size_t l = 0; l < own.routing.size(); ++l)
        std::copy_n(own.routing[l].expert_ids.data_as<int32_t>(), T * k,
                    b.replay_experts.data_as<int32_t>() + int64_t(l) * T * k);
    }
    TrainForward f = model.forward(b);
    const std::vector<float> logprob = to_floats(f.logprob.to(Device::cpu));
    model.backward(f, a.to(Device::cuda), Tensor(), 0.1, 0.1);
    std::vector<std::vector<float>> grads;
    model.grads().for_each([&](const std::string&, const Tensor& g) { grads.push_back(to_floats(g.to(Device::cpu))); });
    return std::pair{logprob, grads};
  };
  EXPECT_EQ(run(false), run(true));
}

TEST_P(ModelStepGpu, MicroBatchesAccumulateTheSameGradients) {
  LOCKSTEP_REQUIRE_GPU();
  const Recipe recipe = GetParam();
  const ModelConfig c = gpu_tiny_config();
  const ModelParameters init = random_parameters(c, 4);
  const Sequences seqs = random_sequences({200, 64, 9, 300}, c.vocab_size, 6);
  const StepResult one = run_step(Device::cuda, recipe, c, init, seqs, seqs.size());
  const StepResult two = run_step(Device::cuda, recipe, c, init, seqs, 2);
  // Rows do not depend on the batch in the forward (same logprobs up to reduction order); the
  // gradients differ only by the order of the two accumulations and, in fp8, by the WGrad
  // operands' columnwise scales (groups of 128 tokens that now fall differently).
  EXPECT_LE(rel_error(to_double(two.logprob), to_double(one.logprob)), 1e-3);
  const auto [e, name] = worst_rel_error(two.grads, one.grads);
  EXPECT_LE(e, recipe == Recipe::bf16 ? 1e-2 : 1e-1) << name;
}

INSTANTIATE_TEST_SUITE_P(Recipes, ModelStepGpu, ::testing::Values(Recipe::bf16, Recipe::fp8),
                         [](const auto& info) { return std::string(recipe_name(info.param)); });

}  // namespace
}  // namespace lockstep::testing
