// The GRPO loop on the GPU skips a step whose gradient is not finite, as on the CPU
// (tests/rl/test_grpo_update.cpp, TrainLoop.MaxSkippedStepsStopsTheRun): a NaN planted in a GPU
// gradient before the optimizer step of step 2 marks it skipped, leaves every weight as step 1 left
// it (bit for bit), and the run goes on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "rl/train.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<uint8_t>> host_bytes(const ModelParameters& p) {
  std::vector<std::vector<uint8_t>> out;
  p.for_each([&](const std::string&, const Tensor& t) {
    const Tensor h = t.to(Device::cpu);
    const auto* b = static_cast<const uint8_t*>(h.data());
    out.emplace_back(b, b + h.nbytes());
  });
  return out;
}

TEST(TrainLoopGpu, NonFiniteGradientSkipsTheStep) {
  if (!cuda_device_available()) GTEST_SKIP() << "no GPU";
  const fs::path dir = fs::temp_directory_path() / "lockstep_test_train_gpu_nonfinite";
  fs::remove_all(dir);
  Config c;
  c.model.device = "cuda";
  c.model.builtin_layers = 1;
  c.sft.steps = 0;
  c.run.steps = 3;
  c.run.eval_every = 0;
  c.run.eval_problems = 4;
  c.run.checkpoint_every = -1;
  c.run.out_dir = dir.string();
  c.rollout.prompts_per_step = 4;
  c.rollout.samples_per_prompt = 4;
  c.rollout.max_new_tokens = 4;
  for (const char* precision : {"fp8", "bf16"}) {
    SCOPED_TRACE(precision);
    c.model.precision = precision;
    fs::remove_all(dir);
    int optimizer_steps = 0;
    std::vector<std::vector<std::vector<uint8_t>>> weights;  // after each step
    TrainHooks hooks;
    hooks.before_optimizer_step = [&](ModelParameters& grads) {
      ASSERT_EQ(grads.final_norm.device(), Device::cuda);
      if (++optimizer_steps != 2) return;
      const float nan = NAN;
      device_copy(grads.final_norm.data(), Device::cuda, &nan, Device::cpu, sizeof nan);
    };
    hooks.after_step = [&](int64_t, const ModelParameters& params) { weights.push_back(host_bytes(params)); };
    run_train(c, hooks);
    ASSERT_EQ(weights.size(), 3u);
    EXPECT_EQ(weights[1], weights[0]);  // step 2 skipped: nothing moved
    EXPECT_NE(weights[2], weights[1]);  // step 3 trained
    std::ifstream in(dir / "metrics.jsonl");
    std::vector<double> skipped;
    for (std::string line; std::getline(in, line);)
      skipped.push_back(nlohmann::json::parse(line)["skipped"].get<double>());
    EXPECT_EQ(skipped, (std::vector<double>{0, 1, 0}));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
