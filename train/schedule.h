// train/schedule.h — the learning rate of optimizer step `step` (counting from 1, as
// ops/adamw.h's step):
//
//   warm-up, step ≤ warmup_steps:   lr = peak_lr · step / warmup_steps   (linear from 0)
//   constant, after the warm-up:    lr = peak_lr
//   cosine, after the warm-up:      lr = min_lr + (peak_lr − min_lr) · (1 + cos(π·p)) / 2,
//                                   p = (step − warmup_steps) / (total_steps − warmup_steps),
//                                   and lr = min_lr once step ≥ total_steps
//
// So the cosine goes from peak_lr at the last warm-up step to min_lr at total_steps. Computed in
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
