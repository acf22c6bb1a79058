// The CUDA LM head against the CPU reference on the same bf16 inputs: forward, backward (bf16 and
// f32 dh, accumulating dw), lm_head_logits and logits_logprob; the CUDA fold of lm_head_logits'
// logits against the fused CUDA forward; kept logits against recomputed ones; out-of-vocabulary
// targets giving NaN; under the exact forward kernels, a row's bits the same in batches of any size,
// through the training forward and through the rollout's logits and fold.
//
// Tolerances (‖gpu − cpu‖/‖cpu‖). h ~ N(0, 1), w ~ N(0, 1/256), H = 1024: logits ~ N(0, 4), so the
// softmax is broad (entropy ≈ 5–7 nats, lse ≈ 11–13). Both sides compute fp32 logits from the
// same bf16 values; only the GEMM's summation order differs (≤ 1e-5 relative, the GEMM tests' f32
// bound; ~4e-6 absolute expected here), and the folds differ in exp and summation order (~1e-7).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/forward_kernels.h"
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

constexpr int64_t kH = 1024;
// Logits from different GEMMs: logprob, entropy, lse within ~1e-6 relative (see above).
constexpr double kLogitsTol = 1e-5;
// The same logits folded on both sides: exp and summation order only.
constexpr double kFoldTol = 5e-6;
// dz/temperature differs by ~1e-5 relative before its rounding to bf16 (logits ~5e-6 apart, and
// log p + entropy near 0 in the entropy term), which moves ~0.2% of the elements by one bf16 step
// (2^-8..2^-7): ~2.5e-4 in the norm of dz, hence of dw and an f32 dh.
constexpr double kGradTol = 2e-3;
// A bf16 dh then rounds values ~2.5e-4 apart, which moves a few % of them by one bf16 step: ~1e-3.
constexpr double kBf16GradTol = 5e-3;

std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

struct Inputs {
  Tensor h, w, targets;  // on the CPU
  Tensor hg, wg, targets_g;
};

Inputs make_inputs(int64_t T, int64_t V, uint64_t seed) {
  Inputs in;
  in.h = random_values({T, kH}, DType::bf16, seed, 1.0f);
  in.w = random_values({V, kH}, DType::bf16, seed + 1, 1.0f / 16);
  in.targets = random_targets(T, V, seed + 2);
  in.hg = in.h.to(Device::cuda);
  in.wg = in.w.to(Device::cuda);
  in.targets_g = in.targets.to(Device::cuda);
  return in;
}

struct Forward {
  Tensor logprob, entropy, lse;
};

Forward forward(const Tensor& h, const Tensor& w, const Tensor& targets, float temperature) {
  const int64_t T = h.dim(0);
  const Device d = h.device();
  Forward f{poisoned({T}, DType::f32, d), poisoned({T}, DType::f32, d), poisoned({T}, DType::f32, d)};
  lm_head_logprob_forward(f.logprob, f.entropy, f.lse, h, w, targets, temperature);
  return f;
}

struct Case {
  int64_t T, V;
  float temperature;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "T " << c.T << ", V " << c.V << ", temperature " << c.temperature;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string("T") + std::to_string(c.T) + "_V" + std::to_string(c.V) + "_temp" +
         std::to_string(int(std::lround(c.temperature * 10)));
}

class LmHeadGpu : public ::testing::TestWithParam<Case> {};

TEST_P(LmHeadGpu, ForwardMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, V, temperature] = GetParam();
  const Inputs in = make_inputs(T, V, 1);
  const Forward cpu = forward(in.h, in.w, in.targets, temperature);
  const Forward gpu = forward(in.hg, in.wg, in.targets_g, temperature);
  EXPECT_LE(rel_error(to_double(gpu.logprob), to_double(cpu.logprob)), kLogitsTol);
  EXPECT_LE(rel_error(to_double(gpu.entropy), to_double(cpu.entropy)), kLogitsTol);
  EXPECT_LE(rel_error(to_double(gpu.lse), to_double(cpu.lse)), kLogitsTol);
}

