// tasks/: JSONL problem loading (fixtures, the real GSM8K test set when present, one error per kind
// of bad line with file:line, skip-and-count), the answer verifier on hand-written completions, and
// the synthetic arithmetic task (determinism, disjoint splits, answers checked by an independent
// evaluator, tokenizer round trips). Every comparison is exact: the verifier works on exact
// rationals and the task on integers, so no tolerance is needed anywhere.
#include <gtest/gtest.h>

#include <cctype>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/tokenizer.h"
#include "tasks/dataset.h"
#include "tasks/synthetic.h"
#include "tasks/verifier.h"
#include "tests/io/io_test_helpers.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_bytes;

const std::filesystem::path kTestData = std::filesystem::path(LOCKSTEP_TEST_DATA) / "tasks";
const std::filesystem::path kSharedData = LOCKSTEP_SHARED_DATA;

// --- datasets ------------------------------------------------------------------------------------

TEST(Dataset, LoadsGsm8kFixture) {
  const LoadedProblems loaded = load_problems(kTestData / "gsm8k_small.jsonl", DatasetFormat::gsm8k);
  ASSERT_EQ(loaded.problems.size(), 4u);  // the blank line is not a problem
  EXPECT_EQ(loaded.skipped_lines, 0u);
  EXPECT_EQ(loaded.problems[0].prompt, "Janet has 16 eggs and eats 3. How many are left?");
  EXPECT_EQ(loaded.problems[0].answer, "13");
  EXPECT_EQ(loaded.problems[1].answer, "200,000");  // as written; extra field "id" ignored
  EXPECT_EQ(loaded.problems[2].answer, "-3");       // surrounding spaces trimmed
  EXPECT_EQ(loaded.problems[3].answer, "8");        // "\r\n" line end
  EXPECT_EQ(answer_reward("so it is 200000", loaded.problems[1].answer), 1.0);
}

TEST(Dataset, LoadsPromptAnswerFixture) {
  const LoadedProblems loaded = load_problems(kTestData / "prompt_answer_small.jsonl", DatasetFormat::prompt_answer);
  ASSERT_EQ(loaded.problems.size(), 3u);  // the whitespace-only line is blank
  EXPECT_EQ(loaded.problems[0].prompt, "12+7=");
  EXPECT_EQ(loaded.problems[0].answer, "19");
  EXPECT_EQ(loaded.problems[1].answer, "3/4");
  EXPECT_EQ(loaded.problems[2].answer, "$1,234.50");  // trimmed
}

