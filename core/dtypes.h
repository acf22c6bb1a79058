// core/dtypes.h — the element types lockstep stores, and the exact conversions between them.
//
//   f32   IEEE binary32
//   bf16  bfloat16; float -> bf16 rounds to nearest even, NaN -> 0x7FFF (as __float2bfloat16_rn)
//   e4m3  OCP FP8 E4M3FN (bias 7, no infinities, max ±448, NaN = 0x7F/0xFF); float -> e4m3 rounds
//         to nearest even and saturates to ±448 (infinities too), NaN -> 0x7F
//         (as __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3))
//   e8m0  a power-of-two scale 2^(bits - 127); 0xFF is NaN (OCP MX scale format)
//
// The conversions are plain integer code, usable on the host and (LOCKSTEP_HD) on the device, and
// are tested bit for bit against CUDA's own over every fp32 bit pattern.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define LOCKSTEP_HD __host__ __device__ __forceinline__
#else
#define LOCKSTEP_HD inline
#endif

namespace lockstep {

// f64: host-side sums only (dist/ collectives of metrics); no op computes in it.
enum class DType : uint8_t { f32, bf16, e4m3, e8m0, i32, i64, f16, f64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::e4m3: return 1;
    case DType::e8m0: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::f16: return 2;
    case DType::f64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e8m0: return "e8m0";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::f16: return "f16";
    case DType::f64: return "f64";
  }
  return "?";
}

// Storage types: a bit pattern and nothing else, so no implicit arithmetic can sneak in.
struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };  // IEEE binary16: read from checkpoints (f16_to_float below)
struct e4m3 { uint8_t bits; };
struct e8m0 { uint8_t bits; };

LOCKSTEP_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

LOCKSTEP_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bf16 ----------------------------------------------------------------------------------------

LOCKSTEP_HD bf16 float_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16{0x7fff};
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  x += 0x7fffu + ((x >> 16) & 1u);
  return bf16{static_cast<uint16_t>(x >> 16)};
}

LOCKSTEP_HD float bf16_to_float(bf16 b) { return bits_float(uint32_t(b.bits) << 16); }

// The value a float takes after a round trip through bf16.
LOCKSTEP_HD float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// ---- f16 -----------------------------------------------------------------------------------------

// Exact: every binary16 value is a binary32 value. NaN keeps its sign and payload.
LOCKSTEP_HD float f16_to_float(f16 h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));          // inf, NaN
  if (exp == 0) return bits_float(sign | float_bits(float(mant) * 0x1p-24f));      // m * 2^-24
  return bits_float(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

// ---- e4m3 ----------------------------------------------------------------------------------------

constexpr float kE4M3Max = 448.0f;

// Branch-free (every path computed, then selected) so that loops of it vectorize on the CPU.
LOCKSTEP_HD e4m3 float_to_e4m3(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t a = x & 0x7fffffffu;
  // Normal (2^-6 <= |f| < 448): keep 3 of 23 mantissa bits, round to nearest even; a carry
  // propagates into the exponent (the largest result is 0x7E, 448).
  uint32_t normal = (((a >> 23) - 120u) << 3) | ((a >> 20) & 7u);  // exponent bias 127 -> 7
  const uint32_t rem = a & 0xfffffu;
  normal += uint32_t(rem > 0x80000u || (rem == 0x80000u && (normal & 1u)));
  // Subnormal (|f| < 2^-6): codes m · 2^-9, m in [0, 8] (8 is the smallest normal, code 0x08).
  // |f| · 2^9 is exact, and adding then subtracting 2^23 rounds it to an integer, nearest even.
  // Other inputs take 0 here (the lane is discarded below): converting a large, infinite or NaN
  // |f| · 2^9 to an integer would be undefined behaviour even though its result is never used.
  const float scaled = bits_float(a < 0x3c800000u ? a : 0u) * 512.0f;
  const uint32_t subnormal = uint32_t((scaled + 8388608.0f) - 8388608.0f);
  uint32_t code = a < 0x3c800000u ? subnormal : normal;
  code = a >= 0x43e00000u ? 0x7eu : code;                  // |f| >= 448 (and inf): saturate
  return e4m3{uint8_t(a > 0x7f800000u ? 0x7fu : (sign | code))};  // NaN stays NaN
}

LOCKSTEP_HD float e4m3_to_float(e4m3 v) {
  const uint32_t sign = uint32_t(v.bits & 0x80u) << 24;
  const uint32_t exp = (v.bits >> 3) & 0xfu, mant = v.bits & 7u;
  if (exp == 0xfu && mant == 7u) return bits_float(sign | 0x7fc00000u);    // NaN
  if (exp == 0) return bits_float(sign | float_bits(float(mant) * 0.001953125f));  // m * 2^-9
  return bits_float(sign | ((exp - 7 + 127) << 23) | (mant << 20));
}

// ---- e8m0 ----------------------------------------------------------------------------------------

LOCKSTEP_HD float e8m0_to_float(e8m0 v) {
  if (v.bits == 0xff) return bits_float(0x7fc00000u);
  if (v.bits == 0) return bits_float(0x00400000u);  // 2^-127 is a float subnormal
  return bits_float(uint32_t(v.bits) << 23);
}

// The smallest power of two >= f, for finite f > 0 in the normal float range; NaN for anything else.
LOCKSTEP_HD e8m0 float_to_e8m0_ceil(float f) {
  const uint32_t x = float_bits(f);
  if (x == 0 || x >= 0x7f800000u || x < 0x00800000u) return e8m0{0xff};
  uint32_t exp = x >> 23;
  if (x & 0x7fffffu) ++exp;
  return e8m0{exp >= 0xff ? uint8_t(0xff) : uint8_t(exp)};
}

}  // namespace lockstep
