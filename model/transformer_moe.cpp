// model/transformer_moe.cpp — the sparse MLP of a Transformer layer (model/moe.h gives the steps).
//
// fp8 recipe: each projection of every expert is one gemm_fp8_grouped (ops/gemm.h) over the
// gathered rows, sorted by expert, reading the experts' stacked copies (model/moe.h): the rows are
// quantized once (1×128 along K is per row, so the same bits as each expert's rows alone) and the
// SwiGLU runs over all of them. What stays per expert are the WGrads and their columnwise (128×1
// along tokens) copies, whose 128-token blocks must not straddle experts.
// bf16 recipe: likewise one gemm_bf16_grouped_fprop / _dgrad per projection (the experts' bf16
// copies where they are), the SwiGLU over all rows, the WGrads per expert.
// Otherwise (the fp32 recipe, widths the grouped GEMMs do not take, or
// TransformerOptions::grouped_experts off) the experts run one after another, each a pair of the
// recipe's ordinary GEMMs on its rows; experts without tokens are skipped. On the CPU both forms
// give the same bits (the grouped references are the per-expert GEMMs, bit for bit).
// With expert parallelism (model/expert_parallel.h) the gathered rows first go to their experts'
// owners, the experts here are this rank's, and their results go back before the combine.
#include <algorithm>

#include "core/error.h"
#include "model/transformer.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/moe_combine.h"
#include "ops/moe_route.h"
#include "ops/swiglu.h"

namespace lockstep {

namespace {

// Σ_t probs[t, e] in double, on the host.
std::vector<double> column_sums(const Tensor& probs) {
  const Tensor p = probs.is_cuda() ? probs.to(Device::cpu) : probs;
  const int64_t T = p.dim(0), E = p.dim(1);
  std::vector<double> sums(size_t(E), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) sums[size_t(e)] += p.data_as<float>()[t * E + e];
  return sums;
}

// The replayed experts where a row has them, the router's own (`own`, host [T, k]) where its first
// id is -1. Checked here, on the host, for every device: k distinct experts of [0, E) a row.
Tensor replayed_ids(const Tensor& own, const Tensor& replay, int64_t num_experts) {
  Tensor ids = Tensor::empty(own.shape(), DType::i32);
  const int64_t T = own.dim(0), k = own.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* r = replay.data_as<int32_t>() + t * k;
    const int32_t* from = r[0] < 0 ? own.data_as<int32_t>() + t * k : r;
    for (int64_t j = 0; j < k; ++j) {
      LOCKSTEP_CHECK(from[j] >= 0 && from[j] < num_experts, "routing replay: row ", t, " choice ", j,
                     " is expert ", from[j], ", outside [0, ", num_experts, ")");
      LOCKSTEP_CHECK(std::find(from, from + j, from[j]) == from + j, "routing replay: row ", t,
                     " names expert ", from[j], " twice");
    }
    std::copy(from, from + k, ids.data_as<int32_t>() + t * k);
  }
  return ids;
}

// fn(e, begin, end) for each expert with rows, [begin, end) its rows (offsets: E + 1 values).
template <class Fn>
void for_each_expert_with_rows(const std::vector<int64_t>& offsets, Fn&& fn) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    if (offsets[e] < offsets[e + 1]) fn(int64_t(e), offsets[e], offsets[e + 1]);
}

// dw += dyᵀ · x for one expert's rows: dy [n_e, N] in the activation dtype, `saved` what
// keep_for_backward left of its input (fp8: dy quantized 128×1 along the expert's tokens).
void expert_wgrad(Tensor& dw, const Tensor& dy, const LinearInput& saved) {
  Fp8Rows dy_cols = Fp8Rows::empty_columnwise(dy.dim(0), dy.dim(1), dy.device());
  quantize_columns(dy_cols, dy);
  gemm_wgrad(dw, dy_cols, saved.cols, /*accumulate=*/true);
}

