// The RL policy loss (train/policy_loss.h): hand-computed examples for every term and option,
// clip-region edge cases, and finite differences of the returned loss for every gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"
#include "train/policy_loss.h"

namespace lockstep {
namespace {

// Inputs are floats: lp = old + log R is rounded to ~2.4e-7 at |lp| ≤ 4, so ratios carry a
// relative error of ~5e-7 and losses/gradients of size ≤ 4 an error below 2e-6. 1e-5 is far
// below every difference the hand calculations distinguish (≥ 1e-2).
constexpr double kTol = 1e-5;

struct Batch {
  std::vector<float> lp, old, ro, ref, entropy, mask, adv;
  std::vector<int32_t> cu;

  PolicyLossInputs inputs() const {
    return {.logprob = lp,
            .old_logprob = old,
            .rollout_logprob = ro,
            .ref_logprob = ref,
            .entropy = entropy,
            .mask = mask,
            .cu_seqlens = cu,
            .advantage = adv};
  }
};

// lp[t] = old[t] + log(ratio[t]): the current policy at a chosen ratio to the old one.
std::vector<float> with_ratios(const std::vector<float>& old, const std::vector<double>& ratio) {
  std::vector<float> lp(old.size());
  for (size_t t = 0; t < old.size(); ++t) lp[t] = float(old[t] + std::log(ratio[t]));
  return lp;
}

std::vector<float> dlogprob_of(const PolicyLoss& l) {
  const float* d = l.dlogprob.data_as<float>();
  return std::vector<float>(d, d + l.dlogprob.numel());
}

void expect_near(const std::vector<float>& got, const std::vector<double>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], kTol) << "token " << i;
}

// Two sequences, ε_low = 0.2, ε_high = 0.28 (bounds 0.8 and 1.28):
//   sequence 0 (A = +1):   token 0 is the prompt (mask 0, logprob NaN: must not be read)
//     t1 R = 1.5 > 1.28: clipped, ℓ = −1.28, ∂ℓ/∂lp = 0
//     t2 R = 1.1:        ℓ = −1.1,  ∂ = −A·R = −1.1
//     t3 R = 0.5 < 0.8:  A > 0 so the lower bound does not bind: ℓ = −0.5, ∂ = −0.5
//   sequence 1 (A = −0.5):
//     t4 R = 0.7 < 0.8:  clipped: min(−0.35, −0.4) = −0.4, ℓ = 0.4, ∂ = 0
//     t5 R = 1.2:        ℓ = 0.6, ∂ = −A·R = 0.6
Batch two_sequences() {
  Batch b;
  b.old = {-1.0f, -0.5f, -2.0f, -1.2f, -0.8f, -3.0f};
  b.lp = with_ratios(b.old, {1, 1.5, 1.1, 0.5, 0.7, 1.2});
  b.lp[0] = NAN;
  b.mask = {0, 1, 1, 1, 1, 1};
  b.cu = {0, 4, 6};
  b.adv = {1.0f, -0.5f};
  return b;
}

const PolicyLossConfig kDapoClip{.clip_low = 0.2f, .clip_high = 0.28f};
const LossAggregation kAggregations[] = {
    LossAggregation::token_mean, LossAggregation::sequence_mean,
    LossAggregation::sequence_mean_token_sum, LossAggregation::token_sum_norm};

TEST(PolicyLoss, TokenMeanByHand) {
  const PolicyLoss l = policy_loss(two_sequences().inputs(), kDapoClip);
  // Σ ℓ = −1.28 − 1.1 − 0.5 + 0.4 + 0.6 = −1.88 over N = 5 tokens.
  EXPECT_NEAR(l.loss, -0.376, kTol);
  EXPECT_NEAR(l.policy_loss, -0.376, kTol);
  EXPECT_EQ(l.kl_loss, 0.0);
  expect_near(dlogprob_of(l), {0, 0, -1.1 / 5, -0.5 / 5, 0, 0.6 / 5});
  EXPECT_EQ(l.dlogprob.data_as<float>()[0], 0.0f);  // the NaN prompt token stays out
  EXPECT_EQ(l.tokens, 5.0);
  EXPECT_EQ(l.sequences, 2);
  EXPECT_NEAR(l.clip_frac_high, 0.2, kTol);
  EXPECT_NEAR(l.clip_frac_low, 0.2, kTol);
  EXPECT_NEAR(l.ratio_mean, (1.5 + 1.1 + 0.5 + 0.7 + 1.2) / 5, kTol);
  // Σ (R − 1 − ln R) = 0.0945349 + 0.0046898 + 0.1931472 + 0.0566749 + 0.0176784 = 0.3667253.
  EXPECT_NEAR(l.approx_kl_old, 0.3667253 / 5, kTol);
  EXPECT_EQ(l.kl_ref, 0.0);
  EXPECT_EQ(l.tis_clip_frac, 0.0);
}

