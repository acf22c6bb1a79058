// tasks/verifier.cpp — final-answer extraction and exact comparison (the grammar is in verifier.h).
#include "tasks/verifier.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace lockstep {
namespace {

using i128 = __int128;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

i128 gcd(i128 a, i128 b) {
  while (b != 0) {
    const i128 r = a % b;
    a = b;
    b = r;
  }
  return a;
}

// num / den in lowest terms, for num >= 0 and den > 0 (signs are applied after).
Rational reduced(i128 num, i128 den) {
  const i128 g = gcd(num, den);
  return {num / g, den / g};
}

// a / b, or nullopt when either has no value, b is zero or the product does not fit.
std::optional<Rational> divide(const std::optional<Rational>& a, const std::optional<Rational>& b) {
  if (!a || !b || b->num == 0) return std::nullopt;
  i128 num, den;
  if (__builtin_mul_overflow(a->num, b->den, &num) || __builtin_mul_overflow(a->den, b->num, &den))
    return std::nullopt;
  return reduced(num, den);  // b->num > 0: both operands are unsigned decimals
}

// Where a number read from some start ends, and its value; end == start: no number there.
struct Scanned {
  size_t end;
  std::optional<Rational> value;
};

// Digits with optional thousands groups and an optional ".digits", or ".digits" alone.
Scanned scan_unsigned(std::string_view s, size_t pos) {
  i128 num = 0, den = 1;
  bool fits = true;
  auto push = [&](char digit, bool fraction) {
    fits = fits && !__builtin_mul_overflow(num, 10, &num) && !__builtin_add_overflow(num, digit - '0', &num);
    if (fraction) fits = fits && !__builtin_mul_overflow(den, 10, &den);
  };
  size_t p = pos;
  while (p < s.size() && is_digit(s[p])) push(s[p++], false);
  if (p > pos && p - pos <= 3) {
    while (p + 3 < s.size() && s[p] == ',' && is_digit(s[p + 1]) && is_digit(s[p + 2]) && is_digit(s[p + 3]) &&
           (p + 4 == s.size() || !is_digit(s[p + 4]))) {
      for (size_t i = p + 1; i <= p + 3; ++i) push(s[i], false);
      p += 4;
    }
  }
  if (p + 1 < s.size() && s[p] == '.' && is_digit(s[p + 1])) {
    size_t end = p + 1;
    while (end < s.size() && is_digit(s[end])) ++end;
    size_t last = end;  // trailing zeros change nothing and would only risk overflowing den
    while (s[last - 1] == '0') --last;
    for (size_t i = p + 1; i < last; ++i) push(s[i], true);
    p = end;
  }
  if (p == pos) return {pos, std::nullopt};
  return {p, fits ? std::optional<Rational>(reduced(num, den)) : std::nullopt};
}

// Bytes of a minus sign at s[pos]: '-' or U+2212 (E2 88 92); 0 if none.
size_t minus_length(std::string_view s, size_t pos) {
  if (pos < s.size() && s[pos] == '-') return 1;
  return s.substr(pos).starts_with("\u2212") ? 3 : 0;
}

// A minus right after an operand is a binary minus ("16-3"), not a sign.
bool after_operand(std::string_view s, size_t pos) {
  if (pos == 0) return false;
  const char c = s[pos - 1];
  return is_digit(c) || is_letter(c) || c == ')' || c == ']' || c == '}';
}

Scanned scan_number(std::string_view s, size_t pos) {
  const Scanned none{pos, std::nullopt};
  size_t p = pos;
  bool negative = false;
  if (const size_t n = minus_length(s, p); n > 0 && !after_operand(s, p)) {
    negative = true;
    p += n;
  }
  const size_t currency = s.substr(p).starts_with("$") ? 1 : s.substr(p).starts_with("\\$") ? 2 : 0;
  if (currency > 0) {
    p += currency;
    if (const size_t n = minus_length(s, p); n > 0 && !negative) {
      negative = true;
      p += n;
    }
  }
  auto signed_result = [&](size_t end, std::optional<Rational> value) {
    if (value && negative) value->num = -value->num;
    return Scanned{end, value};
  };
  for (std::string_view frac : {"\\frac{", "\\dfrac{", "\\tfrac{"}) {
    if (!s.substr(p).starts_with(frac)) continue;
    const size_t a_begin = p + frac.size();
    const Scanned a = scan_unsigned(s, a_begin);
    if (a.end == a_begin || !s.substr(a.end).starts_with("}{")) return none;
    const Scanned b = scan_unsigned(s, a.end + 2);
    if (b.end == a.end + 2 || b.end >= s.size() || s[b.end] != '}') return none;
    return signed_result(b.end + 1, divide(a.value, b.value));
  }
  if (p < s.size() && s[p] == '.' && p > 0 && is_digit(s[p - 1])) return none;  // "3.2.5": not ".5"
  const Scanned a = scan_unsigned(s, p);
  if (a.end == p) return none;
  if (a.end < s.size() && s[a.end] == '/') {
    const Scanned b = scan_unsigned(s, a.end + 1);
    if (b.end > a.end + 1) return signed_result(b.end, divide(a.value, b.value));
  }
  return signed_result(a.end, a.value);
}

// The first (or last) number in s.
std::optional<FinalAnswer> find_number(std::string_view s, bool last) {
  std::optional<FinalAnswer> found;
  for (size_t pos = 0; pos < s.size();) {
    const Scanned n = scan_number(s, pos);
    if (n.end == pos) {
      ++pos;  // byte by byte is safe in UTF-8: no number starts with a continuation byte
      continue;
    }
    found = FinalAnswer{s.substr(pos, n.end - pos), n.value};
    if (!last) break;
    pos = n.end;
  }
  return found;
}

// The contents of every closed "\\boxed{...}" (braces balanced), by opening position: [begin, end)
// with s[begin - 1] == '{' and s[end] its matching '}'. One pass with a stack, so that many unclosed
// "\\boxed{" cost linear time (scanning forward from each for its '}' was quadratic).
struct Box {
  size_t begin, end;
};
std::vector<Box> closed_boxes(std::string_view s) {
  constexpr std::string_view kBoxed = "\\boxed{";
  struct Open {
    size_t begin;
    bool boxed;
  };
  std::vector<Open> open;
  std::vector<Box> boxes;
  for (size_t p = 0; p < s.size(); ++p) {
    if (s[p] == '{') {
      const bool boxed = p + 1 >= kBoxed.size() && s.substr(p + 1 - kBoxed.size(), kBoxed.size()) == kBoxed;
      open.push_back({p + 1, boxed});
    } else if (s[p] == '}' && !open.empty()) {
      if (open.back().boxed) boxes.push_back({open.back().begin, p});
      open.pop_back();
    }
  }
  std::sort(boxes.begin(), boxes.end(), [](const Box& a, const Box& b) { return a.begin < b.begin; });
  return boxes;
}

// A box's answer: its number when it holds exactly one. Two or more ("\\boxed{3, 5}", "\\boxed{3 or
// 5}") is an answer with no value, as math-verify reads such a box as a set, equal to no number.
FinalAnswer box_answer(std::string_view content, size_t first, const Scanned& number) {
  for (size_t pos = number.end; pos < content.size(); ++pos)
    if (scan_number(content, pos).end > pos) return FinalAnswer{content, std::nullopt};
  return FinalAnswer{content.substr(first, number.end - first), number.value};
}

}  // namespace

