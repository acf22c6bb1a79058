// bench/bench_util.h — what the model benches share: the Qwen3 shapes they run (--model) and
// their command-line values (comma-separated lists, non-negative integers), each bad value one
// error naming its flag.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/config.h"

namespace lockstep::bench {

// Qwen3-8B or Qwen3-1.7B (their Hugging Face config.json), all layers.
inline ModelConfig model_config(const std::string& name) {
  ModelConfig c;
  c.family = ModelFamily::qwen3;
  c.qk_norm = true;
  c.head_dim = 128;
  c.num_key_value_heads = 8;
  c.vocab_size = 151936;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  if (name == "qwen3-8b") {
    c.hidden_size = 4096;
    c.intermediate_size = 12288;
    c.num_hidden_layers = 36;
    c.num_attention_heads = 32;
    c.tie_word_embeddings = false;
  } else if (name == "qwen3-1.7b") {
    c.hidden_size = 2048;
    c.intermediate_size = 6144;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 16;
    c.tie_word_embeddings = true;
  } else {
    fail("--model: expected qwen3-8b or qwen3-1.7b, got '" + name + "'");
  }
  return c;
}

inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

inline int64_t parse_int(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  LOCKSTEP_CHECK(!value.empty() && *end == '\0' && v >= 0, flag, ": expected a non-negative integer, got '",
                 value, "'");
  return v;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace lockstep::bench
