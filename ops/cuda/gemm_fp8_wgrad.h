// ops/cuda/gemm_fp8_wgrad.h — the fp8 WGrad of ops/gemm.h on a kernel of ours (sm_90a):
//
//   dw [N, K] (+)= Σ_kb (Σ_{t in token block kb} dy_t[n, t] · x_t[k, t]) · sdy[kb, n] · sx[kb, k]
//
// dy_t, x_t: the columnwise Fp8Rows of dy [T, N] and x [T, K] (numerics/quantize.h): e4m3 [N, Tp]
// and [K, Tp], f32 scales [Tp/128, N] and [Tp/128, K]. Like the CPU reference, every 128-token
// block is summed in fp32 (wgmma on e4m3, with the precision of Hopper's fp8 tensor cores, as
// cuBLASLt), multiplied by its two scales and added to an fp32 accumulator started at 0, which
// accumulate then adds to dw. Deterministic: each element is summed by one thread in a fixed order, so
// two calls give the same bits.
//
// Requirements (a clear error otherwise): N, K and Tp multiples of 128; data, scales and dw
// 16-byte aligned. ops/cuda/gemm.cu picks this kernel or cuBLASLt per shape
// (gemm_set_fp8_wgrad in ops/gemm_backends.h); benches time the variants directly.
#pragma once

#include "core/tensor.h"
#include "numerics/quantize.h"

namespace lockstep::cuda {

// Tuning variants (output tile, partial sums in flight, pipeline stages); 0 is what the dispatch
// runs. Benches time each.
constexpr int kFp8WgradVariants = 7;
const char* fp8_wgrad_variant_name(int variant);

void gemm_fp8_wgrad(Tensor& dw, const Fp8Rows& dy_t, const Fp8Rows& x_t, bool accumulate, int variant = 0);

}  // namespace lockstep::cuda
