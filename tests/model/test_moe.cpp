// Qwen3-MoE: the config fields, the router op (ties, weights, its backward, logsumexp, the weights
// of given experts, the z-loss term), the model's forward against a plain-loop reference in double
// (with replayed experts too), its gradients against finite differences (the load-balancing loss's
// and the router z-loss's too) and the bf16/fp8 recipes' against fp32, routing replay of the
// router's own choices (the same bits), the rollout's record of its routing, the Hugging Face
// checkpoint names, and the router statistics; in fp8 the grouped expert GEMMs against the
// per-expert loop (the same bits) and the experts' copies as views of their stacks. (Rollout = training bit for bit: test_model_generation.cpp's
// qwen3_moe cases.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>

#include "io/safetensors.h"
#include "model/hf_checkpoint.h"
#include "model/transformer.h"
#include "ops/elementwise.h"
#include "ops/moe_combine.h"
#include "ops/moe_dispatch.h"
#include "ops/moe_route.h"
#include "rollout/engine.h"
#include "tests/io/io_test_helpers.h"
#include "tests/model/model_test_util.h"
#include "tests/test_util.h"
#include "train/optimizer.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::pack;
using testing::random_parameters;
using testing::random_sequences;
using testing::Sequences;
using testing::TempDir;
using testing::tiny_config;

std::vector<int32_t> ints(const Tensor& t) {
  const int32_t* p = t.data_as<int32_t>();
  return {p, p + t.numel()};
}

ModelConfig tiny_moe(const testing::TinyShape& shape = {}) { return tiny_config(ModelFamily::qwen3_moe, shape); }

// Three layers (sparse 0 and 2) whose widths the fp8 recipe takes (multiples of 16).
const testing::TinyShape kThreeLayersFp8 = {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64,
                                            .intermediate = 256, .layers = 3, .vocab = 301};

// ---- config.json

const char* kMoeJson = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000.0, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
  "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": true,
  "router_aux_loss_coef": 0.01, "output_router_logits": true
})";

TEST(MoeConfig, ReadsTheSparseFieldsAndWritesThemBack) {
  const ModelConfig c = parse_model_config(kMoeJson, "config.json");
  ASSERT_TRUE(c.moe);
  EXPECT_EQ(c.family, ModelFamily::qwen3_moe);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.moe->num_experts, 8);
  EXPECT_EQ(c.moe->num_experts_per_tok, 2);
  EXPECT_EQ(c.moe->moe_intermediate_size, 32);
  EXPECT_TRUE(c.moe->norm_topk_prob);
  EXPECT_EQ(c.moe->router_aux_loss_coef, 0.01);
  EXPECT_TRUE(c.moe->output_router_logits);
  // Sparse: (i + 1) % 2 == 0 and not in mlp_only_layers -> layer 1 only (3 is listed dense).
  EXPECT_EQ((std::vector<bool>{c.is_moe_layer(0), c.is_moe_layer(1), c.is_moe_layer(2), c.is_moe_layer(3)}),
            (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(parse_model_config(c.to_json(), "again"), c);
  // Three dense layers and one sparse one, counted by hand: attention 4·64·16 (q) + 2·2·64·16 (k, v)
  // + 64·64 (o) + 2·16 (q/k norms), norms 2·64, dense MLP 3·64·96, sparse 8·64 + 8·3·64·32.
  const int64_t attention = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 32, norms = 128;
  const int64_t expected = 100 * 64 * 2 + 64 + 4 * (attention + norms) + 3 * (3 * 64 * 96) + 8 * 64 + 8 * 3 * 64 * 32;
  EXPECT_EQ(parameter_count(c), expected);
  EXPECT_EQ(ModelParameters::zeros(c).numel(), expected);
}

TEST(MoeConfig, DefaultsAsTransformers) {
  std::string json = kMoeJson;
  for (const char* field : {R"("decoder_sparse_step": 2, )", R"("mlp_only_layers": [3], )", R"("norm_topk_prob": true,)",
                            R"("router_aux_loss_coef": 0.01, )", R"("output_router_logits": true)"})
    json.erase(json.find(field), std::string(field).size());
  json.erase(json.rfind(','), 1);  // the comma left before the closing brace
  const ModelConfig c = parse_model_config(json, "config.json");
  EXPECT_EQ(c.moe->decoder_sparse_step, 1);
  EXPECT_TRUE(c.moe->mlp_only_layers.empty());
  EXPECT_FALSE(c.moe->norm_topk_prob);
  EXPECT_EQ(c.moe->router_aux_loss_coef, 0.001);
  EXPECT_FALSE(c.moe->output_router_logits);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(c.is_moe_layer(i));
}

// transformers 5 saves Qwen3MoeConfig's expert count as num_local_experts (5.17.0 on the GPU
// machine, 2026-11-28); the Hub's Qwen3-MoE checkpoints say num_experts.
TEST(MoeConfig, ReadsTheExpertCountUnderEitherName) {
  std::string json = kMoeJson;
  const std::string from = R"("num_experts": 8)";
  json.replace(json.find(from), from.size(), R"("num_local_experts": 8)");
  EXPECT_EQ(parse_model_config(json, "c.json").moe->num_experts, 8);
}

TEST(MoeConfig, BadFieldsNameTheField) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string json = kMoeJson;
    json.replace(json.find(from), from.size(), to);
    return json;
  };
  expect_error([&] { parse_model_config(with(R"("num_experts": 8, )", ""), "c.json"); },
               {"c.json", "'num_experts' is missing"});
  expect_error([&] { parse_model_config(with(R"("num_experts_per_tok": 2)", R"("num_experts_per_tok": 9)"), "c.json"); },
               {"'num_experts_per_tok'", "exceeds num_experts (8)"});
  expect_error([&] { parse_model_config(with(R"("num_experts": 8, )", R"("num_experts": 8, "num_local_experts": 8, )"), "c.json"); },
               {"'num_local_experts'", "not both"});
  expect_error([&] { parse_model_config(with("[3]", "[4]"), "c.json"); },
               {"'mlp_only_layers'", "layer 4", "4 layers"});
  expect_error([&] { parse_model_config(with("[3]", "[-1]"), "c.json"); }, {"'mlp_only_layers'", "non-negative"});
  expect_error([&] { parse_model_config(with("0.01", "-1"), "c.json"); }, {"'router_aux_loss_coef'"});
}

// ---- the router op

TEST(MoeRoute, EqualProbabilitiesGoToTheLowerExpertFirst) {
  // Row 0: experts 1, 2 and 4 tie for the top; row 1: all equal; row 2: 1 and 2 tie for second place.
  const std::vector<float> z = {1, 3, 3, 0, 3, /**/ 0, 0, 0, 0, 0, /**/ 2, 4, 4, 5, 0};
  Tensor logits = Tensor::empty({3, 5}, DType::f32);
  std::copy(z.begin(), z.end(), logits.data_as<float>());
  Tensor probs = Tensor::empty({3, 5}, DType::f32), ids = Tensor::empty({3, 2}, DType::i32);
  Tensor weights = Tensor::empty({3, 2}, DType::f32);
  moe_route_forward(probs, ids, weights, logits, /*normalize=*/false);
  const int32_t* id = ids.data_as<int32_t>();
  EXPECT_EQ((std::vector<int32_t>(id, id + 6)), (std::vector<int32_t>{1, 2, 0, 1, 3, 1}));
  // Row 0 unnormalized: softmax values e^3 / (e + 3e^3 + 1).
  const double p = std::exp(3.0) / (std::exp(1.0) + 3 * std::exp(3.0) + 1);
  EXPECT_NEAR(weights.data_as<float>()[0], p, 1e-7);
  EXPECT_EQ(weights.data_as<float>()[2], 0.2f);
  moe_route_forward(probs, ids, weights, logits, /*normalize=*/true);
  EXPECT_EQ(weights.data_as<float>()[0], 0.5f);
  EXPECT_EQ(weights.data_as<float>()[1], 0.5f);
}

