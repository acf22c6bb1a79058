// qkv_rope and AdamW on the GPU against the CPU reference on the same inputs: qkv_rope within the
// tolerances below (and deterministic), AdamW and its weight copies byte for byte, step after step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <vector>

#include "numerics/quantize.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/qkv_rope.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::poisoned;
using testing::random_tensor;
using testing::rel_error;
using testing::same_bytes;
using testing::to_double;

Tensor gpu(const Tensor& t) { return t.to(Device::cuda); }

// ---- qkv_rope ----------------------------------------------------------------------------------

// GPU and CPU compute each output in fp32 from the same inputs and round it once to bf16; they
// differ only in the order of a head's sums and in FMA contraction, a few fp32 ulps (~2^-22
// relative) before that rounding. So about 1e-4 of the elements land on the other side of a bf16
// rounding boundary (one bf16 ulp, ~2^-8 relative): a normwise error of ~4e-5. A wrong formula,
// angle, head or row is off by far more (one wrong row of 301: ~5e-2); unwritten outputs are NaN.
constexpr double kActTol = 2e-4;
// rstd and the norm-weight gradients are fp32: only the summation order differs (the weight
// gradients add ~5000 terms of |x| ~ 1 in another order: ~1e-5 relative at worst).
constexpr double kRstdTol = 1e-6;
constexpr double kNormGradTol = 1e-4;
constexpr float kEps = 1e-6f;
constexpr int32_t kMaxPosition = 40000;

struct RopeCase {
  HeadLayout layout;
  int64_t T;
  bool norm;
};

// Test names (gtest prints params with PrintTo): q16_kv8_d128_T301_norm.
void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << "q" << c.layout.q_heads << "_kv" << c.layout.kv_heads << "_d" << c.layout.head_dim << "_T"
      << c.T << (c.norm ? "_norm" : "");
}

class QkvRopeGpu : public ::testing::TestWithParam<RopeCase> {};

// Random positions in [0, 40000], with both ends.
Tensor random_positions(int64_t T, uint64_t seed) {
  Tensor p = Tensor::empty({T}, DType::i32);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pos(0, kMaxPosition);
  for (int64_t t = 0; t < T; ++t) p.data_as<int32_t>()[t] = pos(rng);
  p.data_as<int32_t>()[0] = 0;
  p.data_as<int32_t>()[T - 1] = kMaxPosition;
  return p;
}

// The inputs of one case, on the CPU.
struct RopeInputs {
  Tensor qkv, dout, positions, inv_freq, q_norm, k_norm, dq_norm, dk_norm;

  RopeInputs(const RopeCase& c, uint64_t seed) {
    const int64_t d = c.layout.head_dim, width = c.layout.qkv_width();
    qkv = random_tensor({c.T, width}, DType::bf16, seed, /*varied_rows=*/true);
    dout = random_tensor({c.T, width}, DType::bf16, seed + 1);
    positions = random_positions(c.T, seed + 2);
    inv_freq = rope_inv_freq(d, 1e6, std::nullopt);  // Qwen3's rope_theta
    if (c.norm) {
      q_norm = random_tensor({d}, DType::f32, seed + 3);
      k_norm = random_tensor({d}, DType::f32, seed + 4);
      dq_norm = random_tensor({d}, DType::f32, seed + 5);  // the gradients accumulate
      dk_norm = random_tensor({d}, DType::f32, seed + 6);
    }
  }
};

Tensor gpu_or_empty(const Tensor& t) { return t.defined() ? gpu(t) : Tensor(); }

struct RopeResult {
  Tensor out, rstd, dqkv, dq_norm, dk_norm;
};

