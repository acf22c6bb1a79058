// ops/forward_kernels.h — which kernels the CUDA forward ops run: the fast set (the default), or
// the exact set, under which the rollout engine's forward (prefill chunks, decode steps) and the
// training forward compute every row with the same kernels in the same summation order, so that a
// sampled token's logprob is the training forward's bit for bit (rollout.exact, cli/config.h).
//
// What the exact set changes, each because the fast kernel's order depends on the batch or the
// caller (docs/benchmarks.md, "Rollout = training on the GPU"):
//   - training attention (attention_forward): lockstep's own kernel, not cuDNN's SDPA, whose
//     summation order is its own and not the paged kernels';
//   - paged attention of decode steps (one row a sequence): the prefill kernel, which the training
//     forward's own kernel matches, not the split-context decode kernel (another key order);
//   - cuBLASLt GEMMs: only algorithms without split-K (cuBLASLt splits K for few rows, so a row's
//     sum would depend on how many rows share the GEMM); a shape's plan is kept per setting;
//   - fp8 FProp/DGrad: cuBLASLt for every token count, never the small-T kernel (another K order).
// cuBLASLt has no block-scaled fp8 algorithm without split-K for some few-row shapes: there an
// fp8 GEMM fails, naming the shape.
//
// The CPU backend is exact always (each op computes a row the same way whatever the batch); the
// setting changes nothing there.
#pragma once

namespace lockstep {

// Process-wide; the program sets it before its first forward. Default off.
void set_exact_forward(bool on);
bool exact_forward();

}  // namespace lockstep
