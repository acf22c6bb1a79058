// io/config.cpp — config.json -> ModelConfig and back. Defaults follow the Hugging Face config
// classes only where guessing cannot silently change the model; the sizes, rms_norm_eps and
// rope_theta are required.
#include "io/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file_io.h"
#include "io/safetensors.h"

namespace lockstep {

using json = nlohmann::json;
using detail::concat;

std::string_view model_type_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::qwen3: return "qwen3";
    case ModelFamily::qwen3_moe: return "qwen3_moe";
    case ModelFamily::qwen2: return "qwen2";
    case ModelFamily::llama: return "llama";
  }
  return "?";
}

std::string_view architecture_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::qwen3: return "Qwen3ForCausalLM";
    case ModelFamily::qwen3_moe: return "Qwen3MoeForCausalLM";
    case ModelFamily::qwen2: return "Qwen2ForCausalLM";
    case ModelFamily::llama: return "LlamaForCausalLM";
  }
  return "?";
}

namespace {

constexpr ModelFamily kFamilies[] = {ModelFamily::qwen3, ModelFamily::qwen3_moe, ModelFamily::qwen2,
                                     ModelFamily::llama};

// Qwen3 and Qwen3-MoE share the attention: q/k norms, a stated head_dim.
bool is_qwen3_like(ModelFamily family) {
  return family == ModelFamily::qwen3 || family == ModelFamily::qwen3_moe;
}

// Upper bounds on the sizes a config.json states. The largest open checkpoints sit far below them
// (Llama 3.1 405B: hidden 16384, intermediate 53248, 126 layers, 128 heads); they are there so that
// every product of sizes lockstep forms fits an int64_t, the largest being parameter_count's MoE
// term, layers x experts x 3 x hidden x moe_intermediate <= 2^12 x 2^12 x 3 x 2^17 x 2^17 < 2^60,
// and so that a garbled value fails here, naming its field, instead of overflowing or looping later.
constexpr int64_t kMaxWidth = int64_t(1) << 17;         // hidden, intermediate and expert sizes
constexpr int64_t kMaxHeads = int64_t(1) << 10;         // attention and key/value heads
constexpr int64_t kMaxHeadDim = int64_t(1) << 12;
constexpr int64_t kMaxLayers = int64_t(1) << 12;
constexpr int64_t kMaxExperts = int64_t(1) << 12;
constexpr int64_t kMaxVocab = int64_t(1) << 24;
constexpr int64_t kMaxPositions = int64_t(1) << 24;     // sequence lengths

// Typed access to the fields of one JSON object; every error names the source and the field
// (with `prefix`, e.g. "rope_scaling.", for a nested object). A JSON null counts as absent.
class Fields {
 public:
  Fields(const json& object, const std::string& source, std::string prefix = "")
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  const json* find(const char* field) const {
    const auto it = object_.find(field);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  const json& required(const char* field) const {
    const json* v = find(field);
    if (!v) fail_field(field, "is missing (required)");
    return *v;
  }

  int64_t positive_int(const char* field, int64_t limit) const {
    return positive_int_value(field, required(field), limit);
  }
  int64_t non_negative_int(const char* field, const json& v) const {
    if (!v.is_number_unsigned()) fail_field(field, "must hold non-negative integers, got " + describe(v));
    return v.get<int64_t>();
  }
  double non_negative_number(const char* field, double fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_number()) fail_field(field, "must be a number, got " + describe(*v));
    const double x = v->get<double>();
    if (!(x >= 0) || !std::isfinite(x)) fail_field(field, "must be zero or positive, got " + v->dump());
    return x;
  }
  int64_t positive_int(const char* field, int64_t fallback, int64_t limit) const {
    const json* v = find(field);
    return v ? positive_int_value(field, *v, limit) : fallback;
  }
  double positive_number(const char* field) const {
    const json& v = required(field);
    if (!v.is_number()) fail_field(field, "must be a number, got " + describe(v));
    const double x = v.get<double>();
    if (!(x > 0) || !std::isfinite(x)) fail_field(field, "must be positive, got " + v.dump());
    return x;
  }
  bool boolean(const char* field, bool fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_boolean()) fail_field(field, "must be true or false, got " + describe(*v));
    return v->get<bool>();
  }
  std::string string(const char* field, const std::string& fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_string()) fail_field(field, "must be a string, got " + describe(*v));
    return v->get<std::string>();
  }
  int64_t token_id(const char* field, const json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      fail_field(field, "must be a non-negative integer token id (or a list of them), got " +
                            describe(v));
    return v.get<int64_t>();
  }

  [[noreturn]] void fail_field(const char* field, const std::string& what) const {
    fail(concat(source_, ": field '", prefix_, field, "' ", what));
  }
  [[noreturn]] void fail_source(const std::string& what) const { fail(concat(source_, ": ", what)); }

 private:
  static std::string describe(const json& v) { return v.dump() + " (" + v.type_name() + ")"; }
  int64_t positive_int_value(const char* field, const json& v, int64_t limit) const {
    if (!v.is_number_integer()) fail_field(field, "must be an integer, got " + describe(v));
    // nlohmann holds integers >= 0 as unsigned, negative ones as signed.
    const bool positive = v.is_number_unsigned() && v.get<uint64_t>() > 0;
    if (!positive) fail_field(field, "must be a positive integer, got " + v.dump());
    if (v.get<uint64_t>() > uint64_t(limit))
      fail_field(field, concat("is ", v.dump(), ", above lockstep's limit of ", limit,
                               " (lockstep bounds every size so that their products fit 64 bits)"));
    return v.get<int64_t>();
  }

  const json& object_;
  const std::string& source_;
  std::string prefix_;
};

