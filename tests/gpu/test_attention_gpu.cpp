// The CUDA attention kernels (ops/cuda/attention.cu) against the CPU reference on the same bf16
// inputs, the paged path against the training forward, and what bad index values do on the GPU.
// Training attention is called through the backend directly (own_forward, own_backward):
// ops/attention.cpp may send it to another implementation (cuDNN).
//
// Errors: ‖gpu − cpu‖/‖cpu‖ over the whole output, and the worst single head row judged against
// max(its own norm, the RMS row norm), so one wrong or unwritten row among thousands fails too.
// Each test prints the errors it measured ("[ measured ]") so the tolerances can be tightened.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/attention_backends.h"
#include "ops/kv_fp8.h"
#include "tests/test_util.h"

namespace lockstep {

// Test names and failure messages print layouts as q16_kv8_d128, not as bytes.
std::string layout_name(const HeadLayout& l) {
  std::string name = "q";  // (built by appending: GCC 12 warns falsely on "q" + std::string)
  name += std::to_string(l.q_heads) + "_kv" + std::to_string(l.kv_heads) + "_d" + std::to_string(l.head_dim);
  return name;
}
void PrintTo(const HeadLayout& l, std::ostream* os) { *os << layout_name(l); }

namespace {

using testing::expect_error;
using testing::poisoned;
using testing::poisoned_fp8_cache;
using testing::random_tensor;
using testing::rel_error;
using testing::same_bytes;
using testing::to_double;
using Vec = std::vector<double>;

// bf16 outputs: the GPU rounds P to bf16 before P·V (2^-9 relative per term, averaging out over
// the keys) and both sides round the output once (2^-9), in different summation orders: a few
// 1e-3 overall. A single row may reach about 4 output roundings.
constexpr double kOutTol = 1e-2, kOutRowTol = 5e-2;
// lse is fp32 on both sides (|lse| ≲ 20 here; ex2.approx and summation order: ~1e-5).
constexpr double kLseTol = 1e-3;
// dqkv: additionally dS and P are rounded to bf16 for the dK, dQ and dV products, and dS = P·(dP −
// D) cancels: about twice the forward's error.
constexpr double kGradTol = 2e-2, kGradRowTol = 1e-1;

#if LOCKSTEP_HAS_CUDA
void own_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& cu, const HeadLayout& layout) {
  cuda::attention_forward(out, lse, qkv, cu, layout);
}
void own_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                  const Tensor& cu, const HeadLayout& layout) {
  cuda::attention_backward(dqkv, dout, qkv, out, lse, cu, layout);
}
// attention_paged with the decode rows through decode_exact_kernel (the exact rollout mode).
void exact_paged(Tensor& out, const Tensor& qkv, const PagedKv& cache, const Tensor& tables, const Tensor& cu,
                 const Tensor& lens, const HeadLayout& layout, bool one_row_each) {
  cuda::attention_paged(out, qkv, cache, tables, cu, lens, layout, one_row_each, /*decode_as_prefill=*/true);
}
#else
void exact_paged(Tensor&, const Tensor&, const PagedKv&, const Tensor&, const Tensor&, const Tensor&,
                 const HeadLayout&, bool) {
  fail("no CUDA backend");
}
void own_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, const HeadLayout&) { fail("no CUDA backend"); }
void own_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  const HeadLayout&) {
  fail("no CUDA backend");
}
#endif

// Runs f with up to 8 OpenMP threads: ctest gives each test one, and the CPU reference of the
// larger cases takes seconds on one core. Its results do not depend on the thread count
// (tests/ops/test_attention.cpp checks that).
template <class F>
void on_cores(F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(std::min(8, omp_get_num_procs()));
  f();
  omp_set_num_threads(before);
}

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