// The backward against central differences of the forward (in f32: h = 1e-2 on logits of order 1
// gives differences good to ~1e-4), for an objective Σ a·weights + Σ b·probs.
TEST(MoeRoute, BackwardMatchesFiniteDifferences) {
  for (bool normalize : {false, true}) {
    const int64_t T = 6, E = 7, k = 3;
    Tensor logits = testing::random_tensor({T, E}, DType::f32, 1);
    const Tensor a = testing::random_tensor({T, k}, DType::f32, 2), b = testing::random_tensor({T, E}, DType::f32, 3);
    Tensor probs = Tensor::empty({T, E}, DType::f32), ids = Tensor::empty({T, k}, DType::i32);
    Tensor weights = Tensor::empty({T, k}, DType::f32);
    Tensor first_ids;
    auto objective = [&] {
      moe_route_forward(probs, ids, weights, logits, normalize);
      if (!first_ids.defined()) first_ids = ids.to(Device::cpu);
      EXPECT_EQ(ints(ids), ints(first_ids)) << "a difference step changed the routing";
      double sum = 0;
      for (int64_t i = 0; i < T * k; ++i) sum += double(a.data_as<float>()[i]) * weights.data_as<float>()[i];
      for (int64_t i = 0; i < T * E; ++i) sum += double(b.data_as<float>()[i]) * probs.data_as<float>()[i];
      return sum;
    };
    objective();
    Tensor dlogits = Tensor::empty({T, E}, DType::f32);
    moe_route_backward(dlogits, a, b, probs, ids, weights, normalize);
    for (int64_t i = 0; i < T * E; ++i) {
      float& z = logits.data_as<float>()[i];
      const float saved = z, h = 1e-2f;
      z = saved + h;
      const double up = objective();
      z = saved - h;
      const double down = objective();
      z = saved;
      EXPECT_NEAR((up - down) / (2 * h), dlogits.data_as<float>()[i], 3e-4) << "normalize " << normalize << " at " << i;
    }
  }
}

// lse against a double softmax; moe_route_weights of the forward's own ids gives the forward's
// weights bit for bit, and of other ids the probabilities at those ids (normalized: over them).
TEST(MoeRoute, LogsumexpAndTheWeightsOfGivenExperts) {
  const int64_t T = 5, E = 6, k = 2;
  const Tensor logits = testing::random_tensor({T, E}, DType::f32, 4);
  for (bool normalize : {false, true}) {
    Tensor probs = Tensor::empty({T, E}, DType::f32), ids = Tensor::empty({T, k}, DType::i32);
    Tensor weights = Tensor::empty({T, k}, DType::f32), lse = Tensor::empty({T}, DType::f32);
    moe_route_forward(probs, ids, weights, logits, normalize, &lse);
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(double(logits.data_as<float>()[t * E + e]));
      EXPECT_NEAR(lse.data_as<float>()[t], std::log(sum), 1e-6) << "token " << t;  // fp32 rounding of O(1)
    }
    Tensor again = Tensor::empty({T, k}, DType::f32);
    moe_route_weights(again, probs, ids, normalize);
    EXPECT_TRUE(testing::same_bytes(again, weights)) << "normalize " << normalize;
    // Experts 5 and 0 for every token.
    Tensor other = Tensor::empty({T, k}, DType::i32);
    for (int64_t t = 0; t < T; ++t) other.data_as<int32_t>()[t * k] = 5, other.data_as<int32_t>()[t * k + 1] = 0;
    moe_route_weights(again, probs, other, normalize);
    for (int64_t t = 0; t < T; ++t) {
      const double p5 = probs.data_as<float>()[t * E + 5], p0 = probs.data_as<float>()[t * E];
      const double s = normalize ? p5 + p0 : 1.0;
      EXPECT_NEAR(again.data_as<float>()[t * k], p5 / s, 1e-7);
      EXPECT_NEAR(again.data_as<float>()[t * k + 1], p0 / s, 1e-7);
    }
  }
  Tensor weights = Tensor::empty({1, 2}, DType::f32), twice = Tensor::empty({1, 2}, DType::i32);
  Tensor probs = Tensor::zeros({1, 4}, DType::f32);
  twice.data_as<int32_t>()[0] = twice.data_as<int32_t>()[1] = 3;
  expect_error([&] { moe_route_weights(weights, probs, twice, true); }, {"moe_route_weights", "expert 3 twice"});
  twice.data_as<int32_t>()[1] = 4;
  expect_error([&] { moe_route_weights(weights, probs, twice, true); }, {"expert_ids[0, 1] = 4", "[0, 4)"});
}

// The z-loss term of the backward (z_scale · lse · p) against central differences of
// (z_scale / 2) · Σ_t lse_t² added to the objective of BackwardMatchesFiniteDifferences.
TEST(MoeRoute, ZLossTermMatchesFiniteDifferences) {
  const int64_t T = 4, E = 5, k = 2;
  const float z_scale = 0.7f;
  Tensor logits = testing::random_tensor({T, E}, DType::f32, 8);
  const Tensor a = testing::random_tensor({T, k}, DType::f32, 6);
  Tensor probs = Tensor::empty({T, E}, DType::f32), ids = Tensor::empty({T, k}, DType::i32);
  Tensor weights = Tensor::empty({T, k}, DType::f32), lse = Tensor::empty({T}, DType::f32);
  auto objective = [&] {
    moe_route_forward(probs, ids, weights, logits, true, &lse);
    double sum = 0;
    for (int64_t i = 0; i < T * k; ++i) sum += double(a.data_as<float>()[i]) * weights.data_as<float>()[i];
    for (int64_t t = 0; t < T; ++t) sum += 0.5 * z_scale * double(lse.data_as<float>()[t]) * lse.data_as<float>()[t];
    return sum;
  };
  objective();
  const std::vector<int> first_ids = ints(ids);
  Tensor dlogits = Tensor::empty({T, E}, DType::f32);
  moe_route_backward(dlogits, a, Tensor(), probs, ids, weights, true, lse, z_scale);
  for (int64_t i = 0; i < T * E; ++i) {
    float& z = logits.data_as<float>()[i];
    const float saved = z, h = 1e-2f;
    z = saved + h;
    const double up = objective();
    ASSERT_EQ(ints(ids), first_ids) << "a difference step changed the routing";
    z = saved - h;
    const double down = objective();
    z = saved;
    EXPECT_NEAR((up - down) / (2 * h), dlogits.data_as<float>()[i], 3e-4) << "at " << i;
  }
}

TEST(MoeCombine, SlotsMustBeAPermutation) {
  Tensor rows = Tensor::zeros({4, 8}, DType::f32), out = Tensor::empty({2, 8}, DType::f32);
  Tensor slots = testing::i32_tensor({0, 1, 1, 3}).reshape({2, 2});
  expect_error([&] { moe_combine_forward(out, rows, slots, Tensor()); },
               {"moe_combine_forward", "slots[1, 0] = 1", "permutation"});
}

