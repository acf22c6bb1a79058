// model/transformer.cpp
#include "model/transformer.h"

#include <optional>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/kv_fp8.h"
#include "ops/lm_head.h"
#include "ops/qkv_rope.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu.h"

namespace lockstep {

struct Transformer::LayerActivations {
  Tensor x, input_rstd;      // layer input (residual), its norm's rstd
  LinearInput qkv_in;        // normed x as the qkv projection keeps it
  Tensor qkv_raw;            // projection output before q/k norm + RoPE (the attention input
                             // and q/k rstd are remade from it in the backward: cheaper than
                             // keeping them)
  Tensor attn, lse;          // attention output, log-sum-exp
  Tensor h, post_rstd;       // residual after attention, its norm's rstd
  LinearInput gate_up_in;
  Tensor gate_up;            // SwiGLU input (not with fp8 and recompute)
  Fp8Rows gate_up_fp8;       // fp8 with recompute: the SwiGLU input in E4M3, 1×128 groups, read
                             // as such by the SwiGLU ops (never dequantized into memory)
  LinearInput down_in;
  MoeActivations moe;        // sparse layers: instead of gate_up_in, gate_up(_fp8), down_in
};

struct TrainActivations {
  Tensor tokens, targets, cu_seqlens, positions;
  float temperature = 1;
  std::vector<Transformer::LayerActivations> layers;
  Tensor x_final, final_rstd, h_final, lse;
  Tensor head_logits;  // without recompute: the LM head's logits (ops/lm_head.h's kept logits)
};

namespace {

// A host copy of a small i32 tensor, wherever it lives.
std::vector<int32_t> host_i32(const Tensor& t) {
  const Tensor c = t.device() == Device::cpu ? t : t.to(Device::cpu);
  const int32_t* p = c.data_as<int32_t>();
  return {p, p + c.numel()};
}

void check_i32_vector(const Tensor& t, const char* what) {
  check_tensor(t, what, DType::i32, t.device());
  LOCKSTEP_CHECK(t.rank() == 1, what, ": expected a 1-D tensor, got ", t.describe());
}

// positions[t] = t − (start of t's sequence), from checked cu_seqlens.
Tensor positions_of(const Tensor& cu_seqlens, int64_t tokens, Device device) {
  const std::vector<int32_t> cu = host_i32(cu_seqlens);
  LOCKSTEP_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == tokens,
                 "batch: cu_seqlens must run from 0 to the token count ", tokens);
  Tensor pos = Tensor::empty({tokens}, DType::i32);
  int32_t* p = pos.data_as<int32_t>();
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    LOCKSTEP_CHECK(cu[s] <= cu[s + 1], "batch: cu_seqlens must not decrease (entry ", s + 1, ")");
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) p[t] = t - cu[s];
  }
  return device == Device::cpu ? pos : pos.to(device);
}

// Every linear layer of a layer (the dense MLP's or the sparse one's; const for a const layer).
template <class Weights>
auto linear_weights(Weights& w, bool experts = true) {
  std::vector<decltype(&w.qkv)> all{&w.qkv, &w.o};
  if (w.moe.gate_up.empty()) {
    all.push_back(&w.gate_up);
    all.push_back(&w.down);
    return all;
  }
  all.push_back(&w.moe.router);
  for (size_t e = 0; experts && e < w.moe.gate_up.size(); ++e) {
    all.push_back(&w.moe.gate_up[e]);
    all.push_back(&w.moe.down[e]);
  }
  return all;
}

