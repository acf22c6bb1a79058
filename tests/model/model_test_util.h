// tests/model/model_test_util.h — tiny model configs, random parameters and batches for the model
// tests.
#pragma once

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/config.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace lockstep::testing {

using Sequences = std::vector<std::vector<int32_t>>;

struct TinyShape {
  int64_t hidden = 16, heads = 4, kv_heads = 2, head_dim = 8, intermediate = 24, layers = 2,
          vocab = 37;
  bool tied = false;
};

// A config of `family` with the family's characteristic features: Qwen3 q/k norms, Qwen2 q/k/v
// biases, Llama 3 rope scaling (plus o and MLP biases, which Llama configs can switch on), Qwen3-MoE
// 8 experts of intermediate / 2, top-2 with normalized weights, the second layer dense
// (mlp_only_layers).
inline ModelConfig tiny_config(ModelFamily family, const TinyShape& s = {}) {
  ModelConfig c;
  c.family = family;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.vocab_size = s.vocab;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 100.0;  // small, so rotations differ visibly at the short positions tested
  c.tie_word_embeddings = s.tied;
  c.qk_norm = family == ModelFamily::qwen3 || family == ModelFamily::qwen3_moe;
  if (family == ModelFamily::qwen3_moe) {
    c.moe.emplace();
    c.moe->num_experts = 8;
    c.moe->num_experts_per_tok = 2;
    c.moe->moe_intermediate_size = s.intermediate / 2;
    c.moe->norm_topk_prob = true;
    if (s.layers >= 2) c.moe->mlp_only_layers = {1};
  }
  c.qkv_bias = family == ModelFamily::qwen2;
  if (family == ModelFamily::llama) {
    c.qkv_bias = c.o_bias = c.mlp_bias = true;  // Llama's attention_bias covers q, k, v and o
    c.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 64};
  }
  return c;
}

// A small Qwen3 whose dimensions are whole fp8 blocks (multiples of 128) and the CUDA attention kernels
// take (head_dim 128, GQA 4/2): the GPU tests' model.
inline ModelConfig gpu_tiny_config() {
  return tiny_config(ModelFamily::qwen3, {.hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 128,
                                          .intermediate = 384, .layers = 2, .vocab = 1000});
}

// Widths that are multiples of 16 but not of 128, as in SmolLM2-135M (hidden 576, 9 q heads over
// 3 kv heads of 64): fp8's partial 128-groups and blocks everywhere (hidden 192, qkv 320, a block
// straddling q and k, I 320), GQA 3:1.
inline ModelConfig partial_blocks_config(ModelFamily family, int64_t intermediate = 320) {
  return tiny_config(family, {.hidden = 192, .heads = 3, .kv_heads = 1, .head_dim = 64,
                              .intermediate = intermediate, .layers = 2, .vocab = 301,
                              .tied = family == ModelFamily::qwen3});
}

// SmolLM2-135M's layer shapes (hidden 576, 9 q heads over 3 kv heads of 64, I 1536), two layers:
// the GPU tests' partial-block model.
inline ModelConfig gpu_partial_blocks_config() {
  return tiny_config(ModelFamily::llama, {.hidden = 576, .heads = 9, .kv_heads = 3, .head_dim = 64,
                                          .intermediate = 1536, .layers = 2, .vocab = 1000, .tied = true});
}

// Weights ~ N(0, 1/fan_in) (activations of order 1, so gradients are well above rounding noise),
// norm weights 1 + N(0, 0.1²), biases N(0, 0.1²).
inline ModelParameters random_parameters(const ModelConfig& c, uint64_t seed) {
  ModelParameters p = ModelParameters::zeros(c);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  p.for_each([&](const std::string& name, Tensor& t) {
    float* v = t.data_as<float>();
    const bool norm = name.ends_with("norm"), bias = name.ends_with("bias");
    const float scale = norm || bias ? 0.1f : 1.0f / std::sqrt(float(t.dim(t.rank() - 1)));
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = (norm ? 1.0f : 0.0f) + scale * normal(rng);
  });
  return p;
}

