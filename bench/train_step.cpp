// bench/train_step — one optimizer step on the GPU: forward + backward over packed sequences (in
// micro-batches under a token budget, gradients accumulating) + AdamW over every fp32 master,
// writing the recipe's weight copies (bf16, or fp8 blocks and their transposes) in the same pass,
// for the bf16 and the unified fp8 recipe.
//
// Reports per recipe: step time, tokens/s, MFU (matrix FLOPs — linear layers, attention scores and
// values (causal half), LM head; forward ×3 for forward + backward — over the dense bf16 peak
// measured here with an 8192³ cuBLASLt GEMM), peak GPU memory during the step, and the memory the
// first micro-batch's forward keeps for its backward. "layers" is the same step minus the same
// step of a 0-layer model (embedding, final norm, LM head and their optimizer): the transformer
// layers alone.
//
// Usage: bench_train_step [--model qwen3-8b|qwen3-1.7b] [--layers N] [--seqs 4096,2048,1024,1024]
//                         [--micro-batch-tokens N] [--recipes bf16,fp8] [--recompute 0|1]
//                         [--steps N] [--json FILE]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/device.h"
#include "core/error.h"
#include "model/micro_batch.h"
#include "model/transformer.h"
#include "ops/adamw.h"
#include "ops/gemm.h"

using namespace lockstep;
using namespace lockstep::bench;

namespace {

struct Options {
  std::string model = "qwen3-8b";
  int64_t layers = -1;  // the model's own count
  std::vector<int64_t> seqs = {4096, 2048, 1024, 1024};
  int64_t micro_batch_tokens = 0;  // 0: the whole step in one
  std::vector<std::string> recipes = {"bf16", "fp8"};
  bool recompute = false;  // Transformer::set_recompute
  int steps = 3;
  std::string json;
};

// Matrix FLOPs of one training step (forward ×3).
struct Flops {
  double layers = 0, head = 0;
};

Flops step_flops(const ModelConfig& c, const std::vector<int64_t>& seqs) {
  const double h = double(c.hidden_size), i = double(c.intermediate_size);
  const double qw = double(c.num_attention_heads * c.head_dim);
  const double qkvw = qw + 2.0 * double(c.num_key_value_heads * c.head_dim);
  double tokens = 0, attention = 0;
  for (int64_t l : seqs) {
    tokens += double(l);
    attention += 2.0 * double(l) * double(l) * qw;  // QKᵀ and PV over the causal half
  }
  const double linear = tokens * 2.0 * (h * qkvw + qw * h + h * 2.0 * i + i * h);
  return {3.0 * double(c.num_hidden_layers) * (linear + attention),
          3.0 * tokens * 2.0 * h * double(c.vocab_size)};
}

// Dense bf16 TFLOP/s of this GPU: an 8192³ GEMM through the same cuBLASLt path as the model.
double measure_bf16_peak() {
  const int64_t n = 8192;
  // Random-looking operands: tensor cores draw less power (and may clock higher) on zeros.
  Tensor host = Tensor::empty({n, n}, DType::bf16);
  uint32_t state = 1;
  for (int64_t i = 0; i < host.numel(); ++i) {
    state = state * 1664525u + 1013904223u;
    host.data_as<bf16>()[i] = float_to_bf16(float(int32_t(state >> 8) - (1 << 23)) / float(1 << 23));
  }
  const Tensor x = host.to(Device::cuda), w = host.to(Device::cuda);
  Tensor y = Tensor::empty({n, n}, DType::bf16, Device::cuda);
  for (int i = 0; i < 3; ++i) gemm_fprop(y, x, w);
  device_synchronize();
  const int reps = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) gemm_fprop(y, x, w);
  device_synchronize();
  return 2.0 * double(n) * double(n) * double(n) * reps / seconds_since(t0) / 1e12;
}

struct Step {
  std::vector<TrainBatch> batches;
  std::vector<Tensor> dlogprob;  // per micro-batch, f32 on the GPU
};