TEST(PolicyLoss, SequenceMeanByHand) {
  PolicyLossConfig c = kDapoClip;
  c.aggregation = LossAggregation::sequence_mean;
  const PolicyLoss l = policy_loss(two_sequences().inputs(), c);
  // Sequence 0: (−1.28 − 1.1 − 0.5)/3 = −0.96; sequence 1: (0.4 + 0.6)/2 = 0.5; mean −0.23.
  EXPECT_NEAR(l.loss, -0.23, kTol);
  // Weights 1/(3·2) in sequence 0 and 1/(2·2) in sequence 1.
  expect_near(dlogprob_of(l), {0, 0, -1.1 / 6, -0.5 / 6, 0, 0.6 / 4});
  // Metrics stay token means.
  EXPECT_NEAR(l.clip_frac_high, 0.2, kTol);
}

TEST(PolicyLoss, SequenceMeanTokenSumByHand) {
  // verl's seq-mean-token-sum: sequence 0 sums to −1.28 − 1.1 − 0.5 = −2.88, sequence 1 to 1.0;
  // their mean −0.94. Each token's weight is 1/S = 1/2.
  PolicyLossConfig c = kDapoClip;
  c.aggregation = LossAggregation::sequence_mean_token_sum;
  const PolicyLoss l = policy_loss(two_sequences().inputs(), c);
  EXPECT_NEAR(l.loss, -0.94, kTol);
  expect_near(dlogprob_of(l), {0, 0, -1.1 / 2, -0.5 / 2, 0, 0.6 / 2});
}

TEST(PolicyLoss, DrGrpoConstantLengthNormalizerByHand) {
  // Σ ℓ = −1.88 over S·L = 2·10 (TRL dr_grpo: batch size × max_completion_length), whatever the
  // sequences' own lengths: −0.094, each token's weight 1/20.
  PolicyLossConfig c = kDapoClip;
  c.aggregation = LossAggregation::token_sum_norm;
  c.max_response_tokens = 10;
  const PolicyLoss l = policy_loss(two_sequences().inputs(), c);
  EXPECT_NEAR(l.loss, -0.094, kTol);
  expect_near(dlogprob_of(l), {0, 0, -1.1 / 20, -0.5 / 20, 0, 0.6 / 20});
  c.max_response_tokens = 0;
  EXPECT_THROW(policy_loss(two_sequences().inputs(), c), Error);
}

TEST(PolicyLoss, MaskWeightsScaleTokens) {
  // Token t5 at weight 0.5: Σ m ℓ = −1.28 − 1.1 − 0.5 + 0.4 + 0.3 = −2.18 over N = 4.5.
  Batch b = two_sequences();
  b.mask[5] = 0.5f;
  const PolicyLoss l = policy_loss(b.inputs(), kDapoClip);
  EXPECT_NEAR(l.loss, -2.18 / 4.5, kTol);
  expect_near(dlogprob_of(l), {0, 0, -1.1 / 4.5, -0.5 / 4.5, 0, 0.5 * 0.6 / 4.5});
  EXPECT_NEAR(l.ratio_mean, (1.5 + 1.1 + 0.5 + 0.7 + 0.5 * 1.2) / 4.5, kTol);
}

// Tokens [begin, end) of `b` as a batch of the one sequence `seq`.
Batch one_sequence_of(const Batch& b, size_t begin, size_t end, size_t seq) {
  Batch part;
  part.lp.assign(b.lp.begin() + ptrdiff_t(begin), b.lp.begin() + ptrdiff_t(end));
  part.old.assign(b.old.begin() + ptrdiff_t(begin), b.old.begin() + ptrdiff_t(end));
  part.mask.assign(b.mask.begin() + ptrdiff_t(begin), b.mask.begin() + ptrdiff_t(end));
  part.cu = {0, int32_t(end - begin)};
  part.adv = {b.adv[seq]};
  return part;
}

