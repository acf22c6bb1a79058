// model/linear.h — a linear layer y = x·Wᵀ (+ b) in the model's recipe (model/recipe.h): which
// copy of W the GEMMs read, what form x takes, and what is kept for the backward pass.
//
//   recipe  GEMM weight        input form                    kept for backward
//   fp32    the fp32 master    x (f32)                       x
//   bf16    a bf16 copy        x (bf16)                      x
//   fp8     128×128 E4M3 W,Wᵀ  x quantized 1×128 (FProp)     x quantized 128×1 (WGrad) only
#pragma once

#include "core/tensor.h"
#include "model/recipe.h"
#include "numerics/quantize.h"

namespace lockstep {

// The weight as the recipe's GEMMs read it, rebuilt from the fp32 master by refresh() after every
// change of the master (an optimizer step). The copy is written in place once it exists: a sparse
// layer's experts' fp8 copies are views of one stacked buffer (model/moe.h, StackedFp8Weight).
struct LinearWeight {
  Recipe recipe = Recipe::bf16;
  Tensor master;  // f32 [N, K], shared with ModelParameters
  Tensor bf16;    // bf16 recipe
  Fp8Weight fp8;  // fp8 recipe
  Shape shape;    // [N, K], kept when the master is released

  LinearWeight() = default;
  // fp8_copy: where the fp8 recipe's copy goes (an expert's views of its layer's stack), else
  // allocated here.
  LinearWeight(Recipe recipe, const Tensor& master, Fp8Weight fp8_copy = {});
  void refresh();
  // Allocates the recipe's copy on `device` unless it has one (fp8: Wᵀ too with
  // `with_transpose`); drops it. For copies kept elsewhere between uses (train/sharded_weights.h).
  void allocate_copy(Device device, bool with_transpose);
  void drop_copy();
  int64_t out_features() const { return shape.at(0); }
  int64_t in_features() const { return shape.at(1); }
};

// A linear layer's input in the recipe's form.
struct LinearInput {
  Tensor act;    // fp32/bf16 recipes: x [T, K]
  Fp8Rows rows;  // fp8: x quantized 1×128 along K (FProp)
  Fp8Rows cols;  // fp8: x quantized 128×1 along T, stored transposed (WGrad)
};

// x: [T, K] in the recipe's activation dtype. `for_backward` also makes what the backward needs
// (fp8: the columnwise copy, from the same read of x).
LinearInput linear_input(Recipe recipe, const Tensor& x, bool for_backward);
// Drops what the backward does not read (fp8: x itself and the rowwise copy).
void keep_for_backward(LinearInput& in);
// What keep_for_backward leaves, made afresh from x: for an input the backward keeps anyway (the
// attention output), whose fp8 columnwise copy is cheaper to remake than to store.
LinearInput linear_saved_input(Recipe recipe, const Tensor& x);

// y [T, N] (activation dtype) = x·Wᵀ + bias (bias: f32 [N] or undefined).
void linear_forward(Tensor& y, const LinearInput& x, const LinearWeight& w, const Tensor& bias);

// From dy [T, N]: dx [T, K] (written when defined), dw += dyᵀ·x (f32 [N, K]), db += Σ_t dy (when
// defined). `saved` is what keep_for_backward left of the forward's input.
void linear_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy,
                     const LinearInput& saved, const LinearWeight& w);

}  // namespace lockstep
