// tests/fuzz/fuzz_verifier.cpp — the answer verifier (tasks/verifier.h) on arbitrary bytes: the
// input is a completion, then (after a 0 byte) a reference answer. Checks what the header promises:
// the answer is a view into the completion; values are in lowest terms with a positive
// denominator; the reward is 1 exactly when the two values are equal; a reference that parses is
// its own correct completion.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>
#include <string_view>

#include "core/error.h"
#include "tasks/verifier.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

__int128 gcd(__int128 a, __int128 b) {
  if (a < 0) a = -a;
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}

void check_value(const lockstep::Rational& value) {
  if (value.den <= 0) lockstep::fuzz::property_failed("a value with a denominator <= 0");
  if (gcd(value.num, value.den) != 1) lockstep::fuzz::property_failed("a value not in lowest terms");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::fuzz::property_failed;
  const std::vector<std::string_view> parts = lockstep::fuzz::split(data, size, '\0');
  const std::string_view completion = parts[0];
  const std::optional<lockstep::FinalAnswer> answer = lockstep::extract_final_answer(completion);
  if (lockstep::answer_found(completion) != answer.has_value())
    property_failed("answer_found disagrees with extract_final_answer");
  if (answer) {
    if (answer->text.empty() || answer->text.data() < completion.data() ||
        answer->text.data() + answer->text.size() > completion.data() + completion.size())
      property_failed("the answer text is not a part of the completion");
    if (answer->value) check_value(*answer->value);
  }
  const std::string_view reference = parts.size() > 1 ? parts[1] : completion;
  const std::optional<lockstep::Rational> expected = lockstep::parse_answer(reference);
  if (!expected) {
    try {
      (void)lockstep::answer_reward(completion, reference);
      property_failed("answer_reward accepted a reference that parse_answer refuses");
    } catch (const lockstep::Error&) {
    }
    return 0;
  }
  check_value(*expected);
  const double reward = lockstep::answer_reward(completion, reference);
  const bool equal = answer && answer->value && *answer->value == *expected;
  if (reward != (equal ? 1.0 : 0.0)) property_failed("the reward is not 1 exactly when the values are equal");
  if (lockstep::answer_reward(reference, reference) != 1.0) property_failed("a reference is not its own answer");
  return 0;
}