std::optional<RopeScaling> rope_scaling_of(const ModelConfig& c) {
  if (!c.rope_scaling) return std::nullopt;
  return RopeScaling{c.rope_scaling->factor, c.rope_scaling->low_freq_factor,
                     c.rope_scaling->high_freq_factor,
                     double(c.rope_scaling->original_max_position_embeddings)};
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, ModelParameters params, Recipe recipe,
                         TransformerOptions options)
    : config_(config),
      recipe_(recipe),
      layout_{config.num_attention_heads, config.num_key_value_heads, config.head_dim},
      eps_(float(config.rms_norm_eps)),
      trainable_(options.trainable),
      fp8_kv_cache_(options.fp8_kv_cache),
      grouped_experts_(options.grouped_experts),
      device_(params.embed.device()),
      params_(std::move(params)) {
  check_head_layout(layout_);
  LOCKSTEP_CHECK(params_.layers.size() == size_t(config.num_hidden_layers),
                 "model: parameters have ", params_.layers.size(), " layers, the config ",
                 config.num_hidden_layers);
  LOCKSTEP_CHECK(recipe != Recipe::fp32 || device() == Device::cpu,
                 "the fp32 recipe runs on the CPU only");
  if (trainable_) grads_ = ModelParameters::zeros(config_, device());
  for (LayerParameters& l : params_.layers) {
    LayerWeights w;
    w.qkv = LinearWeight(recipe_, l.qkv);
    w.o = LinearWeight(recipe_, l.o);
    if (l.experts.empty()) {
      w.gate_up = LinearWeight(recipe_, l.gate_up);
      w.down = LinearWeight(recipe_, l.down);
    } else {
      // The router stays out of fp8 (routing decisions are the most precision-sensitive step):
      // bf16 in the fp8 recipe, as in the bf16 one.
      w.moe.router = LinearWeight(recipe_ == Recipe::fp32 ? Recipe::fp32 : Recipe::bf16, l.router);
      // fp8: the experts' copies in one stack per projection (gemm_fp8_grouped reads them there).
      const int64_t experts = int64_t(l.experts.size()), im = config_.moe->moe_intermediate_size;
      const bool fp8 = recipe_ == Recipe::fp8;
      if (fp8) {
        w.moe.gate_up_fp8 = StackedFp8Weight::empty(0, experts, 2 * im, config_.hidden_size, device(), true);
        w.moe.down_fp8 = StackedFp8Weight::empty(0, experts, config_.hidden_size, im, device(), true);
      }
      for (int64_t e = 0; e < experts; ++e) {
        const ExpertParameters& p = l.experts[size_t(e)];
        w.moe.gate_up.emplace_back(recipe_, p.gate_up, fp8 ? w.moe.gate_up_fp8.expert(e) : Fp8Weight());
        w.moe.down.emplace_back(recipe_, p.down, fp8 ? w.moe.down_fp8.expert(e) : Fp8Weight());
      }
    }
    weights_.push_back(std::move(w));
  }
  const Tensor freq = rope_inv_freq(config_.head_dim, config_.rope_theta, rope_scaling_of(config_));
  inv_freq_ = device() == Device::cpu ? freq : freq.to(device());
  refresh_weights();
  if (trainable_) return;
  release_masters();
  for (LayerWeights& w : weights_) {  // DGrad's only
    for (LinearWeight* l : linear_weights(w)) l->fp8.wt = Fp8Blocks();
    for (StackedFp8Weight* s : {&w.moe.gate_up_fp8, &w.moe.down_fp8}) s->all.wt = Fp8Blocks();
  }
}

void Transformer::release_masters() {
  if (recipe_ == Recipe::fp32) return;  // fp32 GEMMs read the masters themselves
  params_.embed = params_.lm_head = Tensor();
  for (LayerParameters& p : params_.layers) {
    p.qkv = p.o = p.gate_up = p.down = p.router = Tensor();
    for (ExpertParameters& e : p.experts) e.gate_up = e.down = Tensor();
  }
  for (LayerWeights& w : weights_)
    for (LinearWeight* l : linear_weights(w)) l->master = Tensor();
  masters_released_ = true;
}

void Transformer::allocate_layer_copies(int64_t layer, bool with_transpose, bool own_experts_only) {
  LayerWeights& w = weights_.at(size_t(layer));
  if (!w.moe.gate_up.empty()) {
    const int64_t E = int64_t(w.moe.gate_up.size());
    const bool own = own_experts_only && expert_parallel_.on();
    const int64_t first = own ? expert_parallel_.first_expert(E) : 0;
    const int64_t count = own ? expert_parallel_.experts_per_rank(E) : E;
    if (recipe_ == Recipe::fp8 && !w.moe.gate_up_fp8.all.w.data.defined())
      w.moe.stack_fp8_copies(config_.hidden_size, config_.moe->moe_intermediate_size, device(), with_transpose,
                             first, count);
    for (int64_t e = first; e < first + count; ++e) {
      w.moe.gate_up[size_t(e)].allocate_copy(device(), with_transpose);
      w.moe.down[size_t(e)].allocate_copy(device(), with_transpose);
    }
  }
  for (LinearWeight* l : linear_weights(w, /*experts=*/false)) l->allocate_copy(device(), with_transpose);
}

void Transformer::drop_layer_copies(int64_t layer) {
  LayerWeights& w = weights_.at(size_t(layer));
  for (LinearWeight* l : linear_weights(w)) l->drop_copy();
  w.moe.gate_up_fp8 = w.moe.down_fp8 = StackedFp8Weight();  // (freed with the experts' views)
}

DType Transformer::activation_dtype() const { return lockstep::activation_dtype(recipe_); }
DType Transformer::kv_cache_dtype() const { return fp8_kv_cache_ ? DType::e4m3 : activation_dtype(); }
Device Transformer::device() const { return device_; }

Tensor Transformer::empty_act(int64_t rows, int64_t cols) const {
  return Tensor::empty({rows, cols}, activation_dtype(), device());
}

void Transformer::refresh_weights() {
  // An inference-only model makes its copies once, in the constructor, before the release.
  LOCKSTEP_CHECK(!masters_released_,
                 "refresh_weights: this model's fp32 masters were released once its weight copies "
                 "were made (an inference-only model, TransformerOptions::trainable = false, or one "
                 "whose masters a sharded optimizer holds: it writes the copies)");
  for (LayerWeights& w : weights_)
    for (LinearWeight* l : linear_weights(w)) l->refresh();
  if (recipe_ == Recipe::fp32) {
    embed_ = params_.embed;
    head_ = params_.lm_head;
    return;
  }
  auto bf16_copy = [&](Tensor& copy, const Tensor& master) {
    if (!master.defined()) return;
    if (!copy.defined()) copy = Tensor::empty(master.shape(), DType::bf16, device());
    convert(copy, master);
  };
  bf16_copy(embed_, params_.embed);
  bf16_copy(head_, params_.lm_head);
}

