// io/tokenizer_unicode.cpp — UTF-8 helpers, character classes and NFC (through utf8proc).
#include "io/tokenizer_unicode.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"

namespace lockstep::unicode {

size_t find_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (bytes[i] < 0x80) {
      ++i;
      continue;
    }
    utf8proc_int32_t c;
    // utf8proc_iterate rejects overlong forms, surrogates and values past U+10FFFF.
    const utf8proc_ssize_t length = utf8proc_iterate(bytes + i, utf8proc_ssize_t(n - i), &c);
    if (length <= 0) return i;
    i += size_t(length);
  }
  return std::string_view::npos;
}

char32_t code_point_at(std::string_view text, size_t pos, int* length) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  if (p[0] < 0x80) {
    *length = 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *length = 2;
    return char32_t(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    *length = 3;
    return char32_t(p[0] & 0x0F) << 12 | char32_t(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
  }
  *length = 4;
  return char32_t(p[0] & 0x07) << 18 | char32_t(p[1] & 0x3F) << 12 | char32_t(p[2] & 0x3F) << 6 |
         (p[3] & 0x3F);
}

char32_t code_point_before(std::string_view text, size_t pos, int* length) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return code_point_at(text, start, length);
}

bool is_white_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || c == 0x20;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Alphabetic symbols outside the letter categories (Other_Alphabetic, category So): circled and
  // squared Latin letters.
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
      (c >= 0x1F170 && c <= 0x1F189))
    return true;
  switch (utf8proc_category(utf8proc_int32_t(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC: return true;
    default: return false;
  }
}

std::string nfc(std::string_view text) {
  if (text.empty()) return {};
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), utf8proc_ssize_t(text.size()),
                   &composed, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) fail(std::string("NFC normalization failed: ") + utf8proc_errmsg(length));
  std::string result(reinterpret_cast<const char*>(composed), size_t(length));
  std::free(composed);
  return result;
}

}  // namespace lockstep::unicode
