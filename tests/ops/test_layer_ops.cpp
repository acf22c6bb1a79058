// The layer ops (embedding, RMSNorm, SwiGLU, elementwise, AdamW) on the CPU: double-precision
// references computed from the values the inputs hold, central finite differences for every
// backward, determinism of the weight-gradient sums, row independence, the fused fp8 producers
// against their composition, and the argument checks.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/error.h"
#include "numerics/quantize.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::poisoned;
using testing::random_tensor;
using testing::rel_error;
using testing::same_bytes;
using testing::to_double;
using testing::worst_row_error;

// Stores to f32 after a few fp32 operations per element: each rounds by ≤ 2^-24 (6e-8), so an
// error of 1e-5 means a wrong formula, not rounding.
constexpr double kF32Tol = 1e-5;
// bf16 keeps 8 significant bits: a store rounds by ≤ 2^-8 (3.9e-3) relative per element, so the
// normwise error is at most that (typically ~2e-3); the fp32 math adds next to nothing.
constexpr double kBf16Tol = 4e-3;

double tol(DType out) { return out == DType::bf16 ? kBf16Tol : kF32Tol; }

const DType kActs[] = {DType::f32, DType::bf16};

void with_threads(int threads, const std::function<void()>& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  f();
  omp_set_num_threads(before);
}

// A view that claims to live on the GPU; the checks must reject it before touching its memory.
Tensor fake_cuda(const Tensor& t) {
  return Tensor::view_of(t.data(), t.shape(), t.dtype(), Device::cuda);
}

// ∂L/∂x for L = Σ r·forward(x), by central differences over every element of the f32 tensor x.
// L is summed in double from forward's f32 output.
std::vector<double> finite_diff(Tensor& x, const Tensor& r, const std::function<Tensor()>& forward,
                                float h) {
  const std::vector<double> rd = to_double(r);
  const auto loss = [&] {
    const std::vector<double> out = to_double(forward());
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += rd[i] * out[i];
    return sum;
  };
  float* p = x.data_as<float>();
  std::vector<double> grad(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = p[i], up = v + h, down = v - h;
    p[i] = up;
    const double l_up = loss();
    p[i] = down;
    const double l_down = loss();
    p[i] = v;
    grad[size_t(i)] = (l_up - l_down) / (double(up) - double(down));
  }
  return grad;
}

// ---- embedding ---------------------------------------------------------------------------------

constexpr int64_t kVocab = 50, kHidden = 72;

// Random ids in [0, V − 9) with repeats, plus both ends 0 and V − 1: rows [V − 9, V − 1) are
// never used.
Tensor token_ids(int64_t count, uint64_t seed) {
  Tensor t = Tensor::empty({count}, DType::i32);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, int32_t(kVocab) - 10);
  for (int64_t i = 0; i < count; ++i) t.data_as<int32_t>()[i] = id(rng);
  t.data_as<int32_t>()[0] = int32_t(kVocab) - 1;
  t.data_as<int32_t>()[count - 1] = 0;
  return t;
}

TEST(Embedding, ForwardCopiesTheRowsConvertedToTheOutputType) {
  const int64_t T = 37;
  const Tensor tokens = token_ids(T, 1);
  for (DType table_type : kActs)
    for (DType out_type : kActs) {
      SCOPED_TRACE(std::string(dtype_name(table_type)) + " table, " +
                   std::string(dtype_name(out_type)) + " out");
      const Tensor table = random_tensor({kVocab, kHidden}, table_type, 2);
      Tensor out = poisoned({T, kHidden}, out_type);
      embedding_forward(out, tokens, table);
      const std::vector<double> tv = to_double(table);
      std::vector<double> expected(size_t(T * kHidden));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < kHidden; ++h) {
          const double v = tv[size_t(tokens.data_as<int32_t>()[t] * kHidden + h)];
          expected[size_t(t * kHidden + h)] =
              out_type == DType::bf16 ? double(round_to_bf16(float(v))) : v;
        }
      EXPECT_EQ(to_double(out), expected);  // a copy and at most one rounding: exact
    }
}

TEST(Embedding, BackwardAccumulatesEachTokensRowsDeterministically) {
  const int64_t T = 300;  // ~7 occurrences per used id
  const Tensor tokens = token_ids(T, 3);
  for (DType dout_type : kActs) {
    SCOPED_TRACE(dtype_name(dout_type));
    const Tensor dout = random_tensor({T, kHidden}, dout_type, 4);
    const Tensor dtable0 = random_tensor({kVocab, kHidden}, DType::f32, 5);
    std::vector<double> ref = to_double(dtable0);
    const std::vector<double> dd = to_double(dout);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < kHidden; ++h)
        ref[size_t(tokens.data_as<int32_t>()[t] * kHidden + h)] += dd[size_t(t * kHidden + h)];

    Tensor one = dtable0.to(Device::cpu), three = dtable0.to(Device::cpu);
    with_threads(1, [&] { embedding_backward(one, tokens, dout); });
    with_threads(3, [&] { embedding_backward(three, tokens, dout); });
    // ~10 fp32 additions per element, each ≤ 2^-24 relative.
    EXPECT_LE(rel_error(to_double(three), ref), kF32Tol);
    EXPECT_TRUE(same_bytes(one, three)) << "the sums depend on the thread count";
    const Tensor unused = three.rows(kVocab - 9, kVocab - 1);
    EXPECT_TRUE(same_bytes(unused, dtable0.rows(kVocab - 9, kVocab - 1))) << "unused rows changed";
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int64_t T = 12;
  const Tensor tokens = token_ids(T, 6);
  Tensor table = random_tensor({kVocab, kHidden}, DType::f32, 7);
  const Tensor r = random_tensor({T, kHidden}, DType::f32, 8);
  Tensor out = Tensor::empty({T, kHidden}, DType::f32);
  const auto forward = [&] {
    embedding_forward(out, tokens, table);
    return out;
  };
  const std::vector<double> numeric = finite_diff(table, r, forward, 0.25f);
  Tensor dtable = Tensor::zeros({kVocab, kHidden}, DType::f32);
  embedding_backward(dtable, tokens, r);
  // L is linear in the table, so the differences are exact up to the rounding of L (~1e-15); the
  // backward's fp32 sums of a few rows are what the tolerance covers.
  EXPECT_LE(rel_error(to_double(dtable), numeric), kF32Tol);
}

