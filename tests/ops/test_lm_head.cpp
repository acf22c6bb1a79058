// The fused LM head against a full softmax in double, finite differences of its backward, the
// bit identity between the fused forward and lm_head_logits + logits_logprob, and kept logits
// giving the same bits as recomputed ones.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "ops/lm_head.h"
#include "tests/ops/lm_head_inputs.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::poisoned;
using testing::random_targets;
using testing::random_values;
using testing::rel_error;
using testing::same_bytes;
using testing::to_double;

// z[t][v] = (h[t] · w[v]) / temperature in double, from the values h and w hold.
std::vector<double> logits_double(const Tensor& h, const Tensor& w, double temperature) {
  const int64_t T = h.dim(0), H = h.dim(1), V = w.dim(0);
  const std::vector<double> hd = to_double(h), wd = to_double(w);
  std::vector<double> z(size_t(T * V));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t k = 0; k < H; ++k) acc += hd[size_t(t * H + k)] * wd[size_t(v * H + k)];
      z[size_t(t * V + v)] = acc / temperature;
    }
  return z;
}

struct Reference {
  std::vector<double> logprob, entropy, lse;
};

// The full softmax of each row of z [T, V], in double.
Reference softmax_reference(const std::vector<double>& z, int64_t T, int64_t V,
                            const Tensor& targets) {
  Reference r;
  for (int64_t t = 0; t < T; ++t) {
    const double* row = &z[size_t(t * V)];
    double m = row[0];
    for (int64_t v = 1; v < V; ++v) m = std::max(m, row[v]);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(row[v] - m);
    const double lse = m + std::log(s);
    double pz = 0;
    for (int64_t v = 0; v < V; ++v) pz += std::exp(row[v] - lse) * row[v];
    r.lse.push_back(lse);
    r.logprob.push_back(row[targets.data_as<int32_t>()[t]] - lse);
    r.entropy.push_back(lse - pz);
  }
  return r;
}

struct Forward {
  Tensor logprob, entropy, lse;
};

Forward forward(const Tensor& h, const Tensor& w, const Tensor& targets, float temperature) {
  const int64_t T = h.dim(0);
  Forward f{poisoned({T}, DType::f32), poisoned({T}, DType::f32), poisoned({T}, DType::f32)};
  lm_head_logprob_forward(f.logprob, f.entropy, f.lse, h, w, targets, temperature);
  return f;
}

// Runs `fn` under 1, 2 and 3 OpenMP threads.
void with_thread_counts(const std::function<void(int)>& fn) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    fn(threads);
  }
  omp_set_num_threads(saved);
}

struct ForwardCase {
  DType dtype;
  int64_t V;
  float scale;  // of h and w: 0.3 gives broad distributions, 1.0 peaked ones (small entropies)
};

class LmHeadForward : public ::testing::TestWithParam<ForwardCase> {};

// fp32 logits (≈ 1e-7 relative each) and fp32 sums over V ≤ 9000 in 8 lanes: ~1e-6 relative.
constexpr double kForwardTol = 1e-5;

TEST_P(LmHeadForward, MatchesDoubleSoftmax) {
  const auto [dtype, V, scale] = GetParam();
  const int64_t T = 37, H = 70;  // H: a K tail in the GEMM
  const float temperature = 0.7f;
  Tensor h = random_values({T, H}, dtype, 1, scale), w = random_values({V, H}, dtype, 2, scale);
  Tensor targets = random_targets(T, V, 3);
  const Forward f = forward(h, w, targets, temperature);
  const Reference ref = softmax_reference(logits_double(h, w, temperature), T, V, targets);
  EXPECT_LE(rel_error(to_double(f.logprob), ref.logprob), kForwardTol);
  EXPECT_LE(rel_error(to_double(f.entropy), ref.entropy), kForwardTol);
  EXPECT_LE(rel_error(to_double(f.lse), ref.lse), kForwardTol);
}

INSTANTIATE_TEST_SUITE_P(Cases, LmHeadForward,
                         ::testing::Values(ForwardCase{DType::f32, 1000, 0.3f},
                                           ForwardCase{DType::f32, 9000, 0.3f},
                                           ForwardCase{DType::bf16, 9000, 0.3f},
                                           ForwardCase{DType::f32, 9000, 1.0f},
                                           ForwardCase{DType::bf16, 4100, 1.0f}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_V" +
                                  std::to_string(info.param.V) +
                                  (info.param.scale < 1 ? "_broad" : "_peaked");
                         });

