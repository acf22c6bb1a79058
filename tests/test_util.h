// tests/test_util.h — random inputs, error norms and the GPU skip shared by the tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/head_layout.h"

namespace lockstep::testing {

#define LOCKSTEP_REQUIRE_GPU()                                                  \
  do {                                                                          \
    if (!::lockstep::cuda_device_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Values uniform in [−scale, scale) from a counter hash of (seed, index) (splitmix64's finalizer),
// with `varied_rows` each row scaled by one of 1e-3 .. 1e2 as random_tensor's: hundreds of millions
// a second, for operands too large for random_tensor's generator (a vocabulary's head, GEMMs of
// thousands of tokens). f32 or bf16.
inline Tensor hashed_tensor(Shape shape, DType dtype, uint64_t seed, float scale = 1.0f, bool varied_rows = false) {
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t cols = shape.back();
  constexpr float kRowScales[] = {1e-3f, 1e-2f, 1e-1f, 1.0f, 1e1f, 1e2f};
  auto hash = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t h = hash(seed * 0x9E3779B97F4A7C15ull + uint64_t(i));
    float v = scale * (float(h >> 40) / float(1 << 23) - 1.0f);
    if (varied_rows) v *= kRowScales[hash(seed + uint64_t(i / cols)) % 6];
    if (dtype == DType::f32) t.data_as<float>()[i] = v;
    else t.data_as<bf16>()[i] = float_to_bf16(v);
  }
  return t;
}

// Normal(0, 1) values, each row multiplied by a random power of ten in [1e-3, 1e2] when
// `varied_rows`, so groups see very different magnitudes. Never zeros.
inline Tensor random_tensor(Shape shape, DType dtype, uint64_t seed, bool varied_rows = false) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-3, 2);
  const int64_t cols = shape.empty() ? 1 : shape.back();
  float* p = t.data_as<float>();
  float row_scale = 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (varied_rows && i % cols == 0) row_scale = std::pow(10.0f, float(exponent(rng)));
    p[i] = normal(rng) * row_scale;
  }
  if (dtype == DType::f32) return t;
  Tensor b = Tensor::empty(shape, DType::bf16);
  for (int64_t i = 0; i < t.numel(); ++i) b.data_as<bf16>()[i] = float_to_bf16(p[i]);
  return b;
}

inline std::vector<double> to_double(const Tensor& t) {
  const Tensor c = t.device() == Device::cpu ? t : t.to(Device::cpu);
  std::vector<double> v(size_t(c.numel()));
  for (int64_t i = 0; i < c.numel(); ++i) {
    switch (c.dtype()) {
      case DType::f32: v[size_t(i)] = c.data_as<float>()[i]; break;
      case DType::bf16: v[size_t(i)] = bf16_to_float(c.data_as<bf16>()[i]); break;
      case DType::e4m3: v[size_t(i)] = e4m3_to_float(c.data_as<e4m3>()[i]); break;
      default: ADD_FAILURE() << "to_double: unsupported dtype";
    }
  }
  return v;
}

// ‖out − ref‖ / ‖ref‖; NaN anywhere gives NaN (which fails every ≤ comparison).
inline double rel_error(const std::vector<double>& out, const std::vector<double>& ref) {
  EXPECT_EQ(out.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size() && i < ref.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// Relative error row by row (rows of very different magnitude each get checked), the worst row.
inline double worst_row_error(const std::vector<double>& out, const std::vector<double>& ref,
                              int64_t cols) {
  EXPECT_EQ(out.size(), ref.size());
  double worst = 0;
  for (size_t begin = 0; begin + size_t(cols) <= ref.size(); begin += size_t(cols)) {
    const std::vector<double> o(out.begin() + begin, out.begin() + begin + cols);
    const std::vector<double> r(ref.begin() + begin, ref.begin() + begin + cols);
    const double e = rel_error(o, r);
    if (!(e <= worst)) worst = e;  // keeps a NaN
  }
  return worst;
}

// An output the op must overwrite: every byte 0xFF, NaN in f32, bf16 and e4m3, so an element the op
// forgets to write fails the test.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device = Device::cpu) {
  Tensor t = Tensor::empty(shape, dtype, device);
  t.fill_bytes(0xFF);
  return t;
}

// An e4m3 paged KV cache (ops/attention.h) of num_blocks blocks of block_size slots on `device`,
// every byte and scale poisoned: a slot the op forgets to write stays NaN.
inline PagedKv poisoned_fp8_cache(const HeadLayout& layout, int64_t num_blocks, int64_t block_size,
                                  Device device = Device::cpu) {
  const Shape values{num_blocks, block_size, layout.kv_heads, layout.head_dim};
  const Shape scales{num_blocks, block_size, layout.kv_heads};
  return {poisoned(values, DType::e4m3, device), poisoned(values, DType::e4m3, device),
          poisoned(scales, DType::f32, device), poisoned(scales, DType::f32, device)};
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.to(Device::cpu), cb = b.to(Device::cpu);
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         (ca.nbytes() == 0 || std::memcmp(ca.data(), cb.data(), ca.nbytes()) == 0);
}

// Runs `fn`, expects a lockstep::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string_view> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << *parts.begin() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (std::string_view part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

template <class Fn>
void expect_error(Fn&& fn, std::string_view part) {
  expect_error(std::forward<Fn>(fn), {part});
}

}  // namespace lockstep::testing
