// tests/fuzz/fuzz_tokenizer_load.cpp — tokenizer.json of arbitrary bytes (io/tokenizer.h). A
// tokenizer that loads then encodes a fixed text (or refuses it with lockstep::Error) and decodes
// it, and decodes every id up to 300 and a few outside the vocab.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lockstep::fuzz::InputFile input;
  const std::string& path = input.path({reinterpret_cast<const char*>(data), size});
  std::optional<lockstep::Tokenizer> tokenizer;
  try {
    tokenizer.emplace(lockstep::Tokenizer::from_files(path));
  } catch (const lockstep::Error&) {
    return 0;
  }
  // Encoding may throw lockstep::Error too: as in HF, a model.unk_token missing from the vocab is an
  // error only for a text that needs it (TokenizerErrors.UnkTokenNotInVocab).
  std::vector<int32_t> ids;
  try {
    ids = tokenizer->encode("Hello, world! 12 345 <|im_start|> \xc3\xa9t\xc3\xa9 \n\n  x");
  } catch (const lockstep::Error&) {
    ids.clear();
  }
  for (int32_t id : ids)
    if (id < 0 || id >= tokenizer->vocab_size()) lockstep::fuzz::property_failed("an id outside the vocab");
  (void)tokenizer->decode(ids);
  (void)tokenizer->decode(ids, /*skip_special_tokens=*/true);
  std::vector<int32_t> every;
  for (int32_t id = 0; id < std::min(tokenizer->vocab_size(), 300); ++id) every.push_back(id);
  for (int32_t id : {-1, tokenizer->vocab_size(), INT32_MAX, INT32_MIN}) every.push_back(id);
  (void)tokenizer->decode(every);
  for (int32_t id : every) (void)tokenizer->id_to_token(id);
  return 0;
}