WeightCopies Transformer::weight_copies(const std::string& name) {
  if (recipe_ == Recipe::fp32) return {};  // the GEMMs read the masters themselves
  if (name == "embed") return {.bf16 = &embed_};
  if (name == "lm_head") return {.bf16 = &head_};
  for (size_t i = 0; i < weights_.size(); ++i) {
    const std::string pre = "layers." + std::to_string(i) + ".";
    if (!name.starts_with(pre)) continue;
    LayerWeights& w = weights_[i];
    const std::string rest = name.substr(pre.size());
    LinearWeight* l = rest == "qkv" ? &w.qkv : rest == "o" ? &w.o : rest == "gate_up" ? &w.gate_up
                    : rest == "down" ? &w.down : rest == "router" ? &w.moe.router : nullptr;
    if (!l && rest.starts_with("experts.")) {  // experts.<e>.gate_up / experts.<e>.down
      const size_t dot = rest.find('.', 8);
      const size_t e = size_t(std::stoul(rest.substr(8, dot - 8)));
      if (e < w.moe.gate_up.size())
        l = rest.substr(dot + 1) == "gate_up" ? &w.moe.gate_up[e] : &w.moe.down[e];
    }
    if (!l) return {};
    return l->recipe == Recipe::fp8 ? WeightCopies{.fp8 = &l->fp8} : WeightCopies{.bf16 = &l->bf16};
  }
  return {};
}

int64_t Transformer::weight_copy_bytes(bool embedding_and_head) const {
  if (recipe_ == Recipe::fp32) return 0;
  int64_t bytes = 0;
  if (embedding_and_head)
    for (const Tensor* t : {&embed_, &head_}) bytes += t->defined() ? int64_t(t->nbytes()) : 0;
  for (const LayerWeights& w : weights_)
    for (const LinearWeight* l : linear_weights(w))
      for (const Tensor* t : {&l->bf16, &l->fp8.w.data, &l->fp8.w.scales, &l->fp8.wt.data, &l->fp8.wt.scales})
        bytes += t->defined() ? int64_t(t->nbytes()) : 0;
  return bytes;
}

void Transformer::set_expert_parallel(ExpertParallel ep) {
  LOCKSTEP_CHECK(config_.moe, "set_expert_parallel: the model has no sparse layers");
  check_expert_parallel(config_.moe->num_experts, ep.ranks);
  LOCKSTEP_CHECK(ep.rank >= 0 && ep.rank < ep.ranks && ep.all_to_all, "set_expert_parallel: rank ",
                 ep.rank, " of ", ep.ranks, (ep.all_to_all ? "" : " without an all_to_all"));
  expert_parallel_ = std::move(ep);
}

void Transformer::skip_forward() {
  if (expert_parallel_.on()) {
    // One token of its own; the forward serves the other ranks' rows of this rank's experts.
    const Tensor zero = Tensor::zeros({1}, DType::i32, device());
    Tensor cu = Tensor::zeros({2}, DType::i32);
    cu.data_as<int32_t>()[1] = 1;
    skipped_ = std::make_shared<TrainForward>(forward({zero, zero, cu.to(device())}));
    return;
  }
  const int64_t layers = int64_t(params_.layers.size());
  if (!weight_source_.wanted) return;
  for (int64_t i = 0; i < layers; ++i) {
    weight_source_.wanted(i, i + 1 < layers ? i + 1 : -1);
    weight_source_.done(i);
  }
}

void Transformer::skip_backward(TrainForward* forward) {
  if (expert_parallel_.on()) {
    LOCKSTEP_CHECK(forward || skipped_, "skip_backward: with expert parallelism it backpropagates a "
                   "forward: the skipped one (skip_forward() first) or the one given");
    TrainForward& f = forward ? *forward : *skipped_;
    backward(f, Tensor::zeros(f.logprob.shape(), DType::f32, device()), Tensor());
    skipped_.reset();
    return;
  }
  // backward()'s hooks, in its order.
  const std::vector<std::vector<std::string>> groups =
      gradients_ready_ ? gradient_groups() : std::vector<std::vector<std::string>>();
  if (gradients_ready_) gradients_ready_(groups.front());
  for (size_t i = params_.layers.size(); i-- > 0;) {
    if (weight_source_.wanted) weight_source_.wanted(int64_t(i), int64_t(i) - 1);
    if (weight_source_.done) weight_source_.done(int64_t(i));
    if (gradients_ready_) gradients_ready_(groups[params_.layers.size() - i]);
  }
  if (gradients_ready_) gradients_ready_(groups.back());
}