TEST(MoeDispatch, SortsRowsByExpertThenTokenByHand) {
  // 3 tokens, top 2, 4 experts: (t, j) → expert 2 0 | 1 2 | 2 0. Expert 0 gets (0,1), (2,1); expert
  // 1 (1,0); expert 2 (0,0), (1,1), (2,0); expert 3 nothing.
  const Tensor ids = testing::i32_tensor({2, 0, 1, 2, 2, 0}).reshape({3, 2});
  Tensor offsets = Tensor::empty({5}, DType::i64), token_of_row = Tensor::empty({6}, DType::i32);
  Tensor slots = Tensor::empty({3, 2}, DType::i32);
  moe_dispatch(offsets, token_of_row, slots, ids);
  const int64_t* o = offsets.data_as<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(o, o + 5), (std::vector<int64_t>{0, 2, 3, 6, 6}));
  const int32_t* tr = token_of_row.data_as<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(tr, tr + 6), (std::vector<int32_t>{0, 2, 1, 0, 1, 2}));
  const int32_t* sl = slots.data_as<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(sl, sl + 6), (std::vector<int32_t>{3, 0, 2, 4, 5, 1}));
  const Tensor bad = testing::i32_tensor({2, 0, 1, 4, 2, 0}).reshape({3, 2});
  expect_error([&] { moe_dispatch(offsets, token_of_row, slots, bad); },
               {"moe_dispatch", "token 1 choice 1 is expert 4", "[0, 4)"});
  Tensor short_slots = Tensor::empty({2, 2}, DType::i32);
  expect_error([&] { moe_dispatch(offsets, token_of_row, short_slots, ids); }, {"moe_dispatch: slots"});
}

// ---- the model against a plain-loop reference

// The Qwen3-MoE forward in double from the fp32 masters, one sequence at a time, written from
// transformers' modeling_qwen3_moe.py: RMSNorm, q/k RMSNorm per head, rotate-half RoPE, causal GQA
// attention, then the dense SwiGLU MLP or the router (softmax, top-k with ties to the lower index,
// weights renormalized when norm_topk_prob) and the weighted sum of the chosen experts' SwiGLUs.
// Returns each row's logprob of its target; `routing` gets layer 0's choices (when sparse);
// `forced` (one list of k experts per row of all sequences) replaces them, weighted by the router's
// probabilities of them (routing replay).
class Reference {
 public:
  Reference(const ModelConfig& c, const ModelParameters& p) : c_(c), p_(p) {}

  std::vector<double> logprobs(const Sequences& seqs, std::vector<std::vector<int>>* routing = nullptr,
                               const std::vector<std::vector<int>>* forced = nullptr) const {
    std::vector<double> out;
    size_t first_row = 0;
    for (const auto& seq : seqs) {
      const int64_t n = int64_t(seq.size()), H = c_.hidden_size;
      std::vector<Vec> x(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) x[size_t(t)] = row(p_.embed, seq[size_t(t)]);
      for (size_t l = 0; l < p_.layers.size(); ++l) {
        const LayerParameters& L = p_.layers[l];
        std::vector<Vec> h = x;
        const std::vector<Vec> attn = attention(L, x);
        for (int64_t t = 0; t < n; ++t) {
          const Vec o = matvec(L.o, attn[size_t(t)]);
          for (int64_t i = 0; i < H; ++i) h[size_t(t)][size_t(i)] += o[size_t(i)];
          const Vec hn = rmsnorm(h[size_t(t)], L.post_norm);
          const std::vector<int>* force = forced && l == 0 ? &(*forced)[first_row + size_t(t)] : nullptr;
          const Vec mlp = L.experts.empty() ? swiglu_mlp(L.gate_up, L.down, hn)
                                            : sparse_mlp(L, hn, l == 0 ? routing : nullptr, force);
          for (int64_t i = 0; i < H; ++i) x[size_t(t)][size_t(i)] = h[size_t(t)][size_t(i)] + mlp[size_t(i)];
        }
      }
      const Tensor& head = c_.tie_word_embeddings ? p_.embed : p_.lm_head;
      for (int64_t t = 0; t < n; ++t) {
        const Vec logits = matvec(head, rmsnorm(x[size_t(t)], p_.final_norm));
        double m = -INFINITY, sum = 0;
        for (double z : logits) m = std::max(m, z);
        for (double z : logits) sum += std::exp(z - m);
        const int32_t target = t + 1 < n ? seq[size_t(t + 1)] : 0;
        out.push_back(logits[size_t(target)] - m - std::log(sum));
      }
      first_row += size_t(n);
    }
    return out;
  }

 private:
  using Vec = std::vector<double>;

  static Vec row(const Tensor& w, int64_t r) {
    const float* p = w.data_as<float>() + r * w.dim(1);
    return Vec(p, p + w.dim(1));
  }
  // W [rows_end - rows_begin of W's rows] · v
  static Vec matvec(const Tensor& w, const Vec& v, int64_t begin = 0, int64_t end = -1) {
    if (end < 0) end = w.dim(0);
    Vec y(static_cast<size_t>(end - begin), 0.0);
    for (int64_t r = begin; r < end; ++r)
      for (int64_t i = 0; i < w.dim(1); ++i) y[size_t(r - begin)] += double(w.data_as<float>()[r * w.dim(1) + i]) * v[size_t(i)];
    return y;
  }
  Vec rmsnorm(const Vec& v, const Tensor& w, size_t offset = 0, size_t n = 0) const {
    if (n == 0) n = v.size() - offset;
    double ms = 0;
    for (size_t i = 0; i < n; ++i) ms += v[offset + i] * v[offset + i];
    const double r = 1.0 / std::sqrt(ms / double(n) + c_.rms_norm_eps);
    Vec y(n);
    for (size_t i = 0; i < n; ++i) y[i] = v[offset + i] * r * w.data_as<float>()[i];
    return y;
  }
  static double silu(double g) { return g / (1.0 + std::exp(-g)); }
  static Vec swiglu_mlp(const Tensor& gate_up, const Tensor& down, const Vec& x) {
    const int64_t I = gate_up.dim(0) / 2;
    const Vec g = matvec(gate_up, x, 0, I), u = matvec(gate_up, x, I, 2 * I);
    Vec a(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i) a[size_t(i)] = silu(g[size_t(i)]) * u[size_t(i)];
    return matvec(down, a);
  }
  Vec sparse_mlp(const LayerParameters& L, const Vec& x, std::vector<std::vector<int>>* routing,
                 const std::vector<int>* forced) const {
    const Vec z = matvec(L.router, x);
    double m = -INFINITY, sum = 0;
    for (double v : z) m = std::max(m, v);
    Vec p(z.size());
    for (size_t e = 0; e < z.size(); ++e) sum += p[e] = std::exp(z[e] - m);
    for (double& v : p) v /= sum;
    std::vector<int> chosen;
    std::vector<bool> taken(p.size());
    double picked = 0;
    for (int64_t j = 0; j < c_.moe->num_experts_per_tok; ++j) {
      int best = -1;
      for (size_t e = 0; e < p.size(); ++e)
        if (!taken[e] && (best < 0 || p[e] > p[size_t(best)])) best = int(e);
      taken[size_t(best)] = true;
      chosen.push_back(best);
      picked += p[size_t(best)];
    }
    if (routing) routing->push_back(chosen);
    if (forced) {
      chosen = *forced;
      picked = 0;
      for (int e : chosen) picked += p[size_t(e)];
    }
    Vec y(x.size(), 0.0);
    for (int e : chosen) {
      const double w = c_.moe->norm_topk_prob ? p[size_t(e)] / picked : p[size_t(e)];
      const Vec out = swiglu_mlp(L.experts[size_t(e)].gate_up, L.experts[size_t(e)].down, x);
      for (size_t i = 0; i < y.size(); ++i) y[i] += w * out[i];
    }
    return y;
  }
  std::vector<Vec> attention(const LayerParameters& L, const std::vector<Vec>& x) const {
    const int64_t n = int64_t(x.size()), d = c_.head_dim, qh = c_.num_attention_heads, kvh = c_.num_key_value_heads;
    std::vector<Vec> q(static_cast<size_t>(n)), k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      const Vec qkv = matvec(L.qkv, rmsnorm(x[size_t(t)], L.input_norm));
      auto rope = [&](size_t offset, const Tensor& norm) {
        const Vec u = rmsnorm(qkv, norm, offset, size_t(d));
        Vec r(static_cast<size_t>(d));
        for (int64_t i = 0; i < d / 2; ++i) {
          const double angle = double(t) * std::pow(c_.rope_theta, -2.0 * double(i) / double(d));
          const double a = u[size_t(i)], b = u[size_t(i + d / 2)];
          r[size_t(i)] = a * std::cos(angle) - b * std::sin(angle);
          r[size_t(i + d / 2)] = b * std::cos(angle) + a * std::sin(angle);
        }
        return r;
      };
      for (int64_t hh = 0; hh < qh; ++hh) {
        const Vec r = rope(size_t(hh * d), L.q_norm);
        q[size_t(t)].insert(q[size_t(t)].end(), r.begin(), r.end());
      }
      for (int64_t hh = 0; hh < kvh; ++hh) {
        const Vec r = rope(size_t((qh + hh) * d), L.k_norm);
        k[size_t(t)].insert(k[size_t(t)].end(), r.begin(), r.end());
      }
      v[size_t(t)].assign(qkv.begin() + (qh + kvh) * d, qkv.end());
    }
    std::vector<Vec> out(static_cast<size_t>(n), Vec(static_cast<size_t>(qh * d), 0.0));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t hh = 0; hh < qh; ++hh) {
        const int64_t g = hh / (qh / kvh);
        Vec s(static_cast<size_t>(t + 1));
        double m = -INFINITY, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[size_t(t)][size_t(hh * d + i)] * k[size_t(u)][size_t(g * d + i)];
          s[size_t(u)] = dot / std::sqrt(double(d));
          m = std::max(m, s[size_t(u)]);
        }
        for (double& e : s) sum += e = std::exp(e - m);
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t i = 0; i < d; ++i)
            out[size_t(t)][size_t(hh * d + i)] += s[size_t(u)] / sum * v[size_t(u)][size_t(g * d + i)];
      }
    }
    return out;
  }

  const ModelConfig& c_;
  const ModelParameters& p_;
};