// The rollout computes logits for a few rows and folds them with logits_logprob; training runs the
// fused forward over whole batches. Both must give the same bits for a row, whatever the batch.
class LmHeadBits : public ::testing::TestWithParam<DType> {};

TEST_P(LmHeadBits, FusedForwardEqualsLogitsThenFold) {
  const DType dtype = GetParam();
  const int64_t T = 21, H = 40, V = 9000;
  const float temperature = 1.3f;
  Tensor h = random_values({T, H}, dtype, 10, 0.5f), w = random_values({V, H}, dtype, 11, 0.5f);
  Tensor targets = random_targets(T, V, 12);
  const Forward full = forward(h, w, targets, temperature);
  with_thread_counts([&](int threads) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, T}, {0, 1}, {5, 6}, {20, 21}, {3, 17}}) {
      SCOPED_TRACE(::testing::Message() << "rows " << r0 << ".." << r1);
      const int64_t n = r1 - r0;
      Tensor hs = h.rows(r0, r1), ts = targets.rows(r0, r1);
      const Forward part = forward(hs, w, ts, temperature);
      EXPECT_TRUE(same_bytes(part.logprob, full.logprob.rows(r0, r1)));
      EXPECT_TRUE(same_bytes(part.entropy, full.entropy.rows(r0, r1)));
      EXPECT_TRUE(same_bytes(part.lse, full.lse.rows(r0, r1)));

      Tensor logits = poisoned({n, V}, DType::f32);
      lm_head_logits(logits, hs, w);
      Tensor logprob = poisoned({n}, DType::f32), entropy = poisoned({n}, DType::f32);
      logits_logprob(logprob, entropy, logits, ts, temperature);
      EXPECT_TRUE(same_bytes(logprob, full.logprob.rows(r0, r1)));
      EXPECT_TRUE(same_bytes(entropy, full.entropy.rows(r0, r1)));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LmHeadBits, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Kept logits (ops/lm_head.h): the forward stores each chunk's logits chunk-major, the backward
// reads them instead of recomputing them — the same bits everywhere, and the kept logits are
// lm_head_logits' elements, left as they were by the backward.
class LmHeadKeptLogits : public ::testing::TestWithParam<DType> {};

TEST_P(LmHeadKeptLogits, SameBitsAsRecomputing) {
  const DType dtype = GetParam();
  const int64_t T = 600, H = 24, V = kVocabChunk + 300;  // two row blocks of 512, two chunks
  const float temperature = 0.9f;
  Tensor h = random_values({T, H}, dtype, 50, 0.5f), w = random_values({V, H}, dtype, 51, 0.5f);
  Tensor targets = random_targets(T, V, 52);
  const Forward plain = forward(h, w, targets, temperature);
  Forward kept_run{poisoned({T}, DType::f32), poisoned({T}, DType::f32), poisoned({T}, DType::f32)};
  Tensor kept = poisoned({T * V}, DType::f32);
  lm_head_logprob_forward(kept_run.logprob, kept_run.entropy, kept_run.lse, h, w, targets,
                          temperature, &kept);
  EXPECT_TRUE(same_bytes(kept_run.logprob, plain.logprob));
  EXPECT_TRUE(same_bytes(kept_run.entropy, plain.entropy));
  EXPECT_TRUE(same_bytes(kept_run.lse, plain.lse));

  Tensor logits = poisoned({T, V}, DType::f32);
  lm_head_logits(logits, h, w);
  const float* full = logits.data_as<float>();
  Tensor kept_before = Tensor::empty({T * V}, DType::f32);
  kept_before.copy_from(kept);
  const float* chunked = kept_before.data_as<float>();
  int64_t mismatches = 0;
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const int64_t n = std::min(kVocabChunk, V - v0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < n; ++j)
        mismatches += std::bit_cast<uint32_t>(chunked[T * v0 + t * n + j]) !=
                      std::bit_cast<uint32_t>(full[t * V + v0 + j]);
  }
  EXPECT_EQ(mismatches, 0) << "kept logits vs lm_head_logits";

  const Tensor dlp = random_values({T}, DType::f32, 53, 1.0f), dent = random_values({T}, DType::f32, 54, 1.0f);
  const Tensor dw0 = random_values({V, H}, DType::f32, 55, 1e-3f);
  Tensor dh = poisoned({T, H}, dtype), dh_kept = poisoned({T, H}, dtype);
  Tensor dw = Tensor::empty({V, H}, DType::f32), dw_kept = Tensor::empty({V, H}, DType::f32);
  dw.copy_from(dw0);
  dw_kept.copy_from(dw0);
  lm_head_logprob_backward(dh, dw, dlp, dent, h, w, targets, plain.lse, plain.entropy, temperature);
  lm_head_logprob_backward(dh_kept, dw_kept, dlp, dent, h, w, targets, plain.lse, plain.entropy,
                           temperature, &kept);
  EXPECT_TRUE(same_bytes(dh_kept, dh)) << "dh";
  EXPECT_TRUE(same_bytes(dw_kept, dw)) << "dw";
  EXPECT_TRUE(same_bytes(kept, kept_before)) << "the backward changed the kept logits";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LmHeadKeptLogits, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- backward ----------------------------------------------------------------------------------

// L = Σ_t a[t]·logprob[t] + b[t]·entropy[t] of logits z [T, V] (double), by a full softmax.
double loss_of(const std::vector<double>& z, int64_t T, int64_t V, const Tensor& targets,
               const std::vector<double>& a, const std::vector<double>& b) {
  const Reference r = softmax_reference(z, T, V, targets);
  double loss = 0;
  for (int64_t t = 0; t < T; ++t)
    loss += a[size_t(t)] * r.logprob[size_t(t)] + b[size_t(t)] * r.entropy[size_t(t)];
  return loss;
}

enum class Terms { both, logprob_only, entropy_only };

class LmHeadBackward : public ::testing::TestWithParam<Terms> {};

// f32 recipe, against central differences of the double-precision loss; the undefined gradient
// of a term reads as zero.
TEST_P(LmHeadBackward, MatchesFiniteDifferences) {
  const Terms terms = GetParam();
  const int64_t T = 6, H = 24, V = 4100;  // the second chunk has 4 columns, fewer than a lane group
  const float temperature = 1.3f;
  Tensor h = random_values({T, H}, DType::f32, 20, 0.5f),
         w = random_values({V, H}, DType::f32, 21, 0.5f);
  Tensor targets = random_targets(T, V, 22);
  Tensor da = random_values({T}, DType::f32, 23, 1.0f),
         db = random_values({T}, DType::f32, 24, 1.0f);
  std::vector<double> a = to_double(da), b = to_double(db);
  if (terms == Terms::entropy_only) a.assign(a.size(), 0.0);
  if (terms == Terms::logprob_only) b.assign(b.size(), 0.0);
  const Tensor dlogprob = terms == Terms::entropy_only ? Tensor() : da;
  const Tensor dentropy = terms == Terms::logprob_only ? Tensor() : db;

  const Forward f = forward(h, w, targets, temperature);
  Tensor dh = poisoned({T, H}, DType::f32);
  Tensor dw0 = random_values({V, H}, DType::f32, 25, 1.0f), dw = Tensor::empty({V, H}, DType::f32);
  dw.copy_from(dw0);  // dw accumulates: the gradient is what the call adds
  lm_head_logprob_backward(dh, dw, dlogprob, dentropy, h, w, targets, f.lse, f.entropy,
                           temperature);
  const std::vector<double> dh_out = to_double(dh), dw_out = to_double(dw),
                            dw_before = to_double(dw0);

  const std::vector<double> hd = to_double(h), wd = to_double(w);
  const std::vector<double> z = logits_double(h, w, temperature);
  const double tau = temperature, eps = 1e-4;
  // Perturbing h[t][k] moves row t of z by ±eps·w[:, k]/τ; perturbing w[v][k] moves column v by
  // ±eps·h[:, k]/τ.
  auto central = [&](auto move) {
    std::vector<double> zp = z, zm = z;
    move(zp, eps);
    move(zm, -eps);
    return (loss_of(zp, T, V, targets, a, b) - loss_of(zm, T, V, targets, a, b)) / (2 * eps);
  };
  std::vector<double> fd, out;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < H; ++k) {
      fd.push_back(central([&](std::vector<double>& zz, double e) {
        for (int64_t v = 0; v < V; ++v) zz[size_t(t * V + v)] += e * wd[size_t(v * H + k)] / tau;
      }));
      out.push_back(dh_out[size_t(t * H + k)]);
    }
  // Rows of w: every target, the chunk edges, and a few others.
  std::vector<int64_t> rows = {1, 77, 4095, 4096, 4099};
  for (int64_t t = 0; t < T; ++t) rows.push_back(targets.data_as<int32_t>()[t]);
  for (int64_t v : rows)
    for (int64_t k = 0; k < H; k += 5) {
      fd.push_back(central([&](std::vector<double>& zz, double e) {
        for (int64_t t = 0; t < T; ++t) zz[size_t(t * V + v)] += e * hd[size_t(t * H + k)] / tau;
      }));
      out.push_back(dw_out[size_t(v * H + k)] - dw_before[size_t(v * H + k)]);
    }
  // fp32 logits, lse and dz (~1e-7 relative; measured ≤ 1e-6) against a double FD whose
  // truncation error is O(eps²).
  EXPECT_LE(rel_error(out, fd), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Terms, LmHeadBackward,
                         ::testing::Values(Terms::both, Terms::logprob_only, Terms::entropy_only),
                         [](const auto& info) {
                           return std::string(info.param == Terms::both           ? "both"
                                              : info.param == Terms::logprob_only ? "logprob_only"
                                                                                  : "entropy_only");
                         });

// bf16 recipe: the gradients of the same loss from an analytic double reference (the formula the
// finite differences above confirm), with bf16 dz operands and a bf16 dh.
TEST(LmHeadBackwardBf16, MatchesDoubleReference) {
  const int64_t T = 37, H = 70, V = 9000;
  const float temperature = 0.8f;
  Tensor h = random_values({T, H}, DType::bf16, 30, 0.5f),
         w = random_values({V, H}, DType::bf16, 31, 0.5f);
  Tensor targets = random_targets(T, V, 32);
  Tensor da = random_values({T}, DType::f32, 33, 1.0f),
         db = random_values({T}, DType::f32, 34, 1.0f);
  const Forward f = forward(h, w, targets, temperature);
  Tensor dh = poisoned({T, H}, DType::bf16), dw = Tensor::zeros({V, H}, DType::f32);
  lm_head_logprob_backward(dh, dw, da, db, h, w, targets, f.lse, f.entropy, temperature);

  const std::vector<double> z = logits_double(h, w, temperature), hd = to_double(h),
                            wd = to_double(w);
  const std::vector<double> a = to_double(da), b = to_double(db);
  const Reference r = softmax_reference(z, T, V, targets);
  std::vector<double> dh_ref(size_t(T * H)), dw_ref(size_t(V * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      const double log_p = z[size_t(t * V + v)] - r.lse[size_t(t)], p = std::exp(log_p);
      const double is_target = v == targets.data_as<int32_t>()[t] ? 1.0 : 0.0;
      const double dz =
          (a[size_t(t)] * (is_target - p) - b[size_t(t)] * p * (log_p + r.entropy[size_t(t)])) /
          temperature;
      for (int64_t k = 0; k < H; ++k) {
        dh_ref[size_t(t * H + k)] += dz * wd[size_t(v * H + k)];
        dw_ref[size_t(v * H + k)] += dz * hd[size_t(t * H + k)];
      }
    }
  // dz rounded to bf16 (2^-9 relative each, independent), then dh rounded to bf16 once.
  EXPECT_LE(rel_error(to_double(dh), dh_ref), 5e-3);
  EXPECT_LE(rel_error(to_double(dw), dw_ref), 5e-3);
}

// ---- errors ------------------------------------------------------------------------------------

TEST(LmHead, BadArgumentsAreClearErrors) {
  const int64_t T = 4, H = 16, V = 100;
  Tensor h = random_values({T, H}, DType::f32, 40, 1.0f),
         w = random_values({V, H}, DType::f32, 41, 1.0f);
  Tensor targets = random_targets(T, V, 42);
  Tensor lp = Tensor::empty({T}, DType::f32), ent = Tensor::empty({T}, DType::f32),
         lse = Tensor::empty({T}, DType::f32);
  auto fwd = [&](const Tensor& tg) { lm_head_logprob_forward(lp, ent, lse, h, w, tg, 1.0f); };

  Tensor bad = Tensor::empty({T}, DType::i32);
  bad.copy_from(targets);
  bad.data_as<int32_t>()[2] = -1;
  expect_error([&] { fwd(bad); },
               "lm_head_logprob_forward: targets[2] = -1 is outside the vocabulary [0, 100)");
  bad.data_as<int32_t>()[2] = int32_t(V);
  expect_error([&] { fwd(bad); }, "targets[2] = 100 is outside");
  Tensor logits = Tensor::empty({T, V}, DType::f32);
  lm_head_logits(logits, h, w);
  expect_error([&] { logits_logprob(lp, ent, logits, bad, 1.0f); },
               "logits_logprob: targets[2] = 100");
  Tensor dh = Tensor::empty({T, H}, DType::f32), dw = Tensor::zeros({V, H}, DType::f32);
  expect_error([&] { lm_head_logprob_backward(dh, dw, lp, ent, h, w, bad, lse, ent, 1.0f); },
               "lm_head_logprob_backward: targets[2] = 100");

  Tensor w_bad = random_values({V, H + 1}, DType::f32, 43, 1.0f);
  expect_error([&] { lm_head_logprob_forward(lp, ent, lse, h, w_bad, targets, 1.0f); },
               "lm_head_logprob_forward: w: expected a 2-D tensor [V, 16]");
  Tensor h_int = Tensor::empty({T, H}, DType::i32);
  expect_error([&] { lm_head_logprob_forward(lp, ent, lse, h_int, w, targets, 1.0f); },
               "lm_head_logprob_forward: h: expected f32 or bf16");
  Tensor lse_short = Tensor::empty({T - 1}, DType::f32);
  expect_error([&] { lm_head_logprob_forward(lp, ent, lse_short, h, w, targets, 1.0f); },
               "lm_head_logprob_forward: lse: expected shape");
  Tensor lp_bf16 = Tensor::empty({T}, DType::bf16);
  expect_error([&] { lm_head_logprob_forward(lp_bf16, ent, lse, h, w, targets, 1.0f); },
               "lm_head_logprob_forward: logprob: expected dtype f32");
  Tensor targets_i64 = Tensor::zeros({T}, DType::i64);
  expect_error([&] { lm_head_logprob_forward(lp, ent, lse, h, w, targets_i64, 1.0f); },
               "lm_head_logprob_forward: targets: expected dtype i32");
  for (float bad_t : {0.0f, -1.0f, NAN})
    expect_error([&] { lm_head_logprob_forward(lp, ent, lse, h, w, targets, bad_t); },
                 "temperature must be finite and > 0");
  Tensor dw_bf16 = Tensor::empty({V, H}, DType::bf16);
  expect_error(
      [&] { lm_head_logprob_backward(dh, dw_bf16, lp, ent, h, w, targets, lse, ent, 1.0f); },
      "lm_head_logprob_backward: dw: expected dtype f32");
  Tensor dlp_long = Tensor::empty({T + 1}, DType::f32);
  expect_error(
      [&] { lm_head_logprob_backward(dh, dw, dlp_long, ent, h, w, targets, lse, ent, 1.0f); },
      "lm_head_logprob_backward: dlogprob: expected shape");
  Tensor kept_short = Tensor::empty({T * V - 1}, DType::f32);
  expect_error([&] { lm_head_logprob_forward(lp, ent, lse, h, w, targets, 1.0f, &kept_short); },
               "lm_head_logprob_forward: kept_logits: expected shape");
  const Tensor kept_bf16 = Tensor::empty({T * V}, DType::bf16);
  expect_error(
      [&] { lm_head_logprob_backward(dh, dw, lp, ent, h, w, targets, lse, ent, 1.0f, &kept_bf16); },
      "lm_head_logprob_backward: kept_logits: expected dtype f32");
  Tensor logits_short = Tensor::empty({T, V - 1}, DType::f32);
  expect_error([&] { lm_head_logits(logits_short, h, w); },
               "lm_head_logits: logits: expected shape");
}

}  // namespace
}  // namespace lockstep
