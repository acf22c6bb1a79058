// tests/fuzz/fuzz_cli_config.cpp — the run configuration (cli/config.h): a TOML file of arbitrary
// bytes, then (each after a 0 byte) command-line options. A configuration that loads must come back
// exactly from its own to_toml(), as config.h promises.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/config.h"
#include "core/error.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lockstep::fuzz::InputFile input;
  const std::vector<std::string_view> parts = lockstep::fuzz::split(data, size, '\0');
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  lockstep::Config config;
  try {
    const std::filesystem::path file = input.path(parts[0]);
    config = lockstep::load_config(&file, overrides);
  } catch (const lockstep::Error&) {
    return 0;
  }
  const std::filesystem::path written = input.path(lockstep::to_toml(config));
  if (lockstep::load_config(&written, {}) != config)
    lockstep::fuzz::property_failed("load_config(to_toml(c)) != c");
  return 0;
}
