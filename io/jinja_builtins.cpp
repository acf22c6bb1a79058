// io/jinja_builtins.cpp — filters (jinja2/filters.py), tests (jinja2/tests.py) and the Python str /
// dict methods chat templates call. `tojson` is transformers' override: json.dumps with
// ensure_ascii=False and the indent/separators/sort_keys it is given (no HTML escaping).
//
// Case mapping (upper, lower, title, capitalize) uses utf8proc's simple one-to-one mappings;
// Python's full mappings differ for a few characters (ß.upper() is "SS" in Python).
#include <algorithm>
#include <cmath>
#include <set>

#include <utf8proc.h>

#include "core/error.h"
#include "io/jinja_builtins.h"

namespace lockstep::jinja {
namespace {

[[noreturn]] void type_error(const std::string& what) { fail(what); }

// Positional argument `i`, or keyword `name`, or `fallback`.
Value arg(const CallArgs& a, size_t i, std::string_view name, Value fallback = Value::none()) {
  for (const auto& [k, v] : a.keyword)
    if (k == name) return v;
  return i < a.positional.size() ? a.positional[i] : fallback;
}

bool has_arg(const CallArgs& a, size_t i, std::string_view name) {
  for (const auto& [k, v] : a.keyword)
    if (k == name) return true;
  return i < a.positional.size();
}

void check_arity(const CallArgs& a, size_t max_positional, std::initializer_list<std::string_view> keywords,
                 std::string_view what) {
  LOCKSTEP_CHECK(a.positional.size() <= max_positional, what, " takes at most ", max_positional,
                 " positional arguments (", a.positional.size(), " given)");
  for (const auto& [k, v] : a.keyword)
    LOCKSTEP_CHECK(std::find(keywords.begin(), keywords.end(), k) != keywords.end(), what,
                   " got an unexpected keyword argument '", k, "'");
}

const std::string& need_string(const Value& v, std::string_view what) {
  if (!v.is_string()) type_error(std::string(what) + " needs a str, got " + v.type_name());
  return v.as_string();
}

int64_t need_int(const Value& v, std::string_view what) {
  if (v.kind() == Value::Kind::integer) return v.as_int();
  if (v.kind() == Value::Kind::boolean) return v.as_bool();
  type_error(std::string(what) + " needs an int, got " + v.type_name());
}

// The items Python's iter(value) yields: a list's items, a str's characters, a dict's keys;
// Undefined iterates as empty.
std::vector<Value> iterate(const Value& v, std::string_view what) {
  switch (v.kind()) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return v.as_list();
    case Value::Kind::string: {
      std::vector<Value> out;
      for (char32_t c : utf8_to_u32(v.as_string())) out.emplace_back(u32_to_utf8(std::u32string(1, c)));
      return out;
    }
    case Value::Kind::dict: {
      std::vector<Value> out;
      for (const auto& [k, e] : v.as_dict().items) out.emplace_back(k);
      return out;
    }
    default: type_error(std::string(what) + ": '" + v.type_name() + "' object is not iterable");
  }
}

char32_t to_upper(char32_t c) { return char32_t(utf8proc_toupper(utf8proc_int32_t(c))); }
char32_t to_lower(char32_t c) { return char32_t(utf8proc_tolower(utf8proc_int32_t(c))); }
char32_t to_title(char32_t c) { return char32_t(utf8proc_totitle(utf8proc_int32_t(c))); }
bool is_cased(char32_t c) { return to_upper(c) != c || to_lower(c) != c || to_title(c) != c; }

std::string map_case(const std::string& s, char32_t (*f)(char32_t)) {
  std::u32string u = utf8_to_u32(s);
  for (char32_t& c : u) c = f(c);
  return u32_to_utf8(u);
}

// Python's str.title(): the first cased character of each run of cased characters in title case,
// the others in lower case.
std::string python_title(const std::string& s) {
  std::u32string u = utf8_to_u32(s);
  bool previous_cased = false;
  for (char32_t& c : u) {
    const bool cased = is_cased(c);
    c = !cased ? c : previous_cased ? to_lower(c) : to_title(c);
    previous_cased = cased;
  }
  return u32_to_utf8(u);
}

std::string python_capitalize(const std::string& s) {
  std::u32string u = utf8_to_u32(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_title(u[i]) : to_lower(u[i]);
  return u32_to_utf8(u);
}

// jinja2's `title` filter (not str.title): words begin after runs of `-`, whitespace, `(`, `{`,
// `[` or `<`; each word's first character upper-cased, the rest lower-cased.
std::string jinja_title(const std::string& s) {
  std::u32string u = utf8_to_u32(s);
  bool word_start = true;
  for (char32_t& c : u) {
    const bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_python_space(c);
    if (separator) {
      word_start = true;
      continue;
    }
    c = word_start ? to_upper(c) : to_lower(c);
    word_start = false;
  }
  return u32_to_utf8(u);
}

// Python's str.strip/lstrip/rstrip: `chars` None strips whitespace.
std::string python_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = utf8_to_u32(s);
  std::u32string set;
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) set = utf8_to_u32(need_string(chars, "strip"));
  const auto strip = [&](char32_t c) { return whitespace ? is_python_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip(u[b])) ++b;
  if (right)
    while (e > b && strip(u[e - 1])) --e;
  return u32_to_utf8(std::u32string_view(u).substr(b, e - b));
}