ModelFamily parse_family(const Fields& f) {
  const json* architectures = f.find("architectures");
  const json* model_type = f.find("model_type");
  std::string supported;
  for (ModelFamily fam : kFamilies) supported += (supported.empty() ? "" : ", ") + std::string(architecture_name(fam));
  if (!architectures) {
    // Some tools drop `architectures`; `model_type` then says the same thing.
    if (!model_type) f.fail_field("architectures", "is missing (required)");
    const std::string type = f.string("model_type", "");
    for (ModelFamily fam : kFamilies)
      if (model_type_name(fam) == type) return fam;
    f.fail_field("model_type", concat("is '", type, "', which lockstep does not implement (it reads ",
                                      supported, ")"));
  }
  if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string())
    f.fail_field("architectures", "must be a list of class names, got " + architectures->dump());
  const std::string name = (*architectures)[0].get<std::string>();
  for (ModelFamily fam : kFamilies) {
    if (architecture_name(fam) != name) continue;
    const std::string type = f.string("model_type", std::string(model_type_name(fam)));
    if (type != model_type_name(fam))
      f.fail_field("model_type", concat("is '", type, "', but architectures says ", name));
    return fam;
  }
  f.fail_field("architectures", concat("names unsupported architecture '", name,
                                       "' (lockstep reads ", supported, ")"));
}

// rope_scaling (or, as transformers 5 writes it, rope_parameters) -> none or Llama 3 scaling.
std::optional<Llama3RopeScaling> parse_rope_scaling(const Fields& f, const std::string& source) {
  const char* field = f.find("rope_scaling") ? "rope_scaling" : "rope_parameters";
  const json* scaling = f.find(field);
  if (!scaling) return std::nullopt;
  if (!scaling->is_object()) f.fail_field(field, "must be an object or null, got " + scaling->dump());
  const Fields s(*scaling, source, std::string(field) + ".");
  const std::string type = s.find("rope_type") ? s.string("rope_type", "") : s.string("type", "");
  if (type.empty()) f.fail_field(field, "has no 'rope_type'");
  if (type == "default") return std::nullopt;
  if (type != "llama3")
    f.fail_field(field, concat("has rope type '", type,
                               "', which is unsupported (lockstep implements plain RoPE and 'llama3')"));
  Llama3RopeScaling r;
  r.factor = s.positive_number("factor");
  r.low_freq_factor = s.positive_number("low_freq_factor");
  r.high_freq_factor = s.positive_number("high_freq_factor");
  r.original_max_position_embeddings = s.positive_int("original_max_position_embeddings", kMaxPositions);
  // The blend between the two wavelength bounds divides by (high - low).
  if (!(r.low_freq_factor < r.high_freq_factor))
    s.fail_field("low_freq_factor", concat("(", r.low_freq_factor, ") must be below high_freq_factor (",
                                           r.high_freq_factor, ")"));
  return r;
}

