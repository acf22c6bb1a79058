// train/overlong_penalty.h — DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13;
// verl's DAPO reward manager, overlong_buffer): a reward term that grows linearly more negative
// over the last `buffer` tokens before the longest allowed response,
//
//   penalty(L) = 0                                     L ≤ L_max − buffer
//              = −factor · (L − (L_max − buffer)) / buffer    L_max − buffer < L ≤ L_max
//              = −factor                               L > L_max
//
// where L is the response's length in tokens and L_max the rollout's max_new_tokens. It is added
// to the task reward before the advantages, so a truncated response scores less than a correct
// short one and the model learns to finish inside the budget. Computed in double.
#pragma once

#include <cstdint>

namespace lockstep {

// length ≥ 0; 1 ≤ buffer ≤ max_length; factor ≥ 0. Returns a value in [−factor, 0].
double overlong_penalty(int64_t length, int64_t max_length, int64_t buffer, double factor);

}  // namespace lockstep