TEST(Embedding, BadArgumentsAreClearErrors) {
  Tensor tokens = token_ids(8, 9);
  const Tensor table = random_tensor({kVocab, kHidden}, DType::bf16, 10);
  Tensor out = Tensor::empty({8, kHidden}, DType::bf16);
  tokens.data_as<int32_t>()[3] = -1;
  expect_error([&] { embedding_forward(out, tokens, table); }, "tokens[3] = -1");
  tokens.data_as<int32_t>()[3] = int32_t(kVocab);
  expect_error([&] { embedding_forward(out, tokens, table); }, "tokens[3] = 50 is outside");
  Tensor dtable = Tensor::zeros({kVocab, kHidden}, DType::f32);
  expect_error([&] { embedding_backward(dtable, tokens, out); }, "embedding_backward: tokens[3]");
  tokens.data_as<int32_t>()[3] = 1;

  const Tensor tokens64 = Tensor::zeros({8}, DType::i64);
  expect_error([&] { embedding_forward(out, tokens64, table); }, "embedding_forward: tokens");
  Tensor out_short = Tensor::empty({7, kHidden}, DType::bf16);
  expect_error([&] { embedding_forward(out_short, tokens, table); }, "embedding_forward: out");
  expect_error([&] { embedding_forward(out, tokens, table.reshape({kVocab * kHidden})); },
               "embedding_forward: table");
  Tensor out_gpu = fake_cuda(out);
  expect_error([&] { embedding_forward(out_gpu, tokens, table); }, "embedding_forward: out");
  Tensor dtable_bf16 = Tensor::empty({kVocab, kHidden}, DType::bf16);
  expect_error([&] { embedding_backward(dtable_bf16, tokens, out); }, "embedding_backward: dtable");
  expect_error([&] { embedding_backward(dtable, tokens, out_short); }, "embedding_backward: dout");
}

// ---- RMSNorm -----------------------------------------------------------------------------------

constexpr int64_t kRows = 33, kCols = 203;  // 203: a tail after 8 lanes and after 64-column blocks
constexpr float kEps = 1e-6f;

struct RmsRef {
  std::vector<double> y, rstd;
};

RmsRef rms_forward_ref(const std::vector<double>& x, const std::vector<double>& w, int64_t R,
                       int64_t C) {
  RmsRef ref{std::vector<double>(x.size()), std::vector<double>(size_t(R))};
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[size_t(r * C + c)] * x[size_t(r * C + c)];
    const double rstd = 1 / std::sqrt(ss / double(C) + double(kEps));
    ref.rstd[size_t(r)] = rstd;
    for (int64_t c = 0; c < C; ++c)
      ref.y[size_t(r * C + c)] = x[size_t(r * C + c)] * rstd * w[size_t(c)];
  }
  return ref;
}

TEST(RmsNorm, ForwardMatchesDoubleReference) {
  const Tensor w = random_tensor({kCols}, DType::f32, 20);
  for (DType x_type : kActs)
    for (DType y_type : kActs) {
      SCOPED_TRACE(std::string(dtype_name(x_type)) + " x, " + std::string(dtype_name(y_type)) +
                   " y");
      // Rows from 1e-3 to 1e2: eps matters in the smallest ones.
      const Tensor x = random_tensor({kRows, kCols}, x_type, 21, true);
      Tensor y = poisoned({kRows, kCols}, y_type), rstd = poisoned({kRows}, DType::f32);
      rmsnorm_forward(y, rstd, x, w, kEps);
      const RmsRef ref = rms_forward_ref(to_double(x), to_double(w), kRows, kCols);
      EXPECT_LE(worst_row_error(to_double(y), ref.y, kCols), tol(y_type));
      EXPECT_LE(worst_row_error(to_double(rstd), ref.rstd, 1), kF32Tol);
    }
}

