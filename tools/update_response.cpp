// tools/update_response.cpp — lockstep_update_response: how far one small AdamW step from a
// checkpoint moves the model, per recipe and learning rate (docs/experiments.md, "Why fp8 moves
// further per step").
//
//   lockstep_update_response MODEL_DIR TOKENS_JSON [--lr 1e-9,1e-7,1e-6,1e-5,1e-4] [--dither]
//                            [--device cpu|cuda]
//
// TOKENS_JSON: {"sequences": [[id, ...], ...]} (lockstep_model_check's input), packed into one batch.
// For each recipe (bf16, fp8) and learning rate, from a freshly loaded model: the forward gives
// logprob_t for every row; the loss L = Σ c_t · logprob_t / T with fixed weights c_t (+1 on every
// third row, −0.5 elsewhere: a stand-in for GRPO's advantages); its backward; one AdamW step (the
// optimizer's defaults but the learning rate; at step 1 every master moves by about lr, the sign of
// its gradient) that writes the recipe's weight copies, as training does; then the forward again.
// Printed per line:
//   values changed  the share of the linear layers' copy values that differ after the step (bf16
//                   values, or E4M3 bytes, the zero padding of widths that are not multiples of 128
//                   included: it never changes)
//   scales changed  fp8: the share of their 128×128 block scales that differ (padding blocks
//                   included: they never change)
//   mean |Δlogprob| over the rows
//   ΔL              L after − L before: negative when the step lowered the loss, as intended
// --dither first moves every weight-matrix master off the bf16 grid within its bf16 rounding
// (model/parameters.h's dither_within_bf16_rounding, seed 7): the bf16 copies stay the same
// values, the fp8 copies are requantized from slightly different masters.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/file_io.h"
#include "model/hf_checkpoint.h"
#include "model/transformer.h"
#include "train/optimizer.h"

using namespace lockstep;

namespace {

struct Options {
  std::vector<float> lrs = {1e-9f, 1e-7f, 1e-6f, 1e-5f, 1e-4f};
  bool dither = false;
  Device device = Device::cpu;
};

struct Batch {
  TrainBatch batch;
  std::vector<float> weight;  // c_t
};

Tensor i32_tensor(const std::vector<int32_t>& v, Device device) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t.to(device);
}

Batch read_batch(const std::string& path, Device device) {
  const auto doc = nlohmann::json::parse(read_file(path, "tokens"), nullptr, false);
  LOCKSTEP_CHECK(doc.is_object() && doc.contains("sequences") && doc["sequences"].is_array(), path,
                 ": expected {\"sequences\": [[id, ...], ...]}");
  std::vector<int32_t> tokens, targets, cu{0};
  for (const auto& seq : doc["sequences"]) {
    LOCKSTEP_CHECK(seq.is_array() && seq.size() >= 2, path, ": every sequence must be an array of ",
                   "at least two token ids");
    for (size_t i = 0; i + 1 < seq.size(); ++i) {
      LOCKSTEP_CHECK(seq[i].is_number_integer() && seq[i + 1].is_number_integer(), path, ": token ",
                     i, " is not an integer");
      tokens.push_back(seq[i].get<int32_t>());
      targets.push_back(seq[i + 1].get<int32_t>());
    }
    cu.push_back(int32_t(tokens.size()));
  }
  Batch b;
  b.batch = {i32_tensor(tokens, device), i32_tensor(targets, device), i32_tensor(cu, device)};
  for (size_t t = 0; t < tokens.size(); ++t) b.weight.push_back(t % 3 == 0 ? 1.0f : -0.5f);
  return b;
}

bool is_linear(const std::string& name) {
  for (const char* suffix : {".qkv", ".o", ".gate_up", ".down"})
    if (name.ends_with(suffix)) return true;
  return false;
}

// The host bytes of every linear layer's copies, one vector per (layer, copy).
struct Snapshot {
  std::vector<std::vector<uint8_t>> values;  // bf16 values or E4M3 bytes
  std::vector<std::vector<float>> scales;    // fp8: block scales (empty for bf16)
};

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.device() == Device::cpu ? t : t.to(Device::cpu);
  const auto* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

Snapshot snapshot(Transformer& model) {
  Snapshot s;
  model.params().for_each([&](const std::string& name, Tensor&) {
    if (!is_linear(name)) return;
    const WeightCopies c = model.weight_copies(name);
    if (c.bf16) {
      s.values.push_back(bytes_of(*c.bf16));
      s.scales.emplace_back();
    } else if (c.fp8) {
      s.values.push_back(bytes_of(c.fp8->w.data));
      const std::vector<uint8_t> raw = bytes_of(c.fp8->w.scales);
      std::vector<float> sc(raw.size() / 4);
      std::memcpy(sc.data(), raw.data(), raw.size());
      s.scales.push_back(std::move(sc));
    }
  });
  return s;
}

// The share of copy values that changed: bf16 values, or E4M3 bytes and, apart, block scales.
struct Changed {
  double values = 0, scales = 0;
};

