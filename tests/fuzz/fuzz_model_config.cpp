// tests/fuzz/fuzz_model_config.cpp — config.json of arbitrary bytes (io/config.h). A config that
// parses must survive to_json() and parse back equal, and its parameter count must be computable.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "io/config.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  lockstep::ModelConfig config;
  try {
    config = lockstep::parse_model_config(text, "config.json");
  } catch (const lockstep::Error&) {
    return 0;
  }
  (void)lockstep::parameter_count(config);
  if (lockstep::parse_model_config(config.to_json(), "to_json") != config)
    lockstep::fuzz::property_failed("parse_model_config(to_json(c)) != c");
  return 0;
}
