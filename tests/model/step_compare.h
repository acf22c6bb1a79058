// tests/model/step_compare.h — comparing the parameters after a training step with a reference
// step's (the GPU model-step tests against the CPU): the weights, and the update itself.
//
// Why the update: one AdamW step moves each weight by about lr (1e-3: 2–4% of the test models'
// matrix weights, 0.1% of the norm weights, which are near 1), less than the weights' tolerance in
// fp8 (3e-2), so a tensor left unchanged can pass a comparison of the weights alone. Its update
// (after − before), compared relative to the reference's, is off by 1.0 (StepCompare.*, test_model,
// plants that bug).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "../test_util.h"
#include "model/parameters.h"
#include "model/recipe.h"

namespace lockstep::testing {

// Relative L2 errors per tensor allowed between the GPU's training step and the CPU's, by recipe.
// bf16: a few bf16 roundings of differently ordered sums per op [logprob/grads ~1e-3–1e-2].
// fp8: an E4M3 step is 6–12% of a value, and a flipped code moves a product by that much
// [H200: worst gradient 1.6e-1, the q_norm weights', which sum over every token and head].
// `weights` after one AdamW step; `update` (p − p0): Adam's first step is ≈ lr·sign(g), so elements
// whose gradients are within the two backends' difference of 0 flip their update.
struct StepTolerance {
  double logprob, grads, weights, update;
};
inline StepTolerance step_tolerance(Recipe r) {
  return r == Recipe::bf16 ? StepTolerance{1e-2, 4e-2, 1e-2, 0.3}
                           : StepTolerance{4e-2, 2.5e-1, 3e-2, 0.6};
}

// The worst relative error over the tensors of two parameter sets (CPU), and its tensor's name.
inline std::pair<double, std::string> worst_rel_error(const ModelParameters& out,
                                                      const ModelParameters& ref) {
  std::vector<Tensor> refs;
  ref.for_each([&](const std::string&, const Tensor& t) { refs.push_back(t); });
  std::pair<double, std::string> worst{0.0, ""};
  size_t i = 0;
  out.for_each([&](const std::string& name, const Tensor& t) {
    const double e = rel_error(to_double(t), to_double(refs.at(i++)));
    if (!(e <= worst.first)) worst = {e, name};  // NaN wins
  });
  return worst;
}

// a − b, tensor by tensor, in f64 (CPU parameters).
inline std::vector<std::vector<double>> difference(const ModelParameters& a,
                                                   const ModelParameters& b) {
  std::vector<std::vector<double>> out;
  a.for_each([&](const std::string&, const Tensor& t) { out.push_back(to_double(t)); });
  size_t i = 0;
  b.for_each([&](const std::string&, const Tensor& t) {
    const std::vector<double> v = to_double(t);
    for (size_t k = 0; k < v.size(); ++k) out.at(i)[k] -= v[k];
    ++i;
  });
  return out;
}

// The worst errors of the weights after a step (`after`) against the reference step's
// (`ref_after`), both from `before`: of the weights, and of the update relative to the reference's.
struct StepErrors {
  std::pair<double, std::string> weights, update;
};
inline StepErrors step_errors(const ModelParameters& after, const ModelParameters& ref_after,
                              const ModelParameters& before) {
  StepErrors e{worst_rel_error(after, ref_after), {0.0, ""}};
  const auto update = difference(after, before), ref_update = difference(ref_after, before);
  std::vector<std::string> names;
  before.for_each([&](const std::string& name, const Tensor&) { names.push_back(name); });
  for (size_t i = 0; i < names.size(); ++i) {
    const double u = rel_error(update[i], ref_update[i]);
    if (!(u <= e.update.first)) e.update = {u, names[i]};  // NaN wins
  }
  return e;
}

}  // namespace lockstep::testing