// quantization_config -> block-FP8, the one quantized format lockstep reads and writes. Anything else
// (another method, static activation scales, another element format) would load as something other
// than what the checkpoint holds, so it is an error naming the field.
std::optional<Fp8Quantization> parse_quantization(const Fields& f, const std::string& source) {
  const json* q = f.find("quantization_config");
  if (!q) return std::nullopt;
  if (!q->is_object()) f.fail_field("quantization_config", "must be an object, got " + q->dump());
  const Fields g(*q, source, "quantization_config.");
  const std::string method = g.string("quant_method", "");
  if (method != "fp8")
    g.fail_field("quant_method", concat("is '", method, "'; lockstep reads block-FP8 checkpoints ",
                                        "(quant_method \"fp8\") and unquantized ones"));
  const std::string fmt = g.string("fmt", "e4m3");
  if (fmt != "e4m3") g.fail_field("fmt", concat("is '", fmt, "'; lockstep reads e4m3 weights"));
  const std::string activations = g.string("activation_scheme", "dynamic");
  if (activations != "dynamic")
    g.fail_field("activation_scheme", concat("is '", activations, "'; lockstep quantizes activations ",
                                             "dynamically (\"dynamic\") and reads no activation scales"));
  Fp8Quantization r;
  const json* block = g.find("weight_block_size");
  if (!block)
    g.fail_field("weight_block_size", "is missing: lockstep reads block-scaled weights (e.g. [128, 128]), "
                                      "not one scale per tensor");
  if (!block->is_array() || block->size() != 2)
    g.fail_field("weight_block_size", "must be [rows, columns], got " + block->dump());
  const json named_sizes = {{"rows", (*block)[0]}, {"columns", (*block)[1]}};
  const Fields sizes(named_sizes, source, "quantization_config.weight_block_size.");
  r.block_rows = sizes.positive_int("rows", kMaxWidth);
  r.block_cols = sizes.positive_int("columns", kMaxWidth);
  if (const json* skip = g.find("modules_to_not_convert")) {
    if (!skip->is_array()) g.fail_field("modules_to_not_convert", "must be a list of module names, got " + skip->dump());
    for (const json& name : *skip) {
      if (!name.is_string())
        g.fail_field("modules_to_not_convert", "must hold module names (strings), got " + name.dump());
      r.modules_to_not_convert.push_back(name.get<std::string>());
    }
  }
  return r;
}

// Qwen3MoeConfig's fields of the sparse MLP. The sizes are required; the rest default as
// transformers' Qwen3MoeConfig does (decoder_sparse_step 1, mlp_only_layers [], norm_topk_prob
// false, router_aux_loss_coef 0.001, output_router_logits false).
MoeConfig parse_moe(const Fields& f, int64_t layers) {
  MoeConfig m;
  // The Qwen3-MoE checkpoints say num_experts; transformers 5 writes it as num_local_experts
  // (seen with 5.17.0's Qwen3MoeConfig.save_pretrained). Either, not both.
  const char* experts = f.find("num_experts") || !f.find("num_local_experts") ? "num_experts"
                                                                                : "num_local_experts";
  if (f.find("num_experts") && f.find("num_local_experts"))
    f.fail_field("num_local_experts", "given with num_experts: one of the two names, not both");
  m.num_experts = f.positive_int(experts, kMaxExperts);
  m.num_experts_per_tok = f.positive_int("num_experts_per_tok", kMaxExperts);
  if (m.num_experts_per_tok > m.num_experts)
    f.fail_field("num_experts_per_tok", concat("(", m.num_experts_per_tok, ") exceeds ", experts, " (",
                                               m.num_experts, ")"));
  m.moe_intermediate_size = f.positive_int("moe_intermediate_size", kMaxWidth);
  m.decoder_sparse_step = f.positive_int("decoder_sparse_step", 1, kMaxLayers);
  if (const json* only = f.find("mlp_only_layers")) {
    if (!only->is_array())
      f.fail_field("mlp_only_layers", "must be a list of layer indices, got " + only->dump());
    for (const json& v : *only) {
      const int64_t layer = f.non_negative_int("mlp_only_layers", v);
      if (layer >= layers)
        f.fail_field("mlp_only_layers", concat("holds layer ", layer, ", but the model has ", layers,
                                               " layers (num_hidden_layers)"));
      m.mlp_only_layers.push_back(layer);
    }
  }
  m.norm_topk_prob = f.boolean("norm_topk_prob", false);
  m.router_aux_loss_coef = f.non_negative_number("router_aux_loss_coef", 0.001);
  m.output_router_logits = f.boolean("output_router_logits", false);
  return m;
}