std::vector<int32_t> offsets(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu{0};
  for (int32_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// Columns [c0, c0 + width) of every row of a matrix with `cols` columns.
Vec columns(const Vec& m, int64_t cols, int64_t c0, int64_t width) {
  Vec out;
  for (size_t r = 0; r < m.size() / size_t(cols); ++r)
    out.insert(out.end(), m.begin() + long(r * cols + c0), m.begin() + long(r * cols + c0 + width));
  return out;
}

// max over head rows (chunks of head_dim) of ‖out_r − ref_r‖ / max(‖ref_r‖, RMS of ‖ref_r‖): rows
// near zero (dQ of a sequence's first token is 0 in exact arithmetic) are judged against the
// typical row, not against their own rounding noise. NaN anywhere gives NaN.
double worst_row_error(const Vec& out, const Vec& ref, int64_t head_dim) {
  const size_t d = size_t(head_dim), rows = ref.size() / d;
  double total = 0;
  for (double x : ref) total += x * x;
  const double rms = std::sqrt(total / double(rows));
  double worst = 0;
  for (size_t r = 0; r < rows; ++r) {
    double err = 0, norm = 0;
    for (size_t c = r * d; c < (r + 1) * d; ++c) {
      err += (out[c] - ref[c]) * (out[c] - ref[c]);
      norm += ref[c] * ref[c];
    }
    const double e = std::sqrt(err) / std::max(std::sqrt(norm), rms);
    if (std::isnan(e)) return e;
    worst = std::max(worst, e);
  }
  return worst;
}

double max_abs_diff(const Vec& a, const Vec& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::abs(a[i] - b[i]);
    if (std::isnan(e)) return e;
    worst = std::max(worst, e);
  }
  return worst;
}

bool all_nan(const Vec& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isnan(x); });
}
bool all_finite(const Vec& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// Expects out within (rel, row) of ref; prints what was measured.
void expect_close(const Vec& out, const Vec& ref, int64_t head_dim, double rel_tol, double row_tol,
                  const std::string& what) {
  const double rel = rel_error(out, ref), row = worst_row_error(out, ref, head_dim);
  std::printf("[ measured ] %s: rel %.2e, worst row %.2e\n", what.c_str(), rel, row);
  EXPECT_LE(rel, rel_tol) << what;
  EXPECT_LE(row, row_tol) << what;
}

// ---- training forward and backward ---------------------------------------------------------

// MHA and GQA (group 2, 4, 8; 3: SmolLM2-135M's 9 q heads over 3 kv heads), head_dim 64 and 128.
const std::vector<HeadLayout> kLayouts = {{8, 8, 64}, {16, 8, 128}, {32, 8, 128}, {16, 2, 64}, {9, 3, 64}};
const std::vector<int32_t> kLens = {1, 17, 129, 300, 1000};

class AttentionGpu : public ::testing::TestWithParam<HeadLayout> {};

TEST_P(AttentionGpu, ForwardMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const HeadLayout layout = GetParam();
  const Tensor cu = i32_tensor(offsets(kLens));
  const int64_t T = cu.data_as<int32_t>()[kLens.size()];
  const Tensor qkv = random_tensor({T, layout.qkv_width()}, DType::bf16, 1);

  Tensor out = poisoned({T, layout.q_width()}, DType::bf16, Device::cpu);
  Tensor lse = poisoned({T, layout.q_heads}, DType::f32, Device::cpu);
  on_cores([&] { attention_forward(out, lse, qkv, cu, layout); });
  Tensor out_g = poisoned({T, layout.q_width()}, DType::bf16, Device::cuda);
  Tensor lse_g = poisoned({T, layout.q_heads}, DType::f32, Device::cuda);
  own_forward(out_g, lse_g, qkv.to(Device::cuda), cu.to(Device::cuda), layout);

  const std::string name = "forward " + layout_name(layout);
  expect_close(to_double(out_g), to_double(out), layout.head_dim, kOutTol, kOutRowTol, name + " out");
  const double lse_err = max_abs_diff(to_double(lse_g), to_double(lse));
  std::printf("[ measured ] %s lse: max abs %.2e\n", name.c_str(), lse_err);
  EXPECT_LE(lse_err, kLseTol);
}

TEST_P(AttentionGpu, BackwardMatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const HeadLayout layout = GetParam();
  const Tensor cu = i32_tensor(offsets(kLens));
  const int64_t T = cu.data_as<int32_t>()[kLens.size()];
  const Tensor qkv = random_tensor({T, layout.qkv_width()}, DType::bf16, 2);
  const Tensor dout = random_tensor({T, layout.q_width()}, DType::bf16, 3);
  // Both backward passes get the same saved forward results: the CPU's.
  Tensor out = Tensor::empty({T, layout.q_width()}, DType::bf16);
  Tensor lse = Tensor::empty({T, layout.q_heads}, DType::f32);
  Tensor dqkv = poisoned({T, layout.qkv_width()}, DType::bf16, Device::cpu);
  on_cores([&] {
    attention_forward(out, lse, qkv, cu, layout);
    attention_backward(dqkv, dout, qkv, out, lse, cu, layout);
  });
  Tensor dqkv_g = poisoned({T, layout.qkv_width()}, DType::bf16, Device::cuda);
  own_backward(dqkv_g, dout.to(Device::cuda), qkv.to(Device::cuda), out.to(Device::cuda),
               lse.to(Device::cuda), cu.to(Device::cuda), layout);

  const Vec got = to_double(dqkv_g), ref = to_double(dqkv);
  const int64_t width = layout.qkv_width();
  const std::string name = "backward " + layout_name(layout);
  expect_close(columns(got, width, 0, layout.q_width()), columns(ref, width, 0, layout.q_width()),
               layout.head_dim, kGradTol, kGradRowTol, name + " dq");
  expect_close(columns(got, width, layout.k_offset(), layout.kv_width()),
               columns(ref, width, layout.k_offset(), layout.kv_width()), layout.head_dim, kGradTol,
               kGradRowTol, name + " dk");
  expect_close(columns(got, width, layout.v_offset(), layout.kv_width()),
               columns(ref, width, layout.v_offset(), layout.kv_width()), layout.head_dim, kGradTol,
               kGradRowTol, name + " dv");
}

INSTANTIATE_TEST_SUITE_P(Layouts, AttentionGpu, ::testing::ValuesIn(kLayouts),
                         [](const auto& info) { return layout_name(info.param); });

// ---- paged KV cache ------------------------------------------------------------------------

struct PagedSequence {
  int32_t context;  // positions in the cache
  int32_t rows;     // query rows: the last `rows` positions (1: decode, more: a prefill chunk)
};

// A paged batch: caches of random values (unused blocks too: a kernel that reads the wrong block
// reads numbers, not zeros), every sequence's blocks at shuffled places, and block table columns
// past a sequence's blocks set to −1 (a kernel that reads them writes NaN).
// fp8: an e4m3 cache (ops/kv_fp8.h) of random codes (every finite one, subnormals included) and
// random power-of-two scales from 2^-4 to 2^2.
struct PagedBatch {
  std::vector<PagedSequence> seqs;
  int64_t block_size;
  Tensor qkv, k_cache, v_cache, k_scale, v_scale, block_tables, cu_q, context_lens;

  PagedBatch(std::vector<PagedSequence> s, int64_t bs, const HeadLayout& layout, uint64_t seed, bool fp8 = false)
      : seqs(std::move(s)), block_size(bs) {
    std::vector<int32_t> rows, lens;
    int64_t max_blocks = 1, num_blocks = 0;
    for (const PagedSequence& q : seqs) {
      rows.push_back(q.rows);
      lens.push_back(q.context);
      const int64_t b = (q.context + bs - 1) / bs;
      max_blocks = std::max(max_blocks, b + 1);
      num_blocks += b;
    }
    num_blocks += 3;  // never referenced
    std::vector<int32_t> order(static_cast<size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(unsigned(seed)));
    block_tables = Tensor::empty({int64_t(seqs.size()), max_blocks}, DType::i32);
    int32_t* table = block_tables.data_as<int32_t>();
    size_t next = 0;
    for (size_t i = 0; i < seqs.size(); ++i)
      for (int64_t b = 0; b < max_blocks; ++b)
        table[int64_t(i) * max_blocks + b] = b < (seqs[i].context + bs - 1) / bs ? order[next++] : -1;
    const Shape cache{num_blocks, bs, layout.kv_heads, layout.head_dim};
    if (fp8) {
      std::mt19937 rng(unsigned(seed + 1));
      auto codes = [&] {
        Tensor t = Tensor::empty(cache, DType::e4m3);
        for (int64_t i = 0; i < t.numel(); ++i) {
          uint8_t code = uint8_t(rng());
          t.data_as<e4m3>()[i].bits = (code & 0x7f) == 0x7f ? uint8_t(code - 1) : code;  // no NaN
        }
        return t;
      };
      auto scales = [&] {
        Tensor t = Tensor::empty({num_blocks, bs, layout.kv_heads}, DType::f32);
        for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = std::ldexp(1.0f, int(rng() % 7) - 4);
        return t;
      };
      k_cache = codes(), v_cache = codes(), k_scale = scales(), v_scale = scales();
    } else {
      k_cache = random_tensor(cache, DType::bf16, seed + 1);
      v_cache = random_tensor(cache, DType::bf16, seed + 2);
    }
    cu_q = i32_tensor(offsets(rows));
    context_lens = i32_tensor(lens);
    qkv = random_tensor({cu_q.data_as<int32_t>()[seqs.size()], layout.qkv_width()}, DType::bf16, seed + 3);
  }

  int64_t rows() const { return qkv.dim(0); }
  PagedKv cache(Device device) const {
    PagedKv c{k_cache.to(device), v_cache.to(device)};
    if (k_scale.defined()) c.k_scale = k_scale.to(device), c.v_scale = v_scale.to(device);
    return c;
  }

  Tensor run_cpu(const HeadLayout& layout) const {
    Tensor out = poisoned({rows(), layout.q_width()}, DType::bf16, Device::cpu);
    attention_paged(out, qkv, cache(Device::cpu), block_tables, cu_q, context_lens, layout);
    return out;
  }
  // exact: the decode rows through decode_exact_kernel (exact_paged).
  Tensor run_gpu(const HeadLayout& layout, bool one_row_each = false, bool exact = false) const {
    Tensor out = poisoned({rows(), layout.q_width()}, DType::bf16, Device::cuda);
    if (exact)
      exact_paged(out, qkv.to(Device::cuda), cache(Device::cuda), block_tables.to(Device::cuda), cu_q.to(Device::cuda),
                  context_lens.to(Device::cuda), layout, one_row_each);
    else
      attention_paged(out, qkv.to(Device::cuda), cache(Device::cuda), block_tables.to(Device::cuda),
                      cu_q.to(Device::cuda), context_lens.to(Device::cuda), layout, one_row_each);
    return out;
  }
};

struct PagedCase {
  std::string name;
  HeadLayout layout;
  int64_t block_size;
  std::vector<PagedSequence> seqs;
};

std::vector<PagedCase> paged_cases() {
  // 80 decode rows: S · kv_heads ≥ 4 × the SM count of an H100/H200, so contexts are not split.
  std::vector<PagedSequence> many;
  std::mt19937 rng(7);
  for (int i = 0; i < 80; ++i) many.push_back({int32_t(1 + rng() % 600), 1});
  // Batch 64 at ~1K contexts (the rollout benchmark's shape): more CTAs than the GPU holds at once,
  // each context split over a cluster.
  std::vector<PagedSequence> batch64;
  for (int i = 0; i < 64; ++i) batch64.push_back({int32_t(700 + rng() % 700), 1});
  return {
      // Decode rows (long, short, one position), prefill chunks, a whole prompt, no rows.
      {"mixed_q32_kv8_d128_bs16", {32, 8, 128}, 16, {{5000, 1}, {1, 1}, {700, 1}, {300, 37}, {129, 129}, {2000, 0}, {65, 64}}},
      // Batch 1 at a long context: split over many partitions, merged in its cluster.
      {"long_decode_q16_kv8_d128_bs32", {16, 8, 128}, 32, {{4999, 1}}},
      {"mixed_q8_kv8_d64_bs16", {8, 8, 64}, 16, {{3000, 1}, {64, 1}, {200, 65}, {17, 17}, {1000, 2}}},
      // 16 q heads per kv head: the decode kernel's whole 16-row tile.
      {"mixed_q16_kv1_d64_bs32", {16, 1, 64}, 32, {{2500, 1}, {33, 1}, {100, 31}, {40, 40}}},
      {"many_decode_q16_kv8_d128_bs16", {16, 8, 128}, 16, many},
      {"batch64_decode_q32_kv8_d128_bs16", {32, 8, 128}, 16, batch64},
      // A block size that is not a power of two (the decode kernel divides instead of shifting).
      {"decode_q32_kv8_d128_bs24", {32, 8, 128}, 24, {{3001, 1}, {50, 1}, {777, 1}, {24, 1}}},
      // Batch 1 and 2 at the rollout benchmark's contexts: each context split over a cluster of 8
      // partitions of 1–3 tiles, a partition's tile 0 read before the early-start wait when it holds
      // no row of this step; a block size that is not a power of two.
      {"batch1_decode_q32_kv8_d128_bs16", {32, 8, 128}, 16, {{700, 1}}},
      {"batch2_decode_q32_kv8_d128_bs16", {32, 8, 128}, 16, {{1500, 1}, {1100, 1}}},
      {"batch1_decode_q32_kv8_d128_bs24", {32, 8, 128}, 24, {{1000, 1}}},
      // SmolLM2-135M's heads: 9 q heads over 3 kv heads of 64 (a group of 3, an output row of 576,
      // a partial fp8 128-group), decode and prefill, batch 1, 64 and 80.
      {"mixed_q9_kv3_d64_bs16", {9, 3, 64}, 16, {{3000, 1}, {64, 1}, {200, 65}, {17, 17}, {1000, 2}, {129, 129}}},
      {"batch1_decode_q9_kv3_d64_bs16", {9, 3, 64}, 16, {{700, 1}}},
      {"batch64_decode_q9_kv3_d64_bs16", {9, 3, 64}, 16, batch64},
      {"many_decode_q9_kv3_d64_bs32", {9, 3, 64}, 32, many},
  };
}

void PrintTo(const PagedCase& c, std::ostream* os) { *os << c.name; }

class PagedGpu : public ::testing::TestWithParam<PagedCase> {};

TEST_P(PagedGpu, MatchesCpu) {
  LOCKSTEP_REQUIRE_GPU();
  const PagedCase& c = GetParam();
  const PagedBatch batch(c.seqs, c.block_size, c.layout, 11);
  expect_close(to_double(batch.run_gpu(c.layout)), to_double(batch.run_cpu(c.layout)), c.layout.head_dim,
               kOutTol, kOutRowTol, "paged " + c.name);
}

// From an e4m3 cache: the decode kernel converts the codes and scales scores and probabilities,
// the prefill kernel dequantizes on load; the CPU dequantizes to bf16 first.
TEST_P(PagedGpu, MatchesCpuFromAnFp8Cache) {
  LOCKSTEP_REQUIRE_GPU();
  const PagedCase& c = GetParam();
  const PagedBatch batch(c.seqs, c.block_size, c.layout, 16, /*fp8=*/true);
  expect_close(to_double(batch.run_gpu(c.layout)), to_double(batch.run_cpu(c.layout)), c.layout.head_dim,
               kOutTol, kOutRowTol, "paged fp8 cache " + c.name);
}

INSTANTIATE_TEST_SUITE_P(Batches, PagedGpu, ::testing::ValuesIn(paged_cases()),
                         [](const auto& info) { return info.param.name; });

// A decode step told one_row_each (the multi-row kernel skipped) gives the bits of the general
// call, at batch 1 (split context, merged in a cluster), 64 (split in two on an H100/H200) and
// 80 sequences (unsplit).
TEST(PagedGpu, OneRowEachGivesTheSameBits) {
  LOCKSTEP_REQUIRE_GPU();
  for (const PagedCase& c : paged_cases()) {
    if (!std::all_of(c.seqs.begin(), c.seqs.end(), [](const PagedSequence& q) { return q.rows == 1; }))
      continue;
    for (const bool fp8 : {false, true}) {
      const PagedBatch batch(c.seqs, c.block_size, c.layout, 12, fp8);
      EXPECT_TRUE(same_bytes(batch.run_gpu(c.layout, true), batch.run_gpu(c.layout, false)))
          << c.name << (fp8 ? " fp8 cache" : "");
    }
  }
  // Under the promise, sequences 1 and 2 with offsets (1, 1) and (1, 3) make rows 1 and 2 NaN.
  const HeadLayout layout{16, 8, 128};
  PagedBatch batch({{300, 1}, {40, 1}, {900, 1}}, 16, layout, 13);
  batch.cu_q = i32_tensor({0, 1, 1, 3});
  const Vec out = to_double(batch.run_gpu(layout, true));
  const int64_t w = layout.q_width();
  EXPECT_TRUE(all_nan(Vec(out.begin() + w, out.end())));
  EXPECT_TRUE(all_finite(Vec(out.begin(), out.begin() + w)));
}

// attention_paged_fp8 gives the bytes and scales of attention_paged followed by quantize_rows, in
// both scale formats: fused into the decode kernel for decode steps (one_row_each; with the NaN rows
// of malformed offsets too), attention_paged + quantize_rows for the mixed batches.
TEST(PagedGpu, Fp8OutputIsTheQuantizedOutput) {
  LOCKSTEP_REQUIRE_GPU();
  const auto check = [](const PagedBatch& batch, const HeadLayout& layout, bool one_row_each, const std::string& name) {
    const Tensor expected_bf16 = batch.run_gpu(layout, one_row_each);
    for (const ScaleFormat format : {ScaleFormat::fp32, ScaleFormat::pow2}) {
      Fp8Rows expected = Fp8Rows::empty(batch.rows(), layout.q_width(), Device::cuda);
      quantize_rows(expected, expected_bf16, format);
      Fp8Rows got = Fp8Rows::empty(batch.rows(), layout.q_width(), Device::cuda);
      attention_paged_fp8(got, batch.qkv.to(Device::cuda), batch.cache(Device::cuda), batch.block_tables.to(Device::cuda),
                          batch.cu_q.to(Device::cuda), batch.context_lens.to(Device::cuda), layout, one_row_each,
                          format);
      const std::string what = name + (format == ScaleFormat::pow2 ? " pow2" : " fp32");
      EXPECT_TRUE(same_bytes(got.data, expected.data)) << what;
      EXPECT_TRUE(same_bytes(got.scales, expected.scales)) << what;
    }
  };
  for (const PagedCase& c : paged_cases()) {
    const bool one_row_each =
        std::all_of(c.seqs.begin(), c.seqs.end(), [](const PagedSequence& q) { return q.rows == 1; });
    check(PagedBatch(c.seqs, c.block_size, c.layout, 14), c.layout, one_row_each, c.name);
    check(PagedBatch(c.seqs, c.block_size, c.layout, 14, true), c.layout, one_row_each, c.name + " fp8 cache");
  }
  const HeadLayout layout{16, 8, 128};
  PagedBatch batch({{300, 1}, {40, 1}, {900, 1}}, 16, layout, 15);
  batch.cu_q = i32_tensor({0, 1, 1, 3});
  check(batch, layout, true, "malformed offsets");
}

bool same_cache_bytes(const PagedKv& a, const PagedKv& b) {
  return same_bytes(a.k, b.k) && same_bytes(a.v, b.v) && same_bytes(a.k_scale, b.k_scale) &&
         same_bytes(a.v_scale, b.v_scale);
}

TEST(KvCacheWriteGpu, Fp8CacheSameBytesAndScalesAsCpu) {
  LOCKSTEP_REQUIRE_GPU();
  for (const auto& [layout, bs] : std::vector<std::pair<HeadLayout, int64_t>>{{{16, 8, 128}, 16}, {{8, 2, 64}, 32}}) {
    const int64_t T = 300, num_blocks = 40;
    const Tensor qkv = random_tensor({T, layout.qkv_width()}, DType::bf16, 5, /*varied_rows=*/true);
    std::vector<int32_t> slots(size_t(num_blocks * bs));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(9));
    slots.resize(size_t(T));
    slots[7] = -1;  // skipped by the GPU; the CPU checks slots, so its reference leaves row 7 out
    const Tensor s = i32_tensor(slots);
    PagedKv cpu = poisoned_fp8_cache(layout, num_blocks, bs, Device::cpu);
    PagedKv gpu = poisoned_fp8_cache(layout, num_blocks, bs, Device::cuda);
    std::vector<int64_t> kept;
    for (int64_t t = 0; t < T; ++t)
      if (t != 7) kept.push_back(t);
    Tensor qkv_kept = Tensor::empty({T - 1, layout.qkv_width()}, DType::bf16);
    std::vector<int32_t> slots_kept;
    for (size_t i = 0; i < kept.size(); ++i) {
      qkv_kept.rows(int64_t(i), int64_t(i) + 1).copy_from(qkv.rows(kept[i], kept[i] + 1));
      slots_kept.push_back(slots[size_t(kept[i])]);
    }
    kv_cache_write(cpu, qkv_kept, i32_tensor(slots_kept), layout);
    kv_cache_write(gpu, qkv.to(Device::cuda), s.to(Device::cuda), layout);
    EXPECT_TRUE(same_cache_bytes(gpu, cpu)) << layout_name(layout);
  }
}

