// DAPO's overlong penalty (train/overlong_penalty.h) against hand calculations: L_max = 20,
// buffer 4, factor 1 — no penalty up to 16 tokens, then −(L − 16)/4 up to −1 at 20 tokens.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/test_util.h"
#include "train/overlong_penalty.h"

namespace lockstep {
namespace {

using testing::expect_error;

TEST(OverlongPenalty, LinearOverTheBufferByHand) {
  EXPECT_EQ(overlong_penalty(0, 20, 4, 1.0), 0.0);
  EXPECT_EQ(overlong_penalty(16, 20, 4, 1.0), 0.0);  // L_max − buffer: the last free length
  EXPECT_DOUBLE_EQ(overlong_penalty(17, 20, 4, 1.0), -0.25);
  EXPECT_DOUBLE_EQ(overlong_penalty(18, 20, 4, 1.0), -0.5);
  EXPECT_DOUBLE_EQ(overlong_penalty(20, 20, 4, 1.0), -1.0);  // the longest allowed response
  EXPECT_DOUBLE_EQ(overlong_penalty(25, 20, 4, 1.0), -1.0);  // beyond: the full penalty, no more
  EXPECT_DOUBLE_EQ(overlong_penalty(19, 20, 4, 0.5), -0.375);  // factor 0.5 · 3/4
  EXPECT_DOUBLE_EQ(overlong_penalty(6, 6, 6, 2.0), -2.0);      // the buffer is the whole budget
}

TEST(OverlongPenalty, BadSettingsAreNamed) {
  expect_error([] { overlong_penalty(3, 20, 0, 1.0); }, "buffer = 0");
  expect_error([] { overlong_penalty(3, 20, 21, 1.0); }, "max_length = 20");
  expect_error([] { overlong_penalty(-1, 20, 4, 1.0); }, "length = -1");
  expect_error([] { overlong_penalty(3, 20, 4, -1.0); }, "factor = -1");
}

}  // namespace
}  // namespace lockstep
