// tasks/word_problems.cpp — the word problems' generator: a story is drawn operation by
// operation, keeping the running amount a whole number ≥ 1.
#include "tasks/word_problems.h"

#include <array>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/philox.h"

namespace lockstep {
namespace {

struct Person {
  std::string_view name, he, him, his;  // lower case; a sentence capitalizes its first letter
};
constexpr std::array<Person, 12> kPeople = {{
    {"Tom", "he", "him", "his"},   {"Anna", "she", "her", "her"}, {"Sam", "he", "him", "his"},
    {"Lily", "she", "her", "her"}, {"Ben", "he", "him", "his"},   {"Mia", "she", "her", "her"},
    {"Leo", "he", "him", "his"},   {"Emma", "she", "her", "her"}, {"Max", "he", "him", "his"},
    {"Zoe", "she", "her", "her"},  {"Jack", "he", "him", "his"},  {"Nora", "she", "her", "her"},
}};
struct Item {
  std::string_view one, many;
};
constexpr std::array<Item, 12> kItems = {{
    {"apple", "apples"},   {"marble", "marbles"}, {"sticker", "stickers"}, {"cookie", "cookies"},
    {"pencil", "pencils"}, {"book", "books"},     {"card", "cards"},       {"stamp", "stamps"},
    {"shell", "shells"},   {"balloon", "balloons"}, {"crayon", "crayons"}, {"candy", "candies"},
}};
struct Container {
  std::string_view one, many;
};
constexpr std::array<Container, 3> kContainers = {{{"box", "boxes"}, {"bag", "bags"}, {"pack", "packs"}}};

// Uniform in [0, n): the high word of word * n.
uint32_t below(uint32_t word, uint32_t n) { return uint32_t((uint64_t(word) * n) >> 32); }

// The random words of one candidate problem, drawn in order: Philox at (seed, stream + block, index).
class Draws {
 public:
  Draws(uint64_t seed, uint64_t stream, uint64_t index) : seed_(seed), stream_(stream), index_(index) {}
  // Uniform in [lo, hi].
  int64_t in(int64_t lo, int64_t hi) { return lo + int64_t(below(word(), uint32_t(hi - lo + 1))); }
  template <class T, size_t N>
  const T& pick(const std::array<T, N>& options) {
    return options[size_t(in(0, int64_t(N) - 1))];
  }

