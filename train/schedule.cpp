// train/schedule.cpp
#include "train/schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace lockstep {

float LrSchedule::lr(int64_t step) const {
  LOCKSTEP_CHECK(step >= 1, "LrSchedule: step counts from 1, got ", step);
  LOCKSTEP_CHECK(std::isfinite(peak_lr) && peak_lr >= 0, "LrSchedule: peak_lr = ", peak_lr,
                 " (must be finite and non-negative)");
  LOCKSTEP_CHECK(warmup_steps >= 0, "LrSchedule: warmup_steps = ", warmup_steps,
                 " (must be non-negative)");
  const int64_t i = step - 1;  // LambdaLR's index of this step
  if (i < warmup_steps) return float(double(peak_lr) * double(i) / double(warmup_steps));
  if (kind == Kind::constant) return peak_lr;
  LOCKSTEP_CHECK(total_steps >= warmup_steps, "LrSchedule: total_steps = ", total_steps,
                 " is less than warmup_steps = ", warmup_steps);
  LOCKSTEP_CHECK(min_lr >= 0 && min_lr <= peak_lr, "LrSchedule: min_lr = ", min_lr,
                 " (must be in [0, peak_lr = ", peak_lr, "])");
  if (i >= total_steps) return min_lr;
  const double p = double(i - warmup_steps) / double(total_steps - warmup_steps);
  return float(min_lr + (double(peak_lr) - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
}

}  // namespace lockstep
