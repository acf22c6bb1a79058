// bench/model_cpu — training throughput of a small model on the CPU reference backend: one step
// = forward + backward + AdamW over every parameter (+ refreshing the recipe's weight copies), on
// packed sequences, per recipe. The built-in default job trains a model of this size.
// Usage: bench_model_cpu [--json out.json] [--steps N] [--tokens T] [--seq-len L] [--layers N]
//                        [--hidden H] [--vocab V]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "ops/adamw.h"

using namespace lockstep;

namespace {

struct Options {
  int steps = 3;
  int64_t tokens = 4096, seq_len = 128, layers = 2, hidden = 256, vocab = 512;
  std::string json;
};

ModelConfig bench_config(const Options& o) {
  ModelConfig c;
  c.family = ModelFamily::qwen3;
  c.hidden_size = o.hidden;
  c.intermediate_size = 3 * o.hidden;
  c.num_hidden_layers = o.layers;
  c.num_attention_heads = o.hidden / 64;
  c.num_key_value_heads = std::max<int64_t>(1, o.hidden / 128);
  c.head_dim = 64;
  c.vocab_size = o.vocab;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  return c;
}

TrainBatch random_batch(const Options& o, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, int32_t(o.vocab - 1));
  Tensor tokens = Tensor::empty({o.tokens}, DType::i32), targets = Tensor::empty({o.tokens}, DType::i32);
  const int64_t seqs = (o.tokens + o.seq_len - 1) / o.seq_len;
  Tensor cu = Tensor::empty({seqs + 1}, DType::i32);
  for (int64_t t = 0; t < o.tokens; ++t) {
    tokens.data_as<int32_t>()[t] = token(rng);
    targets.data_as<int32_t>()[t] = token(rng);
  }
  for (int64_t s = 0; s <= seqs; ++s) cu.data_as<int32_t>()[s] = int32_t(std::min(s * o.seq_len, o.tokens));
  return {tokens, targets, cu};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", arg.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (arg == "--json") o.json = next();
    else if (arg == "--steps") o.steps = std::atoi(next());
    else if (arg == "--tokens") o.tokens = std::atoll(next());
    else if (arg == "--seq-len") o.seq_len = std::atoll(next());
    else if (arg == "--layers") o.layers = std::atoll(next());
    else if (arg == "--hidden") o.hidden = std::atoll(next());
    else if (arg == "--vocab") o.vocab = std::atoll(next());
    else { std::fprintf(stderr, "unknown option %s\n", arg.c_str()); return 2; }
  }
  const ModelConfig config = bench_config(o);
  const TrainBatch batch = random_batch(o, 1);
  std::printf("model: hidden %lld, %lld layers, vocab %lld, %lld parameters; %lld tokens per step "
              "in sequences of %lld; %d threads\n",
              (long long)o.hidden, (long long)o.layers, (long long)o.vocab,
              (long long)parameter_count(config), (long long)o.tokens, (long long)o.seq_len,
              omp_get_max_threads());
  std::printf("%-6s %10s %10s %10s %10s %12s\n", "recipe", "fwd ms", "bwd ms", "adamw ms",
              "step ms", "tokens/s");
  std::string json = "{\n  \"parameters\": " + std::to_string(parameter_count(config)) +
                     ",\n  \"tokens_per_step\": " + std::to_string(o.tokens) +
                     ",\n  \"threads\": " + std::to_string(omp_get_max_threads()) + ",\n  \"recipes\": [";
  for (Recipe recipe : {Recipe::fp32, Recipe::bf16, Recipe::fp8}) {
    Transformer model(config, ModelParameters::initialized(config, 7), recipe);
    ModelParameters m = ModelParameters::zeros(config), v = ModelParameters::zeros(config);
    std::vector<Tensor*> params, grads, ms, vs;
    model.params().for_each([&](const std::string&, Tensor& t) { params.push_back(&t); });
    model.grads().for_each([&](const std::string&, Tensor& t) { grads.push_back(&t); });
    m.for_each([&](const std::string&, Tensor& t) { ms.push_back(&t); });
    v.for_each([&](const std::string&, Tensor& t) { vs.push_back(&t); });
    Tensor dlogprob = Tensor::empty({o.tokens}, DType::f32);
    for (int64_t t = 0; t < o.tokens; ++t) dlogprob.data_as<float>()[t] = -1.0f / float(o.tokens);

    double fwd = 0, bwd = 0, opt = 0;
    for (int step = 0; step <= o.steps; ++step) {  // step 0 warms up
      model.grads().zero();
      auto t0 = std::chrono::steady_clock::now();
      TrainForward f = model.forward(batch);
      const double f_s = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      model.backward(f, dlogprob, Tensor());
      const double b_s = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < params.size(); ++i)
        adamw_step(*params[i], *ms[i], *vs[i], *grads[i], AdamWHyper{}, step + 1, 1.0f);
      model.refresh_weights();
      const double o_s = seconds_since(t0);
      if (step > 0) { fwd += f_s; bwd += b_s; opt += o_s; }
    }
    fwd /= o.steps; bwd /= o.steps; opt /= o.steps;
    const double total = fwd + bwd + opt, tps = double(o.tokens) / total;
    std::printf("%-6s %10.1f %10.1f %10.1f %10.1f %12.0f\n", std::string(recipe_name(recipe)).c_str(),
                fwd * 1e3, bwd * 1e3, opt * 1e3, total * 1e3, tps);
    char row[256];
    std::snprintf(row, sizeof row,
                  "%s\n    {\"recipe\": \"%s\", \"forward_ms\": %.2f, \"backward_ms\": %.2f, "
                  "\"optimizer_ms\": %.2f, \"tokens_per_s\": %.1f}",
                  recipe == Recipe::fp32 ? "" : ",", std::string(recipe_name(recipe)).c_str(),
                  fwd * 1e3, bwd * 1e3, opt * 1e3, tps);
    json += row;
  }
  json += "\n  ]\n}\n";
  if (!o.json.empty()) std::ofstream(o.json) << json;
  return 0;
}
