// train/optimizer.h — AdamW over a whole model: fp32 first and second moments for every parameter
// tensor, global gradient-norm clipping, a skipped step on a non-finite gradient, and the learning
// rate from a schedule. step(params, grads):
//
//   1. ‖g‖ = sqrt(Σ over the gradient tensors of ops/elementwise.h's sum_squares), in double.
//   2. A non-finite ‖g‖ skips the step: parameters, moments and the step count stay as they were,
//      and the result names the first tensor (ModelParameters::for_each order) whose gradient holds
//      a non-finite value.
//   3. clip = min(1, max_grad_norm / (‖g‖ + 1e-6)) (torch.nn.utils.clip_grad_norm_'s factor), or 1
//      when max_grad_norm is 0.
//   4. Every tensor takes ops/adamw.h's adamw_step with grad_scale = clip, step = the number of
//      applied steps including this one, lr = schedule.lr(step), writing in the same pass the
//      weight copies `copies(name)` gives (the bf16 / fp8 copies the model's GEMMs read).
//   5. The gradients are zeroed, after a skipped step too (they are the next step's accumulator).
//
// Without `copies` the caller then rebuilds the copies (Transformer::refresh_weights). Works
// wherever the tensors live: it only calls ops (on CUDA each sum_squares returns one double, so
// step 1 synchronizes once per tensor).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "model/parameters.h"
#include "ops/adamw.h"
#include "train/schedule.h"

namespace lockstep {

struct OptimizerConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // verl's default; applied to every tensor
  float max_grad_norm = 1.0f;  // 0: no clipping
  LrSchedule schedule;
};

struct OptimizerStep {
  bool applied = false;
  int64_t step = 0;            // the applied step's number (0 when skipped)
  float lr = 0;                // its learning rate (0 when skipped)
  double grad_norm = 0;        // ‖g‖ before clipping; non-finite when skipped
  float clip_scale = 1;        // the factor the gradients were multiplied by
  std::string nonfinite_grad;  // the first tensor with a non-finite gradient, when skipped
  // The weight hand-over's share of the step: a sharded optimizer's all-gathers of the updated
  // weights (train/sharded_optimizer.h); 0 where the update pass writes the copies in place.
  double handover_seconds = 0;
};

// The rules of one optimizer step, from the per-tensor sums of squared gradients Σg² (`names[i]`
// names tensor i), shared by AdamW and the sharded optimizer (train/sharded_optimizer.h): a
// non-finite sum skips the step (grad_norm = that sum, nonfinite_grad = its name, step 0); else
// grad_norm = √Σ, clip_scale = min(1, max_grad_norm / (grad_norm + 1e-6)) unless clipping is off,
// step = steps_done + 1 and lr = the schedule's. `applied` is left to the caller.
OptimizerStep plan_optimizer_step(const OptimizerConfig& config, int64_t steps_done,
                                  std::span<const double> sums, std::span<const std::string> names);
// ops/adamw.h's hyper-parameters of a step at `lr`.
AdamWHyper adamw_hyper(const OptimizerConfig& config, float lr);

class AdamW {
 public:
  // Zero moments of the shapes and devices of `params` (f32 masters).
  AdamW(const ModelParameters& params, const OptimizerConfig& config);

  // `params` and `grads` have the tensors (names and shapes) of the constructor's `params`.
  using CopiesOf = std::function<WeightCopies(const std::string& name)>;
  OptimizerStep step(ModelParameters& params, ModelParameters& grads, const CopiesOf& copies = {});

  int64_t steps() const { return steps_; }  // applied steps so far
  const ModelParameters& first_moment() const { return m_; }
  const ModelParameters& second_moment() const { return v_; }
  // Continues from a saved state (a checkpoint): moments of the same tensors, and the step count.
  void load_state(const ModelParameters& m, const ModelParameters& v, int64_t steps);

 private:
  OptimizerConfig config_;
  ModelParameters m_, v_;
  int64_t steps_ = 0;
};

}  // namespace lockstep
