// The model's backward: every parameter tensor's gradient against finite differences of the fp32
// model, and the bf16 and fp8 recipes' gradients against the fp32 ones.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "model/transformer.h"
#include "tests/model/model_test_util.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::pack;
using testing::random_parameters;
using testing::random_sequences;
using testing::tiny_config;

Tensor random_weights(int64_t n, uint64_t seed) {
  return testing::random_tensor({n}, DType::f32, seed);
}

// L = Σ_t a[t]·logprob[t] + b[t]·entropy[t], in double.
double objective(Transformer& model, const TrainBatch& batch, const Tensor& a, const Tensor& b,
                 float temperature) {
  const TrainForward f = model.forward(batch, temperature, /*for_backward=*/false);
  double sum = 0;
  for (int64_t t = 0; t < a.numel(); ++t)
    sum += double(a.data_as<float>()[t]) * f.logprob.data_as<float>()[t] +
           double(b.data_as<float>()[t]) * f.entropy.data_as<float>()[t];
  return sum;
}

std::map<std::string, Tensor> by_name(ModelParameters& p) {
  std::map<std::string, Tensor> m;
  p.for_each([&](const std::string& name, Tensor& t) { m[name] = t; });
  return m;
}

class FiniteDifferences : public ::testing::TestWithParam<ModelFamily> {};

// For every parameter tensor θ and a random direction v of its shape, the directional derivative
// Σ ∂L/∂θ · v equals the fourth-order central difference
//   (−L(θ+2hv) + 8L(θ+hv) − 8L(θ−hv) + L(θ−2hv)) / 12h.
TEST_P(FiniteDifferences, EveryParameterTensorInFp32) {
  const ModelFamily family = GetParam();
  const ModelConfig config = tiny_config(family, {.tied = family == ModelFamily::qwen3});
  Transformer model(config, random_parameters(config, 1), Recipe::fp32);
  const TrainBatch batch = pack(random_sequences({5, 1, 9}, config.vocab_size, 2));
  const int64_t t = batch.tokens.numel();
  const Tensor a = random_weights(t, 3), b = random_weights(t, 4);
  const float temperature = 0.8f;

  TrainForward f = model.forward(batch, temperature);
  model.backward(f, a, b);
  std::map<std::string, Tensor> grads = by_name(model.grads());

  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  int checked = 0;
  model.params().for_each([&](const std::string& name, Tensor& theta) {
    const Tensor saved = theta.to(Device::cpu);
    std::vector<float> v(size_t(theta.numel()));
    double analytic = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = normal(rng);
      analytic += double(grads.at(name).data_as<float>()[i]) * v[i];
    }
    const float h = 3e-3f;
    auto at = [&](float step) {
      for (size_t i = 0; i < v.size(); ++i)
        theta.data_as<float>()[i] = saved.data_as<float>()[i] + step * v[i];
      model.refresh_weights();
      return objective(model, batch, a, b, temperature);
    };
    const double numeric =
        (-at(2 * h) + 8 * at(h) - 8 * at(-h) + at(-2 * h)) / (12.0 * double(h));
    theta.copy_from(saved);
    model.refresh_weights();
    // Measured: fp32 forward noise over 12h gives ~1e-3 absolute, the O(h⁴) truncation ≤ 4e-4
    // relative (h = 1e-2 gives 1e-2 relative, h = 1e-3 2e-3 absolute noise). A missing or wrong
    // gradient term is off by far more.
    EXPECT_NEAR(numeric, analytic, 1e-3 * std::abs(analytic) + 2e-3) << name;
    ++checked;
  });
  EXPECT_EQ(checked, int(grads.size()));
}

// The gradients of the bf16 and fp8 recipes against the fp32 recipe's, tensor by tensor, as
// ‖g − g_fp32‖ / ‖g_fp32‖, for an SFT-style loss (mean −logprob) plus an entropy term; at widths
// that are multiples of 128, and (partial_blocks) of 16 only, where fp8 has partial 128-groups.
class RecipeGradients : public ::testing::TestWithParam<bool> {};