// The grouped fp8 GEMM's offsets on the device (where each of its tiles finds its expert): with
// expert parallelism, those of this rank's experts among the rows it received.
Tensor device_offsets(const std::vector<int64_t>& offsets, Device device) {
  if (device == Device::cpu) return Tensor();
  Tensor host = Tensor::empty({int64_t(offsets.size())}, DType::i64);
  std::copy(offsets.begin(), offsets.end(), host.data_as<int64_t>());
  return host.to(device);
}

Fp8Rows quantized_rows(const Tensor& x) {
  Fp8Rows q = Fp8Rows::empty(x.dim(0), x.dim(1), x.device());
  quantize_rows(q, x);
  return q;
}

// The bf16 copies of experts [first, first + count) of one projection (gemm_bf16_grouped_*'s w).
std::vector<Tensor> bf16_copies(const std::vector<LinearWeight>& experts, int64_t first, int64_t count) {
  std::vector<Tensor> w;
  for (int64_t e = first; e < first + count; ++e) w.push_back(experts[size_t(e)].bf16);
  return w;
}

// The experts that have rows here, [first, first + count): every one, or with expert parallelism
// this rank's (the rows it received are theirs alone; with ZeRO-3 it holds only their copies). The
// grouped GEMMs run on that stretch: its offsets (count + 1 values, from 0 to the rows).
struct ExpertStretch {
  int64_t first = 0, count = 0;
  std::vector<int64_t> offsets;
};

ExpertStretch expert_stretch(const ExpertParallel& ep, bool expert_parallel, const std::vector<int64_t>& offsets) {
  const int64_t E = int64_t(offsets.size()) - 1;
  ExpertStretch s{expert_parallel ? ep.first_expert(E) : 0, expert_parallel ? ep.experts_per_rank(E) : E, {}};
  s.offsets.assign(offsets.begin() + s.first, offsets.begin() + s.first + s.count + 1);
  return s;
}

}  // namespace

// gemm_fp8_grouped needs the N of each of its GEMMs a multiple of 128 (every 128×128 scale block
// within one expert): 2·Im and H forward, H and Im for the DGrads. Tiny configs whose widths are
// multiples of 16 only keep the per-expert loop.
bool Transformer::grouped_fp8_experts() const {
  return recipe_ == Recipe::fp8 && grouped_experts_ && config_.hidden_size % kQuantGroup == 0 &&
         config_.moe->moe_intermediate_size % kQuantGroup == 0;
}

// gemm_bf16_grouped_* on CUDA needs every expert's rows 16-byte aligned: widths multiples of 8.
bool Transformer::grouped_bf16_experts() const {
  return recipe_ == Recipe::bf16 && grouped_experts_ && config_.hidden_size % 8 == 0 &&
         config_.moe->moe_intermediate_size % 8 == 0;
}