// Forward then backward (from the forward's rstd) on `device`.
RopeResult run_rope(const RopeInputs& in, const RopeCase& c, Device device) {
  const auto on = [&](const Tensor& t) { return device == Device::cuda ? gpu_or_empty(t) : t; };
  const Tensor qkv = on(in.qkv), dout = on(in.dout), positions = on(in.positions);
  const Tensor inv_freq = on(in.inv_freq), q_norm = on(in.q_norm), k_norm = on(in.k_norm);
  const int64_t width = c.layout.qkv_width();
  RopeResult r;
  r.out = poisoned({c.T, width}, DType::bf16, device);
  if (c.norm) r.rstd = poisoned({c.T, c.layout.q_heads + c.layout.kv_heads}, DType::f32, device);
  qkv_rope_forward(r.out, r.rstd, qkv, positions, inv_freq, q_norm, k_norm, c.layout, kEps);
  r.dqkv = poisoned({c.T, width}, DType::bf16, device);
  if (c.norm) {
    r.dq_norm = in.dq_norm.to(device);
    r.dk_norm = in.dk_norm.to(device);
  }
  qkv_rope_backward(r.dqkv, r.dq_norm, r.dk_norm, dout, qkv, positions, inv_freq, q_norm, k_norm,
                    r.rstd, c.layout);
  return r;
}

// The v columns of every row: copied unchanged forward and backward, so bit for bit.
std::vector<double> v_columns(const Tensor& t, const HeadLayout& l) {
  const std::vector<double> all = to_double(t);
  std::vector<double> v;
  for (int64_t row = 0; row < t.dim(0); ++row)
    for (int64_t c = l.v_offset(); c < l.qkv_width(); ++c)
      v.push_back(all[size_t(row * l.qkv_width() + c)]);
  return v;
}

TEST_P(QkvRopeGpu, MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const RopeCase c = GetParam();
  const RopeInputs in(c, uint64_t(c.T * 131 + c.layout.head_dim));
  const RopeResult cpu = run_rope(in, c, Device::cpu);
  const RopeResult gpu_r = run_rope(in, c, Device::cuda);

  EXPECT_LE(rel_error(to_double(gpu_r.out), to_double(cpu.out)), kActTol);
  EXPECT_LE(rel_error(to_double(gpu_r.dqkv), to_double(cpu.dqkv)), kActTol);
  EXPECT_EQ(v_columns(gpu_r.out, c.layout), v_columns(cpu.out, c.layout));
  EXPECT_EQ(v_columns(gpu_r.dqkv, c.layout), v_columns(cpu.dqkv, c.layout));
  if (c.norm) {
    EXPECT_LE(rel_error(to_double(gpu_r.rstd), to_double(cpu.rstd)), kRstdTol);
    EXPECT_LE(rel_error(to_double(gpu_r.dq_norm), to_double(cpu.dq_norm)), kNormGradTol);
    EXPECT_LE(rel_error(to_double(gpu_r.dk_norm), to_double(cpu.dk_norm)), kNormGradTol);
  }
}

