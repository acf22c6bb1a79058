// ops/cpu/lm_head.cpp — CPU reference for ops/lm_head.h.
//
// Rows are taken kRowBlock at a time and the vocabulary kVocabChunk at a time. A (row block,
// chunk) pair's logits come from the CPU GEMM, whose elements do not depend on the block or chunk
// they are computed in, so they equal lm_head_logits' bit for bit; fold_span then folds them into
// each row's running statistics. logits_logprob walks given logits rows through the same fold in
// the same spans, so both give identical bits for identical logits.
//
// The exponential is exp_f32 below rather than std::exp: ~1e6 exponentials per token at large
// vocabularies need a vectorized one, and being plain float operations with explicit fmas it rounds
// the same in a loop's vector body and in its scalar tail, so a value does not depend on its lane.
#include "ops/lm_head.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/cpu/act.h"
#include "ops/gemm_backends.h"
#include "ops/lm_head_backends.h"

namespace lockstep::cpu {

namespace {

constexpr int kLanes = 8;
constexpr int64_t kRowBlock = 512;  // rows per GEMM: an 8 MiB [512, kVocabChunk] fp32 logits block

// e^x for x <= 0 (Cephes' expf: range reduction by ln 2, degree-5 polynomial, ≈ 1 ulp), 0 below
// -87.3 (where e^x leaves the normal range), NaN for NaN. Branch-free, so loops over it vectorize.
inline float exp_f32(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
  const float xc = std::max(x, -87.3f);
  const float t = std::fma(xc, 1.44269504088896341f, kRound);
  const float n = t - kRound;                // round(x·log2 e), exact
  float r = std::fma(n, -0.693359375f, xc);  // x − n·ln 2 in two parts, the first exact
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float y = std::fma(p, r * r, r) + 1.0f;
  const int32_t n_int = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  const float two_n = std::bit_cast<float>((n_int + 127) << 23);
  const uint32_t keep = x < -87.3f ? 0u : ~0u;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(y * two_n) & keep);
}

inline float lane_tree(const float (&l)[kLanes]) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// One row's softmax statistics over the vocabulary folded so far: m = max z,
// s = Σ exp(z − m) and d = Σ exp(z − m)·(z − m). Then lse = m + log s and
// entropy = log s − d/s, a sum of two non-negative terms (no cancellation when the entropy is
// small).
struct RowFold {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
  float shifted = 0.0f;
  float lse() const { return max + std::log(sum); }
  float entropy() const { return std::log(sum) - shifted / sum; }
};

// Folds z = logits[0, n) / temperature, a span of one row starting at a multiple of kLanes of v:
// rescale once if the span raises the max, then element v goes to lane v % kLanes in increasing v,
// and the lanes are summed by the fixed tree.
void fold_span(RowFold& f, const float* logits, int64_t n, float temperature) {
  const int64_t whole = n / kLanes * kLanes;
  float lane_max[kLanes];
  std::fill(lane_max, lane_max + kLanes, -std::numeric_limits<float>::infinity());
  for (int64_t v = 0; v < whole; v += kLanes)
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) lane_max[l] = std::max(lane_max[l], logits[v + l]);
  for (int64_t v = whole; v < n; ++v)
    lane_max[v - whole] = std::max(lane_max[v - whole], logits[v]);
  // Division is monotonic, so this is the max of the z; + 0 makes a −0 max +0.
  const float m = *std::max_element(lane_max, lane_max + kLanes) / temperature + 0.0f;
  if (m > f.max) {
    if (f.sum > 0.0f) {
      const float shift = f.max - m, scale = exp_f32(shift);
      f.shifted = (f.shifted + f.sum * shift) * scale;
      f.sum *= scale;
    }
    f.max = m;
  }
  float s[kLanes] = {}, d[kLanes] = {};
  const float max = f.max;
  auto add = [&](int l, float logit) {
    const float zm = logit / temperature - max, e = exp_f32(zm);
    s[l] += e;
    d[l] = std::fma(e, zm, d[l]);
  };
  for (int64_t v = 0; v < whole; v += kLanes)
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) add(l, logits[v + l]);
  for (int64_t v = whole; v < n; ++v) add(int(v - whole), logits[v]);
  f.sum += lane_tree(s);
  f.shifted += lane_tree(d);
}

