// model/hf_checkpoint.cpp
#include "model/hf_checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"
#include "ops/elementwise.h"

namespace lockstep {

namespace {

namespace fs = std::filesystem;

// One Hugging Face tensor: rows [row_begin, row_begin + shape[0]) of one of our tensors.
struct Piece {
  std::string name;
  Tensor* target;
  int64_t row_begin;
  Shape shape;
};

// Every Hugging Face tensor of the config, in the order Hugging Face lists a model's parameters.
// `params` must have the config's structure (ModelParameters::zeros or loaded).
template <class Params>
std::vector<Piece> hf_pieces(const ModelConfig& c, Params& p) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, ff = c.intermediate_size;
  std::vector<Piece> pieces;
  auto add = [&](std::string name, const Tensor& t, int64_t row_begin, Shape shape) {
    pieces.push_back({std::move(name), const_cast<Tensor*>(&t), row_begin, std::move(shape)});
  };
  add("model.embed_tokens.weight", p.embed, 0, {c.vocab_size, h});
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const auto& l = p.layers[i];
    const std::string pre = "model.layers." + std::to_string(i) + ".";
    add(pre + "self_attn.q_proj.weight", l.qkv, 0, {q, h});
    add(pre + "self_attn.k_proj.weight", l.qkv, q, {kv, h});
    add(pre + "self_attn.v_proj.weight", l.qkv, q + kv, {kv, h});
    if (c.qkv_bias) {
      add(pre + "self_attn.q_proj.bias", l.qkv_bias, 0, {q});
      add(pre + "self_attn.k_proj.bias", l.qkv_bias, q, {kv});
      add(pre + "self_attn.v_proj.bias", l.qkv_bias, q + kv, {kv});
    }
    if (c.qk_norm) {
      add(pre + "self_attn.q_norm.weight", l.q_norm, 0, {c.head_dim});
      add(pre + "self_attn.k_norm.weight", l.k_norm, 0, {c.head_dim});
    }
    add(pre + "self_attn.o_proj.weight", l.o, 0, {h, q});
    if (c.o_bias) add(pre + "self_attn.o_proj.bias", l.o_bias, 0, {h});
    add(pre + "mlp.gate_proj.weight", l.gate_up, 0, {ff, h});
    add(pre + "mlp.up_proj.weight", l.gate_up, ff, {ff, h});
    if (c.mlp_bias) {
      add(pre + "mlp.gate_proj.bias", l.gate_up_bias, 0, {ff});
      add(pre + "mlp.up_proj.bias", l.gate_up_bias, ff, {ff});
    }
    add(pre + "mlp.down_proj.weight", l.down, 0, {h, ff});
    if (c.mlp_bias) add(pre + "mlp.down_proj.bias", l.down_bias, 0, {h});
    add(pre + "input_layernorm.weight", l.input_norm, 0, {h});
    add(pre + "post_attention_layernorm.weight", l.post_norm, 0, {h});
  }
  add("model.norm.weight", p.final_norm, 0, {h});
  if (!c.tie_word_embeddings) add("lm_head.weight", p.lm_head, 0, {c.vocab_size, h});
  return pieces;
}

// The piece's elements inside its (fp32, CPU) target tensor.
Tensor slice_of(const Piece& piece) {
  const int64_t row_elems = piece.shape.size() == 2 ? piece.shape[1] : 1;
  float* base = piece.target->data_as<float>() + piece.row_begin * row_elems;
  return Tensor::view_of(base, piece.shape, DType::f32);
}

bool ignorable(const std::string& name, const ModelConfig& c) {
  return (name == "lm_head.weight" && c.tie_word_embeddings) ||
         name.ends_with(".rotary_emb.inv_freq");
}

}  // namespace

ModelParameters load_hf_parameters(const ModelConfig& config, const std::string& path) {
  const SafetensorsCheckpoint checkpoint(path);
  ModelParameters params = ModelParameters::zeros(config);
  std::set<std::string> expected;
  for (const Piece& piece : hf_pieces(config, params)) {
    expected.insert(piece.name);
    LOCKSTEP_CHECK(checkpoint.contains(piece.name), "checkpoint ", path, ": missing tensor '",
                   piece.name, "' (a ", architecture_name(config.family), " of this config needs it)");
    const Tensor src = checkpoint.tensor(piece.name);
    LOCKSTEP_CHECK(src.shape() == piece.shape, "checkpoint ", path, ": tensor '", piece.name,
                   "' has shape ", shape_string(src.shape()), ", the config needs ",
                   shape_string(piece.shape));
    LOCKSTEP_CHECK(src.dtype() == DType::bf16 || src.dtype() == DType::f16 ||
                       src.dtype() == DType::f32,
                   "checkpoint ", path, ": tensor '", piece.name, "' is ", dtype_name(src.dtype()),
                   "; model weights must be bf16, f16 or f32");
    Tensor dst = slice_of(piece);
    if (src.dtype() == DType::f16) {  // convert() handles f32/bf16 only
      const f16* s = src.data_as<f16>();
      float* d = dst.data_as<float>();
      for (int64_t i = 0; i < src.numel(); ++i) d[i] = f16_to_float(s[i]);
    } else {
      convert(dst, src);
    }
  }
  for (const std::string& name : checkpoint.names())
    LOCKSTEP_CHECK(expected.count(name) || ignorable(name, config), "checkpoint ", path,
                   ": unexpected tensor '", name, "' (not part of a ",
                   architecture_name(config.family), " with this config)");
  return params;
}

void save_hf_checkpoint(const std::string& folder, const ModelConfig& config,
                        const ModelParameters& params, DType dtype) {
  LOCKSTEP_CHECK(dtype == DType::bf16 || dtype == DType::f32, "save_hf_checkpoint: dtype must be ",
                 "bf16 or f32, got ", dtype_name(dtype));
  ModelParameters cpu = params;  // shares the tensors; CUDA ones are replaced by host copies
  cpu.for_each([](const std::string&, Tensor& t) {
    if (t.is_cuda()) t = t.to(Device::cpu);
  });
  NamedTensors tensors;
  for (const Piece& piece : hf_pieces(config, cpu)) {
    Tensor out = Tensor::empty(piece.shape, dtype);
    convert(out, slice_of(piece));
    tensors.emplace_back(piece.name, std::move(out));
  }
  ModelConfig saved = config;
  saved.torch_dtype = dtype == DType::bf16 ? "bfloat16" : "float32";

  const fs::path target = fs::absolute(fs::path(folder).lexically_normal());
  LOCKSTEP_CHECK(target.has_filename() && target.filename() != "..",
                 "save_hf_checkpoint: '", folder, "' is not a usable folder name");
  const std::string suffix = "." + std::to_string(getpid());
  const fs::path temp = target.string() + ".tmp" + suffix, old = target.string() + ".old" + suffix;
  try {
    fs::remove_all(temp);
    fs::create_directories(temp);
    write_safetensors_checkpoint(temp.string(), tensors, kDefaultMaxShardBytes,
                                 {{"format", "pt"}});
    save_model_config(saved, (temp / "config.json").string());
    if (fs::exists(target)) fs::rename(target, old);
    fs::rename(temp, target);
    fs::remove_all(old);
  } catch (const fs::filesystem_error& e) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    fail("save_hf_checkpoint: cannot write '" + folder + "': " + e.what());
  }
}

}  // namespace lockstep
