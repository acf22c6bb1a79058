// train/optimizer.h: AdamW steps against hand calculations on a tiny parameter set, gradient-norm
// clipping, and the skipped step on a non-finite gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"
#include "train/optimizer.h"

namespace lockstep {
namespace {

using testing::expect_error;

// fp32 AdamW on values ≤ 2 rounds to ~2e-7: 1e-6 absolute on parameters, 1e-6 relative on the
// first moment. The second moment's 1 − β2 is 0.00099998713 in fp32 (0.999f is not 0.999):
// 1.3e-5 relative from the hand calculation's 0.001, so kTolV = 2e-5 there.
constexpr double kTol = 1e-6, kTolV = 2e-5;

Tensor tensor_of(std::vector<float> values, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  std::copy(values.begin(), values.end(), t.data_as<float>());
  return t;
}

std::vector<float> values_of(const Tensor& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

// A two-tensor "model": embed [2, 2] and final_norm [2] (every other tensor undefined).
ModelParameters tiny(std::vector<float> embed, std::vector<float> final_norm) {
  ModelParameters p;
  p.embed = tensor_of(std::move(embed), {2, 2});
  p.final_norm = tensor_of(std::move(final_norm), {2});
  return p;
}

ModelParameters tiny_params() { return tiny({0.5f, -1, 2, 0.25f}, {1, -0.5f}); }
// ‖g‖² = 0.01 + 0.04 + 0.09 + 0.16 + 0.25 + 0.0025 = 0.5525, ‖g‖ = 0.7433034.
ModelParameters tiny_grads() { return tiny({0.1f, -0.2f, 0.3f, 0.4f}, {-0.5f, 0.05f}); }

OptimizerConfig config(float max_grad_norm) {
  return {.beta1 = 0.9f,
          .beta2 = 0.999f,
          .eps = 1e-8f,
          .weight_decay = 0.1f,
          .max_grad_norm = max_grad_norm,
          .schedule = {.peak_lr = 0.01f}};
}

void expect_values(const Tensor& t, const std::vector<double>& expected, double rel, double abs) {
  const std::vector<float> v = values_of(t);
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_NEAR(v[i], expected[i], abs + rel * std::abs(expected[i])) << i;
}

// First step from zero moments: m = 0.1·g, v = 0.001·g², m̂ = g, v̂ = g², so
// p ← p − lr·(g/(|g| + 1e-8) + wd·p) = p − 0.01·(sign(g) + 0.1·p) (1e-8/|g| ≤ 2e-7 is below kTol):
//   embed      0.5 → 0.5 − 0.01·1.05 = 0.4895     −1 → −1 + 0.01·1.1 = −0.989
//              2 → 2 − 0.01·1.2 = 1.988           0.25 → 0.25 − 0.01·1.025 = 0.23975
//   final_norm 1 → 1 + 0.01·0.9 = 1.009           −0.5 → −0.5 − 0.01·0.95 = −0.5095
const std::vector<double> kEmbedAfterOne = {0.4895, -0.989, 1.988, 0.23975};
const std::vector<double> kNormAfterOne = {1.009, -0.5095};

TEST(AdamW, OneStepByHand) {
  ModelParameters params = tiny_params(), grads = tiny_grads();
  AdamW opt(params, config(0));
  const OptimizerStep s = opt.step(params, grads);
  EXPECT_TRUE(s.applied);
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_FLOAT_EQ(s.lr, 0.01f);
  EXPECT_NEAR(s.grad_norm, 0.7433034, 1e-7);
  EXPECT_EQ(s.clip_scale, 1.0f);
  expect_values(params.embed, kEmbedAfterOne, 0, kTol);
  expect_values(params.final_norm, kNormAfterOne, 0, kTol);
  expect_values(opt.first_moment().embed, {0.01, -0.02, 0.03, 0.04}, kTol, 0);
  expect_values(opt.first_moment().final_norm, {-0.05, 0.005}, kTol, 0);
  expect_values(opt.second_moment().embed, {1e-5, 4e-5, 9e-5, 1.6e-4}, kTolV, 0);
  expect_values(opt.second_moment().final_norm, {2.5e-4, 2.5e-6}, kTolV, 0);
  // Gradients are zeroed for the next accumulation.
  for (float g : values_of(grads.embed)) EXPECT_EQ(g, 0.0f);
  for (float g : values_of(grads.final_norm)) EXPECT_EQ(g, 0.0f);
}

TEST(AdamW, ClippingScalesTheGradient) {
  // max_grad_norm 0.5 < ‖g‖: clip = 0.5/(0.7433034 + 1e-6) = 0.6726719, which shows in the
  // moments (m = 0.1·clip·g, v = 0.001·clip²·g²). The first step itself is scale-invariant
  // (m̂/sqrt(v̂) = sign(g)), so the parameters match the unclipped step.
  ModelParameters params = tiny_params(), grads = tiny_grads();
  AdamW opt(params, config(0.5f));
  const OptimizerStep s = opt.step(params, grads);
  EXPECT_NEAR(s.clip_scale, 0.6726719, 1e-6);
  EXPECT_NEAR(s.grad_norm, 0.7433034, 1e-7);
  expect_values(opt.first_moment().embed, {0.0067267, -0.0134534, 0.0201802, 0.0269069}, 1e-5, 0);
  expect_values(opt.second_moment().final_norm, {1.1312187e-4, 1.1312187e-6}, kTolV, 0);
  expect_values(params.embed, kEmbedAfterOne, 0, kTol);

  // Below the threshold nothing is scaled.
  ModelParameters p2 = tiny_params(), g2 = tiny_grads();
  AdamW opt2(p2, config(1.0f));
  EXPECT_EQ(opt2.step(p2, g2).clip_scale, 1.0f);
  expect_values(opt2.first_moment().embed, {0.01, -0.02, 0.03, 0.04}, kTol, 0);
}

TEST(AdamW, TwoStepsFollowTheScheduleAndBiasCorrection) {
  // Warm-up over 2 steps to 0.01, as LambdaLR: lr 0, then 0.005. With the same gradient twice,
  // m = 0.19·g, v = 0.001999·g² and the bias corrections 1 − 0.81, 1 − 0.998001 give m̂ = g,
  // v̂ = g² again. Step 1 at lr 0 leaves the parameters (weight decay is lr-scaled too); step 2
  // is p ← p − 0.005·(sign(g) + 0.1·p):
  //   0.5 → 0.5 − 0.005·1.05 = 0.49475;  −1 → −0.9945;  2 → 1.994;  0.25 → 0.244875
  //   1 → 1.0045;  −0.5 → −0.50475
  ModelParameters params = tiny_params();
  OptimizerConfig c = config(0);
  c.schedule.warmup_steps = 2;
  AdamW opt(params, c);
  ModelParameters grads = tiny_grads();
  EXPECT_EQ(opt.step(params, grads).lr, 0.0f);
  expect_values(params.embed, {0.5, -1, 2, 0.25}, 0, 0);
  grads = tiny_grads();
  const OptimizerStep s = opt.step(params, grads);
  EXPECT_EQ(s.step, 2);
  EXPECT_FLOAT_EQ(s.lr, 0.005f);
  expect_values(params.embed, {0.49475, -0.9945, 1.994, 0.244875}, 0, kTol);
  expect_values(params.final_norm, {1.0045, -0.50475}, 0, kTol);
}

TEST(AdamW, NonFiniteGradientSkipsTheStepAndIsNamed) {
  ModelParameters params = tiny_params(), grads = tiny_grads();
  AdamW opt(params, config(1.0f));
  grads.final_norm.data_as<float>()[1] = INFINITY;
  const OptimizerStep s = opt.step(params, grads);
  EXPECT_FALSE(s.applied);
  EXPECT_EQ(s.nonfinite_grad, "final_norm");
  EXPECT_FALSE(std::isfinite(s.grad_norm));
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_EQ(values_of(params.embed), values_of(tiny_params().embed));
  EXPECT_EQ(values_of(params.final_norm), values_of(tiny_params().final_norm));
  for (float m : values_of(opt.first_moment().embed)) EXPECT_EQ(m, 0.0f);
  for (float g : values_of(grads.final_norm)) EXPECT_EQ(g, 0.0f);  // zeroed even when skipped

  // The first non-finite tensor in for_each order is named (embed comes before final_norm).
  grads = tiny_grads();
  grads.embed.data_as<float>()[2] = NAN;
  grads.final_norm.data_as<float>()[0] = -INFINITY;
  EXPECT_EQ(opt.step(params, grads).nonfinite_grad, "embed");

  // The next good step is step 1 (bias correction from the start): the one-step result.
  grads = tiny_grads();
  const OptimizerStep good = opt.step(params, grads);
  EXPECT_TRUE(good.applied);
  EXPECT_EQ(good.step, 1);
  expect_values(params.embed, kEmbedAfterOne, 0, kTol);
}

TEST(AdamW, MismatchedTensorsAreNamed) {
  ModelParameters params = tiny_params();
  AdamW opt(params, config(1.0f));
  ModelParameters grads = tiny_grads();
  grads.final_norm = Tensor();
  expect_error([&] { opt.step(params, grads); }, "grads has 1 tensors");
  grads = tiny_grads();
  grads.final_norm = Tensor::zeros({3}, DType::f32);
  expect_error([&] { opt.step(params, grads); }, "grads final_norm");
  EXPECT_THROW(AdamW(params, config(-1.0f)), Error);
}

}  // namespace
}  // namespace lockstep