std::vector<int> ids_of(const RouterStats& stats) {
  const int32_t* p = stats.expert_ids.data_as<int32_t>();
  return {p, p + stats.expert_ids.numel()};
}

TEST(MoeModel, Fp32ForwardEqualsThePlainLoopReference) {
  for (bool normalize : {true, false}) {
    ModelConfig config = tiny_moe();
    config.moe->norm_topk_prob = normalize;
    const ModelParameters params = random_parameters(config, 41);
    Transformer model(config, params.copy_to(Device::cpu), Recipe::fp32);
    const Sequences seqs = random_sequences({7, 1, 12}, config.vocab_size, 42);
    const TrainForward f = model.forward(pack(seqs), 1.0f, false);
    ASSERT_EQ(f.routing.size(), 1u);  // layer 1 is in mlp_only_layers

    std::vector<std::vector<int>> routing;
    const std::vector<double> want = Reference(config, params).logprobs(seqs, &routing);
    std::vector<int> want_ids;
    for (const auto& r : routing) want_ids.insert(want_ids.end(), r.begin(), r.end());
    EXPECT_EQ(ids_of(f.routing[0]), want_ids);
    // fp32 against double over two layers: measured ≤ 1e-6; a wrong weight, expert or
    // normalization is off by far more.
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(f.logprob.data_as<float>()[i], want[i], 1e-5) << "row " << i << " normalize " << normalize;
  }
}

std::map<std::string, Tensor> by_name(ModelParameters& p) {
  std::map<std::string, Tensor> m;
  p.for_each([&](const std::string& name, Tensor& t) { m[name] = t; });
  return m;
}

// Every parameter tensor's gradient, in a random direction, against a fourth-order central
// difference of L = Σ_t a[t]·logprob[t] + b[t]·entropy[t] + λ·load_balancing_loss (a, b random
// with λ = 0, then the load-balancing loss alone: a = b = 0, λ = 1),
// as test_model_gradients.cpp does for the dense families. The top-k is not differentiable: a
// difference whose points route any token differently is not a derivative, so such a direction is
// replaced by the next random one (up to 8; with 15 tokens about one direction in four flips a
// near-tie), and every tensor must get a direction that keeps the routing.
TEST(MoeModel, GradientsMatchFiniteDifferencesInFp32) {
  const ModelConfig config = tiny_moe();
  Transformer model(config, random_parameters(config, 51), Recipe::fp32);
  const TrainBatch batch = pack(random_sequences({5, 1, 9}, config.vocab_size, 52));
  const int64_t t = batch.tokens.numel();
  const Tensor random_a = testing::random_tensor({t}, DType::f32, 53), random_b = testing::random_tensor({t}, DType::f32, 54);
  const Tensor zero = Tensor::zeros({t}, DType::f32);
  for (double lambda : {0.0, 1.0}) {
    const Tensor& a = lambda == 0 ? random_a : zero;
    const Tensor& b = lambda == 0 ? random_b : zero;
    model.grads().zero();
    TrainForward f = model.forward(batch, 0.9f);
    const std::vector<int> routing = ids_of(f.routing[0]);
    model.backward(f, a, b, lambda);
    std::map<std::string, Tensor> grads = by_name(model.grads());
    // L, or nothing when the routing differs from the unperturbed one.
    auto objective = [&]() -> std::optional<double> {
      const TrainForward g = model.forward(batch, 0.9f, false);
      if (ids_of(g.routing[0]) != routing) return std::nullopt;
      double sum = lambda * load_balancing_loss(g.routing);
      for (int64_t i = 0; i < t; ++i)
        sum += double(a.data_as<float>()[i]) * g.logprob.data_as<float>()[i] +
               double(b.data_as<float>()[i]) * g.entropy.data_as<float>()[i];
      return sum;
    };
    std::mt19937_64 rng(55);
    std::normal_distribution<float> normal;
    int checked = 0, skipped = 0;
    model.params().for_each([&](const std::string& name, Tensor& theta) {
      const Tensor saved = theta.to(Device::cpu);
      std::vector<float> v(static_cast<size_t>(theta.numel()));
      for (int attempt = 0; attempt < 8; ++attempt) {
        double analytic = 0;
        for (size_t i = 0; i < v.size(); ++i) {
          v[i] = normal(rng);
          analytic += double(grads.at(name).data_as<float>()[i]) * v[i];
        }
        const float h = 3e-3f;
        bool smooth = true;
        auto at = [&](float step) {
          for (size_t i = 0; i < v.size(); ++i) theta.data_as<float>()[i] = saved.data_as<float>()[i] + step * v[i];
          model.refresh_weights();
          const std::optional<double> l = objective();
          smooth &= l.has_value();
          return l.value_or(0.0);
        };
        const double numeric = (-at(2 * h) + 8 * at(h) - 8 * at(-h) + at(-2 * h)) / (12.0 * double(h));
        theta.copy_from(saved);
        model.refresh_weights();
        if (!smooth) {
          ++skipped;
          continue;
        }
        // The dense families' tolerance (test_model_gradients.cpp says how it was measured); the
        // load-balancing loss alone is smaller (directional derivatives 0.02 .. 1.6) and less noisy
        // (measured differences ≤ 3e-5), so its absolute part is 1e-4.
        EXPECT_NEAR(numeric, analytic, 1e-3 * std::abs(analytic) + (lambda == 0 ? 2e-3 : 1e-4))
            << name << " λ " << lambda;
        ++checked;
        return;
      }
      ADD_FAILURE() << name << ": every direction tried changed the routing";
    });
    EXPECT_EQ(checked, int(grads.size()));
    std::printf("λ %.1f: %d tensors checked, %d directions skipped for a routing change\n", lambda, checked, skipped);
  }
}