TEST(PolicyLoss, MicroBatchesWithTheMiniBatchNormalizerAddUp) {
  // The two sequences as two micro-batches, each normalized by the whole mini-batch's count.
  const Batch full = two_sequences();
  const Batch first = one_sequence_of(full, 0, 4, 0), second = one_sequence_of(full, 4, 6, 1);
  for (LossAggregation agg : kAggregations) {
    PolicyLossConfig c = kDapoClip;
    c.aggregation = agg;
    c.max_response_tokens = 10;
    const PolicyLoss whole = policy_loss(full.inputs(), c);
    c.normalizer = agg == LossAggregation::token_mean ? whole.tokens : double(whole.sequences);
    const PolicyLoss a = policy_loss(first.inputs(), c), b = policy_loss(second.inputs(), c);
    EXPECT_NEAR(a.loss + b.loss, whole.loss, 1e-12);
    std::vector<float> d = dlogprob_of(a);
    for (float x : dlogprob_of(b)) d.push_back(x);
    EXPECT_EQ(d, dlogprob_of(whole));
  }
}

// One sequence, A = 0 (no PPO term), β = 0.1, lp = {−1, −2}, ref = {−1.5, −2}:
//   k3: x = ref − lp = −0.5: e^−0.5 + 0.5 − 1 = 0.1065307, ∂/∂lp = 1 − e^−0.5 = 0.3934693;
//       x = 0 gives 0 and ∂ 0.  k1: lp − ref = 0.5 and 0, ∂/∂lp = 1 for both.
Batch kl_batch() {
  Batch b;
  b.lp = {-1.0f, -2.0f};
  b.old = b.lp;
  b.ref = {-1.5f, -2.0f};
  b.mask = {1, 1};
  b.cu = {0, 2};
  b.adv = {0};
  return b;
}

TEST(PolicyLoss, KlPenaltyK3ByHand) {
  const PolicyLoss l = policy_loss(kl_batch().inputs(), {.kl_coef = 0.1f});
  EXPECT_NEAR(l.kl_ref, 0.1065307 / 2, 1e-7);
  EXPECT_NEAR(l.loss, 0.1 * 0.1065307 / 2, 1e-8);
  EXPECT_NEAR(l.kl_loss, l.loss, 1e-15);
  EXPECT_EQ(l.policy_loss, 0.0);
  expect_near(dlogprob_of(l), {0.1 * 0.3934693 / 2, 0});
}

TEST(PolicyLoss, KlPenaltyK1ByHand) {
  const PolicyLoss l =
      policy_loss(kl_batch().inputs(), {.kl_coef = 0.1f, .kl_estimator = KlEstimator::k1});
  EXPECT_NEAR(l.kl_ref, 0.25, 1e-7);
  EXPECT_NEAR(l.loss, 0.025, 1e-8);
  expect_near(dlogprob_of(l), {0.05, 0.05});
}

TEST(PolicyLoss, ReferenceWithoutPenaltyIsOnlyAMetric) {
  const PolicyLoss l = policy_loss(kl_batch().inputs(), {});
  EXPECT_NEAR(l.kl_ref, 0.1065307 / 2, 1e-7);
  EXPECT_EQ(l.loss, 0.0);
  expect_near(dlogprob_of(l), {0, 0});
}

// Truncated importance sampling, C = 2, ε_low = 0.2, ε_high = 0.28. Tokens (R, ρ = π_old/π_ro):
//   sequence 0 (A = +1): (1.1, 3), (1.1, 0.5), (1.5, 3), (2.0, 3)
//   sequence 1 (A = −1): (0.7, 3)
// w = min(ρ, 2) = 2, 0.5, 2, 2, 2. Plain TIS clips R above 1.28 and below 0.8:
//   ℓ = −2.2, −0.55, −2·1.28 = −2.56, −2.56, −2·(−1)·0.8 = 1.6;  ∂ = −2.2, −0.55, 0, 0, 0
// ACR: ρ > C gives r = 2/3 and the upper bound 1.28·3/2 = 1.92; the lower bound stays 0.8:
//   ℓ = −2.2, −0.55, −2·1.5 = −3.0, −2·1.92 = −3.84, 1.6;  ∂ = −2.2, −0.55, −3.0, 0, 0
Batch tis_batch() {
  Batch b;
  b.old = {-1.0f, -0.7f, -1.5f, -2.0f, -0.4f};
  b.lp = with_ratios(b.old, {1.1, 1.1, 1.5, 2.0, 0.7});
  const std::vector<double> rho = {3, 0.5, 3, 3, 3};
  for (size_t t = 0; t < rho.size(); ++t) b.ro.push_back(float(b.old[t] - std::log(rho[t])));
  b.mask = {1, 1, 1, 1, 1};
  b.cu = {0, 4, 5};
  b.adv = {1, -1};
  return b;
}