TEST(RoundKvToFp8Gpu, SameBitsAsCpu) {
  LOCKSTEP_REQUIRE_GPU();
  for (const HeadLayout layout : {HeadLayout{16, 8, 128}, HeadLayout{8, 2, 64}}) {
    Tensor qkv = random_tensor({257, layout.qkv_width()}, DType::bf16, 8, /*varied_rows=*/true);
    Tensor gpu = qkv.to(Device::cuda);
    round_kv_to_fp8(qkv, layout);
    round_kv_to_fp8(gpu, layout);
    EXPECT_TRUE(same_bytes(gpu, qkv)) << layout_name(layout);
  }
}

TEST(KvCacheWriteGpu, SameBytesAsCpu) {
  LOCKSTEP_REQUIRE_GPU();
  for (const auto& [layout, bs] : std::vector<std::pair<HeadLayout, int64_t>>{{{16, 8, 128}, 16}, {{8, 2, 64}, 32}}) {
    const int64_t T = 300, num_blocks = 40;
    const Tensor qkv = random_tensor({T, layout.qkv_width()}, DType::bf16, 5);
    std::vector<int32_t> slots(size_t(num_blocks * bs));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(9));
    slots.resize(size_t(T));
    const Tensor s = i32_tensor(slots);
    const Shape cache{num_blocks, bs, layout.kv_heads, layout.head_dim};
    // Poisoned alike: the untouched slots must stay as they were on both.
    Tensor k = poisoned(cache, DType::bf16, Device::cpu), v = poisoned(cache, DType::bf16, Device::cpu);
    Tensor kg = poisoned(cache, DType::bf16, Device::cuda), vg = poisoned(cache, DType::bf16, Device::cuda);
    kv_cache_write({k, v}, qkv, s, layout);
    kv_cache_write({kg, vg}, qkv.to(Device::cuda), s.to(Device::cuda), layout);
    EXPECT_TRUE(same_bytes(kg, k)) << layout_name(layout);
    EXPECT_TRUE(same_bytes(vg, v)) << layout_name(layout);
  }
}

