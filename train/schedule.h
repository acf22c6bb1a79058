// train/schedule.h — the learning rate of optimizer step `step` (counting from 1, as
// ops/adamw.h's step), as Hugging Face's get_constant_schedule_with_warmup and
// get_cosine_schedule_with_warmup compute it under torch's LambdaLR. LambdaLR gives the k-th
// optimizer.step() (k from 1) the factor lambda(k − 1): scheduler.step() runs after each optimizer
// step, so the first step reads lambda(0). With i = step − 1:
//
//   warm-up, i < warmup_steps:   lr = peak_lr · i / warmup_steps   (the first step at lr 0)
//   constant, after the warm-up: lr = peak_lr
//   cosine, after the warm-up:   lr = min_lr + (peak_lr − min_lr) · (1 + cos(π·p)) / 2,
//                                p = (i − warmup_steps) / (total_steps − warmup_steps)
//                                (min_lr = 0: HF's cosine; min_lr > 0: verl's min_lr_ratio form)
//
// So step warmup_steps + 1 is the first at peak_lr, and the cosine's last step (i =
// total_steps − 1) sits one step above min_lr instead of wasting a step at lr = min_lr. Past
// total_steps, p goes on growing (HF's cosine rises again; here lr stays at min_lr). Computed in
// double, returned as float.
#pragma once

#include <cstdint>

namespace lockstep {

struct LrSchedule {
  enum class Kind { constant, cosine };
  Kind kind = Kind::constant;
  float peak_lr = 1e-6f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // cosine only: ≥ warmup_steps
  float min_lr = 0.0f;      // cosine only: in [0, peak_lr]

  float lr(int64_t step) const;
};

}  // namespace lockstep
