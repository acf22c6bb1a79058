// The sampler on the CPU (ops/sample.h): token frequencies follow the tempered, truncated
// distribution (χ² on a small vocabulary; tokens outside top-k/top-p are never drawn), greedy takes
// the first maximum, ties in top-k go to the lower id (−0 equal to +0), a draw depends only on its
// row and (seed, stream, position) — not on the other draws of the call — its logprob is
// logits_logprob's bit for bit, a NaN row gives token −1 and a NaN logprob, and bad specs are
// refused naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "core/dtypes.h"
#include "core/error.h"
#include "ops/lm_head.h"
#include "ops/sample.h"
#include "tests/rollout/rollout_test_util.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::chi_square;
using testing::expect_error;

struct Drawn {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// sample_tokens over logits rows [S, V] (outputs poisoned first).
Drawn sample(const std::vector<float>& logits, int64_t vocab,
             const std::vector<SampleSpec>& specs) {
  Tensor l = Tensor::empty({int64_t(logits.size()) / vocab, vocab}, DType::f32);
  std::copy(logits.begin(), logits.end(), l.data_as<float>());
  const int64_t n = int64_t(specs.size());
  Tensor tokens = Tensor::empty({n}, DType::i32), logprobs = Tensor::empty({n}, DType::f32);
  tokens.fill_bytes(0xFF);
  logprobs.fill_bytes(0xFF);
  sample_tokens(tokens, logprobs, l, sample_specs_tensor(specs));
  return {{tokens.data_as<int32_t>(), tokens.data_as<int32_t>() + n},
          {logprobs.data_as<float>(), logprobs.data_as<float>() + n}};
}

// One draw from one row.
int32_t sample_token(const std::vector<float>& logits, const SampleSpec& p, uint64_t stream,
                     uint64_t position) {
  SampleSpec s = p;
  s.stream = stream;
  s.position = position;
  return sample(logits, int64_t(logits.size()), {s}).tokens.at(0);
}

std::vector<float> random_logits(size_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> l(vocab);
  for (float& x : l) x = normal(rng);
  return l;
}

// rollout/sampler.h's distribution written out directly, in double.
std::vector<double> expected_probs(const std::vector<float>& logits, const SampleSpec& p) {
  const size_t vocab = logits.size();
  std::vector<double> pi(vocab);
  double max = -INFINITY, total = 0;
  for (size_t v = 0; v < vocab; ++v) max = std::max(max, double(logits[v]) / p.temperature);
  for (size_t v = 0; v < vocab; ++v)
    total += pi[v] = std::exp(double(logits[v]) / p.temperature - max);
  for (double& x : pi) x /= total;
  std::vector<size_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  const size_t k = p.top_k > 0 ? std::min(size_t(p.top_k), vocab) : vocab;
  double mass_k = 0;
  for (size_t i = 0; i < k; ++i) mass_k += pi[order[i]];
  size_t keep = 0;
  for (double mass = 0; keep < k && (p.top_p >= 1 || mass < p.top_p * mass_k); ++keep)
    mass += pi[order[keep]];
  std::vector<double> probs(vocab, 0.0);
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += pi[order[i]];
  for (size_t i = 0; i < keep; ++i) probs[order[i]] = pi[order[i]] / kept;
  return probs;
}

std::vector<int64_t> draw_counts(const std::vector<float>& logits, const SampleSpec& p,
                                 int64_t draws) {
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t i = 0; i < draws; ++i) ++counts[size_t(sample_token(logits, p, 3, uint64_t(i)))];
  return counts;
}

struct Setting {
  float temperature, top_p;
  int64_t top_k;
};

class SamplerFrequencies : public ::testing::TestWithParam<Setting> {};