// Folds rows [0, rows) of a [rows, n] logits block for vocabulary [v0, v0 + n); z_target[t] is set
// when the row's target falls in the span.
void fold_block(std::vector<RowFold>& folds, std::vector<float>& z_target, int64_t row0,
                const float* logits, int64_t rows, int64_t n, int64_t v0, const int32_t* targets,
                float temperature) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = row0 + r;
    const float* row = logits + r * n;
    fold_span(folds[size_t(t)], row, n, temperature);
    if (targets[t] >= v0 && targets[t] < v0 + n)
      z_target[size_t(t)] = row[targets[t] - v0] / temperature;
  }
}

void write_outputs(Tensor& logprob, Tensor& entropy, Tensor* lse, const std::vector<RowFold>& folds,
                   const std::vector<float>& z_target) {
  for (size_t t = 0; t < folds.size(); ++t) {
    const float row_lse = folds[t].lse();
    logprob.data_as<float>()[t] = z_target[t] - row_lse;
    entropy.data_as<float>()[t] = folds[t].entropy();
    if (lse) lse->data_as<float>()[t] = row_lse;
  }
}

// logits [rows, n] = h · w[v0, v0 + n)ᵀ into `dst`.
Tensor chunk_logits(float* dst, const Tensor& h, const Tensor& w, int64_t v0, int64_t n) {
  Tensor logits = Tensor::view_of(dst, {h.dim(0), n}, DType::f32);
  gemm_tn(logits, {h}, {w.rows(v0, v0 + n)}, false);
  return logits;
}

// Where rows [r0, r0 + rows) of vocabulary chunk [v0, v0 + n) sit in kept logits of T rows
// (ops/lm_head.h: chunk-major, each chunk a row-major [T, n] block).
float* kept_block(const Tensor& kept, int64_t T, int64_t r0, int64_t v0, int64_t n) {
  return kept.data_as<float>() + T * v0 + r0 * n;
}

}  // namespace

void lm_head_logprob_forward(Tensor& logprob, Tensor& entropy, Tensor& lse, const Tensor& h,
                             const Tensor& w, const Tensor& targets, float temperature,
                             Tensor* kept_logits) {
  const int64_t T = h.dim(0), V = w.dim(0);
  std::vector<RowFold> folds(static_cast<size_t>(T));
  std::vector<float> z_target(static_cast<size_t>(T)),
      buffer(kept_logits ? 0 : size_t(std::min(T, kRowBlock) * std::min(V, kVocabChunk)));
  for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
    const Tensor hb = h.rows(r0, std::min(T, r0 + kRowBlock));
    for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
      const int64_t n = std::min(kVocabChunk, V - v0);
      const Tensor logits = chunk_logits(
          kept_logits ? kept_block(*kept_logits, T, r0, v0, n) : buffer.data(), hb, w, v0, n);
      fold_block(folds, z_target, r0, logits.data_as<float>(), hb.dim(0), n, v0,
                 targets.data_as<int32_t>(), temperature);
    }
  }
  write_outputs(logprob, entropy, &lse, folds, z_target);
}

void logits_logprob(Tensor& logprob, Tensor& entropy, const Tensor& logits, const Tensor& targets,
                    float temperature) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
  std::vector<RowFold> folds(static_cast<size_t>(T));
  std::vector<float> z_target(static_cast<size_t>(T));
  const float* l = logits.data_as<float>();
  const int32_t* tg = targets.data_as<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk)
      fold_span(folds[size_t(t)], l + t * V + v0, std::min(kVocabChunk, V - v0), temperature);
    z_target[size_t(t)] = l[t * V + tg[t]] / temperature;
  }
  write_outputs(logprob, entropy, nullptr, folds, z_target);
}

