// The Jinja engine (io/jinja.h), one construct at a time: each template of
// tests/data/chat_jinja_cases.json rendered exactly as transformers' jinja2 environment rendered it
// (scripts/dev/gen_chat_fixtures.py), the errors jinja2 raises raised here too, and the constructs outside
// the subset refused with an error naming them and their line.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "io/jinja.h"
#include "io_test_helpers.h"
#include "tokenizer_test_data.h"

namespace lockstep {
namespace {

using ojson = nlohmann::ordered_json;

const ojson& jinja_cases() {
  static const ojson data = testing::read_ordered_json_file(testing::kTestData / "chat_jinja_cases.json");
  return data;
}

std::string render(std::string_view source, const ojson& variables = ojson::object()) {
  return JinjaTemplate(source, "test.jinja").render(variables, testing::fixture_clock());
}

TEST(Jinja, RendersAsJinja2) {
  ASSERT_GE(jinja_cases()["cases"].size(), 35u);
  int rendered = 0;
  for (const ojson& c : jinja_cases()["cases"]) {
    if (!c.contains("text")) continue;
    const std::string source = c["template"].get<std::string>();
    std::string text;
    try {
      text = render(source, c["variables"]);
    } catch (const Error& e) {
      ADD_FAILURE() << "template " << ojson(source).dump() << " failed: " << e.what();
      continue;
    }
    EXPECT_EQ(text, c["text"].get<std::string>()) << "template " << ojson(source).dump();
    ++rendered;
  }
  EXPECT_GE(rendered, 30);
}

TEST(Jinja, FailsWhereJinja2Fails) {
  int checked = 0;
  for (const ojson& c : jinja_cases()["cases"]) {
    if (!c.contains("error")) continue;
    // jinja2's "UndefinedError: 'x' is undefined": the part after the exception's type.
    const std::string error = c["error"].get<std::string>();
    const std::string message = error.substr(error.find(": ") + 2);
    const std::string source = c["template"].get<std::string>();
    testing::expect_error([&] { render(source, c["variables"]); }, {"test.jinja:1: ", message});
    ++checked;
  }
  EXPECT_GE(checked, 7);
}

// A template that is not UTF-8 is read one code point per byte, so 0x85 and 0xa0 are U+0085 and
// U+00A0, Python whitespace, which `-` strips. Stripping counted each such byte as its two-byte
// UTF-8 encoding and stepped past the end of the source (heap-buffer-overflow found by
// tests/fuzz/fuzz_jinja.cpp).
TEST(Jinja, WhitespaceControlOnTextThatIsNotUtf8) {
  EXPECT_EQ(render("a\x85\xa0{#- c -#}\x85\x85\x85\x85" "b\xff"), "ab\xff");
  EXPECT_EQ(render("{%- if true -%}\x85\x85\x85{%- endif -%}\x85\x85\x85"), "");
  EXPECT_EQ(render("x\xff \n  {% if true %}y{% endif %}"), "x\xff \ny");
}

// Integers are 64-bit (Python's are unbounded): a result that does not fit is an error, not signed
// overflow (undefined behaviour found by tests/fuzz/fuzz_jinja.cpp: `2 ** 78`); `**` takes log2 of
// the exponent's steps, so a huge exponent ends at once.
TEST(Jinja, IntegerOverflowIsAnError) {
  using testing::expect_error;
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ 3 ** 3 }} {{ (-2) ** 3 }} {{ 7 // -1 }} {{ -7 // 2 }} {{ -7 % 2 }} {{ 5 % -1 }}"),
            "4611686018427387904 27 -8 -7 -4 1 0");
  expect_error([] { render("{{ 2 ** 78 }}"); }, {"test.jinja:1:", "integer overflow"});
  expect_error([] { render("{{ 2 ** 1000000000000000000 }}"); }, {"integer overflow"});
  expect_error([] { render("{{ 9223372036854775807 + 1 }}"); }, {"integer overflow"});
  expect_error([] { render("{{ -9223372036854775807 - 2 }}"); }, {"integer overflow"});
  expect_error([] { render("{{ 4294967296 * 4294967296 }}"); }, {"integer overflow"});
}

// A macro that calls itself without end is an error, not a stack overflow (found by
// tests/fuzz/fuzz_jinja.cpp); recursion that ends works.
TEST(Jinja, EndlessMacroRecursionIsAnError) {
  testing::expect_error([] { render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"); },
                        {"macro 'f': more than 100 macro calls deep"});
  EXPECT_EQ(render("{% macro count(n) %}{% if n > 0 %}{{ n }}{{ count(n - 1) }}{% endif %}{% endmacro %}{{ count(5) }}"),
            "54321");
}

// Parsing and rendering recurse once per level of nesting: a template nested without bound
// overflowed the stack ({{ ++++…, found by fuzz_jinja on a 16-core machine). Each way of nesting stops
// at 100 levels; macro calls stacking their bodies' nesting stop at 400 in all.
// A namespace is the one mutable value; one that held itself would be a reference cycle (leaked,
// and printed without end: the fuzzers found both). jinja2 would store it; here the assignment
// fails, naming the line.
TEST(Jinja, ANamespaceCannotHoldItself) {
  const char* cycles[] = {
      "{% set ns = namespace(s='') %}\n{% set ns.s = ns %}{{ ns.s }}",
      "{% set ns = namespace(s='') %}\n{% set ns.s = ns, 1 %}",
      "{% set ns = namespace(s='') %}\n{% set ns.s = [{'k': [ns]}] %}",
      "{% set a = namespace(x=0) %}{% set b = namespace(a=a) %}\n{% set a.x = b %}",
  };
  for (const char* source : cycles) {
    SCOPED_TRACE(source);
    testing::expect_error([&] { render(source); }, {"test.jinja:2:", "holds", "itself"});
  }
  // Another namespace, and a value sharing its parts 2^40 ways, are stored (each part walked once).
  EXPECT_EQ(render("{% set a = namespace(x=0) %}{% set b = namespace(y=7) %}{% set a.x = b %}{{ a.x.y }}"), "7");
  EXPECT_EQ(render("{% set ns = namespace(v=[1]) %}{% for i in range(40) %}{% set ns.v = [ns.v, ns.v] %}"
                   "{% endfor %}{{ ns.v | length }}"),
            "2");
}

TEST(Jinja, DeepNestingIsAnError) {
  using testing::expect_error;
  const auto repeat = [](std::string_view s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  const std::string too_deep = "expression nested more than 100 deep";
  expect_error([&] { render("\n{{" + repeat("+", 1000) + "1 }}"); }, {"test.jinja:2: ", too_deep});
  expect_error([&] { render("{{ 1" + repeat(" + 1", 1000) + " }}"); }, {"test.jinja:1: ", too_deep});
  expect_error([&] { render("{{ " + repeat("(", 1000) + "1" + repeat(")", 1000) + " }}"); }, {too_deep});
  expect_error([&] { render("{{ " + repeat("[", 1000) + repeat("]", 1000) + " }}"); }, {too_deep});
  expect_error([&] { render("{{ " + repeat("not ", 1000) + "x }}"); }, {too_deep});
  expect_error([&] { render("{{ x" + repeat("|string", 1000) + " }}"); }, {too_deep});
  expect_error([&] { render("{{ x" + repeat(".a", 1000) + " }}"); }, {too_deep});
  expect_error([&] { render("{{ f" + repeat("()", 1000) + " }}"); }, {too_deep});
  expect_error([&] { render(repeat("{% if true %}", 1000) + repeat("{% endif %}", 1000)); },
               {"test.jinja:1: ", "statement blocks nested more than 100 deep"});
  expect_error([&] { render("{% macro f(n) %}{{ " + repeat("-(", 45) + "f(n)" + repeat(")", 45) +
                            " }}{% endmacro %}{{ f(1) }}"); },
               {"test.jinja:1: ", "statements and expressions nested more than 400 deep through macro calls"});
  // 100 levels of each are fine.
  EXPECT_EQ(render("{{ " + repeat("- ", 99) + "1 }}"), "-1");
  expect_error([&] { render("{{ " + repeat("- ", 100) + "1 }}"); }, {too_deep});
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 99) + " }}"), "100");
  EXPECT_EQ(render("{{ " + repeat("(", 99) + "1" + repeat(")", 99) + " }}"), "1");
  EXPECT_EQ(render(repeat("{% if true %}", 100) + "x" + repeat("{% endif %}", 100)), "x");
}