TEST(PolicyLoss, TruncatedImportanceSamplingByHand) {
  PolicyLossConfig c = kDapoClip;
  c.tis_cap = 2;
  const PolicyLoss l = policy_loss(tis_batch().inputs(), c);
  EXPECT_NEAR(l.loss, (-2.2 - 0.55 - 2.56 - 2.56 + 1.6) / 5, kTol);
  expect_near(dlogprob_of(l), {-2.2 / 5, -0.55 / 5, 0, 0, 0});
  EXPECT_NEAR(l.tis_clip_frac, 0.8, kTol);
  EXPECT_NEAR(l.clip_frac_high, 0.4, kTol);
  EXPECT_NEAR(l.clip_frac_low, 0.2, kTol);
}

TEST(PolicyLoss, AdaptiveClippingRangeByHand) {
  PolicyLossConfig c = kDapoClip;
  c.tis_cap = 2;
  c.adaptive_clip = true;
  const PolicyLoss l = policy_loss(tis_batch().inputs(), c);
  EXPECT_NEAR(l.loss, (-2.2 - 0.55 - 3.0 - 3.84 + 1.6) / 5, kTol);
  expect_near(dlogprob_of(l), {-2.2 / 5, -0.55 / 5, -3.0 / 5, 0, 0});
  EXPECT_NEAR(l.clip_frac_high, 0.2, kTol);
  EXPECT_NEAR(l.clip_frac_low, 0.2, kTol);
}

TEST(PolicyLoss, TisWeightIsCappedNotTheRatio) {
  // ρ = 1000 with C = 2: w = 2 exactly, whatever ρ (R = 1 so ℓ = −w·A).
  Batch b;
  b.old = {-3.0f};
  b.lp = b.old;
  b.ro = {float(-3.0 - std::log(1000.0))};
  b.mask = {1};
  b.cu = {0, 1};
  b.adv = {1};
  const PolicyLoss l = policy_loss(b.inputs(), {.tis_cap = 2});
  EXPECT_NEAR(l.loss, -2.0, kTol);
  expect_near(dlogprob_of(l), {-2.0});
  EXPECT_EQ(l.tis_clip_frac, 1.0);
}

// One token at ratio R with advantage A: ∂loss/∂lp is −A·R unless the clip binds, then 0.
struct EdgeCase {
  double a, ratio;
  float clip_low, clip_high;
  bool clipped;
};

TEST(PolicyLoss, ClipRegionEdges) {
  const EdgeCase cases[] = {
      {1, 1.28 * (1 - 1e-4), 0.2f, 0.28f, false},  // just inside the upper bound
      {1, 1.28 * (1 + 1e-4), 0.2f, 0.28f, true},   // just outside
      {1, 0.3, 0.2f, 0.28f, false},                // A > 0: the lower bound never binds
      {-1, 0.8 * (1 + 1e-4), 0.2f, 0.28f, false},  // just inside the lower bound
      {-1, 0.8 * (1 - 1e-4), 0.2f, 0.28f, true},   // just outside
      {-1, 2.9, 0.2f, 0.28f, false},  // A < 0: the upper bound never binds (dual-clip: at 3)
      {1, 1.25, 0.2f, 0.28f, false},               // clip-higher lets 1.25 through...
      {1, 1.25, 0.2f, 0.2f, true},                 // ...which symmetric 0.2 clips
      {-1, 0.75, 0.2f, 0.28f, true},               // and the two bounds are independent
      {-1, 0.75, 0.28f, 0.28f, false},
      {0, 5.0, 0.2f, 0.28f, false},  // A = 0: no loss, no gradient
  };
  for (const EdgeCase& e : cases) {
    Batch b;
    b.old = {-2.0f};
    b.lp = with_ratios(b.old, {e.ratio});
    b.mask = {1};
    b.cu = {0, 1};
    b.adv = {float(e.a)};
    const PolicyLoss l =
        policy_loss(b.inputs(), {.clip_low = e.clip_low, .clip_high = e.clip_high});
    const double bound = e.a > 0 ? 1 + e.clip_high : 1 - e.clip_low;
    const std::string what = "A = " + std::to_string(e.a) + ", R = " + std::to_string(e.ratio);
    EXPECT_NEAR(l.loss, -e.a * (e.clipped ? bound : e.ratio), kTol) << what;
    EXPECT_NEAR(l.dlogprob.data_as<float>()[0], e.clipped ? 0.0 : -e.a * e.ratio, kTol) << what;
    EXPECT_EQ(l.clip_frac_high + l.clip_frac_low, e.clipped ? 1.0 : 0.0) << what;
  }
}

