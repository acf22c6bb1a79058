// train/optimizer.cpp
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"

namespace lockstep {

namespace {

struct Named {
  std::string name;
  Tensor* tensor;
};

std::vector<Named> tensors_of(ModelParameters& p) {
  std::vector<Named> out;
  p.for_each([&](const std::string& name, Tensor& t) { out.push_back({name, &t}); });
  return out;
}

ModelParameters zeros_like(const ModelParameters& params) {
  ModelParameters z = params;
  z.for_each([](const std::string&, Tensor& t) {
    t = Tensor::zeros(t.shape(), DType::f32, t.device());
  });
  return z;
}

// `what` must hold the tensors of `reference` (the moments, built from the first params).
void check_matches(const std::vector<Named>& what, const std::vector<Named>& reference,
                   const char* what_name) {
  LOCKSTEP_CHECK(what.size() == reference.size(), "AdamW::step: ", what_name, " has ",
                 what.size(), " tensors, the optimizer was built for ", reference.size());
  for (size_t i = 0; i < what.size(); ++i) {
    LOCKSTEP_CHECK(what[i].name == reference[i].name, "AdamW::step: ", what_name, " tensor ", i,
                   " is ", what[i].name, ", expected ", reference[i].name);
    LOCKSTEP_CHECK(what[i].tensor->shape() == reference[i].tensor->shape(), "AdamW::step: ",
                   what_name, " ", what[i].name, " is ", what[i].tensor->describe(),
                   ", expected shape ", shape_string(reference[i].tensor->shape()));
  }
}

}  // namespace

OptimizerStep plan_optimizer_step(const OptimizerConfig& config, int64_t steps_done,
                                  std::span<const double> sums, std::span<const std::string> names) {
  OptimizerStep out;
  double sum = 0;
  for (size_t i = 0; i < sums.size(); ++i) {
    // Squares of finite floats cannot overflow a double: non-finite means a non-finite element.
    if (!std::isfinite(sums[i])) {
      out.grad_norm = sums[i];
      out.nonfinite_grad = names[i];
      return out;
    }
    sum += sums[i];
  }
  out.grad_norm = std::sqrt(sum);
  if (config.max_grad_norm > 0)
    out.clip_scale = float(std::min(1.0, config.max_grad_norm / (out.grad_norm + 1e-6)));
  out.step = steps_done + 1;
  out.lr = config.schedule.lr(out.step);
  return out;
}

AdamWHyper adamw_hyper(const OptimizerConfig& config, float lr) {
  return {.lr = lr,
          .beta1 = config.beta1,
          .beta2 = config.beta2,
          .eps = config.eps,
          .weight_decay = config.weight_decay};
}

AdamW::AdamW(const ModelParameters& params, const OptimizerConfig& config)
    : config_(config), m_(zeros_like(params)), v_(zeros_like(params)) {
  LOCKSTEP_CHECK(std::isfinite(config.max_grad_norm) && config.max_grad_norm >= 0,
                 "AdamW: max_grad_norm = ", config.max_grad_norm,
                 " (must be finite and non-negative; 0 turns clipping off)");
}

OptimizerStep AdamW::step(ModelParameters& params, ModelParameters& grads, const CopiesOf& copies) {
  const std::vector<Named> p = tensors_of(params), g = tensors_of(grads), m = tensors_of(m_),
                           v = tensors_of(v_);
  check_matches(p, m, "params");
  check_matches(g, m, "grads");

  std::vector<const Tensor*> g_tensors;
  std::vector<std::string> names;
  for (const Named& t : g) {
    g_tensors.push_back(t.tensor);
    names.push_back(t.name);
  }
  const std::vector<double> sums = sum_squares(g_tensors);  // one wait for the device
  OptimizerStep out = plan_optimizer_step(config_, steps_, sums, names);
  if (!out.nonfinite_grad.empty()) {
    grads.zero();
    return out;
  }
  const AdamWHyper hyper = adamw_hyper(config_, out.lr);
  for (size_t i = 0; i < p.size(); ++i)
    adamw_step(*p[i].tensor, *m[i].tensor, *v[i].tensor, *g[i].tensor, hyper, out.step,
               out.clip_scale, copies ? copies(p[i].name) : WeightCopies{});
  steps_ = out.step;
  out.applied = true;
  grads.zero();
  return out;
}

void AdamW::load_state(const ModelParameters& m, const ModelParameters& v, int64_t steps) {
  LOCKSTEP_CHECK(steps >= 0, "AdamW::load_state: negative step count ", steps);
  auto load = [](ModelParameters& dst, const ModelParameters& src, const char* what) {
    std::vector<std::pair<std::string, Tensor>> saved;
    src.for_each([&](const std::string& n, const Tensor& t) { saved.emplace_back(n, t); });
    size_t i = 0;
    dst.for_each([&](const std::string& n, Tensor& t) {
      LOCKSTEP_CHECK(i < saved.size() && saved[i].first == n &&
                         saved[i].second.shape() == t.shape(),
                     "AdamW::load_state: the saved ", what, " does not match tensor ", n, " ",
                     t.describe());
      t.copy_from(saved[i++].second);
    });
    LOCKSTEP_CHECK(i == saved.size(), "AdamW::load_state: the saved ", what, " has ",
                   saved.size(), " tensors, the model ", i);
  };
  load(m_, m, "first moment");
  load(v_, v, "second moment");
  steps_ = steps;
}

}  // namespace lockstep
