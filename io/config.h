// io/config.h — the model architecture from a Hugging Face config.json, for the four families
// lockstep implements: Qwen3 (Qwen3ForCausalLM), Qwen3-MoE (Qwen3MoeForCausalLM), Qwen2.5
// (Qwen2ForCausalLM) and Llama 3 (LlamaForCausalLM). Parsing validates everything the model code
// relies on, so a bad or unsupported config fails here with one message naming the file and the
// field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep {

enum class ModelFamily { qwen3, qwen3_moe, qwen2, llama };

// Hugging Face's `model_type`: "qwen3", "qwen3_moe", "qwen2", "llama".
std::string_view model_type_name(ModelFamily family);
// Hugging Face's `architectures[0]`: "Qwen3ForCausalLM", ...
std::string_view architecture_name(ModelFamily family);

// Llama 3.1/3.2 long-context RoPE: frequencies are divided by `factor` for long wavelengths, kept
// for short ones, and blended in between (rope_scaling.rope_type == "llama3").
struct Llama3RopeScaling {
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;
  bool operator==(const Llama3RopeScaling&) const = default;
};

// A checkpoint whose linear weights are block-FP8 (config.json's `quantization_config`, as Qwen3-*-FP8
// and DeepSeek-V3 publish theirs: quant_method "fp8", fmt "e4m3", activation_scheme "dynamic"):
// each projection's weight is E4M3 with an fp32 `weight_scale_inv` per block of `block_rows` ×
// `block_cols` elements (weight ≈ e4m3 · scale_inv; the last block of a dimension may be partial);
// the modules named in `modules_to_not_convert` (e.g. "lm_head") and every embedding, norm and bias
// stay in the checkpoint's dtype.
struct Fp8Quantization {
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  std::vector<std::string> modules_to_not_convert;
  bool operator==(const Fp8Quantization&) const = default;
};

// Qwen3-MoE's sparse MLP (transformers' Qwen3MoeSparseMoeBlock): a router linear [E, H] (`mlp.gate`)
// gives each token E logits; softmax over them in fp32; the k = num_experts_per_tok most probable
// experts (ties: the lower expert index first) each run a SwiGLU MLP of moe_intermediate_size, and
// their outputs are summed weighted by those probabilities (divided by their sum when
// norm_topk_prob). Layer i is sparse when i is not in mlp_only_layers and (i + 1) is a multiple of
// decoder_sparse_step; the others have the dense MLP of intermediate_size.
struct MoeConfig {
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = false;
  // The Switch-Transformer load-balancing loss (transformers' load_balancing_loss_func) is added
  // to the training loss times router_aux_loss_coef when output_router_logits is true (as
  // Qwen3MoeForCausalLM does).
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
  bool operator==(const MoeConfig&) const = default;
};

struct ModelConfig {
  ModelFamily family = ModelFamily::llama;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // default: num_attention_heads (no GQA)
  int64_t head_dim = 0;             // Qwen3 states it; otherwise default hidden / heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 0;
  double rope_theta = 0;
  std::optional<Llama3RopeScaling> rope_scaling;  // none: plain RoPE
  bool tie_word_embeddings = false;               // lm_head shares embed_tokens' weight
  bool qkv_bias = false;  // q/k/v projections have a bias (Qwen2 always; others `attention_bias`)
  bool o_bias = false;    // the output projection has a bias (`attention_bias`, never Qwen2)
  bool mlp_bias = false;  // gate/up/down have a bias (Llama `mlp_bias`)
  bool qk_norm = false;   // RMSNorm over head_dim on q and k before RoPE (Qwen3)
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json holds an int or a list
  std::string torch_dtype;             // the checkpoint's dtype as stated ("bfloat16"), or empty
  std::optional<Fp8Quantization> fp8_quantization;  // none: the weights are bf16, f16 or f32
  std::optional<MoeConfig> moe;  // Qwen3-MoE only (and always there)

  // Whether layer `layer` has the sparse MLP (MoeConfig); false for dense families.
  bool is_moe_layer(int64_t layer) const;
  // How many layers have it.
  int64_t sparse_layers() const;

  // A config.json Hugging Face loads back into the same model (2-space indented, keys sorted).
  std::string to_json() const;
  bool operator==(const ModelConfig&) const = default;
};

// `source` names the text in error messages (normally the file path).
ModelConfig parse_model_config(std::string_view json_text, const std::string& source);
// `path`: a folder holding config.json, or a .json file itself. A path that does not exist, a
// folder without config.json or a file not named *.json is an error saying so. A folder whose
// config.json says tie_word_embeddings but whose weights hold an lm_head.weight different from
// model.embed_tokens.weight gets an untied config and a warning on stderr, as transformers does.
ModelConfig load_model_config(const std::string& path);
// Writes `config.to_json()` to `path` atomically.
void save_model_config(const ModelConfig& config, const std::string& path);

// The number of distinct parameters (a tied lm_head counted once): embeddings, every layer's
// attention, norms and MLP (a sparse one: its router and every expert), the final norm and,
// untied, the lm_head.
int64_t parameter_count(const ModelConfig& config);

}  // namespace lockstep