TEST_P(LmHeadGpu, BackwardMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, V, temperature] = GetParam();
  const Inputs in = make_inputs(T, V, 2);
  // Both sides take the CPU forward's statistics, so only the backward is compared.
  const Forward f = forward(in.h, in.w, in.targets, temperature);
  const Tensor lse_g = f.lse.to(Device::cuda), entropy_g = f.entropy.to(Device::cuda);
  const Tensor da = random_values({T}, DType::f32, 10, 1.0f), db = random_values({T}, DType::f32, 11, 1.0f);
  const Tensor da_g = da.to(Device::cuda), db_g = db.to(Device::cuda);
  // dw accumulates onto these values; the comparison is of what the call adds.
  const Tensor dw0 = random_values({V, kH}, DType::f32, 12, 1e-3f);
  const std::vector<double> dw_before = to_double(dw0);

  struct Run {
    const char* name;
    bool logprob, entropy;
    DType dh;
  };
  for (const Run r : {Run{"both", true, true, DType::bf16}, Run{"logprob only", true, false, DType::bf16},
                      Run{"entropy only", false, true, DType::bf16}, Run{"both, f32 dh", true, true, DType::f32}}) {
    SCOPED_TRACE(r.name);
    const Tensor dlp = r.logprob ? da : Tensor(), dent = r.entropy ? db : Tensor();
    const Tensor dlp_g = r.logprob ? da_g : Tensor(), dent_g = r.entropy ? db_g : Tensor();
    Tensor dh = poisoned({T, kH}, r.dh, Device::cpu), dh_g = poisoned({T, kH}, r.dh, Device::cuda);
    Tensor dw = Tensor::empty({V, kH}, DType::f32), dw_g = dw0.to(Device::cuda);
    dw.copy_from(dw0);
    lm_head_logprob_backward(dh, dw, dlp, dent, in.h, in.w, in.targets, f.lse, f.entropy, temperature);
    lm_head_logprob_backward(dh_g, dw_g, dlp_g, dent_g, in.hg, in.wg, in.targets_g, lse_g, entropy_g,
                             temperature);
    EXPECT_LE(rel_error(to_double(dh_g), to_double(dh)), r.dh == DType::bf16 ? kBf16GradTol : kGradTol)
        << "dh";
    EXPECT_LE(rel_error(minus(to_double(dw_g), dw_before), minus(to_double(dw), dw_before)), kGradTol)
        << "dw";
  }
}

TEST_P(LmHeadGpu, LogitsAndFoldMatchCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, V, temperature] = GetParam();
  const Inputs in = make_inputs(T, V, 3);
  Tensor logits = poisoned({T, V}, DType::f32, Device::cpu), logits_g = poisoned({T, V}, DType::f32, Device::cuda);
  lm_head_logits(logits, in.h, in.w);
  lm_head_logits(logits_g, in.hg, in.wg);
  EXPECT_LE(rel_error(to_double(logits_g), to_double(logits)), kLogitsTol) << "logits";

  // The fold alone: the CPU's logits on both sides.
  Tensor lp = poisoned({T}, DType::f32, Device::cpu), ent = poisoned({T}, DType::f32, Device::cpu);
  Tensor lp_g = poisoned({T}, DType::f32, Device::cuda), ent_g = poisoned({T}, DType::f32, Device::cuda);
  logits_logprob(lp, ent, logits, in.targets, temperature);
  logits_logprob(lp_g, ent_g, logits.to(Device::cuda), in.targets_g, temperature);
  EXPECT_LE(rel_error(to_double(lp_g), to_double(lp)), kFoldTol) << "logits_logprob logprob";
  EXPECT_LE(rel_error(to_double(ent_g), to_double(ent)), kFoldTol) << "logits_logprob entropy";

  // The rollout's path (full logits, then the fold) against the training forward, both on CUDA.
  const Forward fused = forward(in.hg, in.wg, in.targets_g, temperature);
  Tensor lp2 = poisoned({T}, DType::f32, Device::cuda), ent2 = poisoned({T}, DType::f32, Device::cuda);
  logits_logprob(lp2, ent2, logits_g, in.targets_g, temperature);
  EXPECT_LE(rel_error(to_double(lp2), to_double(fused.logprob)), kLogitsTol) << "rollout vs fused logprob";
  EXPECT_LE(rel_error(to_double(ent2), to_double(fused.entropy)), kLogitsTol) << "rollout vs fused entropy";
}

