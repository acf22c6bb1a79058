// cuDNN's SDPA attention (ops/cuda/attention_cudnn.h) against the CPU reference on the same bf16
// inputs: forward out and lse, backward dq, dk and dv, each compared sequence by sequence (a wrong
// offset or length of one short sequence would hide in the norm of a whole batch). Each check
// prints the worst error it measured ("[ measured ]") so the tolerances can be tightened.
//
// Tolerances, ‖gpu − cpu‖/‖cpu‖ per sequence and part (the CPU computes in fp32 and rounds once):
// - out 1e-2: the CPU's only rounding is the bf16 output (≤ 2^-9 relative); cuDNN also rounds the
//   probabilities to bf16 for its tensor-core P·V, another ~2^-9 per term that averages down over
//   the keys: a few 1e-3 expected.
// - lse 1e-3 absolute: fp32 on both sides, from the same exact bf16 products summed in another
//   order (and exp2-based exponentials): ~1e-5 expected for values of order log(n) + a few.
// - dq, dk, dv 2e-2: cuDNN rounds P and dS = P ⊙ (dP − D) to bf16 for its products (dP − D
//   cancels) and rounds the results to bf16: ~5e-3 expected.
// - dq, dk of a one-token sequence 1e-3 absolute: exactly 0 (a softmax over one key has no
//   gradient), so both sides hold only the rounding noise of dP − D (~1e-6), never comparable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/attention.h"
#include "tests/test_util.h"
#if LOCKSTEP_HAS_CUDNN
#include "ops/cuda/attention_cudnn.h"
#endif

namespace lockstep {
namespace {

#if LOCKSTEP_HAS_CUDNN

using testing::poisoned;
using testing::random_tensor;
using testing::to_double;

constexpr double kOutTol = 1e-2, kLseTol = 1e-3, kGradTol = 2e-2, kZeroGradTol = 1e-3;

#define REQUIRE_SDPA()                                                                     \
  do {                                                                                     \
    LOCKSTEP_REQUIRE_GPU();                                                                \
    if (!cudnn::sdpa_available())                                                          \
      GTEST_SKIP() << "cuDNN SDPA unavailable here (needs cuDNN >= 9.6 and SM 9.x/10.x)"; \
  } while (0)

Tensor cu_seqlens_of(const std::vector<int32_t>& lengths) {
  Tensor cu = Tensor::empty({int64_t(lengths.size()) + 1}, DType::i32);
  int32_t* c = cu.data_as<int32_t>();
  c[0] = 0;
  for (size_t i = 0; i < lengths.size(); ++i) c[i + 1] = c[i] + lengths[i];
  return cu;
}

// A packed batch and the CPU reference's forward on it.
struct Batch {
  HeadLayout layout;
  std::vector<int32_t> lengths;
  Tensor cu, qkv, out, lse;  // CPU
};

Batch make_batch(const HeadLayout& layout, std::vector<int32_t> lengths, uint64_t seed) {
  Batch b;
  b.layout = layout;
  b.lengths = std::move(lengths);
  b.cu = cu_seqlens_of(b.lengths);
  const int64_t T = b.cu.data_as<int32_t>()[b.lengths.size()];
  b.qkv = random_tensor({T, layout.qkv_width()}, DType::bf16, seed);
  b.out = Tensor::empty({T, layout.q_width()}, DType::bf16);
  b.lse = Tensor::empty({T, layout.q_heads}, DType::f32);
  attention_forward(b.out, b.lse, b.qkv, b.cu, layout);
  return b;
}

// ‖a − b‖/‖b‖ over rows [r0, r1) and columns [c0, c1) of row-major data `width` wide.
double block_rel_error(const std::vector<double>& a, const std::vector<double>& b, int64_t width,
                       int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  double num = 0, den = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const double x = a[size_t(r * width + c)], y = b[size_t(r * width + c)];
      num += (x - y) * (x - y);
      den += y * y;
    }
  return std::sqrt(num / den);
}

// max |a| over rows [r0, r1) and columns [c0, c1) (NaN if any is NaN).
double block_max_abs(const std::vector<double>& a, int64_t width, int64_t r0, int64_t r1,
                     int64_t c0, int64_t c1) {
  double m = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const double x = std::abs(a[size_t(r * width + c)]);
      if (std::isnan(x)) return x;
      m = std::max(m, x);
    }
  return m;
}

// Columns [begin, end) of a row, named in messages; `zero_for_one_token`: exactly 0 for a
// sequence of one token.
struct Part {
  const char* name;
  int64_t begin, end;
  bool zero_for_one_token = false;
};