TEST(RmsNorm, BackwardMatchesDoubleReference) {
  const Tensor w = random_tensor({kCols}, DType::f32, 30);
  for (DType type : kActs) {
    SCOPED_TRACE(dtype_name(type));
    const Tensor x = random_tensor({kRows, kCols}, type, 31, true);
    const Tensor dy = random_tensor({kRows, kCols}, type, 32);
    Tensor y = Tensor::empty({kRows, kCols}, type), rstd = Tensor::empty({kRows}, DType::f32);
    rmsnorm_forward(y, rstd, x, w, kEps);
    const Tensor dw0 = random_tensor({kCols}, DType::f32, 33);
    Tensor dx = poisoned({kRows, kCols}, type), dw = dw0.to(Device::cpu);
    rmsnorm_backward(dx, dw, dy, x, w, rstd);

    const std::vector<double> xd = to_double(x), dyd = to_double(dy), wd = to_double(w);
    const RmsRef fwd = rms_forward_ref(xd, wd, kRows, kCols);
    std::vector<double> dx_ref(xd.size()), dw_ref = to_double(dw0);
    for (int64_t r = 0; r < kRows; ++r) {
      const double s = fwd.rstd[size_t(r)];
      double mean = 0;
      for (int64_t c = 0; c < kCols; ++c) {
        const size_t i = size_t(r * kCols + c);
        mean += xd[i] * s * wd[size_t(c)] * dyd[i] / double(kCols);
        dw_ref[size_t(c)] += dyd[i] * xd[i] * s;
      }
      for (int64_t c = 0; c < kCols; ++c) {
        const size_t i = size_t(r * kCols + c);
        dx_ref[i] = s * (wd[size_t(c)] * dyd[i] - xd[i] * s * mean);
      }
    }
    EXPECT_LE(worst_row_error(to_double(dx), dx_ref, kCols), tol(type));
    // dw sums 33 rows in fp32: ≤ 33 · 2^-24 relative to the sum of magnitudes.
    EXPECT_LE(rel_error(to_double(dw), dw_ref), kF32Tol);
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t R = 5, C = 24;
  Tensor x = random_tensor({R, C}, DType::f32, 40), w = random_tensor({C}, DType::f32, 41);
  const Tensor r = random_tensor({R, C}, DType::f32, 42);
  Tensor y = Tensor::empty({R, C}, DType::f32), rstd = Tensor::empty({R}, DType::f32);
  const auto forward = [&] {
    rmsnorm_forward(y, rstd, x, w, kEps);
    return y;
  };
  // h = 1e-2 on O(1) inputs: truncation error ~h² and rounding error ~1e-7·|L|/h both ~1e-4.
  const std::vector<double> dx_num = finite_diff(x, r, forward, 1e-2f);
  const std::vector<double> dw_num = finite_diff(w, r, forward, 1e-2f);
  forward();
  Tensor dx = poisoned({R, C}, DType::f32), dw = Tensor::zeros({C}, DType::f32);
  rmsnorm_backward(dx, dw, r, x, w, rstd);
  EXPECT_LE(rel_error(to_double(dx), dx_num), 1e-3);
  EXPECT_LE(rel_error(to_double(dw), dw_num), 1e-3);
}

// The basis of bit-identical training and generation rows: a row's output depends only on that
// row, not on the batch or the thread count.
TEST(RmsNorm, RowsAreIndependentOfTheBatch) {
  const Tensor w = random_tensor({kCols}, DType::f32, 50);
  const Tensor x = random_tensor({kRows, kCols}, DType::bf16, 51, true);
  Tensor y = Tensor::empty({kRows, kCols}, DType::bf16), rstd = Tensor::empty({kRows}, DType::f32);
  with_threads(3, [&] { rmsnorm_forward(y, rstd, x, w, kEps); });
  for (int64_t row : {int64_t(0), int64_t(14), kRows - 1}) {
    const Tensor x1 = x.rows(row, row + 1).to(Device::cpu);
    Tensor y1 = Tensor::empty({1, kCols}, DType::bf16), rstd1 = Tensor::empty({1}, DType::f32);
    with_threads(1, [&] { rmsnorm_forward(y1, rstd1, x1, w, kEps); });
    EXPECT_TRUE(same_bytes(y1, y.rows(row, row + 1))) << "row " << row;
    EXPECT_TRUE(same_bytes(rstd1, rstd.rows(row, row + 1))) << "row " << row;
  }
}

TEST(RmsNorm, WeightGradientDoesNotDependOnTheThreadCount) {
  const int64_t R = 500;
  const Tensor w = random_tensor({kCols}, DType::f32, 55);
  const Tensor x = random_tensor({R, kCols}, DType::bf16, 56),
               dy = random_tensor({R, kCols}, DType::bf16, 57);
  Tensor y = Tensor::empty({R, kCols}, DType::bf16), rstd = Tensor::empty({R}, DType::f32);
  rmsnorm_forward(y, rstd, x, w, kEps);
  Tensor dx = Tensor::empty({R, kCols}, DType::bf16);
  Tensor dw1 = Tensor::zeros({kCols}, DType::f32), dw3 = Tensor::zeros({kCols}, DType::f32);
  with_threads(1, [&] { rmsnorm_backward(dx, dw1, dy, x, w, rstd); });
  with_threads(3, [&] { rmsnorm_backward(dx, dw3, dy, x, w, rstd); });
  EXPECT_TRUE(same_bytes(dw1, dw3));
}

// The residual add fused into the norm gives the bits of add_into followed by the norm: the sum
// left in x, y and rstd. 1 row: a decode step; 37 × 264: rows of a partial lane group.
TEST(RmsNorm, ResidualIsAddIntoThenRmsNorm) {
  for (const auto& [R, C] : {std::pair<int64_t, int64_t>{1, 64}, {5, 264}, {37, 1024}}) {
    const Tensor w = random_tensor({C}, DType::f32, 40);
    for (DType type : kActs)
      for (DType y_type : kActs) {
        SCOPED_TRACE(std::to_string(R) + "x" + std::to_string(C) + " " + std::string(dtype_name(type)) +
                     " x, " + std::string(dtype_name(y_type)) + " y");
        const Tensor x0 = random_tensor({R, C}, type, 41, true);
        const Tensor residual = random_tensor({R, C}, type, 42, true);
        Tensor sum = x0.to(Device::cpu);
        add_into(sum, residual);
        Tensor y = poisoned({R, C}, y_type), rstd = poisoned({R}, DType::f32);
        rmsnorm_forward(y, rstd, sum, w, kEps);

        Tensor x = x0.to(Device::cpu);
        Tensor f_y = poisoned({R, C}, y_type), f_rstd = poisoned({R}, DType::f32);
        rmsnorm_forward(f_y, f_rstd, x, residual, w, kEps);
        EXPECT_TRUE(same_bytes(x, sum));
        EXPECT_TRUE(same_bytes(f_y, y));
        EXPECT_TRUE(same_bytes(f_rstd, rstd));

        Tensor n_y = poisoned({R, C}, y_type), n_rstd = poisoned({R}, DType::f32), n_x = sum.to(Device::cpu);
        rmsnorm_forward(n_y, n_rstd, n_x, Tensor(), w, kEps);  // undefined residual: no add
        EXPECT_TRUE(same_bytes(n_x, sum));
        EXPECT_TRUE(same_bytes(n_y, y));
      }
  }
}

TEST(RmsNorm, BadArgumentsAreClearErrors) {
  const Tensor x = random_tensor({4, 16}, DType::bf16, 60), w = random_tensor({16}, DType::f32, 61);
  Tensor y = Tensor::empty({4, 16}, DType::bf16), rstd = Tensor::empty({4}, DType::f32);
  const Tensor w_short = random_tensor({15}, DType::f32, 62);
  expect_error([&] { rmsnorm_forward(y, rstd, x, w_short, kEps); }, "rmsnorm_forward: w");
  const Tensor w_bf16 = random_tensor({16}, DType::bf16, 63);
  expect_error([&] { rmsnorm_forward(y, rstd, x, w_bf16, kEps); }, "rmsnorm_forward: w");
  Tensor rstd_bf16 = Tensor::empty({4}, DType::bf16);
  expect_error([&] { rmsnorm_forward(y, rstd_bf16, x, w, kEps); }, "rmsnorm_forward: rstd");
  Tensor y_wide = Tensor::empty({4, 17}, DType::bf16);
  expect_error([&] { rmsnorm_forward(y_wide, rstd, x, w, kEps); }, "rmsnorm_forward: y");
  const Tensor x_int = Tensor::zeros({4, 16}, DType::i32);
  expect_error([&] { rmsnorm_forward(y, rstd, x_int, w, kEps); }, "rmsnorm_forward: x");
  expect_error([&] { rmsnorm_forward(y, rstd, x, w, -1.0f); }, "eps");
  Tensor sum = x.to(Device::cpu);
  const Tensor residual_short = random_tensor({3, 16}, DType::bf16, 64);
  expect_error([&] { rmsnorm_forward(y, rstd, sum, residual_short, w, kEps); },
               "rmsnorm_forward: residual");
  const Tensor residual_f32 = random_tensor({4, 16}, DType::f32, 65);
  expect_error([&] { rmsnorm_forward(y, rstd, sum, residual_f32, w, kEps); },
               "rmsnorm_forward: residual");
  Tensor dx = Tensor::empty({4, 16}, DType::bf16), dw = Tensor::zeros({16}, DType::f32);
  Tensor dw_bf16 = Tensor::empty({16}, DType::bf16);
  expect_error([&] { rmsnorm_backward(dx, dw_bf16, x, x, w, rstd); }, "rmsnorm_backward: dw");
  Tensor dx_gpu = fake_cuda(dx);
  expect_error([&] { rmsnorm_backward(dx_gpu, dw, x, x, w, rstd); }, "rmsnorm_backward: dx");
  const Tensor dy_tall = random_tensor({5, 16}, DType::bf16, 64);
  expect_error([&] { rmsnorm_backward(dx, dw, dy_tall, x, w, rstd); }, "rmsnorm_backward: dy");
}

// ---- SwiGLU ------------------------------------------------------------------------------------

constexpr int64_t kTokens = 29, kInter = 77;

double sigmoid(double g) { return 1 / (1 + std::exp(-g)); }

TEST(SwiGlu, ForwardAndBackwardMatchDoubleReference) {
  for (DType type : kActs) {
    SCOPED_TRACE(dtype_name(type));
    // Rows from 1e-3 to 1e2: the gate reaches the saturated ends of the sigmoid (and exp overflow).
    const Tensor gate_up = random_tensor({kTokens, 2 * kInter}, type, 70, true);
    const Tensor dout = random_tensor({kTokens, kInter}, type, 71);
    Tensor out = poisoned({kTokens, kInter}, type),
           dgate_up = poisoned({kTokens, 2 * kInter}, type);
    swiglu_forward(out, gate_up);
    swiglu_backward(dgate_up, dout, gate_up);

    const std::vector<double> gu = to_double(gate_up), d = to_double(dout);
    std::vector<double> out_ref(d.size()), dgu_ref(gu.size());
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t i = 0; i < kInter; ++i) {
        const size_t gi = size_t(t * 2 * kInter + i), ui = gi + size_t(kInter),
                     oi = size_t(t * kInter + i);
        const double g = gu[gi], u = gu[ui], s = sigmoid(g);
        out_ref[oi] = g * s * u;
        dgu_ref[gi] = d[oi] * u * (s + g * s * (1 - s));
        dgu_ref[ui] = d[oi] * g * s;
      }
    EXPECT_LE(worst_row_error(to_double(out), out_ref, kInter), tol(type));
    EXPECT_LE(worst_row_error(to_double(dgate_up), dgu_ref, 2 * kInter), tol(type));
  }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  const int64_t T = 4, I = 20;
  Tensor gate_up = random_tensor({T, 2 * I}, DType::f32, 80);
  const Tensor r = random_tensor({T, I}, DType::f32, 81);
  Tensor out = Tensor::empty({T, I}, DType::f32);
  const auto forward = [&] {
    swiglu_forward(out, gate_up);
    return out;
  };
  // h = 1e-2 on O(1) inputs: truncation ~h², rounding ~1e-7·|L|/h, both ~1e-4 of the gradient.
  const std::vector<double> numeric = finite_diff(gate_up, r, forward, 1e-2f);
  Tensor dgate_up = poisoned({T, 2 * I}, DType::f32);
  swiglu_backward(dgate_up, r, gate_up);
  EXPECT_LE(rel_error(to_double(dgate_up), numeric), 1e-3);
}