ModelConfig parse_config_object(const json& j, const std::string& source) {
  if (!j.is_object()) fail(concat(source, ": config is not a JSON object but ", j.type_name()));
  const Fields f(j, source);
  ModelConfig c;
  c.family = parse_family(f);
  const bool qwen = c.family != ModelFamily::llama;

  c.hidden_size = f.positive_int("hidden_size", kMaxWidth);
  c.intermediate_size = f.positive_int("intermediate_size", kMaxWidth);
  c.num_hidden_layers = f.positive_int("num_hidden_layers", kMaxLayers);
  c.num_attention_heads = f.positive_int("num_attention_heads", kMaxHeads);
  c.num_key_value_heads = f.positive_int("num_key_value_heads", c.num_attention_heads, kMaxHeads);
  c.vocab_size = f.positive_int("vocab_size", kMaxVocab);
  // Hugging Face's class defaults; only a cap on the sequence length.
  c.max_position_embeddings = f.positive_int("max_position_embeddings", qwen ? 32768 : 2048, kMaxPositions);
  c.rms_norm_eps = f.positive_number("rms_norm_eps");

  if (f.find("head_dim")) {
    c.head_dim = f.positive_int("head_dim", kMaxHeadDim);
  } else {
    // Qwen3's head_dim is not hidden / heads in general (Qwen3-0.6B: 1024 / 16 heads, head_dim 128).
    if (is_qwen3_like(c.family)) f.fail_field("head_dim", "is missing (required for Qwen3)");
    if (c.hidden_size % c.num_attention_heads != 0)
      f.fail_field("hidden_size", concat("(", c.hidden_size, ") is not divisible by num_attention_heads (",
                                         c.num_attention_heads, "), and there is no head_dim"));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail_field("num_key_value_heads", concat("(", c.num_key_value_heads,
                                               ") does not divide num_attention_heads (",
                                               c.num_attention_heads, ")"));

  const json* rope_parameters = f.find("rope_parameters");
  if (!f.find("rope_theta") && rope_parameters && rope_parameters->is_object())
    c.rope_theta = Fields(*rope_parameters, source, "rope_parameters.").positive_number("rope_theta");
  else
    c.rope_theta = f.positive_number("rope_theta");
  c.rope_scaling = parse_rope_scaling(f, source);

  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  if (c.family == ModelFamily::qwen2) {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v always biased, o never; `attention_bias` is ignored
  } else {
    c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
  }
  if (c.family == ModelFamily::llama) c.mlp_bias = f.boolean("mlp_bias", false);
  c.qk_norm = is_qwen3_like(c.family);
  if (c.family == ModelFamily::qwen3_moe) c.moe = parse_moe(f, c.num_hidden_layers);

  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") f.fail_field("hidden_act", concat("is '", act, "'; lockstep implements 'silu' (SwiGLU)"));
  if (qwen && f.boolean("use_sliding_window", false))
    f.fail_field("use_sliding_window", "is true; sliding-window attention is not supported");
  // Newer transformers spell the attention kind per layer.
  if (const json* layer_types = f.find("layer_types")) {
    if (!layer_types->is_array()) f.fail_field("layer_types", "must be a list, got " + layer_types->dump());
    for (const json& type : *layer_types)
      if (type != "full_attention")
        f.fail_field("layer_types", "holds " + type.dump() + "; lockstep implements only \"full_attention\"");
  }

  if (const json* bos = f.find("bos_token_id")) c.bos_token_id = f.token_id("bos_token_id", *bos);
  if (const json* eos = f.find("eos_token_id")) {
    if (eos->is_array()) {
      for (const json& id : *eos) c.eos_token_ids.push_back(f.token_id("eos_token_id", id));
    } else {
      c.eos_token_ids.push_back(f.token_id("eos_token_id", *eos));
    }
  }
  // transformers 5 renamed torch_dtype to dtype.
  c.torch_dtype = f.string("torch_dtype", f.string("dtype", ""));
  c.fp8_quantization = parse_quantization(f, source);
  return c;
}

// The flags a config.json can express for each family; anything else would load differently.
void check_expressible(const ModelConfig& c) {
  const bool ok =
      c.qk_norm == is_qwen3_like(c.family) && c.moe.has_value() == (c.family == ModelFamily::qwen3_moe) &&
      (c.family == ModelFamily::llama || !c.mlp_bias) &&
      (c.family == ModelFamily::qwen2 ? (c.qkv_bias && !c.o_bias) : c.qkv_bias == c.o_bias);
  LOCKSTEP_CHECK(ok, "ModelConfig for ", architecture_name(c.family), " has bias/qk-norm flags (qkv_bias ",
                 c.qkv_bias, ", o_bias ", c.o_bias, ", mlp_bias ", c.mlp_bias, ", qk_norm ", c.qk_norm,
                 ", moe ", c.moe.has_value(), ") that its config.json cannot express");
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (!moe) return false;
  const auto& only = moe->mlp_only_layers;
  return std::find(only.begin(), only.end(), layer) == only.end() &&
         (layer + 1) % moe->decoder_sparse_step == 0;
}

int64_t ModelConfig::sparse_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) n += is_moe_layer(i);
  return n;
}

