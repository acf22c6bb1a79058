// model/recipe.cpp
#include "model/recipe.h"

#include "core/error.h"

namespace lockstep {

std::string_view recipe_name(Recipe recipe) {
  switch (recipe) {
    case Recipe::fp32: return "fp32";
    case Recipe::bf16: return "bf16";
    case Recipe::fp8: return "fp8";
  }
  return "?";
}

Recipe parse_recipe(std::string_view name) {
  for (Recipe r : {Recipe::fp32, Recipe::bf16, Recipe::fp8})
    if (name == recipe_name(r)) return r;
  fail("unknown recipe '" + std::string(name) + "' (expected fp32, bf16 or fp8)");
}

}  // namespace lockstep