// Python's str.split / str.rsplit.
std::vector<Value> python_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace separate; leading and trailing whitespace gives no empty parts.
    const std::u32string u = utf8_to_u32(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && is_python_space(u[i])) ++i;
      if (i == u.size()) break;
      size_t j = i;
      while (j < u.size() && !is_python_space(u[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && int64_t(words.size()) > maxsplit + 1) {
      // The remainder keeps its inner whitespace (and, splitting from the left, its trailing one).
      if (!from_right) {
        std::vector<std::pair<size_t, size_t>> kept(words.begin(), words.begin() + maxsplit);
        size_t end = u.size();
        while (end > words[size_t(maxsplit)].first && is_python_space(u[end - 1])) --end;
        kept.emplace_back(words[size_t(maxsplit)].first, end);
        words = kept;
      } else {
        const size_t first_kept = words.size() - size_t(maxsplit);
        std::vector<std::pair<size_t, size_t>> kept{{words[0].first, words[first_kept - 1].second}};
        kept.insert(kept.end(), words.begin() + long(first_kept), words.end());
        words = kept;
      }
    }
    std::vector<Value> out;
    for (auto [b, e] : words) out.emplace_back(u32_to_utf8(std::u32string_view(u).substr(b, e - b)));
    return out;
  }
  const std::string& d = need_string(sep, "split");
  LOCKSTEP_CHECK(!d.empty(), "split: empty separator");
  if (!from_right) {
    size_t pos = 0;
    while (maxsplit < 0 || int64_t(parts.size()) < maxsplit) {
      const size_t hit = s.find(d, pos);
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(pos, hit - pos));
      pos = hit + d.size();
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || int64_t(parts.size()) < maxsplit) {
      if (end < d.size()) break;
      const size_t hit = s.rfind(d, end - d.size());
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(hit + d.size(), end - hit - d.size()));
      end = hit;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  return std::vector<Value>(parts.begin(), parts.end());
}