// The router's gradient from the load-balancing loss alone: nonzero, and only through the router
// (the experts' outputs do not enter the loss).
TEST(MoeModel, LoadBalancingLossReachesOnlyTheRouterAndWhatFeedsIt) {
  const ModelConfig config = tiny_moe();
  Transformer model(config, random_parameters(config, 61), Recipe::fp32);
  const TrainBatch batch = pack(random_sequences({9, 4}, config.vocab_size, 62));
  TrainForward f = model.forward(batch);
  model.backward(f, Tensor(), Tensor(), 1.0);
  double router = 0, experts = 0, head = 0;
  model.grads().for_each([&](const std::string& name, const Tensor& g) {
    const double s = sum_squares(g);
    if (name.find("router") != std::string::npos) router += s;
    if (name.find("experts") != std::string::npos || name.starts_with("layers.1.")) experts += s;
    if (name == "lm_head" || name == "final_norm") head += s;
  });
  EXPECT_GT(router, 0.0);
  EXPECT_EQ(experts, 0.0);
  EXPECT_EQ(head, 0.0);
}

// The bf16 and fp8 recipes' gradients against fp32's, tensor by tensor, at widths of whole fp8
// blocks and (partial) of 16 only, as the dense RecipeGradients test. Every token goes to every
// expert here (k = E = 4): with k < E the recipes' rounding flips near-tied choices (measured: fp8
// changes 21 of 256 choices of the partial-blocks model at top-2 of 8), and a flipped token's
// expert gradients then differ by their whole size, which says nothing about the arithmetic.
TEST(MoeModel, RecipeGradientsCloseToFp32) {
  for (bool partial : {false, true}) {
    ModelConfig config =
        partial ? tiny_moe({.hidden = 192, .heads = 3, .kv_heads = 1, .head_dim = 64, .intermediate = 320,
                            .layers = 2, .vocab = 301})
                : tiny_moe({.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64, .intermediate = 256,
                            .layers = 2, .vocab = 301});
    config.moe->num_experts = config.moe->num_experts_per_tok = 4;
    const ModelParameters params = random_parameters(config, 71);
    const TrainBatch batch = pack(random_sequences({40, 17, 71}, config.vocab_size, 72));
    const int64_t t = batch.tokens.numel();
    Tensor a = Tensor::empty({t}, DType::f32), b = Tensor::empty({t}, DType::f32);
    for (int64_t i = 0; i < t; ++i) {
      a.data_as<float>()[i] = -1.0f / float(t);
      b.data_as<float>()[i] = 0.01f;
    }
    auto gradients = [&](Recipe recipe, std::vector<int>* routing) {
      Transformer model(config, params.copy_to(Device::cpu), recipe);
      TrainForward f = model.forward(batch);
      *routing = ids_of(f.routing[0]);
      model.backward(f, a, b, 0.01);
      return by_name(model.grads());
    };
    std::vector<int> reference_routing, routing;  // (the same sets; the order may differ)
    auto reference = gradients(Recipe::fp32, &reference_routing);
    // Measured worst tensors: bf16 2.3e-2 (partial blocks 2.6e-2), fp8 2.8e-1 (k_norm and the router;
    // the dense Qwen3 test's fp8 reaches 2.3e-1): the same rounding noise as the dense models'.
    for (auto [recipe, tolerance] : {std::pair{Recipe::bf16, 4e-2}, std::pair{Recipe::fp8, 3.5e-1}}) {
      double worst = 0;
      for (auto& [name, g] : gradients(recipe, &routing)) {
        const double e = testing::rel_error(testing::to_double(g), testing::to_double(reference.at(name)));
        EXPECT_LE(e, tolerance) << recipe_name(recipe) << " " << name << (partial ? " partial" : "");
        worst = std::max(worst, e);
      }
      std::printf("%s%s: worst gradient error vs fp32 %.2e\n", std::string(recipe_name(recipe)).c_str(),
                  partial ? " (partial blocks)" : "", worst);
    }
  }
}

// Recompute remakes the attention inputs and the dense layer's; the sparse layer keeps its own:
// the same logprobs and gradients, bit for bit, in fp32 and bf16 (fp8's dense layer keeps its
// SwiGLU input in E4M3, as test_model_gradients.cpp's Recompute test covers).
TEST(MoeModel, RecomputeGivesTheSameBits) {
  const ModelConfig config = tiny_moe();
  const ModelParameters params = random_parameters(config, 95);
  const TrainBatch batch = pack(random_sequences({8, 3, 11}, config.vocab_size, 96));
  const Tensor a = testing::random_tensor({batch.tokens.numel()}, DType::f32, 97);
  for (Recipe recipe : {Recipe::fp32, Recipe::bf16}) {
    auto run = [&](bool recompute) {
      Transformer model(config, params.copy_to(Device::cpu), recipe);
      model.set_recompute(recompute);
      TrainForward f = model.forward(batch);
      const std::vector<float> logprob = testing::to_floats(f.logprob);
      model.backward(f, a, Tensor(), 0.1);
      std::map<std::string, std::vector<float>> grads;
      model.grads().for_each([&](const std::string& name, const Tensor& g) { grads[name] = testing::to_floats(g); });
      return std::pair{logprob, grads};
    };
    EXPECT_EQ(run(false), run(true)) << recipe_name(recipe);
  }
}

// An inference-only sparse model computes the trainable one's bits without the experts' and the
// router's fp32 masters; the optimizer finds every expert's and router's copies by name.
TEST(MoeModel, InferenceOnlyAndWeightCopies) {
  const ModelConfig c = tiny_moe({.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64, .intermediate = 256,
                                  .layers = 2, .vocab = 301});
  const TrainBatch batch = pack(random_sequences({7, 12, 1}, c.vocab_size, 91));
  for (Recipe recipe : {Recipe::bf16, Recipe::fp8}) {
    Transformer trainable(c, random_parameters(c, 92), recipe);
    Transformer infer(c, random_parameters(c, 92), recipe, {.trainable = false});
    EXPECT_TRUE(testing::same_bytes(trainable.forward(batch, 1.0f, false).logprob,
                                    infer.forward(batch, 1.0f, false).logprob));
    const LayerParameters& sparse = infer.params().layers[0];
    EXPECT_FALSE(sparse.router.defined());
    EXPECT_FALSE(sparse.experts[5].gate_up.defined() || sparse.experts[5].down.defined());

    const WeightCopies router = trainable.weight_copies("layers.0.router");
    EXPECT_TRUE(router.bf16 && router.bf16->dtype() == DType::bf16) << recipe_name(recipe);  // never fp8
    const WeightCopies expert = trainable.weight_copies("layers.0.experts.5.down");
    EXPECT_EQ(expert.fp8 != nullptr, recipe == Recipe::fp8);
    EXPECT_EQ(expert.bf16 != nullptr, recipe == Recipe::bf16);
    EXPECT_TRUE(trainable.weight_copies("layers.1.gate_up").bf16 || trainable.weight_copies("layers.1.gate_up").fp8);
  }
}

