// io/jinja_builtins.h — jinja2's filters and tests, and the Python methods of str, dict and list
// that chat templates call, for the subset io/jinja.h supports. Each behaves as jinja2 3.1's (and
// Python's) does; an unsupported one is an error naming it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "io/jinja_value.h"

namespace lockstep::jinja {

// What a filter or test may call back into: applying another filter or test by name (map, select,
// selectattr) and reading an attribute as the template's `a.b` does.
struct BuiltinContext {
  std::function<Value(const Value&, std::string_view filter, CallArgs&)> apply_filter;
  std::function<bool(const Value&, std::string_view test, CallArgs&)> apply_test;
  std::function<Value(const Value&, std::string_view attribute)> get_attribute;
};

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

Value apply_filter(const Value& value, std::string_view name, CallArgs& args, const BuiltinContext& ctx);
bool apply_test(const Value& value, std::string_view name, CallArgs& args, const BuiltinContext& ctx);

// `value.name` when value is a str, dict or list and `name` one of its methods: a callable bound to
// value, or, for a Python method outside the subset, an Undefined saying so (calling it is then an
// error naming the method). nullopt when `name` is no method (jinja2 then tries the item value[name]).
std::optional<Value> method_of(const Value& value, std::string_view name);

// Python's `a < b` for numbers and for strings (code point order); other types are an error.
bool less_than(const Value& a, const Value& b);

}  // namespace lockstep::jinja
