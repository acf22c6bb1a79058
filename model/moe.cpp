// model/moe.cpp
#include "model/moe.h"

#include <algorithm>

#include "core/error.h"
#include "ops/moe_dispatch.h"

namespace lockstep {

MoeDispatch plan_moe_dispatch(const Tensor& expert_ids, int64_t num_experts, bool read_back) {
  LOCKSTEP_CHECK(expert_ids.dtype() == DType::i32 && expert_ids.rank() == 2,
                 "plan_moe_dispatch: expected i32 expert ids [T, k], got ", expert_ids.describe());
  const Device d = expert_ids.device();
  MoeDispatch plan{{},
                   Tensor::empty({num_experts + 1}, DType::i64, d),
                   Tensor::empty({expert_ids.numel()}, DType::i32, d),
                   Tensor::empty(expert_ids.shape(), DType::i32, d)};
  moe_dispatch(plan.device_offsets, plan.token_of_row, plan.slots, expert_ids);
  if (read_back) {
    const Tensor host = d == Device::cpu ? plan.device_offsets : plan.device_offsets.to(Device::cpu);
    plan.offsets.assign(host.data_as<int64_t>(), host.data_as<int64_t>() + num_experts + 1);
  }
  return plan;
}

namespace {

// E experts' Fp8Blocks of [n, k], one after another: E times the rows of one expert's data and
// scales.
Fp8Blocks stacked_blocks(int64_t experts, int64_t n, int64_t k, Device device) {
  const Fp8Blocks one = Fp8Blocks::empty(n, k, device);  // (checks the shape; freed at once)
  return {Tensor::empty({experts * one.data.dim(0), one.data.dim(1)}, DType::e4m3, device),
          Tensor::empty({experts * one.scales.dim(0), one.scales.dim(1)}, DType::f32, device)};
}

// Experts [from, from + count)'s rows of blocks stacked by stacked_blocks (`experts` of them).
Fp8Blocks expert_blocks(const Fp8Blocks& all, int64_t experts, int64_t from, int64_t count) {
  if (!all.data.defined()) return {};
  const int64_t rows = all.data.dim(0) / experts, blocks = all.scales.dim(0) / experts;
  return {all.data.rows(from * rows, (from + count) * rows), all.scales.rows(from * blocks, (from + count) * blocks)};
}

}  // namespace

StackedFp8Weight StackedFp8Weight::empty(int64_t first, int64_t experts, int64_t n, int64_t k, Device device,
                                         bool with_transpose) {
  LOCKSTEP_CHECK(experts >= 1 && first >= 0, "StackedFp8Weight: needs at least one expert, got ", experts,
                 " from ", first);
  StackedFp8Weight s;
  s.first = first, s.experts = experts;
  s.all.w = stacked_blocks(experts, n, k, device);
  if (with_transpose) s.all.wt = stacked_blocks(experts, k, n, device);
  return s;
}

Fp8Weight StackedFp8Weight::range(int64_t from, int64_t count) const {
  LOCKSTEP_CHECK(count >= 1 && holds(from) && holds(from + count - 1), "StackedFp8Weight: experts [", from, ", ",
                 from + count, ") outside the stack's [", first, ", ", first + experts, ")");
  return {expert_blocks(all.w, experts, from - first, count), expert_blocks(all.wt, experts, from - first, count)};
}

void MoeWeights::stack_fp8_copies(int64_t hidden, int64_t moe_intermediate, Device device, bool with_transpose,
                                  int64_t first, int64_t count) {
  gate_up_fp8 = StackedFp8Weight::empty(first, count, 2 * moe_intermediate, hidden, device, with_transpose);
  down_fp8 = StackedFp8Weight::empty(first, count, hidden, moe_intermediate, device, with_transpose);
  for (int64_t e = first; e < first + count; ++e) {
    gate_up[size_t(e)].fp8 = gate_up_fp8.expert(e);
    down[size_t(e)].fp8 = down_fp8.expert(e);
  }
}

namespace {

// N, C_e, P_e of load_balancing_loss.
struct Pooled {
  double tokens = 0;
  std::vector<double> counts, probs;
};

Pooled pooled(const std::vector<RouterStats>& routing) {
  Pooled p;
  for (const RouterStats& layer : routing) {
    const size_t E = layer.expert_tokens.size();
    LOCKSTEP_CHECK((p.counts.empty() || p.counts.size() == E) && layer.prob_sums.size() == E,
                   "load_balancing_loss: layers with different expert counts");
    p.counts.resize(E), p.probs.resize(E);
    p.tokens += double(layer.expert_ids.dim(0));
    for (size_t e = 0; e < E; ++e) {
      p.counts[e] += double(layer.expert_tokens[e]);
      p.probs[e] += layer.prob_sums[e];
    }
  }
  return p;
}

}  // namespace

double load_balancing_loss(const std::vector<RouterStats>& routing) {
  const Pooled p = pooled(routing);
  if (p.tokens == 0) return 0;
  double sum = 0;
  for (size_t e = 0; e < p.counts.size(); ++e) sum += (p.counts[e] / p.tokens) * (p.probs[e] / p.tokens);
  return double(p.counts.size()) * sum;
}

std::vector<double> load_balancing_gradient(const std::vector<RouterStats>& routing) {
  const Pooled p = pooled(routing);
  std::vector<double> g(p.counts.size(), 0.0);
  if (p.tokens == 0) return g;
  for (size_t e = 0; e < g.size(); ++e) g[e] = double(g.size()) * p.counts[e] / (p.tokens * p.tokens);
  return g;
}

double router_z_loss(const std::vector<RouterStats>& routing) {
  double sum = 0, tokens = 0;
  for (const RouterStats& layer : routing) {
    sum += layer.lse_square_sum;
    tokens += double(layer.expert_ids.dim(0));
  }
  return tokens == 0 ? 0 : sum / tokens;
}

ExpertLoad expert_load(const RouterStats& stats) {
  ExpertLoad load;
  int64_t total = 0;
  for (int64_t n : stats.expert_tokens) {
    load.max_tokens = std::max(load.max_tokens, n);
    total += n;
  }
  if (!stats.expert_tokens.empty()) load.mean_tokens = double(total) / double(stats.expert_tokens.size());
  return load;
}

}  // namespace lockstep