std::string ModelConfig::to_json() const {
  check_expressible(*this);
  json j = {
      {"architectures", json::array({std::string(architecture_name(family))})},
      {"model_type", std::string(model_type_name(family))},
      {"hidden_act", "silu"},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", tie_word_embeddings},
  };
  if (rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling->factor},
                         {"low_freq_factor", rope_scaling->low_freq_factor},
                         {"high_freq_factor", rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings",
                          rope_scaling->original_max_position_embeddings}};
  }
  if (family != ModelFamily::qwen2) j["attention_bias"] = o_bias;
  if (family == ModelFamily::llama) j["mlp_bias"] = mlp_bias;
  if (family != ModelFamily::llama) j["use_sliding_window"] = false;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  if (moe) {
    j["num_experts"] = moe->num_experts;
    j["num_experts_per_tok"] = moe->num_experts_per_tok;
    j["moe_intermediate_size"] = moe->moe_intermediate_size;
    j["decoder_sparse_step"] = moe->decoder_sparse_step;
    j["mlp_only_layers"] = moe->mlp_only_layers;
    j["norm_topk_prob"] = moe->norm_topk_prob;
    j["router_aux_loss_coef"] = moe->router_aux_loss_coef;
    j["output_router_logits"] = moe->output_router_logits;
  }
  if (fp8_quantization) {
    j["quantization_config"] = {
        {"quant_method", "fp8"},
        {"fmt", "e4m3"},
        {"activation_scheme", "dynamic"},
        {"weight_block_size", {fp8_quantization->block_rows, fp8_quantization->block_cols}}};
    // An empty list would tell transformers to convert everything, the LM head included.
    if (!fp8_quantization->modules_to_not_convert.empty())
      j["quantization_config"]["modules_to_not_convert"] = fp8_quantization->modules_to_not_convert;
  }
  return j.dump(2) + "\n";
}

ModelConfig parse_model_config(std::string_view json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(concat(source, ": not valid JSON (", e.what(), ")"));
  }
  return parse_config_object(j, source);
}

