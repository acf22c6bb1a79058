// tests/tasks/test_word_problems.cpp — the English word problems (tasks/word_problems.h): every
// answer recomputed by an interpreter of the stories written here, independently of the generator
// (its own pattern per sentence form); the promised operation counts, ranges and forms all occur;
// the worked solution is rewarded by the verifier; determinism, seeds and disjoint splits.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tasks/verifier.h"
#include "tasks/word_problems.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

using testing::expect_error;

// What the interpreter made of a problem.
struct Reading {
  int64_t value = 0;  // the answer the story implies
  int operations = 0;
  std::set<std::string> forms;  // the sentence forms met, by name
};

// Splits "A. B? C." into sentences (numbers here never hold a '.').
std::vector<std::string> sentences(const std::string& text) {
  std::vector<std::string> out;
  std::string current;
  for (char c : text) {
    current += c;
    if (c == '.' || c == '?') {
      out.push_back(current);
      current.clear();
    } else if (c == ' ' && current == " ") {
      current.clear();
    }
  }
  EXPECT_TRUE(current.empty()) << "text after the last sentence: " << current;
  return out;
}

int64_t to_int(const std::ssub_match& m) { return std::stoll(m.str()); }

// Reads the story sentence by sentence; ADD_FAILUREs (and returns what it has) on anything it does
// not know, on a value that leaves the promised ranges, or on inconsistent names and items.
Reading interpret(const std::string& prompt, int max_steps) {
  static const std::regex opening(R"(^(\w+) has (\d+) (\w+)\.$)");
  static const std::regex opening_boxes(R"(^(\w+) has (\d+) (boxes|bags|packs) of (\w+) with (\d+) in each (box|bag|pack)\.$)");
  static const std::regex more_boxes(R"(^(He|She) buys (\d+) more (boxes|bags|packs) of (\w+) with (\d+) in each (box|bag|pack)\.$)");
  static const std::regex gets_more(R"(^(He|She) (buys|finds) (\d+) more (\w+)\.$)");
  static const std::regex given_more(R"(^(His|Her) friend gives (him|her) (\d+) more (\w+)\.$)");
  static const std::regex gives_away(R"(^(He|She) gives (\d+) (\w+) to a friend\.$)");
  static const std::regex loses(R"(^(He|She) (loses|sells) (\d+) (\w+)\.$)");
  static const std::regex scales(R"(^Then (he|she) (doubles|triples) the number of (\w+) (he|she) has\.$)");
  static const std::regex shares(R"(^(He|She) shares them equally among (\d+) friends\.$)");
  static const std::regex packs(R"(^(He|She) puts them equally into (\d+) (boxes|bags|packs)\.$)");
  static const std::regex ask_total(R"(^How many (\w+) does (\w+) have now\?$)");
  static const std::regex ask_friend(R"(^How many (\w+) does each friend get\?$)");
  static const std::regex ask_box(R"(^How many (\w+) are in each (box|bag|pack)\?$)");
  static const std::map<std::string, std::string> plural = {{"box", "boxes"}, {"bag", "bags"}, {"pack", "packs"}};

  Reading r;
  std::vector<std::string> s = sentences(prompt);
  if (s.size() < 3) {
    ADD_FAILURE() << "too few sentences";
    return r;
  }
  EXPECT_EQ(s.back(), std::string(kWordProblemInstruction));
  const std::string question = s[s.size() - 2];
  s.resize(s.size() - 2);

  std::string name, items, container, pronoun;  // pronoun: "he" or "she", from the first use
  auto same = [](std::string& kept, const std::string& seen, const char* what) {
    if (kept.empty()) kept = seen;
    EXPECT_EQ(seen, kept) << what;
  };
  auto he = [&](std::string word) {
    for (char& c : word) c = char(std::tolower(c));
    same(pronoun, word == "his" || word == "him" || word == "he" ? "he" : "she", "pronoun");
  };
  // The item word of a count: singular for 1 ("1 apple", "1 candy": the one plural not made by an s).
  auto noun = [&](int64_t count, const std::string& word, const char* what) {
    std::string expected = items;
    if (count == 1) expected = items == "candies" ? "candy" : items.substr(0, items.size() - 1);
    EXPECT_EQ(word, expected) << what << " of " << count;
  };
  auto in_range = [](int64_t v, int64_t lo, int64_t hi, const char* what) {
    EXPECT_TRUE(v >= lo && v <= hi) << what << " " << v << " not in [" << lo << ", " << hi << "]";
  };
  bool divided = false;
  std::smatch m;
  for (size_t i = 0; i < s.size(); ++i) {
    const std::string& x = s[i];
    EXPECT_FALSE(divided) << "a sentence after the division: " << x;
    if (i == 0 && std::regex_match(x, m, opening_boxes)) {
      name = m[1];
      same(items, m[4], "items");
      EXPECT_EQ(plural.at(m[6]), m[3].str());
      container = m[6];
      in_range(to_int(m[2]), 2, 6, "boxes");
      in_range(to_int(m[5]), 2, 9, "items per box");
      r.value = to_int(m[2]) * to_int(m[5]);
      r.operations += 1;
      r.forms.insert("opening boxes");
    } else if (i == 0 && std::regex_match(x, m, opening)) {
      name = m[1];
      same(items, m[3], "items");
      r.value = to_int(m[2]);
      in_range(r.value, 2, 20, "opening");
      r.forms.insert("opening");
    } else if (i == 0) {
      ADD_FAILURE() << "unknown opening: " << x;
      return r;
    } else if (std::regex_match(x, m, more_boxes)) {
      he(m[1]);
      same(items, m[4], "items");
      same(container, m[6], "container");
      EXPECT_EQ(plural.at(m[6]), m[3].str());
      in_range(to_int(m[2]), 2, 6, "boxes");
      in_range(to_int(m[5]), 2, 9, "items per box");
      r.value += to_int(m[2]) * to_int(m[5]);
      r.operations += 2;
      r.forms.insert("more boxes");
    } else if (std::regex_match(x, m, gets_more)) {
      he(m[1]);
      noun(to_int(m[3]), m[4], "items");
      in_range(to_int(m[3]), 1, 20, "added");
      r.value += to_int(m[3]);
      r.operations += 1;
      r.forms.insert(m[2].str() + " more");
    } else if (std::regex_match(x, m, given_more)) {
      he(m[1]);
      he(m[2]);
      noun(to_int(m[3]), m[4], "items");
      in_range(to_int(m[3]), 1, 20, "added");
      r.value += to_int(m[3]);
      r.operations += 1;
      r.forms.insert("given more");
    } else if (std::regex_match(x, m, gives_away) || std::regex_match(x, m, loses)) {
      const bool gives = m.size() == 4;  // gives_away has three groups, loses four
      he(m[1]);
      const int64_t b = to_int(m[gives ? 2 : 3]);
      noun(b, m[gives ? 3 : 4], "items");
      in_range(b, 1, r.value - 1, "taken away");  // never all of them
      r.value -= b;
      r.operations += 1;
      r.forms.insert(gives ? "gives away" : m[2].str());
    } else if (std::regex_match(x, m, scales)) {
      he(m[1]);
      he(m[4]);
      same(items, m[3], "items");
      in_range(r.value, 1, 20, "doubled or tripled");
      r.value *= m[2] == "doubles" ? 2 : 3;
      r.operations += 1;
      r.forms.insert(m[2]);
    } else if (std::regex_match(x, m, shares) || std::regex_match(x, m, packs)) {
      he(m[1]);
      const bool packing = m.size() == 4;
      if (packing) same(container, [&] {
        for (const auto& [one, many] : plural)
          if (many == m[3]) return one;
        return std::string("?");
      }(), "container");
      const int64_t k = to_int(m[2]);
      in_range(k, 2, 6, "divisor");
      EXPECT_EQ(r.value % k, 0) << "inexact division of " << r.value << " by " << k;
      r.value /= k;
      r.operations += 1;
      divided = true;
      r.forms.insert(packing ? "packs" : "shares");
      // The question asks for a share.
      EXPECT_TRUE(std::regex_match(question, m, packing ? ask_box : ask_friend)) << question;
      if (packing) {
        EXPECT_EQ(m[2].str(), container);
      }
    } else {
      ADD_FAILURE() << "unknown sentence: " << x;
      return r;
    }
    EXPECT_GE(r.value, 1) << x;
  }
  if (!divided) {
    EXPECT_TRUE(std::regex_match(question, m, ask_total)) << question;
    EXPECT_EQ(m[2].str(), name);
  }
  EXPECT_EQ(m[1].str(), items) << question;
  EXPECT_GE(r.operations, 1);
  EXPECT_LE(r.operations, max_steps);
  return r;
}

