// bench/rollout — generation throughput of the rollout engine (rollout/engine.h) on one GPU, for
// the bf16 and the unified fp8 recipe: Qwen3-shaped models with random weights (inference-only:
// TransformerOptions::trainable = false), B requests of P random prompt tokens each, temperature-1
// sampling over the whole vocabulary and no stop tokens, so every sequence generates exactly N
// tokens (checked). The model is built once per recipe, its KV cache sized by --memory-fraction of
// the GPU memory left free by the weights.
//
// Per (recipe, B, N):
//   wall s          one generate() of the B requests with max_new_tokens = N
//   tokens/s        B·N / wall
//   prefill s       the same requests with max_new_tokens = 1 (the prompts, and one token each)
//   ms/step         (wall − prefill) / (N − 1), the decode steps. The engine runs the decodes of
//                   started sequences in the same steps as later prompts' chunks, so this is what
//                   the decodes add to the prefill, spread over the N − 1 decode steps.
//   GB/step         the bytes a decode step reads at the least: every weight the forward reads
//                   (linear layers as the recipe's GEMMs read them: bf16, or E4M3 W + its 128×128
//                   block scales; norms; the bf16 LM head; of a sparse layer's experts those B
//                   tokens reach under uniform routing), the B embedding rows, and the K and V
//                   of each sequence's context at the decode's mean context P + N/2 (activations,
//                   logits and the sampler's reads are left out).
//   roofline        GB/step / copy GB/s / (ms/step): copy GB/s is a device-to-device copy measured
//                   here (read + write bytes over time, as bench_gemm does).
//   host us         host time between two decode-graph steps, when the GPU has nothing queued
//                   (EngineStats::decode_host_seconds over the decode steps): part of ms/step.
// Each (recipe, B) first runs a short generate of the same requests untimed (so every GEMM shape of
// the timed runs is autotuned, and the decode steps' CUDA graphs captured, before them:
// ops/cuda/gemm.cu, rollout/decode_graph.h), then the prefill run, then the short run again,
// timed: its step time, scaled by the modeled bytes, estimates each N's run.
// --graphs 0,1 runs everything with the engine's decode graphs off, then on (one engine each, the
// same prompts), and prints the ratio; the default is on only.
// A configuration is skipped, saying why, when that estimate exceeds --max-seconds, or when the KV
// cache cannot hold all B sequences at once (the engine would preempt and recompute, which is not
// the decode being measured).
//
// A recipe name with "-kv8" (bf16-kv8, fp8-kv8) runs that recipe with the fp8 KV cache
// (TransformerOptions::fp8_kv_cache): e4m3 keys and values, half the bytes of each context token.
//
// --model-path DIR runs a Hugging Face checkpoint folder (config.json + safetensors) instead of a
// random model of a named shape: a real model's weights, the same random prompt tokens.
// --exact on runs the exact forward kernels (ops/forward_kernels.h, rollout.exact).
//
// Usage: bench_rollout [--model qwen3-8b|qwen3-1.7b | --model-path DIR] [--layers N] [--prompt 512] [--new 1024,4096]
//                      [--batch 1,16,64,256] [--recipes bf16,fp8[,bf16-kv8,fp8-kv8]] [--max-seconds 60]
//                      [--memory-fraction 0.9] [--max-step-tokens 8192] [--graphs 1|0|0,1]
//                      [--exact on|off] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gpu_timing.h"
#include "core/cuda_check.h"
#include "core/device.h"
#include "io/config.h"
#include "model/hf_checkpoint.h"
#include "model/transformer.h"
#include "ops/forward_kernels.h"
#include "rollout/engine.h"

using namespace lockstep;
using namespace lockstep::bench;