TEST(SwiGlu, RowsAreIndependentOfTheBatch) {
  const Tensor gate_up = random_tensor({kTokens, 2 * kInter}, DType::bf16, 85);
  Tensor out = Tensor::empty({kTokens, kInter}, DType::bf16);
  with_threads(3, [&] { swiglu_forward(out, gate_up); });
  for (int64_t row : {int64_t(0), int64_t(11), kTokens - 1}) {
    const Tensor one = gate_up.rows(row, row + 1).to(Device::cpu);
    Tensor out1 = Tensor::empty({1, kInter}, DType::bf16);
    with_threads(1, [&] { swiglu_forward(out1, one); });
    EXPECT_TRUE(same_bytes(out1, out.rows(row, row + 1))) << "row " << row;
  }
}

TEST(SwiGlu, BadArgumentsAreClearErrors) {
  const Tensor odd = random_tensor({3, 9}, DType::bf16, 90);
  Tensor out = Tensor::empty({3, 4}, DType::bf16);
  expect_error([&] { swiglu_forward(out, odd); }, "swiglu_forward: gate_up");
  const Tensor gate_up = random_tensor({3, 8}, DType::bf16, 91);
  Tensor out_wide = Tensor::empty({3, 8}, DType::bf16);
  expect_error([&] { swiglu_forward(out_wide, gate_up); }, "swiglu_forward: out");
  Tensor dgate_up = Tensor::empty({3, 8}, DType::bf16),
         dgate_up_short = Tensor::empty({3, 4}, DType::bf16);
  expect_error([&] { swiglu_backward(dgate_up_short, out, gate_up); }, "swiglu_backward: dgate_up");
  const Tensor dout_int = Tensor::zeros({3, 4}, DType::i32);
  expect_error([&] { swiglu_backward(dgate_up, dout_int, gate_up); }, "swiglu_backward: dout");
}

