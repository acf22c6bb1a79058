// io/tokenizer_load.cpp — builds a Tokenizer from tokenizer.json (+ tokenizer_config.json),
// accepting the components of io/tokenizer.h and naming the field of anything else.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_impl.h"
#include "io/tokenizer_json.h"
#include "io/tokenizer_unicode.h"

namespace lockstep {
namespace {

using namespace tokenizer_json;

json read_json(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  LOCKSTEP_CHECK(file.good(), path.string(), ": cannot open the file (missing or unreadable)");
  std::stringstream text;
  text << file.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    fail(path.string() + ": invalid JSON: " + e.what());
  }
}

// --- components (the normalizer, pre-tokenizer and decoder parse themselves) ----------------------

// The post-processor's template for a single sequence: ids before and after the text's ids.
void load_post_processor(const json& post, const std::string& path, Tokenizer::Impl& im, int& templates) {
  const std::string type = type_of(post, path);
  if (type == "ByteLevel") return;  // it only adjusts offsets, never ids
  if (type == "Sequence") {
    const json& list = member(post, path, "processors");
    LOCKSTEP_CHECK(list.is_array(), field(path, "processors"), " must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      load_post_processor(list[i], field(field(path, "processors"), i), im, templates);
    return;
  }
  if (type != "TemplateProcessing")
    unsupported(field(path, "type"), "'" + type + "'", "ByteLevel, TemplateProcessing, Sequence, null");
  LOCKSTEP_CHECK(++templates == 1, path, ": more than one TemplateProcessing is not supported");
  const json& single = member(post, path, "single");
  const std::string single_path = field(path, "single");
  LOCKSTEP_CHECK(single.is_array(), single_path, " must be an array");
  const json& specials = member(post, path, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item_path = field(single_path, i);
    if (const json* sequence = optional_member(single[i], item_path, "Sequence")) {
      const std::string id =
          as_string(member(*sequence, field(item_path, "Sequence"), "id"), field(item_path, "Sequence.id"));
      LOCKSTEP_CHECK(id == "A" && !seen_sequence, item_path,
                     ": a single-sequence template must hold sequence A once");
      seen_sequence = true;
      continue;
    }
    const json& special = member(single[i], item_path, "SpecialToken");
    const std::string name = as_string(member(special, field(item_path, "SpecialToken"), "id"),
                                       field(item_path, "SpecialToken.id"));
    const std::string entry_path = field(field(path, "special_tokens"), name);
    const json& ids = member(member(specials, field(path, "special_tokens"), name), entry_path, "ids");
    LOCKSTEP_CHECK(ids.is_array(), field(entry_path, "ids"), " must be an array");
    auto& target = seen_sequence ? im.suffix_ids : im.prefix_ids;
    for (size_t k = 0; k < ids.size(); ++k)
      target.push_back(as_id(ids[k], field(field(entry_path, "ids"), k)));
  }
  LOCKSTEP_CHECK(seen_sequence, single_path, " has no {\"Sequence\": {\"id\": \"A\"}} item");
}

std::unique_ptr<BpeModel> load_model(const json& model, bool byte_level) {
  const std::string type = type_of(model, "model");
  if (type != "BPE") unsupported("model.type", "'" + type + "'", "BPE");
  if (const json* dropout = optional_member(model, "model", "dropout"))
    LOCKSTEP_CHECK(dropout->is_number() && dropout->get<double>() == 0.0,
                   "model.dropout must be null: BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* affix = optional_member(model, "model", key))
      LOCKSTEP_CHECK(as_string(*affix, field("model", key)).empty(), "model.", key,
                     " is not supported (it must be null or empty)");
  BpeOptions options;
  options.byte_level = byte_level;
  options.ignore_merges = bool_member(model, "model", "ignore_merges", false);
  options.byte_fallback = bool_member(model, "model", "byte_fallback", false);
  options.fuse_unk = bool_member(model, "model", "fuse_unk", false);
  if (const json* unk = optional_member(model, "model", "unk_token"))
    options.unk_token = as_string(*unk, "model.unk_token");

  const json& vocab_json = member(model, "model", "vocab");
  LOCKSTEP_CHECK(vocab_json.is_object(), "model.vocab must be an object mapping tokens to ids");
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items())
    vocab.emplace(token, as_id(id, "model.vocab[\"" + token + "\"]"));

  const json& merges_json = member(model, "model", "merges");
  LOCKSTEP_CHECK(merges_json.is_array(), "model.merges must be an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const json& merge = merges_json[i];
    const std::string path = field("model.merges", i);
    if (merge.is_string()) {  // legacy form "left right"
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      LOCKSTEP_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos, path,
                     " must be two tokens separated by one space, not '", text, "'");
      merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else {
      LOCKSTEP_CHECK(merge.is_array() && merge.size() == 2, path,
                     " must be a \"left right\" string or a 2-element array");
      merges.emplace_back(as_string(merge[0], field(path, 0)), as_string(merge[1], field(path, 1)));
    }
  }
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options));
}

void load_added_tokens(const json& list, Tokenizer::Impl& im) {
  LOCKSTEP_CHECK(list.is_array(), "added_tokens must be an array");
  im.added_tokens.reserve(list.size());  // the matchers keep pointers into it
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = field("added_tokens", i);
    AddedToken token;
    token.id = as_id(member(list[i], path, "id"), field(path, "id"));
    token.content = as_string(member(list[i], path, "content"), field(path, "content"));
    LOCKSTEP_CHECK(unicode::find_invalid_utf8(token.content) == std::string::npos, field(path, "content"),
                   " is not valid UTF-8");
    token.special = bool_member(list[i], path, "special", false);
    token.single_word = bool_member(list[i], path, "single_word", false);
    token.lstrip = bool_member(list[i], path, "lstrip", false);
    token.rstrip = bool_member(list[i], path, "rstrip", false);
    token.normalized = bool_member(list[i], path, "normalized", !token.special);
    im.added_tokens.push_back(std::move(token));
  }
  for (const AddedToken& token : im.added_tokens) {
    if (token.normalized) {
      im.normalized_matcher.add(im.normalizer.normalize(token.content), &token);
    } else {
      im.raw_matcher.add(token.content, &token);
    }
    im.added_ids[token.content] = token.id;
  }
}