TEST(WordProblems, AnswersAreCorrectAndEveryFormOccurs) {
  // The forms a story can take; with max_steps 1 every one but "more boxes" (two operations).
  const std::set<std::string> all_forms = {"opening", "opening boxes", "buys more", "finds more",
                                           "given more", "gives away", "loses", "sells", "doubles",
                                           "triples", "more boxes", "shares", "packs"};
  for (int max_steps = 1; max_steps <= kWordProblemMaxSteps; ++max_steps) {
    std::set<std::string> forms;
    std::map<int, int> operations;
    int64_t largest = 0;
    for (SyntheticSplit split : {SyntheticSplit::train, SyntheticSplit::held_out}) {
      for (uint64_t index = 0; index < 1500; ++index) {
        const Problem p = word_problem(11, max_steps, split, index);
        SCOPED_TRACE(p.prompt);
        const Reading r = interpret(p.prompt, max_steps);
        ASSERT_FALSE(::testing::Test::HasFailure());
        ASSERT_EQ(p.answer, std::to_string(r.value));
        forms.insert(r.forms.begin(), r.forms.end());
        ++operations[r.operations];
        largest = std::max(largest, r.value);
        // The worked solution gets the reward, as the bare answer does; the solution has one
        // equation per operation.
        EXPECT_EQ(answer_reward(p.solution, p.answer), 1.0) << p.solution;
        EXPECT_EQ(answer_reward(p.answer, p.answer), 1.0);
        EXPECT_EQ(int(std::count(p.solution.begin(), p.solution.end(), '=')), r.operations) << p.solution;
        EXPECT_TRUE(p.solution.ends_with("The answer is " + p.answer + ".")) << p.solution;
      }
    }
    EXPECT_LT(largest, 200);
    // Operation counts uniform over 1..max_steps: each at least half its share of 3000 problems.
    EXPECT_EQ(int(operations.size()), max_steps);
    for (const auto& [count, n] : operations) EXPECT_GT(n, 3000 / max_steps / 2) << count << " operations";
    std::set<std::string> expected = all_forms;
    if (max_steps == 1) expected.erase("more boxes");
    EXPECT_EQ(forms, expected) << "max_steps " << max_steps;
  }
}

