// ops/cpu/embedding.cpp — CPU reference for ops/embedding.h.
#include <algorithm>
#include <numeric>
#include <vector>

#include "ops/cpu/act.h"
#include "ops/embedding_backends.h"

namespace lockstep::cpu {

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table) {
  const int64_t T = tokens.dim(0), H = table.dim(1);
  const int32_t* tok = tokens.data_as<int32_t>();
#pragma omp parallel
  {
    std::vector<float> row(H);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      read_f32(table, tok[t] * H, H, row.data());
      write_f32(out, t * H, H, row.data());
    }
  }
}

// Parallel over the distinct tokens, not over positions: each table row is owned by one thread and
// receives its positions' rows in increasing t, so the sums do not depend on the thread count.
void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout) {
  const int64_t T = tokens.dim(0), H = dout.dim(1);
  const int32_t* tok = tokens.data_as<int32_t>();
  std::vector<int64_t> order(T);  // positions grouped by token, increasing t in a group
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [tok](int64_t a, int64_t b) { return tok[a] < tok[b]; });
  std::vector<int64_t> starts;  // where each group begins in `order`, then T
  for (int64_t i = 0; i < T; ++i)
    if (i == 0 || tok[order[i]] != tok[order[i - 1]]) starts.push_back(i);
  starts.push_back(T);
  const int64_t groups = int64_t(starts.size()) - 1;
  float* dt = dtable.data_as<float>();
#pragma omp parallel
  {
    std::vector<float> row(H);
#pragma omp for schedule(dynamic, 8)
    for (int64_t g = 0; g < groups; ++g) {
      float* acc = dt + tok[order[starts[g]]] * H;
      for (int64_t i = starts[g]; i < starts[g + 1]; ++i) {
        read_f32(dout, order[i] * H, H, row.data());
        for (int64_t h = 0; h < H; ++h) acc[h] += row[h];
      }
    }
  }
}

}  // namespace lockstep::cpu
