// ops/cpu/moe_dispatch.cpp — CPU reference for ops/moe_dispatch.h: count, prefix-sum, place.
#include <algorithm>
#include <vector>

#include "ops/moe_dispatch_backends.h"

namespace lockstep::cpu {

void moe_dispatch(Tensor& offsets, Tensor& token_of_row, Tensor& slots, const Tensor& expert_ids) {
  const int64_t rows = expert_ids.numel(), k = expert_ids.dim(1), E = offsets.dim(0) - 1;
  const int32_t* id = expert_ids.data_as<int32_t>();
  int64_t* start = offsets.data_as<int64_t>();
  std::fill_n(start, E + 1, 0);
  for (int64_t i = 0; i < rows; ++i) ++start[id[i] + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> next(start, start + E);
  for (int64_t i = 0; i < rows; ++i) {  // in (t, j) order: each expert's rows in token order
    const int64_t row = next[size_t(id[i])]++;
    token_of_row.data_as<int32_t>()[row] = int32_t(i / k);
    slots.data_as<int32_t>()[i] = int32_t(row);
  }
}

}  // namespace lockstep::cpu
