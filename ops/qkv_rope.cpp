// ops/qkv_rope.cpp — argument checks and backend dispatch for ops/qkv_rope.h, and rope_inv_freq.
#include "ops/qkv_rope.h"

#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"
#include "ops/act_check.h"
#include "ops/attention.h"
#include "ops/qkv_rope_backends.h"

namespace lockstep {

namespace {

// Checks the inputs both directions share; returns T. `op` prefixes every message.
int64_t check_inputs(const std::string& op, const Tensor& qkv, const Tensor& positions,
                     const Tensor& inv_freq, const Tensor& q_norm, const Tensor& k_norm,
                     const HeadLayout& layout) {
  check_head_layout(layout);
  const Device device = qkv.device();
  check_tensor(positions, (op + ": positions").c_str(), DType::i32, device);
  LOCKSTEP_CHECK(positions.rank() == 1, op, ": positions: expected a 1-D [T] tensor, got ",
                 positions.describe());
  const int64_t T = positions.dim(0);
  check_act(qkv, (op + ": qkv").c_str(), device, {T, layout.qkv_width()});
  check_tensor(inv_freq, (op + ": inv_freq").c_str(), DType::f32, device);
  check_shape(inv_freq, (op + ": inv_freq").c_str(), {layout.head_dim / 2});
  LOCKSTEP_CHECK(q_norm.defined() == k_norm.defined(), op,
                 ": q_norm and k_norm must both be given or both be empty (no q/k norm)");
  if (q_norm.defined()) {
    check_tensor(q_norm, (op + ": q_norm").c_str(), DType::f32, device);
    check_shape(q_norm, (op + ": q_norm").c_str(), {layout.head_dim});
    check_tensor(k_norm, (op + ": k_norm").c_str(), DType::f32, device);
    check_shape(k_norm, (op + ": k_norm").c_str(), {layout.head_dim});
  }
  return T;
}

void check_rstd(const std::string& op, const Tensor& rstd, Device device, int64_t T,
                const HeadLayout& layout) {
  check_tensor(rstd, (op + ": rstd").c_str(), DType::f32, device);
  check_shape(rstd, (op + ": rstd").c_str(), {T, layout.q_heads + layout.kv_heads});
}

// CPU tensors only: reading CUDA positions on the host would need a sync (the kernels turn a
// negative position into NaN instead).
void check_positions(const std::string& op, const Tensor& positions) {
  const int32_t* p = positions.data_as<int32_t>();
  for (int64_t t = 0; t < positions.dim(0); ++t)
    LOCKSTEP_CHECK(p[t] >= 0, op, ": positions: must be >= 0, got ", p[t], " at row ", t);
}

void check_forward(const Tensor& out, const Tensor& rstd, const Tensor& qkv, const Tensor& positions,
                   const Tensor& inv_freq, const Tensor& q_norm, const Tensor& k_norm,
                   const HeadLayout& layout) {
  const std::string op = "qkv_rope_forward";
  const int64_t T = check_inputs(op, qkv, positions, inv_freq, q_norm, k_norm, layout);
  check_act(out, "qkv_rope_forward: out", qkv.device(), {T, layout.qkv_width()});
  if (q_norm.defined()) check_rstd(op, rstd, qkv.device(), T, layout);
}

}  // namespace

void qkv_rope_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& positions,
                      const Tensor& inv_freq, const Tensor& q_norm, const Tensor& k_norm,
                      const HeadLayout& layout, float eps) {
  check_forward(out, rstd, qkv, positions, inv_freq, q_norm, k_norm, layout);
  if (qkv.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    return cuda::qkv_rope_forward(out, rstd, qkv, positions, inv_freq, q_norm, k_norm, layout, eps);
#else
    LOCKSTEP_NO_CUDA_OP("qkv_rope_forward");
#endif
  }
  check_positions("qkv_rope_forward", positions);
  cpu::qkv_rope_forward(out, rstd, qkv, positions, inv_freq, q_norm, k_norm, layout, eps);
}

void qkv_rope_forward(Tensor& out, Tensor& rstd, const PagedKv& cache, const Tensor& slots, const Tensor& qkv,
                      const Tensor& positions, const Tensor& inv_freq, const Tensor& q_norm,
                      const Tensor& k_norm, const HeadLayout& layout, float eps) {
  if (!qkv.is_cuda()) {  // the composition, which the CUDA kernel's bytes equal
    qkv_rope_forward(out, rstd, qkv, positions, inv_freq, q_norm, k_norm, layout, eps);
    kv_cache_write(cache, out, slots, layout);
    return;
  }
  check_forward(out, rstd, qkv, positions, inv_freq, q_norm, k_norm, layout);
  check_kv_cache_write(cache, out, slots, layout);
#if LOCKSTEP_HAS_CUDA
  const cuda::KvCacheOut cache_out{cache, slots};
  cuda::qkv_rope_forward(out, rstd, qkv, positions, inv_freq, q_norm, k_norm, layout, eps, &cache_out);
#else
  LOCKSTEP_NO_CUDA_OP("qkv_rope_forward");
#endif
}