// Kept logits (ops/lm_head.h) on CUDA: the forward's outputs and the backward's gradients the same
// bits as without (the same cuBLASLt GEMM per chunk, into the kept block instead of scratch), and
// the kept blocks are the logits of lm_head_logits (a different GEMM shape: kLogitsTol).
TEST_P(LmHeadGpu, KeptLogitsGiveTheSameBits) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [T, V, temperature] = GetParam();
  const Inputs in = make_inputs(T, V, 6);
  const Forward plain = forward(in.hg, in.wg, in.targets_g, temperature);
  Forward kept_run{poisoned({T}, DType::f32, Device::cuda), poisoned({T}, DType::f32, Device::cuda),
                   poisoned({T}, DType::f32, Device::cuda)};
  Tensor kept = poisoned({T * V}, DType::f32, Device::cuda);
  lm_head_logprob_forward(kept_run.logprob, kept_run.entropy, kept_run.lse, in.hg, in.wg, in.targets_g,
                          temperature, &kept);
  EXPECT_TRUE(same_bytes(kept_run.logprob, plain.logprob));
  EXPECT_TRUE(same_bytes(kept_run.entropy, plain.entropy));
  EXPECT_TRUE(same_bytes(kept_run.lse, plain.lse));

  Tensor logits = poisoned({T, V}, DType::f32, Device::cuda);
  lm_head_logits(logits, in.hg, in.wg);
  const std::vector<double> full = to_double(logits), chunked = to_double(kept);
  std::vector<double> rearranged(full.size());
  for (int64_t v0 = 0; v0 < V; v0 += kVocabChunk) {
    const int64_t n = std::min(kVocabChunk, V - v0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < n; ++j) rearranged[size_t(t * V + v0 + j)] = chunked[size_t(T * v0 + t * n + j)];
  }
  EXPECT_LE(rel_error(rearranged, full), kLogitsTol) << "kept logits vs lm_head_logits";

  const Tensor dlp = random_values({T}, DType::f32, 14, 1.0f).to(Device::cuda);
  const Tensor dent = random_values({T}, DType::f32, 15, 1.0f).to(Device::cuda);
  Tensor dh = poisoned({T, kH}, DType::bf16, Device::cuda), dh_kept = poisoned({T, kH}, DType::bf16, Device::cuda);
  Tensor dw = Tensor::zeros({V, kH}, DType::f32, Device::cuda), dw_kept = Tensor::zeros({V, kH}, DType::f32, Device::cuda);
  lm_head_logprob_backward(dh, dw, dlp, dent, in.hg, in.wg, in.targets_g, plain.lse, plain.entropy, temperature);
  lm_head_logprob_backward(dh_kept, dw_kept, dlp, dent, in.hg, in.wg, in.targets_g, plain.lse, plain.entropy,
                           temperature, &kept);
  EXPECT_TRUE(same_bytes(dh_kept, dh)) << "dh";
  EXPECT_TRUE(same_bytes(dw_kept, dw)) << "dw";
}

