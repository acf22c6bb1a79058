// tests/fuzz/fuzz_tokenizer_encode.cpp — encoding arbitrary bytes and decoding arbitrary ids with
// the tokenizer fixtures of tests/data (every normalizer, pre-tokenizer and decoder lockstep
// supports). The first byte picks the tokenizer; the rest is the text, and also read as ids (4
// bytes each, so negative and out-of-vocab ids come too). Encoding may only refuse invalid UTF-8;
// every id is in the vocab; the byte-level tokenizers without a normalizer decode back the exact
// text (made of bytes their vocab holds).
#include <cstddef>
#include <cstdint>
#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

struct Fixture {
  lockstep::Tokenizer tokenizer;
  bool byte_level;  // a ByteLevel pre-tokenizer and decoder and no normalizer
  // Byte-level only: the bytes whose character (GPT-2's bytes_to_unicode) the vocab holds. The
  // fixtures' vocabs are cut down, and a byte without its character is dropped (as in HF, having no
  // unk_token), so decode(encode(text)) == text holds for texts of these bytes.
  std::array<bool, 256> in_vocab{};
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for 256 + n.
std::string byte_level_character(int byte) {
  const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) || (byte >= 0xae && byte <= 0xff);
  uint32_t code = uint32_t(byte);
  if (!printable) {
    code = 256;
    for (int b = 0; b < byte; ++b)
      code += !((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff));
  }
  std::string out;
  if (code < 0x80) {
    out += char(code);
  } else {
    out += char(0xc0 | (code >> 6));
    out += char(0x80 | (code & 0x3f));
  }
  return out;
}

Fixture fixture(const std::string& name, bool byte_level) {
  Fixture f{lockstep::Tokenizer::from_files(LOCKSTEP_TEST_DATA "/tokenizer_" + name + ".json"), byte_level, {}};
  for (int byte = 0; byte < 256; ++byte) f.in_vocab[byte] = byte_level && f.tokenizer.token_to_id(byte_level_character(byte));
  return f;
}

std::vector<Fixture>& fixtures() {
  static std::vector<Fixture> all = [] {
    std::vector<Fixture> list;
    for (const char* name : {"flags", "gpt2_style", "llama2_style", "metaspace_unk", "mistral_style",
                             "split_style", "words_style"})
      list.push_back(fixture(name, false));
    list.push_back(fixture("llama3_style", true));
    list.push_back(fixture("smollm2_style", true));
    return list;
  }();
  return all;
}

bool valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) { n = 1; cp = c; }
    else if ((c & 0xe0) == 0xc0) { n = 2; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { n = 3; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { n = 4; cp = c & 0x07; }
    else return false;
    if (i + n > text.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Fixture& fixture = fixtures()[data[0] % fixtures().size()];
  const lockstep::Tokenizer& tokenizer = fixture.tokenizer;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool utf8 = valid_utf8(text);
  bool exact = fixture.byte_level;
  for (char c : text) exact = exact && fixture.in_vocab[static_cast<unsigned char>(c)];
  for (bool add_special_tokens : {false, true}) {
    std::vector<int32_t> ids;
    try {
      ids = tokenizer.encode(text, add_special_tokens);
    } catch (const lockstep::Error&) {
      if (utf8) lockstep::fuzz::property_failed("valid UTF-8 refused by encode");
      return 0;
    }
    if (!utf8) lockstep::fuzz::property_failed("invalid UTF-8 accepted by encode");
    for (int32_t id : ids)
      if (id < 0 || id >= tokenizer.vocab_size()) lockstep::fuzz::property_failed("an id outside the vocab");
    const std::string decoded = tokenizer.decode(ids);
    if (exact && !add_special_tokens && decoded != text)
      lockstep::fuzz::property_failed("decode(encode(text)) != text for a byte-level tokenizer");
    (void)tokenizer.decode(ids, /*skip_special_tokens=*/true);
  }
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  (void)tokenizer.decode(raw);
  (void)tokenizer.decode(raw, /*skip_special_tokens=*/true);
  return 0;
}
