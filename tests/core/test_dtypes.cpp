// Conversions fp32 -> bf16 / e4m3: every tie and boundary against an independent reference, and,
// where the CUDA headers are present, every fp32 bit pattern against CUDA's own host conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtypes.h"

#if LOCKSTEP_HAVE_CUDA_HEADERS
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#endif

namespace lockstep {
namespace {

// Independent reference: the value of an E4M3FN code from its definition.
double e4m3_value(int code) {
  const int sign = code & 0x80 ? -1 : 1, exp = (code >> 3) & 15, mant = code & 7;
  if (exp == 0) return sign * std::ldexp(mant, -9);
  return sign * std::ldexp(8 + mant, exp - 7 - 3);
}

TEST(E4M3, DecodesAll256Codes) {
  for (int c = 0; c < 256; ++c) {
    const float f = e4m3_to_float(e4m3{uint8_t(c)});
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
    } else {
      EXPECT_EQ(double(f), e4m3_value(c)) << "code " << c;
    }
  }
}

TEST(E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const e4m3 back = float_to_e4m3(e4m3_to_float(e4m3{uint8_t(c)}));
    // -0 stays -0: the sign bit survives.
    EXPECT_EQ(back.bits, c) << "code " << c;
  }
}

// Between each pair of neighbouring positive codes: the exact midpoint goes to the even code, and
// one float step either side goes to the nearer code.
TEST(E4M3, TiesGoToEvenAndNeighboursToNearest) {
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = e4m3_value(c), hi = e4m3_value(c + 1);
    const float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2);  // midpoints are exact in fp32
    const int even = (c % 2 == 0) ? c : c + 1;
    for (float sign : {1.0f, -1.0f}) {
      const int s = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(float_to_e4m3(sign * mid).bits, s | even) << "tie between " << lo << " and " << hi;
      EXPECT_EQ(float_to_e4m3(sign * std::nextafter(mid, 0.0f)).bits, s | c) << lo;
      EXPECT_EQ(float_to_e4m3(sign * std::nextafter(mid, 1e9f)).bits, s | (c + 1)) << hi;
    }
  }
}

TEST(E4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(float_to_e4m3(448.0f).bits, 0x7e);
  EXPECT_EQ(float_to_e4m3(463.99f).bits, 0x7e);
  EXPECT_EQ(float_to_e4m3(464.0f).bits, 0x7e);  // would round to 512, saturates
  EXPECT_EQ(float_to_e4m3(1e30f).bits, 0x7e);
  EXPECT_EQ(float_to_e4m3(INFINITY).bits, 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY).bits, 0xfe);
  EXPECT_EQ(float_to_e4m3(NAN).bits, 0x7f);
  EXPECT_EQ(float_to_e4m3(-NAN).bits, 0x7f);
  EXPECT_EQ(float_to_e4m3(1e-30f).bits, 0x00);
  EXPECT_EQ(float_to_e4m3(-1e-30f).bits, 0x80);
  EXPECT_EQ(float_to_e4m3(1.0f).bits, 0x38);
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(float_to_bf16(bits_float(0x7f7fffffu)).bits, 0x7f80);  // FLT_MAX overflows to inf
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(NAN).bits, 0x7fff);
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {  // every bf16 value is exact
    const uint32_t x = hi << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) continue;
    EXPECT_EQ(float_to_bf16(bits_float(x)).bits, hi);
  }
}

TEST(E8M0, CeilPowerOfTwo) {
  EXPECT_EQ(e8m0_to_float(float_to_e8m0_ceil(1.0f)), 1.0f);
  EXPECT_EQ(e8m0_to_float(float_to_e8m0_ceil(1.0001f)), 2.0f);
  EXPECT_EQ(e8m0_to_float(float_to_e8m0_ceil(0.3f)), 0.5f);
  EXPECT_EQ(e8m0_to_float(float_to_e8m0_ceil(std::ldexp(1.0f, -126))), std::ldexp(1.0f, -126));
  EXPECT_EQ(float_to_e8m0_ceil(0.0f).bits, 0xff);
  EXPECT_EQ(float_to_e8m0_ceil(-1.0f).bits, 0xff);
  EXPECT_EQ(float_to_e8m0_ceil(INFINITY).bits, 0xff);
  EXPECT_TRUE(std::isnan(e8m0_to_float(e8m0{0xff})));
}

#if LOCKSTEP_HAVE_CUDA_HEADERS
// All 2^32 fp32 bit patterns against the conversions in CUDA's own headers (their host paths; the
// GPU test repeats this against the device instructions).
TEST(E4M3, MatchesCudaOnEveryFloat) {
  int64_t mismatches = 0;
#pragma omp parallel for reduction(+ : mismatches) schedule(static)
  for (int64_t i = 0; i < (int64_t(1) << 32); ++i) {
    const float f = bits_float(uint32_t(i));
    const uint8_t ours = float_to_e4m3(f).bits;
    const uint8_t cuda = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    mismatches += ours != cuda;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(BF16, MatchesCudaOnEveryFloat) {
  int64_t mismatches = 0;
#pragma omp parallel for reduction(+ : mismatches) schedule(static)
  for (int64_t i = 0; i < (int64_t(1) << 32); ++i) {
    const float f = bits_float(uint32_t(i));
    const __nv_bfloat16 c = __float2bfloat16_rn(f);
    uint16_t cuda;
    std::memcpy(&cuda, &c, 2);
    mismatches += float_to_bf16(f).bits != cuda;
  }
  EXPECT_EQ(mismatches, 0);
}
#endif

}  // namespace
}  // namespace lockstep