void Transformer::report_gradients_per_layer(GradientsReady ready) {
  LOCKSTEP_CHECK(trainable_, "report_gradients_per_layer: this model is inference-only: it has no gradients");
  gradients_ready_ = std::move(ready);
  // One set of layer gradient buffers per kind of layer (dense, or sparse: the MoE configs'
  // mlp_only_layers differ from the rest), zero.
  for (size_t i = 0; i < grads_.layers.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (grads_.layers[j].experts.size() == grads_.layers[i].experts.size()) {
        grads_.layers[i] = grads_.layers[j];
        break;
      }
  grads_.zero();
}

std::vector<std::vector<std::string>> Transformer::gradient_groups() const {
  std::vector<std::vector<std::string>> groups(params_.layers.size() + 2);
  grads_.for_each([&](const std::string& name, const Tensor&) {
    if (name == "embed") {
      groups.back().push_back(name);
    } else if (name.starts_with("layers.")) {
      const size_t i = std::stoul(name.substr(7));
      groups[params_.layers.size() - i].push_back(name);  // the last layer's first
    } else {
      groups.front().push_back(name);
    }
  });
  return groups;
}

void Transformer::share_embedding_copies(const Transformer& other) {
  LOCKSTEP_CHECK(recipe_ != Recipe::fp32 && other.recipe_ != Recipe::fp32 && config_ == other.config_,
                 "share_embedding_copies: models of different configs or an fp32 recipe");
  embed_ = other.embed_;
  head_ = other.head_;
}

void Transformer::layer_forward(size_t i, Tensor& x, Tensor& residual, const Tensor& positions,
                                const Attend& attend, LayerActivations* save, const KvWrite* kv,
                                RouterStats* stats, const Tensor* replay, Tensor* routing) {
  const LayerParameters& p = params_.layers[i];
  const LayerWeights& w = weights_[i];
  const int64_t t = x.dim(0), hidden = config_.hidden_size;
  const bool train = save != nullptr;

  Tensor input_rstd = Tensor::empty({t}, DType::f32, device());
  LinearInput qkv_in = normed_input(x, residual, p.input_norm, input_rstd, train);
  tap(i, "input", x);
  tap(i, "attn_norm", qkv_in);
  Tensor qkv_raw = empty_act(t, layout_.qkv_width());
  linear_forward(qkv_raw, qkv_in, w.qkv, p.qkv_bias);
  tap(i, "qkv", qkv_raw);

  Tensor qkv = empty_act(t, layout_.qkv_width()), qk_rstd;
  if (config_.qk_norm)
    qk_rstd = Tensor::empty({t, layout_.q_heads + layout_.kv_heads}, DType::f32, device());
  if (kv) {
    qkv_rope_forward(qkv, qk_rstd, kv->cache.layers[i], kv->slots, qkv_raw, positions, inv_freq_, p.q_norm,
                     p.k_norm, layout_, eps_);
    tap(i, "qk_norm_rope", qkv);
  } else {
    qkv_rope_forward(qkv, qk_rstd, qkv_raw, positions, inv_freq_, p.q_norm, p.k_norm, layout_, eps_);
    tap(i, "qk_norm_rope", qkv);
    if (fp8_kv_cache_) round_kv_to_fp8(qkv, layout_);  // what the rollout's cache holds
  }
  // The attention output is kept for the attention backward anyway (by attend); in fp8 the o
  // projection's columnwise copy is remade from it there rather than stored.
  const LinearInput attn = attend(i, qkv, save);
  tap(i, "attention", attn);
  Tensor h = empty_act(t, hidden);
  linear_forward(h, attn, w.o, p.o_bias);
  tap(i, "o_proj", h);

  Tensor post_rstd = Tensor::empty({t}, DType::f32, device());
  Tensor out, gate_up;
  LinearInput gate_up_in, down_in;
  if (config_.is_moe_layer(int64_t(i))) {
    // Sparse: the experts' inputs are gathered (and, in fp8, quantized) per expert from the normed
    // rows, so the norm writes them in the activation dtype.
    Tensor hn = empty_act(t, hidden);
    rmsnorm_forward(hn, post_rstd, h, x, p.post_norm, eps_);
    tap(i, "mlp_norm", hn);
    out = moe_forward(i, hn, train ? &save->moe : nullptr, stats, replay,
                      /*expert_parallel=*/!kv && expert_parallel_.on(), routing);
    tap(i, "moe", out);
  } else {
    gate_up_in = normed_input(h, x, p.post_norm, post_rstd, train);
    tap(i, "mlp_norm", gate_up_in);
    gate_up = empty_act(t, 2 * config_.intermediate_size);
    linear_forward(gate_up, gate_up_in, w.gate_up, p.gate_up_bias);
    tap(i, "gate_up", gate_up);
    down_in = swiglu_input(gate_up, train && !recompute_);
    tap(i, "swiglu", down_in);
    out = empty_act(t, hidden);
    linear_forward(out, down_in, w.down, p.down_bias);
    tap(i, "down", out);
  }

  if (train) {
    save->x = x;
    save->input_rstd = input_rstd;
    save->qkv_raw = qkv_raw;
    save->h = h;
    save->post_rstd = post_rstd;
    // (A sparse layer's MLP has no gate_up here: moe_forward kept what its backward reads.)
    const bool dense = gate_up.defined();
    if (dense && recompute_ && recipe_ == Recipe::fp8 && gate_up.dim(1) % kQuantGroup == 0) {
      // As DeepSeek-V3 does: the SwiGLU input [T, 2I] — the largest activation kept — is kept in
      // E4M3, and the backward runs the SwiGLU backward and the down projection's WGrad on what it
      // remakes from it (recompute_inputs). (2I a multiple of 128, as ops/swiglu.h's E4M3 input
      // must be; other widths keep gate_up in bf16.)
      save->gate_up_fp8 = Fp8Rows::empty(t, gate_up.dim(1), device());
      quantize_rows(save->gate_up_fp8, gate_up);
    } else if (dense) {
      save->gate_up = gate_up;
    }
    if (!recompute_) {  // otherwise remade by recompute_inputs
      keep_for_backward(qkv_in);
      save->qkv_in = std::move(qkv_in);
      if (dense) {
        for (LinearInput* in : {&gate_up_in, &down_in}) keep_for_backward(*in);
        save->gate_up_in = std::move(gate_up_in);
        save->down_in = std::move(down_in);
      }
    }
  }
  x = std::move(out);
  residual = std::move(h);
}

// In fp8 the norm writes the E4M3 copies directly (no bf16 output in memory).
LinearInput Transformer::normed_input(Tensor& x, const Tensor& residual, const Tensor& w,
                                      Tensor& rstd, bool for_backward) const {
  const int64_t t = x.dim(0), hidden = config_.hidden_size;
  if (recipe_ != Recipe::fp8) {
    Tensor xn = empty_act(t, hidden);
    rmsnorm_forward(xn, rstd, x, residual, w, eps_);
    return linear_input(recipe_, xn, for_backward);
  }
  LinearInput in;
  in.rows = Fp8Rows::empty(t, hidden, device());
  if (for_backward) in.cols = Fp8Rows::empty_columnwise(t, hidden, device());
  rmsnorm_forward_fp8(in.rows, in.cols, rstd, x, residual, w, eps_);
  return in;
}

LinearInput Transformer::swiglu_input(const Tensor& gate_up, bool for_backward) const {
  const int64_t t = gate_up.dim(0), inter = gate_up.dim(1) / 2;
  if (recipe_ != Recipe::fp8) {
    Tensor a = empty_act(t, inter);
    swiglu_forward(a, gate_up);
    return linear_input(recipe_, a, for_backward);
  }
  LinearInput in;
  in.rows = Fp8Rows::empty(t, inter, device());
  if (for_backward) in.cols = Fp8Rows::empty_columnwise(t, inter, device());
  swiglu_forward_fp8(in.rows, in.cols, gate_up);
  return in;
}

// The same bits the forward made (every op is deterministic), from what it kept; in fp8 the SwiGLU
// input is its E4M3 copy, so its output (the down projection's WGrad input) and the SwiGLU backward
// see the quantized values. A sparse layer's MLP keeps its inputs (moe_forward): only the qkv
// projection's is remade there.
void Transformer::recompute_inputs(size_t i, LayerActivations& s) const {
  const LayerParameters& p = params_.layers[i];
  Tensor rstd = Tensor::empty({s.x.dim(0)}, DType::f32, device());
  s.qkv_in = normed_input(s.x, Tensor(), p.input_norm, rstd, true);
  if (config_.is_moe_layer(int64_t(i))) {
    keep_for_backward(s.qkv_in);
    return;
  }
  s.gate_up_in = normed_input(s.h, Tensor(), p.post_norm, rstd, true);
  if (s.gate_up_fp8.data.defined()) {  // straight from the E4M3 input (ops/swiglu.h): no bf16 copy
    const int64_t t = s.gate_up_fp8.rows(), inter = config_.intermediate_size;
    s.down_in.rows = Fp8Rows::empty(t, inter, device());
    s.down_in.cols = Fp8Rows::empty_columnwise(t, inter, device());
    swiglu_forward_fp8(s.down_in.rows, s.down_in.cols, s.gate_up_fp8);
  } else {
    s.down_in = swiglu_input(s.gate_up, true);
  }
  for (LinearInput* in : {&s.qkv_in, &s.gate_up_in, &s.down_in}) keep_for_backward(*in);
}

Tensor Transformer::layer_backward(size_t i, LayerActivations& s, const Tensor& dout,
                                   const Tensor& positions, const Tensor& cu_seqlens,
                                   const Tensor& dprobs, float z_scale) {
  const LayerParameters& p = params_.layers[i];
  LayerParameters& g = grads_.layers[i];
  const LayerWeights& w = weights_[i];
  const int64_t t = dout.dim(0), hidden = config_.hidden_size;
  if (recompute_) recompute_inputs(i, s);

  // out = h + down(swiglu(gate_up(norm(h)))), or h + moe(norm(h))
  Tensor dhn;
  if (config_.is_moe_layer(int64_t(i))) {
    dhn = moe_backward(i, s.moe, dout, dprobs, z_scale);
  } else {
    Tensor da = empty_act(t, config_.intermediate_size);
    linear_backward(da, g.down, g.down_bias, dout, s.down_in, w.down);
    Tensor dgate_up = empty_act(t, 2 * config_.intermediate_size);
    if (s.gate_up_fp8.data.defined()) swiglu_backward(dgate_up, da, s.gate_up_fp8);
    else swiglu_backward(dgate_up, da, s.gate_up);
    dhn = empty_act(t, hidden);
    linear_backward(dhn, g.gate_up, g.gate_up_bias, dgate_up, s.gate_up_in, w.gate_up);
  }
  Tensor dh = empty_act(t, hidden);
  rmsnorm_backward(dh, g.post_norm, dhn, s.h, p.post_norm, s.post_rstd);
  add_into(dh, dout);

  // h = x + o(attention(rope(qk_norm(qkv(norm(x))))))
  Tensor dattn = empty_act(t, layout_.q_width());
  linear_backward(dattn, g.o, g.o_bias, dh, linear_saved_input(recipe_, s.attn), w.o);
  Tensor qkv = empty_act(t, layout_.qkv_width()), qk_rstd;
  if (config_.qk_norm)
    qk_rstd = Tensor::empty({t, layout_.q_heads + layout_.kv_heads}, DType::f32, device());
  qkv_rope_forward(qkv, qk_rstd, s.qkv_raw, positions, inv_freq_, p.q_norm, p.k_norm, layout_, eps_);
  if (fp8_kv_cache_) round_kv_to_fp8(qkv, layout_);  // the forward's k and v; gradients pass straight through
  Tensor dqkv = empty_act(t, layout_.qkv_width());
  attention_backward(dqkv, dattn, qkv, s.attn, s.lse, cu_seqlens, layout_);
  Tensor dqkv_raw = empty_act(t, layout_.qkv_width());
  qkv_rope_backward(dqkv_raw, g.q_norm, g.k_norm, dqkv, s.qkv_raw, positions, inv_freq_, p.q_norm,
                    p.k_norm, qk_rstd, layout_);
  Tensor dxn = empty_act(t, hidden);
  linear_backward(dxn, g.qkv, g.qkv_bias, dqkv_raw, s.qkv_in, w.qkv);
  Tensor dx = empty_act(t, hidden);
  rmsnorm_backward(dx, g.input_norm, dxn, s.x, p.input_norm, s.input_rstd);
  add_into(dx, dh);
  return dx;
}

Tensor Transformer::trunk(const TrainBatch& batch, TrainActivations* saved,
                          std::vector<RouterStats>* routing) {
  check_i32_vector(batch.tokens, "batch tokens");
  check_i32_vector(batch.targets, "batch targets");
  check_i32_vector(batch.cu_seqlens, "batch cu_seqlens");
  const int64_t t = batch.tokens.dim(0);
  LOCKSTEP_CHECK(batch.targets.dim(0) == t, "batch: ", t, " tokens but ", batch.targets.dim(0),
                 " targets");
  const Tensor positions = positions_of(batch.cu_seqlens, t, device());

  Tensor x = empty_act(t, config_.hidden_size);
  embedding_forward(x, batch.tokens, embed_);
  const Attend attend = [&](size_t, const Tensor& qkv, LayerActivations* save) {
    Tensor out = empty_act(qkv.dim(0), layout_.q_width());
    Tensor lse = Tensor::empty({qkv.dim(0), layout_.q_heads}, DType::f32, device());
    attention_forward(out, lse, qkv, batch.cu_seqlens, layout_);
    if (save) save->attn = out, save->lse = lse;
    return linear_input(recipe_, out, false);
  };
  int64_t sparse_layers = 0;
  for (size_t i = 0; i < params_.layers.size(); ++i) sparse_layers += config_.is_moe_layer(int64_t(i));
  const Tensor& replay = batch.replay_experts;
  if (replay.defined()) {
    LOCKSTEP_CHECK(sparse_layers > 0, "batch replay_experts: the model has no sparse layers to replay");
    LOCKSTEP_CHECK(replay.device() == Device::cpu && replay.dtype() == DType::i32 && replay.rank() == 3 &&
                       replay.dim(0) == sparse_layers && replay.dim(1) == t &&
                       replay.dim(2) == config_.moe->num_experts_per_tok,
                   "batch replay_experts: expected i32 [", sparse_layers, ", ", t, ", ",
                   config_.moe->num_experts_per_tok, "] on the host (sparse layers, tokens, k), got ",
                   replay.describe());
  }
  if (saved) saved->layers.resize(params_.layers.size());
  Tensor residual;
  for (size_t i = 0, sparse = 0; i < params_.layers.size(); ++i) {
    RouterStats* stats = nullptr;
    Tensor layer_replay;
    if (config_.is_moe_layer(int64_t(i))) {
      if (routing) stats = &routing->emplace_back();
      if (replay.defined()) layer_replay = replay.rows(int64_t(sparse), int64_t(sparse) + 1).reshape({t, replay.dim(2)});
      ++sparse;
    }
    const int64_t layers = int64_t(params_.layers.size());
    if (weight_source_.wanted) weight_source_.wanted(int64_t(i), int64_t(i) + 1 < layers ? int64_t(i) + 1 : -1);
    layer_forward(i, x, residual, positions, attend, saved ? &saved->layers[i] : nullptr, nullptr, stats,
                  layer_replay.defined() ? &layer_replay : nullptr);
    if (weight_source_.done) weight_source_.done(int64_t(i));
  }

  // The final norm adds the last layer's residual into x (kept as x_final).
  Tensor h = empty_act(t, config_.hidden_size), rstd = Tensor::empty({t}, DType::f32, device());
  rmsnorm_forward(h, rstd, x, residual, params_.final_norm, eps_);
  tap(params_.layers.size(), "final_norm", h);
  if (saved) {
    saved->tokens = batch.tokens;
    saved->targets = batch.targets;
    saved->cu_seqlens = batch.cu_seqlens;
    saved->positions = positions;
    saved->x_final = x;
    saved->final_rstd = rstd;
    saved->h_final = h;
  }
  return h;
}

TrainForward Transformer::forward(const TrainBatch& batch, float temperature, bool for_backward) {
  LOCKSTEP_CHECK(temperature > 0, "temperature must be positive, got ", temperature);
  auto saved = for_backward ? std::make_shared<TrainActivations>() : nullptr;
  TrainForward result;
  const Tensor h = trunk(batch, saved.get(), &result.routing);
  const int64_t t = h.dim(0);
  result.logprob = Tensor::empty({t}, DType::f32, device());
  result.entropy = Tensor::empty({t}, DType::f32, device());
  Tensor lse = Tensor::empty({t}, DType::f32, device());
  Tensor head_logits;
  if (saved && !recompute_) head_logits = Tensor::empty({t * config_.vocab_size}, DType::f32, device());
  lm_head_logprob_forward(result.logprob, result.entropy, lse, h, head_weight(), batch.targets,
                          temperature, head_logits.defined() ? &head_logits : nullptr);
  if (saved) {
    saved->temperature = temperature;
    saved->lse = lse;
    saved->head_logits = head_logits;
    result.saved = std::move(saved);
  }
  return result;
}

Tensor Transformer::hidden_states(const TrainBatch& batch) { return trunk(batch, nullptr, nullptr); }

void Transformer::backward(TrainForward& forward, const Tensor& dlogprob, const Tensor& dentropy,
                           double load_balancing_weight, double router_z_weight) {
  LOCKSTEP_CHECK(trainable_, "backward: this model is inference-only ",
                 "(TransformerOptions::trainable = false): it has no gradients");
  LOCKSTEP_CHECK(forward.saved, "backward: the forward was run without for_backward, or its ",
                 "activations were already used by a backward");
  const std::shared_ptr<TrainActivations> s = std::move(forward.saved);
  const int64_t t = s->tokens.dim(0), hidden = config_.hidden_size;

  Tensor dh = empty_act(t, hidden);
  Tensor& dhead = config_.tie_word_embeddings ? grads_.embed : grads_.lm_head;
  lm_head_logprob_backward(dh, dhead, dlogprob, dentropy, s->h_final, head_weight(), s->targets,
                           s->lse, forward.entropy, s->temperature,
                           s->head_logits.defined() ? &s->head_logits : nullptr);
  s->head_logits = Tensor();
  Tensor dx = empty_act(t, hidden);
  rmsnorm_backward(dx, grads_.final_norm, dh, s->x_final, params_.final_norm, s->final_rstd);
  // The load-balancing loss's gradient w.r.t. the router probabilities: one value per expert, the
  // same for every sparse layer and token (model/moe.h).
  Tensor dprobs;
  if (load_balancing_weight != 0 && !forward.routing.empty()) {
    const std::vector<double> g = load_balancing_gradient(forward.routing);
    const int64_t E = int64_t(g.size());
    Tensor host = Tensor::empty({t, E}, DType::f32);
    for (int64_t r = 0; r < t; ++r)
      for (int64_t e = 0; e < E; ++e)
        host.data_as<float>()[r * E + e] = float(load_balancing_weight * g[size_t(e)]);
    dprobs = device() == Device::cpu ? host : host.to(device());
  }
  // The router z-loss's: (2 · weight / N) · lse_t · probs[t] for every sparse layer's token t.
  float z_scale = 0;
  if (router_z_weight != 0 && !forward.routing.empty())
    z_scale = float(2 * router_z_weight / double(t * int64_t(forward.routing.size())));
  std::vector<std::vector<std::string>> groups;
  if (gradients_ready_) {
    groups = gradient_groups();
    gradients_ready_(groups.front());
  }
  for (size_t i = params_.layers.size(); i-- > 0;) {
    if (weight_source_.wanted) weight_source_.wanted(int64_t(i), int64_t(i) - 1);
    dx = layer_backward(i, s->layers[i], dx, s->positions, s->cu_seqlens, dprobs, z_scale);
    if (weight_source_.done) weight_source_.done(int64_t(i));
    s->layers[i] = LayerActivations();  // free as we go
    if (gradients_ready_) gradients_ready_(groups[params_.layers.size() - i]);
  }
  embedding_backward(grads_.embed, s->tokens, dx);
  if (gradients_ready_) gradients_ready_(groups.back());
}

Tensor Transformer::forward_infer(const InferBatch& batch, KvCache& cache) {
  check_i32_vector(batch.tokens, "infer batch tokens");
  check_i32_vector(batch.cu_seqlens_q, "infer batch cu_seqlens_q");
  check_i32_vector(batch.last_rows, "infer batch last_rows");
  LOCKSTEP_CHECK(cache.layers.size() == params_.layers.size(), "KV cache has ", cache.layers.size(),
                 " layers, the model ", params_.layers.size());
  for (const PagedKv& layer : cache.layers)
    LOCKSTEP_CHECK(layer.k.dtype() == kv_cache_dtype(), "KV cache in ", dtype_name(layer.k.dtype()),
                   ", but this model's is ", dtype_name(kv_cache_dtype()), " (TransformerOptions::fp8_kv_cache: ",
                   "the training forward rounds k and v as an e4m3 cache does)");
  const int64_t t = batch.tokens.dim(0), sequences = batch.last_rows.dim(0);
  LOCKSTEP_CHECK(batch.cu_seqlens_q.dim(0) == sequences + 1, "infer batch: cu_seqlens_q has ",
                 batch.cu_seqlens_q.dim(0), " entries, last_rows ", sequences,
                 " (expected one more)");
  if (batch.routing.defined()) {
    const int64_t sparse = config_.sparse_layers();
    const Tensor& r = batch.routing;
    LOCKSTEP_CHECK(config_.moe && r.dtype() == DType::i32 && r.device() == device() && r.rank() == 3 &&
                       r.dim(0) == sparse && r.dim(1) >= t && r.dim(2) == config_.moe->num_experts_per_tok,
                   "infer batch: routing must be i32 [", sparse, " sparse layers, >= ", t, " rows, k] on the ",
                   "model's device, got ", r.describe());
  }
  if (device() == Device::cpu) {
    const int32_t* cu = batch.cu_seqlens_q.data_as<int32_t>();
    const int32_t* last = batch.last_rows.data_as<int32_t>();
    for (int64_t s = 0; s < sequences; ++s) {
      LOCKSTEP_CHECK(cu[s] < cu[s + 1] && cu[s + 1] <= t, "infer batch: sequence ", s,
                     " has no rows in cu_seqlens_q");
      LOCKSTEP_CHECK(last[s] == cu[s + 1] - 1, "infer batch: last_rows[", s, "] = ", last[s],
                     ", but the sequence's last row is ", cu[s + 1] - 1);
    }
  }

  Tensor x = empty_act(t, config_.hidden_size);
  embedding_forward(x, batch.tokens, embed_);
  const Attend attend = [&](size_t i, const Tensor& qkv, LayerActivations*) {
    if (recipe_ == Recipe::fp8) {
      LinearInput in;
      in.rows = Fp8Rows::empty(qkv.dim(0), layout_.q_width(), device());
      attention_paged_fp8(in.rows, qkv, cache.layers[i], batch.block_tables, batch.cu_seqlens_q,
                          batch.context_lens, layout_, batch.one_row_each);
      return in;
    }
    Tensor out = empty_act(qkv.dim(0), layout_.q_width());
    attention_paged(out, qkv, cache.layers[i], batch.block_tables, batch.cu_seqlens_q,
                    batch.context_lens, layout_, batch.one_row_each);
    return linear_input(recipe_, out, false);
  };
  const KvWrite kv{cache, batch.slots};
  Tensor residual;
  int64_t sparse = 0;  // the sparse layers so far
  for (size_t i = 0; i < params_.layers.size(); ++i) {
    Tensor routing;  // the layer's [T, k] of batch.routing
    if (batch.routing.defined() && config_.is_moe_layer(int64_t(i))) {
      const int64_t k = config_.moe->num_experts_per_tok, rows = batch.routing.dim(1);
      routing = Tensor::view_of(batch.routing.data_as<int32_t>() + sparse++ * rows * k, {t, k}, DType::i32,
                                device());
    }
    layer_forward(i, x, residual, batch.positions, attend, nullptr, &kv, nullptr, nullptr,
                  routing.defined() ? &routing : nullptr);
  }

  Tensor h = empty_act(sequences, config_.hidden_size);
  Tensor rstd = Tensor::empty({sequences}, DType::f32, device());
  if (batch.one_row_each) {  // row s is sequence s's last (attention_paged checked T = S)
    rmsnorm_forward(h, rstd, x, residual, params_.final_norm, eps_);
    tap(params_.layers.size(), "final_norm", h);
    return h;
  }
  // Only each sequence's last row goes on to the head: gathered by row index (the embedding
  // lookup is exactly that gather, with x as the table).
  add_into(x, residual);
  Tensor last = empty_act(sequences, config_.hidden_size);
  embedding_forward(last, batch.last_rows, x);
  rmsnorm_forward(h, rstd, last, params_.final_norm, eps_);
  tap(params_.layers.size(), "final_norm", h);
  return h;
}

Tensor Transformer::logits(const Tensor& hidden) const {
  Tensor out = Tensor::empty({hidden.dim(0), config_.vocab_size}, DType::f32, device());
  lm_head_logits(out, hidden, head_weight());
  return out;
}

}  // namespace lockstep
