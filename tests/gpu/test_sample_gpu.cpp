// tests/gpu/test_sample_gpu.cpp — the CUDA sampler (ops/sample.h) and KV block copy
// (ops/block_copy.h) against their CPU backends on the same inputs.
//
// Tokens must equal the CPU's except where a draw lies within rounding of a boundary: the CUDA
// weights are expf(l·(1/τ) − max) against the CPU's exp(l/τ − max) (a few ulps apart) and are
// summed as integers of 2^-44 where the CPU sums doubles, so a cumulative weight can differ by
// ~1e-6 relative. A differing token is excused when, in double precision, the draw's target
// u·Σw or its top-p target top_p·mass lies within 1e-5 (relative) of a neighbouring cumulative
// sum; excused draws are counted and printed, and must stay rare (expected: none).
// Logprobs are compared with logits_logprob on the CPU for the GPU's token within 1e-5 absolute,
// or four ulps of the row's largest |z| where that is more (the peaked rows): z = l/τ and l·(1/τ)
// differ by an ulp, and lse = max z + log Σ is rounded at that magnitude on both sides.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "core/dtypes.h"
#include "core/philox.h"
#include "ops/block_copy.h"
#include "ops/lm_head.h"
#include "ops/sample.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::random_tensor;

struct Drawn {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// sample_tokens on `device` (outputs poisoned first), results on the host.
Drawn sample_on(Device device, const Tensor& logits, const std::vector<SampleSpec>& specs) {
  const int64_t n = int64_t(specs.size());
  Tensor tokens = Tensor::empty({n}, DType::i32, device);
  Tensor logprobs = Tensor::empty({n}, DType::f32, device);
  tokens.fill_bytes(0xFF);
  logprobs.fill_bytes(0xFF);
  sample_tokens(tokens, logprobs, logits.to(device), sample_specs_tensor(specs).to(device));
  const Tensor t = tokens.to(Device::cpu), l = logprobs.to(Device::cpu);
  return {{t.data_as<int32_t>(), t.data_as<int32_t>() + n},
          {l.data_as<float>(), l.data_as<float>() + n}};
}

// How close, relative to the masses involved, the draw of `spec` from `row` comes to a boundary
// that rounding could move it across (ops/sample.h's definition in double); infinite for greedy.
double boundary_margin(std::span<const float> row, const SampleSpec& spec) {
  if (spec.temperature == 0) return INFINITY;
  const size_t vocab = row.size();
  std::vector<double> w(vocab);
  double max = -INFINITY;
  for (size_t v = 0; v < vocab; ++v) max = std::max(max, double(row[v]) / spec.temperature);
  for (size_t v = 0; v < vocab; ++v) w[v] = std::exp(double(row[v]) / spec.temperature - max);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
  size_t keep = spec.top_k > 0 && size_t(spec.top_k) < vocab ? size_t(spec.top_k) : vocab;
  double margin = INFINITY;
  if (spec.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) mass += w[size_t(order[i])];
    const double target = double(spec.top_p) * mass;
    double sum = 0;
    size_t n = 0;
    while (n < keep && sum < target) sum += w[size_t(order[n++])];
    margin = std::min(sum - target, target - (sum - w[size_t(order[n - 1])])) / mass;
    keep = n;
  }
  std::vector<int32_t> kept(order.begin(), order.begin() + ptrdiff_t(keep));
  std::sort(kept.begin(), kept.end());
  double total = 0;
  for (int32_t v : kept) total += w[size_t(v)];
  const double target =
      philox_uniform53(philox_at(spec.seed, spec.stream, spec.position)) * total;
  double sum = 0;
  for (int32_t v : kept) {
    const double before = sum;
    sum += w[size_t(v)];
    if (sum >= target) return std::min(margin, std::min(target - before, sum - target) / total);
  }
  return 0;  // the sum fell short of the target: a rounding boundary by definition
}

