// io/jinja_value.cpp
#include "io/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "core/error.h"
#include "io/tokenizer_unicode.h"

namespace lockstep::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  if (Value* v = find(key)) *v = std::move(value);
  else items.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string why) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(why));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::none;
  return v;
}

Value::Value(bool b) : kind_(Kind::boolean), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::integer), i_(i) {}
Value::Value(double d) : kind_(Kind::floating), d_(d) {}
Value::Value(std::string s) : kind_(Kind::string), s_(std::make_shared<const std::string>(std::move(s))) {}

Value Value::list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind_ = Kind::list;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::dict;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::callable(std::string name, Callable f) {
  Value v;
  v.kind_ = Kind::callable;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const Callable>(std::move(f));
  return v;
}

Value Value::namespace_object(Dict attrs) {
  Value v = dict(std::move(attrs));
  v.kind_ = Kind::ns;
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      LOCKSTEP_CHECK(u <= uint64_t(INT64_MAX), "integer ", u, " is too large for a chat template value");
      return Value(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.set(k, from_json(e));
      return dict(std::move(d));
    }
    default: fail("a chat template value cannot be made of JSON " + std::string(j.type_name()));
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return b_;
    case Kind::integer: return i_ != 0;
    case Kind::floating: return d_ != 0;
    case Kind::string: return !s_->empty();
    case Kind::list: return !list_->empty();
    case Kind::dict: return !dict_->items.empty();
    case Kind::callable:
    case Kind::ns: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return tuple_ ? "tuple" : "list";
    case Kind::dict: return "dict";
    case Kind::callable: return "function";
    case Kind::ns: return "Namespace";
  }
  return "?";
}

namespace {

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_to_u32(s)) {
    char buf[16];
    if (c == '\\') out += "\\\\";
    else if (c == char32_t(quote)) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) {
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
      out += buf;
    } else if (c == 0x2028 || c == 0x2029) {
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      out += buf;
    } else {
      out += u32_to_utf8(std::u32string(1, c));
    }
  }
  return out + quote;
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::undefined: return "";
    case Kind::none: return "None";
    case Kind::boolean: return b_ ? "True" : "False";
    case Kind::integer: return std::to_string(i_);
    case Kind::floating: return python_float_repr(d_);
    case Kind::string: return *s_;
    case Kind::list: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::dict:
    case Kind::ns: {
      std::string out = kind_ == Kind::ns ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items) {
        out += (first ? "" : ", ") + python_string_repr(k) + ": " + v.repr();
        first = false;
      }
      return out + (kind_ == Kind::ns ? "}>" : "}");
    }
    case Kind::callable: return "<function " + *s_ + ">";
  }
  return "";
}

std::string Value::repr() const { return kind_ == Kind::string ? python_string_repr(*s_) : str(); }

bool Value::equals(const Value& o) const {
  const auto numeric = [](const Value& v) {
    return v.kind_ == Kind::boolean || v.kind_ == Kind::integer || v.kind_ == Kind::floating;
  };
  if (numeric(*this) && numeric(o)) {
    if (kind_ != Kind::floating && o.kind_ != Kind::floating) {
      const int64_t a = kind_ == Kind::boolean ? int64_t(b_) : i_;
      const int64_t b = o.kind_ == Kind::boolean ? int64_t(o.b_) : o.i_;
      return a == b;
    }
    const double a = kind_ == Kind::boolean ? double(b_) : as_double();
    const double b = o.kind_ == Kind::boolean ? double(o.b_) : o.as_double();
    return a == b;
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return true;
    case Kind::string: return *s_ == *o.s_;
    case Kind::list: {
      if (tuple_ != o.tuple_ || list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i)
        if (!(*list_)[i].equals((*o.list_)[i])) return false;
      return true;
    }
    case Kind::dict: {
      if (dict_->items.size() != o.dict_->items.size()) return false;
      for (const auto& [k, v] : dict_->items) {
        const Value* w = o.dict_->find(k);
        if (!w || !v.equals(*w)) return false;
      }
      return true;
    }
    case Kind::callable: return fn_ == o.fn_;
    case Kind::ns: return dict_ == o.dict_;
    default: return false;
  }
}

