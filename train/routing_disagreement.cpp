// train/routing_disagreement.cpp
#include "train/routing_disagreement.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace lockstep {

RoutingDisagreement routing_disagreement(std::span<const int32_t> rollout_ids,
                                         std::span<const int32_t> train_ids,
                                         std::span<const uint8_t> counted, int64_t layers, int64_t k) {
  const size_t width = size_t(std::max<int64_t>(layers, 0) * std::max<int64_t>(k, 0));
  LOCKSTEP_CHECK(k >= 1 && layers >= 1 && rollout_ids.size() == counted.size() * width &&
                     train_ids.size() == rollout_ids.size(),
                 "routing_disagreement: expected two [T, layers, k] id lists for T = ", counted.size(),
                 " tokens (layers = ", layers, ", k = ", k, "), got ", rollout_ids.size(), " and ",
                 train_ids.size(), " ids");
  RoutingDisagreement d;
  std::vector<int32_t> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
  for (size_t t = 0; t < counted.size(); ++t) {
    if (!counted[t]) continue;
    bool differs = false;
    for (int64_t l = 0; l < layers; ++l) {
      const ptrdiff_t at = ptrdiff_t(t * width + size_t(l * k));
      std::copy_n(rollout_ids.begin() + at, k, a.begin());
      std::copy_n(train_ids.begin() + at, k, b.begin());
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      d.pairs += 1;
      d.pairs_differ += a != b;
      differs = differs || a != b;
    }
    d.tokens += 1;
    d.tokens_differ += differs;
  }
  return d;
}

}  // namespace lockstep
