// ops/elementwise_backends.h — per-backend entry points for ops/elementwise.h; arguments are
// checked by ops/elementwise.cpp.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace lockstep::cpu {
void add_into(Tensor& y, const Tensor& x);
void add_bias(Tensor& y, const Tensor& b);
void bias_backward(Tensor& db, const Tensor& dy);
void convert(Tensor& dst, const Tensor& src);
double sum_squares(const Tensor& x);
}  // namespace lockstep::cpu

namespace lockstep::cuda {
void add_into(Tensor& y, const Tensor& x);
void add_into_f32(Tensor& y, const Tensor& x);  // y, x f32
void add_bias(Tensor& y, const Tensor& b);
void bias_backward(Tensor& db, const Tensor& dy);
void convert(Tensor& dst, const Tensor& src);
std::vector<double> sum_squares(const std::vector<const Tensor*>& xs);
}  // namespace lockstep::cuda