TEST_P(QkvRopeGpu, BackwardIsDeterministic) {
  LOCKSTEP_REQUIRE_GPU();
  const RopeCase c = GetParam();
  const RopeInputs in(c, 7);
  const RopeResult a = run_rope(in, c, Device::cuda), b = run_rope(in, c, Device::cuda);
  EXPECT_TRUE(same_bytes(a.out, b.out));
  EXPECT_TRUE(same_bytes(a.dqkv, b.dqkv));
  if (c.norm) {
    EXPECT_TRUE(same_bytes(a.dq_norm, b.dq_norm));
    EXPECT_TRUE(same_bytes(a.dk_norm, b.dk_norm));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, QkvRopeGpu,
    ::testing::Values(
        // Qwen3-like; 301 rows: the last backward CTA (4 rows each) gets one row.
        RopeCase{{16, 8, 128}, 301, true}, RopeCase{{16, 8, 128}, 301, false},
        // head_dim 80: 5 chunk lanes in a group of 8 (3 idle lanes in every sum).
        RopeCase{{4, 2, 80}, 37, true},
        // The largest head_dim (groups of 16 lanes) and the smallest (one lane a head).
        RopeCase{{2, 1, 256}, 9, true}, RopeCase{{4, 4, 16}, 5, true},
        // Qwen3-8B at decode sizes: T ≤ 256 spreads a row's 48 heads over 2 CTAs (32 a CTA), 257
        // takes the row kernel.
        RopeCase{{32, 8, 128}, 1, true}, RopeCase{{32, 8, 128}, 3, true}, RopeCase{{32, 8, 128}, 256, true},
        RopeCase{{32, 8, 128}, 257, true}, RopeCase{{32, 8, 128}, 1, false},
        // SmolLM2-135M's heads (9 q over 3 kv, head_dim 64, no q/k norm), prefill and decode.
        RopeCase{{9, 3, 64}, 300, false}, RopeCase{{9, 3, 64}, 1, true}, RopeCase{{9, 3, 64}, 7, false}),
    ::testing::PrintToStringParamName());

// At T ≤ 256 the forward spreads a row's heads over CTAs (another kernel, the same per-head code):
// its rows have the bits of the row kernel's (T = 257) for the same rows. Layouts: the last CTA of a
// row partly idle (48 heads, 32 a CTA; 20 heads, 16 a CTA) and idle lanes (head_dim 80).
TEST(QkvRopeGpuDecode, SmallBatchesGiveTheBitsOfTheRowKernel) {
  LOCKSTEP_REQUIRE_GPU();
  for (const HeadLayout layout : {HeadLayout{32, 8, 128}, HeadLayout{4, 2, 80}, HeadLayout{12, 4, 256}})
    for (const bool norm : {true, false}) {
      const RopeCase big{layout, 257, norm};
      const RopeInputs in(big, 11);
      const Tensor qkv = gpu(in.qkv), positions = gpu(in.positions), inv_freq = gpu(in.inv_freq);
      const Tensor q_norm = gpu_or_empty(in.q_norm), k_norm = gpu_or_empty(in.k_norm);
      const int64_t width = layout.qkv_width(), heads = layout.q_heads + layout.kv_heads;
      Tensor out = poisoned({257, width}, DType::bf16, Device::cuda);
      Tensor rstd = norm ? poisoned({257, heads}, DType::f32, Device::cuda) : Tensor();
      qkv_rope_forward(out, rstd, qkv, positions, inv_freq, q_norm, k_norm, layout, kEps);
      for (const int64_t T : {1, 3, 64, 256}) {
        SCOPED_TRACE(::testing::Message() << "head_dim " << layout.head_dim << " T " << T << " norm " << norm);
        Tensor small = poisoned({T, width}, DType::bf16, Device::cuda);
        Tensor small_rstd = norm ? poisoned({T, heads}, DType::f32, Device::cuda) : Tensor();
        qkv_rope_forward(small, small_rstd, qkv.rows(0, T), positions.rows(0, T), inv_freq, q_norm, k_norm,
                         layout, kEps);
        EXPECT_TRUE(same_bytes(small, out.rows(0, T)));
        if (norm) {
          EXPECT_TRUE(same_bytes(small_rstd, rstd.rows(0, T)));
        }
      }
    }
}

// The inference form (the cache written from the op's kernel) gives the bytes of CUDA qkv_rope
// followed by CUDA kv_cache_write: out, rstd and both caches, whose other slots keep their bytes.
// Slots: distinct, random over a cache of twice the rows, and (T ≥ 3) one negative and one past the
// end, which both paths skip. T ≤ 256 the heads kernel, 257 and 301 the row kernel.
TEST(QkvRopeGpuCache, SameBytesAsQkvRopeThenKvCacheWrite) {
  LOCKSTEP_REQUIRE_GPU();
  for (const HeadLayout layout : {HeadLayout{32, 8, 128}, HeadLayout{16, 2, 64}})
    for (const int64_t T : {1, 3, 64, 256, 257, 301})
      for (const bool norm : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "head_dim " << layout.head_dim << " T " << T << " norm " << norm);
        const RopeCase c{layout, T, norm};
        const RopeInputs in(c, 21);
        const Tensor qkv = gpu(in.qkv), positions = gpu(in.positions), inv_freq = gpu(in.inv_freq);
        const Tensor q_norm = gpu_or_empty(in.q_norm), k_norm = gpu_or_empty(in.k_norm);
        constexpr int64_t kBlockSize = 16;
        const int64_t blocks = (2 * T + kBlockSize - 1) / kBlockSize, capacity = blocks * kBlockSize;
        std::vector<int32_t> order(static_cast<size_t>(capacity));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937_64(22));
        Tensor slots = Tensor::empty({T}, DType::i32);
        std::copy(order.begin(), order.begin() + T, slots.data_as<int32_t>());
        if (T >= 3) {
          slots.data_as<int32_t>()[1] = -1;
          slots.data_as<int32_t>()[2] = int32_t(capacity);
        }
        slots = gpu(slots);
        const Tensor cache0 = random_tensor({blocks, kBlockSize, layout.kv_heads, layout.head_dim}, DType::bf16, 23);
        const int64_t width = layout.qkv_width(), heads = layout.q_heads + layout.kv_heads;
        // A bf16 cache, and an e4m3 one (ops/kv_fp8.h) whose bytes and scales start as 0xFF.
        auto fresh_cache = [&](bool fp8) {
          return fp8 ? testing::poisoned_fp8_cache(layout, blocks, kBlockSize, Device::cuda)
                     : PagedKv{gpu(cache0), gpu(cache0)};
        };

        Tensor out = poisoned({T, width}, DType::bf16, Device::cuda);
        Tensor rstd = norm ? poisoned({T, heads}, DType::f32, Device::cuda) : Tensor();
        qkv_rope_forward(out, rstd, qkv, positions, inv_freq, q_norm, k_norm, layout, kEps);
        for (const bool fp8 : {false, true}) {
          SCOPED_TRACE(fp8 ? "e4m3 cache" : "bf16 cache");
          const PagedKv cache = fresh_cache(fp8), f_cache = fresh_cache(fp8);
          kv_cache_write(cache, out, slots, layout);

          Tensor f_out = poisoned({T, width}, DType::bf16, Device::cuda);
          Tensor f_rstd = norm ? poisoned({T, heads}, DType::f32, Device::cuda) : Tensor();
          qkv_rope_forward(f_out, f_rstd, f_cache, slots, qkv, positions, inv_freq, q_norm, k_norm, layout, kEps);
          EXPECT_TRUE(same_bytes(f_out, out));
          if (norm) {
            EXPECT_TRUE(same_bytes(f_rstd, rstd));
          }
          EXPECT_TRUE(same_bytes(f_cache.k, cache.k));
          EXPECT_TRUE(same_bytes(f_cache.v, cache.v));
          if (fp8) {
            EXPECT_TRUE(same_bytes(f_cache.k_scale, cache.k_scale));
            EXPECT_TRUE(same_bytes(f_cache.v_scale, cache.v_scale));
          }
          EXPECT_FALSE(same_bytes(f_cache.k, fresh_cache(fp8).k));  // written
        }
      }
}