bool Value::reaches(const Value& ns) const {
  // Lists and dicts may share parts (`[x, x]` nested n deep holds 2^n paths): each is walked once.
  std::unordered_set<const void*> seen;
  std::vector<const Value*> pending = {this};
  while (!pending.empty()) {
    const Value* v = pending.back();
    pending.pop_back();
    if (v->kind_ == Kind::ns && v->dict_ == ns.dict_) return true;
    const void* node = v->kind_ == Kind::list ? static_cast<const void*>(v->list_.get())
                       : v->kind_ == Kind::dict || v->kind_ == Kind::ns ? static_cast<const void*>(v->dict_.get())
                                                                          : nullptr;
    if (!node || !seen.insert(node).second) continue;
    if (v->kind_ == Kind::list)
      for (const Value& item : *v->list_) pending.push_back(&item);
    else
      for (const auto& [key, item] : v->dict_->items) pending.push_back(&item);
  }
  return false;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out by Python's repr rule: positional
  // for decimal exponents -4..15, scientific otherwise.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  const bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  const size_t e = s.find('e');
  const int exponent = std::stoi(s.substr(e + 1));
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += ebuf;
  } else if (exponent < 0) {
    out = "0." + std::string(size_t(-exponent - 1), '0') + digits;
  } else if (size_t(exponent) + 1 >= digits.size()) {
    out = digits + std::string(size_t(exponent) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, size_t(exponent) + 1) + "." + digits.substr(size_t(exponent) + 1);
  }
  return negative ? "-" + out : out;
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_to_u32(s)) {
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7f && c < 0x10000)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      out += buf;
    } else if (ensure_ascii && c >= 0x10000) {
      const unsigned v = unsigned(c) - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      out += buf;
    } else {
      out += u32_to_utf8(std::u32string(1, c));
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonStyle& style, int level) {
  const std::string item_sep = style.item_separator ? *style.item_separator : style.indent >= 0 ? "," : ", ";
  const auto newline = [&](int depth) {
    if (style.indent >= 0) out += "\n" + std::string(size_t(style.indent * depth), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : python_float_repr(d);
      return;
    }
    case Value::Kind::string: json_string(out, v.as_string(), style.ensure_ascii); return;
    case Value::Kind::list: {
      if (v.as_list().empty()) { out += "[]"; return; }
      out += '[';
      for (size_t i = 0; i < v.as_list().size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        json_value(out, v.as_list()[i], style, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.as_dict().items) items.push_back(&item);
      if (style.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      if (items.empty()) { out += "{}"; return; }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        json_string(out, items[i]->first, style.ensure_ascii);
        out += style.key_separator;
        json_value(out, items[i]->second, style, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default: fail("tojson: Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& value, const JsonStyle& style) {
  std::string out;
  json_value(out, value, style, 0);
  return out;
}

std::u32string utf8_to_u32(std::string_view text) {
  std::u32string out;
  if (unicode::find_invalid_utf8(text) != std::string_view::npos) {
    // Not UTF-8 (Python would not have made such a str): one code point per byte keeps it whole.
    for (unsigned char c : text) out += char32_t(c);
    return out;
  }
  int length = 0;
  for (size_t i = 0; i < text.size(); i += size_t(length)) out += unicode::code_point_at(text, i, &length);
  return out;
}

std::string u32_to_utf8(std::u32string_view text) {
  std::string out;
  for (char32_t c : text) {
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xc0 | (c >> 6));
      out += char(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += char(0xe0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3f));
      out += char(0x80 | (c & 0x3f));
    } else {
      out += char(0xf0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3f));
      out += char(0x80 | ((c >> 6) & 0x3f));
      out += char(0x80 | (c & 0x3f));
    }
  }
  return out;
}

bool is_python_space(char32_t c) { return unicode::is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

}  // namespace lockstep::jinja
