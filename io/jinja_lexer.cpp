// io/jinja_lexer.cpp — template text to pieces and expression tokens, with jinja2's whitespace
// rules (jinja2/lexer.py): `{%-`/`{{-`/`{#-` strip all whitespace before the tag, `-%}`/`-}}`/`-#}`
// all whitespace after it; trim_blocks drops the one newline after `%}` and `#}`; lstrip_blocks
// drops the whitespace between a line's start and `{%` or `{#` (not `{{`) when nothing else is on
// the line before the tag, unless the tag opens with `+`.
#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "io/jinja_syntax.h"
#include "io/tokenizer_unicode.h"

namespace lockstep::jinja {
namespace {

[[noreturn]] void lex_error(std::string_view name, int line, const std::string& what) {
  fail(std::string(name) + ":" + std::to_string(line) + ": " + what);
}

// Python's str.rstrip() / the `\s*` of jinja2's regexes, on UTF-8 text.
// The bytes of `text` that the first `count` code points of utf8_to_u32(text) came from. Text that
// is not UTF-8 is read one code point per byte (utf8_to_u32), and re-encoding those would count
// the bytes 0x80-0xff twice (U+0085 and U+00A0 are Python whitespace).
size_t bytes_of_code_points(std::string_view text, std::u32string_view cps, size_t count) {
  if (unicode::find_invalid_utf8(text) != std::string_view::npos) return count;
  return u32_to_utf8(cps.substr(0, count)).size();
}

size_t rstrip_end(std::string_view text) {
  const std::u32string cps = utf8_to_u32(text);
  size_t keep = cps.size();
  while (keep > 0 && is_python_space(cps[keep - 1])) --keep;
  return bytes_of_code_points(text, cps, keep);
}

size_t lstrip_begin(std::string_view text, size_t pos) {
  const std::u32string cps = utf8_to_u32(text.substr(pos));
  size_t skip = 0;
  while (skip < cps.size() && is_python_space(cps[skip])) ++skip;
  return pos + bytes_of_code_points(text.substr(pos), cps, skip);
}

int count_lines(std::string_view text) { return int(std::count(text.begin(), text.end(), '\n')); }

// Python's "unicode-escape" decoding of a string literal's body (jinja2 decodes literals so).
std::string decode_string(std::string_view body, std::string_view name, int line) {
  std::u32string out;
  const std::u32string in = utf8_to_u32(body);
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 == in.size()) {
      out += in[i];
      continue;
    }
    const char32_t c = in[++i];
    const auto hex = [&](size_t digits) {
      if (i + digits >= in.size())
        lex_error(name, line, "truncated \\x/\\u escape in a string literal");
      std::string h;
      for (size_t k = 1; k <= digits; ++k) h += char(in[i + k]);
      for (char d : h)
        if (!std::isxdigit(static_cast<unsigned char>(d)))
          lex_error(name, line, "bad escape \\" + std::string(1, char(c)) + h + " in a string literal");
      i += digits;
      return char32_t(std::strtoul(h.c_str(), nullptr, 16));
    };
    switch (c) {
      case '\n': break;  // line continuation
      case '\\': out += U'\\'; break;
      case '\'': out += U'\''; break;
      case '"': out += U'"'; break;
      case 'a': out += U'\a'; break;
      case 'b': out += U'\b'; break;
      case 'f': out += U'\f'; break;
      case 'n': out += U'\n'; break;
      case 'r': out += U'\r'; break;
      case 't': out += U'\t'; break;
      case 'v': out += U'\v'; break;
      case 'x': out += hex(2); break;
      case 'u': out += hex(4); break;
      case 'U': out += hex(8); break;
      default:
        if (c >= '0' && c <= '7') {
          char32_t v = c - '0';
          for (int k = 0; k < 2 && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '7'; ++k)
            v = v * 8 + (in[++i] - '0');
          out += v;
        } else {
          out += U'\\';  // unknown escapes stay as written
          out += c;
        }
    }
  }
  return u32_to_utf8(out);
}

constexpr std::string_view kOperators[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                           "~",  "<",  ">",  "(",  ")",  "[",  "]", "{", "}", ",", ".",
                                           ":",  "|",  "=",  ";"};

struct TagEnd {
  size_t end = 0;  // just past the closer
  char sign = 0;   // '-' or '+' before the closer, or 0
};