TEST_P(RecipeGradients, CloseToFp32) {
  const ModelConfig config =
      GetParam() ? testing::partial_blocks_config(ModelFamily::qwen3)
                 : tiny_config(ModelFamily::qwen3, {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64,
                                                    .intermediate = 256, .layers = 2, .vocab = 301});
  const ModelParameters params = random_parameters(config, 21);
  const TrainBatch batch = pack(random_sequences({40, 17, 71}, config.vocab_size, 22));
  const int64_t t = batch.tokens.numel();
  Tensor a = Tensor::empty({t}, DType::f32), b = Tensor::empty({t}, DType::f32);
  for (int64_t i = 0; i < t; ++i) {
    a.data_as<float>()[i] = -1.0f / float(t);
    b.data_as<float>()[i] = 0.01f;
  }
  auto gradients = [&](Recipe recipe) {
    Transformer model(config, params.copy_to(Device::cpu), recipe);
    TrainForward f = model.forward(batch);
    model.backward(f, a, b);
    return by_name(model.grads());
  };
  auto reference = gradients(Recipe::fp32);
  // bf16: activations and gradients rounded to bf16 (≤ 2^-8 relative) between every op, two
  // layers: measured 1.3e-2 .. 2.2e-2 per tensor. fp8: every linear layer's operands in E4M3
  // (3 mantissa bits: 16x coarser than bf16), forward and backward: measured 1.2e-1 .. 2.3e-1,
  // uniformly over the tensors (a layout or scale bug gives errors of order 1).
  for (auto [recipe, tolerance] : {std::pair{Recipe::bf16, 4e-2}, std::pair{Recipe::fp8, 3e-1}}) {
    double worst = 0;
    for (auto& [name, g] : gradients(recipe)) {
      const double e = testing::rel_error(testing::to_double(g), testing::to_double(reference.at(name)));
      EXPECT_LE(e, tolerance) << recipe_name(recipe) << " " << name;
      worst = std::max(worst, e);
    }
    std::printf("%s: worst gradient error vs fp32 %.2e\n", std::string(recipe_name(recipe)).c_str(), worst);
  }
}

// Recomputing the linear layers' cheap inputs in the backward gives the same gradients, bit for
// bit, in fp32 and bf16 (and the forward's results do not change); fp8 also keeps the SwiGLU input
// in E4M3, so its gradients move by quantization noise. (partial_blocks: widths with partial fp8
// 128-groups, I = 320, 2I a multiple of 128 as the E4M3 SwiGLU input needs.)
class Recompute : public ::testing::TestWithParam<bool> {};

TEST_P(Recompute, SameGradientsBitForBit) {
  const ModelConfig config =
      GetParam() ? testing::partial_blocks_config(ModelFamily::llama)
                 : tiny_config(ModelFamily::llama, {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64,
                                                    .intermediate = 256, .layers = 2, .vocab = 101});
  const ModelParameters params = random_parameters(config, 31);
  const TrainBatch batch = pack(random_sequences({30, 9, 50}, config.vocab_size, 32));
  const int64_t t = batch.tokens.numel();
  Tensor a = Tensor::empty({t}, DType::f32), b = Tensor::empty({t}, DType::f32);
  for (int64_t i = 0; i < t; ++i) {
    a.data_as<float>()[i] = -1.0f / float(t);
    b.data_as<float>()[i] = 0.01f;
  }
  for (Recipe recipe : {Recipe::fp32, Recipe::bf16, Recipe::fp8}) {
    auto run = [&](bool recompute) {
      Transformer model(config, params.copy_to(Device::cpu), recipe);
      model.set_recompute(recompute);
      TrainForward f = model.forward(batch);
      const std::vector<float> logprob = testing::to_floats(f.logprob);
      model.backward(f, a, b);
      return std::pair{logprob, by_name(model.grads())};
    };
    const auto [lp_saved, g_saved] = run(false);
    const auto [lp_recomputed, g_recomputed] = run(true);
    EXPECT_EQ(lp_saved, lp_recomputed) << recipe_name(recipe);
    double worst = 0;
    for (const auto& [name, g] : g_saved) {
      if (recipe != Recipe::fp8) {
        EXPECT_EQ(testing::to_floats(g), testing::to_floats(g_recomputed.at(name)))
            << recipe_name(recipe) << " " << name;
        continue;
      }
      // fp8 recomputes from the E4M3 SwiGLU input: each gate/up value moves by up to half an E4M3
      // step (≤ 6%, ~2% typical), and the MLP's and earlier layers' gradients with it.
      const double e = testing::rel_error(testing::to_double(g_recomputed.at(name)), testing::to_double(g));
      EXPECT_LE(e, 0.15) << name;
      worst = std::max(worst, e);
    }
    // (Tensors whose gradients are complete before the last layer's SwiGLU backward — the LM
    // head, the final norm — are equal; the MLPs' are not.)
    if (recipe == Recipe::fp8) {
      EXPECT_GT(worst, 0.0) << "the fp8 path did not use the E4M3 SwiGLU input";
    }
  }
}

const auto kPartialName = [](const auto& info) { return std::string(info.param ? "partial_blocks" : "whole_blocks"); };
INSTANTIATE_TEST_SUITE_P(Widths, RecipeGradients, ::testing::Bool(), kPartialName);
INSTANTIATE_TEST_SUITE_P(Widths, Recompute, ::testing::Bool(), kPartialName);

INSTANTIATE_TEST_SUITE_P(Families, FiniteDifferences,
                         ::testing::Values(ModelFamily::qwen3, ModelFamily::qwen2,
                                           ModelFamily::llama),
                         [](const auto& info) {
                           return std::string(model_type_name(info.param));
                         });

}  // namespace
}  // namespace lockstep
