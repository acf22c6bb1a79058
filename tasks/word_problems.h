// tasks/word_problems.h — English arithmetic word problems for a small real model to learn
// (data.train / data.test = "word-problems"): problems from (seed, max_steps, split, index) alone,
// no files, like the synthetic task (tasks/synthetic.h), but in sentences a pretrained instruct
// model reads through its chat template.
//
// A problem is a short story about one person and one kind of item, one to `max_steps` arithmetic
// operations long (the count uniform), on small whole numbers, every intermediate value and the
// answer a whole number ≥ 1:
//   "Tom has 3 apples. He buys 5 more apples. How many apples does Tom have now?"      3 + 5
//   "Mia has 4 boxes of shells with 6 in each box. She loses 7 shells. ..."            4 * 6 - 7
//   "... Then he doubles the number of cards he has. ..."                              × 2 (or triples: × 3)
//   "... She shares them equally among 4 friends. How many stickers does each friend get?"   ÷ 4
// Operations: the opening amount (given, or boxes × items per box: one multiplication); adding
// (buys / finds / is given more); subtracting (gives away / loses / sells, never all of them);
// doubling or tripling; buying more boxes of a number each (a multiplication and an addition: two
// operations); and, as the last operation only, sharing or packing equally (an exact division).
// Operands: the opening 2–20 (boxes 2–6 of 2–9), added amounts 1–20, doubling or tripling only of
// at most 20, divisors 2–6; answers stay below 200.
//
// The prompt ends with kWordProblemInstruction, which asks for the answer as a number at the end
// (tasks/verifier.h reads the last number). Problem::solution is a worked answer, one equation per
// operation and then "The answer is N." — the SFT target.
//
// Splits: held out when tasks/synthetic.h's is_held_out_text says so (1 in 8 by a hash of the
// prompt, the same for every seed); each split draws until it gets one of its own, so train and
// held-out never share a problem, in any run.
#pragma once

#include <cstdint>
#include <string_view>

#include "tasks/dataset.h"
#include "tasks/synthetic.h"

namespace lockstep {

inline constexpr int kWordProblemMaxSteps = 3;
inline constexpr std::string_view kWordProblemInstruction = "Give the final answer as a number at the end.";

// Problem `index` of the split; the same for the same arguments on every machine. Throws
// lockstep::Error unless 1 <= max_steps <= kWordProblemMaxSteps.
Problem word_problem(uint64_t seed, int max_steps, SyntheticSplit split, uint64_t index);

}  // namespace lockstep