void build_id_tables(Tokenizer::Impl& im) {
  int32_t max_id = -1;
  for (const auto& [token, id] : im.bpe->vocab()) max_id = std::max(max_id, id);
  for (const AddedToken& token : im.added_tokens) max_id = std::max(max_id, token.id);
  const size_t size = size_t(max_id) + 1;
  im.token_of_id.assign(size, {});
  im.bytes_of_id.assign(size, {});
  im.known_id.assign(size, 0);
  im.special_id.assign(size, 0);
  for (const auto& [token, id] : im.bpe->vocab()) {
    LOCKSTEP_CHECK(!im.known_id[size_t(id)], "model.vocab: id ", id, " is given to both '",
                   im.token_of_id[size_t(id)], "' and '", token, "'");
    im.token_of_id[size_t(id)] = token;
    im.known_id[size_t(id)] = 1;
  }
  for (const AddedToken& token : im.added_tokens) {  // an added token wins over the vocab, as in HF
    im.token_of_id[size_t(token.id)] = token.content;
    im.known_id[size_t(token.id)] = 1;
    im.special_id[size_t(token.id)] = token.special;
  }
  for (const AddedToken& token : im.added_tokens)
    if (token.normalized && !im.normalizer.empty())
      im.normalized_added[token.id] = im.normalizer.normalize(token.content);
  for (size_t id = 0; id < size; ++id)
    if (im.known_id[id]) im.bytes_of_id[id] = byte_level_decoded(im.decoder_input(int32_t(id)));
}

void load_tokenizer_json(const json& root, Tokenizer::Impl& im) {
  expect_object(root, "");
  for (const char* key : {"truncation", "padding"})
    LOCKSTEP_CHECK(optional_member(root, "", key) == nullptr, key, " must be null: ", key,
                   " inside the tokenizer is not supported");
  if (const json* normalizer = optional_member(root, "", "normalizer"))
    im.normalizer = Normalizer::from_json(*normalizer, "normalizer");
  im.pre_tokenizer = PreTokenizer::from_json(optional_member(root, "", "pre_tokenizer"), "pre_tokenizer");
  im.decoder = std::make_unique<Decoder>(Decoder::from_json(member(root, "", "decoder"), "decoder"));
  im.bpe = load_model(member(root, "", "model"), im.pre_tokenizer.byte_level());
  int templates = 0;
  if (const json* post = optional_member(root, "", "post_processor"))
    load_post_processor(*post, "post_processor", im, templates);
  if (const json* added = optional_member(root, "", "added_tokens")) load_added_tokens(*added, im);
  build_id_tables(im);
  for (int32_t id : im.prefix_ids)
    LOCKSTEP_CHECK(size_t(id) < im.known_id.size() && im.known_id[size_t(id)], "post_processor: template id ",
                   id, " is not a token");
  for (int32_t id : im.suffix_ids)
    LOCKSTEP_CHECK(size_t(id) < im.known_id.size() && im.known_id[size_t(id)], "post_processor: template id ",
                   id, " is not a token");
}

// bos_token / eos_token / pad_token: a string, null, or (older transformers) {"content": ...}.
std::optional<int32_t> special_from_config(const json& config, std::string_view key,
                                           const Tokenizer& tokenizer) {
  const json* value = optional_member(config, "", key);
  if (value == nullptr) return std::nullopt;
  const std::string name = value->is_object() ? as_string(member(*value, std::string(key), "content"),
                                                          field(std::string(key), "content"))
                                              : as_string(*value, std::string(key));
  const std::optional<int32_t> id = tokenizer.token_to_id(name);
  LOCKSTEP_CHECK(id.has_value(), key, " '", name, "' is not a token of the tokenizer");
  return id;
}

}  // namespace

Tokenizer Tokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                const std::filesystem::path& tokenizer_config_json) {
  auto impl = std::make_unique<Impl>();
  const json root = read_json(tokenizer_json);
  try {
    load_tokenizer_json(root, *impl);
  } catch (const json::exception& e) {  // a wrong type the checks above did not anticipate
    fail(tokenizer_json.string() + ": " + e.what());
  } catch (const Error& e) {
    fail(tokenizer_json.string() + ": " + e.what());
  }
  Tokenizer tokenizer(std::move(impl));
  if (tokenizer_config_json.empty()) return tokenizer;

  const json config = read_json(tokenizer_config_json);
  try {
    tokenizer.impl_->eos = special_from_config(config, "eos_token", tokenizer);
    tokenizer.impl_->bos = special_from_config(config, "bos_token", tokenizer);
    tokenizer.impl_->pad = special_from_config(config, "pad_token", tokenizer);
  } catch (const json::exception& e) {
    fail(tokenizer_config_json.string() + ": " + e.what());
  } catch (const Error& e) {
    fail(tokenizer_config_json.string() + ": " + e.what());
  }
  return tokenizer;
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  const std::filesystem::path config = dir / "tokenizer_config.json";
  return from_files(dir / "tokenizer.json",
                    std::filesystem::exists(config) ? config : std::filesystem::path{});
}

}  // namespace lockstep