// One token at ratio R, advantage A, with the given config.
PolicyLoss one_token(double a, double log_ratio, const PolicyLossConfig& c) {
  Batch b;
  b.old = {-2.0f};
  b.lp = {float(-2.0 + log_ratio)};
  b.mask = {1};
  b.cu = {0, 1};
  b.adv = {float(a)};
  return policy_loss(b.inputs(), c);
}

TEST(PolicyLoss, DualClipBoundsTheLossOfNegativeAdvantages) {
  // verl's dual-clip, c = 3: A = −1, R = 4 → ℓ = −A·c = 3 (not −A·R = 4), ∂ = 0.
  PolicyLoss l = one_token(-1, std::log(4.0), kDapoClip);
  EXPECT_NEAR(l.loss, 3.0, kTol);
  EXPECT_EQ(l.dlogprob.data_as<float>()[0], 0.0f);
  EXPECT_EQ(l.clip_frac_dual, 1.0);
  EXPECT_EQ(l.clip_frac_low + l.clip_frac_high, 0.0);
  // R = 2.9 < c: the plain branch, ℓ = 2.9, ∂ = −A·R = 2.9.
  l = one_token(-1, std::log(2.9), kDapoClip);
  EXPECT_NEAR(l.loss, 2.9, kTol);
  EXPECT_NEAR(l.dlogprob.data_as<float>()[0], 2.9, kTol);
  EXPECT_EQ(l.clip_frac_dual, 0.0);
  // Off (c = 0): ℓ = 4, ∂ = 4.
  PolicyLossConfig off = kDapoClip;
  off.clip_ratio_c = 0;
  l = one_token(-1, std::log(4.0), off);
  EXPECT_NEAR(l.loss, 4.0, kTol);
  EXPECT_NEAR(l.dlogprob.data_as<float>()[0], 4.0, kTol);
  // A > 0 is untouched by it: R = 4 clips at 1 + ε_high = 1.28.
  l = one_token(1, std::log(4.0), kDapoClip);
  EXPECT_NEAR(l.loss, -1.28, kTol);
  EXPECT_EQ(l.clip_frac_high, 1.0);
  EXPECT_EQ(l.clip_frac_dual, 0.0);
  PolicyLossConfig bad = kDapoClip;
  bad.clip_ratio_c = 1.0f;
  EXPECT_THROW(one_token(-1, 0, bad), Error);
}

TEST(PolicyLoss, LogRatioIsClampedAtTwenty) {
  // lp − old = −25, A = +1: R = exp(−20) = 2.0611536e-9 (not exp(−25)); the clamp passes no
  // gradient, as torch.clamp outside its range.
  PolicyLoss l = one_token(1, -25, kDapoClip);
  EXPECT_NEAR(l.loss, -2.0611536e-9, 1e-15);
  EXPECT_EQ(l.dlogprob.data_as<float>()[0], 0.0f);
  // lp − old = +30, A = −1, dual-clip off: R = exp(20) = 4.8516520e8, a finite loss of that size.
  PolicyLossConfig off = kDapoClip;
  off.clip_ratio_c = 0;
  l = one_token(-1, 30, off);
  EXPECT_NEAR(l.loss, 4.8516520e8, 1e2);
  EXPECT_EQ(l.dlogprob.data_as<float>()[0], 0.0f);
  // A token the policy now gives probability 0 (lp = −inf): still a finite loss.
  l = one_token(1, -INFINITY, kDapoClip);
  EXPECT_NEAR(l.loss, -2.0611536e-9, 1e-15);
  // Inside ±20 nothing changes: lp − old = 19.9, A = −1, dual-clip off: ∂ = −A·R = e^19.9.
  l = one_token(-1, 19.9, off);
  EXPECT_NEAR(l.dlogprob.data_as<float>()[0], std::exp(19.9), 1e-6 * std::exp(19.9));
}

