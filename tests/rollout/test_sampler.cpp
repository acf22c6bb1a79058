// The host sampler: token frequencies follow the tempered, truncated distribution (χ² on a small
// vocabulary; tokens outside top-k/top-p are never drawn), greedy takes the first maximum, a draw
// depends only on (seed, stream, position), and a NaN row is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "rollout/sampler.h"
#include "tests/rollout/rollout_test_util.h"

namespace lockstep {
namespace {

using testing::chi_square;

std::vector<float> random_logits(size_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> l(vocab);
  for (float& x : l) x = normal(rng);
  return l;
}

// rollout/sampler.h's distribution written out directly, in double.
std::vector<double> expected_probs(const std::vector<float>& logits, const SamplingParams& p) {
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

std::vector<int64_t> draw_counts(const std::vector<float>& logits, const SamplingParams& p,
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
  SamplingParams p;
  p.temperature = s.temperature;
  p.top_p = s.top_p;
  p.top_k = s.top_k;
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
  const auto wrong = chi_square(counts, expected_probs(logits, SamplingParams{}));
  EXPECT_GT(wrong.statistic, wrong.critical());
}

INSTANTIATE_TEST_SUITE_P(Settings, SamplerFrequencies,
                         ::testing::Values(Setting{0.6f, 1.0f, 0}, Setting{1.6f, 1.0f, 5},
                                           Setting{0.8f, 0.7f, 0}, Setting{1.3f, 0.9f, 7}));

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  std::vector<float> logits = random_logits(20, 9);
  const size_t best = size_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  logits[15] = logits[best];
  SamplingParams p;
  p.temperature = 0;
  for (uint64_t position = 0; position < 5; ++position)
    EXPECT_EQ(sample_token(logits, p, position, position), int32_t(std::min<size_t>(best, 15)));
}

TEST(Sampler, DependsOnlyOnSeedStreamAndPosition) {
  const std::vector<float> logits(50, 0.0f);  // uniform: every draw is equally informative
  SamplingParams p;
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

TEST(Sampler, RefusesNaNLogits) {
  std::vector<float> logits = random_logits(10, 1);
  logits[4] = std::nanf("");
  EXPECT_THROW(sample_token(logits, SamplingParams{}, 0, 0), Error);
}

}  // namespace
}  // namespace lockstep
