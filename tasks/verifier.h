// tasks/verifier.h — the verifiable reward: the final answer a completion gives, compared exactly
// with the reference answer.
//
// The final answer is, in this order of precedence:
//   1. the number right after the first "####" that is followed by one (GSM8K's format; whitespace
//      may come between);
//   2. else the number inside the last "\boxed{...}" (braces balanced) that holds one; a box that
//      holds two or more ("\boxed{3, 5}", "\boxed{3 or 5}", "\boxed{16-3}") is the final answer with
//      no value, equal to nothing, as math-verify reads such a box as a set or an expression that
//      equals no single number (an expression is not evaluated);
//   3. else the last number in the text.
//
// A number is: an optional minus ('-' or U+2212; only where it cannot be a binary minus, i.e. not
// right after a letter, a digit or a closing bracket, so "16-3" ends in 3 and "x-5" is 5, not -5:
// verl's GSM8K regex would read -5, but an expression in x is no negative answer), an optional
// currency sign ('$' or "\$", and a minus may follow it: "$-5"), then an unsigned decimal and an optional
// "/denominator" ("3/4", "1.5/2"), or LaTeX "\frac{a}{b}" (also \dfrac, \tfrac). An unsigned
// decimal is digits with optional thousands separators (groups of exactly three: "1,234,567"; "1,2,3"
// is three numbers), then an optional ".digits" (a '.' without a digit after it ends the number, as
// at the end of a sentence); or ".digits" alone, when no digit comes right before. Whatever follows
// a number (units, words, '%') is ignored: "18 dollars" is 18, and "25%" is 25, because GSM8K writes
// the answer to a percentage question as the number of percent.
//
// Values are exact rationals (128-bit numerator and denominator, reduced), so "0.75", "3/4" and
// "\frac{3}{4}" are equal, as are "18", "18.00" and "$18", with no tolerance at all: "0.3333" is not
// 1/3. A number that has no exact value here (more than about 38 significant digits, or a zero
// denominator) is still the final answer, but equals nothing.
#pragma once

#include <optional>
#include <string_view>

namespace lockstep {

// num / den in lowest terms, den > 0: equal values have equal members.
struct Rational {
  __int128 num = 0;
  __int128 den = 1;
  friend bool operator==(const Rational&, const Rational&) = default;
};

struct FinalAnswer {
  std::string_view text;          // the number as written, a view into the completion ("$1,000.00")
  std::optional<Rational> value;  // empty when it has no exact value (see above)
};

// The completion's final answer, or nullopt when the text holds no number at all.
std::optional<FinalAnswer> extract_final_answer(std::string_view completion);

// A reference answer: the whole text (surrounding whitespace aside) must be one number ("72",
// "-3", "1,234.5", "$18", "3/4"); nullopt otherwise, or when it has no exact value.
std::optional<Rational> parse_answer(std::string_view text);

// 1.0 when the completion's final answer equals the reference, else 0.0. Throws lockstep::Error if
// the reference is not a number parse_answer accepts (datasets check this at load).
double answer_reward(std::string_view completion, std::string_view reference);

// Whether the completion gives a final answer at all (a metric: "answered, but wrong" vs "no answer").
bool answer_found(std::string_view completion);

}  // namespace lockstep
