// tasks/synthetic.h — the built-in arithmetic task: problems from (seed, level, split, index) alone,
// no files, for the default job (a tiny model trained from scratch: SFT, then GRPO), and the tiny
// tokenizer its texts need.
//
// Prompts are expressions ending in '=', answers the exact integer result: "12+7=" -> "19".
// Operands have a number of digits drawn uniformly first, so short numbers are as common as long ones
// (an easy start inside every level). Levels, a curriculum:
//   1  a+b           a, b: 1-2 digits                      (answers 0..198)
//   2  a+b or a-b    a, b: 1-3 digits, a-b with a >= b     (answers 0..1998)
//   3  a*b+c, a*b-c, c+a*b, c-a*b   a, b: 1 digit, c: 1-2 digits; '*' first   (answers -99..180)
//
// Splits: whether a problem is held out is a fixed hash of its prompt text (1 in 8 held out), the
// same for every seed and level; each split draws (Philox, keyed by the seed, countered by split,
// level and index) until it gets one of its own. So train and held-out never share a problem, in
// any run, and a model trained with one seed has never seen another seed's held-out problems either.
// Within a split, problems may repeat (level 1 has 10,000 distinct ones).
//
// The tokenizer: byte-level BPE without merges whose first ids are the task's characters, one token
// each, and the end token: '0'-'9' -> 0-9, '+' 10, '-' 11, '*' 12, '=' 13, "<|endoftext|>" 14 (eos
// and pad). io/'s loader requires a token for each of the 256 bytes, so the other 242 bytes follow
// as ids 15..256 (Tokenizer::vocab_size() is 257); the task's texts only ever use ids below
// kSyntheticVocabSize, so a model for it needs only that many embedding and LM-head rows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "tasks/dataset.h"

namespace lockstep {

inline constexpr int kSyntheticLevels = 3;
inline constexpr std::string_view kSyntheticEos = "<|endoftext|>";
inline constexpr int32_t kSyntheticVocabSize = 15;
// The characters of the task's texts, in id order (ids 0..13); the end token takes id 14.
inline constexpr std::string_view kSyntheticChars = "0123456789+-*=";

enum class SyntheticSplit { train, held_out };

// Whether a problem with this prompt text is held out: 1 in 8 texts, by a fixed hash (the same for
// every seed; the word problems of tasks/word_problems.h split by it too).
bool is_held_out_text(std::string_view prompt);

// The first of draw(0), draw(1), ... whose prompt belongs to `split` by is_held_out_text: how both
// generated tasks keep their splits apart (8/7 draws on average for train, 8 for held-out; it ends
// with probability 1).
Problem draw_in_split(SyntheticSplit split, const std::function<Problem(uint64_t attempt)>& draw);

// Problem `index` of the split; the same for the same arguments on every machine. Throws
// lockstep::Error unless 1 <= level <= kSyntheticLevels.
Problem synthetic_problem(uint64_t seed, int level, SyntheticSplit split, uint64_t index);

// What SFT trains the model to generate after the prompt: the answer, then the end token.
std::string synthetic_sft_target(const Problem& problem);

// Throws lockstep::Error when `text` has a character outside kSyntheticChars (which a model of
// kSyntheticVocabSize tokens cannot read): the message names `what` (e.g. "generate.prompt"), the
// first such character and its position, and the characters accepted.
void check_synthetic_text(std::string_view text, std::string_view what);

// Writes dir/tokenizer.json and dir/tokenizer_config.json (eos and pad "<|endoftext|>"), creating
// dir if needed, for Tokenizer::from_dir(dir) (io/ loads tokenizers from files only).
void write_synthetic_tokenizer(const std::filesystem::path& dir);

}  // namespace lockstep
