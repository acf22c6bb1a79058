// train/schedule.h: learning rates at the phase boundaries, against hand calculations of Hugging
// Face's get_{constant,cosine}_schedule_with_warmup under torch's LambdaLR (optimizer step k reads
// lambda(k − 1)).
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
  EXPECT_EQ(s.lr(1), 0.0f);  // lambda(0) = 0/4: LambdaLR's first step
  expect_lr(s, 2, 2.5e-4);   // lambda(1) = 1/4
  expect_lr(s, 4, 7.5e-4);   // lambda(3) = 3/4, the last warm-up step
  expect_lr(s, 5, 1e-3);     // lambda(4) = 1: the first step at the peak
  expect_lr(s, 100000, 1e-3);
  expect_lr(LrSchedule{.peak_lr = 3e-6f}, 1, 3e-6);  // no warm-up
}

TEST(LrSchedule, CosineAfterWarmup) {
  // Warm-up 10 to peak 1, 110 steps in all, cosine towards 0.1:
  // lr(step) = 0.1 + 0.45·(1 + cos(π·(step − 1 − 10)/100)).
  const LrSchedule s{.kind = LrSchedule::Kind::cosine,
                     .peak_lr = 1.0f,
                     .warmup_steps = 10,
                     .total_steps = 110,
                     .min_lr = 0.1f};
  EXPECT_EQ(s.lr(1), 0.0f);     // lambda(0): the warm-up starts at 0
  expect_lr(s, 2, 0.1);         // 1/10 of the peak
  expect_lr(s, 10, 0.9);        // 9/10: the last warm-up step
  expect_lr(s, 11, 1.0);        // cos(0)
  expect_lr(s, 12, 0.9997780);  // 0.1 + 0.45·(1 + cos(0.01π)) = 0.1 + 0.45·1.9995066
  expect_lr(s, 36, 0.8681981);  // 0.1 + 0.45·(1 + cos(π/4)) = 0.1 + 0.45·1.7071068
  expect_lr(s, 61, 0.55);       // cos(π/2) = 0: halfway
  // The last of the 110 steps: 0.1 + 0.45·(1 + cos(0.99π)) = 0.1 + 0.45·0.00049344 = 0.10022205,
  // not a wasted step at min_lr.
  expect_lr(s, 110, 0.10022205);
  expect_lr(s, 111, 0.1);  // past the schedule: min_lr
  expect_lr(s, 5000, 0.1);
  // HF's cosine (min_lr 0) over 4 steps, no warm-up: 1, (1 + cos(π/4))/2, 1/2, (1 + cos(3π/4))/2.
  const LrSchedule hf{.kind = LrSchedule::Kind::cosine, .peak_lr = 1.0f, .total_steps = 4};
  expect_lr(hf, 1, 1.0);
  expect_lr(hf, 2, 0.8535534);
  expect_lr(hf, 3, 0.5);
  expect_lr(hf, 4, 0.14644661);
}

TEST(LrSchedule, CosineWithNoDecayPhase) {
  const LrSchedule s{.kind = LrSchedule::Kind::cosine,
                     .peak_lr = 2.0f,
                     .warmup_steps = 5,
                     .total_steps = 5,
                     .min_lr = 0.5f};
  expect_lr(s, 5, 1.6);  // 4/5 of the peak
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
