// train/overlong_penalty.cpp
#include "train/overlong_penalty.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lockstep {

double overlong_penalty(int64_t length, int64_t max_length, int64_t buffer, double factor) {
  LOCKSTEP_CHECK(length >= 0, "overlong_penalty: length = ", length, " (must be ≥ 0)");
  LOCKSTEP_CHECK(buffer >= 1 && buffer <= max_length, "overlong_penalty: buffer = ", buffer,
                 " (must be in [1, max_length = ", max_length, "])");
  LOCKSTEP_CHECK(std::isfinite(factor) && factor >= 0, "overlong_penalty: factor = ", factor,
                 " (must be finite and ≥ 0)");
  const int64_t exceed = length - (max_length - buffer);
  if (exceed <= 0) return 0.0;
  return -factor * std::min(1.0, double(exceed) / double(buffer));
}

}  // namespace lockstep