void qkv_rope_backward(Tensor& dqkv, Tensor& dq_norm, Tensor& dk_norm, const Tensor& dout,
                       const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq,
                       const Tensor& q_norm, const Tensor& k_norm, const Tensor& rstd,
                       const HeadLayout& layout) {
  const std::string op = "qkv_rope_backward";
  const int64_t T = check_inputs(op, qkv, positions, inv_freq, q_norm, k_norm, layout);
  const Device device = qkv.device();
  check_act(dout, "qkv_rope_backward: dout", device, {T, layout.qkv_width()});
  check_act(dqkv, "qkv_rope_backward: dqkv", device, {T, layout.qkv_width()});
  if (q_norm.defined()) {
    check_rstd(op, rstd, device, T, layout);
    check_tensor(dq_norm, "qkv_rope_backward: dq_norm", DType::f32, device);
    check_shape(dq_norm, "qkv_rope_backward: dq_norm", {layout.head_dim});
    check_tensor(dk_norm, "qkv_rope_backward: dk_norm", DType::f32, device);
    check_shape(dk_norm, "qkv_rope_backward: dk_norm", {layout.head_dim});
  }
  if (device == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    return cuda::qkv_rope_backward(dqkv, dq_norm, dk_norm, dout, qkv, positions, inv_freq, q_norm,
                                   k_norm, rstd, layout);
#else
    LOCKSTEP_NO_CUDA_OP("qkv_rope_backward");
#endif
  }
  check_positions(op, positions);
  cpu::qkv_rope_backward(dqkv, dq_norm, dk_norm, dout, qkv, positions, inv_freq, q_norm, k_norm,
                         rstd, layout);
}

Tensor rope_inv_freq(int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling) {
  LOCKSTEP_CHECK(head_dim > 0 && head_dim % 2 == 0,
                 "rope_inv_freq: head_dim must be positive and even, got ", head_dim);
  LOCKSTEP_CHECK(std::isfinite(theta) && theta > 0,
                 "rope_inv_freq: rope_theta must be positive, got ", theta);
  const int64_t half = head_dim / 2;
  Tensor t = Tensor::empty({half}, DType::f32);
  float* inv = t.data_as<float>();
  // transformers: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all fp32: the base and
  // the exponent are fp32, and 1.0 / x is torch's reciprocal (an fp32 division). The fp32 pow is
  // computed in double and rounded once, i.e. correctly rounded. torch's own fp32 pow is SLEEF's
  // (≤ 1 ulp, and its SSE, AVX2 and AVX-512 builds disagree among themselves in the last bit),
  // glibc's powf is not correctly rounded either: no fp32 pow gives "HF's" bits on every machine,
  // and each differs from the correctly rounded value in the last bit for a few exponents in a
  // hundred at most. The correctly rounded value is the one any device can reproduce.
  const float base = float(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = float(2 * i) / float(head_dim);
    inv[i] = 1.0f / float(std::pow(double(base), double(exponent)));
  }
  if (!scaling) return t;

  // transformers' _compute_llama3_parameters, step by step in fp32 as torch evaluates it: Python
  // scalars become fp32 operands, `a / tensor` is reciprocal(tensor) · a.
  const RopeScaling& s = *scaling;
  LOCKSTEP_CHECK(s.factor > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                     s.original_max_position_embeddings > 0,
                 "rope_inv_freq: llama3 rope_scaling needs factor > 0, high_freq_factor > "
                 "low_freq_factor > 0 and original_max_position_embeddings > 0");
  const float factor = float(s.factor);
  const float old_context_len = float(s.original_max_position_embeddings);
  const float low_freq_wavelen = float(s.original_max_position_embeddings / s.low_freq_factor);
  const float high_freq_wavelen = float(s.original_max_position_embeddings / s.high_freq_factor);
  const float low_freq_factor = float(s.low_freq_factor);
  const float factor_span = float(s.high_freq_factor - s.low_freq_factor);
  const float two_pi = float(2 * std::numbers::pi);
  for (int64_t i = 0; i < half; ++i) {
    const float wavelen = (1.0f / inv[i]) * two_pi;
    if (wavelen > low_freq_wavelen) {
      inv[i] = inv[i] / factor;
    } else if (!(wavelen < high_freq_wavelen)) {
      const float smooth = ((1.0f / wavelen) * old_context_len - low_freq_factor) / factor_span;
      inv[i] = (1.0f - smooth) * inv[i] / factor + smooth * inv[i];
    }
  }
  return t;
}

}  // namespace lockstep
