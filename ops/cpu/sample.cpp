// ops/cpu/sample.cpp — CPU reference for ops/sample.h: each draw on its own, as the header defines
// it (weights in f32, sums in double), and its logprob by the logits_logprob fold of its row.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "core/philox.h"
#include "ops/lm_head_backends.h"
#include "ops/sample.h"
#include "ops/sample_backends.h"

namespace lockstep::cpu {

namespace {

// The lowest id of largest logit; −1 for a row with a NaN or no finite maximum.
int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  bool nan = false;
  for (size_t v = 0; v < logits.size(); ++v) {
    nan |= std::isnan(logits[v]);
    if (logits[v] > logits[size_t(best)]) best = int32_t(v);
  }
  return nan || !std::isfinite(logits[size_t(best)]) ? -1 : best;
}

// The first id of `ids` (increasing) whose cumulative weight reaches u·Σ weight.
int32_t draw(std::span<const int32_t> ids, std::span<const float> weight, double u) {
  double total = 0;
  for (int32_t v : ids) total += weight[size_t(v)];
  const double target = u * total;
  double sum = 0;
  int32_t last_positive = ids.front();
  for (int32_t v : ids) {
    if (weight[size_t(v)] <= 0) continue;
    sum += weight[size_t(v)];
    last_positive = v;
    if (sum >= target) return v;
  }
  return last_positive;  // rounding left the sum a hair below the target
}

// The token of one draw from `logits`, or −1 (ops/sample.h).
int32_t sample_row(std::span<const float> logits, const SampleSpec& s) {
  if (s.temperature == 0) return argmax(logits);

  // Weights exp(z − max z) in scratch reused across calls: a vocabulary row per token adds up.
  thread_local std::vector<float> weight;
  thread_local std::vector<int32_t> ids;
  const size_t vocab = logits.size();
  weight.resize(vocab);
  float max_z = -INFINITY;
  bool nan = false;
  for (size_t v = 0; v < vocab; ++v) {
    weight[v] = logits[v] / s.temperature;
    nan |= std::isnan(weight[v]);
    max_z = std::max(max_z, weight[v]);
  }
  if (nan || !std::isfinite(max_z)) return -1;
  for (size_t v = 0; v < vocab; ++v) weight[v] = std::exp(weight[v] - max_z);

  ids.resize(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const double u = philox_uniform53(philox_at(s.seed, s.stream, s.position));
  const bool top_k = s.top_k > 0 && size_t(s.top_k) < vocab, top_p = s.top_p < 1.0f;
  if (!top_k && !top_p) return draw(ids, weight, u);

  // By logit, not weight: exp and the division by τ can round distinct logits together.
  const auto before = [&](int32_t a, int32_t b) {
    const float la = logits[size_t(a)], lb = logits[size_t(b)];
    return la > lb || (la == lb && a < b);
  };
  const size_t k = top_k ? size_t(s.top_k) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), before);
  ids.resize(k);
  if (top_p) {
    double mass = 0;
    for (int32_t v : ids) mass += weight[size_t(v)];
    const double target = double(s.top_p) * mass;
    double sum = 0;
    size_t keep = 0;
    while (keep < ids.size() && sum < target) sum += weight[size_t(ids[keep++])];
    ids.resize(keep);  // ≥ 1: the target is positive
  }
  std::sort(ids.begin(), ids.end());
  return draw(ids, weight, u);
}

// logits_logprob of `token` in `row` (a one-row call: the fold of a row ignores the others).
float logprob_of(const float* row, int64_t vocab, int32_t token, float temperature) {
  float logprob = 0, entropy = 0;
  Tensor lp = Tensor::view_of(&logprob, {1}, DType::f32);
  Tensor ent = Tensor::view_of(&entropy, {1}, DType::f32);
  const Tensor logits = Tensor::view_of(const_cast<float*>(row), {1, vocab}, DType::f32);
  const Tensor target = Tensor::view_of(&token, {1}, DType::i32);
  logits_logprob(lp, ent, logits, target, temperature);
  return logprob;
}

}  // namespace

void sample_tokens(Tensor& tokens, Tensor& logprobs, const Tensor& logits, const Tensor& specs) {
  const int64_t draws = specs.dim(0), vocab = logits.dim(1);
  const float* l = logits.data_as<float>();
  const int64_t* words = specs.data_as<int64_t>();
  int32_t* token_out = tokens.data_as<int32_t>();
  float* logprob_out = logprobs.data_as<float>();
#pragma omp parallel for schedule(dynamic)
  for (int64_t d = 0; d < draws; ++d) {
    SampleSpec s;
    std::memcpy(static_cast<void*>(&s), words + d * kSampleSpecWords, sizeof s);
    const float* row = l + int64_t(s.row) * vocab;
    const int32_t token = sample_row({row, size_t(vocab)}, s);
    token_out[d] = token;
    logprob_out[d] =
        token < 0 ? NAN : logprob_of(row, vocab, token, s.temperature > 0 ? s.temperature : 1.0f);
  }
}

}  // namespace lockstep::cpu