// 10007: a last chunk of 1815 (not a multiple of 4: unaligned rows); 1000: one chunk, first and
// last; 8192: whole chunks only. T = 1, 5: odd token counts for cuBLASLt.
INSTANTIATE_TEST_SUITE_P(Shapes, LmHeadGpu,
                         ::testing::Values(Case{1, 10007, 1.0f}, Case{5, 10007, 0.7f},
                                           Case{300, 10007, 0.7f}, Case{300, 10007, 1.0f},
                                           Case{5, 1000, 0.7f}, Case{37, 8192, 1.0f}),
                         case_name);

// The exact forward kernels (ops/forward_kernels.h): a row's logprob, entropy and lse are the same
// bits in a batch of any size and place, and the rollout's path — lm_head_logits, then the fold of
// logits_logprob, whose bits the sampler's logprob has (ops/sample.h) — gives the training
// forward's. The training forward holds T = 4096 rows; parts of 1 (the first and the last row), 7
// (odd: cuBLASLt may take the part padded), 64 (a decode step) and 300 rows (past a 256-token
// tile) run alone, each through both paths. One part is also checked against the CPU reference
// (kLogitsTol: it keeps every row from being the same wrong bits). Shapes of real heads: Qwen3-1.7B
// (V 151,936, H 2048: 37 chunks and a last one of 448) and SmolLM2-135M (49,152 × 576: 12 whole
// chunks). Weights uniform of variance 4/H: logits ~ N(0, 4), a broad softmax as in the cases above.
struct ExactCase {
  int64_t V, H;
};

void PrintTo(const ExactCase& c, std::ostream* os) { *os << "V " << c.V << ", H " << c.H; }

class LmHeadExactGpu : public ::testing::TestWithParam<ExactCase> {};

