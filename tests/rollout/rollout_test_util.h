// tests/rollout/rollout_test_util.h — what the CPU and GPU engine tests share: requests over random
// prompts, and Pearson's χ² test of drawn tokens against a distribution.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "rollout/engine.h"
#include "tests/model/model_test_util.h"

namespace lockstep::testing {

// Requests over random prompts (token ids below `vocab`) of the given lengths, each with its own
// sampling seed.
inline std::vector<GenerationRequest> make_requests(const std::vector<int>& prompt_lengths,
                                                    const SamplingParams& sampling, uint64_t seed, int64_t vocab) {
  std::vector<GenerationRequest> requests;
  for (const std::vector<int32_t>& prompt : random_sequences(prompt_lengths, vocab, seed)) {
    requests.push_back({prompt, sampling});
    requests.back().sampling.seed = seed * 1000 + requests.size();
  }
  return requests;
}

// A recipe for the engine tests, with or without the fp8 KV cache, and its test-name suffix.
struct EngineCase {
  Recipe recipe;
  bool fp8_kv_cache = false;
  bool partial_blocks = false;  // widths with fp8 partial 128-groups (testing::partial_blocks_config)
  TransformerOptions options() const { return {.fp8_kv_cache = fp8_kv_cache}; }
};
inline std::string engine_case_name(const EngineCase& c) {
  return std::string(recipe_name(c.recipe)) + (c.fp8_kv_cache ? "_fp8_kv_cache" : "") +
         (c.partial_blocks ? "_partial_blocks" : "");
}

struct ChiSquare {
  double statistic = 0;
  int dof = 0;
  // The value χ² exceeds with probability 1e-3 when the counts do follow the distribution
  // (Wilson–Hilferty: accurate to a few percent at the dof used here).
  double critical() const {
    const double a = 2.0 / (9.0 * dof), z = 3.090;
    return dof * std::pow(1 - a + z * std::sqrt(a), 3);
  }
};

// counts[v] draws of token v against probabilities probs[v] (which sum to 1); bins expecting fewer
// than 5 draws are pooled into one. Tokens of probability 0 are left out (check them apart).
inline ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  ChiSquare result;
  double pooled_expected = 0, pooled_count = 0;
  int bins = 0;
  auto add = [&](double observed, double expected) {
    result.statistic += (observed - expected) * (observed - expected) / expected;
    ++bins;
  };
  for (size_t v = 0; v < counts.size(); ++v) {
    const double expected = probs[v] * double(total);
    if (expected == 0) continue;
    if (expected < 5) {
      pooled_expected += expected;
      pooled_count += double(counts[v]);
    } else {
      add(double(counts[v]), expected);
    }
  }
  if (pooled_expected > 0) add(pooled_count, pooled_expected);
  result.dof = bins - 1;
  return result;
}

}  // namespace lockstep::testing