// The rollout's view of a sequence equals the trainer's: k/v written to the cache by kv_cache_write
// from the same qkv, then attention_paged over the cache. Prefill rows (whole prompts and chunks)
// run the training forward's kernel, whose arithmetic for a row does not depend on where the row's
// 64-row tile starts (keys are tiled from 0, fully masked tiles leave the running sums unchanged),
// so they must be bit-identical. Decode rows run the flash-decoding kernel (another summation
// order): within tolerance — or, in the exact mode, decode_exact_kernel (fwd_kernel's order, the
// group's heads as rows of one MMA tile): bit-identical too, also as a decode batch (one_row_each).
// With an e4m3 cache the training forward runs on round_kv_to_fp8 of the same qkv (ops/kv_fp8.h).
// Groups of 2, 4 (Qwen3-8B) and 8 q heads a kv head; contexts of 1 to 1000 keys.
TEST(PagedGpu, EqualsTheTrainingForward) {
  LOCKSTEP_REQUIRE_GPU();
  for (const bool exact : {false, true})
  for (const bool fp8 : {false, true})
  for (const HeadLayout layout : {HeadLayout{16, 8, 128}, HeadLayout{8, 4, 64}, HeadLayout{32, 8, 128},
                                  HeadLayout{16, 2, 64}}) {
    SCOPED_TRACE(fp8 ? "fp8 cache" : "bf16 cache");
    SCOPED_TRACE(exact ? "exact decode" : "split decode");
    const int64_t bs = 16;
    const std::vector<int32_t> cu = offsets(kLens);
    const int64_t T = cu.back(), S = int64_t(kLens.size());
    const Tensor qkv = random_tensor({T, layout.qkv_width()}, DType::bf16, 21).to(Device::cuda);
    Tensor train_qkv = qkv.to(Device::cuda);
    if (fp8) round_kv_to_fp8(train_qkv, layout);
    Tensor out = poisoned({T, layout.q_width()}, DType::bf16, Device::cuda);
    Tensor lse = poisoned({T, layout.q_heads}, DType::f32, Device::cuda);
    own_forward(out, lse, train_qkv, i32_tensor(cu).to(Device::cuda), layout);
    const Vec train = to_double(out);

    // Shuffled blocks; every position's slot from the block table.
    int64_t max_blocks = 0, num_blocks = 0;
    for (int32_t n : kLens) max_blocks = std::max<int64_t>(max_blocks, (n + bs - 1) / bs);
    num_blocks = S * max_blocks;
    std::vector<int32_t> order(static_cast<size_t>(num_blocks)), slots;
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(3));
    Tensor tables = i32_tensor(order).reshape({S, max_blocks});
    for (int64_t s = 0; s < S; ++s)
      for (int32_t p = 0; p < kLens[size_t(s)]; ++p)
        slots.push_back(int32_t(order[size_t(s * max_blocks + p / bs)] * bs + p % bs));
    const Shape shape{num_blocks, bs, layout.kv_heads, layout.head_dim};
    const PagedKv cache = fp8 ? poisoned_fp8_cache(layout, num_blocks, bs, Device::cuda)
                              : PagedKv{poisoned(shape, DType::bf16, Device::cuda), poisoned(shape, DType::bf16, Device::cuda)};
    kv_cache_write(cache, qkv, i32_tensor(slots).to(Device::cuda), layout);
    const Tensor tables_g = tables.to(Device::cuda), lens_g = i32_tensor(kLens).to(Device::cuda);

    // Query rows: the last `chunk` positions of every sequence (all of them for chunk ≥ length).
    for (int32_t chunk : {1, 50, 1 << 20}) {
      std::vector<int32_t> rows, picked;
      for (size_t s = 0; s < kLens.size(); ++s) {
        rows.push_back(std::min(chunk, kLens[s]));
        for (int32_t i = kLens[s] - rows.back(); i < kLens[s]; ++i) picked.push_back(cu[s] + i);
      }
      Tensor q = Tensor::empty({int64_t(picked.size()), layout.qkv_width()}, DType::bf16, Device::cuda);
      for (size_t i = 0; i < picked.size(); ++i) q.rows(int64_t(i), int64_t(i) + 1).copy_from(qkv.rows(picked[i], picked[i] + 1));
      Tensor paged = poisoned({q.dim(0), layout.q_width()}, DType::bf16, Device::cuda);
      const Tensor cu_q = i32_tensor(offsets(rows)).to(Device::cuda);
      if (exact) exact_paged(paged, q, cache, tables_g, cu_q, lens_g, layout, false);
      else attention_paged(paged, q, cache, tables_g, cu_q, lens_g, layout);
      if (exact && chunk == 1) {  // a decode batch: the same bits
        Tensor batch = poisoned({q.dim(0), layout.q_width()}, DType::bf16, Device::cuda);
        exact_paged(batch, q, cache, tables_g, cu_q, lens_g, layout, true);
        EXPECT_TRUE(same_bytes(batch, paged)) << layout_name(layout) << ": one_row_each";
      }

      const Vec got = to_double(paged);
      const int64_t w = layout.q_width();
      Vec decode_got, decode_ref;
      int differing = 0;
      size_t i = 0;
      for (size_t s = 0; s < kLens.size(); ++s)
        for (int32_t r = 0; r < rows[s]; ++r, ++i) {
          const Vec a(got.begin() + long(i * w), got.begin() + long((i + 1) * w));
          const Vec b(train.begin() + long(picked[i] * w), train.begin() + long((picked[i] + 1) * w));
          if (rows[s] == 1 && !exact) {
            decode_got.insert(decode_got.end(), a.begin(), a.end());
            decode_ref.insert(decode_ref.end(), b.begin(), b.end());
          } else if (a != b && differing++ == 0) {
            ADD_FAILURE() << layout_name(layout) << (rows[s] == 1 ? ": decode row " : ": prefill row ") << r
                          << " of sequence " << s << " (chunk " << chunk << ") differs from the training forward's; rel " << rel_error(a, b);
          }
        }
      EXPECT_EQ(differing, 0) << "rows that differ from the training forward's";
      if (!exact)
        expect_close(decode_got, decode_ref, layout.head_dim, kOutTol, kOutRowTol,
                   "decode rows vs training forward " + layout_name(layout) + " chunk " + std::to_string(chunk));
    }
  }
}

