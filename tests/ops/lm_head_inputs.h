// tests/ops/lm_head_inputs.h — random inputs of the LM-head tests (CPU and GPU).
#pragma once

#include <random>

#include "ops/lm_head.h"
#include "tests/test_util.h"

namespace lockstep::testing {

// Normal(0, 1)·scale values in `dtype` (bf16: rounded once from f32).
inline Tensor random_values(Shape shape, DType dtype, uint64_t seed, float scale) {
  Tensor t = random_tensor(shape, DType::f32, seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] *= scale;
  if (dtype == DType::f32) return t;
  Tensor b = Tensor::empty(shape, DType::bf16);
  for (int64_t i = 0; i < t.numel(); ++i)
    b.data_as<bf16>()[i] = float_to_bf16(t.data_as<float>()[i]);
  return b;
}

// Targets in [0, V), including 0, V − 1 and the last chunk.
inline Tensor random_targets(int64_t T, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty({T}, DType::i32);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, int32_t(V - 1));
  for (int64_t i = 0; i < T; ++i) t.data_as<int32_t>()[i] = id(rng);
  t.data_as<int32_t>()[0] = 0;
  if (T > 1) t.data_as<int32_t>()[1] = int32_t(V - 1);
  if (T > 2)
    t.data_as<int32_t>()[2] =
        int32_t((V - 1) / kVocabChunk * kVocabChunk);  // first of the last chunk
  return t;
}

}  // namespace lockstep::testing
