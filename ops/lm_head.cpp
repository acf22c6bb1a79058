// ops/lm_head.cpp — argument checks and backend dispatch for ops/lm_head.h.
#include "ops/lm_head.h"

#include <cmath>

#include "ops/act_check.h"
#include "ops/lm_head_backends.h"

namespace lockstep {

namespace {

// h [T, H] and w [V, H] activations (f32 or bf16) on one device, H > 0, V > 0.
void check_h_w(const char* op, const Tensor& h, const Tensor& w) {
  const std::string h_what = std::string(op) + ": h", w_what = std::string(op) + ": w";
  check_act(h, h_what.c_str(), h.device(), h.shape());
  LOCKSTEP_CHECK(h.rank() == 2 && h.dim(1) > 0, h_what,
                 ": expected a 2-D tensor [T, H] with H > 0, got ", h.describe());
  check_act(w, w_what.c_str(), h.device(), w.shape());
  LOCKSTEP_CHECK(w.rank() == 2 && w.dim(0) > 0 && w.dim(1) == h.dim(1), w_what,
                 ": expected a 2-D tensor [V, ", h.dim(1), "] with V > 0, got ", w.describe());
}

// An f32 [T] per-token tensor.
void check_per_token(const char* op, const char* name, const Tensor& t, int64_t T, Device d) {
  const std::string what = std::string(op) + ": " + name;
  check_tensor(t, what.c_str(), DType::f32, d);
  check_shape(t, what.c_str(), {T});
}

// targets: i32 [T] in [0, V). The range is checked on host memory only.
void check_targets(const char* op, const Tensor& targets, int64_t T, int64_t V, Device d) {
  const std::string what = std::string(op) + ": targets";
  check_tensor(targets, what.c_str(), DType::i32, d);
  check_shape(targets, what.c_str(), {T});
  if (d == Device::cuda) return;
  const int32_t* tok = targets.data_as<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    LOCKSTEP_CHECK(tok[t] >= 0 && tok[t] < V, op, ": targets[", t, "] = ", tok[t],
                   " is outside the vocabulary [0, ", V, ")");
}

// kept_logits: f32 [T·V] on device d (ops/lm_head.h's chunk-major layout), or null.
void check_kept_logits(const char* op, const Tensor* kept, int64_t T, int64_t V, Device d) {
  if (!kept) return;
  const std::string what = std::string(op) + ": kept_logits";
  check_tensor(*kept, what.c_str(), DType::f32, d);
  check_shape(*kept, what.c_str(), {T * V});
}

void check_temperature(const char* op, float temperature) {
  LOCKSTEP_CHECK(std::isfinite(temperature) && temperature > 0, op,
                 ": temperature must be finite and > 0, got ", temperature);
}

// The CUDA backend runs the bf16 recipe only (its GEMMs take bf16 operands).
void check_cuda_bf16(const char* op, const Tensor& h, const Tensor& w) {
  LOCKSTEP_CHECK(h.dtype() == DType::bf16 && w.dtype() == DType::bf16, op,
                 ": on CUDA h and w must be bf16, got h ", h.describe(), " and w ", w.describe());
}

#if LOCKSTEP_HAS_CUDA
#define LOCKSTEP_ON_CUDA(name, call) return call
#else
#define LOCKSTEP_ON_CUDA(name, call) LOCKSTEP_NO_CUDA_OP(name)
#endif

}  // namespace

void lm_head_logprob_forward(Tensor& logprob, Tensor& entropy, Tensor& lse, const Tensor& h,
                             const Tensor& w, const Tensor& targets, float temperature,
                             Tensor* kept_logits) {
  const char* op = "lm_head_logprob_forward";
  check_h_w(op, h, w);
  const int64_t T = h.dim(0), V = w.dim(0);
  const Device d = h.device();
  check_per_token(op, "logprob", logprob, T, d);
  check_per_token(op, "entropy", entropy, T, d);
  check_per_token(op, "lse", lse, T, d);
  check_temperature(op, temperature);
  check_targets(op, targets, T, V, d);
  check_kept_logits(op, kept_logits, T, V, d);
  if (d == Device::cuda) {
    check_cuda_bf16(op, h, w);
    LOCKSTEP_ON_CUDA("lm_head_logprob_forward",
                     cuda::lm_head_logprob_forward(logprob, entropy, lse, h, w, targets, temperature,
                                                   kept_logits));
  }
  cpu::lm_head_logprob_forward(logprob, entropy, lse, h, w, targets, temperature, kept_logits);
}

void lm_head_logprob_backward(Tensor& dh, Tensor& dw, const Tensor& dlogprob,
                              const Tensor& dentropy, const Tensor& h, const Tensor& w,
                              const Tensor& targets, const Tensor& lse, const Tensor& entropy,
                              float temperature, const Tensor* kept_logits) {
  const char* op = "lm_head_logprob_backward";
  check_h_w(op, h, w);
  const int64_t T = h.dim(0), V = w.dim(0);
  const Device d = h.device();
  check_act(dh, "lm_head_logprob_backward: dh", d, h.shape());
  check_tensor(dw, "lm_head_logprob_backward: dw", DType::f32, d);
  check_shape(dw, "lm_head_logprob_backward: dw", w.shape());
  if (dlogprob.defined()) check_per_token(op, "dlogprob", dlogprob, T, d);
  if (dentropy.defined()) check_per_token(op, "dentropy", dentropy, T, d);
  check_per_token(op, "lse", lse, T, d);
  check_per_token(op, "entropy", entropy, T, d);
  check_temperature(op, temperature);
  check_targets(op, targets, T, V, d);
  check_kept_logits(op, kept_logits, T, V, d);
  if (d == Device::cuda) {
    check_cuda_bf16(op, h, w);
    LOCKSTEP_ON_CUDA("lm_head_logprob_backward",
                     cuda::lm_head_logprob_backward(dh, dw, dlogprob, dentropy, h, w, targets, lse,
                                                    entropy, temperature, kept_logits));
  }
  cpu::lm_head_logprob_backward(dh, dw, dlogprob, dentropy, h, w, targets, lse, entropy,
                                temperature, kept_logits);
}

void lm_head_logits(Tensor& logits, const Tensor& h, const Tensor& w) {
  check_h_w("lm_head_logits", h, w);
  check_tensor(logits, "lm_head_logits: logits", DType::f32, h.device());
  check_shape(logits, "lm_head_logits: logits", {h.dim(0), w.dim(0)});
  if (h.is_cuda()) {
    check_cuda_bf16("lm_head_logits", h, w);
    LOCKSTEP_ON_CUDA("lm_head_logits", cuda::lm_head_logits(logits, h, w));
  }
  cpu::lm_head_logits(logits, h, w);
}

void logits_logprob(Tensor& logprob, Tensor& entropy, const Tensor& logits, const Tensor& targets,
                    float temperature) {
  const char* op = "logits_logprob";
  check_tensor(logits, "logits_logprob: logits", DType::f32, logits.device());
  LOCKSTEP_CHECK(logits.rank() == 2 && logits.dim(1) > 0,
                 "logits_logprob: logits: expected a 2-D tensor [T, V] with V > 0, got ",
                 logits.describe());
  const int64_t T = logits.dim(0), V = logits.dim(1);
  const Device d = logits.device();
  check_per_token(op, "logprob", logprob, T, d);
  check_per_token(op, "entropy", entropy, T, d);
  check_temperature(op, temperature);
  check_targets(op, targets, T, V, d);
  if (d == Device::cuda)
    LOCKSTEP_ON_CUDA("logits_logprob",
                     cuda::logits_logprob(logprob, entropy, logits, targets, temperature));
  cpu::logits_logprob(logprob, entropy, logits, targets, temperature);
}

}  // namespace lockstep