// fp8 recipe, widths multiples of 128: the experts as gemm_fp8_grouped (rows quantized once, the
// SwiGLU over all rows, the DGrads grouped) give the per-expert loop's bits on the CPU — the
// training and the inference forward's logprobs and every gradient — with experts that get no
// tokens among them; the bf16 recipe's gemm_bf16_grouped_* likewise. Widths the grouped fp8 GEMM
// does not take keep the loop.
TEST(MoeModel, GroupedExpertsGiveThePerExpertLoopsBits) {
  ModelConfig c = tiny_moe({.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64, .intermediate = 256,
                            .layers = 2, .vocab = 301});
  c.moe->num_experts = 16;
  const ModelParameters params = random_parameters(c, 41);
  const TrainBatch batch = pack(random_sequences({9, 4, 13}, c.vocab_size, 42));  // 52 rows, 16 experts
  const Tensor a = testing::random_tensor({batch.tokens.numel()}, DType::f32, 43);
  const Tensor b = testing::random_tensor({batch.tokens.numel()}, DType::f32, 44);
  for (Recipe recipe : {Recipe::fp8, Recipe::bf16}) {
    auto run = [&](bool grouped) {
      Transformer model(c, params.copy_to(Device::cpu), recipe, {.grouped_experts = grouped});
      EXPECT_EQ(recipe == Recipe::fp8 ? model.grouped_fp8_experts() : model.grouped_bf16_experts(), grouped);
      std::vector<Tensor> out = {model.forward(batch, 1.0f, false).logprob};
      TrainForward f = model.forward(batch);
      const std::vector<int64_t>& tokens = f.routing[0].expert_tokens;
      EXPECT_NE(std::find(tokens.begin(), tokens.end(), 0), tokens.end()) << "no expert without tokens";
      out.push_back(f.logprob);
      model.backward(f, a, b, 0.01);
      model.grads().for_each([&](const std::string&, const Tensor& g) { out.push_back(g); });
      return out;
    };
    const std::vector<Tensor> grouped = run(true), loop = run(false);
    ASSERT_EQ(grouped.size(), loop.size());
    for (size_t i = 0; i < grouped.size(); ++i)
      EXPECT_TRUE(testing::same_bytes(grouped[i], loop[i])) << recipe_name(recipe) << " output " << i;
  }
  // H 192, Im 160: not whole 128-blocks per expert.
  const ModelConfig partial = tiny_moe({.hidden = 192, .heads = 3, .kv_heads = 1, .head_dim = 64,
                                        .intermediate = 320, .layers = 2, .vocab = 301});
  EXPECT_FALSE(Transformer(partial, random_parameters(partial, 45), Recipe::fp8).grouped_fp8_experts());
  EXPECT_TRUE(Transformer(partial, random_parameters(partial, 45), Recipe::bf16).grouped_bf16_experts());
}

// fp8 recipe: each sparse layer's expert copies are views of one stack per projection, and what
// rewrites them writes through the views: the optimizer's update pass (AdamW with the model's
// copies), refresh_weights after a step without copies, and an inference-only model's (W only).
// Each expert's copy is then a fresh LinearWeight of its master, byte for byte.
TEST(MoeModel, ExpertFp8CopiesAreViewsOfTheirStacks) {
  const ModelConfig c = tiny_moe({.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64, .intermediate = 256,
                                  .layers = 2, .vocab = 301});
  const ModelParameters params = random_parameters(c, 51);
  Transformer model(c, params.copy_to(Device::cpu), Recipe::fp8);
  EXPECT_EQ(testing::expert_copies_mismatch(model, model.params(), true), "");
  const TrainBatch batch = pack(random_sequences({6, 11}, c.vocab_size, 52));
  AdamW optimizer(model.params(), OptimizerConfig{});
  for (bool with_copies : {true, false}) {
    TrainForward f = model.forward(batch);
    model.backward(f, testing::random_tensor({batch.tokens.numel()}, DType::f32, 53), Tensor());
    const OptimizerStep step = with_copies ? optimizer.step(model.params(), model.grads(),
                                                            [&](const std::string& n) { return model.weight_copies(n); })
                                           : optimizer.step(model.params(), model.grads());
    ASSERT_TRUE(step.applied);
    if (!with_copies) model.refresh_weights();
    EXPECT_EQ(testing::expert_copies_mismatch(model, model.params(), true), "") << "copies in the step: " << with_copies;
  }
  EXPECT_FALSE(testing::same_bytes(model.params().layers[0].experts[3].down, params.layers[0].experts[3].down))
      << "the steps changed no master";
  Transformer infer(c, params.copy_to(Device::cpu), Recipe::fp8, {.trainable = false});
  EXPECT_EQ(testing::expert_copies_mismatch(infer, params, false), "");
}

// ---- routing replay, router z-loss

// The batch's replay of `routing` (TrainForward::routing, layer by layer), or of `forced` rows for
// every sparse layer.
Tensor replay_of(const std::vector<RouterStats>& routing) {
  const int64_t T = routing[0].expert_ids.dim(0), k = routing[0].expert_ids.dim(1);
  Tensor r = Tensor::empty({int64_t(routing.size()), T, k}, DType::i32);
  for (size_t l = 0; l < routing.size(); ++l)
    std::copy_n(routing[l].expert_ids.data_as<int32_t>(), T * k, r.data_as<int32_t>() + int64_t(l) * T * k);
  return r;
}

// Replaying the router's own choices changes nothing: the same logprobs and gradients, bit for bit,
// in every recipe (moe_route_weights recomputes the forward's weights exactly).
TEST(MoeModel, ReplayOfTheRoutersOwnChoicesGivesTheSameBits) {
  const ModelConfig config = tiny_moe(kThreeLayersFp8);
  const ModelParameters params = random_parameters(config, 81);
  const TrainBatch batch = pack(random_sequences({8, 3, 11}, config.vocab_size, 82));
  const Tensor a = testing::random_tensor({batch.tokens.numel()}, DType::f32, 83);
  for (Recipe recipe : {Recipe::fp32, Recipe::bf16, Recipe::fp8}) {
    auto run = [&](bool replay) {
      Transformer model(config, params.copy_to(Device::cpu), recipe);
      TrainBatch b = batch;
      if (replay) b.replay_experts = replay_of(model.forward(batch, 1.0f, false).routing);
      TrainForward f = model.forward(b);
      const std::vector<float> logprob = testing::to_floats(f.logprob);
      model.backward(f, a, Tensor(), 0.1, 0.1);
      std::map<std::string, std::vector<float>> grads;
      model.grads().for_each([&](const std::string& name, const Tensor& g) { grads[name] = testing::to_floats(g); });
      return std::pair{logprob, grads};
    };
    EXPECT_EQ(run(false), run(true)) << recipe_name(recipe);
  }
}