TEST(WordProblems, AModelsAnswerInTheAskedFormIsRewarded) {
  const Problem p = word_problem(3, 3, SyntheticSplit::train, 0);
  EXPECT_EQ(answer_reward("Let me think step by step. " + p.solution, p.answer), 1.0);
  EXPECT_EQ(answer_reward("The final answer is " + p.answer, p.answer), 1.0);
  EXPECT_EQ(answer_reward("The final answer is " + std::to_string(std::stoll(p.answer) + 1), p.answer), 0.0);
}

TEST(WordProblems, DeterministicAndSeeded) {
  for (int max_steps = 1; max_steps <= kWordProblemMaxSteps; ++max_steps) {
    int same_as_other_seed = 0;
    for (uint64_t index = 0; index < 300; ++index) {
      const Problem a = word_problem(123, max_steps, SyntheticSplit::train, index);
      const Problem b = word_problem(123, max_steps, SyntheticSplit::train, index);
      EXPECT_EQ(a.prompt, b.prompt);
      EXPECT_EQ(a.answer, b.answer);
      EXPECT_EQ(a.solution, b.solution);
      same_as_other_seed += a.prompt == word_problem(124, max_steps, SyntheticSplit::train, index).prompt;
    }
    EXPECT_LT(same_as_other_seed, 5) << "max_steps " << max_steps;  // collisions by chance only
  }
  expect_error([] { word_problem(0, 0, SyntheticSplit::train, 0); }, {"max_steps must be 1..3, not 0"});
  expect_error([] { word_problem(0, 4, SyntheticSplit::train, 0); }, {"max_steps must be 1..3, not 4"});
}

TEST(WordProblems, TrainAndHeldOutAreDisjoint) {
  for (int max_steps = 1; max_steps <= kWordProblemMaxSteps; ++max_steps) {
    std::set<std::string> train, held_out;
    for (uint64_t seed : {1, 2}) {
      for (uint64_t index = 0; index < 10000; ++index)
        train.insert(word_problem(seed, max_steps, SyntheticSplit::train, index).prompt);
      for (uint64_t index = 0; index < 1500; ++index)
        held_out.insert(word_problem(seed, max_steps, SyntheticSplit::held_out, index).prompt);
    }
    for (const std::string& prompt : held_out) {
      ASSERT_EQ(train.count(prompt), 0u) << prompt;
      ASSERT_TRUE(is_held_out_text(prompt)) << prompt;
    }
    for (const std::string& prompt : train) ASSERT_FALSE(is_held_out_text(prompt)) << prompt;
    // Few repeats: a held-out set worth measuring on.
    EXPECT_GT(held_out.size(), 2000u) << "max_steps " << max_steps;
  }
}

}  // namespace
}  // namespace lockstep
