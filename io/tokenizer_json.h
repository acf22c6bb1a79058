// io/tokenizer_json.h — reading tokenizer.json's fields with errors that name the field
// ("pre_tokenizer.pretokenizers[1].behavior"); private to io/tokenizer*.cpp. The file name is added
// by the caller that catches the error.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"

namespace lockstep::tokenizer_json {

using json = nlohmann::json;

inline std::string field(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}
inline std::string field(const std::string& path, size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

inline void expect_object(const json& value, const std::string& path) {
  LOCKSTEP_CHECK(value.is_object(), (path.empty() ? "the top level" : path), " must be an object, not ",
                 value.type_name());
}

// A member that may be absent or null: nullptr then.
inline const json* optional_member(const json& object, const std::string& path, std::string_view key) {
  expect_object(object, path);
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

inline const json& member(const json& object, const std::string& path, std::string_view key) {
  const json* value = optional_member(object, path, key);
  LOCKSTEP_CHECK(value != nullptr, field(path, key), " is missing");
  return *value;
}

inline std::string as_string(const json& value, const std::string& path) {
  LOCKSTEP_CHECK(value.is_string(), path, " must be a string, not ", value.type_name());
  return value.get<std::string>();
}

inline std::string string_member(const json& object, const std::string& path, std::string_view key) {
  return as_string(member(object, path, key), field(path, key));
}

inline bool bool_member(const json& object, const std::string& path, std::string_view key, bool fallback) {
  const json* value = optional_member(object, path, key);
  if (value == nullptr) return fallback;
  LOCKSTEP_CHECK(value->is_boolean(), field(path, key), " must be true or false, not ", value->type_name());
  return value->get<bool>();
}

inline size_t count_member(const json& object, const std::string& path, std::string_view key) {
  const json& value = member(object, path, key);
  LOCKSTEP_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
                 field(path, key), " must be a non-negative integer, not ", value.dump());
  return value.get<size_t>();
}

inline int32_t as_id(const json& value, const std::string& path) {
  LOCKSTEP_CHECK(
      value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < (int64_t(1) << 31),
      path, " must be a token id (an integer in [0, 2^31)), not ", value.dump());
  return int32_t(value.get<int64_t>());
}

inline std::string type_of(const json& object, const std::string& path) {
  return as_string(member(object, path, "type"), field(path, "type"));
}

inline const json& array_member(const json& object, const std::string& path, std::string_view key) {
  const json& list = member(object, path, key);
  LOCKSTEP_CHECK(list.is_array(), field(path, key), " must be an array");
  return list;
}

[[noreturn]] inline void unsupported(const std::string& path, const std::string& what,
                                     const std::string& supported) {
  fail(path + " " + what + " is not supported (supported: " + supported + ")");
}

// A pattern object {"String": "..."} or {"Regex": "..."} (Split, Replace): its text, and whether it
// is a literal string.
inline std::string pattern_member(const json& object, const std::string& path, bool& literal) {
  const json& pattern = member(object, path, "pattern");
  const std::string pattern_path = field(path, "pattern");
  literal = optional_member(pattern, pattern_path, "String") != nullptr;
  const std::string key = literal ? "String" : "Regex";
  return as_string(member(pattern, pattern_path, key), field(pattern_path, key));
}

}  // namespace lockstep::tokenizer_json