// Replayed experts that the router would not choose (each token's own top-2 shifted by one
// expert): the forward computes the double reference with those experts, weighted by the router's
// probabilities of them, and reports what the router itself chose; a -1 row keeps the router's own.
TEST(MoeModel, ReplaySendsTokensToTheReplayedExperts) {
  const ModelConfig config = tiny_moe();  // sparse layer 0
  const ModelParameters params = random_parameters(config, 84);
  Transformer model(config, params.copy_to(Device::cpu), Recipe::fp32);
  const Sequences seqs = random_sequences({7, 1, 12}, config.vocab_size, 85);
  TrainBatch batch = pack(seqs);
  const TrainForward own = model.forward(batch, 1.0f, false);
  const int64_t T = batch.tokens.numel(), k = config.moe->num_experts_per_tok, E = config.moe->num_experts;
  Tensor replay = replay_of(own.routing);
  std::vector<std::vector<int>> forced;
  for (int64_t t = 0; t < T; ++t) {
    int32_t* r = replay.data_as<int32_t>() + t * k;
    if (t == 3) {  // the router's own
      r[0] = -1;
      forced.push_back({own.routing[0].expert_ids.data_as<int32_t>()[t * k],
                        own.routing[0].expert_ids.data_as<int32_t>()[t * k + 1]});
      continue;
    }
    for (int64_t j = 0; j < k; ++j) r[j] = int32_t((r[j] + 1) % E);
    forced.push_back({r[0], r[1]});
  }
  batch.replay_experts = replay;
  const TrainForward f = model.forward(batch, 1.0f, false);
  EXPECT_EQ(ids_of(f.routing[0]), ids_of(own.routing[0]));  // the router's own choices
  std::vector<int64_t> tokens(size_t(E), 0);
  for (const auto& ids : forced)
    for (int e : ids) ++tokens[size_t(e)];
  EXPECT_EQ(f.routing[0].expert_tokens, tokens);
  const std::vector<double> want = Reference(config, params).logprobs(seqs, nullptr, &forced);
  double moved = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    // As Fp32ForwardEqualsThePlainLoopReference.
    EXPECT_NEAR(f.logprob.data_as<float>()[i], want[i], 1e-5) << "row " << i;
    moved = std::max(moved, std::abs(want[i] - double(own.logprob.data_as<float>()[i])));
  }
  EXPECT_GT(moved, 1e-3);  // other experts do compute something else
  replay.data_as<int32_t>()[5 * k + 1] = replay.data_as<int32_t>()[5 * k];
  expect_error([&] { model.forward(batch, 1.0f, false); }, {"routing replay: row 5 names expert", "twice"});
  replay.data_as<int32_t>()[5 * k + 1] = int32_t(E);
  expect_error([&] { model.forward(batch, 1.0f, false); }, {"routing replay: row 5 choice 1 is expert 8", "[0, 8)"});
  batch.replay_experts = Tensor::zeros({2, T, k}, DType::i32);
  expect_error([&] { model.forward(batch, 1.0f, false); }, {"replay_experts", "[1, 20, 2]"});
}

// The router z-loss's gradient against a fourth-order central difference of router_z_loss in
// random directions, every tensor (those it does not reach: zero both ways), fp32. Routing is
// fixed by replay, so no difference step crosses a top-k tie.
TEST(MoeModel, RouterZLossGradientMatchesFiniteDifferences) {
  const ModelConfig config = tiny_moe({.layers = 3});
  Transformer model(config, random_parameters(config, 86), Recipe::fp32);
  TrainBatch batch = pack(random_sequences({5, 1, 9}, config.vocab_size, 87));
  batch.replay_experts = replay_of(model.forward(batch, 1.0f, false).routing);
  model.grads().zero();
  TrainForward f = model.forward(batch);
  EXPECT_GT(router_z_loss(f.routing), 0.0);
  model.backward(f, Tensor(), Tensor(), 0, 1.0);
  std::map<std::string, Tensor> grads = by_name(model.grads());
  std::mt19937_64 rng(88);
  std::normal_distribution<float> normal;
  int reached = 0;
  model.params().for_each([&](const std::string& name, Tensor& theta) {
    const Tensor saved = theta.to(Device::cpu);
    std::vector<float> v(static_cast<size_t>(theta.numel()));
    double analytic = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = normal(rng);
      analytic += double(grads.at(name).data_as<float>()[i]) * v[i];
    }
    const float h = 3e-3f;
    auto at = [&](float step) {
      for (size_t i = 0; i < v.size(); ++i) theta.data_as<float>()[i] = saved.data_as<float>()[i] + step * v[i];
      model.refresh_weights();
      TrainForward g = model.forward(batch);  // lse is computed by forwards kept for a backward
      return router_z_loss(g.routing);
    };
    const double numeric = (-at(2 * h) + 8 * at(h) - 8 * at(-h) + at(-2 * h)) / (12.0 * double(h));
    theta.copy_from(saved);
    model.refresh_weights();
    // The load-balancing case's tolerance in GradientsMatchFiniteDifferencesInFp32.
    EXPECT_NEAR(numeric, analytic, 1e-3 * std::abs(analytic) + 1e-4) << name;
    reached += analytic != 0;
  });
  EXPECT_GE(reached, 10);  // the routers, the layers before them, the embedding
}

// The engine records each token's routing as the training forward of the same sequence computes
// it, prompt shared by the samples or not, with responses of one token (the prompt's routing only,
// the samples finishing in the step that forks them) or several.
TEST(MoeRollout, RecordsTheRoutingTheTrainingForwardComputes) {
  const ModelConfig config = tiny_moe(kThreeLayersFp8);
  for (Recipe recipe : {Recipe::fp32, Recipe::fp8}) {
    Transformer model(config, random_parameters(config, 89), recipe);
    for (auto [share, max_new_tokens] : {std::pair{true, 5}, {false, 5}, {true, 1}, {false, 1}}) {
      Engine engine(model, {.num_blocks = 64, .block_size = 4, .share_prompts = share, .record_routing = true});
      GenerationRequest request;
      request.prompt = {3, 1, 4, 1, 5, 9};
      request.sampling.n = 3;
      request.sampling.temperature = 1.0f;
      request.sampling.max_new_tokens = max_new_tokens;
      request.sampling.seed = 7;
      const auto samples = engine.generate({request});
      for (const GeneratedSample& s : samples[0]) {
        Sequences seq = {request.prompt};
        seq[0].insert(seq[0].end(), s.tokens.begin(), s.tokens.end());
        const TrainForward f = model.forward(pack(seq), 1.0f, false);
        const int64_t n = int64_t(seq[0].size()), k = 2, layers = 2;
        ASSERT_EQ(int64_t(s.expert_ids.size()), (n - 1) * layers * k);
        for (int64_t t = 0; t + 1 < n; ++t)
          for (int64_t l = 0; l < layers; ++l)
            for (int64_t j = 0; j < k; ++j)
              ASSERT_EQ(s.expert_ids[size_t((t * layers + l) * k + j)],
                        f.routing[size_t(l)].expert_ids.data_as<int32_t>()[t * k + j])
                  << recipe_name(recipe) << " share " << share << " max_new_tokens " << max_new_tokens
                  << " token " << t << " layer " << l;
      }
    }
  }
}

// ---- statistics