// data.format = "auto": the first non-blank line's fields decide, whatever the file is called.
TEST(Dataset, DetectsTheLayoutFromTheFirstLine) {
  const LoadedProblems gsm8k = load_problems(kTestData / "gsm8k_small.jsonl", DatasetFormat::detect);
  ASSERT_EQ(gsm8k.problems.size(), 4u);
  EXPECT_EQ(gsm8k.problems[1].answer, "200,000");  // the text after "####": read as gsm8k
  const LoadedProblems plain = load_problems(kTestData / "prompt_answer_small.jsonl", DatasetFormat::detect);
  ASSERT_EQ(plain.problems.size(), 3u);
  EXPECT_EQ(plain.problems[1].answer, "3/4");

  TempDir dir;
  const std::string renamed = dir.file("problems.jsonl");
  write_bytes(renamed, "\n" R"({"question": "q?", "answer": "so 2\n#### 2"})" "\n");
  EXPECT_EQ(load_problems(renamed, DatasetFormat::detect).problems[0].answer, "2");
  const std::string neither = dir.file("neither.jsonl");
  write_bytes(neither, "\n" R"({"text": "q?", "answer": "2"})" "\n");
  expect_error([&] { load_problems(neither, DatasetFormat::detect); },
               {neither + ":2: cannot tell the layout", "neither \"question\" (gsm8k) nor \"prompt\""});
  const std::string not_json = dir.file("not_json.jsonl");
  write_bytes(not_json, "question,answer\n");
  expect_error([&] { load_problems(not_json, DatasetFormat::detect); },
               {not_json + ":1: cannot tell the layout", "not a JSON object"});
}

TEST(Dataset, SkipsAndCountsBadLines) {
  const std::filesystem::path path = kTestData / "prompt_answer_mixed_bad.jsonl";
  const LoadedProblems loaded = load_problems(path, DatasetFormat::prompt_answer, BadLines::skip);
  ASSERT_EQ(loaded.problems.size(), 3u);
  EXPECT_EQ(loaded.skipped_lines, 5u);
  EXPECT_EQ(loaded.problems[0].prompt, "1+1=");
  EXPECT_EQ(loaded.problems[1].prompt, "4+4=");
  EXPECT_EQ(loaded.problems[2].prompt, "7+7=");
  // Without skipping, the first bad line (2) is the error.
  expect_error([&] { load_problems(path, DatasetFormat::prompt_answer); },
               {path.string() + ":2: invalid JSON"});
}

struct BadLineCase {
  DatasetFormat format;
  std::string line;
  std::string message;
};

TEST(Dataset, EveryBadLineNamesFileAndLine) {
  const std::string good_gsm8k = R"({"question": "q?", "answer": "1+1=2\n#### 2"})";
  const std::string good_plain = R"({"prompt": "1+1=", "answer": "2"})";
  const std::vector<BadLineCase> cases = {
      {DatasetFormat::gsm8k, R"({"question": "q?", "answer": "#### 2")", "invalid JSON"},
      {DatasetFormat::gsm8k, R"({"question": "q?", "answer": "#### 2"} trailing)", "invalid JSON"},
      // A number beyond a double is nlohmann's out_of_range, not its parse_error (found by fuzz_dataset).
      {DatasetFormat::gsm8k, R"({"question": 8e888888, "answer": "#### 2"})", "invalid JSON: [json.exception.out_of_range.406] number overflow"},
      {DatasetFormat::prompt_answer, R"({"prompt": "q?", "answer": "2", "x": -1e400})", "invalid JSON: [json.exception.out_of_range.406]"},
      {DatasetFormat::gsm8k, "{\"question\": \"q\xff\", \"answer\": \"#### 2\"}", "invalid UTF-8: byte 0xFF at column 16"},
      {DatasetFormat::gsm8k, R"(["q?", "#### 2"])", "expected a JSON object, not array"},
      {DatasetFormat::gsm8k, R"("just text")", "expected a JSON object, not string"},
      {DatasetFormat::gsm8k, R"({"answer": "#### 2"})", "field \"question\" is missing"},
      {DatasetFormat::gsm8k, R"({"question": "q?"})", "field \"answer\" is missing"},
      {DatasetFormat::gsm8k, R"({"question": 3, "answer": "#### 2"})", "field \"question\" must be a string, not number"},
      {DatasetFormat::gsm8k, R"({"question": "q?", "answer": 2})", "field \"answer\" must be a string, not number"},
      {DatasetFormat::gsm8k, R"({"question": null, "answer": "#### 2"})", "field \"question\" must be a string, not null"},
      {DatasetFormat::gsm8k, R"({"question": "  ", "answer": "#### 2"})", "field \"question\" is empty"},
      {DatasetFormat::gsm8k, R"({"question": "q?", "answer": "it is 2"})", "has no \"#### <number>\""},
      {DatasetFormat::gsm8k, R"({"question": "q?", "answer": "#### two"})", "after \"####\" must be a number, not \"two\""},
      {DatasetFormat::gsm8k, R"({"question": "q?", "answer": "#### "})", "after \"####\" must be a number, not \"\""},
      {DatasetFormat::gsm8k, R"({"question": "q?", "answer": "#### 2 apples"})", "must be a number, not \"2 apples\""},
      {DatasetFormat::gsm8k, R"({"prompt": "q?", "answer": "2"})", "field \"question\" is missing"},
      {DatasetFormat::prompt_answer, R"({"prompt": "q?", "answer": "2")", "invalid JSON"},
      {DatasetFormat::prompt_answer, R"(42)", "expected a JSON object, not number"},
      {DatasetFormat::prompt_answer, R"({"answer": "2"})", "field \"prompt\" is missing"},
      {DatasetFormat::prompt_answer, R"({"prompt": "q?"})", "field \"answer\" is missing"},
      {DatasetFormat::prompt_answer, R"({"prompt": ["q?"], "answer": "2"})", "field \"prompt\" must be a string, not array"},
      {DatasetFormat::prompt_answer, R"({"prompt": "q?", "answer": 2})", "field \"answer\" must be a string, not number"},
      {DatasetFormat::prompt_answer, R"({"prompt": "", "answer": "2"})", "field \"prompt\" is empty"},
      {DatasetFormat::prompt_answer, R"({"prompt": "q?", "answer": ""})", "field \"answer\" is empty"},
      {DatasetFormat::prompt_answer, R"({"prompt": "q?", "answer": "two"})", "field \"answer\" must be a number"},
      {DatasetFormat::prompt_answer, R"({"prompt": "q?", "answer": "1/0"})", "field \"answer\" must be a number"},
      {DatasetFormat::prompt_answer, R"({"question": "q?", "answer": "#### 2"})", "field \"prompt\" is missing"},
  };
  TempDir dir;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].line);
    const std::string path = dir.file("case" + std::to_string(i) + ".jsonl");
    const std::string& good = cases[i].format == DatasetFormat::gsm8k ? good_gsm8k : good_plain;
    // Lines 1 and 3 good, 2 blank, 4 bad, 5 good: the error must say line 4.
    write_bytes(path, good + "\n\n" + good + "\n" + cases[i].line + "\n" + good + "\n");
    expect_error([&] { load_problems(path, cases[i].format); }, {path + ":4: ", cases[i].message});
    const LoadedProblems loaded = load_problems(path, cases[i].format, BadLines::skip);
    EXPECT_EQ(loaded.problems.size(), 3u);
    EXPECT_EQ(loaded.skipped_lines, 1u);
  }
}

// Windows-written files (a byte order mark, CRLF line ends), invalid UTF-8 anywhere in a line, and
// very long lines: loaded, or one error naming file:line.
TEST(Dataset, ByteOrderMarkCrlfInvalidUtf8AndLongLines) {
  TempDir dir;
  const std::string windows = dir.file("windows.jsonl");
  write_bytes(windows, "\xEF\xBB\xBF{\"prompt\": \"a?\", \"answer\": \"1\"}\r\n\r\n"
                       "{\"prompt\": \"b?\", \"answer\": \"2\"}\r\n");
  for (DatasetFormat format : {DatasetFormat::prompt_answer, DatasetFormat::detect}) {
    const LoadedProblems loaded = load_problems(windows, format);
    ASSERT_EQ(loaded.problems.size(), 2u);
    EXPECT_EQ(loaded.problems[0].prompt, "a?");
    EXPECT_EQ(loaded.problems[1].answer, "2");
  }
  const std::string gsm8k = dir.file("gsm8k_crlf.jsonl");
  write_bytes(gsm8k, "\xEF\xBB\xBF{\"question\": \"q?\", \"answer\": \"so\\n#### 7\"}\r\n");
  EXPECT_EQ(load_problems(gsm8k, DatasetFormat::detect).problems.at(0).answer, "7");

  // Invalid UTF-8 outside a string, inside one, and on the first line (where the layout is read).
  const std::string good = "{\"prompt\": \"a?\", \"answer\": \"1\"}\n";
  const std::string bad_outside = dir.file("bad_outside.jsonl");
  write_bytes(bad_outside, good + "{\"prompt\": \"b?\", \"answer\": \"2\"}\xC3\n");
  expect_error([&] { load_problems(bad_outside, DatasetFormat::prompt_answer); },
               {bad_outside + ":2: invalid UTF-8: byte 0xC3 at column 32"});
  EXPECT_EQ(load_problems(bad_outside, DatasetFormat::prompt_answer, BadLines::skip).skipped_lines, 1u);
  const std::string bad_first = dir.file("bad_first.jsonl");
  write_bytes(bad_first, "{\"prompt\": \"\xED\xA0\x80\", \"answer\": \"1\"}\n" + good);  // a surrogate
  expect_error([&] { load_problems(bad_first, DatasetFormat::detect); },
               {bad_first + ":1: invalid UTF-8: byte 0xED at column 13"});

  // A 4 MB prompt loads whole; a 4 MB line that is bad gives a message of a few hundred bytes.
  const std::string long_prompt(4 << 20, 'x');
  const std::string long_file = dir.file("long.jsonl");
  write_bytes(long_file, good + "{\"prompt\": \"" + long_prompt + "\", \"answer\": \"3\"}\n");
  const LoadedProblems loaded = load_problems(long_file, DatasetFormat::prompt_answer);
  ASSERT_EQ(loaded.problems.size(), 2u);
  EXPECT_EQ(loaded.problems[1].prompt, long_prompt);
  const std::string long_bad = dir.file("long_bad.jsonl");
  write_bytes(long_bad, good + "{\"prompt\": \"" + long_prompt + "\n");
  try {
    load_problems(long_bad, DatasetFormat::prompt_answer);
    ADD_FAILURE() << "no error for an unterminated 4 MB line";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.starts_with(long_bad + ":2: invalid JSON")) << message.substr(0, 400);
    EXPECT_LT(message.size(), 1000u);
  }
}

TEST(Dataset, FileErrors) {
  TempDir dir;
  const std::string empty = dir.file("empty.jsonl");
  write_bytes(empty, "");
  expect_error([&] { load_problems(empty, DatasetFormat::gsm8k); }, {empty, "no problems", "empty"});
  expect_error([&] { load_problems(empty, DatasetFormat::gsm8k, BadLines::skip); }, {empty, "empty"});
  const std::string blank = dir.file("blank.jsonl");
  write_bytes(blank, "\n  \n\r\n");
  expect_error([&] { load_problems(blank, DatasetFormat::prompt_answer); }, {blank, "empty"});
  const std::string all_bad = dir.file("all_bad.jsonl");
  write_bytes(all_bad, "{\n[\n");
  expect_error([&] { load_problems(all_bad, DatasetFormat::prompt_answer, BadLines::skip); },
               {all_bad, "no problems", "2 skipped"});
  const std::string missing = dir.file("missing.jsonl");
  expect_error([&] { load_problems(missing, DatasetFormat::gsm8k); }, {"dataset", missing});
}

TEST(Dataset, LoadsRealGsm8kTest) {
  const std::filesystem::path path = kSharedData / "gsm8k" / "test.jsonl";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data absent: " << path;
  const LoadedProblems loaded = load_problems(path, DatasetFormat::gsm8k);
  ASSERT_EQ(loaded.problems.size(), 1319u);
  EXPECT_EQ(loaded.problems[0].answer, "18");
  // The reference solutions themselves (with their <<16-3-4=9>> calculator notes) earn reward 1:
  // the verifier takes the number after "####", not the last or first number of the reasoning.
  std::ifstream file(path);
  std::string line;
  for (const Problem& problem : loaded.problems) {
    ASSERT_TRUE(std::getline(file, line));
    const std::string solution = nlohmann::json::parse(line).at("answer").get<std::string>();
    ASSERT_EQ(answer_reward(solution, problem.answer), 1.0) << solution;
  }
}

// --- verifier ------------------------------------------------------------------------------------

struct VerifierCase {
  std::string completion;
  std::string reference;
  bool correct;
};

TEST(Verifier, Cases) {
  const std::vector<VerifierCase> cases = {
      // GSM8K style: "####" wins over everything else in the text.
      {"Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18", "18", true},
      {"Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 17", "18", false},
      {"#### 1,000.00", "1000", true},
      {"####1000", "1,000", true},
      {"#### $18", "18", true},
      {"#### -3", "-3", true},
      {"#### -3", "3", false},
      {"#### 42 and then 7 more, 9", "42", true},
      {"#### 18 dollars", "18", true},
      {"#### 5\n#### 6", "5", true},  // the first "####"
      {"####\n\n  12", "12", true},
      {"#### eighteen. So the answer is 18.", "18", true},  // "####" without a number: last number
      {"##### 7", "7", true},
      {"#### 7 but \\boxed{8}", "7", true},
      // \boxed{}: the last one holding a number.
      {"So the answer is \\boxed{18}.", "18", true},
      {"First \\boxed{18}, rechecking: \\boxed{20}", "20", true},
      {"\\boxed{\\frac{3}{4}}", "0.75", true},
      {"\\boxed{\\dfrac{1}{3}}", "2/6", true},
      {"\\boxed{-\\frac{1}{2}}", "-0.5", true},
      {"\\boxed{\\$1,234}", "1234", true},
      {"\\boxed{x = 5}", "5", true},
      {"\\boxed{x = -5}", "-5", true},
      {"\\boxed{5} and then 7 more words 9", "5", true},
      {"\\boxed{\\text{18 dollars}}", "18", true},
      {"\\boxed{7} then \\boxed{} and the answer is 4", "7", true},
      {"\\boxed{12", "12", true},  // unclosed: no box, the last number
      {"\\boxed{\\boxed{7}}", "7", true},
      {"\\boxed{a \\boxed{b} c} so 9", "9", true},  // nested boxes without a number: the last number
      // Two numbers in one box: an answer with no value (math-verify reads a set, or an expression
      // it would evaluate; neither equals the first number).
      {"\\boxed{3, 5}", "3", false},
      {"\\boxed{3 or 5}", "5", false},
      {"\\boxed{16-3}", "16", false},
      {"\\boxed{16-3}", "13", false},
      {"\\boxed{3} but then \\boxed{3, 5}", "3", false},  // the last box holding a number
      // Thousands separators: groups of exactly three.
      {"The total is 1,234 apples.", "1234", true},
      {"The total is 1,234,567.", "1234567", true},
      {"We have 1,2,3", "3", true},
      {"We have 12,34", "1234", false},
      {"We have 1234,567", "1234567", false},
      // Units, currency, percent.
      {"She earns 18 dollars.", "18", true},
      {"It takes 5 hours", "5", true},
      {"The price is $4.50.", "4.5", true},
      {"It is 25%.", "25", true},
      {"It is 25%.", "0.25", false},
      // Fractions and decimals, exactly.
      {"She ate 3/4 of the pie", "0.75", true},
      {"0.75", "3/4", true},
      {"2/4", "1/2", true},
      {"1/3", "0.333333", false},
      {"0.1", "1/10", true},
      {"0.30000000000000004", "0.3", false},
      {"It is .5 of it", "0.5", true},
      {"5/0", "5", false},  // found, but has no value
      // Trailing zeros.
      {"18.0", "18", true},
      {"18.00", "18", true},
      {"18.50", "18.5", true},
      {"answer: 007", "7", true},
      {"The answer is 18.", "18", true},
      // Signs.
      {"The temperature is -5 degrees", "-5", true},
      {"16-3", "3", true},
      {"16-3", "-3", false},
      {"x = \u22127", "-7", true},
      {"a loss of $-5", "-5", true},
      {"a loss of -$5", "-5", true},
      {"(2)-5", "5", true},
      // A minus right after a letter is binary: "x-5" is 5, not -5 (so is "\\boxed{x-5}").
      {"The value is x-5", "5", true},
      {"The value is x-5", "-5", false},
      {"\\boxed{x-5}", "-5", false},
      {"\\boxed{x-5}", "5", true},
      // Distractors: the last number counts.
      {"First 3, then 4 and finally 5", "5", true},
      {"First 3, then 4 and finally 5", "3", false},
      {"Step 1: 2+2=4. Step 2: 4*3=12. The answer is 12.", "12", true},
      {"The answer is 12. Checked in 2 steps.", "12", false},
      // Big but exact (30 digits fit a 128-bit numerator).
      {"123456789012345678901234567890", "123456789012345678901234567890", true},
      {"123456789012345678901234567890", "123456789012345678901234567891", false},
      // No number at all.
      {"I don't know.", "0", false},
      {"", "0", false},
  };
  for (const VerifierCase& c : cases) {
    EXPECT_EQ(answer_reward(c.completion, c.reference), c.correct ? 1.0 : 0.0)
        << "completion '" << c.completion << "', reference '" << c.reference << "'";
  }
}

TEST(Verifier, ExtractsTheAnswerAsWritten) {
  const auto text = [](std::string_view completion) {
    const std::optional<FinalAnswer> answer = extract_final_answer(completion);
    return answer ? std::string(answer->text) : std::string("<none>");
  };
  EXPECT_EQ(text("#### $1,000.00 total"), "$1,000.00");
  EXPECT_EQ(text("so \\boxed{\\frac{3}{4}}."), "\\frac{3}{4}");
  EXPECT_EQ(text("it is 25%"), "25");
  EXPECT_EQ(text("we get -12.5 dollars"), "-12.5");
  EXPECT_EQ(text("we get 16-3"), "3");
  EXPECT_EQ(text("3.2.5"), "5");  // ".5" right after a digit is not a number start
  EXPECT_EQ(text("so x-5"), "5");
  EXPECT_EQ(text("\\boxed{3, 5}"), "3, 5");  // the whole box, with no value
  EXPECT_FALSE(extract_final_answer("\\boxed{3, 5}")->value.has_value());
  EXPECT_EQ(text("\\boxed{ 1,234 }"), "1,234");  // one number with thousands separators

  EXPECT_EQ(parse_answer("1,000.00"), parse_answer("1000"));
  EXPECT_EQ(parse_answer("\\frac{6}{8}"), (Rational{3, 4}));
  EXPECT_EQ(parse_answer("-0.125"), (Rational{-1, 8}));
  EXPECT_FALSE(parse_answer("").has_value());
  EXPECT_FALSE(parse_answer("18 dollars").has_value());  // a reference is one number, nothing else
}

TEST(Verifier, AnswerFound) {
  EXPECT_TRUE(answer_found("#### 5"));
  EXPECT_TRUE(answer_found("maybe 3 or so"));
  EXPECT_TRUE(answer_found("5/0"));  // an answer, though it equals nothing
  EXPECT_FALSE(answer_found(""));
  EXPECT_FALSE(answer_found("I don't know."));
  EXPECT_FALSE(answer_found("#### "));
  EXPECT_FALSE(answer_found("\\boxed{}"));
  EXPECT_FALSE(answer_found("- $ . , / \\frac{}{} #### -"));  // number starts without digits
}

// Many unclosed "\\boxed{" (and deeply nested boxes without a number) take linear time: when each
// box was scanned forward for its '}', 400 KB took 19.5 s, so these 700 KB would take about a
// minute; linear is about 0.1 s, so three seconds is a wide bound. The time is this thread's CPU
// time, not the wall clock's: on a loaded machine (CI's shared cores) the wall time of the
// sanitized build's run reached 12 s while its CPU time stayed a few seconds. AddressSanitizer with
// libFuzzer's coverage hooks (the sanitized build) slows it several-fold: there the bound is 12 s,
// still well under the quadratic minute.
#if defined(__SANITIZE_ADDRESS__)
constexpr double kVerifierSlowdown = 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr double kVerifierSlowdown = 4;
#else
constexpr double kVerifierSlowdown = 1;
#endif
#else
constexpr double kVerifierSlowdown = 1;
#endif
TEST(Verifier, LinearOnRepeatedAndNestedBoxes) {
  constexpr size_t kCopies = 100'000;  // 7 bytes each: 700 KB
  std::string unclosed;
  for (size_t i = 0; i < kCopies; ++i) unclosed += "\\boxed{";
  std::string nested = unclosed + std::string(kCopies, '}');
  unclosed += "\\boxed{12} and 4";
  nested += " so 9";
  const auto thread_cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  const double start = thread_cpu_seconds();
  EXPECT_EQ(answer_reward(unclosed, "12"), 1.0);
  EXPECT_EQ(answer_reward(nested, "9"), 1.0);
  EXPECT_EQ(answer_reward("\\boxed{" + nested + "}", "9"), 1.0);  // one box around them all
  EXPECT_LT(thread_cpu_seconds() - start, 3.0 * kVerifierSlowdown);
}

TEST(Verifier, NumbersTooLongForExactValuesEqualNothing) {
  const std::string huge(45, '9');
  const std::string completion = "#### " + huge;
  const std::optional<FinalAnswer> answer = extract_final_answer(completion);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->text, huge);
  EXPECT_FALSE(answer->value.has_value());
  EXPECT_EQ(answer_reward(completion, "9"), 0.0);
  // Zeros after the point change nothing, however many.
  EXPECT_EQ(answer_reward("#### 7." + std::string(60, '0'), "7"), 1.0);
}

TEST(Verifier, ReferenceMustBeANumber) {
  expect_error([] { answer_reward("#### 5", "five"); }, {"reference answer 'five'", "not a number"});
}

// --- synthetic arithmetic ------------------------------------------------------------------------

// An independent evaluator: integers joined by + - *, '*' binding tighter; the digit counts of the
// operands are returned for the range checks.
int64_t evaluate(std::string_view expression, std::vector<std::string>* operands, std::string* ops) {
  std::vector<int64_t> terms;  // signed products, summed at the end
  int64_t sign = 1, product = 1;
  size_t i = 0;
  while (true) {
    size_t j = i;
    while (j < expression.size() && std::isdigit(static_cast<unsigned char>(expression[j]))) ++j;
    EXPECT_GT(j, i) << "no operand at " << i << " in " << expression;
    if (j == i) return 0;
    operands->emplace_back(expression.substr(i, j - i));
    product *= std::stoll(operands->back());
    if (j == expression.size() || expression[j] != '*') {
      terms.push_back(sign * product);
      product = 1;
    }
    if (j == expression.size()) break;
    ops->push_back(expression[j]);
    if (expression[j] == '-') sign = -1;
    if (expression[j] == '+') sign = 1;
    i = j + 1;
  }
  int64_t sum = 0;
  for (int64_t t : terms) sum += t;
  return sum;
}

TEST(Synthetic, AnswersAreCorrectAndInRange) {
  for (int level = 1; level <= kSyntheticLevels; ++level) {
    std::set<std::string> shapes;
    for (SyntheticSplit split : {SyntheticSplit::train, SyntheticSplit::held_out}) {
      for (uint64_t index = 0; index < 3000; ++index) {
        const Problem p = synthetic_problem(7, level, split, index);
        SCOPED_TRACE(p.prompt);
        ASSERT_TRUE(p.prompt.ends_with("="));
        std::vector<std::string> operands;
        std::string ops;
        const int64_t value = evaluate(std::string_view(p.prompt).substr(0, p.prompt.size() - 1), &operands, &ops);
        ASSERT_EQ(p.answer, std::to_string(value));
        for (const std::string& operand : operands) ASSERT_TRUE(operand == "0" || operand[0] != '0');
        std::string shape = ops;  // e.g. "*+" or "+*": which operations, in which order
        if (level == 1) {
          ASSERT_EQ(ops, "+");
          for (const std::string& operand : operands) ASSERT_LE(operand.size(), 2u);
        } else if (level == 2) {
          ASSERT_TRUE(ops == "+" || ops == "-");
          for (const std::string& operand : operands) ASSERT_LE(operand.size(), 3u);
          ASSERT_GE(value, 0);
        } else {
          ASSERT_EQ(ops.size(), 2u);
          ASSERT_NE(ops.find('*'), std::string::npos);
          const size_t star = ops.find('*');  // the factors are 1 digit, the addend 1-2
          ASSERT_EQ(operands[star].size(), 1u);
          ASSERT_EQ(operands[star + 1].size(), 1u);
          ASSERT_LE(operands[star == 0 ? 2 : 0].size(), 2u);
        }
        for (const std::string& operand : operands) shape += std::to_string(operand.size());
        shapes.insert(shape);
        EXPECT_EQ(answer_reward(p.answer, p.answer), 1.0);
      }
    }
    // Every shape the level promises occurs: level 1: + with 1/2-digit operands (4 shapes);
    // level 2: + with 1-3 digits (9), - with the first at least as long (6); level 3: 4 forms x 2
    // addend lengths (8).
    const size_t expected[] = {4, 15, 8};
    EXPECT_EQ(shapes.size(), expected[level - 1]) << "level " << level;
  }
}

TEST(Synthetic, DeterministicAndSeeded) {
  for (int level = 1; level <= kSyntheticLevels; ++level) {
    int same_as_other_seed = 0;
    for (uint64_t index = 0; index < 200; ++index) {
      const Problem a = synthetic_problem(123, level, SyntheticSplit::train, index);
      const Problem b = synthetic_problem(123, level, SyntheticSplit::train, index);
      EXPECT_EQ(a.prompt, b.prompt);
      EXPECT_EQ(a.answer, b.answer);
      same_as_other_seed += a.prompt == synthetic_problem(124, level, SyntheticSplit::train, index).prompt;
    }
    EXPECT_LT(same_as_other_seed, 20) << "level " << level;  // collisions by chance only
  }
  // Fixed values: a change to the generator shows here (and changes every experiment's data).
  EXPECT_EQ(synthetic_problem(0, 1, SyntheticSplit::train, 2).prompt, "53+90=");
  EXPECT_EQ(synthetic_problem(0, 1, SyntheticSplit::held_out, 0).prompt, "1+88=");
  EXPECT_EQ(synthetic_problem(0, 2, SyntheticSplit::train, 1).prompt, "4+853=");
  EXPECT_EQ(synthetic_problem(0, 2, SyntheticSplit::held_out, 2).prompt, "71-51=");
  EXPECT_EQ(synthetic_problem(0, 3, SyntheticSplit::train, 0).prompt, "0*6-89=");
  EXPECT_EQ(synthetic_problem(0, 3, SyntheticSplit::held_out, 1).prompt, "5*8-48=");
  expect_error([] { synthetic_problem(0, 0, SyntheticSplit::train, 0); }, {"level must be 1..3, not 0"});
  expect_error([] { synthetic_problem(0, 4, SyntheticSplit::train, 0); }, {"level must be 1..3, not 4"});
}

TEST(Synthetic, TrainAndHeldOutAreDisjoint) {
  for (int level = 1; level <= kSyntheticLevels; ++level) {
    std::set<std::string> train, held_out;
    for (uint64_t seed : {1, 2}) {
      for (uint64_t index = 0; index < 20000; ++index)
        train.insert(synthetic_problem(seed, level, SyntheticSplit::train, index).prompt);
      for (uint64_t index = 0; index < 3000; ++index)
        held_out.insert(synthetic_problem(seed, level, SyntheticSplit::held_out, index).prompt);
    }
    for (const std::string& prompt : held_out) ASSERT_EQ(train.count(prompt), 0u) << prompt;
    EXPECT_GT(held_out.size(), 500u) << "level " << level;  // a held-out set worth measuring on
  }
}

TEST(Synthetic, TokenizerRoundTripsEveryProblem) {
  TempDir dir;
  write_synthetic_tokenizer(dir.path() / "tok");
  const Tokenizer tokenizer = Tokenizer::from_dir(dir.path() / "tok");
  EXPECT_EQ(tokenizer.vocab_size(), 257);
  const std::string chars = "0123456789+-*=";
  for (size_t i = 0; i < chars.size(); ++i) EXPECT_EQ(tokenizer.token_to_id(chars.substr(i, 1)), int32_t(i));
  ASSERT_EQ(tokenizer.eos_id(), kSyntheticVocabSize - 1);
  EXPECT_EQ(tokenizer.pad_id(), kSyntheticVocabSize - 1);
  EXPECT_FALSE(tokenizer.bos_id().has_value());
  EXPECT_TRUE(tokenizer.is_special(kSyntheticVocabSize - 1));
  EXPECT_EQ(tokenizer.token_to_id(kSyntheticEos), kSyntheticVocabSize - 1);
  for (int level = 1; level <= kSyntheticLevels; ++level) {
    for (SyntheticSplit split : {SyntheticSplit::train, SyntheticSplit::held_out}) {
      for (uint64_t index = 0; index < 1000; ++index) {
        const Problem p = synthetic_problem(5, level, split, index);
        const std::string text = p.prompt + synthetic_sft_target(p);
        const std::vector<int32_t> ids = tokenizer.encode(text);
        // One token per character, then the end token; all below kSyntheticVocabSize.
        ASSERT_EQ(ids.size(), p.prompt.size() + p.answer.size() + 1) << text;
        ASSERT_EQ(ids.back(), kSyntheticVocabSize - 1) << text;
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < kSyntheticVocabSize) << text;
        ASSERT_EQ(tokenizer.decode(ids), text);
        const std::vector<int32_t> answer_ids(ids.end() - std::ptrdiff_t(p.answer.size() + 1), ids.end());
        ASSERT_EQ(answer_reward(tokenizer.decode(answer_ids, /*skip_special_tokens=*/true), p.answer), 1.0);
      }
    }
  }
}

}  // namespace
}  // namespace lockstep