// ---- elementwise -------------------------------------------------------------------------------

constexpr int64_t kT = 17, kN = 300;  // 5100 elements: more than one 4096-element chunk

TEST(Elementwise, AddIntoMatchesDoubleReference) {
  for (DType y_type : kActs)
    for (DType x_type : kActs) {
      SCOPED_TRACE(std::string(dtype_name(y_type)) + " y, " + std::string(dtype_name(x_type)) +
                   " x");
      Tensor y = random_tensor({kT, kN}, y_type, 100);
      const Tensor x = random_tensor({kT, kN}, x_type, 101);
      std::vector<double> ref = to_double(y);
      const std::vector<double> xd = to_double(x);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += xd[i];
      add_into(y, x);
      EXPECT_LE(rel_error(to_double(y), ref), tol(y_type));
    }
}

TEST(Elementwise, AddBiasMatchesDoubleReference) {
  const Tensor b = random_tensor({kN}, DType::f32, 110);
  for (DType type : kActs) {
    SCOPED_TRACE(dtype_name(type));
    Tensor y = random_tensor({kT, kN}, type, 111);
    std::vector<double> ref = to_double(y);
    const std::vector<double> bd = to_double(b);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += bd[i % size_t(kN)];
    add_bias(y, b);
    EXPECT_LE(rel_error(to_double(y), ref), tol(type));
  }
}

TEST(Elementwise, BiasBackwardAccumulatesRowsDeterministically) {
  const int64_t T = 517;
  for (DType type : kActs) {
    SCOPED_TRACE(dtype_name(type));
    const Tensor dy = random_tensor({T, kN}, type, 120);
    const Tensor db0 = random_tensor({kN}, DType::f32, 121);
    std::vector<double> ref = to_double(db0);
    const std::vector<double> dyd = to_double(dy);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < kN; ++n) ref[size_t(n)] += dyd[size_t(t * kN + n)];
    Tensor one = db0.to(Device::cpu), three = db0.to(Device::cpu);
    with_threads(1, [&] { bias_backward(one, dy); });
    with_threads(3, [&] { bias_backward(three, dy); });
    // 517 fp32 additions of O(1) terms into a sum of O(√517): ≲ 517 · 2^-24 · 1 / √517 ≈ 1e-6.
    EXPECT_LE(rel_error(to_double(three), ref), kF32Tol);
    EXPECT_TRUE(same_bytes(one, three)) << "the sums depend on the thread count";
  }
}

TEST(Elementwise, ConvertRoundsToNearestEven) {
  for (DType src_type : kActs)
    for (DType dst_type : kActs) {
      SCOPED_TRACE(std::string(dtype_name(src_type)) + " -> " + std::string(dtype_name(dst_type)));
      const Tensor src = random_tensor({3, 5000}, src_type, 130);
      Tensor dst = poisoned({3, 5000}, dst_type);
      convert(dst, src);
      std::vector<double> expected = to_double(src);
      if (dst_type == DType::bf16)
        for (double& v : expected) v = double(round_to_bf16(float(v)));
      EXPECT_EQ(to_double(dst), expected);
    }
}

TEST(Elementwise, SumSquaresIsAccurateAndDeterministic) {
  const Tensor x = random_tensor({7, 14291}, DType::f32, 140, true);  // 100037 elements
  double ref = 0;
  for (double v : to_double(x)) ref += v * v;
  double one = 0, three = 0;
  with_threads(1, [&] { one = sum_squares(x); });
  with_threads(3, [&] { three = sum_squares(x); });
  // Squares of floats are exact in double; 1e5 double additions: ≤ 1e5 · 2^-53 ≈ 1e-11.
  EXPECT_NEAR(three, ref, 1e-11 * ref);
  EXPECT_EQ(one, three) << "the sum depends on the thread count";
}

// The list form (the global gradient norm's) gives each tensor's single-tensor bits, in order.
TEST(Elementwise, SumSquaresOfAListIsEachTensorsSum) {
  const Tensor a = random_tensor({3, 5000}, DType::f32, 141, true), b = random_tensor({17}, DType::f32, 142),
               empty = Tensor::zeros({0}, DType::f32);
  const std::vector<double> sums = sum_squares({&a, &empty, &b});
  ASSERT_EQ(sums.size(), 3u);
  EXPECT_EQ(sums[0], sum_squares(a));
  EXPECT_EQ(sums[1], 0.0);
  EXPECT_EQ(sums[2], sum_squares(b));
  EXPECT_TRUE(sum_squares(std::vector<const Tensor*>{}).empty());
  const Tensor y = random_tensor({4, 8}, DType::bf16, 143);
  expect_error([&] { sum_squares({&a, &y}); }, "sum_squares: x");
}