// Positions are not checked on the host for CUDA tensors: a negative one turns its row's q and k
// (and their gradients, and the norm-weight gradients) into NaN; the other rows are untouched.
TEST(QkvRopeGpuBadInput, NegativePositionGivesNaNRow) {
  LOCKSTEP_REQUIRE_GPU();
  const RopeCase c{{16, 8, 128}, 40, true};
  const RopeInputs in(c, 11);
  RopeInputs bad = in;
  bad.positions = in.positions.to(Device::cpu);
  constexpr int64_t kRow = 7;
  bad.positions.data_as<int32_t>()[kRow] = -5;
  const RopeResult good = run_rope(in, c, Device::cuda), r = run_rope(bad, c, Device::cuda);

  const HeadLayout& l = c.layout;
  const std::vector<double> out = to_double(r.out), out_good = to_double(good.out);
  const std::vector<double> dqkv = to_double(r.dqkv), dqkv_good = to_double(good.dqkv);
  int64_t q_k_not_nan = 0, other_rows_differ = 0;
  for (int64_t row = 0; row < c.T; ++row)
    for (int64_t col = 0; col < l.qkv_width(); ++col) {
      const size_t i = size_t(row * l.qkv_width() + col);
      if (row == kRow && col < l.v_offset()) {
        q_k_not_nan += !std::isnan(out[i]) + !std::isnan(dqkv[i]);
      } else {
        other_rows_differ += (out[i] != out_good[i]) + (dqkv[i] != dqkv_good[i]);
      }
    }
  EXPECT_EQ(q_k_not_nan, 0);
  EXPECT_EQ(other_rows_differ, 0);
  for (const Tensor* g : {&r.dq_norm, &r.dk_norm})
    for (double x : to_double(*g)) EXPECT_TRUE(std::isnan(x));
}