namespace {

struct Options {
  std::string model = "qwen3-8b";
  std::string model_path;  // a checkpoint folder instead of random weights
  int64_t layers = -1;  // the model's own count
  int64_t prompt = 512;
  std::vector<int64_t> news = {1024, 4096};
  std::vector<int64_t> batches = {1, 16, 64, 256};
  std::vector<std::string> recipes = {"bf16", "fp8"};
  double max_seconds = 60;
  double memory_fraction = 0.9;
  int64_t max_step_tokens = 8192;
  std::vector<int64_t> graphs = {1};
  std::string json;
};

double parse_double(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  LOCKSTEP_CHECK(!value.empty() && *end == '\0' && v > 0, flag,
                 ": expected a positive number, got '", value, "'");
  return v;
}

std::vector<int64_t> parse_ints(const std::string& flag, const std::string& value, int64_t least) {
  std::vector<int64_t> out;
  for (const std::string& s : split(value)) {
    out.push_back(parse_int(flag, s));
    LOCKSTEP_CHECK(out.back() >= least, flag, ": each value must be at least ", least, ", got ", s);
  }
  LOCKSTEP_CHECK(!out.empty(), flag, ": expected a comma-separated list");
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    LOCKSTEP_CHECK(i + 1 < argc, arg, " needs a value");
    const std::string value = argv[++i];
    if (arg == "--model") o.model = value;
    else if (arg == "--model-path") o.model_path = value;
    else if (arg == "--layers") o.layers = parse_int(arg, value);
    else if (arg == "--prompt") o.prompt = parse_int(arg, value);
    else if (arg == "--new") o.news = parse_ints(arg, value, 2);  // at least one decode step
    else if (arg == "--batch") o.batches = parse_ints(arg, value, 1);
    else if (arg == "--recipes") o.recipes = split(value);
    else if (arg == "--max-seconds") o.max_seconds = parse_double(arg, value);
    else if (arg == "--memory-fraction") o.memory_fraction = parse_double(arg, value);
    else if (arg == "--max-step-tokens") o.max_step_tokens = parse_int(arg, value);
    else if (arg == "--graphs") o.graphs = parse_ints(arg, value, 0);
    else if (arg == "--json") o.json = value;
    else if (arg == "--exact" && (value == "on" || value == "off")) set_exact_forward(value == "on");
    else fail("unknown option or value: " + arg + " " + value);
  }
  LOCKSTEP_CHECK(o.prompt > 0, "--prompt must be positive");
  LOCKSTEP_CHECK(o.model_path.empty() || o.layers < 0, "--layers applies to a named --model, not to --model-path");
  for (const int64_t g : o.graphs)
    LOCKSTEP_CHECK(g == 0 || g == 1, "--graphs: expected 0 and/or 1, got ", g);
  for (const std::string& r : o.recipes)
    LOCKSTEP_CHECK(r == "bf16" || r == "fp8" || r == "bf16-kv8" || r == "fp8-kv8",
                   "--recipes: expected some of bf16, fp8, bf16-kv8, fp8-kv8, got '", r, "'");
  LOCKSTEP_CHECK(o.memory_fraction <= 1, "--memory-fraction must be in (0, 1], got ",
                 o.memory_fraction);
  // A decode step of the whole batch must be one engine step, or N tokens take more than N steps.
  const int64_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  LOCKSTEP_CHECK(o.max_step_tokens >= max_batch, "--max-step-tokens (", o.max_step_tokens,
                 ") must be at least the largest --batch (", max_batch, ")");
  return o;
}


// The memory pool (core/device.cpp) keeps what tensors free, and CUDA keeps the memory of
// destroyed graphs; handing both back to the device lets the next engine's memory_fraction of
// *free* memory count them (the masters an inference-only model released, the previous engine's
// cache and graphs).
void release_pooled_memory() {
  device_synchronize();
  int device = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  LOCKSTEP_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  LOCKSTEP_CUDA_CHECK(cudaDeviceGraphMemTrim(device));
}

// The bytes a decode step of `batch` sequences at mean context `context` reads at the least (see
// the top of the file).
double decode_bytes(Transformer& model, int64_t batch, double context) {
  const ModelConfig& c = model.config();
  const DType act = model.activation_dtype();
  double bytes = double(model.head_weight().nbytes());
  // An inference-only model keeps only the norms and biases as fp32 masters: all read each step.
  std::as_const(model.params()).for_each([&](const std::string&, const Tensor& t) {
    bytes += double(t.nbytes());
  });
  auto copy_bytes = [&](const std::string& name) {
    const WeightCopies w = model.weight_copies(name);
    return w.fp8 ? double(w.fp8->w.data.nbytes() + w.fp8->w.scales.nbytes()) : double(w.bf16->nbytes());
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = "layers." + std::to_string(i) + ".";
    bytes += copy_bytes(layer + "qkv") + copy_bytes(layer + "o");
    if (!c.is_moe_layer(i)) {
      bytes += copy_bytes(layer + "gate_up") + copy_bytes(layer + "down");
      continue;
    }
    // A sparse layer: the router, and the experts B tokens reach, E·(1 − (1 − k/E)^B) of them
    // expected under uniform routing (random weights route less evenly: to fewer).
    const double E = double(c.moe->num_experts), k = double(c.moe->num_experts_per_tok);
    const double reached = E * (1 - std::pow(1 - k / E, double(batch)));
    bytes += copy_bytes(layer + "router") +
             reached * (copy_bytes(layer + "experts.0.gate_up") + copy_bytes(layer + "experts.0.down"));
  }
  bytes += double(batch * c.hidden_size) * double(dtype_size(act));
  return bytes + double(batch) * context * double(KvCache::block_bytes(c, model.kv_cache_dtype(), 1));
}

