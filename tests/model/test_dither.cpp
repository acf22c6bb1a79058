// dither_within_bf16_rounding: masters on the bf16 grid move off it, each within its own bf16
// rounding (checked against core/dtypes.h's round_to_bf16), norms and biases untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtypes.h"
#include "model/parameters.h"
#include "tests/model/model_test_util.h"

namespace lockstep {
namespace {

using testing::random_parameters;
using testing::tiny_config;

ModelParameters on_bf16_grid(uint64_t seed) {
  ModelParameters p = random_parameters(tiny_config(ModelFamily::qwen3), seed);
  p.for_each([](const std::string&, Tensor& t) {
    float* v = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = round_to_bf16(v[i]);
  });
  return p;
}

TEST(Dither, StaysWithinEachBf16RoundingAndMovesTheWeights) {
  const ModelParameters before = on_bf16_grid(3);
  ModelParameters after = before.copy_to(Device::cpu);
  dither_within_bf16_rounding(after, 11);
  std::vector<const Tensor*> old;
  before.for_each([&](const std::string&, const Tensor& t) { old.push_back(&t); });
  size_t k = 0;
  int64_t weights = 0, moved = 0;
  after.for_each([&](const std::string& name, const Tensor& t) {
    const float* a = old[k++]->data_as<float>();
    const float* b = t.data_as<float>();
    const bool kept = name.ends_with("norm") || name.ends_with("bias");
    for (int64_t i = 0; i < t.numel(); ++i) {
      ASSERT_EQ(round_to_bf16(b[i]), a[i]) << name << "[" << i << "]";
      if (kept) {
        ASSERT_EQ(b[i], a[i]) << name << "[" << i << "]";
      }
      if (!kept && a[i] != 0) {
        ++weights;
        moved += b[i] != a[i];
      }
    }
  });
  EXPECT_GT(weights, 1000);
  EXPECT_GT(moved, weights * 9 / 10);  // u = 0 (or a sub-ulp move lost to f32) is rare
}

TEST(Dither, KeepsPowersOfTwoWithinTheirRoundingOnBothSides) {
  // Below 2^k the bf16 grid is twice as fine as above: a downward move of 0.49 of the upper ulp
  // would round to the next bf16 value down.
  ModelParameters p = on_bf16_grid(5);
  float* v = p.embed.data_as<float>();
  for (int64_t i = 0; i < p.embed.numel(); ++i) v[i] = std::ldexp(i % 2 ? 1.0f : -1.0f, -int(i % 12));
  const ModelParameters before = p.copy_to(Device::cpu);
  dither_within_bf16_rounding(p, 1);
  for (int64_t i = 0; i < p.embed.numel(); ++i)
    ASSERT_EQ(round_to_bf16(v[i]), before.embed.data_as<float>()[i]) << i;
}

TEST(Dither, IsDeterministicInTheSeed) {
  ModelParameters a = on_bf16_grid(3), b = on_bf16_grid(3), c = on_bf16_grid(3);
  dither_within_bf16_rounding(a, 11);
  dither_within_bf16_rounding(b, 11);
  dither_within_bf16_rounding(c, 12);
  const int64_t n = a.embed.numel();
  EXPECT_EQ(0, std::memcmp(a.embed.data(), b.embed.data(), size_t(n) * 4));
  EXPECT_NE(0, std::memcmp(a.embed.data(), c.embed.data(), size_t(n) * 4));
}

}  // namespace
}  // namespace lockstep