// ---- bad index values: no access outside a tensor, NaN in the affected outputs -------------

TEST(AttentionGpuBadIndices, MalformedCuSeqlensGivesNaN) {
  LOCKSTEP_REQUIRE_GPU();
  const HeadLayout layout{8, 4, 64};
  const int64_t T = 40;
  const Tensor qkv = random_tensor({T, layout.qkv_width()}, DType::bf16, 4).to(Device::cuda);
  for (const std::vector<int32_t>& cu : {std::vector<int32_t>{0, 30, 20, 40}, {0, 10, 50}, {5, 20, 40}, {0, 20, 39}}) {
    const Tensor cu_g = i32_tensor(cu).to(Device::cuda);
    // Outputs start as zeros here: NaN must come from the op.
    Tensor out = Tensor::zeros({T, layout.q_width()}, DType::bf16, Device::cuda);
    Tensor lse = Tensor::zeros({T, layout.q_heads}, DType::f32, Device::cuda);
    own_forward(out, lse, qkv, cu_g, layout);
    EXPECT_TRUE(all_nan(to_double(out))) << "forward out, cu_seqlens " << ::testing::PrintToString(cu);
    EXPECT_TRUE(all_nan(to_double(lse))) << "forward lse";

    Tensor dqkv = Tensor::zeros({T, layout.qkv_width()}, DType::bf16, Device::cuda);
    const Tensor dout = random_tensor({T, layout.q_width()}, DType::bf16, 5).to(Device::cuda);
    const Tensor lse_ok = Tensor::zeros({T, layout.q_heads}, DType::f32, Device::cuda);
    own_backward(dqkv, dout, qkv, dout, lse_ok, cu_g, layout);
    EXPECT_TRUE(all_nan(to_double(dqkv))) << "backward dqkv";

    Tensor paged = Tensor::zeros({T, layout.q_width()}, DType::bf16, Device::cuda);
    const Shape cache{4, 16, layout.kv_heads, layout.head_dim};
    const Tensor kc = Tensor::zeros(cache, DType::bf16, Device::cuda), vc = Tensor::zeros(cache, DType::bf16, Device::cuda);
    const int64_t S = int64_t(cu.size()) - 1;
    attention_paged(paged, qkv, {kc, vc}, Tensor::zeros({S, 4}, DType::i32, Device::cuda), cu_g,
                    i32_tensor(std::vector<int32_t>(size_t(S), 64)).to(Device::cuda), layout);
    EXPECT_TRUE(all_nan(to_double(paged))) << "paged out";
  }
  device_synchronize();  // no sticky error from an access out of bounds
}