// `prompts.size()` requests of N new tokens, each its own sample stream.
std::vector<GenerationRequest> requests(const std::vector<std::vector<int32_t>>& prompts,
                                        int64_t new_tokens) {
  std::vector<GenerationRequest> out(prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r) {
    out[r].prompt = prompts[r];
    out[r].sampling.temperature = 1.0f;
    out[r].sampling.max_new_tokens = new_tokens;
    out[r].sampling.seed = r + 1;
  }
  return out;
}

struct Run {
  double seconds = 0;
  EngineStats stats;  // this run's own
};

Run timed_generate(Engine& engine, const std::vector<GenerationRequest>& reqs) {
  const EngineStats before = engine.stats();
  device_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = engine.generate(reqs);
  Run run{seconds_since(t0), engine.stats()};
  run.stats.steps -= before.steps;
  run.stats.tokens_computed -= before.tokens_computed;
  run.stats.preemptions -= before.preemptions;
  run.stats.block_copies -= before.block_copies;
  run.stats.decode_steps -= before.decode_steps;
  run.stats.decode_host_seconds -= before.decode_host_seconds;
  for (size_t r = 0; r < out.size(); ++r)
    LOCKSTEP_CHECK(int64_t(out[r][0].tokens.size()) == reqs[r].sampling.max_new_tokens,
                   "request ", r, " generated ", out[r][0].tokens.size(), " tokens, not ",
                   reqs[r].sampling.max_new_tokens, " (no stop rule should end it early)");
  return run;
}

struct Row {
  std::string recipe;
  bool graphs = true;
  int64_t batch = 0, new_tokens = 0, kv_cache_tokens = 0;
  std::string skipped;  // why, when it did not run
  double wall_s = 0, prefill_s = 0, tokens_per_s = 0, step_ms = 0, step_bytes = 0, roofline = 0;
  double host_us = 0;  // a decode step's share of EngineStats::decode_host_seconds
  EngineStats stats;
};

std::string json_row(const Row& r) {
  char buf[768];
  if (!r.skipped.empty()) {
    std::snprintf(buf, sizeof buf,
                  "{\"recipe\": \"%s\", \"graphs\": %d, \"batch\": %lld, \"new_tokens\": %lld, "
                  "\"kv_cache_tokens\": %lld, \"skipped\": \"%s\"}",
                  r.recipe.c_str(), int(r.graphs), (long long)r.batch, (long long)r.new_tokens,
                  (long long)r.kv_cache_tokens, r.skipped.c_str());
  } else {
    std::snprintf(buf, sizeof buf,
                  "{\"recipe\": \"%s\", \"graphs\": %d, \"batch\": %lld, \"new_tokens\": %lld, "
                  "\"kv_cache_tokens\": %lld, \"wall_s\": %.4f, \"prefill_s\": %.4f, "
                  "\"tokens_per_s\": %.1f, \"decode_ms_per_step\": %.4f, "
                  "\"decode_bytes_per_step\": %.0f, \"roofline_fraction\": %.4f, "
                  "\"host_us_per_step\": %.1f, "
                  "\"engine_steps\": %lld, \"decode_graph_steps\": %lld, \"preemptions\": %lld}",
                  r.recipe.c_str(), int(r.graphs), (long long)r.batch, (long long)r.new_tokens,
                  (long long)r.kv_cache_tokens, r.wall_s, r.prefill_s, r.tokens_per_s, r.step_ms,
                  r.step_bytes, r.roofline, r.host_us, (long long)r.stats.steps,
                  (long long)r.stats.decode_steps, (long long)r.stats.preemptions);
  }
  return buf;
}

void print_row(const Row& r) {
  if (!r.skipped.empty()) {
    std::printf("%-8s %6d %5lld %5lld  skipped: %s\n", r.recipe.c_str(), int(r.graphs),
                (long long)r.batch, (long long)r.new_tokens, r.skipped.c_str());
  } else {
    std::printf("%-8s %6d %5lld %5lld %8.2f %9.2f %9.0f %8.2f %8.2f %8.1f%% %7.0f %7lld %7lld\n",
                r.recipe.c_str(), int(r.graphs), (long long)r.batch, (long long)r.new_tokens, r.wall_s,
                r.prefill_s, r.tokens_per_s, r.step_ms, r.step_bytes / 1e9, 100 * r.roofline, r.host_us,
                (long long)r.stats.steps, (long long)r.stats.preemptions);
  }
  std::fflush(stdout);
}

