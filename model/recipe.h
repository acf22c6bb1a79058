// model/recipe.h — the numeric recipe a model computes in (docs/architecture.md, "The precision flow").
//
//   fp32  fp32 activations, fp32 GEMMs on the master weights (CPU only: gradient checks and
//         comparisons with PyTorch in fp32)
//   bf16  bf16 activations and gradients between ops, bf16 GEMMs with fp32 accumulation
//   fp8   bf16 activations; every linear layer's GEMMs in E4M3 with 1×128 activation groups and
//         128×128 weight blocks (the unified FP8 flow: rollout uses these very weights)
// In every recipe norms, softmax, attention math and the LM head compute in fp32, weights are fp32
// masters, and weight gradients accumulate in fp32.
#pragma once

#include <string>
#include <string_view>

#include "core/dtypes.h"

namespace lockstep {

enum class Recipe { fp32, bf16, fp8 };

std::string_view recipe_name(Recipe recipe);
// "fp32", "bf16", "fp8"; anything else is an error naming the accepted values.
Recipe parse_recipe(std::string_view name);

// The dtype of activations and of the gradients flowing between ops.
inline DType activation_dtype(Recipe recipe) {
  return recipe == Recipe::fp32 ? DType::f32 : DType::bf16;
}

}  // namespace lockstep