TEST(Elementwise, BadArgumentsAreClearErrors) {
  Tensor y = random_tensor({4, 8}, DType::bf16, 150);
  const Tensor x_wide = random_tensor({4, 9}, DType::bf16, 151);
  expect_error([&] { add_into(y, x_wide); }, "add_into: x");
  const Tensor b_bf16 = random_tensor({8}, DType::bf16, 152),
               b_short = random_tensor({7}, DType::f32, 153);
  expect_error([&] { add_bias(y, b_bf16); }, "add_bias: b");
  expect_error([&] { add_bias(y, b_short); }, "add_bias: b");
  Tensor flat = y.reshape({32});
  const Tensor b = random_tensor({8}, DType::f32, 154);
  expect_error([&] { add_bias(flat, b); }, "add_bias: y");
  Tensor db_short = Tensor::zeros({7}, DType::f32);
  expect_error([&] { bias_backward(db_short, y); }, "bias_backward: db");
  Tensor dst_int = Tensor::empty({4, 8}, DType::i32);
  expect_error([&] { convert(dst_int, y); }, "convert: dst");
  expect_error([&] { sum_squares(y); }, "sum_squares: x");
}

// ---- AdamW -------------------------------------------------------------------------------------

TEST(AdamW, ThreeStepsMatchDoubleReference) {
  const Shape shape = {37, 41};
  const AdamWHyper hyper{
      .lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  const float grad_scale = 0.7f;
  Tensor param = random_tensor(shape, DType::f32, 160);
  Tensor m = Tensor::zeros(shape, DType::f32), v = Tensor::zeros(shape, DType::f32);
  const std::vector<double> p0 = to_double(param);
  std::vector<double> p = p0, md(p.size()), vd(p.size());
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE(step);
    const Tensor grad = random_tensor(shape, DType::f32, 160 + uint64_t(step), true);
    adamw_step(param, m, v, grad, hyper, step, grad_scale);

    const std::vector<double> g = to_double(grad);
    const double b1 = hyper.beta1, b2 = hyper.beta2;
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] * double(grad_scale);
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      const double mhat = md[i] / (1 - std::pow(b1, double(step)));
      const double vhat = vd[i] / (1 - std::pow(b2, double(step)));
      p[i] -= double(hyper.lr) *
              (mhat / (std::sqrt(vhat) + double(hyper.eps)) + double(hyper.weight_decay) * p[i]);
    }
    // m, v: two fp32 roundings a step. The update (Δp ~ 0.05 a step) is compared on its own so that
    // the fp32 storage of p (6e-8 of |p| ~ 1) stays ~1e-6 of it.
    EXPECT_LE(rel_error(to_double(m), md), kF32Tol);
    EXPECT_LE(rel_error(to_double(v), vd), kF32Tol);
    std::vector<double> delta = to_double(param), delta_ref = p;
    for (size_t i = 0; i < p.size(); ++i) {
      delta[i] -= p0[i];
      delta_ref[i] -= p0[i];
    }
    EXPECT_LE(rel_error(delta, delta_ref), kF32Tol);
  }
}

TEST(AdamW, BadArgumentsAreClearErrors) {
  Tensor p = random_tensor({8}, DType::f32, 170), m = Tensor::zeros({8}, DType::f32);
  Tensor v = Tensor::zeros({8}, DType::f32);
  const Tensor g = random_tensor({8}, DType::f32, 171);
  const AdamWHyper hyper;
  expect_error([&] { adamw_step(p, m, v, g, hyper, 0, 1.0f); }, "adamw_step: step");
  Tensor m_long = Tensor::zeros({9}, DType::f32);
  expect_error([&] { adamw_step(p, m_long, v, g, hyper, 1, 1.0f); }, "adamw_step: m");
  const Tensor g_bf16 = random_tensor({8}, DType::bf16, 172);
  expect_error([&] { adamw_step(p, m, v, g_bf16, hyper, 1, 1.0f); }, "adamw_step: grad");
  Tensor v_gpu = fake_cuda(v);
  expect_error([&] { adamw_step(p, m, v_gpu, g, hyper, 1, 1.0f); }, "adamw_step: v");
  AdamWHyper bad_beta;
  bad_beta.beta2 = 1.0f;
  expect_error([&] { adamw_step(p, m, v, g, bad_beta, 1, 1.0f); }, "beta2 = 1");
  expect_error([&] { adamw_step(p, m, v, g, hyper, 1, std::nanf("")); }, "adamw_step: grad_scale");
}

// ---- fused fp8 producers -----------------------------------------------------------------------

Fp8Rows poisoned_fp8(int64_t rows, int64_t cols, bool columnwise) {
  Fp8Rows q = columnwise ? Fp8Rows::empty_columnwise(rows, cols, Device::cpu)
                         : Fp8Rows::empty(rows, cols, Device::cpu);
  q.data.fill_bytes(0xFF);
  q.scales.fill_bytes(0xFF);
  return q;
}

void expect_same_fp8(const Fp8Rows& a, const Fp8Rows& b, const char* what) {
  EXPECT_TRUE(same_bytes(a.data, b.data)) << what << " data";
  EXPECT_TRUE(same_bytes(a.scales, b.scales)) << what << " scales";
}

constexpr int64_t kFp8Rows = 37, kFp8Cols = 256;  // 37 rows: a partial group of 128 tokens

