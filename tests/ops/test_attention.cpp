// qkv_rope (q/k norm + RoPE), rope_inv_freq and attention (packed training forward and backward,
// paged KV cache) against double-precision references written here, central finite differences of
// those references for every backward, and bit identity between training and paged inference rows.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <numeric>
#include <random>
#include <string>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/kv_fp8.h"
#include "ops/qkv_rope.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::poisoned;
using testing::random_tensor;
using testing::rel_error;
using testing::same_bytes;
using testing::to_double;
using Vec = std::vector<double>;

// ---- inputs ----------------------------------------------------------------------------------

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

// Values rounded to `dtype` (a test input, or an f32 point for finite differences).
Tensor tensor_of(const Vec& v, const Shape& shape, DType dtype) {
  Tensor f = Tensor::empty(shape, DType::f32);
  for (size_t i = 0; i < v.size(); ++i) f.data_as<float>()[i] = float(v[i]);
  if (dtype == DType::f32) return f;
  Tensor b = Tensor::empty(shape, DType::bf16);
  for (size_t i = 0; i < v.size(); ++i) b.data_as<bf16>()[i] = float_to_bf16(float(v[i]));
  return b;
}

// Packed sequences of the given lengths.
struct Batch {
  std::vector<int32_t> lens;

  int64_t tokens() const { return std::accumulate(lens.begin(), lens.end(), int64_t(0)); }
  std::vector<int32_t> cu() const {
    std::vector<int32_t> c{0};
    for (int32_t n : lens) c.push_back(c.back() + n);
    return c;
  }
  // Positions restart at 0 in every sequence.
  std::vector<int32_t> positions() const {
    std::vector<int32_t> p;
    for (int32_t n : lens)
      for (int32_t i = 0; i < n; ++i) p.push_back(i);
    return p;
  }
};

double weighted_sum(const Vec& r, const Vec& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
  return s;
}

// Central differences of `loss` at x for the coordinates in `coords`. x is an f32 point and so is
// every perturbed point: x_i ± h rounded to f32, with the step actually taken.
Vec central_differences(const Vec& x, const std::vector<size_t>& coords, double h,
                        const std::function<double(const Vec&)>& loss) {
  Vec grad;
  Vec p = x;
  for (size_t i : coords) {
    const double plus = float(x[i] + h), minus = float(x[i] - h);
    p[i] = plus;
    const double lp = loss(p);
    p[i] = minus;
    const double lm = loss(p);
    p[i] = x[i];
    grad.push_back((lp - lm) / (plus - minus));
  }
  return grad;
}

std::vector<size_t> all_coords(size_t n) {
  std::vector<size_t> c(n);
  std::iota(c.begin(), c.end(), size_t(0));
  return c;
}

// The worst ‖out − ref‖/‖ref‖ over the heads (chunks of head_dim) of all rows: rows of very
// different magnitudes cannot hide one another's errors.
double worst_head_error(const Vec& out, const Vec& ref, int64_t head_dim) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); i += size_t(head_dim)) {
    const size_t end = i + size_t(head_dim);
    const double e = rel_error(Vec(out.begin() + long(i), out.begin() + long(end)),
                               Vec(ref.begin() + long(i), ref.begin() + long(end)));
    worst = std::isnan(e) ? e : std::max(worst, e);
    if (std::isnan(worst)) break;
  }
  return worst;
}

Vec pick(const Vec& v, const std::vector<size_t>& coords) {
  Vec out;
  for (size_t i : coords) out.push_back(v[i]);
  return out;
}

