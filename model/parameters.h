// model/parameters.h — the tensors of a Qwen3 / Qwen2.5 / Llama-3 transformer, all fp32.
//
// The same structure holds the master weights and their gradients. Projections that read the same
// input are fused (one GEMM each): `qkv` stacks q_proj, k_proj, v_proj along the output dimension
// (ops/head_layout.h), `gate_up` stacks gate_proj and up_proj (ops/swiglu.h). model/hf_checkpoint.h
// maps them to and from Hugging Face's tensor names.
//
// Optional tensors (biases, Qwen3's q/k norms, an untied lm_head) are undefined Tensors when the
// config does not have them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"

namespace lockstep {

struct LayerParameters {
  Tensor input_norm;    // [H]
  Tensor qkv;           // [q + 2·kv, H]
  Tensor qkv_bias;      // [q + 2·kv]      Qwen2 (attention_bias)
  Tensor q_norm;        // [head_dim]      Qwen3
  Tensor k_norm;        // [head_dim]      Qwen3
  Tensor o;             // [H, q]
  Tensor o_bias;        // [H]             attention_bias (not Qwen2)
  Tensor post_norm;     // [H]             post_attention_layernorm
  Tensor gate_up;       // [2·I, H]
  Tensor gate_up_bias;  // [2·I]           mlp_bias
  Tensor down;          // [H, I]
  Tensor down_bias;     // [H]             mlp_bias
};

struct ModelParameters {
  Tensor embed;    // [V, H]
  std::vector<LayerParameters> layers;
  Tensor final_norm;  // [H]
  Tensor lm_head;     // [V, H]; undefined when tied to embed

  // Zero-filled tensors of the config's shapes (fp32, on `device`).
  static ModelParameters zeros(const ModelConfig& config, Device device = Device::cpu);
  // Hugging Face's initialization: linear weights and embeddings ~ N(0, 0.02²), norm weights 1,
  // biases 0. Deterministic in `seed` (Philox; each tensor its own stream).
  static ModelParameters initialized(const ModelConfig& config, uint64_t seed,
                                     Device device = Device::cpu);

  // A deep copy on `device` (a frozen reference, or a second model from the same start).
  ModelParameters copy_to(Device device) const;

  // Every defined tensor with a stable name ("embed", "layers.3.qkv", ...), in a fixed order.
  void for_each(const std::function<void(const std::string&, Tensor&)>& fn);
  void for_each(const std::function<void(const std::string&, const Tensor&)>& fn) const;
  int64_t numel() const;
  // Sets every tensor to zero (gradients before a step).
  void zero();
};

// Moves every weight-matrix master (embedding, LM head, linear layers; CPU tensors) off the bf16
// grid by u · ulp_bf16(w), u uniform in ±0.49 (Philox in `seed`, one stream per tensor): each bf16
// rounding stays w, so a bf16 model computes the same function, and the fp8 copies are requantized
// from slightly moved values. Why: masters loaded from a bf16 checkpoint all sit on the bf16 grid,
// so a small first update changes no bf16 copy (each master must first move half an ulp), while
// the E4M3 bytes that sit exactly on rounding ties all flip at once in the update's direction
// (docs/experiments.md measures both). Norm weights and biases are left as they are.
void dither_within_bf16_rounding(ModelParameters& params, uint64_t seed);

}  // namespace lockstep