// 20000 draws: with ≥ 5 expected per bin, χ² follows its distribution closely; the critical value
// is the 1e-3 tail (draws are deterministic, so the test either always passes or always fails).
TEST_P(SamplerFrequencies, MatchTheDistribution) {
  const Setting s = GetParam();
  const std::vector<float> logits = random_logits(12, 5);
  SampleSpec p;
  p.temperature = s.temperature;
  p.top_p = s.top_p;
  p.top_k = int32_t(s.top_k);
  p.seed = 77;
  const std::vector<int64_t> counts = draw_counts(logits, p, 20000);
  const std::vector<double> probs = expected_probs(logits, p);
  for (size_t v = 0; v < probs.size(); ++v)
    if (probs[v] == 0) {
      EXPECT_EQ(counts[v], 0) << "token " << v << " is outside top-k/top-p";
    }
  const auto chi2 = chi_square(counts, probs);
  EXPECT_LT(chi2.statistic, chi2.critical()) << "dof " << chi2.dof;

  // The test has power: the same counts against the untruncated τ = 1 distribution fail.
  const auto wrong = chi_square(counts, expected_probs(logits, SampleSpec{}));
  EXPECT_GT(wrong.statistic, wrong.critical());
}

INSTANTIATE_TEST_SUITE_P(Settings, SamplerFrequencies,
                         ::testing::Values(Setting{0.6f, 1.0f, 0}, Setting{1.6f, 1.0f, 5},
                                           Setting{0.8f, 0.7f, 0}, Setting{1.3f, 0.9f, 7}));

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  std::vector<float> logits = random_logits(20, 9);
  const size_t best = size_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  logits[15] = logits[best];
  SampleSpec p;
  p.temperature = 0;
  for (uint64_t position = 0; position < 5; ++position)
    EXPECT_EQ(sample_token(logits, p, position, position), int32_t(std::min<size_t>(best, 15)));
}

TEST(Sampler, DependsOnlyOnSeedStreamAndPosition) {
  const std::vector<float> logits(50, 0.0f);  // uniform: every draw is equally informative
  SampleSpec p;
  p.seed = 123;
  std::vector<int32_t> a, b;
  for (uint64_t i = 0; i < 64; ++i) a.push_back(sample_token(logits, p, 1, i));
  for (uint64_t i = 0; i < 64; ++i) EXPECT_EQ(sample_token(logits, p, 1, i), a[i]);
  for (uint64_t i = 0; i < 64; ++i) b.push_back(sample_token(logits, p, 2, i));
  EXPECT_NE(a, b);
  p.seed = 124;
  std::vector<int32_t> c;
  for (uint64_t i = 0; i < 64; ++i) c.push_back(sample_token(logits, p, 1, i));
  EXPECT_NE(a, c);
}

// Rows of tied logits, −0 among +0: top_k = 3 keeps ids 0, 1, 2 (ties by id, −0 = +0), so a
// temperature that flattens the row draws each of them and nothing else.
TEST(Sampler, TopKBreaksTiesByIdWithNegativeZeroEqualToZero) {
  const std::vector<float> logits = {-0.0f, 0.0f, -0.0f, 0.0f, 0.0f, -1.0f, -0.0f, -2.0f};
  SampleSpec p;
  p.top_k = 3;
  p.temperature = 5.0f;
  std::vector<int64_t> counts(logits.size(), 0);
  for (uint64_t i = 0; i < 600; ++i) ++counts[size_t(sample_token(logits, p, 0, i))];
  for (size_t v = 0; v < logits.size(); ++v)
    if (v < 3) {
      EXPECT_GT(counts[v], 150) << "token " << v;
    } else {
      EXPECT_EQ(counts[v], 0) << "token " << v;
    }
}