Vec concat(Vec a, const Vec& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- rope_inv_freq -----------------------------------------------------------------------------

TEST(RopeInvFreq, DefaultIsTheCorrectlyRoundedFp32Formula) {
  for (const auto& [dim, theta] : std::vector<std::pair<int64_t, double>>{
           {128, 1e6}, {64, 1e6}, {128, 5e5}, {64, 1e4}, {80, 1e4}, {2, 1e4}}) {
    const Tensor inv = rope_inv_freq(dim, theta, std::nullopt);
    ASSERT_EQ(inv.shape(), Shape{dim / 2});
    for (int64_t i = 0; i < dim / 2; ++i) {
      // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in fp32; the fp32 pow
      // correctly rounded (double pow, rounded once).
      const float exponent = float(2 * i) / float(dim);
      const float expected = 1.0f / float(std::pow(double(float(theta)), double(exponent)));
      const float got = inv.data_as<float>()[i];
      EXPECT_EQ(got, expected) << "dim " << dim << " theta " << theta << " i " << i;
      // And within 2 ulps of the exact value (two fp32 roundings plus the exponent's).
      const double exact = std::pow(theta, -2.0 * double(i) / double(dim));
      EXPECT_LE(std::abs(got - exact), 2.5 * std::ldexp(exact, -23)) << "i " << i;
    }
  }
}

TEST(RopeInvFreq, Llama3ScalingFollowsTransformers) {
  // Llama 3.1 8B (factor 8) and Llama 3.2 (factor 32).
  for (double factor : {8.0, 32.0}) {
    const RopeScaling scaling{factor, 1.0, 4.0, 8192};
    const int64_t dim = 128;
    const Tensor plain = rope_inv_freq(dim, 5e5, std::nullopt);
    const Tensor scaled = rope_inv_freq(dim, 5e5, scaling);
    int low = 0, medium = 0, high = 0;
    for (int64_t i = 0; i < dim / 2; ++i) {
      const float inv = plain.data_as<float>()[i], got = scaled.data_as<float>()[i];
      // _compute_llama3_parameters, evaluated here in double from the (fp32) default frequency.
      const double wavelen = 2 * std::numbers::pi / double(inv);
      if (wavelen < 8192.0 / 4.0) {
        ++high;
        EXPECT_EQ(got, inv) << "high frequency " << i << " is unchanged";
      } else if (wavelen > 8192.0 / 1.0) {
        ++low;
        EXPECT_EQ(got, inv / float(factor)) << "low frequency " << i << " is divided by the factor";
      } else {
        ++medium;
        const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
        const double expected = (1 - smooth) * double(inv) / factor + smooth * double(inv);
        // A handful of fp32 operations on values of similar size: a few ulps.
        EXPECT_NEAR(got, expected, 8 * std::ldexp(expected, -24)) << "medium frequency " << i;
      }
    }
    // theta 5e5, dim 128: the three bands are all present.
    EXPECT_GT(low, 0);
    EXPECT_GT(medium, 0);
    EXPECT_GT(high, 0);
  }
}

TEST(RopeInvFreq, BadArguments) {
  expect_error([] { rope_inv_freq(7, 1e4, std::nullopt); }, "head_dim");
  expect_error([] { rope_inv_freq(64, -1, std::nullopt); }, "rope_theta");
  expect_error([] { rope_inv_freq(64, 5e5, RopeScaling{8, 4, 1, 8192}); }, "high_freq_factor");
}

// ---- qkv_rope ----------------------------------------------------------------------------------

constexpr float kEps = 1e-6f;

struct RopeRef {
  Vec out, rstd;
};

// The contract of ops/qkv_rope.h in double, except the angle: float(position) · inv_freq is one
// fp32 product by contract (as in transformers), so the reference takes that product in fp32 too.
RopeRef ref_qkv_rope(const Vec& qkv, const std::vector<int32_t>& pos,
                     const std::vector<float>& freq, const Vec& q_norm, const Vec& k_norm,
                     const HeadLayout& l) {
  const int64_t T = int64_t(pos.size()), W = l.qkv_width(), d = l.head_dim, half = d / 2;
  const int64_t heads = l.q_heads + l.kv_heads;
  const bool norm = !q_norm.empty();
  RopeRef r{qkv, Vec(size_t(T * heads))};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < heads; ++k) {
      double* x = &r.out[size_t(t * W + k * d)];
      if (norm) {
        const Vec& w = k < l.q_heads ? q_norm : k_norm;
        double ss = 0;
        for (int64_t c = 0; c < d; ++c) ss += x[c] * x[c];
        const double rstd = 1 / std::sqrt(ss / double(d) + double(kEps));
        r.rstd[size_t(t * heads + k)] = rstd;
        for (int64_t c = 0; c < d; ++c) x[c] *= rstd * w[size_t(c)];
      }
      for (int64_t i = 0; i < half; ++i) {
        const double angle = float(pos[size_t(t)]) * freq[size_t(i)];
        const double a = x[i], b = x[i + half];
        x[i] = a * std::cos(angle) - b * std::sin(angle);
        x[i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  return r;
}

std::vector<float> floats(const Tensor& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

struct RopeCase {
  HeadLayout layout;
  DType dtype;
  bool norm;
};

std::string describe(const RopeCase& c) {
  return "heads " + std::to_string(c.layout.q_heads) + "/" + std::to_string(c.layout.kv_heads) +
         " d " + std::to_string(c.layout.head_dim) + " " + std::string(dtype_name(c.dtype)) +
         (c.norm ? " norm" : " no norm");
}

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> cases;
  for (HeadLayout l : {HeadLayout{4, 2, 16}, HeadLayout{4, 1, 16}, HeadLayout{2, 2, 8}})
    for (DType dtype : {DType::f32, DType::bf16})
      for (bool norm : {true, false}) cases.push_back({l, dtype, norm});
  return cases;
}

TEST(QkvRope, ForwardMatchesDoubleReference) {
  for (const RopeCase& rc : rope_cases()) {
    SCOPED_TRACE(describe(rc));
    const HeadLayout& l = rc.layout;
    const Batch batch{{1, 6, 13, 4}};
    std::vector<int32_t> pos = batch.positions();
    for (int i = 0; i < 4; ++i) pos.push_back(3000 + i);  // a late chunk, as in generation
    const int64_t T = int64_t(pos.size()), heads = l.q_heads + l.kv_heads;
    const Tensor qkv = random_tensor({T, l.qkv_width()}, rc.dtype, 1, true);
    const Tensor freq = rope_inv_freq(l.head_dim, 1e4, std::nullopt);
    Tensor q_norm, k_norm, rstd;
    Vec qn, kn;
    if (rc.norm) {
      q_norm = random_tensor({l.head_dim}, DType::f32, 2);
      k_norm = random_tensor({l.head_dim}, DType::f32, 3);
      qn = to_double(q_norm);
      kn = to_double(k_norm);
      rstd = poisoned({T, heads}, DType::f32);
    }
    Tensor out = poisoned({T, l.qkv_width()}, rc.dtype);
    qkv_rope_forward(out, rstd, qkv, i32_tensor(pos), freq, q_norm, k_norm, l, kEps);
    const RopeRef ref = ref_qkv_rope(to_double(qkv), pos, floats(freq), qn, kn, l);
    // f32: a few fp32 roundings per element (norm, rotation, fp32 cos/sin) ≈ 1e-7 relative;
    // bf16: the output rounding, ≤ 2^-8 relative per element (8 significant bits).
    EXPECT_LE(worst_head_error(to_double(out), ref.out, l.head_dim),
              rc.dtype == DType::f32 ? 1e-6 : 4e-3);
    if (rc.norm) {
      EXPECT_LE(rel_error(to_double(rstd), ref.rstd), 1e-6);  // an fp32 sum of d squares
    }
  }
}

TEST(QkvRope, BackwardMatchesFiniteDifferences) {
  for (const RopeCase& rc : rope_cases()) {
    SCOPED_TRACE(describe(rc));
    const HeadLayout& l = rc.layout;
    const Batch batch{{1, 5, 3}};
    const std::vector<int32_t> pos = batch.positions();
    const int64_t T = batch.tokens(), W = l.qkv_width(), d = l.head_dim,
                  heads = l.q_heads + l.kv_heads;
    const Tensor qkv = random_tensor({T, W}, rc.dtype, 11),
                 dout = random_tensor({T, W}, rc.dtype, 12);
    const Tensor freq = rope_inv_freq(d, 1e4, std::nullopt);
    const Tensor positions = i32_tensor(pos);
    Tensor q_norm, k_norm, rstd, dq_norm, dk_norm;
    Vec qn, kn, dq_init, dk_init;
    if (rc.norm) {
      q_norm = random_tensor({d}, DType::f32, 13);
      k_norm = random_tensor({d}, DType::f32, 14);
      qn = to_double(q_norm);
      kn = to_double(k_norm);
      rstd = poisoned({T, heads}, DType::f32);
      dq_norm = random_tensor({d}, DType::f32, 15);  // the weight gradients accumulate
      dk_norm = random_tensor({d}, DType::f32, 16);
      dq_init = to_double(dq_norm);
      dk_init = to_double(dk_norm);
    }
    Tensor out = poisoned({T, W}, rc.dtype), dqkv = poisoned({T, W}, rc.dtype);
    qkv_rope_forward(out, rstd, qkv, positions, freq, q_norm, k_norm, l, kEps);
    qkv_rope_backward(dqkv, dq_norm, dk_norm, dout, qkv, positions, freq, q_norm, k_norm, rstd, l);

    // Finite differences of Σ dout · y over qkv and the norm weights, the reference in double.
    const Vec r = to_double(dout), x0 = concat(concat(to_double(qkv), qn), kn);
    const size_t n_qkv = size_t(T * W);
    const auto loss = [&](const Vec& x) {
      const Vec qkv_x(x.begin(), x.begin() + long(n_qkv));
      const Vec qn_x(x.begin() + long(n_qkv), x.begin() + long(n_qkv + qn.size()));
      const Vec kn_x(x.begin() + long(n_qkv + qn.size()), x.end());
      return weighted_sum(r, ref_qkv_rope(qkv_x, pos, floats(freq), qn_x, kn_x, l).out);
    };
    const Vec fd = central_differences(x0, all_coords(x0.size()), 1e-4, loss);
    const Vec fd_qkv(fd.begin(), fd.begin() + long(n_qkv));
    // f32: fp32 arithmetic (≈ 1e-7) plus the differences' truncation error (h² ≈ 1e-8);
    // bf16: dqkv rounded to bf16, ≤ 2^-8 relative per element.
    const double tol = rc.dtype == DType::f32 ? 1e-6 : 4e-3;
    EXPECT_LE(rel_error(to_double(dqkv), fd_qkv), tol);
    if (rc.norm) {
      Vec dq = to_double(dq_norm), dk = to_double(dk_norm);
      for (size_t i = 0; i < dq.size(); ++i) {
        dq[i] -= dq_init[i];
        dk[i] -= dk_init[i];
      }
      // fp32 sums over the rows and heads of products (for bf16 inputs too): ≈ 1e-7 relative.
      EXPECT_LE(rel_error(dq, Vec(fd.begin() + long(n_qkv), fd.begin() + long(n_qkv + d))), 1e-6);
      EXPECT_LE(rel_error(dk, Vec(fd.begin() + long(n_qkv + d), fd.end())), 1e-6);
    }
  }
}

TEST(QkvRope, BadArguments) {
  const HeadLayout l{4, 2, 8};
  const int64_t T = 5, W = l.qkv_width();
  const Tensor qkv = random_tensor({T, W}, DType::f32, 1),
               freq = rope_inv_freq(8, 1e4, std::nullopt);
  const Tensor w = random_tensor({8}, DType::f32, 2);
  const Tensor pos = i32_tensor({0, 1, 2, 3, 4});
  Tensor out = poisoned({T, W}, DType::f32), rstd = poisoned({T, 6}, DType::f32);
  expect_error(
      [&] {
        qkv_rope_forward(out, rstd, qkv, i32_tensor({0, 1, -2, 3, 4}), freq, w, w, l, kEps);
      },
      "positions: must be >= 0");
  expect_error(
      [&] {
        qkv_rope_forward(out, rstd, qkv, i32_tensor({0, 1, 2}), freq, w, w, l, kEps);
      },
      "qkv_rope_forward: qkv");
  expect_error(
      [&] {
        qkv_rope_forward(out, rstd, qkv, pos.reshape({5, 1}), freq, w, w, l, kEps);
      },
      "positions");
  expect_error([&] { qkv_rope_forward(out, rstd, qkv, pos, freq.rows(0, 2), w, w, l, kEps); },
               "inv_freq");
  expect_error([&] { qkv_rope_forward(out, rstd, qkv, pos, freq, w, Tensor(), l, kEps); },
               "q_norm and k_norm");
  Tensor no_rstd;
  expect_error([&] { qkv_rope_forward(out, no_rstd, qkv, pos, freq, w, w, l, kEps); }, "rstd");
  Tensor out_i32 = Tensor::empty({T, W}, DType::i32);
  expect_error([&] { qkv_rope_forward(out_i32, rstd, qkv, pos, freq, w, w, l, kEps); }, "out");
  expect_error(
      [&] {
        qkv_rope_forward(out, rstd, qkv, pos, freq, w, w, HeadLayout{3, 2, 8}, kEps);
      },
      "kv_heads");
  Tensor dq_bf16 = Tensor::empty({8}, DType::bf16), dk = Tensor::zeros({8}, DType::f32);
  expect_error([&] { qkv_rope_backward(out, dq_bf16, dk, qkv, qkv, pos, freq, w, w, rstd, l); },
               "dq_norm");
  Tensor none;
  expect_error([&] { qkv_rope_backward(out, none, none, qkv, qkv, pos, freq, w, w, rstd, l); },
               "dq_norm");
}

// The inference form is the op followed by kv_cache_write of its output (the same bytes), with
// kv_cache_write's checks.
TEST(QkvRope, InferenceFormIsTheOpThenKvCacheWrite) {
  const HeadLayout l{4, 2, 8};
  const int64_t T = 5, W = l.qkv_width(), blocks = 3, block_size = 4;
  const Tensor qkv = random_tensor({T, W}, DType::bf16, 11), freq = rope_inv_freq(8, 1e4, std::nullopt);
  const Tensor qn = random_tensor({8}, DType::f32, 12), kn = random_tensor({8}, DType::f32, 13);
  const Tensor pos = i32_tensor({4, 0, 9, 2, 30}), slots = i32_tensor({7, 0, 11, 3, 5});
  const Tensor cache0 = random_tensor({blocks, block_size, l.kv_heads, l.head_dim}, DType::bf16, 14);

  Tensor out = poisoned({T, W}, DType::bf16), rstd = poisoned({T, 6}, DType::f32);
  qkv_rope_forward(out, rstd, qkv, pos, freq, qn, kn, l, kEps);
  Tensor k = cache0.to(Device::cpu), v = cache0.to(Device::cpu);
  kv_cache_write({k, v}, out, slots, l);

  Tensor f_out = poisoned({T, W}, DType::bf16), f_rstd = poisoned({T, 6}, DType::f32);
  Tensor f_k = cache0.to(Device::cpu), f_v = cache0.to(Device::cpu);
  qkv_rope_forward(f_out, f_rstd, {f_k, f_v}, slots, qkv, pos, freq, qn, kn, l, kEps);
  EXPECT_TRUE(same_bytes(f_out, out));
  EXPECT_TRUE(same_bytes(f_rstd, rstd));
  EXPECT_TRUE(same_bytes(f_k, k));
  EXPECT_TRUE(same_bytes(f_v, v));
  EXPECT_FALSE(same_bytes(f_k, cache0));  // the cache was written

  expect_error(
      [&] {
        qkv_rope_forward(f_out, f_rstd, {f_k, f_v}, i32_tensor({7, 0, 12, 3, 5}), qkv, pos, freq, qn,
                         kn, l, kEps);
      },
      "kv_cache_write: slots");
}

// ---- attention ---------------------------------------------------------------------------------

struct AttentionRef {
  Vec out, lse;
};

// ops/attention.h's math in double.
AttentionRef ref_attention(const Vec& qkv, const Batch& batch, const HeadLayout& l) {
  const int64_t T = batch.tokens(), W = l.qkv_width(), d = l.head_dim;
  const std::vector<int32_t> cu = batch.cu();
  AttentionRef r{Vec(size_t(T * l.q_width())), Vec(size_t(T * l.q_heads))};
  Vec s;
  for (size_t seq = 0; seq < batch.lens.size(); ++seq)
    for (int64_t t = cu[seq]; t < cu[seq + 1]; ++t)
      for (int64_t h = 0; h < l.q_heads; ++h) {
        const int64_t g = h / l.group();
        const double* q = &qkv[size_t(t * W + h * d)];
        s.clear();
        double max = -INFINITY;
        for (int64_t j = cu[seq]; j <= t; ++j) {
          const double* k = &qkv[size_t(j * W + l.k_offset() + g * d)];
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[c] * k[c];
          s.push_back(dot / std::sqrt(double(d)));
          max = std::max(max, s.back());
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - max));
        double* o = &r.out[size_t(t * l.q_width() + h * d)];
        for (int64_t j = cu[seq]; j <= t; ++j) {
          const double* v = &qkv[size_t(j * W + l.v_offset() + g * d)];
          for (int64_t c = 0; c < d; ++c) o[c] += s[size_t(j - cu[seq])] / sum * v[c];
        }
        r.lse[size_t(t * l.q_heads + h)] = max + std::log(sum);
      }
  return r;
}

struct AttentionCase {
  HeadLayout layout;
  DType dtype;
};

// Head dims cover every column block of the CPU kernels (64, 8 and single columns).
std::vector<AttentionCase> attention_cases(const std::vector<HeadLayout>& layouts) {
  std::vector<AttentionCase> cases;
  for (const HeadLayout& l : layouts)
    for (DType dtype : {DType::f32, DType::bf16}) cases.push_back({l, dtype});
  return cases;
}

std::string describe(const AttentionCase& c) {
  return "heads " + std::to_string(c.layout.q_heads) + "/" + std::to_string(c.layout.kv_heads) +
         " d " + std::to_string(c.layout.head_dim) + " " + std::string(dtype_name(c.dtype));
}

// Random q/k/v, scaled so that the softmax is far from uniform.
Tensor attention_input(int64_t T, const HeadLayout& l, DType dtype, uint64_t seed) {
  Vec v = to_double(random_tensor({T, l.qkv_width()}, DType::f32, seed));
  for (double& x : v) x *= 1.5;
  return tensor_of(v, {T, l.qkv_width()}, dtype);
}

TEST(Attention, ForwardMatchesDoubleReference) {
  const Batch batch{{1, 7, 33, 4, 19}};
  const int64_t T = batch.tokens();
  for (const AttentionCase& ac : attention_cases({{4, 2, 72}, {4, 1, 16}, {2, 2, 10}})) {
    SCOPED_TRACE(describe(ac));
    const HeadLayout& l = ac.layout;
    const Tensor qkv = attention_input(T, l, ac.dtype, 21);
    Tensor out = poisoned({T, l.q_width()}, ac.dtype), lse = poisoned({T, l.q_heads}, DType::f32);
    attention_forward(out, lse, qkv, i32_tensor(batch.cu()), l);
    const AttentionRef ref = ref_attention(to_double(qkv), batch, l);
    // f32: fp32 dot products of ≤ 72 terms and sums of ≤ 33 terms, ≈ 1e-7 relative;
    // bf16: the output rounding, ≤ 2^-8 relative per element. lse is fp32 either way.
    EXPECT_LE(rel_error(to_double(out), ref.out), ac.dtype == DType::f32 ? 1e-6 : 4e-3);
    EXPECT_LE(rel_error(to_double(lse), ref.lse), 1e-6);
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  const Batch batch{{1, 5, 9, 3}};
  const int64_t T = batch.tokens();
  for (const AttentionCase& ac : attention_cases({{4, 2, 16}, {4, 1, 10}, {2, 2, 16}})) {
    SCOPED_TRACE(describe(ac));
    const HeadLayout& l = ac.layout;
    const Tensor qkv = attention_input(T, l, ac.dtype, 31);
    const Tensor dout = random_tensor({T, l.q_width()}, ac.dtype, 32);
    const Tensor cu = i32_tensor(batch.cu());
    Tensor out = poisoned({T, l.q_width()}, ac.dtype), lse = poisoned({T, l.q_heads}, DType::f32);
    Tensor dqkv = poisoned({T, l.qkv_width()}, ac.dtype);
    attention_forward(out, lse, qkv, cu, l);
    attention_backward(dqkv, dout, qkv, out, lse, cu, l);

    const Vec r = to_double(dout);
    const auto loss = [&](const Vec& x) { return weighted_sum(r, ref_attention(x, batch, l).out); };
    const Vec x0 = to_double(qkv);
    const Vec fd = central_differences(x0, all_coords(x0.size()), 1e-4, loss);
    // f32: fp32 arithmetic, with the cancellation in dP − D, ≈ 3e-7 relative, plus the differences'
    // truncation error (h² ≈ 1e-8). bf16: dqkv rounded to bf16 (≤ 2^-8) and D computed from the
    // bf16 output (another ≈ 2^-8 on dS): ≈ 3e-3 measured.
    EXPECT_LE(rel_error(to_double(dqkv), fd), ac.dtype == DType::f32 ? 3e-6 : 8e-3);
  }
}

// The same check against the op's own fp32 forward (not the reference): forward and backward agree.
TEST(Attention, BackwardMatchesFiniteDifferencesOfTheOp) {
  const Batch batch{{3, 8, 1}};
  const HeadLayout l{4, 2, 72};
  const int64_t T = batch.tokens();
  const Tensor qkv = attention_input(T, l, DType::f32, 41);
  const Tensor dout = random_tensor({T, l.q_width()}, DType::f32, 42);
  const Tensor cu = i32_tensor(batch.cu());
  Tensor out = poisoned({T, l.q_width()}, DType::f32), lse = poisoned({T, l.q_heads}, DType::f32);
  Tensor dqkv = poisoned({T, l.qkv_width()}, DType::f32);
  attention_forward(out, lse, qkv, cu, l);
  attention_backward(dqkv, dout, qkv, out, lse, cu, l);

  const Vec r = to_double(dout);
  const auto loss = [&](const Vec& x) {
    Tensor y = Tensor::empty({T, l.q_width()}, DType::f32),
           m = Tensor::empty({T, l.q_heads}, DType::f32);
    attention_forward(y, m, tensor_of(x, {T, l.qkv_width()}, DType::f32), cu, l);
    return weighted_sum(r, to_double(y));
  };
  std::vector<size_t> coords;
  std::mt19937 rng(43);
  for (int i = 0; i < 64; ++i) coords.push_back(rng() % size_t(T * l.qkv_width()));
  const Vec fd = central_differences(to_double(qkv), coords, 1e-2, loss);
  // The loss sums ~3500 fp32 outputs (rounding noise ≈ 2e-6 absolute) and the step is 1e-2:
  // ≈ 1e-4 absolute error on gradients of order 1, plus the truncation error (h² ≈ 1e-4).
  EXPECT_LE(rel_error(pick(to_double(dqkv), coords), fd), 1e-3);
}

// Results do not depend on the number of threads (nor on the dynamic schedule).
TEST(Attention, ThreadCountDoesNotChangeBits) {
  const Batch batch{{40, 1, 23, 64, 7}};
  const HeadLayout l{4, 2, 64};
  const int64_t T = batch.tokens();
  const Tensor qkv = attention_input(T, l, DType::bf16, 51);
  const Tensor dout = random_tensor({T, l.q_width()}, DType::bf16, 52);
  const Tensor cu = i32_tensor(batch.cu());
  std::vector<Tensor> results;
  const int threads = omp_get_max_threads();
  for (int n : {1, 3}) {
    omp_set_num_threads(n);
    Tensor out = poisoned({T, l.q_width()}, DType::bf16),
           lse = poisoned({T, l.q_heads}, DType::f32);
    Tensor dqkv = poisoned({T, l.qkv_width()}, DType::bf16);
    attention_forward(out, lse, qkv, cu, l);
    attention_backward(dqkv, dout, qkv, out, lse, cu, l);
    results.insert(results.end(), {out, lse, dqkv});
  }
  omp_set_num_threads(threads);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(same_bytes(results[i], results[i + 3])) << i;
}

// ---- paged KV cache ----------------------------------------------------------------------------

Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  const size_t row_bytes = t.nbytes() / size_t(t.dim(0));
  Tensor g = Tensor::empty({int64_t(rows.size()), t.dim(1)}, t.dtype());
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(g.data()) + i * row_bytes,
                static_cast<const char*>(t.data()) + size_t(rows[i]) * row_bytes, row_bytes);
  return g;
}

void scatter_rows(Tensor& t, const std::vector<int64_t>& rows, const Tensor& src) {
  const size_t row_bytes = t.nbytes() / size_t(t.dim(0));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(t.data()) + size_t(rows[i]) * row_bytes,
                static_cast<const char*>(src.data()) + i * row_bytes, row_bytes);
}

