// Philox4x32-10 against the known-answer vectors published with Random123 (kat_vectors).
#include <gtest/gtest.h>

#include "core/philox.h"

namespace lockstep {
namespace {

void expect_philox(Philox4 ctr, PhiloxKey key, Philox4 expected) {
  const Philox4 out = philox4x32_10(ctr, key);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], expected.v[i]) << "word " << i;
}

TEST(Philox, KnownAnswers) {
  expect_philox({{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}});
  expect_philox({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}},
                {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}});
  expect_philox({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}},
                {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}});
}

TEST(Philox, UniformIsInHalfOpenUnitInterval) {
  EXPECT_GT(philox_uniform(0), 0.0f);
  EXPECT_EQ(philox_uniform(0xffffffffu), 1.0f);
  double sum = 0;
  const int n = 1 << 16;
  for (int i = 0; i < n; ++i) sum += philox_uniform(philox_at(7, 3, uint64_t(i)).v[0]);
  EXPECT_NEAR(sum / n, 0.5, 0.01);  // 0.5 ± ~4.5 standard errors (1/sqrt(12 n) = 0.0011)
}

TEST(Philox, StreamsAndPositionsAreDistinct) {
  const Philox4 a = philox_at(1, 0, 1), b = philox_at(1, 1, 0), c = philox_at(2, 0, 1);
  EXPECT_NE(a.v[0], b.v[0]);
  EXPECT_NE(a.v[0], c.v[0]);
}

}  // namespace
}  // namespace lockstep