Tensor Transformer::moe_forward(size_t i, const Tensor& hn, MoeActivations* save, RouterStats* stats,
                                const Tensor* replay, bool expert_parallel, Tensor* routing) const {
  const MoeConfig& m = *config_.moe;
  const MoeWeights& w = weights_[i].moe;
  const int64_t t = hn.dim(0), hidden = config_.hidden_size, E = m.num_experts, k = m.num_experts_per_tok;
  const bool train = save != nullptr;

  Tensor logits = empty_act(t, E);
  linear_forward(logits, linear_input(w.router.recipe, hn, false), w.router, Tensor());
  Tensor probs = Tensor::empty({t, E}, DType::f32, device());
  Tensor expert_ids = routing ? *routing : Tensor::empty({t, k}, DType::i32, device());
  Tensor weights = Tensor::empty({t, k}, DType::f32, device());
  // A forward kept for the backward also gives each token's logsumexp (the router z-loss's).
  Tensor lse = train ? Tensor::empty({t}, DType::f32, device()) : Tensor();
  moe_route_forward(probs, expert_ids, weights, logits, m.norm_topk_prob, train ? &lse : nullptr);
  // host: the router's own choices (for the stats and the replay)
  const Tensor router_ids = stats || replay ? expert_ids.to(Device::cpu) : Tensor();
  if (replay) {
    // Routing replay: the tokens go to the replayed experts, weighted by this router's probs.
    const Tensor ids = replayed_ids(router_ids, *replay, E);
    expert_ids = device() == Device::cpu ? ids : ids.to(device());
    moe_route_weights(weights, probs, expert_ids, m.norm_topk_prob);
  }
  // An inference forward on the GPU whose experts run as grouped fp8 GEMMs reads nothing back: they
  // take the plan's device offsets alone, sized for at most t rows an expert (a decode step can be
  // captured into a CUDA graph).
  const bool offsets_on_device = !train && !stats && !replay && !expert_parallel && grouped_fp8_experts() &&
                                 device() == Device::cuda;
  MoeDispatch plan = plan_moe_dispatch(expert_ids, E, /*read_back=*/!offsets_on_device);

  // The gather is the embedding lookup with hn as the table.
  const int64_t im = m.moe_intermediate_size;
  Tensor gathered = empty_act(t * k, hidden);
  embedding_forward(gathered, plan.token_of_row, hn);
  // With expert parallelism the experts below are this rank's, on every rank's rows of them
  // (model/expert_parallel.h); `offsets` are then their rows among those received.
  ExpertParallelRoute route;
  std::vector<int64_t> offsets = plan.offsets;
  if (expert_parallel) {
    route = route_to_owners(expert_parallel_, plan.offsets, device());
    gathered = send_to_owners(expert_parallel_, route, gathered);
    offsets = route.offsets;
  }
  const int64_t n = gathered.dim(0);  // the rows the experts here run on
  Tensor gate_up = empty_act(n, 2 * im), rows = empty_act(n, hidden);
  if (train) {
    save->gate_up_in.resize(size_t(E));
    save->down_in.resize(size_t(E));
  }
  const ExpertStretch x =
      offsets_on_device ? ExpertStretch{0, E, {}} : expert_stretch(expert_parallel_, expert_parallel, offsets);
  Tensor on_device;
  if (grouped_fp8_experts()) {
    // Without expert parallelism the stretch is every expert: the plan's offsets.
    on_device = expert_parallel ? device_offsets(x.offsets, device()) : plan.device_offsets;
    const auto grouped = [&](Tensor& y, const Fp8Rows& in, const StackedFp8Weight& stack) {
      const Fp8Weight experts = stack.range(x.first, x.count);
      if (offsets_on_device) return gemm_fp8_grouped(y, in, experts.w, t, on_device);
      gemm_fp8_grouped(y, in, experts.w, x.offsets, on_device);
    };
    grouped(gate_up, quantized_rows(gathered), w.gate_up_fp8);
    Fp8Rows a = Fp8Rows::empty(n, im, device());
    if (train) {
      // swiglu_forward_fp8's composition, keeping the bf16 output for each expert's columnwise copy.
      Tensor act = empty_act(n, im);
      swiglu_forward(act, gate_up);
      quantize_rows(a, act);
      for_each_expert_with_rows(offsets, [&](int64_t e, int64_t begin, int64_t end) {
        save->gate_up_in[size_t(e)] = linear_saved_input(recipe_, gathered.rows(begin, end));
        save->down_in[size_t(e)] = linear_saved_input(recipe_, act.rows(begin, end));
      });
    } else {
      Fp8Rows no_columns;
      swiglu_forward_fp8(a, no_columns, gate_up);
    }
    grouped(rows, a, w.down_fp8);
  } else if (grouped_bf16_experts()) {
    gemm_bf16_grouped_fprop(gate_up, gathered, bf16_copies(w.gate_up, x.first, x.count), x.offsets);
    Tensor act = empty_act(n, im);
    swiglu_forward(act, gate_up);
    gemm_bf16_grouped_fprop(rows, act, bf16_copies(w.down, x.first, x.count), x.offsets);
    if (train) {  // what keep_for_backward keeps in bf16: the inputs
      for_each_expert_with_rows(offsets, [&](int64_t e, int64_t begin, int64_t end) {
        save->gate_up_in[size_t(e)].act = gathered.rows(begin, end);
        save->down_in[size_t(e)].act = act.rows(begin, end);
      });
    }
  } else {
    for_each_expert_with_rows(offsets, [&](int64_t e, int64_t begin, int64_t end) {
      LinearInput in = linear_input(recipe_, gathered.rows(begin, end), train);
      Tensor gate_up_e = gate_up.rows(begin, end);
      linear_forward(gate_up_e, in, w.gate_up[size_t(e)], Tensor());
      LinearInput a = swiglu_input(gate_up_e, train);
      Tensor y = rows.rows(begin, end);
      linear_forward(y, a, w.down[size_t(e)], Tensor());
      if (train) {
        keep_for_backward(in);
        keep_for_backward(a);
        save->gate_up_in[size_t(e)] = std::move(in);
        save->down_in[size_t(e)] = std::move(a);
      }
    });
  }
  if (expert_parallel) rows = return_from_owners(expert_parallel_, route, rows);
  Tensor out = empty_act(t, hidden);
  moe_combine_forward(out, rows, plan.slots, weights);

  if (stats) {
    stats->expert_ids = router_ids;
    stats->expert_tokens.resize(size_t(E));
    for (int64_t e = 0; e < E; ++e)
      stats->expert_tokens[size_t(e)] = plan.offsets[size_t(e + 1)] - plan.offsets[size_t(e)];
    stats->prob_sums = column_sums(probs);
    if (train) {
      const Tensor l = lse.is_cuda() ? lse.to(Device::cpu) : lse;
      for (int64_t r = 0; r < t; ++r) stats->lse_square_sum += double(l.data_as<float>()[r]) * l.data_as<float>()[r];
    }
  }
  if (train) {
    save->hn = hn;
    save->probs = std::move(probs);
    save->expert_ids = std::move(expert_ids);
    save->weights = std::move(weights);
    save->lse = std::move(lse);
    save->dispatch = std::move(plan);
    save->rows = std::move(rows);
    save->gate_up = std::move(gate_up);
    save->expert_parallel = std::move(route);
    save->grouped_offsets = std::move(on_device);
  }
  return out;
}

