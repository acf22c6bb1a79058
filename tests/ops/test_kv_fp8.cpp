// The fp8 KV cache's numbers (ops/kv_fp8.h) against a brute-force reference, and the agreement the
// rollout needs: what kv_cache_write stores into an e4m3 cache reads back as exactly the values
// round_kv_to_fp8 gives the training forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtypes.h"
#include "ops/attention.h"
#include "ops/kv_fp8.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::poisoned_fp8_cache;
using testing::random_tensor;
using testing::same_bytes;

float value_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f32 ? t.data_as<float>()[i] : bf16_to_float(t.data_as<bf16>()[i]);
}
void set_value(Tensor& t, int64_t i, float x) {
  if (t.dtype() == DType::f32) t.data_as<float>()[i] = x;
  else t.data_as<bf16>()[i] = float_to_bf16(x);
}

// The nearest of the e4m3 grid (every finite code, by value) times scale to x, ties to the even
// code; computed in double.
double nearest_on_grid(double x, double scale) {
  double best = 0, best_distance = std::numeric_limits<double>::infinity();
  int best_code = 0;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    const double v = double(e4m3_to_float(e4m3{uint8_t(code)})) * scale, d = std::abs(v - x);
    if (d < best_distance || (d == best_distance && code % 2 == 0 && best_code % 2 == 1)) {
      best = v, best_distance = d, best_code = code;
    }
  }
  return best;
}

// qkv rows whose heads include an all-zero head, a head of tiny values next to a large one (e4m3
// subnormals), one with a NaN, and heads of very different magnitudes.
Tensor test_qkv(const HeadLayout& l, int64_t T, DType dtype) {
  Tensor qkv = random_tensor({T, l.qkv_width()}, dtype, 71, /*varied_rows=*/true);
  const int64_t d = l.head_dim, k0 = l.k_offset();
  for (int64_t c = 0; c < d; ++c) set_value(qkv, 0 * l.qkv_width() + k0 + c, 0.0f);         // row 0, k head 0
  for (int64_t c = 1; c < d; ++c) set_value(qkv, 1 * l.qkv_width() + k0 + c, 1e-4f * float(c % 7));  // row 1
  set_value(qkv, 1 * l.qkv_width() + k0, 3.0f);
  set_value(qkv, 2 * l.qkv_width() + l.v_offset() + 5, std::nanf(""));  // row 2, v head 0
  return qkv;
}

TEST(RoundKvToFp8, ValuesAreTheNearestOnAPowerOfTwoGrid) {
  const HeadLayout l{4, 2, 64};
  const int64_t T = 6, d = l.head_dim, W = l.qkv_width();
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor qkv = test_qkv(l, T, dtype);
    Tensor rounded = qkv.to(Device::cpu);
    round_kv_to_fp8(rounded, l);
    int subnormals = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < l.q_width(); ++c)  // the q heads are untouched
        ASSERT_EQ(float_bits(value_at(rounded, t * W + c)), float_bits(value_at(qkv, t * W + c)));
      for (int64_t h = 0; h < 2 * l.kv_heads; ++h) {
        const int64_t base = t * W + l.k_offset() + h * d;
        double amax = 0;
        bool nan = false;
        for (int64_t c = 0; c < d; ++c) {
          const double x = value_at(qkv, base + c);
          nan |= std::isnan(x);
          amax = std::max(amax, std::abs(x));
        }
        // The smallest power of two ≥ amax / 448 (and 1 for a zero head).
        const double scale = amax == 0 ? 1.0 : std::exp2(std::ceil(std::log2(amax / 448.0)));
        for (int64_t c = 0; c < d; ++c) {
          const double x = value_at(qkv, base + c), got = value_at(rounded, base + c);
          if (nan) {
            EXPECT_TRUE(std::isnan(got)) << "row " << t << " head " << h;
            continue;
          }
          const double want = nearest_on_grid(x, scale);
          subnormals += std::abs(want) > 0 && std::abs(want) < scale * std::exp2(-6);
          ASSERT_EQ(got, want) << "row " << t << " head " << h << " column " << c << ": x = " << x;
        }
      }
    }
    EXPECT_GT(subnormals, 0);  // the tiny head reached e4m3's subnormal codes
  }
}

TEST(KvCacheWrite, AnFp8CacheReadsBackAsTheRoundedValues) {
  const HeadLayout l{4, 2, 64};
  const int64_t T = 6, d = l.head_dim, W = l.qkv_width();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor qkv = test_qkv(l, T, dtype);
    Tensor rounded = qkv.to(Device::cpu);
    round_kv_to_fp8(rounded, l);
    PagedKv cache = poisoned_fp8_cache(l, 3, 4);
    const std::vector<int32_t> slots{5, 0, 11, 2, 7, 3};
    Tensor slot_tensor = Tensor::empty({T}, DType::i32);
    std::memcpy(slot_tensor.data(), slots.data(), sizeof(int32_t) * slots.size());
    kv_cache_write(cache, qkv, slot_tensor, l);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < 2 * l.kv_heads; ++h) {
        const bool is_v = h >= l.kv_heads;
        const int64_t g = h % l.kv_heads, head = slots[size_t(t)] * l.kv_heads + g;
        const float scale = (is_v ? cache.v_scale : cache.k_scale).data_as<float>()[head];
        const e4m3* q = (is_v ? cache.v : cache.k).data_as<e4m3>() + head * d;
        for (int64_t c = 0; c < d; ++c) {
          float value = e4m3_to_float(q[c]) * scale;
          if (dtype == DType::bf16) value = round_to_bf16(value);
          const float want = value_at(rounded, t * W + l.k_offset() + h * d + c);
          ASSERT_EQ(float_bits(value), float_bits(want)) << "row " << t << " head " << h << " column " << c;
        }
      }
    // Slots nobody wrote keep their bytes.
    EXPECT_EQ(cache.k.data_as<e4m3>()[1 * l.kv_heads * d].bits, 0xff);
    EXPECT_TRUE(std::isnan(cache.k_scale.data_as<float>()[1 * l.kv_heads]));
  }
}

TEST(KvCacheWrite, AnFp8CacheNeedsItsScales) {
  const HeadLayout l{4, 2, 64};
  const Tensor qkv = random_tensor({1, l.qkv_width()}, DType::bf16, 3);
  Tensor slot = Tensor::empty({1}, DType::i32);
  slot.data_as<int32_t>()[0] = 0;
  PagedKv cache = poisoned_fp8_cache(l, 2, 4);
  PagedKv no_scales = cache;
  no_scales.v_scale = Tensor();
  expect_error([&] { kv_cache_write(no_scales, qkv, slot, l); }, {"kv_cache_write", "v_scale"});
  PagedKv bad_scales = cache;
  bad_scales.k_scale = Tensor::empty({2, 4, l.kv_heads, 1}, DType::f32);
  expect_error([&] { kv_cache_write(bad_scales, qkv, slot, l); }, {"kv_cache_write", "k_scale"});
  PagedKv mixed = cache;
  mixed.v = Tensor::empty(cache.k.shape(), DType::bf16);
  expect_error([&] { kv_cache_write(mixed, qkv, slot, l); }, {"kv_cache_write", "v_cache"});
  Tensor f16_like = Tensor::empty({1, l.qkv_width() + 1}, DType::bf16);
  expect_error([&] { round_kv_to_fp8(f16_like, l); }, "round_kv_to_fp8: qkv");
}

}  // namespace
}  // namespace lockstep