 private:
  uint32_t word() {
    if (used_ == 4) {
      block_ = philox_at(seed_, stream_ + blocks_++, index_);
      used_ = 0;
    }
    return block_.v[used_++];
  }
  uint64_t seed_, stream_, index_;
  uint64_t blocks_ = 0;
  Philox4 block_{};
  int used_ = 4;
};

std::string capitalized(std::string_view s) {
  std::string out(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = char(out[0] - 'a' + 'A');
  return out;
}

std::string num(int64_t v) { return std::to_string(v); }

// The story so far: its sentences, the worked equations and the running amount.
struct Story {
  std::string text, solution;
  int64_t amount = 0;

  void say(const std::string& sentence) { text += (text.empty() ? "" : " ") + sentence; }
  // One operation: "a op b = result." in the solution, and the amount becomes result.
  void apply(int64_t a, char op, int64_t b, int64_t result) {
    solution += num(a) + " " + op + " " + num(b) + " = " + num(result) + ". ";
    amount = result;
  }
};

// The divisors in [2, 6] that leave at least 1 each.
std::vector<int64_t> exact_divisors(int64_t amount) {
  std::vector<int64_t> out;
  for (int64_t k = 2; k <= 6 && k <= amount; ++k)
    if (amount % k == 0) out.push_back(k);
  return out;
}

Problem draw(uint64_t seed, int max_steps, SyntheticSplit split, uint64_t index, uint64_t attempt) {
  // A stream per (attempt, max_steps, split), with room for 2^16 blocks of words each; the tag keeps
  // it apart from the synthetic task's streams.
  const uint64_t stream = 0x5750ull << 48 | attempt << 20 | uint64_t(max_steps) << 17 |
                          uint64_t(split == SyntheticSplit::held_out) << 16;
  Draws r(seed, stream, index);
  const Person& p = r.pick(kPeople);
  const Item& item = r.pick(kItems);
  const std::string items(item.many);
  auto noun = [&](int64_t n) { return std::string(n == 1 ? item.one : item.many); };  // 1 apple, 2 apples
  const Container& box = r.pick(kContainers);
  const std::string He = capitalized(p.he), His = capitalized(p.his);
  int steps = int(r.in(1, max_steps));

  Story s;
  if (r.in(0, 2) == 0) {  // the opening amount as boxes × items per box: one operation
    const int64_t boxes = r.in(2, 6), each = r.in(2, 9);
    s.say(std::string(p.name) + " has " + num(boxes) + " " + std::string(box.many) + " of " +
          items + " with " + num(each) + " in each " + std::string(box.one) + ".");
    s.apply(boxes, '*', each, boxes * each);
    --steps;
  } else {
    s.amount = r.in(2, 20);
    s.say(std::string(p.name) + " has " + num(s.amount) + " " + items + ".");
  }

  std::string question = "How many " + items + " does " + std::string(p.name) + " have now?";
  while (steps > 0) {
    const int64_t before = s.amount;
    const std::vector<int64_t> divisors = exact_divisors(before);
    // The last operation may be a division (when one is exact); two operations may be more boxes.
    enum Kind { add, subtract, scale, more_boxes, share };
    std::vector<Kind> kinds = {add, add, subtract, subtract};
    if (before <= 20) kinds.push_back(scale);
    if (steps >= 2) kinds.push_back(more_boxes);
    if (steps == 1 && !divisors.empty()) kinds.insert(kinds.end(), {share, share});
    if (before < 2) kinds = {add};  // nothing to take away from 1
    switch (kinds[size_t(r.in(0, int64_t(kinds.size()) - 1))]) {
      case add: {
        const int64_t b = r.in(1, 20);
        const std::string sentences[] = {
            He + " buys " + num(b) + " more " + noun(b) + ".",
            He + " finds " + num(b) + " more " + noun(b) + ".",
            His + " friend gives " + std::string(p.him) + " " + num(b) + " more " + noun(b) + ".",
        };
        s.say(sentences[r.in(0, 2)]);
        s.apply(before, '+', b, before + b);
        --steps;
        break;
      }
      case subtract: {
        const int64_t b = r.in(1, before - 1);
        const std::string sentences[] = {
            He + " gives " + num(b) + " " + noun(b) + " to a friend.",
            He + " loses " + num(b) + " " + noun(b) + ".",
            He + " sells " + num(b) + " " + noun(b) + ".",
        };
        s.say(sentences[r.in(0, 2)]);
        s.apply(before, '-', b, before - b);
        --steps;
        break;
      }
      case scale: {
        const int64_t factor = r.in(2, 3);
        s.say("Then " + std::string(p.he) + (factor == 2 ? " doubles" : " triples") + " the number of " +
              items + " " + std::string(p.he) + " has.");
        s.apply(before, '*', factor, before * factor);
        --steps;
        break;
      }
      case more_boxes: {
        const int64_t boxes = r.in(2, 6), each = r.in(2, 9);
        s.say(He + " buys " + num(boxes) + " more " + std::string(box.many) + " of " + items +
              " with " + num(each) + " in each " + std::string(box.one) + ".");
        s.apply(boxes, '*', each, boxes * each);
        s.apply(before, '+', boxes * each, before + boxes * each);
        steps -= 2;
        break;
      }
      case share: {
        const int64_t k = divisors[size_t(r.in(0, int64_t(divisors.size()) - 1))];
        if (r.in(0, 1) == 0) {
          s.say(He + " shares them equally among " + num(k) + " friends.");
          question = "How many " + items + " does each friend get?";
        } else {
          s.say(He + " puts them equally into " + num(k) + " " + std::string(box.many) + ".");
          question = "How many " + items + " are in each " + std::string(box.one) + "?";
        }
        s.apply(before, '/', k, before / k);
        --steps;
        break;
      }
    }
  }
  Problem problem;
  problem.prompt = s.text + " " + question + " " + std::string(kWordProblemInstruction);
  problem.answer = num(s.amount);
  problem.solution = s.solution + "The answer is " + problem.answer + ".";
  return problem;
}

}  // namespace

Problem word_problem(uint64_t seed, int max_steps, SyntheticSplit split, uint64_t index) {
  LOCKSTEP_CHECK(max_steps >= 1 && max_steps <= kWordProblemMaxSteps, "word_problem: max_steps must be 1..",
                 kWordProblemMaxSteps, ", not ", max_steps);
  return draw_in_split(split, [&](uint64_t attempt) { return draw(seed, max_steps, split, index, attempt); });
}

}  // namespace lockstep