// Many draws in one call, several from one row: each equals the same draw made alone, and its
// logprob is logits_logprob of its token at its temperature (1 when greedy), bit for bit.
TEST(Sampler, ADrawIgnoresTheOthersAndReportsTheForwardLogprob) {
  const int64_t vocab = 4096 + 37, rows = 3;  // two fold chunks, the second partial
  std::vector<float> logits;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row = random_logits(size_t(vocab), 10 + uint64_t(r));
    logits.insert(logits.end(), row.begin(), row.end());
  }
  std::vector<SampleSpec> specs;
  for (int i = 0; i < 12; ++i)
    specs.push_back({.seed = 5,
                     .stream = uint64_t(i % 4),
                     .position = uint64_t(20 + i),
                     .row = int32_t(i % rows),
                     .temperature = i % 5 == 0 ? 0.0f : 0.5f + 0.2f * float(i),
                     .top_p = i % 3 == 0 ? 0.8f : 1.0f,
                     .top_k = i % 4 == 1 ? 50 : 0});
  const Drawn all = sample(logits, vocab, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Drawn alone = sample(logits, vocab, {specs[i]});
    EXPECT_EQ(all.tokens[i], alone.tokens[0]) << "draw " << i;
    EXPECT_EQ(float_bits(all.logprobs[i]), float_bits(alone.logprobs[0])) << "draw " << i;

    ASSERT_GE(all.tokens[i], 0);
    const float temperature = specs[i].temperature > 0 ? specs[i].temperature : 1.0f;
    Tensor row = Tensor::empty({1, vocab}, DType::f32), target = Tensor::empty({1}, DType::i32);
    std::copy_n(logits.begin() + specs[i].row * vocab, vocab, row.data_as<float>());
    target.data_as<int32_t>()[0] = all.tokens[i];
    Tensor logprob = Tensor::empty({1}, DType::f32), entropy = Tensor::empty({1}, DType::f32);
    logits_logprob(logprob, entropy, row, target, temperature);
    EXPECT_EQ(float_bits(all.logprobs[i]), float_bits(logprob.data_as<float>()[0])) << "draw " << i;
  }
}

TEST(Sampler, MarksNaNAndNonFiniteRowsInsteadOfDrawing) {
  std::vector<float> logits = random_logits(10, 1);
  logits[4] = std::nanf("");
  std::vector<float> infinite = random_logits(10, 2);
  infinite[7] = INFINITY;
  const std::vector<float> all_minus_inf(10, -INFINITY);
  for (const auto& row : {logits, infinite, all_minus_inf})
    for (float temperature : {1.0f, 0.0f}) {
      SampleSpec p;
      p.temperature = temperature;
      const Drawn d = sample(row, 10, {p});
      EXPECT_EQ(d.tokens[0], -1) << "temperature " << temperature;
      EXPECT_TRUE(std::isnan(d.logprobs[0])) << "temperature " << temperature;
    }
}

TEST(Sampler, RefusesBadSpecsNamingTheField) {
  const std::vector<float> logits = random_logits(20, 3);  // two rows of 10
  auto bad = [&](auto change, const std::string& part) {
    std::vector<SampleSpec> specs(3);
    change(specs[2]);
    expect_error([&] { sample(logits, 10, specs); }, "specs[2]." + part);
  };
  bad([](SampleSpec& s) { s.row = 2; }, "row = 2 is outside the logits rows [0, 2)");
  bad([](SampleSpec& s) { s.row = -1; }, "row = -1");
  bad([](SampleSpec& s) { s.temperature = -0.5f; }, "temperature");
  bad([](SampleSpec& s) { s.temperature = INFINITY; }, "temperature");
  bad([](SampleSpec& s) { s.top_p = 0; }, "top_p");
  bad([](SampleSpec& s) { s.top_p = 1.5f; }, "top_p");
  bad([](SampleSpec& s) { s.top_k = -1; }, "top_k");

  Tensor l = Tensor::empty({1, 10}, DType::f32), tokens = Tensor::empty({2}, DType::i32);
  Tensor logprobs = Tensor::empty({2}, DType::f32);
  const Tensor one = sample_specs_tensor(std::vector<SampleSpec>(1));
  expect_error([&] { sample_tokens(tokens, logprobs, l, one); }, "tokens: expected shape [1]");
  expect_error([&] { sample_tokens(tokens, logprobs, l, Tensor::empty({2, 4}, DType::i64)); },
               "specs: expected [D, 5]");
  Tensor wide = Tensor::empty({1, kMaxSampleVocab + 1}, DType::f32);
  expect_error([&] { sample_tokens(tokens, logprobs, wide, sample_specs_tensor({})); },
               "0 < V <= 524288");
}

}  // namespace
}  // namespace lockstep
