// ops/cpu/attention.cpp — CPU reference for ops/attention.h.
//
// Work is split into (sequence, kv head) tasks. A task widens the keys and values of its context to
// fp32 once (Context), then runs every query row of the kv head's group through attend_row. The
// training forward reads the context from the packed qkv rows, the paged path through the block
// table; both land in the same fp32 buffers and go through the same code, so a row's bits depend
// only on its query and its context's k/v values, never on where they came from or on the batch.
// Each task writes disjoint outputs (the backward accumulates dK and dV of its kv head over the
// group's q heads in a fixed order), so the results do not depend on the OpenMP schedule.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "ops/attention_backends.h"
#include "ops/cpu/act.h"
#include "ops/cpu/kv_fp8.h"

namespace lockstep::cpu {

namespace {

// Keys are processed in blocks of kKeys and head columns in blocks of up to kCols: a block's sums
// stay in registers while the loop runs over the other index. Blocking never changes a result:
// every sum runs over its own index in order (with an FMA per term), whatever the block, the
// context length or the padding.
constexpr int64_t kKeys = 32, kCols = 64;

int64_t padded(int64_t n) { return (n + kKeys - 1) / kKeys * kKeys; }

// out[j] = Σ_c x[c] · mt[c·stride + j] for j < padded(n) (mt: d rows of `stride` ≥ padded(n)).
// Even and odd c go to two sums, added at the end: twice the FMA chains in flight.
void column_dots(const float* x, const float* mt, int64_t stride, int64_t d, int64_t n,
                 float* out) {
  for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
    float even[kKeys] = {}, odd[kKeys] = {};
    for (int64_t c = 0; c < d; c += 2) {  // head_dim is even (ops/head_layout.h)
      const float x0 = x[c], x1 = x[c + 1];
      const float* m0 = mt + c * stride + j0;
      const float* m1 = m0 + stride;
      for (int64_t l = 0; l < kKeys; ++l) {
        even[l] = std::fma(x0, m0[l], even[l]);
        odd[l] = std::fma(x1, m1[l], odd[l]);
      }
    }
    for (int64_t l = 0; l < kKeys; ++l) out[j0 + l] = even[l] + odd[l];
  }
}

// o[c0 + l] = Σ_j p[j] · rows[j·d + c0 + l] for l < W, j < n.
template <int64_t W>
void combine_columns(const float* p, const float* rows, int64_t n, int64_t d, int64_t c0,
                     float* o) {
  float acc[W] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* r = rows + j * d + c0;
    for (int64_t l = 0; l < W; ++l) acc[l] = std::fma(pj, r[l], acc[l]);
  }
  std::copy(acc, acc + W, o + c0);
}

// o[c] = Σ_j p[j] · rows[j·d + c] for j < n.
void row_combination(const float* p, const float* rows, int64_t n, int64_t d, float* o) {
  int64_t c = 0;
  for (; c + kCols <= d; c += kCols) combine_columns<kCols>(p, rows, n, d, c, o);
  for (; c + 8 <= d; c += 8) combine_columns<8>(p, rows, n, d, c, o);
  for (; c < d; ++c) combine_columns<1>(p, rows, n, d, c, o);
}

// fp32 keys and values of context positions 0..n−1 of one kv head. Keys are stored transposed,
// kt[c·stride + j] with the rows padded with zeros to a whole number of key blocks, so the scores
// of a block of keys are computed together without horizontal reductions.
struct Context {
  int64_t d = 0, stride = 0;
  std::vector<float> kt, v;  // kt: [d, stride]; v: [n, d]

  // read(p, k, v) puts position p's key and value (d floats each) in k and v.
  template <class Read>
  void load(int64_t n, int64_t head_dim, Read read) {
    d = head_dim;
    stride = padded(n);
    kt.assign(size_t(d * stride), 0.0f);
    v.resize(size_t(n * d));
    std::vector<float> k(d);
    for (int64_t p = 0; p < n; ++p) {
      read(p, k.data(), &v[size_t(p * d)]);
      for (int64_t c = 0; c < d; ++c) kt[size_t(c * stride + p)] = k[size_t(c)];
    }
  }
};

// s[j] = (q · k_j) · scale for keys j < n. s: padded(n) floats.
void scores(const float* q, const Context& ctx, int64_t n, float scale, float* s) {
  column_dots(q, ctx.kt.data(), ctx.stride, ctx.d, n, s);
  for (int64_t j = 0; j < n; ++j) s[j] *= scale;
}