TEST(Jinja, UnsupportedConstructsNameThemselvesAndTheirLine) {
  using testing::expect_error;
  expect_error([] { render("line one\n{% include 'other.jinja' %}"); },
               {"test.jinja:2:", "'{% include %}' statement is not supported"});
  expect_error([] { render("{% for x in xs recursive %}{% endfor %}"); }, {"test.jinja:1:", "recursive"});
  expect_error([] { render("\n\n{{ x | wordwrap(5) }}"); }, {"test.jinja:3:", "unknown filter 'wordwrap'"});
  expect_error([] { render("{% if x is prime %}{% endif %}"); }, {"test.jinja:1:", "unknown test 'prime'"});
  expect_error([] { render("{% frobnicate %}"); }, {"test.jinja:1:", "unknown statement '{% frobnicate %}'"});
  expect_error([] { render("{{ 'a'.zfill(3) }}"); }, {"test.jinja:1:", "str.zfill() is not supported"});
  expect_error([] { render("{{ {'a': 1}.update({}) }}"); }, {"test.jinja:1:", "dict.update() is not supported"});
  expect_error([] { render("{{ 'a'.no_such_method() }}"); },
               {"test.jinja:1:", "'str object' has no attribute 'no_such_method'"});
  expect_error([] { render("{% set xs = [] %}\n{{ xs.append(1) }}"); },
               {"test.jinja:2:", "list.append() is not allowed"});
  expect_error([] { render("{% if true %}never closed"); }, {"test.jinja", "expected 'elif' or 'else' or 'endif'"});
  expect_error([] { render("{{ 'unterminated }}"); }, {"test.jinja:1:", "unterminated string literal"});
  expect_error([] { render("{{ 1 +* 2 }}"); }, {"test.jinja:1:", "unexpected '*'"});
  expect_error([] { render("{% set x = 1 %}{% set x.y = 2 %}"); }, {"not a namespace() object"});
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessage) {
  testing::expect_error([] { render("a\nb\n{{ raise_exception('Only user and assistant roles!') }}"); },
                        {"test.jinja:3: ", "Only user and assistant roles!"});
}

TEST(Jinja, StrftimeNowUsesTheGivenClockElseNow) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "07 Mar 2025");
  // Without a clock: this machine's local date, as datetime.now() gives it.
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char expected[32];
  std::strftime(expected, sizeof expected, "%Y-%m-%d", &local);
  EXPECT_EQ(JinjaTemplate("{{ strftime_now('%Y-%m-%d') }}", "t").render(ojson::object()), expected);
}

TEST(Jinja, KeepsTheCallersKeyOrder) {
  const ojson vars = ojson::parse(R"({"d": {"zeta": 1, "alpha": 2, "mid": 3}})");
  EXPECT_EQ(render("{% for k in d %}{{ k }} {% endfor %}{{ d | tojson }}", vars),
            "zeta alpha mid {\"zeta\": 1, \"alpha\": 2, \"mid\": 3}");
}

}  // namespace
}  // namespace lockstep