TEST_P(LmHeadExactGpu, RowsAreTheSameBitsInEveryBatch) {
  LOCKSTEP_REQUIRE_GPU();
  const auto [V, H] = GetParam();
  constexpr int64_t T = 4096;
  const ExactForwardScope exact;
  const Tensor h = random_values({T, H}, DType::bf16, 21, 1.0f);
  const Tensor w = testing::hashed_tensor({V, H}, DType::bf16, 22, float(2.0 * std::sqrt(3.0 / double(H))));
  const Tensor targets = random_targets(T, V, 23);
  const Tensor hg = h.to(Device::cuda), wg = w.to(Device::cuda), targets_g = targets.to(Device::cuda);
  const Forward all = forward(hg, wg, targets_g, 1.0f);

  for (const auto& [begin, count] : {std::pair<int64_t, int64_t>{0, 1}, {T - 1, 1}, {1000, 7}, {64, 64},
                                     {3000, 300}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << begin << " .. " << begin + count);
    const Tensor hp = hg.rows(begin, begin + count), tp = targets_g.rows(begin, begin + count);
    const Forward part = forward(hp, wg, tp, 1.0f);
    EXPECT_TRUE(same_bytes(part.logprob, all.logprob.rows(begin, begin + count))) << "logprob";
    EXPECT_TRUE(same_bytes(part.entropy, all.entropy.rows(begin, begin + count))) << "entropy";
    EXPECT_TRUE(same_bytes(part.lse, all.lse.rows(begin, begin + count))) << "lse";

    Tensor logits = poisoned({count, V}, DType::f32, Device::cuda);
    lm_head_logits(logits, hp, wg);
    Tensor lp = poisoned({count}, DType::f32, Device::cuda), ent = poisoned({count}, DType::f32, Device::cuda);
    logits_logprob(lp, ent, logits, tp, 1.0f);
    EXPECT_TRUE(same_bytes(lp, all.logprob.rows(begin, begin + count))) << "rollout's logprob";
    EXPECT_TRUE(same_bytes(ent, all.entropy.rows(begin, begin + count))) << "rollout's entropy";

    if (count == 7) {
      const Forward cpu = forward(h.rows(begin, begin + count), w, targets.rows(begin, begin + count), 1.0f);
      EXPECT_LE(rel_error(to_double(part.logprob), to_double(cpu.logprob)), kLogitsTol) << "logprob vs CPU";
      EXPECT_LE(rel_error(to_double(part.entropy), to_double(cpu.entropy)), kLogitsTol) << "entropy vs CPU";
      EXPECT_LE(rel_error(to_double(part.lse), to_double(cpu.lse)), kLogitsTol) << "lse vs CPU";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, LmHeadExactGpu,
                         ::testing::Values(ExactCase{151936, 2048}, ExactCase{49152, 576}),
                         [](const ::testing::TestParamInfo<ExactCase>& info) {
                           std::string name = "V";  // (appended to, as in test_gemm_gpu's shape_name)
                           return name += std::to_string(info.param.V) + "_H" + std::to_string(info.param.H);
                         });

// Target ids on CUDA are not checked on the host: one outside [0, V) poisons what depends on it
// (and only that in the forward), for the trainer's non-finite check to catch.
TEST(LmHeadGpuTargets, OutsideTheVocabularyGiveNaN) {
  LOCKSTEP_REQUIRE_GPU();
  const int64_t T = 5, V = 10007;
  Inputs in = make_inputs(T, V, 4);
  in.targets.data_as<int32_t>()[1] = -1;
  in.targets.data_as<int32_t>()[3] = int32_t(V);
  in.targets_g = in.targets.to(Device::cuda);
  auto is_bad_row = [](int64_t t) { return t == 1 || t == 3; };

  const Forward f = forward(in.hg, in.wg, in.targets_g, 1.0f);
  const std::vector<double> logprob = to_double(f.logprob), entropy = to_double(f.entropy),
                            lse = to_double(f.lse);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(std::isnan(logprob[size_t(t)]), is_bad_row(t)) << "logprob row " << t;
    EXPECT_TRUE(std::isfinite(entropy[size_t(t)]) && std::isfinite(lse[size_t(t)])) << "row " << t;
  }

  Tensor logits = poisoned({T, V}, DType::f32, Device::cuda);
  lm_head_logits(logits, in.hg, in.wg);
  Tensor lp = poisoned({T}, DType::f32, Device::cuda), ent = poisoned({T}, DType::f32, Device::cuda);
  logits_logprob(lp, ent, logits, in.targets_g, 1.0f);
  const std::vector<double> lp_rows = to_double(lp);
  for (int64_t t = 0; t < T; ++t)
    EXPECT_EQ(std::isnan(lp_rows[size_t(t)]), is_bad_row(t)) << "logits_logprob row " << t;

  Tensor dh = poisoned({T, kH}, DType::bf16, Device::cuda), dw = Tensor::zeros({V, kH}, DType::f32, Device::cuda);
  const Tensor dlogprob = random_values({T}, DType::f32, 13, 1.0f).to(Device::cuda);
  lm_head_logprob_backward(dh, dw, dlogprob, Tensor(), in.hg, in.wg, in.targets_g, f.lse, f.entropy, 1.0f);
  const std::vector<double> dh_d = to_double(dh), dw_d = to_double(dw);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < kH; ++k)
      ASSERT_EQ(std::isnan(dh_d[size_t(t * kH + k)]), is_bad_row(t)) << "dh[" << t << "][" << k << "]";
  for (size_t i = 0; i < dw_d.size(); ++i) ASSERT_TRUE(std::isnan(dw_d[i])) << "dw element " << i;
}

TEST(LmHeadGpuErrors, CudaNeedsBf16) {
  LOCKSTEP_REQUIRE_GPU();
  const int64_t T = 2, V = 64;
  const Tensor h = random_values({T, kH}, DType::f32, 5, 1.0f).to(Device::cuda);
  const Tensor w = random_values({V, kH}, DType::bf16, 6, 1.0f).to(Device::cuda);
  Tensor logits = Tensor::empty({T, V}, DType::f32, Device::cuda);
  expect_error([&] { lm_head_logits(logits, h, w); }, "lm_head_logits: on CUDA h and w must be bf16");
}

}  // namespace
}  // namespace lockstep