TEST(AttentionGpuBadIndices, PagedBadBlockOrLengthGivesNaNRows) {
  LOCKSTEP_REQUIRE_GPU();
  const HeadLayout layout{16, 8, 128};
  // Sequences 1 and 3 get a block id outside the cache, sequence 2 a context longer than its block
  // table row holds; sequences 0 and 4 are good. Decode rows (1) and prefill chunks (2, 3) both.
  PagedBatch batch({{300, 1}, {300, 1}, {100, 20}, {200, 20}, {90, 3}}, 16, layout, 31);
  PagedBatch good({{300, 1}, {90, 3}}, 16, layout, 31);
  const int64_t max_blocks = batch.block_tables.dim(1), num_blocks = batch.k_cache.dim(0);
  batch.block_tables.data_as<int32_t>()[1 * max_blocks + 5] = int32_t(num_blocks);
  batch.block_tables.data_as<int32_t>()[3 * max_blocks + 0] = -7;
  batch.context_lens.data_as<int32_t>()[2] = int32_t(max_blocks * 16 + 1);
  // The good sequences read the same cache blocks in both batches (the bad ones' blocks and rows
  // sit between them: the good rows must not be touched).
  good.k_cache = batch.k_cache;
  good.v_cache = batch.v_cache;
  for (int64_t b = 0; b < good.block_tables.dim(1); ++b) {
    good.block_tables.data_as<int32_t>()[b] = batch.block_tables.data_as<int32_t>()[0 * max_blocks + b];
    good.block_tables.data_as<int32_t>()[good.block_tables.dim(1) + b] = batch.block_tables.data_as<int32_t>()[4 * max_blocks + b];
  }
  good.qkv.rows(0, 1).copy_from(batch.qkv.rows(0, 1));
  good.qkv.rows(1, 4).copy_from(batch.qkv.rows(42, 45));

  for (const bool exact : {false, true}) {
    SCOPED_TRACE(exact ? "exact decode" : "split decode");
    const Vec out = to_double(batch.run_gpu(layout, false, exact)), ref = to_double(good.run_gpu(layout, false, exact));
    const int64_t w = layout.q_width();
    auto rows = [&](const Vec& v, int64_t r0, int64_t r1) { return Vec(v.begin() + long(r0 * w), v.begin() + long(r1 * w)); };
    // Prefill rows are bit-identical whatever the batch; the split decode row's partitions depend on
    // the batch size (within tolerance), the exact one's do not.
    EXPECT_TRUE(rows(out, 42, 45) == rows(ref, 1, 4)) << "good prefill rows";
    if (exact) EXPECT_TRUE(rows(out, 0, 1) == rows(ref, 0, 1)) << "good decode row";
    else expect_close(rows(out, 0, 1), rows(ref, 0, 1), layout.head_dim, kOutTol, kOutRowTol, "good decode row");
    EXPECT_TRUE(all_finite(rows(ref, 0, 4)));
    EXPECT_TRUE(all_nan(rows(out, 1, 2))) << "decode row with a bad block id";
    EXPECT_TRUE(all_nan(rows(out, 2, 22))) << "prefill rows with a context past the block table";
    EXPECT_TRUE(all_nan(rows(out, 22, 42))) << "prefill rows with a bad block id";
  }
  device_synchronize();
}