std::optional<FinalAnswer> extract_final_answer(std::string_view completion) {
  const std::string_view s = completion;
  for (size_t at = s.find("####"); at != std::string_view::npos; at = s.find("####", at + 1)) {
    size_t p = at + 4;
    while (p < s.size() && is_space(s[p])) ++p;
    const Scanned n = scan_number(s, p);
    if (n.end > p) return FinalAnswer{s.substr(p, n.end - p), n.value};
  }
  // The last box that holds a number. Boxes nest or are disjoint; a box already scanned without
  // finding a number is skipped as a whole when an enclosing box is scanned (from its start to its
  // end), so that every byte is scanned once however deeply boxes nest.
  const std::vector<Box> boxes = closed_boxes(s);
  std::unordered_map<size_t, size_t> numberless;  // begin -> end of boxes without a number
  for (auto box = boxes.rbegin(); box != boxes.rend(); ++box) {
    const std::string_view content = s.substr(box->begin, box->end - box->begin);
    for (size_t pos = 0; pos < content.size();) {
      if (const auto skip = numberless.find(box->begin + pos); skip != numberless.end()) {
        pos = skip->second - box->begin + 1;  // past the inner box's '}' (an empty box ends where it begins)
        continue;
      }
      const Scanned n = scan_number(content, pos);
      if (n.end > pos) return box_answer(content, pos, n);
      ++pos;
    }
    numberless.emplace(box->begin, box->end);
  }
  return find_number(s, true);
}

std::optional<Rational> parse_answer(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  const Scanned n = scan_number(text, 0);
  if (text.empty() || n.end != text.size()) return std::nullopt;
  return n.value;
}

double answer_reward(std::string_view completion, std::string_view reference) {
  const std::optional<Rational> expected = parse_answer(reference);
  LOCKSTEP_CHECK(expected.has_value(), "answer_reward: the reference answer '", reference,
                 "' is not a number (expected e.g. 72, -3, 1,234.5, 3/4)");
  const std::optional<FinalAnswer> answer = extract_final_answer(completion);
  return answer && answer->value == expected ? 1.0 : 0.0;
}

bool answer_found(std::string_view completion) { return extract_final_answer(completion).has_value(); }

}  // namespace lockstep
