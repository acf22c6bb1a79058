// ops/cpu/qkv_rope.cpp — CPU reference for ops/qkv_rope.h. Rows are independent: each row reads
// its heads into fp32 buffers, computes its rotation angles once for all its q and k heads, and
// writes back rounded once. The norm weight gradients are summed per row first, then over the rows
// in order, so they do not depend on the thread count.
#include <cmath>
#include <vector>

#include "ops/cpu/act.h"
#include "ops/cpu/rms_row.h"
#include "ops/qkv_rope_backends.h"

namespace lockstep::cpu {

namespace {

// cos and sin of the rotation angles of one position, as the contract in ops/qkv_rope.h states.
void rope_angles(int32_t position, const float* inv_freq, int64_t half, float* c, float* s) {
  for (int64_t i = 0; i < half; ++i) {
    const float angle = float(position) * inv_freq[i];
    c[i] = float(std::cos(double(angle)));
    s[i] = float(std::sin(double(angle)));
  }
}

// (x[i], x[i + half]) -> (x[i]·c − x[i + half]·s, x[i + half]·c + x[i]·s). The backward passes
// −sin: the transposed rotation, bit for bit the same expression with s negated.
void rotate(float* x, const float* c, const float* s, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * c[i] - b * s[i];
    x[i + half] = b * c[i] + a * s[i];
  }
}

}  // namespace

void qkv_rope_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& positions,
                      const Tensor& inv_freq, const Tensor& q_norm, const Tensor& k_norm,
                      const HeadLayout& layout, float eps) {
  const int64_t T = qkv.dim(0), width = layout.qkv_width(), d = layout.head_dim, half = d / 2;
  // q heads, then k heads: head k of the row starts at column k·d.
  const int64_t qk_heads = layout.q_heads + layout.kv_heads;
  const bool norm = q_norm.defined();
  const int32_t* pos = positions.data_as<int32_t>();
  const float* freq = inv_freq.data_as<float>();
  const float* qw = norm ? q_norm.data_as<float>() : nullptr;
  const float* kw = norm ? k_norm.data_as<float>() : nullptr;
  float* rs = norm ? rstd.data_as<float>() : nullptr;
#pragma omp parallel
  {
    std::vector<float> x(layout.kv_width()), c(half), s(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      rope_angles(pos[t], freq, half, c.data(), s.data());
      for (int64_t k = 0; k < qk_heads; ++k) {
        const int64_t offset = t * width + k * d;
        read_f32(qkv, offset, d, x.data());
        if (norm) {
          rs[t * qk_heads + k] = rms_normalize(x.data(), k < layout.q_heads ? qw : kw, d, eps);
        }
        rotate(x.data(), c.data(), s.data(), half);
        write_f32(out, offset, d, x.data());
      }
      const int64_t v = t * width + layout.v_offset();
      read_f32(qkv, v, layout.kv_width(), x.data());
      write_f32(out, v, layout.kv_width(), x.data());
    }
  }
}

void qkv_rope_backward(Tensor& dqkv, Tensor& dq_norm, Tensor& dk_norm, const Tensor& dout,
                       const Tensor& qkv, const Tensor& positions, const Tensor& inv_freq,
                       const Tensor& q_norm, const Tensor& k_norm, const Tensor& rstd,
                       const HeadLayout& layout) {
  const int64_t T = qkv.dim(0), width = layout.qkv_width(), d = layout.head_dim, half = d / 2;
  const int64_t qk_heads = layout.q_heads + layout.kv_heads;
  const bool norm = q_norm.defined();
  const int32_t* pos = positions.data_as<int32_t>();
  const float* freq = inv_freq.data_as<float>();
  const float* qw = norm ? q_norm.data_as<float>() : nullptr;
  const float* kw = norm ? k_norm.data_as<float>() : nullptr;
  const float* rs = norm ? rstd.data_as<float>() : nullptr;
  // Per row: Σ over its q heads (then its k heads) of dy · x̂, reduced over the rows afterwards.
  std::vector<float> dw_rows(norm ? size_t(T * 2 * d) : 0);
#pragma omp parallel
  {
    std::vector<float> g(layout.kv_width()), x(d);
    std::vector<float> c(half), minus_s(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      rope_angles(pos[t], freq, half, c.data(), minus_s.data());
      for (float& v : minus_s) v = -v;
      for (int64_t k = 0; k < qk_heads; ++k) {
        const int64_t offset = t * width + k * d;
        read_f32(dout, offset, d, g.data());
        rotate(g.data(), c.data(), minus_s.data(), half);  // g: gradient of the normalized head
        if (norm) {
          const bool is_q = k < layout.q_heads;
          read_f32(qkv, offset, d, x.data());
          rms_normalize_backward(x.data(), g.data(), is_q ? qw : kw, d, rs[t * qk_heads + k],
                                 &dw_rows[size_t((2 * t + (is_q ? 0 : 1)) * d)]);
        }
        write_f32(dqkv, offset, d, g.data());
      }
      const int64_t v = t * width + layout.v_offset();
      read_f32(dout, v, layout.kv_width(), g.data());
      write_f32(dqkv, v, layout.kv_width(), g.data());
    }
  }
  if (!norm) return;
  float* dq = dq_norm.data_as<float>();
  float* dk = dk_norm.data_as<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) {
      dq[i] += dw_rows[size_t((2 * t) * d + i)];
      dk[i] += dw_rows[size_t((2 * t + 1) * d + i)];
    }
}

}  // namespace lockstep::cpu
