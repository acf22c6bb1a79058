// AdamW with the weight copies (ops/adamw.h, WeightCopies) on the CPU: the step is byte for byte
// adamw_step followed by convert and quantize_weight of the updated param, and the copies'
// arguments are checked with clear errors.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "numerics/quantize.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::random_tensor;
using testing::same_bytes;

Tensor copy_of(const Tensor& t) { return t.to(Device::cpu); }

const AdamWHyper kHyper{.lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};

// Three steps with copies against three plain steps each followed by convert / quantize_weight:
// identical bytes (the copies are made from the updated param, never the old one).
void expect_composition(const Shape& shape, bool with_bf16, bool with_fp8, ScaleFormat format) {
  Tensor p = random_tensor(shape, DType::f32, 1), m = random_tensor(shape, DType::f32, 2);
  Tensor v = random_tensor(shape, DType::f32, 3);
  for (int64_t i = 0; i < v.numel(); ++i) v.data_as<float>()[i] *= v.data_as<float>()[i];  // v ≥ 0
  Tensor p_ref = copy_of(p), m_ref = copy_of(m), v_ref = copy_of(v);
  Tensor bf16 = Tensor::empty(shape, DType::bf16), bf16_ref = Tensor::empty(shape, DType::bf16);
  Fp8Weight fp8, fp8_ref;
  if (with_fp8) {
    fp8 = Fp8Weight::empty(shape[0], shape[1], Device::cpu);
    fp8_ref = Fp8Weight::empty(shape[0], shape[1], Device::cpu);
  }
  const WeightCopies copies{.bf16 = with_bf16 ? &bf16 : nullptr,
                            .fp8 = with_fp8 ? &fp8 : nullptr,
                            .fp8_format = format};
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE(step);
    const Tensor g = random_tensor(shape, DType::f32, 10 + uint64_t(step), /*varied_rows=*/true);
    bf16.fill_bytes(0xFF);
    for (Tensor* t : {&fp8.w.data, &fp8.w.scales, &fp8.wt.data, &fp8.wt.scales})
      if (t->defined()) t->fill_bytes(0xFF);
    adamw_step(p, m, v, g, kHyper, step, 0.7f, copies);
    adamw_step(p_ref, m_ref, v_ref, g, kHyper, step, 0.7f);
    EXPECT_TRUE(same_bytes(p, p_ref));
    EXPECT_TRUE(same_bytes(m, m_ref));
    EXPECT_TRUE(same_bytes(v, v_ref));
    if (with_bf16) {
      convert(bf16_ref, p_ref);
      EXPECT_TRUE(same_bytes(bf16, bf16_ref));
    }
    if (with_fp8) {
      quantize_weight(fp8_ref, p_ref, format);
      EXPECT_TRUE(same_bytes(fp8.w.data, fp8_ref.w.data));
      EXPECT_TRUE(same_bytes(fp8.w.scales, fp8_ref.w.scales));
      EXPECT_TRUE(same_bytes(fp8.wt.data, fp8_ref.wt.data));
      EXPECT_TRUE(same_bytes(fp8.wt.scales, fp8_ref.wt.scales));
    }
  }
}

TEST(AdamWCopies, BothCopiesAreTheStepThenConvertAndQuantize) {
  expect_composition({256, 384}, true, true, ScaleFormat::fp32);
  expect_composition({128, 640}, true, true, ScaleFormat::pow2);
  // Partial 128-blocks (numerics/quantize.h): SmolLM2-135M's qkv [960, 576], a [192, 320].
  expect_composition({960, 576}, true, true, ScaleFormat::fp32);
  expect_composition({192, 320}, false, true, ScaleFormat::pow2);
}

TEST(AdamWCopies, EachCopyAlone) {
  expect_composition({256, 128}, false, true, ScaleFormat::fp32);
  expect_composition({37, 41}, true, false, ScaleFormat::fp32);  // a norm-weight-like shape
  expect_composition({1000}, true, false, ScaleFormat::fp32);
}

TEST(AdamWCopies, BadCopiesAreClearErrors) {
  const Shape shape = {128, 256};
  Tensor p = random_tensor(shape, DType::f32, 20), m = Tensor::zeros(shape, DType::f32);
  Tensor v = Tensor::zeros(shape, DType::f32);
  const Tensor g = random_tensor(shape, DType::f32, 21);
  const auto step = [&](const WeightCopies& c) { adamw_step(p, m, v, g, kHyper, 1, 1.0f, c); };

  Tensor f32_copy = Tensor::empty(shape, DType::f32);
  expect_error([&] { step({.bf16 = &f32_copy}); }, "adamw_step: bf16 copy");
  Tensor short_copy = Tensor::empty({128, 128}, DType::bf16);
  expect_error([&] { step({.bf16 = &short_copy}); }, "adamw_step: bf16 copy");

  Fp8Weight transposed = Fp8Weight::empty(256, 128, Device::cpu);
  expect_error([&] { step({.fp8 = &transposed}); }, "adamw_step: fp8 copy.w");
  Fp8Weight no_wt = Fp8Weight::empty(128, 256, Device::cpu);
  no_wt.wt.scales = Tensor::empty({2, 2}, DType::f32);
  expect_error([&] { step({.fp8 = &no_wt}); }, "adamw_step: fp8 copy.wt");

  // Shapes whose sides are not multiples of 16 take no fp8 copy.
  Tensor p_odd = random_tensor({128, 200}, DType::f32, 22), m_odd = Tensor::zeros({128, 200}, DType::f32);
  Tensor v_odd = Tensor::zeros({128, 200}, DType::f32);
  const Tensor g_odd = random_tensor({128, 200}, DType::f32, 23);
  Fp8Weight fp8 = Fp8Weight::empty(128, 256, Device::cpu);
  expect_error([&] { adamw_step(p_odd, m_odd, v_odd, g_odd, kHyper, 1, 1.0f, {.fp8 = &fp8}); },
               "adamw_step: an fp8 copy needs param [N, K] with N and K multiples of 16");
  Tensor p_1d = random_tensor({256}, DType::f32, 24), m_1d = Tensor::zeros({256}, DType::f32);
  Tensor v_1d = Tensor::zeros({256}, DType::f32);
  const Tensor g_1d = random_tensor({256}, DType::f32, 25);
  expect_error([&] { adamw_step(p_1d, m_1d, v_1d, g_1d, kHyper, 1, 1.0f, {.fp8 = &fp8}); },
               "adamw_step: an fp8 copy");
}

#if !LOCKSTEP_HAS_CUDA
// A view that claims to live on the GPU: without a CUDA backend it is refused by name.
TEST(AdamWCopies, CudaTensorsNeedACudaBuild) {
  Tensor p = random_tensor({8}, DType::f32, 30);
  Tensor gp = Tensor::view_of(p.data(), p.shape(), p.dtype(), Device::cuda);
  Tensor gm = gp, gv = gp;
  expect_error([&] { adamw_step(gp, gm, gv, gp, kHyper, 1, 1.0f); }, "adamw_step: ");
}
#endif

}  // namespace
}  // namespace lockstep
