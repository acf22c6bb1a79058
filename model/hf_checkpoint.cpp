// model/hf_checkpoint.cpp
#include "model/hf_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>

#include "core/error.h"
#include "io/file_io.h"
#include "io/safetensors.h"
#include "numerics/quantize.h"
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
    if (c.is_moe_layer(int64_t(i))) {
      const int64_t im = c.moe->moe_intermediate_size;
      add(pre + "mlp.gate.weight", l.router, 0, {c.moe->num_experts, h});
      for (size_t e = 0; e < l.experts.size(); ++e) {
        const std::string expert = pre + "mlp.experts." + std::to_string(e) + ".";
        add(expert + "gate_proj.weight", l.experts[e].gate_up, 0, {im, h});
        add(expert + "up_proj.weight", l.experts[e].gate_up, im, {im, h});
        add(expert + "down_proj.weight", l.experts[e].down, 0, {h, im});
      }
    } else {
      add(pre + "mlp.gate_proj.weight", l.gate_up, 0, {ff, h});
      add(pre + "mlp.up_proj.weight", l.gate_up, ff, {ff, h});
      if (c.mlp_bias) {
        add(pre + "mlp.gate_proj.bias", l.gate_up_bias, 0, {ff});
        add(pre + "mlp.up_proj.bias", l.gate_up_bias, ff, {ff});
      }
      add(pre + "mlp.down_proj.weight", l.down, 0, {h, ff});
      if (c.mlp_bias) add(pre + "mlp.down_proj.bias", l.down_bias, 0, {h});
    }
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