// The reference of the fused producer is the composition, through a bf16 y whatever x's dtype.
TEST(LayerFp8, RmsNormFp8IsRmsNormThenQuantization) {
  const Tensor w = random_tensor({kFp8Cols}, DType::f32, 200);
  for (DType x_type : kActs)
    for (ScaleFormat format : {ScaleFormat::fp32, ScaleFormat::pow2}) {
      SCOPED_TRACE(std::string(dtype_name(x_type)) + (format == ScaleFormat::pow2 ? " pow2" : ""));
      const Tensor x = random_tensor({kFp8Rows, kFp8Cols}, x_type, 201, true);
      Tensor y = poisoned({kFp8Rows, kFp8Cols}, DType::bf16), rstd = poisoned({kFp8Rows}, DType::f32);
      rmsnorm_forward(y, rstd, x, w, kEps);
      Fp8Rows rows = poisoned_fp8(kFp8Rows, kFp8Cols, false), cols = poisoned_fp8(kFp8Rows, kFp8Cols, true);
      quantize_rows_and_columns(rows, cols, y, format);

      Fp8Rows f_rows = poisoned_fp8(kFp8Rows, kFp8Cols, false), f_cols = poisoned_fp8(kFp8Rows, kFp8Cols, true);
      Tensor f_rstd = poisoned({kFp8Rows}, DType::f32);
      rmsnorm_forward_fp8(f_rows, f_cols, f_rstd, x, w, kEps, format);
      expect_same_fp8(f_rows, rows, "rows");
      expect_same_fp8(f_cols, cols, "columns");
      EXPECT_TRUE(same_bytes(f_rstd, rstd));

      Fp8Rows i_rows = poisoned_fp8(kFp8Rows, kFp8Cols, false), none;  // inference: rows only
      Tensor i_rstd = poisoned({kFp8Rows}, DType::f32);
      rmsnorm_forward_fp8(i_rows, none, i_rstd, x, w, kEps, format);
      expect_same_fp8(i_rows, rows, "rows only");
      EXPECT_TRUE(same_bytes(i_rstd, rstd));
    }
}

// With a residual: add_into, then the fused producer (itself the composition, above).
TEST(LayerFp8, RmsNormFp8ResidualIsAddIntoThenRmsNormFp8) {
  const Tensor w = random_tensor({kFp8Cols}, DType::f32, 205);
  for (int64_t R : {int64_t(1), kFp8Rows})
    for (DType x_type : kActs) {
      SCOPED_TRACE(std::to_string(R) + " rows, " + std::string(dtype_name(x_type)));
      const Tensor x0 = random_tensor({R, kFp8Cols}, x_type, 206, true);
      const Tensor residual = random_tensor({R, kFp8Cols}, x_type, 207, true);
      Tensor sum = x0.to(Device::cpu);
      add_into(sum, residual);
      Fp8Rows rows = poisoned_fp8(R, kFp8Cols, false), cols = poisoned_fp8(R, kFp8Cols, true);
      Tensor rstd = poisoned({R}, DType::f32);
      rmsnorm_forward_fp8(rows, cols, rstd, sum, w, kEps, ScaleFormat::pow2);

      Tensor x = x0.to(Device::cpu);
      Fp8Rows f_rows = poisoned_fp8(R, kFp8Cols, false), f_cols = poisoned_fp8(R, kFp8Cols, true);
      Tensor f_rstd = poisoned({R}, DType::f32);
      rmsnorm_forward_fp8(f_rows, f_cols, f_rstd, x, residual, w, kEps, ScaleFormat::pow2);
      EXPECT_TRUE(same_bytes(x, sum));
      expect_same_fp8(f_rows, rows, "rows");
      expect_same_fp8(f_cols, cols, "columns");
      EXPECT_TRUE(same_bytes(f_rstd, rstd));

      x = x0.to(Device::cpu);
      Fp8Rows i_rows = poisoned_fp8(R, kFp8Cols, false), none;  // inference: rows only
      Tensor i_rstd = poisoned({R}, DType::f32);
      rmsnorm_forward_fp8(i_rows, none, i_rstd, x, residual, w, kEps, ScaleFormat::pow2);
      EXPECT_TRUE(same_bytes(x, sum));
      expect_same_fp8(i_rows, rows, "rows only");
      EXPECT_TRUE(same_bytes(i_rstd, rstd));
    }
}

TEST(LayerFp8, SwiGluFp8IsSwiGluThenQuantization) {
  for (DType type : kActs)
    for (ScaleFormat format : {ScaleFormat::fp32, ScaleFormat::pow2}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + (format == ScaleFormat::pow2 ? " pow2" : ""));
      const Tensor gate_up = random_tensor({kFp8Rows, 2 * kFp8Cols}, type, 210, true);
      Tensor out = poisoned({kFp8Rows, kFp8Cols}, DType::bf16);
      swiglu_forward(out, gate_up);
      Fp8Rows rows = poisoned_fp8(kFp8Rows, kFp8Cols, false), cols = poisoned_fp8(kFp8Rows, kFp8Cols, true);
      quantize_rows_and_columns(rows, cols, out, format);

      Fp8Rows f_rows = poisoned_fp8(kFp8Rows, kFp8Cols, false), f_cols = poisoned_fp8(kFp8Rows, kFp8Cols, true);
      swiglu_forward_fp8(f_rows, f_cols, gate_up, format);
      expect_same_fp8(f_rows, rows, "rows");
      expect_same_fp8(f_cols, cols, "columns");

      Fp8Rows i_rows = poisoned_fp8(kFp8Rows, kFp8Cols, false), none;
      swiglu_forward_fp8(i_rows, none, gate_up, format);
      expect_same_fp8(i_rows, rows, "rows only");
    }
}

// The recompute path's SwiGLU ops on the E4M3 input are dequantize (into bf16), then the op.
TEST(LayerFp8, SwiGluOnE4m3InputIsDequantizeThenSwiGlu) {
  const Tensor gate_up = random_tensor({kFp8Rows, 2 * kFp8Cols}, DType::bf16, 230, true);
  Fp8Rows q = Fp8Rows::empty(kFp8Rows, 2 * kFp8Cols, Device::cpu);
  quantize_rows(q, gate_up);
  Tensor deq = poisoned({kFp8Rows, 2 * kFp8Cols}, DType::bf16);
  dequantize(deq, q);
  const Tensor dout = random_tensor({kFp8Rows, kFp8Cols}, DType::bf16, 231);

  Tensor d = poisoned({kFp8Rows, 2 * kFp8Cols}, DType::bf16), f_d = poisoned({kFp8Rows, 2 * kFp8Cols}, DType::bf16);
  swiglu_backward(d, dout, deq);
  swiglu_backward(f_d, dout, q);
  EXPECT_TRUE(same_bytes(f_d, d));

  Fp8Rows rows = poisoned_fp8(kFp8Rows, kFp8Cols, false), cols = poisoned_fp8(kFp8Rows, kFp8Cols, true);
  swiglu_forward_fp8(rows, cols, deq);
  Fp8Rows f_rows = poisoned_fp8(kFp8Rows, kFp8Cols, false), f_cols = poisoned_fp8(kFp8Rows, kFp8Cols, true);
  swiglu_forward_fp8(f_rows, f_cols, q);
  expect_same_fp8(f_rows, rows, "rows");
  expect_same_fp8(f_cols, cols, "columns");
}

