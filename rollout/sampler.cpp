// rollout/sampler.cpp
#include "rollout/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"

namespace lockstep {

namespace {

double philox_unit(uint64_t seed, uint64_t stream, uint64_t position) {
  const Philox4 r = philox_at(seed, stream, position);
  const uint64_t bits = (uint64_t(r.v[0]) << 32 | r.v[1]) >> 11;
  return double(bits + 1) * 0x1p-53;  // never 0, so a token of zero weight is never drawn
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t v = 1; v < logits.size(); ++v)
    if (logits[v] > logits[size_t(best)]) best = int32_t(v);
  return best;
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

}  // namespace

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t stream,
                     uint64_t position) {
  LOCKSTEP_CHECK(!logits.empty(), "sample_token: empty logits row");
  if (p.temperature == 0) return argmax(logits);

  // Weights exp(z − max z) (f32: plenty for drawing; the reported logprob comes from
  // ops/lm_head.h), in scratch reused across calls: a vocabulary row per token adds up.
  thread_local std::vector<float> weight;
  thread_local std::vector<int32_t> ids;
  const size_t vocab = logits.size();
  weight.resize(vocab);
  float max_z = -INFINITY;
  bool nan = false;
  for (size_t v = 0; v < vocab; ++v) {
    weight[v] = logits[v] / p.temperature;
    nan |= std::isnan(weight[v]);
    max_z = std::max(max_z, weight[v]);
  }
  LOCKSTEP_CHECK(!nan && std::isfinite(max_z), "sample_token: the logits row ",
                 nan ? "holds a NaN" : "has no finite maximum", " (stream ", stream, ", position ",
                 position, ")");
  for (size_t v = 0; v < vocab; ++v) weight[v] = std::exp(weight[v] - max_z);

  ids.resize(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const double u = philox_unit(p.seed, stream, position);
  const bool top_k = p.top_k > 0 && size_t(p.top_k) < vocab, top_p = p.top_p < 1.0f;
  if (!top_k && !top_p) return draw(ids, weight, u);

  // By logit, not weight: exp and the division by τ can round distinct logits together.
  const auto before = [&](int32_t a, int32_t b) {
    const float la = logits[size_t(a)], lb = logits[size_t(b)];
    return la > lb || (la == lb && a < b);
  };
  const size_t k = top_k ? size_t(p.top_k) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), before);
  ids.resize(k);
  if (top_p) {
    double mass = 0;
    for (int32_t v : ids) mass += weight[size_t(v)];
    const double target = double(p.top_p) * mass;
    double sum = 0;
    size_t keep = 0;
    while (keep < ids.size() && sum < target) sum += weight[size_t(ids[keep++])];
    ids.resize(keep);  // ≥ 1: the target is positive
  }
  std::sort(ids.begin(), ids.end());
  return draw(ids, weight, u);
}

}  // namespace lockstep