// The weights a block-FP8 checkpoint quantizes: the attention and MLP projections.
bool is_projection(const Piece& piece) {
  return piece.shape.size() == 2 && piece.name.ends_with("_proj.weight");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// dst [N, K] = e4m3 · scale_inv of the element's block, one fp32 multiply as transformers
// dequantizes (weight.to(float32) * scale_inv). Returns the scale tensor's name.
std::string load_fp8_piece(Tensor& dst, const Tensor& src, const SafetensorsCheckpoint& checkpoint,
                           const Piece& piece, const ModelConfig& config) {
  const std::string& path = checkpoint.path();
  LOCKSTEP_CHECK(config.fp8_quantization, "checkpoint ", path, ": tensor '", piece.name,
                 "' is F8_E4M3 but config.json has no quantization_config (which says how its "
                 "blocks are scaled)");
  LOCKSTEP_CHECK(piece.shape.size() == 2, "checkpoint ", path, ": tensor '", piece.name,
                 "' is F8_E4M3; only 2-D weights can be block-FP8");
  const std::string scale_name = piece.name + "_scale_inv";
  LOCKSTEP_CHECK(checkpoint.contains(scale_name), "checkpoint ", path, ": tensor '", piece.name,
                 "' is F8_E4M3 but its block scales '", scale_name, "' are missing");
  const Tensor scale = checkpoint.tensor(scale_name);
  const int64_t n = piece.shape[0], k = piece.shape[1];
  const int64_t br = config.fp8_quantization->block_rows, bc = config.fp8_quantization->block_cols;
  const Shape want = {ceil_div(n, br), ceil_div(k, bc)};
  LOCKSTEP_CHECK(scale.dtype() == DType::f32 && scale.shape() == want, "checkpoint ", path,
                 ": tensor '", scale_name, "' is ", dtype_name(scale.dtype()), " ",
                 shape_string(scale.shape()), "; it must be f32 ", shape_string(want),
                 " (one scale per ", br, "×", bc, " block of ", shape_string(piece.shape), ")");
  const e4m3* q = src.data_as<e4m3>();
  const float* s = scale.data_as<float>();
  float* d = dst.data_as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      d[i * k + j] = e4m3_to_float(q[i * k + j]) * s[(i / br) * want[1] + j / bc];
  return scale_name;
}

// The checkpoint's tensors of rows [first_row, first_row + n) of `blocks`, the weight of a piece
// [n, k]: its E4M3 values without lockstep's column padding, and the scales of its 128×128 blocks
// without the scale table's padding. first_row is a multiple of 128.
std::pair<Tensor, Tensor> hf_fp8_tensors(const Fp8Blocks& blocks, int64_t first_row, int64_t n,
                                         int64_t k) {
  Tensor data = Tensor::empty({n, k}, DType::e4m3);
  const int64_t stored = blocks.data.dim(1);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(blocks.data.data_as<e4m3>() + (first_row + i) * stored, k,
                data.data_as<e4m3>() + i * k);
  const int64_t rows = ceil_div(n, kQuantGroup), cols = ceil_div(k, kQuantGroup);
  const int64_t table_cols = blocks.scales.dim(1), first_block = first_row / kQuantGroup;
  Tensor scales = Tensor::empty({rows, cols}, DType::f32);
  for (int64_t i = 0; i < rows; ++i)
    std::copy_n(blocks.scales.data_as<float>() + (first_block + i) * table_cols, cols,
                scales.data_as<float>() + i * cols);
  return {std::move(data), std::move(scales)};
}

void check_files_to_copy(const std::vector<std::string>& files) {
  for (const std::string& file : files)
    LOCKSTEP_CHECK(fs::is_regular_file(file), "no file '", file, "' to copy into the checkpoint");
}

ModelParameters host_copy(const ModelParameters& params) {
  ModelParameters cpu = params;  // shares the tensors; CUDA ones are replaced by host copies
  cpu.for_each([](const std::string&, Tensor& t) {
    if (t.is_cuda()) t = t.to(Device::cpu);
  });
  return cpu;
}

// Runs `fill` on a temporary folder beside `folder`, then puts it in place (replace_folder: an
// existing folder of that name is exchanged atomically), so a reader never sees a half-written
// checkpoint, even after a crash.
void write_folder_atomically(const std::string& folder, const char* what,
                             const std::function<void(const fs::path&)>& fill) {
  const fs::path target = fs::absolute(fs::path(folder).lexically_normal());
  LOCKSTEP_CHECK(target.has_filename() && target.filename() != "..", what, ": '", folder,
                 "' is not a usable folder name");
  const fs::path temp = target.string() + ".tmp." + std::to_string(getpid());
  try {
    fs::remove_all(temp);
    fs::create_directories(temp);
    fill(temp);
    replace_folder(temp.string(), target.string());
  } catch (const fs::filesystem_error& e) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    fail(std::string(what) + ": cannot write '" + folder + "': " + e.what());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    throw;
  }
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
    Tensor dst = slice_of(piece);
    if (src.dtype() == DType::e4m3) {
      expected.insert(load_fp8_piece(dst, src, checkpoint, piece, config));
      continue;
    }
    LOCKSTEP_CHECK(src.dtype() == DType::bf16 || src.dtype() == DType::f16 ||
                       src.dtype() == DType::f32,
                   "checkpoint ", path, ": tensor '", piece.name, "' is ", dtype_name(src.dtype()),
                   "; model weights must be bf16, f16 or f32 (or block-FP8 e4m3)");
    if (src.dtype() == DType::f16) {  // convert() handles f32/bf16 only
      const f16* s = src.data_as<f16>();
      float* d = dst.data_as<float>();
      for (int64_t i = 0; i < src.numel(); ++i) d[i] = f16_to_float(s[i]);
    } else {
      convert(dst, src);
    }
  }
  if (config.tie_word_embeddings && checkpoint.contains("lm_head.weight")) {
    // Tied, as transformers ties a stored head equal to the embeddings; one that differs is untied
    // by load_model_config (as transformers does), so a tied config here that differs was made by hand.
    const Tensor head = checkpoint.tensor("lm_head.weight");
    bool equal = head.shape() == params.embed.shape() &&
                 (head.dtype() == DType::bf16 || head.dtype() == DType::f16 || head.dtype() == DType::f32);
    if (equal) {
      Tensor wide = Tensor::empty(head.shape(), DType::f32);
      if (head.dtype() == DType::f16) {  // convert() handles f32/bf16 only
        for (int64_t i = 0; i < head.numel(); ++i)
          wide.data_as<float>()[i] = f16_to_float(head.data_as<f16>()[i]);
      } else {
        convert(wide, head);
      }
      const float* w = wide.data_as<float>();
      equal = std::equal(w, w + wide.numel(), params.embed.data_as<float>());
    }
    LOCKSTEP_CHECK(equal, "checkpoint ", path, ": the config ties the embeddings, but lm_head.weight ",
                   "differs from model.embed_tokens.weight; transformers would not tie them and would ",
                   "use the stored head, as load_model_config(<folder>) does (set tie_word_embeddings ",
                   "to false)");
  }
  for (const std::string& name : checkpoint.names())
    LOCKSTEP_CHECK(expected.count(name) || ignorable(name, config), "checkpoint ", path,
                   ": unexpected tensor '", name, "' (not part of a ",
                   architecture_name(config.family), " with this config)");
  return params;
}