TEST(PolicyLoss, RatioOneWithZeroEpsilonKeepsItsGradient) {
  // ε_low = ε_high = 0 and R = 1 exactly (the first on-policy mini-batch): R sits on both bounds;
  // the unclipped branch is taken (torch's clamp passes the gradient at its bounds), so
  // ∂ℓ/∂lp = −A·R = −A. A ">=" at the bound would give 0 and stop learning.
  const PolicyLossConfig zero{.clip_low = 0.0f, .clip_high = 0.0f};
  for (double a : {1.0, -0.5}) {
    const PolicyLoss l = one_token(a, 0, zero);
    EXPECT_NEAR(l.loss, -a, kTol) << a;
    EXPECT_EQ(l.dlogprob.data_as<float>()[0], float(-a)) << a;
    EXPECT_EQ(l.clip_frac_low + l.clip_frac_high, 0.0) << a;
  }
}

TEST(PolicyLoss, EntropyMetricIsAMaskedMean) {
  Batch b = two_sequences();
  b.entropy = {100, 1, 2, 3, 4, 5};  // token 0 is masked out
  EXPECT_NEAR(policy_loss(b.inputs(), kDapoClip).entropy_mean, 3.0, 1e-12);
}

TEST(PolicyLoss, NonFiniteLogprobOfACountedTokenPropagates) {
  Batch b = two_sequences();
  b.lp[2] = NAN;
  const PolicyLoss l = policy_loss(b.inputs(), kDapoClip);
  EXPECT_TRUE(std::isnan(l.loss));
  EXPECT_TRUE(std::isnan(l.dlogprob.data_as<float>()[2]));
}

// Random batches for the finite differences: ratios kept ≥ 3% away from every clip bound (the
// loss has kinks there), some ρ above the TIS cap.
Batch random_batch(uint64_t seed, float clip_low, float clip_high, float cap, float dual = 3) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::normal_distribution<double> normal;
  Batch b;
  b.cu = {0};
  for (int s = 0; s < 6; ++s) {
    const int len = 1 + int(uniform(rng) * 8);
    b.adv.push_back(float(normal(rng)));
    for (int i = 0; i < len; ++i) {
      const double old = -0.1 - 3.5 * uniform(rng), rho = 0.3 + 3.7 * uniform(rng);
      const double upper_acr = (1 + clip_high) * std::max(1.0, rho / cap);
      double ratio;
      do {
        ratio = 0.5 + 1.5 * uniform(rng);
      } while (std::abs(ratio / (1 - clip_low) - 1) < 0.03 ||
               std::abs(ratio / (1 + clip_high) - 1) < 0.03 ||
               std::abs(ratio / upper_acr - 1) < 0.03 || std::abs(ratio / dual - 1) < 0.03);
      b.old.push_back(float(old));
      b.lp.push_back(float(old + std::log(ratio)));
      b.ro.push_back(float(old - std::log(rho)));
      b.ref.push_back(float(b.lp.back() + 0.5 * normal(rng)));
      b.entropy.push_back(float(uniform(rng)));
      b.mask.push_back(i == 0 ? 0.0f : uniform(rng) < 0.2 ? 0.5f : 1.0f);
    }
    b.cu.push_back(int32_t(b.lp.size()));
  }
  return b;
}

