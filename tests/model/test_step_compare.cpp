// tests/model/test_step_compare.cpp — the GPU model-step check (step_compare.h, used by
// ModelStepGpu.* in test_model_gpu) on the planted bug it must catch, here on the CPU: an optimizer
// step that leaves the weights as they were, in every tensor or in one. The weight comparison alone
// lets a tensor through whose step is smaller than its tolerance (the norms'); the update's fails.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "model_test_util.h"
#include "ops/adamw.h"
#include "step_compare.h"

namespace lockstep::testing {
namespace {

// The parameters after one AdamW step from `init` with random gradients, as ModelStepGpu takes it
// (first step, weight decay 0.1): each element moves by about lr.
ModelParameters one_adamw_step(const ModelConfig& c, const ModelParameters& init) {
  ModelParameters p = init.copy_to(Device::cpu), m = ModelParameters::zeros(c),
                  v = ModelParameters::zeros(c);
  const ModelParameters g = random_parameters(c, 11);
  std::vector<Tensor*> ps, ms, vs;
  std::vector<const Tensor*> gs;
  p.for_each([&](const std::string&, Tensor& t) { ps.push_back(&t); });
  m.for_each([&](const std::string&, Tensor& t) { ms.push_back(&t); });
  v.for_each([&](const std::string&, Tensor& t) { vs.push_back(&t); });
  g.for_each([&](const std::string&, const Tensor& t) { gs.push_back(&t); });
  AdamWHyper hyper;
  hyper.weight_decay = 0.1f;
  for (size_t i = 0; i < ps.size(); ++i) adamw_step(*ps[i], *ms[i], *vs[i], *gs[i], hyper, 1, 1.0f);
  return p;
}

TEST(StepCompare, ATensorLeftUnchangedFailsTheUpdateCheck) {
  const ModelConfig c = gpu_tiny_config();  // ModelStepGpu.MatchesCpu's model and weights
  const ModelParameters init = random_parameters(c, 3);
  const ModelParameters stepped = one_adamw_step(c, init);
  const StepTolerance tol = step_tolerance(Recipe::fp8);

  const StepErrors same = step_errors(stepped, stepped, init);
  EXPECT_EQ(same.weights.first, 0.0);
  EXPECT_EQ(same.update.first, 0.0);

  // The planted bug: no tensor updated. The update is off by all of it.
  const StepErrors none = step_errors(init, stepped, init);
  EXPECT_DOUBLE_EQ(none.update.first, 1.0);
  EXPECT_GT(none.update.first, tol.update);

  // Only final_norm left as it was (weights near 1, moved by lr = 0.1% of them): its weights are
  // well within fp8's weight tolerance; the update check fails and names it.
  ModelParameters one_missed = stepped.copy_to(Device::cpu);
  std::vector<const Tensor*> before;
  init.for_each([&](const std::string&, const Tensor& t) { before.push_back(&t); });
  size_t i = 0;
  one_missed.for_each([&](const std::string& name, Tensor& t) {
    if (name == "final_norm") t.copy_from(*before[i]);
    ++i;
  });
  const StepErrors missed = step_errors(one_missed, stepped, init);
  EXPECT_LE(missed.weights.first, tol.weights);
  EXPECT_DOUBLE_EQ(missed.update.first, 1.0);
  EXPECT_GT(missed.update.first, tol.update);
  EXPECT_EQ(missed.update.second, "final_norm");
}

}  // namespace
}  // namespace lockstep::testing
