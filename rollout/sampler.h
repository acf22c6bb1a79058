// rollout/sampler.h — what a request asks of generation (SamplingParams).
//
// Each token is drawn by ops/sample.h's sample_tokens (which defines temperature, top-k, top-p and
// the Philox draw exactly) with a SampleSpec of the request's temperature, top_k, top_p and seed;
// rollout/engine.h says which stream and position key each draw.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

struct SamplingParams {
  int64_t n = 1;                // samples of the prompt
  float temperature = 1.0f;     // ≥ 0; 0 = greedy
  float top_p = 1.0f;           // (0, 1]
  int64_t top_k = 0;            // ≥ 0; 0 = no limit
  int64_t max_new_tokens = 16;  // ≥ 1
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;  // non-empty strings; need a tokenizer
  uint64_t seed = 0;
};

}  // namespace lockstep
