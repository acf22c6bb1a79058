// tests/fuzz/fuzz_safetensors.cpp — a .safetensors file of arbitrary bytes (io/safetensors.h): the
// header is parsed and validated, then every tensor it lists is asked for and every byte of it read,
// so a bound the validation missed shows as an ASan read past the mapping.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "io/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lockstep::fuzz::InputFile input;
  const std::string& path = input.path({reinterpret_cast<const char*>(data), size});
  try {
    lockstep::SafetensorsFile file(path);
    for (const std::string& name : file.names()) {
      const lockstep::SafetensorsEntry& entry = file.entry(name);
      if (entry.end < entry.begin) lockstep::fuzz::property_failed("an entry ends before it begins");
      try {
        const lockstep::Tensor tensor = file.tensor(name);
        if (tensor.nbytes() != entry.end - entry.begin)
          lockstep::fuzz::property_failed("a tensor's size differs from its byte range");
        volatile unsigned char sum = 0;
        const auto* bytes = static_cast<const unsigned char*>(tensor.data());
        for (size_t i = 0; i < tensor.nbytes(); ++i) sum = sum + bytes[i];
      } catch (const lockstep::Error&) {  // an unsupported dtype: the file still opens
      }
    }
  } catch (const lockstep::Error&) {
  }
  return 0;
}
