// tasks/synthetic.cpp — the arithmetic task's generator and tokenizer files.
#include "tasks/synthetic.h"

#include <nlohmann/json.hpp>
#include <system_error>

#include "core/error.h"
#include "core/philox.h"
#include "io/file_io.h"
#include "io/tokenizer_bpe.h"

namespace lockstep {
namespace {

constexpr std::string_view kChars = kSyntheticChars;
static_assert(kChars.size() + 1 == size_t(kSyntheticVocabSize));

// Uniform in [0, n): the high word of word * n (bias below n / 2^32, far under anything measurable).
uint32_t below(uint32_t word, uint32_t n) { return uint32_t((uint64_t(word) * n) >> 32); }

// A number with 1..max_digits digits, the count uniform, then the value uniform among those.
int64_t operand(uint32_t digits_word, uint32_t value_word, int max_digits) {
  const uint32_t digits = 1 + below(digits_word, uint32_t(max_digits));
  uint32_t high = 10;
  for (uint32_t d = 1; d < digits; ++d) high *= 10;
  const uint32_t low = digits == 1 ? 0 : high / 10;
  return int64_t(low + below(value_word, high - low));
}

std::string text_of(int64_t a, char op, int64_t b) { return std::to_string(a) + op + std::to_string(b); }

// One candidate problem: eight random words decide it.
Problem draw(uint64_t seed, int level, SyntheticSplit split, uint64_t index, uint64_t attempt) {
  const uint64_t stream = attempt << 4 | uint64_t(level) << 2 | uint64_t(split == SyntheticSplit::held_out) << 1;
  const Philox4 r0 = philox_at(seed, stream, index), r1 = philox_at(seed, stream | 1, index);
  const uint32_t w[8] = {r0.v[0], r0.v[1], r0.v[2], r0.v[3], r1.v[0], r1.v[1], r1.v[2], r1.v[3]};
  if (level == 1) {
    const int64_t a = operand(w[0], w[1], 2), b = operand(w[2], w[3], 2);
    return {text_of(a, '+', b) + "=", std::to_string(a + b)};
  }
  if (level == 2) {
    int64_t a = operand(w[0], w[1], 3), b = operand(w[2], w[3], 3);
    if (below(w[4], 2) == 0) return {text_of(a, '+', b) + "=", std::to_string(a + b)};
    if (a < b) std::swap(a, b);
    return {text_of(a, '-', b) + "=", std::to_string(a - b)};
  }
  const int64_t a = operand(w[0], w[1], 1), b = operand(w[2], w[3], 1), c = operand(w[4], w[5], 2);
  const std::string product = text_of(a, '*', b);
  switch (below(w[6], 4)) {
    case 0: return {product + "+" + std::to_string(c) + "=", std::to_string(a * b + c)};
    case 1: return {product + "-" + std::to_string(c) + "=", std::to_string(a * b - c)};
    case 2: return {std::to_string(c) + "+" + product + "=", std::to_string(c + a * b)};
    default: return {std::to_string(c) + "-" + product + "=", std::to_string(c - a * b)};
  }
}

std::string tokenizer_json() {
  using ordered_json = nlohmann::ordered_json;
  ordered_json vocab = ordered_json::object();
  int32_t next_id = 0;
  for (char c : kChars) vocab[byte_level_char(uint8_t(c))] = next_id++;
  // The end token is in the vocab too (as GPT-2's is): HF gives an added token that the vocab lacks
  // the next id after the vocab's, whatever the file says, and the ids must agree with HF's.
  const int32_t eos_id = next_id++;
  vocab[std::string(kSyntheticEos)] = eos_id;
  for (int b = 0; b < 256; ++b)
    if (kChars.find(char(b)) == std::string_view::npos) vocab[byte_level_char(uint8_t(b))] = next_id++;

  const ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  const ordered_json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", ordered_json::array({ordered_json{{"id", eos_id}, {"content", kSyntheticEos},
                                                       {"single_word", false}, {"lstrip", false},
                                                       {"rstrip", false}, {"normalized", false},
                                                       {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", nullptr},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", false}, {"vocab", vocab}, {"merges", ordered_json::array()}}},
  };
  return root.dump(1) + "\n";
}

}  // namespace

// A hash of the text under a fixed key (the same for every seed).
bool is_held_out_text(std::string_view prompt) {
  uint64_t fnv = 0xCBF29CE484222325ull;  // FNV-1a, then Philox to mix it well
  for (char c : prompt) fnv = (fnv ^ uint8_t(c)) * 0x100000001B3ull;
  return below(philox_at(0x6F1D5EEDu, fnv, 0).v[0], 8) == 0;
}

Problem draw_in_split(SyntheticSplit split, const std::function<Problem(uint64_t attempt)>& draw) {
  for (uint64_t attempt = 0;; ++attempt) {
    Problem problem = draw(attempt);
    if (is_held_out_text(problem.prompt) == (split == SyntheticSplit::held_out)) return problem;
  }
}

Problem synthetic_problem(uint64_t seed, int level, SyntheticSplit split, uint64_t index) {
  LOCKSTEP_CHECK(level >= 1 && level <= kSyntheticLevels, "synthetic_problem: level must be 1..",
                 kSyntheticLevels, ", not ", level);
  return draw_in_split(split, [&](uint64_t attempt) { return draw(seed, level, split, index, attempt); });
}

std::string synthetic_sft_target(const Problem& problem) { return problem.answer + std::string(kSyntheticEos); }

void check_synthetic_text(std::string_view text, std::string_view what) {
  const size_t bad = text.find_first_not_of(kChars);
  if (bad == std::string_view::npos) return;
  // A byte of a multi-byte UTF-8 character is shown with the rest of that character.
  size_t end = bad + 1;
  while (end < text.size() && (uint8_t(text[end]) & 0xC0) == 0x80) ++end;
  fail(detail::concat(what, ": the builtin model reads only the characters ", kChars,
                      " (digits, + - * =), not '", text.substr(bad, end - bad), "' at position ",
                      bad, " of \"", text, "\""));
}

void write_synthetic_tokenizer(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  LOCKSTEP_CHECK(!error, "write_synthetic_tokenizer: cannot create the folder ", dir.string(), ": ",
                 error.message());
  write_file_atomically((dir / "tokenizer.json").string(), tokenizer_json());
  const nlohmann::ordered_json config = {
      {"bos_token", nullptr}, {"eos_token", kSyntheticEos}, {"pad_token", kSyntheticEos}};
  write_file_atomically((dir / "tokenizer_config.json").string(), config.dump(1) + "\n");
}

}  // namespace lockstep