TEST(LayerFp8, BadArgumentsAreClearErrors) {
  // Widths that are multiples of 16 are taken (partial 128-groups, numerics/quantize.h); others not.
  const Tensor x = random_tensor({4, 200}, DType::bf16, 220), w = random_tensor({200}, DType::f32, 221);
  Tensor rstd = Tensor::empty({4}, DType::f32);
  Fp8Rows none;
  expect_error([&] { rmsnorm_forward_fp8(none, none, rstd, x, w, kEps); },
               "rmsnorm_forward_fp8: x: the row width must be a multiple of 16");
  const Tensor x128 = random_tensor({4, 128}, DType::bf16, 222), w128 = random_tensor({128}, DType::f32, 223);
  expect_error([&] { rmsnorm_forward_fp8(none, none, rstd, x128, w128, kEps); },
               "rmsnorm_forward_fp8: y_rows");
  Fp8Rows rows = Fp8Rows::empty(4, 128, Device::cpu), rows_not_columns = Fp8Rows::empty(4, 128, Device::cpu);
  expect_error([&] { rmsnorm_forward_fp8(rows, rows_not_columns, rstd, x128, w128, kEps); },
               "rmsnorm_forward_fp8: y_cols");
  expect_error([&] { rmsnorm_forward_fp8(rows, none, rstd, x128, w128, -1.0f); }, "eps");
  expect_error([&] { swiglu_forward_fp8(rows, none, x); },
               "swiglu_forward_fp8: gate_up: the output width (100) must be a multiple of 16");
  const Tensor gate_up = random_tensor({4, 256}, DType::bf16, 224);
  expect_error([&] { swiglu_forward_fp8(rows, rows_not_columns, gate_up); }, "swiglu_forward_fp8: out_cols");
  Fp8Rows wide = Fp8Rows::empty(4, 256, Device::cpu);
  expect_error([&] { swiglu_forward_fp8(wide, none, gate_up); }, "swiglu_forward_fp8: out_rows");

  // E4M3 inputs: whole groups of gate and of up, scales of the Fp8Rows layout, a matching dout.
  const Fp8Rows q256 = Fp8Rows::empty(4, 256, Device::cpu);
  const Fp8Rows partial_groups{Tensor::empty({4, 192}, DType::e4m3), Tensor::empty({1, 4}, DType::f32)};
  Tensor dout = Tensor::empty({4, 128}, DType::bf16), dgate_up = Tensor::empty({4, 256}, DType::bf16);
  expect_error([&] { swiglu_backward(dgate_up, dout, partial_groups); },
               "swiglu_backward: gate_up: expected an Fp8Rows [T, 2I] (2I a multiple of 128");
  expect_error([&] { swiglu_backward(dgate_up, dout, none); }, "swiglu_backward: gate_up");
  Fp8Rows bad_scales{q256.data, Tensor::empty({2, 5}, DType::f32)};
  expect_error([&] { swiglu_backward(dgate_up, dout, bad_scales); }, "swiglu_backward: gate_up");
  Tensor dout_short = Tensor::empty({3, 128}, DType::bf16);
  expect_error([&] { swiglu_backward(dgate_up, dout_short, q256); }, "swiglu_backward: dout");
  expect_error([&] { swiglu_forward_fp8(wide, none, q256); }, "swiglu_forward_fp8: out_rows");
  Fp8Rows i64 = Fp8Rows::empty(4, 128, Device::cpu);  // I = 64: a partial output group, taken
  quantize_rows(i64, random_tensor({4, 128}, DType::bf16, 225));
  EXPECT_NO_THROW(swiglu_forward_fp8(rows, none, i64));
  Tensor x80 = random_tensor({4, 80}, DType::bf16, 226);
  expect_error([&] { swiglu_forward_fp8(rows, none, x80); },
               "swiglu_forward_fp8: gate_up: the output width (40) must be a multiple of 16");
}

// ---- CUDA tensors ------------------------------------------------------------------------------

// GPU tensors are refused by name before their memory is touched: by every op in a build without
// CUDA, and as f32 activations (the CUDA layer kernels take bf16) in a build with it.
TEST(LayerOps, CudaTensorsAreRefusedByName) {
  const Tensor a = random_tensor({4, 8}, DType::f32, 180), w = random_tensor({8}, DType::f32, 181);
  const Tensor r = Tensor::zeros({4}, DType::f32), tok = Tensor::zeros({4}, DType::i32);
  const Tensor out = Tensor::empty({4, 4}, DType::f32);
  Tensor ga = fake_cuda(a), gb = fake_cuda(a), gw = fake_cuda(w), gr = fake_cuda(r);
  Tensor gout = fake_cuda(out);
  const Tensor gtok = fake_cuda(tok);
  expect_error([&] { embedding_forward(ga, gtok, gb); }, "embedding_forward: ");
  expect_error([&] { rmsnorm_forward(ga, gr, gb, gw, kEps); }, "rmsnorm_forward: ");
  expect_error([&] { swiglu_forward(gout, ga); }, "swiglu_forward: ");
  // f32 is a CUDA type of these two (gradient accumulation, norms): refused only without CUDA.
  if (!built_with_cuda()) expect_error([&] { add_into(ga, gb); }, "add_into: ");
  if (!built_with_cuda()) expect_error([&] { sum_squares(ga); }, "sum_squares: ");
}

}  // namespace
}  // namespace lockstep