namespace {

// Whether two checkpoint tensors hold equal values (torch.equal after loading both in one dtype).
bool equal_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  auto widened = [](const Tensor& t, int64_t i) -> std::optional<float> {
    switch (t.dtype()) {
      case DType::f32: return t.data_as<float>()[i];
      case DType::bf16: return bf16_to_float(t.data_as<bf16>()[i]);
      case DType::f16: return f16_to_float(t.data_as<f16>()[i]);
      default: return std::nullopt;
    }
  };
  if (a.dtype() == b.dtype() && !widened(a, 0) && a.numel() > 0)  // other dtypes: the same bytes
    return std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const std::optional<float> x = widened(a, i), y = widened(b, i);
    if (!x || !y || *x != *y) return false;
  }
  return true;
}

// A checkpoint whose config.json ties the embeddings but which holds an lm_head.weight different
// from model.embed_tokens.weight: transformers (PreTrainedModel.tie_weights in modeling_utils.py)
// then does not tie them, keeps the stored head and warns. The same here: the config is untied,
// so the stored head is loaded and used. A stored head equal to the embeddings stays tied (as
// transformers does, silently: .bin exports hold both).
void untie_a_differing_stored_head(ModelConfig& config, const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  if (!config.tie_word_embeddings) return;
  if (!fs::exists(folder / "model.safetensors") && !fs::exists(folder / "model.safetensors.index.json"))
    return;
  const SafetensorsCheckpoint checkpoint(folder.string());
  if (!checkpoint.contains("lm_head.weight") || !checkpoint.contains("model.embed_tokens.weight")) return;
  if (equal_values(checkpoint.tensor("lm_head.weight"), checkpoint.tensor("model.embed_tokens.weight")))
    return;
  config.tie_word_embeddings = false;
  std::fprintf(stderr,
               "lockstep: warning: %s: config.json says tie_word_embeddings: true, but the checkpoint "
               "holds an lm_head.weight different from model.embed_tokens.weight; as transformers "
               "does, they are NOT tied and the stored head is used (set tie_word_embeddings to "
               "false in config.json to silence this)\n",
               folder.string().c_str());
}

}  // namespace

ModelConfig load_model_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  LOCKSTEP_CHECK(fs::exists(status), "model config ", path,
                 ": no such file or folder (a Hugging Face checkpoint folder holds config.json)");
  if (fs::is_directory(status)) {
    const std::string file = (fs::path(path) / "config.json").string();
    LOCKSTEP_CHECK(fs::exists(file), "model folder ", path,
                   " has no config.json (a Hugging Face checkpoint folder holds one)");
    ModelConfig config = parse_model_config(read_file(file, "config"), file);
    untie_a_differing_stored_head(config, path);
    return config;
  }
  // A file: the config.json itself. Any other file is a mistaken model folder.
  LOCKSTEP_CHECK(fs::path(path).extension() == ".json", path,
                 " is a file, not a model folder (a Hugging Face checkpoint folder holding "
                 "config.json)");
  return parse_model_config(read_file(path, "config"), path);
}

void save_model_config(const ModelConfig& config, const std::string& path) {
  write_file_atomically(path, config.to_json());
}

int64_t parameter_count(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, ff = c.intermediate_size;
  const int64_t attention = h * q + 2 * h * kv + q * h + (c.qkv_bias ? q + 2 * kv : 0) +
                            (c.o_bias ? h : 0) + (c.qk_norm ? 2 * c.head_dim : 0);
  const int64_t dense_mlp = 3 * h * ff + (c.mlp_bias ? 2 * ff + h : 0);
  int64_t layers = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const int64_t mlp = c.is_moe_layer(i) ? c.moe->num_experts * (h + 3 * h * c.moe->moe_intermediate_size)
                                          : dense_mlp;
    layers += attention + mlp + 2 * h;  // + input and post-attention RMSNorm
  }
  const int64_t embedding = c.vocab_size * h;
  return embedding + layers + h + (c.tie_word_embeddings ? 0 : embedding);
}

}  // namespace lockstep