// logits_logprob on the CPU of `token` in `row`.
float cpu_logprob(std::span<const float> row, int32_t token, float temperature) {
  Tensor l = Tensor::view_of(const_cast<float*>(row.data()), {1, int64_t(row.size())}, DType::f32);
  Tensor target = Tensor::view_of(&token, {1}, DType::i32);
  Tensor logprob = Tensor::empty({1}, DType::f32), entropy = Tensor::empty({1}, DType::f32);
  logits_logprob(logprob, entropy, l, target, temperature > 0 ? temperature : 1.0f);
  return logprob.data_as<float>()[0];
}

// Rows of N(0, σ²) logits, σ per row from `scales` (flat to peaked); `tied` rows are rounded to
// multiples of 0.5, so many logits tie (−0 among them).
Tensor logits_rows(int64_t vocab, const std::vector<float>& scales, bool tied, uint64_t seed) {
  Tensor t = Tensor::empty({int64_t(scales.size()), vocab}, DType::f32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  float* p = t.data_as<float>();
  for (size_t r = 0; r < scales.size(); ++r)
    for (int64_t v = 0; v < vocab; ++v) {
      const float x = normal(rng) * scales[r];
      p[int64_t(r) * vocab + v] = tied ? std::round(x * 2.0f) / 2.0f : x;
    }
  return t;
}

// Each row under every setting at a few positions.
std::vector<SampleSpec> all_settings(int64_t rows, uint64_t positions) {
  struct Setting {
    float temperature, top_p;
    int32_t top_k;
  };
  const Setting settings[] = {{0.0f, 1.0f, 0},     {1.0f, 1.0f, 0},    {0.7f, 1.0f, 50},
                              {1.0f, 0.9f, 0},     {1.3f, 0.95f, 1000}, {0.8f, 1.0f, 1},
                              {1.0f, 0.3f, 0},     {0.5f, 0.99f, 7}};
  std::vector<SampleSpec> specs;
  for (int64_t r = 0; r < rows; ++r)
    for (const Setting& s : settings)
      for (uint64_t p = 0; p < positions; ++p)
        specs.push_back({.seed = 1234 + uint64_t(r),
                         .stream = uint64_t(specs.size() % 3),
                         .position = 100 + p,
                         .row = int32_t(r),
                         .temperature = s.temperature,
                         .top_p = s.top_p,
                         .top_k = s.top_k});
  return specs;
}

void expect_like_cpu(const Tensor& logits, const std::vector<SampleSpec>& specs) {
  const Drawn cpu = sample_on(Device::cpu, logits, specs);
  const Drawn gpu = sample_on(Device::cuda, logits, specs);
  const int64_t vocab = logits.dim(1);
  int excused = 0;
  for (size_t d = 0; d < specs.size(); ++d) {
    const SampleSpec& s = specs[d];
    const std::span<const float> row(logits.data_as<float>() + s.row * vocab, size_t(vocab));
    ASSERT_GE(gpu.tokens[d], 0) << "draw " << d;
    ASSERT_LT(gpu.tokens[d], vocab) << "draw " << d;
    if (gpu.tokens[d] != cpu.tokens[d]) {
      const double margin = boundary_margin(row, s);
      EXPECT_LT(margin, 1e-5) << "draw " << d << " (row " << s.row << ", temperature "
                              << s.temperature << ", top_k " << s.top_k << ", top_p " << s.top_p
                              << "): GPU token " << gpu.tokens[d] << ", CPU " << cpu.tokens[d];
      ++excused;
    }
    const float temperature = s.temperature > 0 ? s.temperature : 1.0f;
    float max_z = 0;
    for (float l : row)
      if (std::isfinite(l)) max_z = std::max(max_z, std::abs(l) / temperature);
    const double tolerance = std::max(1e-5, 4.0 * double(std::nextafter(max_z, INFINITY) - max_z));
    EXPECT_NEAR(gpu.logprobs[d], cpu_logprob(row, gpu.tokens[d], s.temperature), tolerance)
        << "draw " << d;
  }
  std::printf("%d of %zu draws differ from the CPU's within rounding of a boundary\n", excused,
              specs.size());
  EXPECT_LE(excused, int(specs.size() / 100));
}

TEST(SampleGpu, QwenVocabularyRowsMatchTheCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const Tensor logits = logits_rows(151936, {0.1f, 1.0f, 2.0f, 4.0f, 12.0f}, false, 1);
  expect_like_cpu(logits, all_settings(logits.dim(0), 3));
}

TEST(SampleGpu, TiedLogitsMatchTheCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const Tensor logits = logits_rows(20000, {1.0f, 3.0f}, true, 2);
  expect_like_cpu(logits, all_settings(logits.dim(0), 4));
}

// V = 4097: two chunks, the second of one id, and rows that are not 16-byte aligned; V = 5: less
// than one 16-byte load per thread.
TEST(SampleGpu, OddVocabulariesMatchTheCpu) {
  LOCKSTEP_REQUIRE_GPU();
  for (int64_t vocab : {4097, 5, 1}) {
    const Tensor logits = logits_rows(vocab, {0.5f, 2.0f, 6.0f}, false, uint64_t(vocab));
    expect_like_cpu(logits, all_settings(logits.dim(0), 4));
  }
}

TEST(SampleGpu, GreedyIsTheFirstArgmax) {
  LOCKSTEP_REQUIRE_GPU();
  Tensor logits = logits_rows(151936, {1.0f, 1.0f, 1.0f}, false, 3);
  float* p = logits.data_as<float>();
  const int64_t vocab = logits.dim(1);
  p[1 * vocab + 70000] = p[1 * vocab + 90000] = 100.0f;  // a tie: the lower id wins
  p[2 * vocab + vocab - 1] = 100.0f;                      // the last id
  std::vector<SampleSpec> specs(3);
  for (int32_t r = 0; r < 3; ++r) specs[size_t(r)] = {.row = r, .temperature = 0.0f};
  const Drawn gpu = sample_on(Device::cuda, logits, specs);
  for (int64_t r = 0; r < 3; ++r) {
    const float* row = p + r * vocab;
    EXPECT_EQ(gpu.tokens[size_t(r)], int32_t(std::max_element(row, row + vocab) - row));
  }
  EXPECT_EQ(gpu.tokens[1], 70000);
  EXPECT_EQ(gpu.tokens[2], vocab - 1);
}

// Greedy and untruncated draws take the split path (a CTA per 4096-id chunk, then a replay of the
// row's fold over the chunks): tokens as the CPU's (expect_like_cpu), and logprobs with the bits
// of logits_logprob on CUDA, which folds the whole row in one CTA — the replay must reproduce it.
void expect_split_path_like_cpu(const Tensor& logits) {
  std::vector<SampleSpec> specs;
  for (int32_t r = 0; r < int32_t(logits.dim(0)); ++r)
    for (float temperature : {0.0f, 0.6f, 1.0f, 1.7f})
      for (uint64_t p = 0; p < 6; ++p)
        specs.push_back({.seed = 77 + uint64_t(r), .stream = p % 2, .position = 10 + p, .row = r,
                         .temperature = temperature,
                         .top_k = p == 5 ? int32_t(logits.dim(1)) : 0});  // top_k = V: untruncated
  expect_like_cpu(logits, specs);
  const Drawn gpu = sample_on(Device::cuda, logits, specs);
  for (float temperature : {0.0f, 0.6f, 1.0f, 1.7f}) {
    // One logits_logprob call per temperature over the rows the draws read, targets their tokens.
    std::vector<size_t> draws;
    for (size_t d = 0; d < specs.size(); ++d)
      if (specs[d].temperature == temperature) draws.push_back(d);
    const int64_t n = int64_t(draws.size()), vocab = logits.dim(1);
    Tensor picked = Tensor::empty({n, vocab}, DType::f32), target = Tensor::empty({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) {
      const SampleSpec& s = specs[draws[size_t(i)]];
      std::memcpy(picked.data_as<float>() + i * vocab, logits.data_as<float>() + s.row * vocab,
                  size_t(vocab) * 4);
      target.data_as<int32_t>()[i] = gpu.tokens[draws[size_t(i)]];
    }
    Tensor lp = Tensor::empty({n}, DType::f32, Device::cuda);
    Tensor ent = Tensor::empty({n}, DType::f32, Device::cuda);
    logits_logprob(lp, ent, picked.to(Device::cuda), target.to(Device::cuda),
                   temperature > 0 ? temperature : 1.0f);
    const Tensor want = lp.to(Device::cpu);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(float_bits(gpu.logprobs[draws[size_t(i)]]), float_bits(want.data_as<float>()[i]))
          << "draw " << draws[size_t(i)] << " temperature " << temperature;
  }
}

// Vocabularies that are not multiples of the chunk (one of a single chunk, one with a last chunk
// of one id) and Qwen's.
TEST(SampleGpu, SplitPathMatchesTheCpuAndLogitsLogprob) {
  LOCKSTEP_REQUIRE_GPU();
  for (int64_t vocab : {151936, 3 * 4096 + 1, 4095, 2 * 4096 + 17, 37}) {
    const Tensor logits = logits_rows(vocab, {0.3f, 1.0f, 3.0f, 9.0f}, false, 40 + uint64_t(vocab));
    expect_split_path_like_cpu(logits);
  }
}

// −inf logits (masked ids): scattered ones and whole chunks of them, after a first chunk holding
// finite logits (a row whose first chunk is all −inf folds to a NaN sum, on the CPU too).
TEST(SampleGpu, SplitPathWithMinusInfinityLogits) {
  LOCKSTEP_REQUIRE_GPU();
  Tensor logits = logits_rows(5 * 4096 + 100, {1.0f, 4.0f}, false, 50);
  float* p = logits.data_as<float>();
  const int64_t vocab = logits.dim(1);
  for (int64_t v = 0; v < vocab; ++v) {
    if (v % 3 == 1) p[v] = -INFINITY;                                 // row 0: scattered
    if (v >= 4096 && v < 3 * 4096 + 50) p[vocab + v] = -INFINITY;  // row 1: whole chunks
  }
  expect_split_path_like_cpu(logits);
}

// Greedy ties: across a chunk boundary, far apart, and −0 against +0 (equal: the lower id wins).
TEST(SampleGpu, SplitPathGreedyTies) {
  LOCKSTEP_REQUIRE_GPU();
  Tensor logits = logits_rows(151936, {1.0f, 1.0f, 1.0f}, false, 51);
  float* p = logits.data_as<float>();
  const int64_t vocab = logits.dim(1);
  p[4096] = p[4095] = 50.0f;
  p[vocab + 151935] = p[vocab + 8191] = 50.0f;
  for (int64_t v = 0; v < vocab; ++v) p[2 * vocab + v] = -1.0f - std::abs(p[2 * vocab + v]);
  p[2 * vocab + 9000] = -0.0f;
  p[2 * vocab + 100000] = 0.0f;
  std::vector<SampleSpec> specs(3);
  for (int32_t r = 0; r < 3; ++r) specs[size_t(r)] = {.row = r, .temperature = 0.0f};
  const Drawn gpu = sample_on(Device::cuda, logits, specs);
  EXPECT_EQ(gpu.tokens, (std::vector<int32_t>{4095, 8191, 9000}));
  EXPECT_EQ(gpu.tokens, sample_on(Device::cpu, logits, specs).tokens);
}

// A draw's bits depend on its row and spec only: alone, in a batch, or run again.
TEST(SampleGpu, ADrawIsTheSameAloneInABatchAndRunAgain) {
  LOCKSTEP_REQUIRE_GPU();
  const Tensor logits = logits_rows(32768, {1.0f, 3.0f, 0.3f}, false, 4);
  const std::vector<SampleSpec> specs = all_settings(logits.dim(0), 2);
  const Drawn batch = sample_on(Device::cuda, logits, specs);
  const Drawn again = sample_on(Device::cuda, logits, specs);
  EXPECT_EQ(batch.tokens, again.tokens);
  for (size_t d = 0; d < specs.size(); ++d) {
    EXPECT_EQ(float_bits(batch.logprobs[d]), float_bits(again.logprobs[d])) << "draw " << d;
    if (d % 5 != 0) continue;
    const Drawn alone = sample_on(Device::cuda, logits, {specs[d]});
    EXPECT_EQ(alone.tokens[0], batch.tokens[d]) << "draw " << d;
    EXPECT_EQ(float_bits(alone.logprobs[0]), float_bits(batch.logprobs[d])) << "draw " << d;
  }
}

// CUDA specs are not checked on the host: a bad one, or a row with a NaN, gives token −1 and a
// NaN logprob, and the other draws of the call are unaffected.
TEST(SampleGpu, BadSpecsAndNaNRowsGiveMinusOneAndNaN) {
  LOCKSTEP_REQUIRE_GPU();
  Tensor logits = logits_rows(1000, {1.0f, 1.0f}, false, 5);
  logits.data_as<float>()[1000 + 321] = NAN;  // row 1
  std::vector<SampleSpec> specs(8);
  specs[1].row = 2;
  specs[2].row = -1;
  specs[3].temperature = -1.0f;
  specs[4].top_p = 0.0f;
  specs[5].top_k = -3;
  specs[6].row = 1;
  specs[7].row = 1;
  specs[7].temperature = 0.0f;
  const Drawn gpu = sample_on(Device::cuda, logits, specs);
  const Drawn good = sample_on(Device::cpu, logits, {specs[0]});
  EXPECT_EQ(gpu.tokens[0], good.tokens[0]);
  EXPECT_NEAR(gpu.logprobs[0], good.logprobs[0], 1e-5);
  for (size_t d = 1; d < specs.size(); ++d) {
    EXPECT_EQ(gpu.tokens[d], -1) << "draw " << d;
    EXPECT_TRUE(std::isnan(gpu.logprobs[d])) << "draw " << d;
  }
}

// Three bf16 tensors whose blocks take 16-byte copies, and f32 ones of 12-byte blocks (byte
// copies): the same bytes as the CPU's copies. On CUDA only, a pair with dst out of range copies
// nothing and one with src out of range fills its dst with 0xFF.
TEST(BlockCopyGpu, CopiesLikeTheCpuAndGuardsBadPairs) {
  LOCKSTEP_REQUIRE_GPU();
  for (const auto& [shape, dtype] : {std::pair{Shape{10, 4, 2, 8}, DType::bf16},
                                     std::pair{Shape{10, 3}, DType::f32}}) {
    std::vector<Tensor> cpu, gpu;
    for (uint64_t i = 0; i < 3; ++i) {
      cpu.push_back(random_tensor(shape, dtype, 60 + i));
      gpu.push_back(cpu.back().to(Device::cuda));
    }
    const std::vector<int32_t> good = {2, 7, 2, 0, 9, 3, 5, 6};
    Tensor pairs = Tensor::empty({4, 2}, DType::i32);
    std::copy(good.begin(), good.end(), pairs.data_as<int32_t>());
    copy_blocks(cpu, pairs);
    copy_blocks(gpu, pairs.to(Device::cuda));
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(testing::same_bytes(cpu[i], gpu[i])) << i;

    Tensor bad = Tensor::empty({2, 2}, DType::i32);
    const int32_t bad_pairs[4] = {1, 10, 12, 4};  // dst 10 is outside; src 12 is outside
    std::copy(bad_pairs, bad_pairs + 4, bad.data_as<int32_t>());
    copy_blocks(gpu, bad.to(Device::cuda));
    const size_t block = cpu[0].nbytes() / 10;
    for (size_t i = 0; i < 3; ++i) {
      const Tensor back = gpu[i].to(Device::cpu);
      const char* got = static_cast<const char*>(back.data());
      const char* want = static_cast<const char*>(cpu[i].data());
      for (size_t blk = 0; blk < 10; ++blk) {
        if (blk == 4) {
          EXPECT_TRUE(std::all_of(got + 4 * block, got + 5 * block,
                                  [](char c) { return c == char(0xFF); }));
        } else {
          EXPECT_EQ(std::memcmp(got + blk * block, want + blk * block, block), 0) << blk;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lockstep