Changed changed_share(const Snapshot& a, const Snapshot& b) {
  int64_t values = 0, value_total = 0, scales = 0, scale_total = 0;
  for (size_t i = 0; i < a.values.size(); ++i) {
    const size_t width = a.scales[i].empty() ? 2 : 1;  // bf16: two bytes a value
    for (size_t j = 0; j < a.values[i].size(); j += width)
      values += std::memcmp(&a.values[i][j], &b.values[i][j], width) != 0;
    value_total += int64_t(a.values[i].size() / width);
    for (size_t k = 0; k < a.scales[i].size(); ++k) scales += a.scales[i][k] != b.scales[i][k];
    scale_total += int64_t(a.scales[i].size());
  }
  Changed c;
  c.values = value_total ? double(values) / double(value_total) : 0.0;
  c.scales = scale_total ? double(scales) / double(scale_total) : 0.0;
  return c;
}

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.device() == Device::cpu ? t : t.to(Device::cpu);
  return std::vector<float>(h.data_as<float>(), h.data_as<float>() + h.numel());
}

void measure(const ModelConfig& config, const std::string& model_dir, const Batch& b, Recipe recipe,
             float lr, const Options& o) {
  ModelParameters params = load_hf_parameters(config, model_dir);
  if (o.dither) dither_within_bf16_rounding(params, 7);
  Transformer model(config, o.device == Device::cpu ? params : params.copy_to(o.device), recipe);
  const int64_t rows = int64_t(b.weight.size());

  const std::vector<float> before = host_floats(model.forward(b.batch, 1.0f, false).logprob);
  const Snapshot copies_before = snapshot(model);
  TrainForward f = model.forward(b.batch);
  Tensor dlogprob = Tensor::empty({rows}, DType::f32);
  for (int64_t t = 0; t < rows; ++t) dlogprob.data_as<float>()[t] = b.weight[size_t(t)] / float(rows);
  model.backward(f, o.device == Device::cpu ? dlogprob : dlogprob.to(o.device), Tensor());
  OptimizerConfig oc;
  oc.schedule.peak_lr = lr;
  AdamW optimizer(model.params(), oc);
  const OptimizerStep step = optimizer.step(model.params(), model.grads(),
                                            [&](const std::string& n) { return model.weight_copies(n); });
  LOCKSTEP_CHECK(step.applied, "the step was skipped: a non-finite gradient in ", step.nonfinite_grad);
  const std::vector<float> after = host_floats(model.forward(b.batch, 1.0f, false).logprob);

  double abs_change = 0, loss_change = 0;
  for (int64_t t = 0; t < rows; ++t) {
    const double d = double(after[size_t(t)]) - double(before[size_t(t)]);
    abs_change += std::fabs(d);
    loss_change += b.weight[size_t(t)] * d;
  }
  const Changed changed = changed_share(copies_before, snapshot(model));
  std::printf("%-5s lr %-7.0e values changed %8.4f%%  scales changed %6.2f%%  mean |dlogprob| %.4f  "
              "dL %+.4f\n", recipe == Recipe::fp8 ? "fp8" : "bf16", double(lr), 100.0 * changed.values,
              100.0 * changed.scales, abs_change / double(rows), loss_change / double(rows));
}

std::vector<float> parse_lrs(const std::string& list) {
  std::vector<float> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const float v = std::strtof(item.c_str(), &end);
    LOCKSTEP_CHECK(!item.empty() && end == item.c_str() + item.size() && std::isfinite(v) && v > 0,
                   "--lr: \"", item, "\" is not a positive number");
    out.push_back(v);
  }
  LOCKSTEP_CHECK(!out.empty(), "--lr: an empty list");
  return out;
}

int usage() {
  std::cerr << "usage: lockstep_update_response MODEL_DIR TOKENS_JSON [--lr A,B,...] [--dither] "
               "[--device cpu|cuda]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> positional;
    Options o;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--dither") {
        o.dither = true;
      } else if ((a == "--lr" || a == "--device") && i + 1 < argc) {
        const std::string v = argv[++i];
        if (a == "--lr") {
          o.lrs = parse_lrs(v);
        } else {
          o.device = parse_device(v, a);
        }
      } else if (a.starts_with("--")) {
        return usage();
      } else {
        positional.push_back(a);
      }
    }
    if (positional.size() != 2) return usage();
    const ModelConfig config = load_model_config(positional[0]);
    const Batch b = read_batch(positional[1], o.device);
    std::printf("%s, %zu rows, %s masters\n", positional[0].c_str(), b.weight.size(),
                o.dither ? "dithered" : "checkpoint (bf16-grid)");
    for (Recipe recipe : {Recipe::bf16, Recipe::fp8})
      for (float lr : o.lrs) measure(config, positional[0], b, recipe, lr, o);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "lockstep_update_response: " << e.what() << "\n";
    return 1;
  }
}
