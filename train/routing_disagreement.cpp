// train/routing_disagreement.cpp
#include "train/routing_disagreement.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace lockstep {

double routing_disagreement(std::span<const int32_t> rollout_ids, std::span<const int32_t> train_ids, int64_t k) {
  LOCKSTEP_CHECK(k >= 1 && rollout_ids.size() == train_ids.size() && rollout_ids.size() % size_t(k) == 0,
                 "routing_disagreement: expected two [T, k] id lists of one length (k = ", k, "), got ",
                 rollout_ids.size(), " and ", train_ids.size(), " ids");
  const size_t tokens = rollout_ids.size() / size_t(k);
  if (tokens == 0) return 0;
  size_t differ = 0;
  std::vector<int32_t> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
  for (size_t t = 0; t < tokens; ++t) {
    std::copy_n(rollout_ids.begin() + ptrdiff_t(t * size_t(k)), k, a.begin());
    std::copy_n(train_ids.begin() + ptrdiff_t(t * size_t(k)), k, b.begin());
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    differ += a != b;
  }
  return double(differ) / double(tokens);
}

}  // namespace lockstep
