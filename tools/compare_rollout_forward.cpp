// tools/compare_rollout_forward.cpp — lockstep_compare_rollout_forward: where, op by op, the
// rollout's forward and the training forward part (rollout/forward_comparison.h says what is
// compared and how).
//
//   lockstep_compare_rollout_forward [--model qwen3-1.7b|qwen3-8b | --model-path DIR] [--layers N]
//       [--device cpu|cuda] [--precision fp32|bf16|fp8] [--kv-cache bf16|fp8] [--batch B]
//       [--prompt-tokens P] [--prefill-chunk N] [--new-tokens N] [--temperature T] [--seed S]
//       [--tapped-sequences M] [--train-tokens N] [--cuda-graphs on|off] [--exact on|off]
//
// --model: a random model (ModelParameters::initialized, seed 7) of that Qwen3 shape; --model-path:
// a Hugging Face checkpoint folder. --layers keeps the first N layers. The prompts are B random
// token ids sequences of P tokens (from --seed). The engine generates --new-tokens tokens for all B
// at once (greedy, or sampled at --temperature) with --prefill-chunk as its step token budget
// (max_step_tokens: prompt chunks, and the B rows of a decode step, so at least B); its decode steps
// are tapped without CUDA graphs; --cuda-graphs on (the default on cuda) also generates with graphs
// and compares those logprobs. The training forward runs in micro-batches of --train-tokens tokens.
// --exact on: both sides run the exact forward kernels (ops/forward_kernels.h, rollout.exact);
// default off, the fast ones.
//
// Output: one line per layer, op and phase (prompt rows: the chunked prefill; gen rows: the decode
// steps), for the rows of the first M sequences: rows compared, the fraction bit-identical, the
// largest |Δ| of an element, and for fp8 GEMM inputs the fraction of E4M3 codes that differ; then the
// first op whose rows differ, and the logprob mismatch of every generated token (mean and max
// |Δlogp|, tokens not bit-equal). On the CPU every fraction is 1 and every Δ 0.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/device.h"
#include "core/error.h"
#include "io/config.h"
#include "model/hf_checkpoint.h"
#include "model/recipe.h"
#include "model/transformer.h"
#include "ops/forward_kernels.h"
#include "rollout/forward_comparison.h"

using namespace lockstep;