Tensor Transformer::moe_backward(size_t i, MoeActivations& s, const Tensor& dout, const Tensor& dprobs,
                                 float z_scale) {
  const MoeConfig& m = *config_.moe;
  const MoeWeights& w = weights_[i].moe;
  LayerParameters& g = grads_.layers[i];
  const int64_t t = dout.dim(0), hidden = config_.hidden_size, E = m.num_experts;
  const int64_t im = m.moe_intermediate_size;

  // out = Σ_j w_j · rows[slots[t, j]]
  Tensor drows = empty_act(s.rows.dim(0), hidden), dweights = Tensor::empty(s.weights.shape(), DType::f32, device());
  moe_combine_backward(drows, dweights, dout, s.rows, s.dispatch.slots, s.weights);
  s.rows = Tensor();
  // Expert parallelism: the row gradients go to the experts' owners the forward's way.
  const bool expert_parallel = !s.expert_parallel.offsets.empty();
  const std::vector<int64_t>& offsets = expert_parallel ? s.expert_parallel.offsets : s.dispatch.offsets;
  if (expert_parallel) drows = send_to_owners(expert_parallel_, s.expert_parallel, drows);
  const int64_t rows = drows.dim(0);

  // rows[e's] = down_e(swiglu(gate_up_e(gathered[e's])))
  Tensor dgathered = empty_act(rows, hidden), no_bias;
  const ExpertStretch x = expert_stretch(expert_parallel_, expert_parallel, offsets);
  if (grouped_fp8_experts()) {
    // The DGrads grouped (the Wᵀ stacks), each expert's WGrad on its own rows.
    const Tensor& on_device = s.grouped_offsets;
    Tensor da = empty_act(rows, im), dgate_up = empty_act(rows, 2 * im);
    gemm_fp8_grouped(da, quantized_rows(drows), w.down_fp8.range(x.first, x.count).wt, x.offsets, on_device);
    swiglu_backward(dgate_up, da, s.gate_up);
    gemm_fp8_grouped(dgathered, quantized_rows(dgate_up), w.gate_up_fp8.range(x.first, x.count).wt, x.offsets,
                     on_device);
    for_each_expert_with_rows(offsets, [&](int64_t e, int64_t begin, int64_t end) {
      ExpertParameters& ge = g.experts[size_t(e)];
      expert_wgrad(ge.down, drows.rows(begin, end), s.down_in[size_t(e)]);
      expert_wgrad(ge.gate_up, dgate_up.rows(begin, end), s.gate_up_in[size_t(e)]);
    });
  } else if (grouped_bf16_experts()) {
    Tensor da = empty_act(rows, im), dgate_up = empty_act(rows, 2 * im);
    gemm_bf16_grouped_dgrad(da, drows, bf16_copies(w.down, x.first, x.count), x.offsets);
    swiglu_backward(dgate_up, da, s.gate_up);
    gemm_bf16_grouped_dgrad(dgathered, dgate_up, bf16_copies(w.gate_up, x.first, x.count), x.offsets);
    for_each_expert_with_rows(offsets, [&](int64_t e, int64_t begin, int64_t end) {
      ExpertParameters& ge = g.experts[size_t(e)];
      gemm_wgrad(ge.down, drows.rows(begin, end), s.down_in[size_t(e)].act, /*accumulate=*/true);
      gemm_wgrad(ge.gate_up, dgate_up.rows(begin, end), s.gate_up_in[size_t(e)].act, /*accumulate=*/true);
    });
  } else {
    for_each_expert_with_rows(offsets, [&](int64_t e, int64_t begin, int64_t end) {
      ExpertParameters& ge = g.experts[size_t(e)];
      Tensor da = empty_act(end - begin, im);
      linear_backward(da, ge.down, no_bias, drows.rows(begin, end), s.down_in[size_t(e)], w.down[size_t(e)]);
      Tensor dgate_up = empty_act(end - begin, 2 * im);
      swiglu_backward(dgate_up, da, s.gate_up.rows(begin, end));
      Tensor dx = dgathered.rows(begin, end);
      linear_backward(dx, ge.gate_up, no_bias, dgate_up, s.gate_up_in[size_t(e)], w.gate_up[size_t(e)]);
    });
  }

  if (expert_parallel) dgathered = return_from_owners(expert_parallel_, s.expert_parallel, dgathered);

  // gathered = hn[token_of_row]: each token's k rows summed back.
  Tensor dhn = empty_act(t, hidden);
  moe_combine_forward(dhn, dgathered, s.dispatch.slots, Tensor());

  // The router: through the weights (and the load-balancing loss's dprobs, the z-loss's lse) to
  // the logits, then its linear layer.
  Tensor dlogits = empty_act(t, E);
  moe_route_backward(dlogits, dweights, dprobs, s.probs, s.expert_ids, s.weights, m.norm_topk_prob,
                     z_scale != 0 ? s.lse : Tensor(), z_scale);
  Tensor dhn_router = empty_act(t, hidden);
  linear_backward(dhn_router, g.router, no_bias, dlogits, linear_saved_input(w.router.recipe, s.hn),
                  w.router);
  add_into(dhn, dhn_router);
  return dhn;
}

}  // namespace lockstep