// One query row against context keys 0..n−1 (ops/attention.h's math): writes o [d], returns lse.
// s: scratch of padded(n) floats.
float attend_row(const float* q, const Context& ctx, int64_t n, float scale, float* s, float* o) {
  scores(q, ctx, n, scale, s);
  float max_s = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) max_s = std::max(max_s, s[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - max_s);
    sum += s[j];
  }
  row_combination(s, ctx.v.data(), n, ctx.d, o);
  for (int64_t c = 0; c < ctx.d; ++c) o[c] = o[c] / sum;
  return max_s + std::log(sum);
}

// 1/sqrt(head_dim) rounded once; the scores are multiplied by it (exact when head_dim is a power
// of 4, e.g. 64).
float softmax_scale(const HeadLayout& layout) {
  return float(1.0 / std::sqrt(double(layout.head_dim)));
}

// Loads sequence [t0, t0 + n) of the packed qkv rows as kv head g's context.
void load_packed(Context& ctx, const Tensor& qkv, int64_t t0, int64_t n, int64_t g,
                 const HeadLayout& layout) {
  const int64_t width = layout.qkv_width(), d = layout.head_dim;
  ctx.load(n, d, [&](int64_t p, float* k, float* v) {
    const int64_t row = (t0 + p) * width + g * d;
    read_f32(qkv, row + layout.k_offset(), d, k);
    read_f32(qkv, row + layout.v_offset(), d, v);
  });
}

// Head g of a cache slot: read (bf16/f32), or dequantized (e4m3: ops/kv_fp8.h) in `dtype`, the
// activations'.
void read_cached(const PagedKv& cache, int64_t slot, int64_t g, int64_t d, DType dtype, float* k, float* v) {
  const int64_t head = slot * cache.k.dim(2) + g, offset = head * d;
  if (!cache.fp8()) {
    read_f32(cache.k, offset, d, k);
    read_f32(cache.v, offset, d, v);
    return;
  }
  dequantize_kv_head(static_cast<const uint8_t*>(cache.k.data()) + offset, cache.k_scale.data_as<float>()[head], d, dtype, k);
  dequantize_kv_head(static_cast<const uint8_t*>(cache.v.data()) + offset, cache.v_scale.data_as<float>()[head], d, dtype, v);
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                       const HeadLayout& layout) {
  const int32_t* cu = cu_seqlens.data_as<int32_t>();
  const int64_t S = cu_seqlens.dim(0) - 1, d = layout.head_dim, width = layout.qkv_width();
  const int64_t tasks = S * layout.kv_heads, group = layout.group();
  const float scale = softmax_scale(layout);
  float* lse_out = lse.data_as<float>();
#pragma omp parallel
  {
    Context ctx;
    std::vector<float> q(d), o(d), s;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t seq = task / layout.kv_heads, g = task % layout.kv_heads;
      const int64_t t0 = cu[seq], n = cu[seq + 1] - t0;
      load_packed(ctx, qkv, t0, n, g, layout);
      s.resize(size_t(ctx.stride));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const int64_t t = t0 + i;
          read_f32(qkv, t * width + h * d, d, q.data());
          lse_out[t * layout.q_heads + h] =
              attend_row(q.data(), ctx, i + 1, scale, s.data(), o.data());
          write_f32(out, t * layout.q_width() + h * d, d, o.data());
        }
    }
  }
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const HeadLayout& layout) {
  const int32_t* cu = cu_seqlens.data_as<int32_t>();
  const int64_t S = cu_seqlens.dim(0) - 1, d = layout.head_dim, width = layout.qkv_width();
  const int64_t tasks = S * layout.kv_heads, group = layout.group();
  const float scale = softmax_scale(layout);
  const float* lse_in = lse.data_as<float>();
#pragma omp parallel
  {
    Context ctx;
    std::vector<float> k, vt, dk, dv;  // [n, d], [d, stride] (zero padded), [n, d], [n, d]
    std::vector<float> q(d), dout_row(d), o(d), dq(d);
    std::vector<float> p, dp, ds;  // [stride]
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t seq = task / layout.kv_heads, g = task % layout.kv_heads;
      const int64_t t0 = cu[seq], n = cu[seq + 1] - t0;
      load_packed(ctx, qkv, t0, n, g, layout);
      const int64_t stride = ctx.stride;
      k.resize(size_t(n * d));
      vt.assign(size_t(d * stride), 0.0f);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < d; ++c) {
          k[size_t(j * d + c)] = ctx.kt[size_t(c * stride + j)];
          vt[size_t(c * stride + j)] = ctx.v[size_t(j * d + c)];
        }
      dk.assign(size_t(n * d), 0.0f);
      dv.assign(size_t(n * d), 0.0f);
      p.resize(size_t(stride));
      dp.resize(size_t(stride));
      ds.resize(size_t(stride));
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = t0 + i, len = i + 1;
          read_f32(qkv, t * width + h * d, d, q.data());
          read_f32(dout, t * layout.q_width() + h * d, d, dout_row.data());
          read_f32(out, t * layout.q_width() + h * d, d, o.data());
          const float row_lse = lse_in[t * layout.q_heads + h];
          float D = 0.0f;  // rowsum(dO ⊙ O)
          for (int64_t c = 0; c < d; ++c) D += dout_row[c] * o[c];
          // P from the forward's scores and the saved lse; dP = dO · Vᵀ; dS = P ⊙ (dP − D).
          scores(q.data(), ctx, len, scale, p.data());
          column_dots(dout_row.data(), vt.data(), stride, d, len, dp.data());
          for (int64_t j = 0; j < len; ++j) {
            p[j] = std::exp(p[j] - row_lse);
            ds[j] = p[j] * (dp[j] - D);
          }
          row_combination(ds.data(), k.data(), len, d, dq.data());
          for (float& x : dq) x *= scale;
          write_f32(dqkv, t * width + h * d, d, dq.data());
          for (int64_t j = 0; j < len; ++j) {
            float* dkj = &dk[size_t(j * d)];
            float* dvj = &dv[size_t(j * d)];
            for (int64_t c = 0; c < d; ++c) {
              dkj[c] = std::fma(ds[j], q[c], dkj[c]);
              dvj[c] = std::fma(p[j], dout_row[c], dvj[c]);
            }
          }
        }
      for (float& x : dk) x *= scale;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = (t0 + j) * width + g * d;
        write_f32(dqkv, row + layout.k_offset(), d, &dk[size_t(j * d)]);
        write_f32(dqkv, row + layout.v_offset(), d, &dv[size_t(j * d)]);
      }
    }
  }
}