// Tokens of one tag from `pos` up to its closer ("}}" or "%}"), at bracket depth 0.
TagEnd lex_tag(std::string_view s, size_t pos, std::string_view closer, std::string_view name, int& line,
               std::vector<Token>& tokens) {
  int depth = 0;
  while (true) {
    while (pos < s.size() && std::isspace(static_cast<unsigned char>(s[pos]))) {
      if (s[pos] == '\n') ++line;
      ++pos;
    }
    if (pos >= s.size()) lex_error(name, line, "unexpected end of template: missing '" + std::string(closer) + "'");
    const std::string_view rest = s.substr(pos);
    if (depth == 0) {
      for (char sign : {'-', '+'})
        if (rest.size() > closer.size() && rest[0] == sign && rest.substr(1, closer.size()) == closer &&
            (sign == '-' || closer == "%}"))
          return {pos + 1 + closer.size(), sign};
      if (rest.substr(0, closer.size()) == closer) return {pos + closer.size(), 0};
    }
    Token t;
    t.line = line;
    const char c = rest[0];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t n = 1;
      while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
      t.kind = Token::Kind::name;
      t.text = std::string(rest.substr(0, n));
      pos += n;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t n = 0;
      while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
      bool is_float = false;
      if (n + 1 < rest.size() && rest[n] == '.' && std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
        is_float = true;
        ++n;
        while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
      }
      if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
        size_t m = n + 1;
        if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
        if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
          is_float = true;
          n = m;
          while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
        }
      }
      std::string digits;
      for (char d : rest.substr(0, n))
        if (d != '_') digits += d;
      if (is_float) {
        t.kind = Token::Kind::floating;
        t.floating = std::strtod(digits.c_str(), nullptr);
      } else {
        t.kind = Token::Kind::integer;
        t.integer = std::strtoll(digits.c_str(), nullptr, 10);
      }
      pos += n;
    } else if (c == '\'' || c == '"') {
      size_t n = 1;
      while (n < rest.size() && rest[n] != c) n += rest[n] == '\\' ? 2 : 1;
      if (n >= rest.size()) lex_error(name, line, "unterminated string literal");
      t.kind = Token::Kind::string;
      t.text = decode_string(rest.substr(1, n - 1), name, line);
      line += count_lines(rest.substr(0, n));
      pos += n + 1;
    } else {
      std::string_view op;
      for (std::string_view o : kOperators)
        if (rest.substr(0, o.size()) == o) {
          op = o;
          break;
        }
      if (op.empty()) lex_error(name, line, "unexpected character '" + std::string(1, c) + "' in a tag");
      if (op == "(" || op == "[" || op == "{") ++depth;
      if (op == ")" || op == "]" || op == "}") --depth;
      t.kind = Token::Kind::op;
      t.text = std::string(op);
      pos += op.size();
    }
    tokens.push_back(std::move(t));
  }
}

}  // namespace

std::vector<Piece> lex(std::string_view raw, std::string_view name, const LexOptions& options) {
  // jinja2 normalizes the source's newlines to "\n" and drops one trailing newline
  // (keep_trailing_newline=False).
  std::string source;
  source.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      source += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      source += raw[i];
    }
  }
  if (!source.empty() && source.back() == '\n') source.pop_back();
  const std::string_view s = source;

  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;  // the text at `pos` starts a line (jinja2's `line_starting`)
  while (pos < s.size()) {
    size_t open = std::string_view::npos;
    for (std::string_view opener : {"{{", "{%", "{#"}) open = std::min(open, s.find(opener, pos));
    std::string_view text = s.substr(pos, open == std::string_view::npos ? s.size() - pos : open - pos);
    if (open == std::string_view::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::text, std::string(text), {}, line});
      break;
    }
    const char type = s[open + 1];
    const char sign = open + 2 < s.size() && (s[open + 2] == '-' || s[open + 2] == '+') ? s[open + 2] : 0;
    const int text_line = line;
    line += count_lines(text);
    if (sign == '-') {
      text = text.substr(0, rstrip_end(text));
    } else if (sign != '+' && options.lstrip_blocks && type != '{') {
      const size_t newline = text.rfind('\n');
      const size_t l_pos = newline == std::string_view::npos ? 0 : newline + 1;
      if (l_pos > 0 || line_starting) {
        // jinja2: `\s+` must match all of the line's start (spaces, tabs, other Unicode whitespace).
        const std::u32string line_start = utf8_to_u32(text.substr(l_pos));
        const bool blank = !line_start.empty() && std::all_of(line_start.begin(), line_start.end(), is_python_space);
        if (blank) text = text.substr(0, l_pos);
      }
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::text, std::string(text), {}, text_line});
    size_t after = open + 2 + (sign ? 1 : 0);
    const int tag_line = line;

    TagEnd end;
    if (type == '#') {
      size_t close = s.find("#}", after);
      if (close == std::string_view::npos) lex_error(name, tag_line, "unterminated comment: missing '#}'");
      line += count_lines(s.substr(after, close - after));
      end.end = close + 2;
      end.sign = close > after && s[close - 1] == '-' ? '-' : close > after && s[close - 1] == '+' ? '+' : 0;
    } else {
      Piece piece;
      piece.kind = type == '{' ? Piece::Kind::output : Piece::Kind::statement;
      piece.line = tag_line;
      end = lex_tag(s, after, type == '{' ? "}}" : "%}", name, line, piece.tokens);
      Token last;
      last.kind = Token::Kind::end;
      last.line = line;
      piece.tokens.push_back(last);
      pieces.push_back(std::move(piece));
    }
    pos = end.end;
    line_starting = false;
    if (end.sign == '-') {
      const size_t next = lstrip_begin(s, pos);
      line += count_lines(s.substr(pos, next - pos));
      line_starting = next > pos && s[next - 1] == '\n';
      pos = next;
    } else if (end.sign != '+' && type != '{' && options.trim_blocks && pos < s.size() && s[pos] == '\n') {
      ++pos;
      ++line;
      line_starting = true;
    }
  }
  return pieces;
}

}  // namespace lockstep::jinja
