// train/schedule.h: learning rates at the phase boundaries, against hand calculations.
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/schedule.h"

namespace lockstep {
namespace {

// Computed in double, returned as float: 1e-7 relative.
void expect_lr(const LrSchedule& s, int64_t step, double expected) {
  EXPECT_NEAR(s.lr(step), expected, 1e-7 * expected) << "step " << step;
}

TEST(LrSchedule, ConstantWithWarmup) {
  const LrSchedule s{.peak_lr = 1e-3f, .warmup_steps = 4};
  expect_lr(s, 1, 2.5e-4);  // 1/4 of the peak
  expect_lr(s, 2, 5e-4);
  expect_lr(s, 4, 1e-3);  // the last warm-up step reaches the peak
  expect_lr(s, 5, 1e-3);
  expect_lr(s, 100000, 1e-3);
  expect_lr(LrSchedule{.peak_lr = 3e-6f}, 1, 3e-6);  // no warm-up
}

TEST(LrSchedule, CosineAfterWarmup) {
  // Warm-up 10 to peak 1, cosine to 0.1 at step 110: lr = 0.1 + 0.45·(1 + cos(π·(step − 10)/100)).
  const LrSchedule s{.kind = LrSchedule::Kind::cosine,
                     .peak_lr = 1.0f,
                     .warmup_steps = 10,
                     .total_steps = 110,
                     .min_lr = 0.1f};
  expect_lr(s, 1, 0.1);         // warm-up from 0: 1/10 of the peak
  expect_lr(s, 10, 1.0);        // cos(0)
  expect_lr(s, 11, 0.9997780);  // 0.1 + 0.45·(1 + cos(0.01π)) = 0.1 + 0.45·1.9995066
  expect_lr(s, 35, 0.8681981);  // 0.1 + 0.45·(1 + cos(π/4)) = 0.1 + 0.45·1.7071068
  expect_lr(s, 60, 0.55);       // cos(π/2) = 0: halfway
  expect_lr(s, 110, 0.1);       // cos(π) = −1
  expect_lr(s, 111, 0.1);
  expect_lr(s, 5000, 0.1);
}

TEST(LrSchedule, CosineWithNoDecayPhase) {
  const LrSchedule s{.kind = LrSchedule::Kind::cosine,
                     .peak_lr = 2.0f,
                     .warmup_steps = 5,
                     .total_steps = 5,
                     .min_lr = 0.5f};
  expect_lr(s, 5, 2.0);
  expect_lr(s, 6, 0.5);
}

TEST(LrSchedule, BadSettingsAreNamed) {
  EXPECT_THROW(LrSchedule{}.lr(0), Error);
  EXPECT_THROW((LrSchedule{.warmup_steps = -1}.lr(1)), Error);
  const LrSchedule short_total{.kind = LrSchedule::Kind::cosine,
                               .peak_lr = 1.0f,
                               .warmup_steps = 10,
                               .total_steps = 5};
  EXPECT_THROW(short_total.lr(11), Error);
  const LrSchedule min_above_peak{
      .kind = LrSchedule::Kind::cosine, .peak_lr = 1.0f, .total_steps = 10, .min_lr = 2.0f};
  EXPECT_THROW(min_above_peak.lr(1), Error);
}

}  // namespace
}  // namespace lockstep