void save_hf_checkpoint(const std::string& folder, const ModelConfig& config,
                        const ModelParameters& params, DType dtype,
                        const std::vector<std::string>& copy_files) {
  LOCKSTEP_CHECK(dtype == DType::bf16 || dtype == DType::f32, "save_hf_checkpoint: dtype must be ",
                 "bf16 or f32, got ", dtype_name(dtype));
  check_files_to_copy(copy_files);
  ModelParameters cpu = host_copy(params);
  NamedTensors tensors;
  for (const Piece& piece : hf_pieces(config, cpu)) {
    Tensor out = Tensor::empty(piece.shape, dtype);
    convert(out, slice_of(piece));
    tensors.emplace_back(piece.name, std::move(out));
  }
  ModelConfig saved = config;
  saved.torch_dtype = dtype == DType::bf16 ? "bfloat16" : "float32";
  saved.fp8_quantization.reset();
  write_folder_atomically(folder, "save_hf_checkpoint", [&](const fs::path& temp) {
    write_safetensors_checkpoint(temp.string(), tensors, kDefaultMaxShardBytes, {{"format", "pt"}});
    save_model_config(saved, (temp / "config.json").string());
    for (const std::string& file : copy_files) fs::copy_file(file, temp / fs::path(file).filename());
  });
}

Fp8Export save_fp8_hf_checkpoint(const std::string& folder, const ModelConfig& config,
                                 const ModelParameters& params,
                                 const std::vector<std::string>& copy_files) {
  check_files_to_copy(copy_files);
  ModelParameters cpu = host_copy(params);
  Fp8Export report;
  NamedTensors tensors;
  // The fp8 recipe quantizes each fused master (qkv, gate_up) as one weight: its pieces follow each
  // other in hf_pieces, so one quantized master is kept at a time.
  const Tensor* quantized_master = nullptr;
  Fp8Weight quantized;
  for (const Piece& piece : hf_pieces(config, cpu)) {
    if (!is_projection(piece)) {
      Tensor out = Tensor::empty(piece.shape, DType::bf16);
      convert(out, slice_of(piece));
      tensors.emplace_back(piece.name, std::move(out));
      continue;
    }
    const int64_t n = piece.shape[0], k = piece.shape[1];
    LOCKSTEP_CHECK(n % kFp8ColsMultiple == 0 && k % kFp8ColsMultiple == 0, "save_fp8_hf_checkpoint: '",
                   piece.name, "' is ", shape_string(piece.shape), "; block-FP8 export needs ",
                   "dimensions that are multiples of ", kFp8ColsMultiple, " (as the fp8 recipe)");
    std::pair<Tensor, Tensor> out;
    if (piece.row_begin % kQuantGroup == 0) {
      if (quantized_master != piece.target) {
        const Tensor& m = *piece.target;
        quantized = Fp8Weight::empty(m.dim(0), m.dim(1), Device::cpu);
        quantize_weight(quantized, m);
        quantized_master = piece.target;
      }
      out = hf_fp8_tensors(quantized.w, piece.row_begin, n, k);
      report.exact.push_back(piece.name);
    } else {
      Fp8Weight own = Fp8Weight::empty(n, k, Device::cpu);
      quantize_weight(own, slice_of(piece));
      out = hf_fp8_tensors(own.w, 0, n, k);
      report.requantized.push_back(piece.name);
    }
    tensors.emplace_back(piece.name, std::move(out.first));
    tensors.emplace_back(piece.name + "_scale_inv", std::move(out.second));
  }
  ModelConfig saved = config;
  saved.torch_dtype = "bfloat16";
  // transformers would otherwise make the (tied or untied) LM head an FP8 linear layer, with no
  // scales in the file for it.
  saved.fp8_quantization = Fp8Quantization{.modules_to_not_convert = {"lm_head"}};
  // The routers stay bf16 (as Qwen3-30B-A3B-FP8 keeps them): named one by one, since transformers
  // matches these names as substrings and "mlp.gate" would also catch dense layers' gate_proj.
  for (int64_t i = 0; i < config.num_hidden_layers; ++i)
    if (config.is_moe_layer(i))
      saved.fp8_quantization->modules_to_not_convert.push_back("model.layers." + std::to_string(i) +
                                                               ".mlp.gate");
  write_folder_atomically(folder, "save_fp8_hf_checkpoint", [&](const fs::path& temp) {
    write_safetensors_checkpoint(temp.string(), tensors, kDefaultMaxShardBytes, {{"format", "pt"}});
    save_model_config(saved, (temp / "config.json").string());
    for (const std::string& file : copy_files)
      fs::copy_file(file, temp / fs::path(file).filename());
  });
  return report;
}

}  // namespace lockstep