void kv_cache_write(const PagedKv& cache, const Tensor& qkv, const Tensor& slots, const HeadLayout& layout) {
  const int64_t T = qkv.dim(0), kv_width = layout.kv_width(), width = layout.qkv_width();
  const int64_t d = layout.head_dim;
  const int32_t* slot = slots.data_as<int32_t>();
#pragma omp parallel
  {
    std::vector<float> x(kv_width);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int kv = 0; kv < 2; ++kv) {  // k, then v
        Tensor dst = kv == 0 ? cache.k : cache.v;  // a handle: writes go to the cache
        read_f32(qkv, t * width + (kv == 0 ? layout.k_offset() : layout.v_offset()), kv_width, x.data());
        if (!cache.fp8()) {
          write_f32(dst, slot[t] * kv_width, kv_width, x.data());
          continue;
        }
        float* scales = (kv == 0 ? cache.k_scale : cache.v_scale).data_as<float>();
        for (int64_t g = 0; g < layout.kv_heads; ++g)
          scales[slot[t] * layout.kv_heads + g] =
              quantize_kv_head(&x[size_t(g * d)], d, static_cast<uint8_t*>(dst.data()) + slot[t] * kv_width + g * d);
      }
  }
}

void attention_paged(Tensor& out, const Tensor& qkv, const PagedKv& cache, const Tensor& block_tables,
                     const Tensor& cu_seqlens_q, const Tensor& context_lens, const HeadLayout& layout) {
  const int32_t* cu = cu_seqlens_q.data_as<int32_t>();
  const int32_t* lens = context_lens.data_as<int32_t>();
  const int32_t* tables = block_tables.data_as<int32_t>();
  const int64_t S = context_lens.dim(0), max_blocks = block_tables.dim(1);
  const int64_t block_size = cache.k.dim(1), d = layout.head_dim, width = layout.qkv_width();
  const int64_t tasks = S * layout.kv_heads, group = layout.group();
  const float scale = softmax_scale(layout);
#pragma omp parallel
  {
    Context ctx;
    std::vector<float> q(d), o(d), s;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t seq = task / layout.kv_heads, g = task % layout.kv_heads;
      const int64_t t0 = cu[seq], n_q = cu[seq + 1] - t0, len = lens[seq];
      if (n_q == 0) continue;
      const int32_t* table = tables + seq * max_blocks;
      ctx.load(len, d, [&](int64_t p, float* k, float* v) {
        const int64_t slot = int64_t(table[p / block_size]) * block_size + p % block_size;
        read_cached(cache, slot, g, d, qkv.dtype(), k, v);
      });
      s.resize(size_t(ctx.stride));
      for (int64_t i = 0; i < n_q; ++i)
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const int64_t t = t0 + i, position = len - n_q + i;
          read_f32(qkv, t * width + h * d, d, q.data());
          attend_row(q.data(), ctx, position + 1, scale, s.data(), o.data());
          write_f32(out, t * layout.q_width() + h * d, d, o.data());
        }
    }
  }
}

}  // namespace lockstep::cpu