// Batch 1: a bad block id in a tile the decode kernel requests before the early-start wait (block
// 2: partition 0's tile 0), or in the block of the last row (partition 5's only tile; the row itself
// is read after the wait), makes the row NaN; from a bf16 and from an e4m3 cache.
TEST(AttentionGpuBadIndices, Batch1DecodeBadBlockGivesNaN) {
  LOCKSTEP_REQUIRE_GPU();
  const HeadLayout layout{32, 8, 128};
  for (const bool fp8 : {false, true})
    for (const int64_t block : {int64_t(2), int64_t(699 / 16)}) {
      PagedBatch batch({{700, 1}}, 16, layout, 32, fp8);
      EXPECT_TRUE(all_finite(to_double(batch.run_gpu(layout, true))));
      batch.block_tables.data_as<int32_t>()[block] = int32_t(batch.k_cache.dim(0));
      EXPECT_TRUE(all_nan(to_double(batch.run_gpu(layout, true)))) << "bad block " << block << (fp8 ? " fp8" : "");
    }
  device_synchronize();
}

TEST(AttentionGpuBadIndices, KvCacheWriteSkipsSlotsOutsideTheCache) {
  LOCKSTEP_REQUIRE_GPU();
  const HeadLayout layout{8, 2, 64};
  const Shape cache{4, 16, layout.kv_heads, layout.head_dim};
  const Tensor qkv = random_tensor({4, layout.qkv_width()}, DType::bf16, 6);
  Tensor k = poisoned(cache, DType::bf16, Device::cuda), v = poisoned(cache, DType::bf16, Device::cuda);
  kv_cache_write({k, v}, qkv.to(Device::cuda), i32_tensor({3, -1, 64, 10}).to(Device::cuda), layout);
  Tensor kc = poisoned(cache, DType::bf16, Device::cpu), vc = poisoned(cache, DType::bf16, Device::cpu);
  Tensor good = Tensor::empty({2, layout.qkv_width()}, DType::bf16);
  good.rows(0, 1).copy_from(qkv.rows(0, 1));
  good.rows(1, 2).copy_from(qkv.rows(3, 4));
  kv_cache_write({kc, vc}, good, i32_tensor({3, 10}), layout);
  EXPECT_TRUE(same_bytes(k, kc));
  EXPECT_TRUE(same_bytes(v, vc));
  device_synchronize();
}

// ---- argument checks of the CUDA path --------------------------------------------------------

// Through attention_paged, which only these kernels serve (training attention may go to cuDNN).
TEST(AttentionGpuArguments, UnsupportedShapesAndDtypes) {
  LOCKSTEP_REQUIRE_GPU();
  auto paged = [](const HeadLayout& l, DType dtype) {
    Tensor out = Tensor::empty({1, l.q_width()}, dtype, Device::cuda);
    const Tensor cache = Tensor::empty({2, 16, l.kv_heads, l.head_dim}, dtype, Device::cuda);
    attention_paged(out, Tensor::empty({1, l.qkv_width()}, dtype, Device::cuda), {cache, cache},
                    Tensor::zeros({1, 2}, DType::i32, Device::cuda), i32_tensor({0, 1}).to(Device::cuda),
                    i32_tensor({1}).to(Device::cuda), l);
  };
  expect_error([&] { paged({4, 2, 64}, DType::f32); }, "bf16");
  expect_error([&] { paged({4, 2, 96}, DType::bf16); }, "head_dim");
  expect_error([&] { paged({32, 1, 64}, DType::bf16); }, "16 q heads per kv head");
}

}  // namespace
}  // namespace lockstep