TEST(MoeStats, LoadBalancingLossAndExpertLoadByHand) {
  // Two layers of two tokens, 4 experts, top-1. Layer A: tokens to experts 0 and 0, probs rows
  // (.7 .1 .1 .1), (.4 .3 .2 .1); layer B: experts 1 and 3, rows (.1 .6 .2 .1), (.2 .2 .2 .4).
  auto layer = [](std::vector<int32_t> ids, std::vector<int64_t> tokens, std::vector<double> sums) {
    RouterStats s;
    s.expert_ids = testing::i32_tensor(ids).reshape({int64_t(ids.size()), 1});
    s.expert_tokens = tokens;
    s.prob_sums = sums;
    return s;
  };
  const std::vector<RouterStats> routing = {layer({0, 0}, {2, 0, 0, 0}, {1.1, 0.4, 0.3, 0.2}),
                                            layer({1, 3}, {0, 1, 0, 1}, {0.3, 0.8, 0.4, 0.5})};
  // N = 4, C = (2, 1, 0, 1), P = (1.4, 1.2, 0.7, 0.7): 4 · (2·1.4 + 1·1.2 + 0 + 1·0.7) / 16.
  EXPECT_NEAR(load_balancing_loss(routing), 4.0 * (2 * 1.4 + 1.2 + 0.7) / 16.0, 1e-12);
  const std::vector<double> g = load_balancing_gradient(routing);
  EXPECT_NEAR(g[0], 4.0 * 2 / 16, 1e-12);
  EXPECT_NEAR(g[2], 0.0, 1e-12);
  const ExpertLoad load = expert_load(routing[0]);
  EXPECT_EQ(load.max_tokens, 2);
  EXPECT_EQ(load.mean_tokens, 0.5);
}

// ---- checkpoints

TEST(MoeCheckpoint, SaveThenLoadUnderHuggingFaceNames) {
  const ModelConfig config = tiny_moe();
  const ModelParameters params = random_parameters(config, 81);
  TempDir dir;
  save_hf_checkpoint(dir.file("m"), config, params, DType::f32);
  ModelConfig stored = config;
  stored.torch_dtype = "float32";
  EXPECT_EQ(load_model_config(dir.file("m")), stored);
  const ModelParameters loaded = load_hf_parameters(config, dir.file("m"));
  std::map<std::string, std::vector<double>> want;
  params.for_each([&](const std::string& name, const Tensor& t) { want[name] = testing::to_double(t); });
  int tensors = 0;
  loaded.for_each([&](const std::string& name, const Tensor& t) {
    EXPECT_EQ(testing::to_double(t), want.at(name)) << name;
    ++tensors;
  });
  EXPECT_EQ(tensors, int(want.size()));

  const SafetensorsCheckpoint ckpt(dir.file("m"));
  const int64_t im = config.moe->moe_intermediate_size, H = config.hidden_size;
  const Tensor up = ckpt.tensor("model.layers.0.mlp.experts.3.up_proj.weight");
  EXPECT_EQ(up.shape(), (Shape{im, H}));
  EXPECT_EQ(up.data_as<float>()[0], params.layers[0].experts[3].gate_up.data_as<float>()[im * H]);
  EXPECT_EQ(ckpt.tensor("model.layers.0.mlp.gate.weight").shape(), (Shape{8, H}));
  EXPECT_EQ(ckpt.tensor("model.layers.0.mlp.experts.7.down_proj.weight").shape(), (Shape{H, im}));
  EXPECT_TRUE(ckpt.contains("model.layers.1.mlp.gate_proj.weight"));  // the dense layer
  EXPECT_FALSE(ckpt.contains("model.layers.1.mlp.gate.weight"));
}

// The block-FP8 export: every expert projection holds the fp8 recipe's own E4M3 weight, the
// routers stay bf16 and are named in modules_to_not_convert one by one, and the checkpoint loads
// back as dequantized masters.
TEST(MoeCheckpoint, BlockFp8ExportKeepsTheRouterInBf16) {
  const ModelConfig config = tiny_moe({.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 64,
                                       .intermediate = 256, .layers = 2, .vocab = 301});
  const ModelParameters params = random_parameters(config, 83);
  TempDir dir;
  const Fp8Export report = save_fp8_hf_checkpoint(dir.file("fp8"), config, params);
  for (const std::string& name : report.requantized)  // (v_proj is: its rows start at 192)
    EXPECT_EQ(name.find("experts"), std::string::npos) << name;
  const std::string expert = "model.layers.0.mlp.experts.6.up_proj.weight";
  EXPECT_NE(std::find(report.exact.begin(), report.exact.end(), expert), report.exact.end());
  const ModelConfig loaded_config = load_model_config(dir.file("fp8"));
  EXPECT_EQ(loaded_config.fp8_quantization->modules_to_not_convert,
            (std::vector<std::string>{"lm_head", "model.layers.0.mlp.gate"}));
  const SafetensorsCheckpoint ckpt(dir.file("fp8"));
  EXPECT_EQ(ckpt.tensor("model.layers.0.mlp.gate.weight").dtype(), DType::bf16);
  const Tensor data = ckpt.tensor(expert), scales = ckpt.tensor(expert + "_scale_inv");
  ASSERT_EQ(data.dtype(), DType::e4m3);
  const ModelParameters loaded = load_hf_parameters(loaded_config, dir.file("fp8"));
  const int64_t im = config.moe->moe_intermediate_size, H = config.hidden_size;
  const float* up = loaded.layers[0].experts[6].gate_up.data_as<float>() + im * H;  // up's rows
  for (int64_t i = 0; i < data.numel(); ++i)
    ASSERT_EQ(up[i], e4m3_to_float(data.data_as<e4m3>()[i]) *
                         scales.data_as<float>()[(i / H / 128) * scales.dim(1) + (i % H) / 128]);
}

TEST(MoeCheckpoint, BadCheckpointsNameTheTensor) {
  const ModelConfig config = tiny_moe();
  TempDir dir;
  save_hf_checkpoint(dir.file("good"), config, random_parameters(config, 82), DType::bf16);
  auto edited = [&](const std::string& name, const std::function<void(NamedTensors&)>& edit) {
    const SafetensorsCheckpoint good(dir.file("good"));
    NamedTensors tensors;
    for (const std::string& n : good.names()) tensors.emplace_back(n, good.tensor(n).to(Device::cpu));
    edit(tensors);
    write_safetensors(dir.file(name), tensors);
    return dir.file(name);
  };
  const std::string missing = edited("missing.safetensors", [](NamedTensors& t) {
    std::erase_if(t, [](const auto& p) { return p.first == "model.layers.0.mlp.experts.5.down_proj.weight"; });
  });
  expect_error([&] { load_hf_parameters(config, missing); },
               {missing, "missing tensor", "model.layers.0.mlp.experts.5.down_proj.weight", "Qwen3MoeForCausalLM"});
  const std::string reshaped = edited("reshaped.safetensors", [](NamedTensors& t) {
    for (auto& [name, tensor] : t)
      if (name == "model.layers.0.mlp.gate.weight") tensor = Tensor::zeros({7, 16}, DType::bf16);
  });
  expect_error([&] { load_hf_parameters(config, reshaped); }, {"model.layers.0.mlp.gate.weight", "[7, 16]", "[8, 16]"});
  const std::string extra = edited("extra.safetensors", [](NamedTensors& t) {
    t.emplace_back("model.layers.0.mlp.experts.8.up_proj.weight", Tensor::zeros({12, 16}, DType::bf16));
  });
  expect_error([&] { load_hf_parameters(config, extra); },
               {"unexpected tensor", "model.layers.0.mlp.experts.8.up_proj.weight"});
}

}  // namespace
}  // namespace lockstep