// Generates the packed sequences of `batch` through a paged cache of `block_size` whose blocks are
// handed out in a random order. In each round every unfinished sequence contributes its next
// chunk(remaining) rows, the sequences in a shuffled order; the chunk's k/v are written to the
// cache, then its queries attend. Returns the output rows in packed order.
Tensor run_paged(const Tensor& qkv, const Batch& batch, const HeadLayout& l, int64_t block_size,
                 DType cache_dtype, const std::function<int32_t(int32_t, std::mt19937&)>& chunk,
                 uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  const size_t S = batch.lens.size();
  const std::vector<int32_t> cu = batch.cu();
  int64_t num_blocks = 3;  // spare blocks nobody uses
  int64_t max_blocks = 0;
  for (int32_t n : batch.lens) {
    num_blocks += (n + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, (n + block_size - 1) / block_size);
  }
  ++max_blocks;  // a trailing unused entry (-1) in every table row
  std::vector<int32_t> free_blocks(static_cast<size_t>(num_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::vector<std::vector<int32_t>> tables(S, std::vector<int32_t>(size_t(max_blocks), -1));
  size_t next = 0;
  for (size_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < (batch.lens[s] + block_size - 1) / block_size; ++b)
      tables[s][size_t(b)] = free_blocks[next++];

  PagedKv cache{poisoned({num_blocks, block_size, l.kv_heads, l.head_dim}, cache_dtype),
                poisoned({num_blocks, block_size, l.kv_heads, l.head_dim}, cache_dtype)};
  if (cache.fp8()) {
    cache.k_scale = poisoned({num_blocks, block_size, l.kv_heads}, DType::f32);
    cache.v_scale = poisoned({num_blocks, block_size, l.kv_heads}, DType::f32);
  }
  Tensor out = poisoned({batch.tokens(), l.q_width()}, qkv.dtype());
  std::vector<int32_t> done(S, 0);
  for (;;) {
    std::vector<size_t> order;
    for (size_t s = 0; s < S; ++s)
      if (done[s] < batch.lens[s]) order.push_back(s);
    if (order.empty()) break;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> rows;
    std::vector<int32_t> slots, cu_q{0}, lens, table_entries;
    for (size_t s : order) {
      const int32_t n = chunk(batch.lens[s] - done[s], rng);
      for (int32_t p = done[s]; p < done[s] + n; ++p) {
        rows.push_back(cu[s] + p);
        slots.push_back(int32_t(tables[s][size_t(p / block_size)] * block_size + p % block_size));
      }
      done[s] += n;
      cu_q.push_back(cu_q.back() + n);
      lens.push_back(done[s]);
      table_entries.insert(table_entries.end(), tables[s].begin(), tables[s].end());
    }
    const Tensor qkv_b = gather_rows(qkv, rows);
    kv_cache_write(cache, qkv_b, i32_tensor(slots), l);
    Tensor out_b = poisoned({int64_t(rows.size()), l.q_width()}, qkv.dtype());
    const Tensor block_tables =
        i32_tensor(table_entries).reshape({int64_t(order.size()), max_blocks});
    attention_paged(out_b, qkv_b, cache, block_tables, i32_tensor(cu_q),
                    i32_tensor(lens), l);
    scatter_rows(out, rows, out_b);
  }
  return out;
}

TEST(AttentionPaged, RowsAreBitIdenticalToTheTrainingForward) {
  const Batch batch{{1, 5, 17, 33, 8}};
  const int64_t T = batch.tokens();
  const std::vector<std::pair<std::string, std::function<int32_t(int32_t, std::mt19937&)>>>
      policies{{"prefill", [](int32_t remaining, std::mt19937&) { return remaining; }},
               {"decode", [](int32_t, std::mt19937&) { return 1; }},
               {"mixed", [](int32_t remaining, std::mt19937& rng) {
                  return std::min(remaining, int32_t(rng() % 2 ? 1 : 1 + rng() % 9));
                }}};
  for (HeadLayout l : {HeadLayout{4, 2, 72}, HeadLayout{4, 1, 24}})
    for (const auto& [qkv_dtype, cache_dtype] :
         {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::bf16},
          std::pair{DType::bf16, DType::f32},  // bf16 → f32 is exact: the same fp32 values
          std::pair{DType::bf16, DType::e4m3}, std::pair{DType::f32, DType::e4m3}}) {
      const Tensor qkv = attention_input(T, l, qkv_dtype, 61);
      // An e4m3 cache holds what round_kv_to_fp8 gives the training forward (ops/kv_fp8.h).
      Tensor train_qkv = qkv.to(Device::cpu);
      if (cache_dtype == DType::e4m3) round_kv_to_fp8(train_qkv, l);
      Tensor out = poisoned({T, l.q_width()}, qkv_dtype),
             lse = poisoned({T, l.q_heads}, DType::f32);
      attention_forward(out, lse, train_qkv, i32_tensor(batch.cu()), l);
      for (int64_t block_size : {1, 3, 16})
        for (const auto& [name, chunk] : policies) {
          SCOPED_TRACE("heads " + std::to_string(l.q_heads) + "/" + std::to_string(l.kv_heads) +
                       " " + std::string(dtype_name(qkv_dtype)) + " qkv, " +
                       std::string(dtype_name(cache_dtype)) + " cache, block " +
                       std::to_string(block_size) + ", " + name);
          const Tensor paged =
              run_paged(qkv, batch, l, block_size, cache_dtype, chunk, uint64_t(block_size));
          EXPECT_TRUE(same_bytes(paged, out));
        }
    }
}

// ---- argument errors ---------------------------------------------------------------------------

TEST(Attention, BadArguments) {
  const HeadLayout l{4, 2, 8};
  const int64_t T = 6;
  const Tensor qkv = random_tensor({T, l.qkv_width()}, DType::f32, 1);
  Tensor out = poisoned({T, l.q_width()}, DType::f32), lse = poisoned({T, l.q_heads}, DType::f32);
  const Tensor cu = i32_tensor({0, 2, 6});
  expect_error(
      [&] {
        attention_forward(out, lse, qkv, i32_tensor({1, 2, 6}), l);
      },
      "cu_seqlens: must start at 0");
  expect_error(
      [&] {
        attention_forward(out, lse, qkv, i32_tensor({0, 4, 2, 6}), l);
      },
      "cu_seqlens: must not decrease");
  expect_error(
      [&] {
        attention_forward(out, lse, qkv, i32_tensor({0, 2, 5}), l);
      },
      "cu_seqlens: must end at the number of rows T = 6");
  Tensor cu64 = Tensor::zeros({3}, DType::i64);
  expect_error([&] { attention_forward(out, lse, qkv, cu64, l); }, "cu_seqlens");
  expect_error(
      [&] {
        attention_forward(out, lse, random_tensor({T, 40}, DType::f32, 2), cu, l);
      },
      "attention_forward: qkv");
  expect_error([&] { attention_forward(out, lse, qkv.reshape({T * l.qkv_width()}), cu, l); },
               "qkv");
  Tensor lse_bad = poisoned({T, 2}, DType::f32),
         out_i32 = Tensor::empty({T, l.q_width()}, DType::i32);
  expect_error([&] { attention_forward(out, lse_bad, qkv, cu, l); }, "lse");
  expect_error([&] { attention_forward(out_i32, lse, qkv, cu, l); }, "out");
  expect_error([&] { attention_forward(out, lse, qkv, cu, HeadLayout{4, 3, 8}); }, "kv_heads");
  Tensor dqkv = poisoned({T, l.qkv_width()}, DType::f32);
  expect_error([&] { attention_backward(dqkv, qkv, qkv, out, lse, cu, l); },
               "attention_backward: dout");
  expect_error([&] { attention_backward(out, out, qkv, out, lse, cu, l); }, "dqkv");

  // Paged: a cache of 4 blocks of 2 slots; one sequence of 3 positions in blocks 2 and 0.
  Tensor k_cache = poisoned({4, 2, 2, 8}, DType::f32), v_cache = poisoned({4, 2, 2, 8}, DType::f32);
  const Tensor q1 = qkv.rows(0, 1);
  Tensor out1 = poisoned({1, l.q_width()}, DType::f32);
  const auto paged = [&](const Tensor& tables, const Tensor& lens) {
    attention_paged(out1, q1, {k_cache, v_cache}, tables, i32_tensor({0, 1}), lens, l);
  };
  kv_cache_write({k_cache, v_cache}, qkv.rows(0, 3), i32_tensor({4, 5, 0}), l);
  paged(i32_tensor({2, 0}).reshape({1, 2}), i32_tensor({3}));  // valid
  expect_error(
      [&] {
        paged(i32_tensor({2, 4}).reshape({1, 2}), i32_tensor({3}));
      },
      "block_tables: entry [0, 1] is 4");
  expect_error(
      [&] {
        paged(i32_tensor({-1, 0}).reshape({1, 2}), i32_tensor({3}));
      },
      "block_tables");
  expect_error([&] { paged(i32_tensor({2, 0}).reshape({1, 2}), i32_tensor({5})); }, "context_lens");
  expect_error([&] { paged(i32_tensor({2, 0}).reshape({1, 2}), i32_tensor({0})); }, "context_lens");
  expect_error(
      [&] {
        paged(i32_tensor({2, 0, 1, 3}).reshape({2, 2}), i32_tensor({3}));
      },
      "block_tables");
  Tensor k_bad = poisoned({4, 2, 1, 8}, DType::f32), v_bad = poisoned({4, 3, 2, 8}, DType::f32);
  expect_error([&] { kv_cache_write({k_bad, v_cache}, q1, i32_tensor({0}), l); }, "k_cache");
  expect_error([&] { kv_cache_write({k_cache, v_bad}, q1, i32_tensor({0}), l); }, "v_cache");
  expect_error(
      [&] {
        kv_cache_write({k_cache, v_cache}, qkv.rows(0, 2), i32_tensor({8, 1}), l);
      },
      "slots: row 0 has slot 8");
  expect_error(
      [&] {
        kv_cache_write({k_cache, v_cache}, qkv.rows(0, 2), i32_tensor({3, 3}), l);
      },
      "slots: rows 0 and 1 both write slot 3");
  expect_error([&] { kv_cache_write({k_cache, v_cache}, qkv.rows(0, 2), i32_tensor({3}), l); },
               "slots");
}

// attention_paged_fp8 checks its arguments as attention_paged does, naming itself, and its output's
// shape (on the CPU it is attention_paged then quantize_rows; the CUDA kernel that quantizes
// itself is compared with those in tests/gpu/test_attention_gpu.cpp).
TEST(AttentionPaged, Fp8OutputBadArguments) {
  const HeadLayout l{2, 1, 64};  // q_width 128: one quantization group
  Tensor k_cache = random_tensor({2, 4, 1, 64}, DType::f32, 3), v_cache = random_tensor({2, 4, 1, 64}, DType::f32, 4);
  const Tensor qkv = random_tensor({1, l.qkv_width()}, DType::f32, 5);
  const Tensor tables = i32_tensor({1, 0}).reshape({1, 2}), cu = i32_tensor({0, 1}), lens = i32_tensor({6});
  Fp8Rows out = Fp8Rows::empty(1, 128, Device::cpu);
  attention_paged_fp8(out, qkv, {k_cache, v_cache}, tables, cu, lens, l, true);  // valid
  Fp8Rows two_rows = Fp8Rows::empty(2, 128, Device::cpu);
  expect_error([&] { attention_paged_fp8(two_rows, qkv, {k_cache, v_cache}, tables, cu, lens, l); },
               "attention_paged_fp8: out");
  expect_error([&] { attention_paged_fp8(out, qkv, {k_cache, v_cache}, i32_tensor({1, 2}).reshape({1, 2}), cu, lens, l); },
               "block_tables: entry [0, 1] is 2");
  expect_error([&] { attention_paged_fp8(out, qkv, {k_cache, v_cache}, tables, cu, i32_tensor({9}), l); },
               "context_lens");
}

}  // namespace
}  // namespace lockstep