void lm_head_logits(Tensor& logits, const Tensor& h, const Tensor& w) {
  gemm_tn(logits, {h}, {w}, false);
}

// Per (row block, chunk): recompute the logits (or copy the kept ones, which dz must not
// overwrite), form dz/temperature in place of them, round it to h's dtype (the GEMM operand of
// the recipe), then dh_block += dz·w_chunk and dw_chunk += dzᵀ·h_block. dh is summed over the
// chunks in fp32 and stored once; dw adds the row blocks in increasing order.
void lm_head_logprob_backward(Tensor& dh, Tensor& dw, const Tensor& dlogprob,
                              const Tensor& dentropy, const Tensor& h, const Tensor& w,
                              const Tensor& targets, const Tensor& lse, const Tensor& entropy,
                              float temperature, const Tensor* kept_logits) {
  const int64_t T = h.dim(0), H = h.dim(1), V = w.dim(0);
  const int32_t* tg = targets.data_as<int32_t>();
  const float* lse_p = lse.data_as<float>();
  const float* ent_p = entropy.data_as<float>();
  const float* dlp_p = dlogprob.defined() ? dlogprob.data_as<float>() : nullptr;
  const float* dent_p = dentropy.defined() ? dentropy.data_as<float>() : nullptr;
  const int64_t max_rows = std::min(T, kRowBlock), max_n = std::min(V, kVocabChunk);
  std::vector<float> buffer(size_t(max_rows * max_n));
  // dz in h's dtype for the GEMMs; an f32 h uses dz in place.
  const Tensor rounded =
      h.dtype() == DType::f32 ? Tensor() : Tensor::empty({max_rows * max_n}, h.dtype());
  Tensor dh_block = Tensor::empty({max_rows, H}, DType::f32);
  for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
    const int64_t rows = std::min(T, r0 + kRowBlock) - r0;
    const Tensor hb = h.rows(r0, r0 + rows);
    Tensor dhb = dh_block.rows(0, rows);
    for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
      const int64_t n = std::min(kVocabChunk, V - v0);
      const Tensor logits = kept_logits ? Tensor::view_of(buffer.data(), {rows, n}, DType::f32)
                                        : chunk_logits(buffer.data(), hb, w, v0, n);
      if (kept_logits)
        std::copy_n(kept_block(*kept_logits, T, r0, v0, n), rows * n, logits.data_as<float>());
      Tensor dz =
          rounded.defined() ? Tensor::view_of(rounded.data(), {rows, n}, h.dtype()) : logits;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r0 + r;
        const float row_lse = lse_p[t], ent = ent_p[t];
        const float dlp = dlp_p ? dlp_p[t] : 0.0f, dent = dent_p ? dent_p[t] : 0.0f;
        // dz = dlogprob·(1[v = target] − p) + dentropy·(−p·(log p + entropy)), then / temperature.
        auto dz_of = [&](float logit, float is_target) {
          const float log_p = logit / temperature - row_lse, p = exp_f32(log_p);
          return (dlp * (is_target - p) + dent * (-p * (log_p + ent))) / temperature;
        };
        float* row = logits.data_as<float>() + r * n;
        const int64_t target = tg[t] - v0;
        const bool has_target = target >= 0 && target < n;
        const float target_logit = has_target ? row[target] : 0.0f;
#pragma omp simd
        for (int64_t v = 0; v < n; ++v) row[v] = dz_of(row[v], 0.0f);
        if (has_target) row[target] = dz_of(target_logit, 1.0f);
        if (rounded.defined()) write_f32(dz, r * n, n, row);
      }
      gemm_tn(dhb, {dz}, {w.rows(v0, v0 + n), true}, v0 > 0);
      Tensor dw_chunk = dw.rows(v0, v0 + n);
      gemm_tn(dw_chunk, {dz, true}, {hb, true}, true);
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) write_f32(dh, (r0 + r) * H, H, dhb.data_as<float>() + r * H);
  }
}

}  // namespace lockstep::cpu