// Every gradient against central differences of the returned loss (double precision, each
// logprob moved by ±h as a float; the exact float steps are used). With h = 1e-3 the truncation
// error (~h²·|ℓ'''|/6) and the float steps' asymmetry are below 1e-6 relative; the analytic
// gradient is stored as a float (6e-8): 1e-5 relative over the whole gradient vector.
TEST(PolicyLoss, FiniteDifferencesOfEveryOption) {
  // Dual-clip at c = 1.6, inside the ratios' range [0.5, 2], so that it binds on some tokens.
  const float clip_low = 0.2f, clip_high = 0.28f, cap = 2.0f, dual = 1.6f;
  int seed = 0;
  for (LossAggregation agg : kAggregations) {
    for (int kl = 0; kl < 3; ++kl) {
      for (int tis = 0; tis < 3; ++tis) {
        const PolicyLossConfig c{.clip_low = clip_low,
                                 .clip_high = clip_high,
                                 .clip_ratio_c = dual,
                                 .aggregation = agg,
                                 .kl_coef = kl == 0 ? 0.0f : 0.3f,
                                 .kl_estimator = kl == 1 ? KlEstimator::k1 : KlEstimator::k3,
                                 .tis_cap = tis == 0 ? 0.0f : cap,
                                 .adaptive_clip = tis == 2,
                                 .max_response_tokens = 7};
        Batch b = random_batch(uint64_t(++seed), clip_low, clip_high, cap, dual);
        const std::vector<float> analytic = dlogprob_of(policy_loss(b.inputs(), c));
        std::vector<double> numeric(analytic.size()), analytic_d(analytic.begin(), analytic.end());
        const float h = 1e-3f;
        for (size_t t = 0; t < b.lp.size(); ++t) {
          const float x = b.lp[t];
          b.lp[t] = x + h;
          const double up = policy_loss(b.inputs(), c).loss, step_up = double(b.lp[t]) - x;
          b.lp[t] = x - h;
          const double down = policy_loss(b.inputs(), c).loss, step_down = x - double(b.lp[t]);
          b.lp[t] = x;
          numeric[t] = (up - down) / (step_up + step_down);
        }
        EXPECT_LE(testing::rel_error(analytic_d, numeric), 1e-5)
            << "aggregation " << int(agg) << ", kl " << kl << ", tis " << tis;
      }
    }
  }
}

TEST(PolicyLoss, FiniteDifferencesSeeTheClippedZeros) {
  // The finite-difference test must be able to fail: with ratios on both sides of the bounds
  // some gradients are exactly 0, and the numeric ones agree.
  const Batch b = random_batch(99, 0.2f, 0.28f, 2.0f);
  const PolicyLoss l = policy_loss(b.inputs(), kDapoClip);
  int zeros = 0;
  for (size_t t = 0; t < b.lp.size(); ++t)
    zeros += b.mask[t] != 0 && l.dlogprob.data_as<float>()[t] == 0.0f;
  EXPECT_GT(zeros, 0);
  EXPECT_GT(l.clip_frac_high + l.clip_frac_low, 0.0);
}

void expect_error(const PolicyLossInputs& in, const PolicyLossConfig& c, const std::string& part) {
  try {
    policy_loss(in, c);
    ADD_FAILURE() << "no error for " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(PolicyLoss, BadInputIsNamed) {
  const Batch good = two_sequences();
  Batch b = good;
  b.old.pop_back();
  expect_error(b.inputs(), {}, "old_logprob");
  b = good;
  b.ro = {1, 2};
  expect_error(b.inputs(), {}, "rollout_logprob");
  b = good;
  b.cu = {0, 4, 5};
  expect_error(b.inputs(), {}, "cu_seqlens ends at 5");
  b.cu = {0, 4, 3, 6};
  b.adv = {1, 1, 1};
  expect_error(b.inputs(), {}, "cu_seqlens[2]");
  b = good;
  b.adv = {1};
  expect_error(b.inputs(), {}, "advantage");
  b.adv = {1, NAN};
  expect_error(b.inputs(), {}, "advantage[1]");
  b = good;
  b.mask[3] = -1;
  expect_error(b.inputs(), {}, "mask[3]");
  b.mask.assign(6, 0.0f);
  expect_error(b.inputs(), {}, "selects no token");
  expect_error(good.inputs(), {.kl_coef = 0.1f}, "ref_logprob");
  expect_error(good.inputs(), {.tis_cap = 2}, "rollout_logprob");
  expect_error(good.inputs(), {.adaptive_clip = true}, "tis_cap");
  expect_error(good.inputs(), {.clip_low = 1}, "clip_low");
  expect_error(good.inputs(), {.clip_high = -0.1f}, "clip_high");
}

}  // namespace
}  // namespace lockstep