std::string python_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` before every character and at the end.
    const std::u32string u = utf8_to_u32(s);
    int64_t n = 0;
    for (char32_t c : u) {
      if (count < 0 || n < count) out += with, ++n;
      out += u32_to_utf8(std::u32string(1, c));
    }
    if (count < 0 || n < count) out += with;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out += s.substr(pos, hit - pos) + with;
    pos = hit + old.size();
    ++n;
  }
  return out + s.substr(pos);
}

// Python's str.splitlines() (line boundaries: \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029).
std::vector<std::string> python_splitlines(const std::string& s) {
  const std::u32string u = utf8_to_u32(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    const char32_t c = u[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      lines.push_back(u32_to_utf8(std::u32string_view(u).substr(start, i - start)));
      if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < u.size()) lines.push_back(u32_to_utf8(std::u32string_view(u).substr(start)));
  return lines;
}

bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  const auto one = [&](const std::string& p) {
    return p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
  };
  if (what.kind() == Value::Kind::list && what.is_tuple()) {
    for (const Value& p : what.as_list())
      if (one(need_string(p, start ? "startswith" : "endswith"))) return true;
    return false;
  }
  return one(need_string(what, start ? "startswith" : "endswith"));
}

JsonStyle json_style(const CallArgs& a) {
  check_arity(a, 0, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonStyle style;
  const Value indent = arg(a, 99, "indent");
  if (!indent.is_none()) style.indent = int(need_int(indent, "tojson(indent=…)"));
  const Value separators = arg(a, 99, "separators");
  if (!separators.is_none()) {
    LOCKSTEP_CHECK(separators.kind() == Value::Kind::list && separators.as_list().size() == 2,
                   "tojson(separators=…) needs two strings");
    style.item_separator = need_string(separators.as_list()[0], "tojson(separators=…)");
    style.key_separator = need_string(separators.as_list()[1], "tojson(separators=…)");
  }
  style.sort_keys = arg(a, 99, "sort_keys", Value(false)).truthy();
  style.ensure_ascii = arg(a, 99, "ensure_ascii", Value(false)).truthy();
  return style;
}

Value to_int(const Value& v, const Value& fallback) {
  switch (v.kind()) {
    case Value::Kind::integer: return v;
    case Value::Kind::boolean: return Value(int64_t(v.as_bool()));
    case Value::Kind::floating: return std::isfinite(v.as_double()) ? Value(int64_t(v.as_double())) : fallback;
    case Value::Kind::string: {
      const std::string t = python_strip(v.as_string(), Value::none(), true, true);
      char* end = nullptr;
      const long long i = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && *end == '\0') return Value(int64_t(i));
      const double d = std::strtod(t.c_str(), &end);  // jinja2 falls back to int(float(s))
      if (!t.empty() && *end == '\0' && std::isfinite(d)) return Value(int64_t(d));
      return fallback;
    }
    default: return fallback;
  }
}

Value to_float(const Value& v, const Value& fallback) {
  switch (v.kind()) {
    case Value::Kind::integer:
    case Value::Kind::floating: return Value(v.as_double());
    case Value::Kind::boolean: return Value(double(v.as_bool()));
    case Value::Kind::string: {
      const std::string t = python_strip(v.as_string(), Value::none(), true, true);
      char* end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      return !t.empty() && *end == '\0' ? Value(d) : fallback;
    }
    default: return fallback;
  }
}

CallArgs rest_args(const CallArgs& a, size_t from) {
  CallArgs r;
  for (size_t i = from; i < a.positional.size(); ++i) r.positional.push_back(a.positional[i]);
  r.keyword = a.keyword;
  return r;
}

// select/reject/selectattr/rejectattr: keep the items whose (attribute's) test result is `keep`.
Value select_items(const Value& v, const CallArgs& a, bool by_attribute, bool keep, const BuiltinContext& ctx,
                   std::string_view what) {
  std::vector<Value> out;
  const size_t test_at = by_attribute ? 1 : 0;
  if (by_attribute) LOCKSTEP_CHECK(!a.positional.empty(), what, " needs an attribute name");
  const std::string attribute = by_attribute ? need_string(a.positional[0], what) : "";
  const bool has_test = a.positional.size() > test_at;
  const std::string test = has_test ? need_string(a.positional[test_at], what) : "";
  if (has_test) LOCKSTEP_CHECK(is_known_test(test), what, ": unknown test '", test, "'");
  CallArgs test_args = rest_args(a, test_at + 1);
  for (const Value& item : iterate(v, what)) {
    Value subject = item;
    if (by_attribute)
      for (size_t b = 0, e; b <= attribute.size(); b = e + 1) {
        e = std::min(attribute.find('.', b), attribute.size());
        subject = ctx.get_attribute(subject, attribute.substr(b, e - b));
      }
    CallArgs t = test_args;
    const bool passed = has_test ? ctx.apply_test(subject, test, t) : subject.truthy();
    if (passed == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

const std::set<std::string, std::less<>>& filter_names() {
  static const std::set<std::string, std::less<>> names = {
      "abs",   "attr",     "capitalize", "count",  "d",          "default", "first", "float",
      "indent", "int",     "items",      "join",   "last",       "length",  "list",  "lower",
      "map",   "reject",   "rejectattr", "replace", "reverse",   "safe",    "select", "selectattr",
      "string", "title",   "tojson",     "trim",   "upper",      "wordcount"};
  return names;
}

const std::set<std::string, std::less<>>& test_names() {
  static const std::set<std::string, std::less<>> names = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "even", "false", "float",
      "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt",
      "lessthan", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string",
      "true", "undefined", "upper"};
  return names;
}

}  // namespace

bool is_known_filter(std::string_view name) { return filter_names().count(name) > 0; }
bool is_known_test(std::string_view name) { return test_names().count(name) > 0; }

bool less_than(const Value& a, const Value& b) {
  const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::boolean; };
  if (numeric(a) && numeric(b)) {
    const double x = a.kind() == Value::Kind::boolean ? double(a.as_bool()) : a.as_double();
    const double y = b.kind() == Value::Kind::boolean ? double(b.as_bool()) : b.as_double();
    if (a.kind() == Value::Kind::integer && b.kind() == Value::Kind::integer) return a.as_int() < b.as_int();
    return x < y;
  }
  if (a.is_string() && b.is_string()) return utf8_to_u32(a.as_string()) < utf8_to_u32(b.as_string());
  type_error("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value apply_filter(const Value& v, std::string_view name, CallArgs& a, const BuiltinContext& ctx) {
  const std::string what = "filter '" + std::string(name) + "'";
  if (name == "safe") return v;
  if (name == "trim") {
    check_arity(a, 1, {"chars"}, what);
    return Value(python_strip(v.str(), arg(a, 0, "chars"), true, true));
  }
  if (name == "length" || name == "count") {
    switch (v.kind()) {
      case Value::Kind::undefined: return Value(int64_t(0));
      case Value::Kind::string: return Value(int64_t(utf8_to_u32(v.as_string()).size()));
      case Value::Kind::list: return Value(int64_t(v.as_list().size()));
      case Value::Kind::dict: return Value(int64_t(v.as_dict().items.size()));
      default: type_error(what + ": object of type '" + v.type_name() + "' has no len()");
    }
  }
  if (name == "tojson") return Value(to_json(v, json_style(a)));
  if (name == "string") return v.is_string() ? v : Value(v.str());
  if (name == "upper") return Value(map_case(v.str(), to_upper));
  if (name == "lower") return Value(map_case(v.str(), to_lower));
  if (name == "capitalize") return Value(python_capitalize(v.str()));
  if (name == "title") return Value(jinja_title(v.str()));
  if (name == "replace") {
    check_arity(a, 3, {"old", "new", "count"}, what);
    const Value count = arg(a, 2, "count");
    return Value(python_replace(v.str(), arg(a, 0, "old").str(), arg(a, 1, "new").str(),
                                count.is_none() ? -1 : need_int(count, what)));
  }
  if (name == "join") {
    check_arity(a, 2, {"d", "attribute"}, what);
    const std::string sep = arg(a, 0, "d", Value("")).str();
    const Value attribute = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v, what)) {
      const Value shown = attribute.is_none() ? item : ctx.get_attribute(item, attribute.str());
      out += (first ? "" : sep) + shown.str();
      first = false;
    }
    return Value(out);
  }
  if (name == "first" || name == "last") {
    const std::vector<Value> items = iterate(v, what);
    if (items.empty()) return Value::undefined("No " + std::string(name) + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "default" || name == "d") {
    check_arity(a, 2, {"default_value", "boolean"}, what);
    const bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value(""));
    return v;
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (v.kind() != Value::Kind::dict) type_error(what + ": can only get item pairs from a mapping");
    std::vector<Value> out;
    for (const auto& [k, e] : v.as_dict().items) out.push_back(Value::list({Value(k), e}, /*tuple=*/true));
    return Value::list(std::move(out));
  }
  if (name == "list") return Value::list(iterate(v, what));
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = utf8_to_u32(v.as_string());
      std::reverse(u.begin(), u.end());
      return Value(u32_to_utf8(u));
    }
    std::vector<Value> items = iterate(v, what);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "map") {
    std::vector<Value> out;
    const Value attribute = arg(a, 99, "attribute");
    if (!attribute.is_none()) {
      check_arity(a, 0, {"attribute", "default"}, what);
      const Value fallback = arg(a, 99, "default", Value());
      for (const Value& item : iterate(v, what)) {
        Value got = item;
        const std::string path = attribute.str();
        for (size_t b = 0, e; b <= path.size(); b = e + 1) {
          e = std::min(path.find('.', b), path.size());
          got = ctx.get_attribute(got, path.substr(b, e - b));
        }
        out.push_back(got.is_undefined() && has_arg(a, 99, "default") ? fallback : got);
      }
      return Value::list(std::move(out));
    }
    LOCKSTEP_CHECK(!a.positional.empty(), what, " needs a filter name or attribute=");
    const std::string filter = need_string(a.positional[0], what);
    LOCKSTEP_CHECK(is_known_filter(filter), what, ": unknown filter '", filter, "'");
    for (const Value& item : iterate(v, what)) {
      CallArgs f = rest_args(a, 1);
      out.push_back(ctx.apply_filter(item, filter, f));
    }
    return Value::list(std::move(out));
  }
  if (name == "select") return select_items(v, a, false, true, ctx, what);
  if (name == "reject") return select_items(v, a, false, false, ctx, what);
  if (name == "selectattr") return select_items(v, a, true, true, ctx, what);
  if (name == "rejectattr") return select_items(v, a, true, false, ctx, what);
  if (name == "attr") {
    check_arity(a, 1, {"name"}, what);
    return ctx.get_attribute(v, need_string(arg(a, 0, "name"), what));
  }
  if (name == "int") {
    check_arity(a, 2, {"default", "base"}, what);
    LOCKSTEP_CHECK(arg(a, 1, "base", Value(int64_t(10))).equals(Value(int64_t(10))), what, ": only base 10 is supported");
    return to_int(v, arg(a, 0, "default", Value(int64_t(0))));
  }
  if (name == "float") {
    check_arity(a, 1, {"default"}, what);
    return to_float(v, arg(a, 0, "default", Value(0.0)));
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::integer) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.kind() == Value::Kind::floating) return Value(std::fabs(v.as_double()));
    if (v.kind() == Value::Kind::boolean) return Value(int64_t(v.as_bool()));
    type_error(what + ": bad operand type for abs(): '" + v.type_name() + "'");
  }
  if (name == "wordcount") return Value(int64_t(python_split(v.str(), Value::none(), -1, false).size()));
  if (name == "indent") {
    check_arity(a, 3, {"width", "first", "blank"}, what);
    const Value width = arg(a, 0, "width", Value(int64_t(4)));
    const std::string indention = width.is_string() ? width.as_string() : std::string(size_t(need_int(width, what)), ' ');
    const bool first = arg(a, 1, "first", Value(false)).truthy(), blank = arg(a, 2, "blank", Value(false)).truthy();
    std::vector<std::string> lines = python_splitlines(v.str() + "\n");
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i == 0) out = lines[0];
      else out += "\n" + (blank || !lines[i].empty() ? indention : "") + lines[i];
    }
    return Value(first ? indention + out : out);
  }
  fail("unknown filter '" + std::string(name) + "'");
}

bool apply_test(const Value& v, std::string_view name, CallArgs& a, const BuiltinContext&) {
  const auto other = [&]() -> const Value& {
    LOCKSTEP_CHECK(!a.positional.empty(), "test '", name, "' needs an argument");
    return a.positional[0];
  };
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == K::dict;
  if (name == "iterable")
    return v.kind() == K::list || v.kind() == K::string || v.kind() == K::dict || v.kind() == K::undefined;
  if (name == "sequence")
    return v.kind() == K::list || v.kind() == K::string || v.kind() == K::dict || v.kind() == K::undefined;
  if (name == "number") return v.is_number() || v.kind() == K::boolean;
  if (name == "integer") return v.kind() == K::integer;
  if (name == "float") return v.kind() == K::floating;
  if (name == "boolean") return v.kind() == K::boolean;
  if (name == "true") return v.kind() == K::boolean && v.as_bool();
  if (name == "false") return v.kind() == K::boolean && !v.as_bool();
  if (name == "callable") return v.kind() == K::callable;
  if (name == "odd" || name == "even") {
    const int64_t i = need_int(v, "test '" + std::string(name) + "'");
    return ((i % 2 + 2) % 2 == 1) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = need_int(other(), "divisibleby");
    LOCKSTEP_CHECK(d != 0, "divisibleby(0): integer modulo by zero");
    return need_int(v, "divisibleby") % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return v.equals(other());
  if (name == "ne" || name == "!=") return !v.equals(other());
  if (name == "lt" || name == "lessthan" || name == "<") return less_than(v, other());
  if (name == "gt" || name == "greaterthan" || name == ">") return less_than(other(), v);
  if (name == "le" || name == "<=") return !less_than(other(), v);
  if (name == "ge" || name == ">=") return !less_than(v, other());
  if (name == "lower") return map_case(v.str(), to_lower) == v.str() && map_case(v.str(), to_upper) != v.str();
  if (name == "upper") return map_case(v.str(), to_upper) == v.str() && map_case(v.str(), to_lower) != v.str();
  if (name == "sameas") {
    const Value& o = other();
    return v.kind() == o.kind() && (v.is_none() || (v.kind() == K::boolean && v.as_bool() == o.as_bool()));
  }
  if (name == "in") {
    const Value& seq = other();
    if (seq.is_string()) return seq.as_string().find(need_string(v, "test 'in'")) != std::string::npos;
    for (const Value& item : iterate(seq, "test 'in'"))
      if (item.equals(v)) return true;
    return false;
  }
  fail("unknown test '" + std::string(name) + "'");
}

std::optional<Value> method_of(const Value& v, std::string_view name) {
  const std::string method(name);
  const std::string what = v.type_name() + "." + method + "()";
  // Python's other methods of these types: refused by name rather than reported as missing.
  static const std::set<std::string, std::less<>> other_str_methods = {
      "casefold", "center", "encode", "expandtabs", "format", "format_map", "index", "isalnum", "isalpha",
      "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace",
      "istitle", "isupper", "ljust", "maketrans", "partition", "removeprefix", "removesuffix", "rfind",
      "rindex", "rjust", "rpartition", "swapcase", "translate", "zfill"};
  static const std::set<std::string, std::less<>> other_dict_methods = {"copy", "fromkeys", "setdefault", "update",
                                                                        "popitem", "pop", "clear"};
  static const std::set<std::string, std::less<>> other_list_methods = {"copy", "index", "count"};
  if ((v.is_string() && other_str_methods.count(name)) ||
      (v.kind() == Value::Kind::dict && other_dict_methods.count(name)) ||
      (v.kind() == Value::Kind::list && other_list_methods.count(name)))
    return Value::undefined(what + " is not supported by lockstep's Jinja subset");
  if (v.is_string()) {
    const std::string s = v.as_string();
    static const std::set<std::string, std::less<>> str_methods = {
        "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "replace", "upper",
        "lower",      "title",    "capitalize", "find", "count", "join", "splitlines"};
    if (!str_methods.count(name)) return std::nullopt;
    return Value::callable(what, [s, method, what](CallArgs& a) -> Value {
      if (method == "startswith" || method == "endswith") {
        check_arity(a, 1, {}, what);
        LOCKSTEP_CHECK(a.positional.size() == 1, what, " takes one argument");
        return Value(starts_or_ends(s, a.positional[0], method == "startswith"));
      }
      if (method == "strip" || method == "lstrip" || method == "rstrip") {
        check_arity(a, 1, {}, what);
        return Value(python_strip(s, arg(a, 0, ""), method != "rstrip", method != "lstrip"));
      }
      if (method == "split" || method == "rsplit") {
        check_arity(a, 2, {"sep", "maxsplit"}, what);
        return Value::list(python_split(s, arg(a, 0, "sep"), need_int(arg(a, 1, "maxsplit", Value(int64_t(-1))), what),
                                        method == "rsplit"));
      }
      if (method == "replace") {
        check_arity(a, 3, {}, what);
        LOCKSTEP_CHECK(a.positional.size() >= 2, what, " needs old and new");
        return Value(python_replace(s, need_string(a.positional[0], what), need_string(a.positional[1], what),
                                    a.positional.size() > 2 ? need_int(a.positional[2], what) : -1));
      }
      check_arity(a, method == "find" || method == "count" || method == "join" ? 1 : 0, {}, what);
      if (method == "upper") return Value(map_case(s, to_upper));
      if (method == "lower") return Value(map_case(s, to_lower));
      if (method == "title") return Value(python_title(s));
      if (method == "capitalize") return Value(python_capitalize(s));
      if (method == "splitlines") {
        const std::vector<std::string> lines = python_splitlines(s);
        return Value::list(std::vector<Value>(lines.begin(), lines.end()));
      }
      LOCKSTEP_CHECK(a.positional.size() == 1, what, " takes one argument");
      if (method == "join") {
        std::string out;
        bool first = true;
        for (const Value& item : iterate(a.positional[0], what)) {
          out += (first ? "" : s) + need_string(item, what);
          first = false;
        }
        return Value(out);
      }
      const std::string& needle = need_string(a.positional[0], what);
      if (method == "find") {
        const size_t hit = s.find(needle);
        return Value(hit == std::string::npos ? int64_t(-1) : int64_t(utf8_to_u32(s.substr(0, hit)).size()));
      }
      int64_t n = 0;  // count: non-overlapping occurrences
      if (needle.empty()) return Value(int64_t(utf8_to_u32(s).size() + 1));
      for (size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + needle.size())) ++n;
      return Value(n);
    });
  }
  if (v.kind() == Value::Kind::dict) {
    if (name != "get" && name != "items" && name != "keys" && name != "values") return std::nullopt;
    return Value::callable(what, [v, method, what](CallArgs& a) -> Value {
      if (method == "get") {
        check_arity(a, 2, {}, what);
        LOCKSTEP_CHECK(!a.positional.empty(), what, " needs a key");
        const Value& key = a.positional[0];
        const Value* found = key.is_string() ? v.as_dict().find(key.as_string()) : nullptr;
        return found ? *found : a.positional.size() > 1 ? a.positional[1] : Value::none();
      }
      check_arity(a, 0, {}, what);
      std::vector<Value> out;
      for (const auto& [k, e] : v.as_dict().items)
        out.push_back(method == "keys"     ? Value(k)
                      : method == "values" ? e
                                           : Value::list({Value(k), e}, /*tuple=*/true));
      return Value::list(std::move(out));
    });
  }
  if (v.kind() == Value::Kind::list) {
    static const std::set<std::string, std::less<>> mutating = {"append", "extend", "insert", "pop", "remove",
                                                                "clear", "sort", "reverse"};
    if (mutating.count(name))
      fail("list." + method + "() is not allowed: chat templates render in an immutable sandbox, as in transformers");
  }
  return std::nullopt;
}

}  // namespace lockstep::jinja
