// io/tokenizer_bpe.cpp — byte-level map and BPE merges.
#include "io/tokenizer_bpe.h"

#include <cstdio>
#include <queue>

#include "core/error.h"

namespace lockstep {
namespace {

std::string utf8_of(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += char(c);
  } else {  // the map only uses code points below U+0800
    s += char(0xC0 | (c >> 6));
    s += char(0x80 | (c & 0x3F));
  }
  return s;
}

// bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes (controls,
// space, 0x7F-0xA0, 0xAD) for U+0100, U+0101, ... in byte order.
struct ByteLevelMap {
  std::array<std::string, 256> char_of_byte;
  std::array<int16_t, 512> byte_of_char;
  ByteLevelMap() {
    byte_of_char.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? char32_t(b) : next++;
      char_of_byte[b] = utf8_of(c);
      byte_of_char[c] = int16_t(b);
    }
  }
};

const ByteLevelMap& byte_level_map() {
  static const ByteLevelMap map;
  return map;
}

// Pieces longer than this are not cached: they are rare and would bloat the cache.
constexpr size_t kMaxCachedPieceBytes = 256;
constexpr size_t kMaxCachedPieces = 1 << 18;

}  // namespace

const std::string& byte_level_char(uint8_t b) { return byte_level_map().char_of_byte[b]; }

int byte_of_byte_level_char(char32_t c) { return c < 512 ? byte_level_map().byte_of_char[c] : -1; }

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(byte_level_char(uint8_t(b)));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto fallback = vocab_.find(name);
    fallback_ids_[b] = fallback == vocab_.end() ? -1 : fallback->second;
  }
  if (!options_.unk_token.empty()) {
    const auto it = vocab_.find(options_.unk_token);
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto left_it = vocab_.find(left);
    const auto right_it = vocab_.find(right);
    const auto merged_it = vocab_.find(left + right);
    LOCKSTEP_CHECK(left_it != vocab_.end(), "model.merges[", rank, "]: token '", left,
                   "' is not in model.vocab");
    LOCKSTEP_CHECK(right_it != vocab_.end(), "model.merges[", rank, "]: token '", right,
                   "' is not in model.vocab");
    LOCKSTEP_CHECK(merged_it != vocab_.end(), "model.merges[", rank, "]: merged token '", left + right,
                   "' is not in model.vocab");
    // A repeated pair keeps its last rank, as in HF (its merge map is built by insertion).
    merges_[pair_key(left_it->second, right_it->second)] = Merge{int32_t(rank), merged_it->second};
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (options_.byte_level && piece.size() == 1 && byte_ids_[static_cast<unsigned char>(piece[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  std::string key;
  if (cacheable) {
    key.assign(piece);
    std::lock_guard lock(cache_mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bool whole = false;
  if (options_.ignore_merges) {
    std::string spelling;
    if (options_.byte_level) {
      for (char b : piece) spelling += byte_level_char(static_cast<unsigned char>(b));
    } else {
      spelling.assign(piece);
    }
    const auto it = vocab_.find(spelling);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) merge_word(piece, out);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kMaxCachedPieces) cache_.clear();
    cache_.emplace(std::move(key), std::vector<int32_t>(out.begin() + std::ptrdiff_t(first), out.end()));
  }
}

int32_t BpeModel::unit_id(std::string_view unit) const {
  if (options_.byte_level) return byte_ids_[static_cast<unsigned char>(unit[0])];
  const auto it = vocab_.find(std::string(unit));
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::merge_word(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  int32_t pending_unk = -1;  // HF holds an unknown back to fuse it with the next one
  for (size_t pos = 0; pos < piece.size();) {
    size_t length = 1;
    if (!options_.byte_level) {
      const auto lead = static_cast<unsigned char>(piece[pos]);
      length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    }
    const std::string_view unit = piece.substr(pos, length);
    pos += length;
    const int32_t id = unit_id(unit);
    if (id >= 0) {
      if (pending_unk >= 0) symbols.push_back(pending_unk);
      pending_unk = -1;
      symbols.push_back(id);
      continue;
    }
    // The unit's spelling in the vocab, whose bytes byte_fallback looks up.
    const std::string spelling = options_.byte_level ? byte_level_char(static_cast<unsigned char>(unit[0]))
                                                     : std::string(unit);
    if (options_.byte_fallback) {
      bool all = true;
      for (char b : spelling) all = all && fallback_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all) {  // as in HF, a held-back unknown stays held back
        for (char b : spelling) symbols.push_back(fallback_ids_[static_cast<unsigned char>(b)]);
        continue;
      }
    }
    if (options_.unk_token.empty()) continue;  // no unk_token: HF drops the unit
    LOCKSTEP_CHECK(unk_id_ >= 0, "tokenizer: model.unk_token '", options_.unk_token,
                   "' is needed for a character the vocab lacks, and is not in model.vocab");
    if (pending_unk >= 0 && !options_.fuse_unk) symbols.push_back(pending_unk);
    pending_unk = unk_id_;
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);
  merge(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

// HF's Word::merge_all: repeatedly apply the lowest-rank merge available (leftmost on ties) over a
// linked list of symbols, with a heap of candidate pairs; entries made stale by an earlier merge are
// recognised and skipped when popped.
void BpeModel::merge(std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool removed;
  };
  struct Candidate {
    int32_t rank, pos, merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = int32_t(ids.size());
  if (n < 2) return;
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) symbols[size_t(i)] = {ids[size_t(i)], i - 1, i + 1 < n ? i + 1 : -1, false};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t pos) {
    const Symbol& left = symbols[size_t(pos)];
    if (left.next < 0) return;
    const auto it = merges_.find(pair_key(left.id, symbols[size_t(left.next)].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(top.pos)];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[size_t(left.next)];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;  // stale entry
    left.id = top.merged_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = symbols[size_t(i)].next) ids.push_back(symbols[size_t(i)].id);
}

}  // namespace lockstep
