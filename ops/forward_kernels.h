// ops/forward_kernels.h — which kernels the CUDA forward ops run: the fast set (the default), or
// the exact set, under which the rollout engine's forward (prefill chunks, decode steps) and the
// training forward compute every row with the same kernels in the same summation order, so that a
// sampled token's logprob is the training forward's bit for bit (rollout.exact, cli/config.h).
//
// What the exact set changes, each because the fast kernel's order depends on the batch or the
// caller (docs/benchmarks.md, "Rollout = training on the GPU"):
//   - training attention (attention_forward): lockstep's own kernel, not cuDNN's SDPA, whose
//     summation order is its own and not the paged kernels';
//   - paged attention of decode steps (one row a sequence): decode_exact_kernel
//     (ops/cuda/attention.cu), which walks the keys in the training forward's tiles and order, not
//     the split-context decode kernel;
//   - bf16 FProp on cuBLASLt: one algorithm per weight shape at every T, without split-K
//     (cuBLASLt picks per shape, T included, and splits K for few rows, so a row's sum
//     would depend on how many rows share the GEMM; ops/cuda/gemm.cu, make_exact_plan), and the
//     rollout's logits (lm_head_logits) made in the training forward's vocabulary chunks;
//   - fp8 FProp: the batch-invariant kernel (ops/cuda/gemm_fp8_small_t.h) at every T, not cuBLASLt
//     or the small-T kernel chosen by T.
// Backward kernels are unchanged (only the forwards must agree), except the training attention's,
// which follows its forward (lockstep's own backward reads the own forward's log-sum-exp). The
// cost is measured in docs/benchmarks.md (slower decoding at small batches, a slower fp8 training
// forward).
//
// The CPU backend is exact always (each op computes a row the same way whatever the batch); the
// setting changes nothing there.
#pragma once

namespace lockstep {

// Process-wide; the program sets it before its first forward. Default off.
void set_exact_forward(bool on);
bool exact_forward();

// set_exact_forward(true) for its lifetime, then the setting it found (tests).
class ExactForwardScope {
 public:
  ExactForwardScope() : previous_(exact_forward()) { set_exact_forward(true); }
  ~ExactForwardScope() { set_exact_forward(previous_); }
  ExactForwardScope(const ExactForwardScope&) = delete;
  ExactForwardScope& operator=(const ExactForwardScope&) = delete;

 private:
  bool previous_;
};

}  // namespace lockstep