// Every configuration of one recipe with one engine (decode graphs on or off).
std::vector<Row> run_engine(const Options& o, Transformer& model, const std::string& name,
                            bool graphs, double copy_gbs) {
  const ModelConfig& c = model.config();
  const int64_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const EngineOptions options{.memory_fraction = o.memory_fraction,
                              .max_step_tokens = o.max_step_tokens,
                              .max_step_sequences = max_batch,
                              .cuda_graphs = graphs};
  Engine engine(model, options);
  const int64_t block = options.block_size;
  const int64_t kv_tokens = engine.num_blocks() * block;
  std::printf("%s, decode graphs %s: KV cache of %lld tokens\n", name.c_str(),
              !graphs ? "off" : model.decode_reads_nothing_back() ? "on"
                                 : "asked for, but off (this sparse model reads its expert counts back)",
              (long long)kv_tokens);
  std::fflush(stdout);
  // Whether B sequences of `tokens` tokens (the last one's k/v never written) fit at once.
  auto fits = [&](int64_t batch, int64_t tokens) {
    return batch * ((tokens - 1 + block - 1) / block) <= engine.num_blocks();
  };

  std::vector<Row> rows;
  const int64_t min_new = *std::min_element(o.news.begin(), o.news.end());
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int32_t> token(0, int32_t(c.vocab_size - 1));
  for (const int64_t batch : o.batches) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
    for (auto& p : prompts)
      for (int64_t t = 0; t < o.prompt; ++t) p.push_back(token(rng));
    // Long enough for every prompt to be prefilled before the first sequence finishes, so the
    // short run makes the same step shapes as the long ones (the warm-up autotunes them all).
    const int64_t probe =
        std::min(min_new, (batch * o.prompt + o.max_step_tokens - 1) / o.max_step_tokens + 8);
    Run prefill, short_run;
    if (fits(batch, o.prompt + probe)) {
      timed_generate(engine, requests(prompts, probe));
      prefill = timed_generate(engine, requests(prompts, 1));
      short_run = timed_generate(engine, requests(prompts, probe));
    }
    const double probe_step =
        std::max(0.0, short_run.seconds - prefill.seconds) / double(probe - 1);
    const double probe_bytes = decode_bytes(model, batch, double(o.prompt) + double(probe) / 2);
    for (const int64_t n : o.news) {
      Row row;
      row.recipe = name;
      row.graphs = graphs;
      row.batch = batch;
      row.new_tokens = n;
      row.kv_cache_tokens = kv_tokens;
      const double bytes = decode_bytes(model, batch, double(o.prompt) + double(n) / 2);
      const double estimate = prefill.seconds + double(n - 1) * probe_step * bytes / probe_bytes;
      char why[160] = "";
      if (!fits(batch, o.prompt + n)) {
        std::snprintf(why, sizeof why,
                      "the KV cache holds %lld tokens, %lld sequences of %lld need more "
                      "(the engine would preempt)",
                      (long long)kv_tokens, (long long)batch, (long long)(o.prompt + n));
      } else if (estimate > o.max_seconds) {
        std::snprintf(why, sizeof why, "estimated %.1f s > --max-seconds %g", estimate,
                      o.max_seconds);
      } else {
        const Run run = timed_generate(engine, requests(prompts, n));
        row.wall_s = run.seconds;
        row.prefill_s = prefill.seconds;
        row.tokens_per_s = double(batch * n) / run.seconds;
        row.step_ms = 1e3 * (run.seconds - prefill.seconds) / double(n - 1);
        row.step_bytes = bytes;
        row.roofline = bytes / (copy_gbs * 1e9) / (row.step_ms * 1e-3);
        row.stats = run.stats;
        if (run.stats.decode_steps > 1)
          row.host_us = 1e6 * run.stats.decode_host_seconds / double(run.stats.decode_steps - 1);
      }
      row.skipped = why;
      print_row(row);
      rows.push_back(row);
    }
  }
  return rows;
}

