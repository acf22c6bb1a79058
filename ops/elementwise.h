// ops/elementwise.h — the small elementwise ops around the layers: residual adds, biases, dtype
// conversion, and the squared norm used for gradient clipping.
//
// CUDA: activations (y, x, dy) bf16 (add_into also takes y and x both f32: a sharded optimizer's
// gradient accumulation), 16-byte aligned data, and for the row ops (add_bias, bias_backward) N a
// multiple of 8. add_into, add_bias and convert give the CPU's bits.
// bias_backward and sum_squares add in an order fixed by the shape alone (no atomics): the same
// bits every run, rounded differently from the CPU's. sum_squares waits for the device (it returns
// host numbers): once for all the tensors of a call.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace lockstep {

// y += x  (same shape; f32 or bf16 each; fp32 add, one rounding). The residual connection.
void add_into(Tensor& y, const Tensor& x);
// y[t, :] += b  (y f32/bf16 [T, N], b f32 [N]).
void add_bias(Tensor& y, const Tensor& b);
// db += Σ_t dy[t, :]  (db f32 [N], accumulates; rows added in order).
void bias_backward(Tensor& db, const Tensor& dy);
// dst = src converted to dst's dtype (f32 <-> bf16, rounding to nearest even); same shape.
void convert(Tensor& dst, const Tensor& src);
// Σ x² in double (f32 tensor).
double sum_squares(const Tensor& x);
// Σ x² of each tensor, in order (f32 tensors on one device): for the global gradient norm over a
// model's tensors, each tensor's sum the bits of sum_squares(*xs[i]).
std::vector<double> sum_squares(const std::vector<const Tensor*>& xs);

}  // namespace lockstep