// ---- AdamW -------------------------------------------------------------------------------------

const AdamWHyper kHyper{.lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
constexpr float kGradScale = 0.7f;
constexpr int64_t kSteps = 4;

// An optimizer state mid-training (never zeros): the param, m, and v ≥ 0.
struct AdamWState {
  Tensor p, m, v;
  AdamWState(const Shape& shape, uint64_t seed)
      : p(random_tensor(shape, DType::f32, seed)), m(random_tensor(shape, DType::f32, seed + 1)),
        v(random_tensor(shape, DType::f32, seed + 2)) {
    float* vp = v.data_as<float>();
    for (int64_t i = 0; i < v.numel(); ++i) vp[i] *= vp[i];
  }
  AdamWState on(Device device) const {
    AdamWState s = *this;
    s.p = p.to(device);
    s.m = m.to(device);
    s.v = v.to(device);
    return s;
  }
};

void expect_same_state(const AdamWState& gpu_s, const AdamWState& cpu_s) {
  EXPECT_TRUE(same_bytes(gpu_s.p, cpu_s.p)) << "param";
  EXPECT_TRUE(same_bytes(gpu_s.m, cpu_s.m)) << "m";
  EXPECT_TRUE(same_bytes(gpu_s.v, cpu_s.v)) << "v";
}

// The same fp32 operations in the same order (ops/adamw_element.h), so the same bits. A CUDA block
// takes 2048 elements: 6144 fills 3 blocks; 3548 leaves a last block whose first half is whole and
// whose second is not; counts that are no multiple of 4 exercise the scalar tail.
TEST(AdamWGpu, StepsAreBitIdenticalToCpu) {
  LOCKSTEP_REQUIRE_GPU();
  for (const Shape& shape : {Shape{37, 41}, Shape{517, 999}, Shape{3}, Shape{64, 96}, Shape{4, 887}}) {
    SCOPED_TRACE(shape_string(shape));
    AdamWState cpu_s(shape, 40), gpu_s = cpu_s.on(Device::cuda);
    for (int64_t step = 1; step <= kSteps; ++step) {
      SCOPED_TRACE(step);
      const Tensor g = random_tensor(shape, DType::f32, 50 + uint64_t(step), /*varied_rows=*/true);
      adamw_step(cpu_s.p, cpu_s.m, cpu_s.v, g, kHyper, step, kGradScale);
      adamw_step(gpu_s.p, gpu_s.m, gpu_s.v, gpu(g), kHyper, step, kGradScale);
      expect_same_state(gpu_s, cpu_s);
    }
  }
}

struct CopiesCase {
  Shape shape;
  bool bf16, fp8;
  ScaleFormat format;
};

// Test names: 384x640_bf16_fp8.
void PrintTo(const CopiesCase& c, std::ostream* os) {
  for (size_t i = 0; i < c.shape.size(); ++i) *os << (i ? "x" : "") << c.shape[i];
  *os << (c.bf16 ? "_bf16" : "") << (c.fp8 ? "_fp8" : "") << (c.format == ScaleFormat::pow2 ? "_pow2" : "");
}

class AdamWCopiesGpu : public ::testing::TestWithParam<CopiesCase> {};

// The fused step against the CPU composition (adamw_step, convert, quantize_weight): the state,
// the bf16 copy, and the fp8 W and Wᵀ bytes and scales (padding included) byte for byte, every step.
TEST_P(AdamWCopiesGpu, SameBytesAsCpuComposition) {
  LOCKSTEP_REQUIRE_GPU();
  const CopiesCase c = GetParam();
  AdamWState cpu_s(c.shape, 60), gpu_s = cpu_s.on(Device::cuda);
  Tensor bf16_cpu = Tensor::empty(c.shape, DType::bf16);
  Tensor bf16_gpu = Tensor::empty(c.shape, DType::bf16, Device::cuda);
  Fp8Weight fp8_cpu, fp8_gpu;
  if (c.fp8) {
    fp8_cpu = Fp8Weight::empty(c.shape[0], c.shape[1], Device::cpu);
    fp8_gpu = Fp8Weight::empty(c.shape[0], c.shape[1], Device::cuda);
  }
  const WeightCopies copies_gpu{.bf16 = c.bf16 ? &bf16_gpu : nullptr,
                                .fp8 = c.fp8 ? &fp8_gpu : nullptr,
                                .fp8_format = c.format};
  for (int64_t step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(step);
    const Tensor g = random_tensor(c.shape, DType::f32, 70 + uint64_t(step), /*varied_rows=*/true);
    adamw_step(cpu_s.p, cpu_s.m, cpu_s.v, g, kHyper, step, kGradScale);
    if (c.bf16) convert(bf16_cpu, cpu_s.p);
    if (c.fp8) quantize_weight(fp8_cpu, cpu_s.p, c.format);

    bf16_gpu.fill_bytes(0xFF);
    if (c.fp8)
      for (Tensor* t : {&fp8_gpu.w.data, &fp8_gpu.w.scales, &fp8_gpu.wt.data, &fp8_gpu.wt.scales})
        t->fill_bytes(0xFF);
    adamw_step(gpu_s.p, gpu_s.m, gpu_s.v, gpu(g), kHyper, step, kGradScale, copies_gpu);

    expect_same_state(gpu_s, cpu_s);
    if (c.bf16) {
      EXPECT_TRUE(same_bytes(bf16_gpu, bf16_cpu)) << "bf16 copy";
    }
    if (c.fp8) {
      EXPECT_TRUE(same_bytes(fp8_gpu.w.data, fp8_cpu.w.data)) << "W bytes";
      EXPECT_TRUE(same_bytes(fp8_gpu.w.scales, fp8_cpu.w.scales)) << "W scales";
      EXPECT_TRUE(same_bytes(fp8_gpu.wt.data, fp8_cpu.wt.data)) << "Wt bytes";
      EXPECT_TRUE(same_bytes(fp8_gpu.wt.scales, fp8_cpu.wt.scales)) << "Wt scales";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Copies, AdamWCopiesGpu,
    ::testing::Values(
        // 3 × 5 blocks: both scale tables have padding (5 → 8 and 3 → 4 columns).
        CopiesCase{{384, 640}, true, true, ScaleFormat::fp32},
        CopiesCase{{256, 512}, false, true, ScaleFormat::pow2},
        CopiesCase{{1024, 1536}, true, true, ScaleFormat::fp32},
        // Partial 128-blocks (the step, then quantize_weight): SmolLM2-135M's qkv and down.
        CopiesCase{{960, 576}, true, true, ScaleFormat::fp32},
        CopiesCase{{576, 1536}, false, true, ScaleFormat::pow2},
        CopiesCase{{192, 320}, true, true, ScaleFormat::pow2},
        // Shapes without 128×128 blocks (norm weights, embeddings) take the bf16 copy only.
        CopiesCase{{37, 41}, true, false, ScaleFormat::fp32},
        CopiesCase{{4099}, true, false, ScaleFormat::fp32}),
    ::testing::PrintToStringParamName());

}  // namespace
}  // namespace lockstep