namespace {

struct Options {
  std::string model = "qwen3-1.7b", model_path;
  int64_t layers = -1;
  Device device = Device::cpu;
  Recipe recipe = Recipe::bf16;
  bool fp8_kv_cache = false;
  int64_t batch = 1, prompt_tokens = 64;
  std::optional<bool> cuda_graphs;
  ForwardComparisonOptions compare;
};

void print_logprobs(const char* what, const LogprobComparison& c) {
  std::printf("%s: %lld tokens, %lld not bit-equal (%.4f), mean |dlogp| %.6g, max %.6g\n", what,
              (long long)c.tokens, (long long)c.not_equal,
              c.tokens ? double(c.not_equal) / double(c.tokens) : 0.0, c.mean_abs_diff,
              c.max_abs_diff);
}

int run(const Options& o) {
  ModelConfig c = o.model_path.empty() ? bench::model_config(o.model) : load_model_config(o.model_path);
  if (o.layers >= 0) {
    LOCKSTEP_CHECK(o.layers >= 1 && o.layers <= c.num_hidden_layers, "--layers: expected 1 to ",
                   c.num_hidden_layers, ", got ", o.layers);
    c.num_hidden_layers = o.layers;
  }
  // load_hf_parameters reads the layers the config names: the first N with --layers.
  ModelParameters params = o.model_path.empty() ? ModelParameters::initialized(c, 7)
                                                : load_hf_parameters(c, o.model_path);
  Transformer model(c, o.device == Device::cpu ? std::move(params) : params.copy_to(o.device), o.recipe,
                    {.trainable = false, .fp8_kv_cache = o.fp8_kv_cache});
  params = ModelParameters();

  std::mt19937_64 rng(o.compare.seed);
  std::uniform_int_distribution<int32_t> id(0, int32_t(c.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts(size_t(o.batch));
  for (auto& p : prompts)
    for (int64_t i = 0; i < o.prompt_tokens; ++i) p.push_back(id(rng));

  ForwardComparisonOptions compare = o.compare;
  compare.cuda_graphs = o.cuda_graphs.value_or(o.device == Device::cuda);
  std::printf("%s, %lld layers, %s on %s, KV cache %s; batch %lld, prompts of %lld tokens, step "
              "budget %lld, %lld new tokens, temperature %g; per-op rows of %lld sequences\n",
              o.model_path.empty() ? o.model.c_str() : o.model_path.c_str(),
              (long long)c.num_hidden_layers, recipe_name(o.recipe).data(),
              o.device == Device::cpu ? "cpu" : "cuda", o.fp8_kv_cache ? "fp8" : "bf16",
              (long long)o.batch, (long long)o.prompt_tokens, (long long)compare.step_tokens,
              (long long)compare.new_tokens, compare.temperature,
              (long long)std::min(compare.tapped_sequences, o.batch));
  const ForwardComparison r = compare_rollout_forward(model, model, prompts, compare);

  std::printf("%-6s %-13s %-6s %8s %9s %12s %12s\n", "layer", "op", "phase", "rows", "equal",
              "max |d|", "codes diff");
  auto layer_name = [&](const OpComparison& op) {
    return op.layer == c.num_hidden_layers ? std::string("final") : std::to_string(op.layer);
  };
  const OpComparison* first = nullptr;
  for (const OpComparison& op : r.ops) {
    const std::string layer = layer_name(op);
    char codes[32] = "-";
    if (op.codes > 0) std::snprintf(codes, sizeof codes, "%.6f", double(op.codes_differ) / double(op.codes));
    std::printf("%-6s %-13s %-6s %8lld %9.4f %12.6g %12s%s\n", layer.c_str(), op.op.c_str(),
                op.decode ? "gen" : "prompt", (long long)op.rows,
                op.rows ? double(op.rows_equal) / double(op.rows) : 1.0, op.max_abs_diff, codes,
                op.forms_differ ? "  (different forms: fp8 codes on one side only)" : "");
    if (!first && op.rows_equal != op.rows) first = &op;
  }
  if (first)
    std::printf("first op whose rows differ: layer %s %s (%s rows)\n", layer_name(*first).c_str(),
                first->op.c_str(), first->decode ? "generated" : "prompt");
  else
    std::printf("every compared row is bit-identical\n");
  print_logprobs("logprobs, rollout (no graphs) vs training", r.logprobs);
  print_logprobs("  of which tapped tokens whose final_norm rows are equal (the LM head's share)",
                 r.head_logprobs);
  if (r.graphs_run) {
    print_logprobs("logprobs, rollout with CUDA graphs vs training", r.graph_logprobs);
    std::printf("graphs vs no graphs: %lld sequences with a different token, %lld logprobs not "
                "bit-equal before it\n",
                (long long)r.graph_tokens_differ, (long long)r.graph_logprobs_not_equal_to_eager);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    LOCKSTEP_CHECK(arg.starts_with("--") && i + 1 < argc, "unknown option or missing value: ", arg);
    const std::string v = argv[++i];
    auto count = [&] { return bench::parse_int(arg, v); };
    auto one_of = [&](std::initializer_list<const char*> allowed) {
      for (const char* a : allowed)
        if (v == a) return;
      fail(arg + ": unexpected value '" + v + "'");
    };
    if (arg == "--model") {
      o.model = v;
    } else if (arg == "--model-path") {
      o.model_path = v;
    } else if (arg == "--layers") {
      o.layers = count();
    } else if (arg == "--device") {
      o.device = parse_device(v, arg);
    } else if (arg == "--precision") {
      o.recipe = parse_recipe(v);
    } else if (arg == "--kv-cache") {
      one_of({"bf16", "fp8"});
      o.fp8_kv_cache = v == "fp8";
    } else if (arg == "--batch") {
      o.batch = count();
    } else if (arg == "--prompt-tokens") {
      o.prompt_tokens = count();
    } else if (arg == "--prefill-chunk") {
      o.compare.step_tokens = count();
    } else if (arg == "--new-tokens") {
      o.compare.new_tokens = count();
    } else if (arg == "--temperature") {
      o.compare.temperature = std::stof(v);
      LOCKSTEP_CHECK(o.compare.temperature >= 0, "--temperature must be >= 0, got ", v);
    } else if (arg == "--seed") {
      o.compare.seed = uint64_t(count());
    } else if (arg == "--tapped-sequences") {
      o.compare.tapped_sequences = count();
    } else if (arg == "--train-tokens") {
      o.compare.train_tokens = count();
    } else if (arg == "--cuda-graphs") {
      one_of({"on", "off"});
      o.cuda_graphs = v == "on";
    } else if (arg == "--exact") {
      one_of({"on", "off"});
      set_exact_forward(v == "on");
    } else {
      fail("unknown option: " + arg);
    }
  }
  LOCKSTEP_CHECK(o.batch >= 1 && o.prompt_tokens >= 1, "--batch and --prompt-tokens must be >= 1");
  LOCKSTEP_CHECK(o.device == Device::cpu || cuda_device_available(), "--device cuda: no GPU found");
  return run(o);
} catch (const std::exception& e) {
  std::cerr << "lockstep_compare_rollout_forward: " << e.what() << "\n";
  return 1;
}