// Random tokens in sequences of the given lengths, split into micro-batches; the loss is the
// mean −logprob over every row.
Step make_step(const Options& o, const ModelConfig& c) {
  int64_t total = 0;
  for (int64_t l : o.seqs) total += l;
  const int64_t budget = o.micro_batch_tokens > 0 ? o.micro_batch_tokens : total;
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int32_t> token(0, int32_t(c.vocab_size - 1));
  Step step;
  for (const SequenceRange& r : plan_micro_batches(o.seqs, budget)) {
    std::vector<int32_t> tokens, targets, cu{0};
    for (size_t s = r.first; s < r.last; ++s) {
      for (int64_t t = 0; t < o.seqs[s]; ++t) tokens.push_back(token(rng));
      cu.push_back(int32_t(tokens.size()));
    }
    for (size_t t = 0; t < tokens.size(); ++t) targets.push_back(token(rng));
    step.batches.push_back(make_train_batch(tokens, targets, cu, c.vocab_size, Device::cuda));
    Tensor d = Tensor::empty({int64_t(tokens.size())}, DType::f32);
    for (int64_t t = 0; t < d.numel(); ++t) d.data_as<float>()[t] = -1.0f / float(total);
    step.dlogprob.push_back(d.to(Device::cuda));
  }
  return step;
}

struct Result {
  double step_s = 0;
  size_t peak_bytes = 0, saved_bytes = 0;
};

