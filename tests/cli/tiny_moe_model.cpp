// tests/cli/tiny_moe_model.cpp — tiny_moe_model BASE_DIR OUT_DIR: writes OUT_DIR, a Qwen3-MoE
// checkpoint of BASE_DIR's widths (BASE_DIR: a dense Qwen3 checkpoint folder, e.g. a builtin run's
// checkpoint/model) with its tokenizer files: 8 experts of hidden_size, top-2, normalized weights,
// the last layer dense (mlp_only_layers), the load-balancing loss on (output_router_logits,
// coefficient 0.01), Hugging Face's random initialization (seed 7). For the command's MoE tests.
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "io/config.h"
#include "model/hf_checkpoint.h"
#include "model/parameters.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using namespace lockstep;
  if (argc != 3) {
    std::cerr << "usage: tiny_moe_model BASE_DIR OUT_DIR\n";
    return 2;
  }
  try {
    ModelConfig c = load_model_config(argv[1]);
    LOCKSTEP_CHECK(c.family == ModelFamily::qwen3, argv[1], ": expected a Qwen3 checkpoint");
    c.family = ModelFamily::qwen3_moe;
    c.moe.emplace();
    c.moe->num_experts = 8;
    c.moe->num_experts_per_tok = 2;
    c.moe->moe_intermediate_size = c.hidden_size;
    c.moe->mlp_only_layers = {c.num_hidden_layers - 1};
    c.moe->norm_topk_prob = true;
    c.moe->router_aux_loss_coef = 0.01;
    c.moe->output_router_logits = true;
    std::vector<std::string> files;
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
      if (fs::exists(fs::path(argv[1]) / name)) files.push_back((fs::path(argv[1]) / name).string());
    save_hf_checkpoint(argv[2], c, ModelParameters::initialized(c, 7), DType::bf16, files);
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