// Every non-empty sequence of a [T, width] result, part by part, within `tol` of the reference
// (or within kZeroGradTol of 0 where the part is 0).
void expect_close_per_sequence(const Tensor& gpu, const Tensor& cpu, const Batch& b,
                               const std::vector<Part>& parts, double tol) {
  const std::vector<double> x = to_double(gpu), y = to_double(cpu);
  const int64_t width = cpu.dim(1);
  const int32_t* c = b.cu.data_as<int32_t>();
  for (const Part& p : parts) {
    double worst = 0;
    for (size_t s = 0; s < b.lengths.size(); ++s) {
      if (b.lengths[s] == 0) continue;
      if (b.lengths[s] == 1 && p.zero_for_one_token) {
        EXPECT_LE(block_max_abs(x, width, c[s], c[s + 1], p.begin, p.end), kZeroGradTol)
            << p.name << " of one-token sequence " << s << ": largest absolute value";
        continue;
      }
      const double rel = block_rel_error(x, y, width, c[s], c[s + 1], p.begin, p.end);
      EXPECT_LE(rel, tol) << p.name << ", sequence " << s << " (" << b.lengths[s] << " tokens)";
      worst = std::isnan(rel) ? rel : std::max(worst, rel);
    }
    std::printf("[ measured ] %s: worst sequence rel %.2e\n", p.name, worst);
  }
}

void expect_lse_close(const Tensor& gpu, const Tensor& cpu) {
  const std::vector<double> x = to_double(gpu), y = to_double(cpu);
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = std::abs(x[i] - y[i]);
    worst = std::isnan(d) ? d : std::max(worst, d);
  }
  std::printf("[ measured ] lse: max abs %.2e\n", worst);
  EXPECT_LE(worst, kLseTol) << "lse: largest absolute difference";
}

// out and lse from `forward` (cuDNN's, or the public op) against the CPU's.
template <class Forward>
void check_forward(const Batch& b, Forward forward) {
  const Tensor qkv = b.qkv.to(Device::cuda), cu = b.cu.to(Device::cuda);
  Tensor out = poisoned(b.out.shape(), DType::bf16, Device::cuda);
  Tensor lse = poisoned(b.lse.shape(), DType::f32, Device::cuda);
  forward(out, lse, qkv, cu, b.layout);
  expect_close_per_sequence(out, b.out, b, {{"out", 0, b.layout.q_width()}}, kOutTol);
  expect_lse_close(lse, b.lse);
}

// dqkv from `backward` on a random dout and the CPU's out and lse, against the CPU's.
template <class Backward>
void check_backward(const Batch& b, uint64_t seed, Backward backward) {
  const HeadLayout& l = b.layout;
  const Tensor dout = random_tensor(b.out.shape(), DType::bf16, seed);
  Tensor dqkv = Tensor::empty(b.qkv.shape(), DType::bf16);
  attention_backward(dqkv, dout, b.qkv, b.out, b.lse, b.cu, l);
  Tensor dqkv_gpu = poisoned(b.qkv.shape(), DType::bf16, Device::cuda);
  backward(dqkv_gpu, dout.to(Device::cuda), b.qkv.to(Device::cuda), b.out.to(Device::cuda),
           b.lse.to(Device::cuda), b.cu.to(Device::cuda), l);
  expect_close_per_sequence(dqkv_gpu, dqkv, b,
                            {{"dq", 0, l.k_offset(), true},
                             {"dk", l.k_offset(), l.v_offset(), true},
                             {"dv", l.v_offset(), l.qkv_width()}},
                            kGradTol);
}

void check_forward(const Batch& b) { check_forward(b, cudnn::attention_forward); }
void check_backward(const Batch& b, uint64_t seed) {
  check_backward(b, seed, cudnn::attention_backward);
}

struct LayoutCase {
  const char* name;
  HeadLayout layout;
};
void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

class AttentionCudnnGpu : public ::testing::TestWithParam<LayoutCase> {};

