// io/tokenizer.cpp — encode and decode; loading from JSON is in io/tokenizer_load.cpp.
#include "io/tokenizer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "io/tokenizer_impl.h"
#include "io/tokenizer_unicode.h"

namespace lockstep {

void AddedTokenMatcher::add(std::string pattern, const AddedToken* token) {
  if (pattern.empty()) return;  // HF ignores empty added tokens
  const uint8_t first = static_cast<uint8_t>(pattern[0]);
  entries_.push_back({std::move(pattern), token});
  auto& bucket = by_first_byte_[first];
  bucket.push_back(uint32_t(entries_.size() - 1));
  std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
    return entries_[a].pattern.size() > entries_[b].pattern.size();
  });
}

const AddedTokenMatcher::Entry* AddedTokenMatcher::longest_match_at(std::string_view text, size_t pos) const {
  for (uint32_t index : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
    const std::string& pattern = entries_[index].pattern;
    if (text.size() - pos >= pattern.size() &&
        std::memcmp(text.data() + pos, pattern.data(), pattern.size()) == 0)
      return &entries_[index];
  }
  return nullptr;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextPiece>& out) const {
  size_t start_offset = 0;  // where the text not yet handed out begins
  size_t search = 0;        // where the next match may begin
  while (search < text.size()) {
    const Entry* found = nullptr;
    size_t start = search;
    while (start < text.size() && (found = longest_match_at(text, start)) == nullptr) ++start;
    if (found == nullptr) break;
    size_t stop = start + found->pattern.size();
    search = stop;  // as HF: the search resumes after the match itself, whatever is stripped
    const AddedToken& token = *found->token;
    int length = 0;
    if (token.single_word) {
      const bool word_before =
          start > 0 && unicode::is_word_char(unicode::code_point_before(text, start, &length));
      const bool word_after =
          stop < text.size() && unicode::is_word_char(unicode::code_point_at(text, stop, &length));
      if (word_before || word_after) continue;  // part of a longer word: not this token
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0 && unicode::is_white_space(unicode::code_point_before(text, new_start, &length)))
        new_start -= size_t(length);
      start = std::max(new_start, start_offset);  // never eat into an earlier piece
    }
    if (token.rstrip) {
      while (stop < text.size() && unicode::is_white_space(unicode::code_point_at(text, stop, &length)))
        stop += size_t(length);
    }
    if (start_offset < start) out.push_back({text.substr(start_offset, start - start_offset), -1});
    out.push_back({text.substr(start, stop - start), token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1});
}

void Tokenizer::Impl::encode_stretch(std::string_view text, bool at_text_start,
                                     std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  thread_local std::vector<std::string_view> pieces;
  pieces.clear();
  pre_tokenizer.split(text, at_text_start, pieces);
  for (std::string_view piece : pieces) bpe->encode_piece(piece, ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const size_t bad = unicode::find_invalid_utf8(text);
  LOCKSTEP_CHECK(bad == std::string_view::npos, "Tokenizer::encode: the text is not valid UTF-8 (byte ", bad,
                 " of ", text.size(), ")");
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + im.prefix_ids.size() + im.suffix_ids.size() + 4);
  if (add_special_tokens) ids = im.prefix_ids;

  std::vector<TextPiece> raw_pieces, normalized_pieces;
  if (im.raw_matcher.empty()) {
    raw_pieces.push_back({text, -1});
  } else {
    im.raw_matcher.split(text, raw_pieces);
  }
  std::string normalized;
  for (const TextPiece& raw : raw_pieces) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    // Metaspace's prepend_scheme "first" asks whether a piece begins the text.
    const bool raw_at_start = raw.text.data() == text.data();
    std::string_view body = raw.text;
    if (!im.normalizer.empty()) {
      normalized = im.normalizer.normalize(body);
      body = normalized;
    }
    if (im.normalized_matcher.empty()) {
      im.encode_stretch(body, raw_at_start, ids);
      continue;
    }
    normalized_pieces.clear();
    im.normalized_matcher.split(body, normalized_pieces);
    for (const TextPiece& piece : normalized_pieces) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
      } else {
        im.encode_stretch(piece.text, raw_at_start && piece.text.data() == body.data(), ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), im.suffix_ids.begin(), im.suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  auto wanted = [&](int32_t id) {
    return id >= 0 && size_t(id) < im.known_id.size() && im.known_id[size_t(id)] &&
           !(skip_special_tokens && im.special_id[size_t(id)]);
  };
  if (im.decoder->byte_level_only()) {  // each token's bytes on their own
    std::string text;
    for (int32_t id : ids)
      if (wanted(id)) text += im.bytes_of_id[size_t(id)];
    return text;
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids)
    if (wanted(id)) tokens.push_back(im.decoder_input(id));
  return im.decoder->decode(std::move(tokens));
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->bpe->vocab().find(key); it != impl_->bpe->vocab().end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->known_id[size_t(id)]) return std::nullopt;
  return impl_->token_of_id[size_t(id)];
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->known_id.size()); }

bool Tokenizer::decodes_piecewise() const { return impl_->decoder->byte_level_only(); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special_id[size_t(id)];
}

std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

}  // namespace lockstep
