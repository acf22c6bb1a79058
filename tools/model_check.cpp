// tools/model_check.cpp — lockstep_model_check: runs a Hugging Face checkpoint through lockstep's
// model (on the CPU, or on the GPU with --device cuda) and writes what another implementation can be compared with
// (scripts/dev/compare_hf.py does it against transformers).
//
//   lockstep_model_check MODEL_DIR TOKENS_JSON OUT_DIR [--recipe fp32|bf16|fp8] [--device cpu|cuda]
//                        [--grads-dtype f32|bf16]
//
// TOKENS_JSON: {"sequences": [[id, ...], ...]}, packed into one batch (each row's target is the next
// token; a sequence's last row targets token 0). Writes
//   OUT_DIR/outputs.safetensors  logits f32 [T, V], logprob f32 [T], entropy f32 [T], loss f32 [1],
//                                and for a mixture-of-experts model expert_ids.<layer> i32 [T, k]
//                                per sparse layer (the router's choices, best first)
//   OUT_DIR/grads/               the gradient of the loss as a checkpoint (Hugging Face names, f32
//                                or bf16 for large models)
// where loss = mean of −logprob over every row but each sequence's last (the SFT loss).
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/file_io.h"
#include "io/safetensors.h"
#include "model/hf_checkpoint.h"
#include "model/sft_loss.h"
#include "model/transformer.h"

using namespace lockstep;

namespace {

Tensor i32_tensor(const std::vector<int32_t>& v, Device device) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t.to(device);
}

struct Options {
  Recipe recipe = Recipe::fp32;
  Device device = Device::cpu;
  DType grads_dtype = DType::f32;
};

int run(const std::string& model_dir, const std::string& tokens_path, const std::string& out_dir,
        const Options& o) {
  const ModelConfig config = load_model_config(model_dir);
  Transformer model(config, load_hf_parameters(config, model_dir).copy_to(o.device), o.recipe);

  const auto doc = nlohmann::json::parse(read_file(tokens_path, "tokens"), nullptr, false);
  LOCKSTEP_CHECK(doc.is_object() && doc.contains("sequences") && doc["sequences"].is_array(),
                 tokens_path, ": expected {\"sequences\": [[id, ...], ...]}");
  std::vector<int32_t> tokens, targets, cu{0};
  std::vector<float> mask;
  for (const auto& seq : doc["sequences"]) {
    LOCKSTEP_CHECK(seq.is_array() && !seq.empty(), tokens_path, ": every sequence must be a ",
                   "non-empty array of token ids");
    for (size_t i = 0; i < seq.size(); ++i) {
      LOCKSTEP_CHECK(seq[i].is_number_integer(), tokens_path, ": token ", i, " is not an integer");
      tokens.push_back(seq[i].get<int32_t>());
      targets.push_back(i + 1 < seq.size() ? seq[i + 1].get<int32_t>() : 0);
      mask.push_back(i + 1 < seq.size() ? 1.0f : 0.0f);
    }
    cu.push_back(int32_t(tokens.size()));
  }
  const TrainBatch batch{i32_tensor(tokens, o.device), i32_tensor(targets, o.device),
                         i32_tensor(cu, o.device)};

  const Tensor logits = model.logits(model.hidden_states(batch)).to(Device::cpu);
  TrainForward forward = model.forward(batch);
  const Tensor logprob = forward.logprob.to(Device::cpu), entropy = forward.entropy.to(Device::cpu);
  Tensor mask_tensor = Tensor::empty({int64_t(mask.size())}, DType::f32);
  std::copy(mask.begin(), mask.end(), mask_tensor.data_as<float>());
  const SftLoss loss = sft_loss(logprob, mask_tensor);
  model.backward(forward, loss.dlogprob.to(o.device), Tensor());

  Tensor loss_tensor = Tensor::empty({1}, DType::f32);
  loss_tensor.data_as<float>()[0] = float(loss.loss);
  std::filesystem::create_directories(out_dir);
  NamedTensors outputs = {{"logits", logits}, {"logprob", logprob}, {"entropy", entropy}, {"loss", loss_tensor}};
  // A sparse model's routing: each sparse layer's experts per row, best first (i32 [T, k]).
  for (size_t l = 0, i = 0; i < size_t(config.num_hidden_layers); ++i)
    if (config.is_moe_layer(int64_t(i))) outputs.emplace_back("expert_ids." + std::to_string(i), forward.routing[l++].expert_ids);
  write_safetensors(out_dir + "/outputs.safetensors", outputs);
  save_hf_checkpoint(out_dir + "/grads", config, model.grads(), o.grads_dtype);
  std::cout << "tokens " << tokens.size() << ", loss " << loss.loss << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const bool has_value = i + 1 < argc;
      if (arg == "--recipe" && has_value) {
        o.recipe = parse_recipe(argv[++i]);
      } else if (arg == "--device" && has_value) {
        o.device = parse_device(argv[++i], arg);
      } else if (arg == "--grads-dtype" && has_value) {
        const std::string d = argv[++i];
        LOCKSTEP_CHECK(d == "f32" || d == "bf16", "--grads-dtype: expected f32 or bf16, got '", d,
                       "'");
        o.grads_dtype = d == "f32" ? DType::f32 : DType::bf16;
      } else if (arg.starts_with("--")) {
        fail("unknown option " + arg);
      } else {
        positional.push_back(arg);
      }
    }
    if (positional.size() != 3) {
      std::cerr << "usage: lockstep_model_check MODEL_DIR TOKENS_JSON OUT_DIR [--recipe fp32|bf16|fp8] "
                   "[--device cpu|cuda] [--grads-dtype f32|bf16]\n";
      return 2;
    }
    return run(positional[0], positional[1], positional[2], o);
  } catch (const Error& e) {
    std::cerr << "lockstep_model_check: " << e.what() << "\n";
    return 1;
  }
}