// Qwen3-like GQA, the same heads as MHA, and Qwen2.5-0.5B-like (head_dim 64, groups of 7).
INSTANTIATE_TEST_SUITE_P(Layouts, AttentionCudnnGpu,
                         ::testing::Values(LayoutCase{"gqa_16q_8kv_d128", {16, 8, 128}},
                                           LayoutCase{"mha_16q_16kv_d128", {16, 16, 128}},
                                           LayoutCase{"gqa_14q_2kv_d64", {14, 2, 64}}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_P(AttentionCudnnGpu, ForwardMatchesCpu) {
  REQUIRE_SDPA();
  check_forward(make_batch(GetParam().layout, {1, 17, 300, 1000}, 1));
}

TEST_P(AttentionCudnnGpu, BackwardMatchesCpu) {
  REQUIRE_SDPA();
  check_backward(make_batch(GetParam().layout, {1, 17, 300, 1000}, 2), 3);
}

// Five sequences (one empty) run as a batch of eight: three empty sequences pad the plan's batch.
TEST(AttentionCudnnGpuBatch, EmptyAndPaddingSequences) {
  REQUIRE_SDPA();
  const Batch b = make_batch({16, 8, 128}, {300, 0, 17, 1, 64}, 4);
  check_forward(b);
  check_backward(b, 5);
}

// A second batch of other lengths in the same shape bucket (3 sequences, T in (256, 512]) runs on
// the plans the first one built.
TEST(AttentionCudnnGpuBatch, SameBucketReusesPlans) {
  REQUIRE_SDPA();
  const HeadLayout layout{16, 8, 128};
  const Batch first = make_batch(layout, {100, 50, 200}, 6);
  check_forward(first);
  check_backward(first, 7);
  const size_t plans = cudnn::sdpa_plan_count();
  const Batch second = make_batch(layout, {10, 300, 90}, 8);
  check_forward(second);
  check_backward(second, 9);
  EXPECT_EQ(cudnn::sdpa_plan_count(), plans) << "a batch of the same bucket built new plans";
}

// cu_seqlens that do not split the rows: nothing read out of bounds, every output NaN.
TEST(AttentionCudnnGpuBatch, InvalidCuSeqlensGiveNaN) {
  REQUIRE_SDPA();
  const HeadLayout layout{16, 8, 128};
  const int64_t T = 40;
  const Tensor qkv = random_tensor({T, layout.qkv_width()}, DType::bf16, 10).to(Device::cuda);
  const Tensor dout = random_tensor({T, layout.q_width()}, DType::bf16, 11).to(Device::cuda);
  const Tensor out_in = random_tensor({T, layout.q_width()}, DType::bf16, 12).to(Device::cuda);
  const Tensor lse_in = random_tensor({T, layout.q_heads}, DType::f32, 13).to(Device::cuda);
  const std::vector<std::vector<int32_t>> bad = {
      {0, 10, 50},      // ends past T
      {0, 30, 20, 40},  // decreases
      {5, 20, 40},      // does not start at 0
      {0, 10, 30}};     // ends before T
  for (const auto& offsets : bad) {
    Tensor cu = Tensor::empty({int64_t(offsets.size())}, DType::i32);
    std::copy(offsets.begin(), offsets.end(), cu.data_as<int32_t>());
    const Tensor cu_gpu = cu.to(Device::cuda);
    Tensor out = Tensor::zeros({T, layout.q_width()}, DType::bf16, Device::cuda);
    Tensor lse = Tensor::zeros({T, layout.q_heads}, DType::f32, Device::cuda);
    Tensor dqkv = Tensor::zeros({T, layout.qkv_width()}, DType::bf16, Device::cuda);
    cudnn::attention_forward(out, lse, qkv, cu_gpu, layout);
    cudnn::attention_backward(dqkv, dout, qkv, out_in, lse_in, cu_gpu, layout);
    for (const Tensor* t : {&out, &lse, &dqkv}) {
      const std::vector<double> v = to_double(*t);
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double x) { return std::isnan(x); }))
          << t->describe() << ": not all NaN for cu_seqlens " << ::testing::PrintToString(offsets);
    }
  }
}

TEST(AttentionCudnnGpuBatch, RejectsF32) {
  REQUIRE_SDPA();
  const HeadLayout layout{16, 8, 128};
  const Tensor qkv = random_tensor({8, layout.qkv_width()}, DType::f32, 14).to(Device::cuda);
  const Tensor cu = cu_seqlens_of({8}).to(Device::cuda);
  Tensor out = Tensor::empty({8, layout.q_width()}, DType::f32, Device::cuda);
  Tensor lse = Tensor::empty({8, layout.q_heads}, DType::f32, Device::cuda);
  EXPECT_THROW(cudnn::attention_forward(out, lse, qkv, cu, layout), Error);
}

// The public ops on CUDA tensors (whichever backend ops/attention.cpp picks) against the CPU.
TEST(AttentionCudnnGpuBatch, PublicOpsMatchCpu) {
  REQUIRE_SDPA();
  const Batch b = make_batch({16, 8, 128}, {1, 17, 300}, 15);
  check_forward(b, [](auto&&... args) { attention_forward(args...); });
  check_backward(b, 16, [](auto&&... args) { attention_backward(args...); });
}

#else

TEST(AttentionCudnnGpu, Skipped) { GTEST_SKIP() << "built without cuDNN: no cuDNN attention"; }

#endif

}  // namespace
}  // namespace lockstep