inline Sequences random_sequences(const std::vector<int>& lengths, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, int32_t(vocab - 1));
  Sequences seqs;
  for (int n : lengths) {
    seqs.emplace_back(size_t(n));
    for (int32_t& x : seqs.back()) x = token(rng);
  }
  return seqs;
}

inline Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

// Packed batch: targets are the next tokens; a sequence's last row targets token 0 (ignored).
inline TrainBatch pack(const Sequences& seqs) {
  std::vector<int32_t> tokens, targets, cu{0};
  for (const auto& s : seqs) {
    for (size_t i = 0; i < s.size(); ++i) {
      tokens.push_back(s[i]);
      targets.push_back(i + 1 < s.size() ? s[i + 1] : 0);
    }
    cu.push_back(int32_t(tokens.size()));
  }
  return {i32_tensor(tokens), i32_tensor(targets), i32_tensor(cu)};
}

inline std::vector<float> to_floats(const Tensor& t) {
  const float* p = t.data_as<float>();
  return {p, p + t.numel()};
}

// The name of the first gradient whose bytes differ between two models of one config ("" when
// every one is equal).
inline std::string first_different_gradient(Transformer& got, Transformer& want) {
  std::vector<const Tensor*> wanted;
  want.grads().for_each([&](const std::string&, const Tensor& t) { wanted.push_back(&t); });
  std::string first;
  size_t i = 0;
  got.grads().for_each([&](const std::string& name, const Tensor& t) {
    const Tensor a = t.to(Device::cpu), b = wanted[i++]->to(Device::cpu);
    if (first.empty() && (a.shape() != b.shape() || std::memcmp(a.data(), b.data(), a.nbytes()) != 0)) first = name;
  });
  return first;
}

// The fp8 recipe's expert copies of every sparse layer (model/moe.h): "" when each expert's copy
// (weight_copies) is a view of its projection's stack — expert e's W, W's scales (and with
// `with_transpose` Wᵀ's) right after expert e − 1's — and holds the bytes of a fresh
// LinearWeight made from its master in `masters` (host tensors); else the first that is not.
inline std::string expert_copies_mismatch(Transformer& model, const ModelParameters& masters, bool with_transpose) {
  for (size_t i = 0; i < masters.layers.size(); ++i) {
    const std::vector<ExpertParameters>& experts = masters.layers[i].experts;
    for (const char* proj : {"gate_up", "down"}) {
      const Fp8Weight* prev = nullptr;
      for (size_t e = 0; e < experts.size(); ++e) {
        const std::string name = "layers." + std::to_string(i) + ".experts." + std::to_string(e) + "." + proj;
        const Fp8Weight* c = model.weight_copies(name).fp8;
        if (!c || !c->w.data.defined()) return name + ": no fp8 copy";
        const LinearWeight fresh(Recipe::fp8, std::string(proj) == "gate_up" ? experts[e].gate_up : experts[e].down);
        std::vector<std::pair<const Fp8Blocks*, const Fp8Blocks*>> blocks = {{&c->w, &fresh.fp8.w}};
        if (with_transpose) blocks.push_back({&c->wt, &fresh.fp8.wt});
        for (size_t b = 0; b < blocks.size(); ++b) {
          const char* which = b == 0 ? " W" : " Wᵀ";
          const Fp8Blocks& got = *blocks[b].first;
          const Fp8Blocks& want = *blocks[b].second;
          for (auto [g, w] : {std::pair{&got.data, &want.data}, std::pair{&got.scales, &want.scales}}) {
            const Tensor host = g->to(Device::cpu);
            if (host.shape() != w->shape() || std::memcmp(host.data(), w->data(), w->nbytes()) != 0)
              return name + which + ": not the bytes of a fresh copy of its master";
          }
          if (prev) {
            const Fp8Blocks& before = b == 0 ? prev->w : prev->wt;
            for (auto [t, p] : {std::pair{&got.data, &before.data}, std::pair{&got.scales, &before.scales}})
              if (t->data() != static_cast<const char*>(p->data()) + p->nbytes())
                return name + which + ": not right after the previous expert's in a stack";
          }
        }
        prev = c;
      }
    }
  }
  return "";
}

}  // namespace lockstep::testing