// Every configuration of one recipe, for each --graphs value.
std::vector<Row> run_recipe(const Options& o, const ModelConfig& c, const ModelParameters& host,
                            const std::string& name, double copy_gbs) {
  const bool kv8 = name.ends_with("-kv8");
  const Recipe recipe = parse_recipe(kv8 ? name.substr(0, name.size() - 4) : name);
  const auto t0 = std::chrono::steady_clock::now();
  ModelParameters params = host;  // the same host tensors, each replaced by a GPU copy below
  params.for_each([](const std::string&, Tensor& t) { t = t.to(Device::cuda); });
  Transformer model(c, std::move(params), recipe, {.trainable = false, .fp8_kv_cache = kv8});
  release_pooled_memory();
  const size_t weights = device_memory_stats().in_use;
  std::printf("%s: model on the GPU in %.1f s, %.2f GB of weights\n", name.c_str(),
              seconds_since(t0), double(weights) / 1e9);
  std::fflush(stdout);
  std::vector<Row> rows;
  for (const int64_t graphs : o.graphs) {
    const std::vector<Row> more = run_engine(o, model, name, graphs != 0, copy_gbs);
    rows.insert(rows.end(), more.begin(), more.end());
    release_pooled_memory();  // the next engine's KV cache gets this one's memory
  }
  return rows;
}

void write_json(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    LOCKSTEP_CHECK(out.good(), "--json: cannot write ", tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  LOCKSTEP_CHECK(cuda_device_available(), "bench_rollout needs a GPU");
  const bool real = !o.model_path.empty();
  ModelConfig c = real ? load_model_config(o.model_path) : model_config(o.model);
  if (o.layers >= 0) c.num_hidden_layers = o.layers;
  cudaDeviceProp prop;
  LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbs = copy_bandwidth_gbs(20);  // median of 20 copies of 1 GiB
  auto t0 = std::chrono::steady_clock::now();
  const ModelParameters host = real ? load_hf_parameters(c, o.model_path) : ModelParameters::initialized(c, 7);
  std::printf("%s: %s, %lld layers, %lld parameters (%s in %.1f s); prompts of %lld "
              "tokens; device-to-device copy %.0f GB/s\n",
              prop.name, real ? o.model_path.c_str() : o.model.c_str(), (long long)c.num_hidden_layers,
              (long long)parameter_count(c), real ? "loaded" : "initialized", seconds_since(t0),
              (long long)o.prompt, copy_gbs);
  std::printf("%-8s %6s %5s %5s %8s %9s %9s %8s %8s %9s %7s %7s %7s\n", "recipe", "graphs", "batch",
              "new", "wall s", "prefill s", "tokens/s", "ms/step", "GB/step", "roofline", "host us",
              "steps", "preempt");

  std::vector<Row> all;
  std::string rows;
  for (const std::string& name : o.recipes) {
    for (const Row& r : run_recipe(o, c, host, name, copy_gbs)) {
      rows += (rows.empty() ? "\n    " : ",\n    ") + json_row(r);
      all.push_back(r);
    }
    release_pooled_memory();  // the next recipe's KV cache gets this one's memory
  }
  // Runs alike but for the recipe (the same graphs setting), or for the graphs (the same recipe).
  for (const Row& f : all) {
    if (!f.skipped.empty()) continue;
    for (const Row& b : all) {
      if (!b.skipped.empty() || b.batch != f.batch || b.new_tokens != f.new_tokens) continue;
      if (f.recipe != "bf16" && b.recipe == "bf16" && f.graphs == b.graphs)
        std::printf("%s / bf16 tokens/s at batch %lld, %lld new, graphs %d: %.2fx\n", f.recipe.c_str(),
                    (long long)f.batch, (long long)f.new_tokens, int(f.graphs), f.tokens_per_s / b.tokens_per_s);
      if (f.recipe == b.recipe && f.graphs && !b.graphs)
        std::printf("%s graphs on / off tokens/s at batch %lld, %lld new: %.2fx\n",
                    f.recipe.c_str(), (long long)f.batch, (long long)f.new_tokens,
                    f.tokens_per_s / b.tokens_per_s);
    }
  }
  if (!o.json.empty()) {
    char head[512];
    std::snprintf(head, sizeof head,
                  "{\n  \"device\": \"%s\",\n  \"model\": \"%s\",\n  \"layers\": %lld,\n  "
                  "\"prompt_tokens\": %lld,\n  \"max_step_tokens\": %lld,\n  "
                  "\"memory_fraction\": %.3f,\n  \"copy_gbs\": %.1f,\n  \"results\": [",
                  prop.name, (real ? o.model_path : o.model).c_str(), (long long)c.num_hidden_layers,
                  (long long)o.prompt, (long long)o.max_step_tokens, o.memory_fraction, copy_gbs);
    write_json(o.json, head + rows + "\n  ]\n}\n");
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "bench_rollout: %s\n", e.what());
  return 1;
}
