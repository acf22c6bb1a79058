// tools/generate_tokens.cpp — lockstep_generate_tokens: runs prompts given as token ids through the
// rollout engine on a checkpoint and writes the generated ids and their logprobs, so that scripts
// can compare lockstep's generation with another implementation's (scripts/dev/compare_greedy.py does
// it against transformers' greedy generate).
//
//   lockstep_generate_tokens MODEL_DIR PROMPTS_JSON OUT_JSON [--recipe fp32|bf16|fp8]
//                            [--device cpu|cuda] [--kv-cache bf16|fp8] [--max-new N]
//                            [--temperature T] [--seed S] [--stop ID,...]
//
// PROMPTS_JSON: {"prompts": [[id, ...], ...]}. OUT_JSON: {"tokens": [[id, ...], ...],
// "logprobs": [[lp, ...], ...], "finish": ["length" | "stop", ...]}, one entry per prompt.
// Temperature 0 (the default) is greedy decoding; without --stop only max-new ends a sequence.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/config.h"
#include "io/file_io.h"
#include "model/hf_checkpoint.h"
#include "model/recipe.h"
#include "model/transformer.h"
#include "rollout/engine.h"

using namespace lockstep;

namespace {

struct Options {
  Recipe recipe = Recipe::bf16;
  Device device = Device::cpu;
  bool fp8_kv_cache = false;
  int64_t max_new = 64;
  float temperature = 0;
  uint64_t seed = 0;
  std::vector<int32_t> stop;
};

std::vector<std::vector<int32_t>> read_prompts(const std::string& path) {
  const auto doc = nlohmann::json::parse(read_file(path, "prompts"), nullptr, false);
  LOCKSTEP_CHECK(doc.is_object() && doc.contains("prompts") && doc["prompts"].is_array(), path,
                 ": expected {\"prompts\": [[id, ...], ...]}");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : doc["prompts"]) {
    LOCKSTEP_CHECK(p.is_array() && !p.empty(), path, ": prompt ", prompts.size(),
                   " must be a non-empty array of token ids");
    std::vector<int32_t>& ids = prompts.emplace_back();
    for (const auto& id : p) {
      LOCKSTEP_CHECK(id.is_number_integer(), path, ": prompt ", prompts.size() - 1, " holds a non-integer");
      ids.push_back(id.get<int32_t>());
    }
  }
  return prompts;
}

int run(const std::string& model_dir, const std::string& prompts_path, const std::string& out_path,
        const Options& o) {
  const ModelConfig config = load_model_config(model_dir);
  Transformer model(config, load_hf_parameters(config, model_dir).copy_to(o.device), o.recipe,
                    {.trainable = false, .fp8_kv_cache = o.fp8_kv_cache});
  const std::vector<std::vector<int32_t>> prompts = read_prompts(prompts_path);
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
  const int64_t block_size = 16;
  // Room for every sequence at once: no preemption, whatever the device.
  const int64_t blocks = int64_t(prompts.size()) * ((longest + o.max_new + block_size - 1) / block_size);
  Engine engine(model, {.num_blocks = blocks, .block_size = block_size});
  std::vector<GenerationRequest> requests;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.sampling.temperature = o.temperature;
    r.sampling.max_new_tokens = o.max_new;
    r.sampling.stop_token_ids = o.stop;
    r.sampling.seed = o.seed;
    requests.push_back(std::move(r));
  }
  const auto samples = engine.generate(requests);
  nlohmann::json out = {{"tokens", nlohmann::json::array()},
                        {"logprobs", nlohmann::json::array()},
                        {"finish", nlohmann::json::array()}};
  for (const auto& per_request : samples) {
    const GeneratedSample& s = per_request[0];
    out["tokens"].push_back(s.tokens);
    out["logprobs"].push_back(s.logprobs);
    out["finish"].push_back(std::string(finish_reason_name(s.finish_reason)));
  }
  write_file_atomically(out_path, out.dump() + "\n");
  std::cout << prompts.size() << " prompts, " << o.max_new << " new tokens at most\n";
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
      } else if (arg == "--kv-cache" && has_value) {
        const std::string d = argv[++i];
        LOCKSTEP_CHECK(d == "bf16" || d == "fp8", "--kv-cache: expected bf16 or fp8, got '", d, "'");
        o.fp8_kv_cache = d == "fp8";
      } else if (arg == "--max-new" && has_value) {
        o.max_new = std::stoll(argv[++i]);
        LOCKSTEP_CHECK(o.max_new >= 1, "--max-new must be at least 1");
      } else if (arg == "--temperature" && has_value) {
        o.temperature = std::stof(argv[++i]);
        LOCKSTEP_CHECK(o.temperature >= 0, "--temperature must be at least 0");
      } else if (arg == "--seed" && has_value) {
        o.seed = std::stoull(argv[++i]);
      } else if (arg == "--stop" && has_value) {
        std::string list = argv[++i];
        for (size_t start = 0; start <= list.size();) {
          const size_t end = std::min(list.find(',', start), list.size());
          o.stop.push_back(std::stoi(list.substr(start, end - start)));
          start = end + 1;
        }
      } else if (arg.starts_with("--")) {
        fail("unknown option or missing value: " + arg);
      } else {
        positional.push_back(arg);
      }
    }
    if (positional.size() != 3) {
      std::cerr << "usage: lockstep_generate_tokens MODEL_DIR PROMPTS_JSON OUT_JSON [--recipe fp32|bf16|fp8] "
                   "[--device cpu|cuda] [--kv-cache bf16|fp8] [--max-new N] [--temperature T] [--seed S] "
                   "[--stop ID,...]\n";
      return 2;
    }
    return run(positional[0], positional[1], positional[2], o);
  } catch (const std::exception& e) {  // lockstep::Error, and std::stoll's invalid_argument
    std::cerr << "lockstep_generate_tokens: " << e.what() << "\n";
    return 1;
  }
}
