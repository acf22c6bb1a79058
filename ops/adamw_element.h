// ops/adamw_element.h — the AdamW update of one element (ops/adamw.h's formula, operation by
// operation), shared by the CPU reference and the CUDA kernels so that both give the same bits.
//
// AdamWScalars holds the per-step scalars, computed once on the host (ops/adamw.cpp). The
// operations are spelled out as correctly rounded fp32 operations: the host build never contracts
// a·b + c into an FMA (-ffp-contract=off), nvcc does by default, so the device uses the _rn
// intrinsics, which it never contracts. (nvcc's plain / and sqrtf are correctly rounded too, without
// -use_fast_math; the intrinsics make it independent of that flag.)
#pragma once

#include <cmath>

#include "core/dtypes.h"  // LOCKSTEP_HD

namespace lockstep {

struct AdamWScalars {
  float lr, beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias1, bias2;  // 1 − β1^step, 1 − β2^step
  float eps, weight_decay, grad_scale;
};

#if defined(__CUDA_ARCH__)
LOCKSTEP_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
LOCKSTEP_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
LOCKSTEP_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
LOCKSTEP_HD float div_rn(float a, float b) { return __fdiv_rn(a, b); }
LOCKSTEP_HD float sqrt_rn(float a) { return __fsqrt_rn(a); }
#else
LOCKSTEP_HD float mul_rn(float a, float b) { return a * b; }
LOCKSTEP_HD float add_rn(float a, float b) { return a + b; }
LOCKSTEP_HD float sub_rn(float a, float b) { return a - b; }
LOCKSTEP_HD float div_rn(float a, float b) { return a / b; }
LOCKSTEP_HD float sqrt_rn(float a) { return std::sqrt(a); }
#endif

// p, m, v updated in place from the gradient element `grad`.
LOCKSTEP_HD void adamw_element(float& p, float& m, float& v, float grad, const AdamWScalars& s) {
  const float g = mul_rn(grad, s.grad_scale);
  m = add_rn(mul_rn(s.beta1, m), mul_rn(s.one_minus_beta1, g));
  v = add_rn(mul_rn(s.beta2, v), mul_rn(s.one_minus_beta2, mul_rn(g, g)));
  const float update = add_rn(div_rn(div_rn(m, s.bias1), add_rn(sqrt_rn(div_rn(v, s.bias2)), s.eps)),
                              mul_rn(s.weight_decay, p));
  p = sub_rn(p, mul_rn(s.lr, update));
}

}  // namespace lockstep