// Builds the model on the GPU and times `steps` steps after one warm-up step.
Result run_steps(const ModelConfig& c, Recipe recipe, bool recompute, const Step& step, int steps) {
  Transformer model(c, ModelParameters::initialized(c, 7, Device::cuda), recipe);
  model.set_recompute(recompute);
  ModelParameters m = ModelParameters::zeros(c, Device::cuda);
  ModelParameters v = ModelParameters::zeros(c, Device::cuda);
  std::vector<Tensor*> params, grads, ms, vs;
  std::vector<WeightCopies> copies;  // what the update pass writes besides the master
  model.params().for_each([&](const std::string& name, Tensor& t) {
    params.push_back(&t);
    copies.push_back(model.weight_copies(name));
  });
  model.grads().for_each([&](const std::string&, Tensor& t) { grads.push_back(&t); });
  m.for_each([&](const std::string&, Tensor& t) { ms.push_back(&t); });
  v.for_each([&](const std::string&, Tensor& t) { vs.push_back(&t); });

  Result r;
  for (int s = 0; s <= steps; ++s) {  // step 0 warms up (GEMM autotuning, pool growth)
    device_synchronize();
    reset_peak_device_memory();
    const auto t0 = std::chrono::steady_clock::now();
    model.grads().zero();
    for (size_t b = 0; b < step.batches.size(); ++b) {
      const size_t before = device_memory_stats().in_use;
      TrainForward f = model.forward(step.batches[b]);
      if (b == 0 && s == steps) {
        device_synchronize();
        r.saved_bytes = device_memory_stats().in_use - before;
      }
      model.backward(f, step.dlogprob[b], Tensor());
    }
    for (size_t i = 0; i < params.size(); ++i)
      adamw_step(*params[i], *ms[i], *vs[i], *grads[i], AdamWHyper{}, s + 1, 1.0f, copies[i]);
    device_synchronize();
    if (s > 0) r.step_s += seconds_since(t0) / steps;
    r.peak_bytes = std::max(r.peak_bytes, device_memory_stats().peak);
  }
  return r;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    LOCKSTEP_CHECK(i + 1 < argc, arg, " needs a value");
    const std::string value = argv[++i];
    if (arg == "--model") o.model = value;
    else if (arg == "--layers") o.layers = parse_int(arg, value);
    else if (arg == "--micro-batch-tokens") o.micro_batch_tokens = parse_int(arg, value);
    else if (arg == "--steps") o.steps = int(parse_int(arg, value));
    else if (arg == "--json") o.json = value;
    else if (arg == "--recipes") o.recipes = split(value);
    else if (arg == "--recompute") o.recompute = parse_int(arg, value) != 0;
    else if (arg == "--seqs") {
      o.seqs.clear();
      for (const std::string& s : split(value)) o.seqs.push_back(parse_int(arg, s));
    } else fail("unknown option " + arg);
  }
  LOCKSTEP_CHECK(o.steps > 0, "--steps must be positive");
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  LOCKSTEP_CHECK(cuda_device_available(), "bench_train_step needs a GPU");
  ModelConfig c = model_config(o.model);
  if (o.layers >= 0) c.num_hidden_layers = o.layers;
  ModelConfig head_only = c;
  head_only.num_hidden_layers = 0;
  const Step step = make_step(o, c);
  int64_t tokens = 0;
  for (int64_t l : o.seqs) tokens += l;
  const Flops flops = step_flops(c, o.seqs);
  const double peak = measure_bf16_peak();
  std::printf("%s, %lld layers, %lld parameters; %lld tokens in %zu sequences, %zu micro-batch(es)%s; "
              "dense bf16 peak %.0f TFLOP/s\n",
              o.model.c_str(), (long long)c.num_hidden_layers, (long long)parameter_count(c),
              (long long)tokens, o.seqs.size(), step.batches.size(),
              o.recompute ? ", recompute" : "", peak);
  std::printf("%-6s %9s %10s %7s %9s %10s %7s %9s %10s\n", "recipe", "step ms", "tokens/s", "MFU",
              "layers ms", "layers t/s", "MFU", "peak GiB", "saved GiB");
  std::string rows;
  for (const std::string& name : o.recipes) {
    const Recipe recipe = parse_recipe(name);
    const Result full = run_steps(c, recipe, o.recompute, step, o.steps);
    const Result head = run_steps(head_only, recipe, o.recompute, step, o.steps);
    const double layers_s = full.step_s - head.step_s;
    const double mfu = (flops.layers + flops.head) / full.step_s / (peak * 1e12);
    const double layers_mfu = flops.layers / layers_s / (peak * 1e12);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    std::printf("%-6s %9.1f %10.0f %6.1f%% %9.1f %10.0f %6.1f%% %9.2f %10.2f\n", name.c_str(),
                full.step_s * 1e3, double(tokens) / full.step_s, 100 * mfu, layers_s * 1e3,
                double(tokens) / layers_s, 100 * layers_mfu, double(full.peak_bytes) / gib,
                double(full.saved_bytes) / gib);
    char row[512];
    std::snprintf(row, sizeof row,
                  "%s\n    {\"recipe\": \"%s\", \"step_ms\": %.2f, \"tokens_per_s\": %.0f, "
                  "\"mfu\": %.4f, \"layers_ms\": %.2f, \"layers_tokens_per_s\": %.0f, "
                  "\"layers_mfu\": %.4f, \"head_step_ms\": %.2f, \"peak_bytes\": %zu, "
                  "\"saved_activation_bytes\": %zu}",
                  rows.empty() ? "" : ",", name.c_str(), full.step_s * 1e3,
                  double(tokens) / full.step_s, mfu, layers_s * 1e3, double(tokens) / layers_s,
                  layers_mfu, head.step_s * 1e3, full.peak_bytes, full.saved_bytes);
    rows += row;
  }
  if (!o.json.empty()) {
    std::string seqs;
    for (int64_t l : o.seqs) seqs += (seqs.empty() ? "" : ", ") + std::to_string(l);
    std::ofstream(o.json) << "{\n  \"model\": \"" << o.model << "\",\n  \"layers\": "
                          << c.num_hidden_layers << ",\n  \"recompute\": " << o.recompute
                          << ",\n  \"sequences\": [" << seqs
                          << "],\n  \"micro_batches\": " << step.batches.size()
                          << ",\n  \"bf16_peak_tflops\": " << peak << ",\n  \"results\": [" << rows
                          << "\n  ]\n}\n";
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "bench_train_step: %s\n", e.what());
  return 1;
}
