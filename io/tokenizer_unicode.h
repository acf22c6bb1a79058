// io/tokenizer_unicode.h — the few Unicode facts the tokenizer needs: UTF-8 decoding and
// validation, the four normalization forms, lowercasing, and the character classes of HF's Rust code.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep::unicode {

// Offset of the first byte that starts no valid UTF-8 sequence (overlong forms, surrogates and
// code points past U+10FFFF are invalid, as in Rust's str), or npos when all of `text` is valid.
size_t find_invalid_utf8(std::string_view text);

// The code point starting at text[pos] / ending just before text[pos]; *length receives its byte
// count. `text` must be valid UTF-8 and pos a character boundary.
char32_t code_point_at(std::string_view text, size_t pos, int* length);
char32_t code_point_before(std::string_view text, size_t pos, int* length);

// Unicode White_Space: what Rust's char::is_whitespace, Rust regex's \s and Oniguruma's \s match.
bool is_white_space(char32_t c);
// Rust regex's Unicode \w: letters, marks, decimal digits, connector punctuation, Join_Control.
bool is_word_char(char32_t c);

// Rust's char::is_numeric (categories Nd, Nl, No): what the Digits pre-tokenizer splits on.
bool is_numeric(char32_t c);
// HF's Punctuation pre-tokenizer: ASCII punctuation (which includes symbols such as $ + < = > ^ ` | ~)
// or a Unicode punctuation category (Pc, Pd, Ps, Pe, Pi, Pf, Po).
bool is_punctuation(char32_t c);

// The Unicode normalization forms of valid UTF-8 text (utf8proc). ASCII text is its own image under
// all four.
enum class NormalForm { nfc, nfd, nfkc, nfkd };
std::string normalize(std::string_view text, NormalForm form);
inline std::string nfc(std::string_view text) { return normalize(text, NormalForm::nfc); }

// Rust's char::to_lowercase applied to each character (no context: a final sigma stays σ).
std::string lowercase(std::string_view text);

// True when `text` is valid UTF-8 holding exactly one character.
bool is_one_character(std::string_view text);

// Appends the UTF-8 encoding of c.
void append_utf8(std::string& out, char32_t c);

inline bool is_ascii(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace lockstep::unicode
