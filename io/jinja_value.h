// io/jinja_value.h — the values a Jinja template computes with, behaving as their Python
// counterparts do under jinja2: None, bool, int, float, str, list, tuple, dict (insertion-ordered,
// string keys), callables, namespace() objects, and jinja2's default Undefined (prints as nothing,
// is false, iterates as empty; using it in arithmetic or reading its attributes is an error).
//
// Strings hold UTF-8; length, indexing and slicing count code points, as Python's str does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::jinja {

class Value;

// Insertion-ordered string-keyed map (Python dicts keep insertion order; chat data is JSON objects).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Callable = std::function<Value(CallArgs&)>;

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, callable, ns };

  Value() = default;  // Undefined
  static Value undefined(std::string why);  // why: "'x' is undefined", shown when it is misused
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(int64_t(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(Dict d);
  static Value callable(std::string name, Callable f);
  static Value namespace_object(Dict attrs);
  // JSON from the caller (messages, tools, tokenizer_config values); objects keep their key order.
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_number() const { return kind_ == Kind::integer || kind_ == Kind::floating; }
  bool is_tuple() const { return kind_ == Kind::list && tuple_; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::integer ? double(i_) : d_; }
  const std::string& as_string() const { return *s_; }
  const std::vector<Value>& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& namespace_attrs() const { return *dict_; }  // namespace(): the one mutable object
  const Callable& as_callable() const { return *fn_; }
  const std::string& undefined_reason() const { return *s_; }
  const std::string& callable_name() const { return *s_; }

  // Python's truth value; Undefined is false.
  bool truthy() const;
  // Python's type name, as jinja2's messages use it ("str", "dict", "list", "undefined"…).
  std::string type_name() const;
  // str(value): what {{ value }} prints. Undefined prints as "".
  std::string str() const;
  // repr(value): how str() shows the items of a list or dict.
  std::string repr() const;
  // Python's ==.
  bool equals(const Value& other) const;
  // Whether this value is, or holds through lists, dicts and namespaces, the namespace object `ns`.
  // Namespaces are the one mutable value, so storing such a value into `ns` is the one way a
  // template could build a reference cycle (which printing would follow forever).
  bool reaches(const Value& ns) const;

 private:
  Kind kind_ = Kind::undefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_ = std::make_shared<const std::string>("value is undefined");
  std::shared_ptr<const std::vector<Value>> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> fn_;
};

// json.dumps(value, ensure_ascii=False, indent=indent, separators=…, sort_keys=…), as transformers'
// `tojson` filter calls it. indent < 0: None (one line). Undefined and callables are errors.
struct JsonStyle {
  int indent = -1;
  std::optional<std::string> item_separator;  // none: Python's default (", ", or "," when indented)
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json(const Value& value, const JsonStyle& style);

// Python's repr(float): the shortest text that reads back to the same double.
std::string python_float_repr(double d);

// UTF-8 <-> code points, for Python's str semantics.
std::u32string utf8_to_u32(std::string_view text);
std::string u32_to_utf8(std::u32string_view text);
// Python's str.isspace() for one code point.
bool is_python_space(char32_t c);

}  // namespace lockstep::jinja
