// ops/cpu/swiglu.cpp — CPU reference for ops/swiglu.h. The exponential is the scalar std::exp (a
// vector math library would round differently in a loop's vector body and its scalar tail, making a
// value depend on its column position modulo the vector width).
#include <cmath>
#include <vector>

#include "ops/cpu/act.h"
#include "ops/swiglu_backends.h"

namespace lockstep::cpu {

void swiglu_forward(Tensor& out, const Tensor& gate_up) {
  const int64_t T = gate_up.dim(0), I = out.dim(1);
#pragma omp parallel
  {
    std::vector<float> gate(I), up(I);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float* g = gate.data();
      const float* u = up.data();
      read_f32(gate_up, t * 2 * I, I, g);
      read_f32(gate_up, t * 2 * I + I, I, up.data());
      for (int64_t i = 0; i < I; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      write_f32(out, t * I, I, g);
    }
  }
}

void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  const int64_t T = gate_up.dim(0), I = dout.dim(1);
#pragma omp parallel
  {
    std::vector<float> gate(I), up(I), grad(I);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float* g = gate.data();  // becomes dg
      float* u = up.data();    // becomes du
      const float* d = grad.data();
      read_f32(gate_up, t * 2 * I, I, g);
      read_f32(gate_up, t * 2 * I + I, I, u);
      read_f32(dout, t * I, I, grad.data());
      for (int64_t i = 0; i < I; ++i) {
        const float denom = 1.0f + std::exp(-g[i]);
        const float s = 1.0f / denom, silu = g[i] / denom;  // silu as in the forward
        const float dsilu = s * (1.0f + g[i] * (1.0f - s));
        g[i] = d[i] * u[i] * dsilu;
        u[i] = d[i] * silu;
      }
      write_f32(dgate_up, t * 2 * I, I, g);
      write_f32(dgate_up, t * 2 * I + I, I, u);
    }
  }
}

}  // namespace lockstep::cpu
