// io/jinja_render.cpp — walks the syntax tree: scopes, loops, macros, operators, and jinja2's
// lookup rules (jinja2/environment.py, sandbox.py):
//   - `a.b` tries the attribute (a str/dict method) first, then the item a['b'];
//   - `a[b]` tries the item first, then, for a string b, the attribute;
//   - a failed lookup gives Undefined, which prints as "" and is false; reading an attribute or
//     item of Undefined, doing arithmetic or ordering with it, or calling it, is an error.
// Scopes: a for loop's body gets its own scope (its `set`s do not leak out, hence namespace());
// if-blocks do not. A macro sees the template's top-level names and its arguments.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "io/jinja.h"
#include "io/jinja_builtins.h"
#include "io/jinja_syntax.h"

namespace lockstep {
namespace jinja {
namespace {

using Scope = std::unordered_map<std::string, Value>;

enum class Flow { normal, break_, continue_ };

// Python's slice.indices + the selection, over n items.
std::vector<size_t> slice_positions(int64_t n, const Value& start, const Value& stop, const Value& step_v) {
  const auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    LOCKSTEP_CHECK(v.kind() == Value::Kind::integer, "slice ", what, " must be an integer, got ", v.type_name());
    return v.as_int();
  };
  const int64_t step = as_index(step_v, "step").value_or(1);
  LOCKSTEP_CHECK(step != 0, "slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> i, int64_t fallback) {
    if (!i) return fallback;
    int64_t v = *i < 0 ? *i + n : *i;
    if (step > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  const int64_t b = clamp(as_index(start, "start"), step > 0 ? 0 : n - 1);
  const int64_t e = clamp(as_index(stop, "stop"), step > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(size_t(i));
  return out;
}

class Renderer {
 public:
  Renderer(const Template& t, const JinjaRenderOptions& options) : template_(t), options_(options) {
    ctx_.apply_filter = [this](const Value& v, std::string_view f, CallArgs& a) {
      return apply_filter(v, f, a, ctx_);
    };
    ctx_.apply_test = [this](const Value& v, std::string_view t, CallArgs& a) { return apply_test(v, t, a, ctx_); };
    ctx_.get_attribute = [this](const Value& v, std::string_view name) { return get_attribute(v, name); };
  }

  std::string render(const nlohmann::ordered_json& variables) {
    LOCKSTEP_CHECK(variables.is_object(), template_.name, ": template variables must be a JSON object");
    root_ = std::make_shared<Scope>();
    for (const auto& [k, v] : variables.items()) (*root_)[k] = Value::from_json(v);
    scopes_ = {root_.get()};
    std::string out;
    try {
      exec_body(template_.body, out);
    } catch (const Error& e) {
      fail(template_.name + ":" + std::to_string(line_) + ": " + e.what());
    }
    return out;
  }

 private:
  const Template& template_;
  const JinjaRenderOptions& options_;
  BuiltinContext ctx_;
  std::shared_ptr<Scope> root_;
  std::vector<Scope*> scopes_;  // innermost last
  int macro_depth_ = 0;         // macro calls under way (a recursion without end must stop)
  int line_ = 0;                // of the statement or expression being evaluated, for errors

  // The parser bounds a template's nesting, but each macro call stacks its body's nesting on its
  // caller's; this bounds the whole (statements and expressions under evaluation), which must fit
  // on the stack even under AddressSanitizer. 100 calls of a plain recursive macro take 200.
  static constexpr int kMaxRenderNesting = 400;
  int render_nesting_ = 0;
  // A NestingLevel's action past kMaxRenderNesting levels.
  [[noreturn]] static void too_deep() {
    fail(detail::concat("statements and expressions nested more than ", kMaxRenderNesting,
                        " deep through macro calls"));
  }

  // ---- statements
  Flow exec_body(const Body& body, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow exec(const Stmt& s, std::string& out) {
    line_ = s.line;
    const NestingLevel nested(render_nesting_, kMaxRenderNesting, too_deep);
    switch (s.kind) {
      case Stmt::Kind::text: out += s.text; return Flow::normal;
      case Stmt::Kind::output: out += eval(*s.expr).str(); return Flow::normal;
      case Stmt::Kind::if_:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond).truthy()) return exec_body(body, out);
        return exec_body(s.else_body, out);
      case Stmt::Kind::for_: exec_for(s, out); return Flow::normal;
      case Stmt::Kind::set: assign(s.target, eval(*s.expr), s.line); return Flow::normal;
      case Stmt::Kind::set_block: {
        std::string captured;
        exec_body(s.body, captured);
        assign(s.target, Value(captured), s.line);
        return Flow::normal;
      }
      case Stmt::Kind::macro: scopes_.back()->insert_or_assign(s.text, make_macro(s)); return Flow::normal;
      case Stmt::Kind::call_block: {
        const Expr& call = *s.expr;
        Value callee = eval(*call.args[0]);
        CallArgs args = eval_args(call);
        std::vector<Scope*> caller_scopes = scopes_;
        const Body* body = &s.body;
        args.keyword.emplace_back("caller", Value::callable("caller", [this, caller_scopes, body](CallArgs&) {
                                    std::vector<Scope*> saved = scopes_;
                                    scopes_ = caller_scopes;
                                    std::string text;
                                    exec_body(*body, text);
                                    scopes_ = saved;
                                    return Value(text);
                                  }));
        out += call_value(callee, args).str();
        return Flow::normal;
      }
      case Stmt::Kind::break_: return Flow::break_;
      case Stmt::Kind::continue_: return Flow::continue_;
      case Stmt::Kind::generation: return exec_body(s.body, out);
    }
    return Flow::normal;
  }

  void bind(const Target& target, const Value& value, Scope& scope) {
    if (!target.tuple) {
      scope.insert_or_assign(target.names[0], value);
      return;
    }
    std::vector<Value> items;
    if (value.kind() == Value::Kind::list) items = value.as_list();
    else if (value.is_string() || value.kind() == Value::Kind::dict) items = apply_list(value);
    else fail("cannot unpack non-iterable " + value.type_name() + " object");
    LOCKSTEP_CHECK(items.size() == target.names.size(), "cannot unpack ", items.size(), " values into ",
                   target.names.size(), " names");
    for (size_t i = 0; i < items.size(); ++i) scope.insert_or_assign(target.names[i], items[i]);
  }

  std::vector<Value> apply_list(const Value& v) {
    CallArgs none;
    return apply_filter(v, "list", none, ctx_).as_list();
  }

  void assign(const Target& target, const Value& value, int line) {
    if (!target.attribute.empty()) {
      const Value ns = lookup(target.names[0]);
      if (ns.kind() != Value::Kind::ns) {
        line_ = line;
        fail("cannot assign attribute '" + target.attribute + "' on '" + target.names[0] +
             "': it is not a namespace() object");
      }
      if (value.reaches(ns)) {
        line_ = line;
        fail("cannot assign to '" + target.names[0] + "." + target.attribute + "' a value that holds '" +
             target.names[0] + "' itself (a namespace cannot contain itself)");
      }
      ns.namespace_attrs().set(target.attribute, value);
      return;
    }
    bind(target, value, *scopes_.back());
  }

  void exec_for(const Stmt& s, std::string& out) {
    const Value iterable = eval(*s.expr);
    std::vector<Value> items;
    if (iterable.kind() == Value::Kind::list) items = iterable.as_list();
    else if (iterable.is_undefined()) items = {};
    else if (iterable.is_string() || iterable.kind() == Value::Kind::dict) items = apply_list(iterable);
    else fail("'" + iterable.type_name() + "' object is not iterable");

    // Each iteration starts from a fresh scope: a `set` in the body lasts until the iteration ends
    // (jinja2 renders `{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{% endfor %}` as "11").
    Scope scope;
    scopes_.push_back(&scope);
    struct Pop {
      std::vector<Scope*>& s;
      ~Pop() { s.pop_back(); }
    } pop{scopes_};
    if (s.filter) {
      // `for x in xs if cond`: the condition sees the loop variable; loop.* counts what passes.
      std::vector<Value> kept;
      for (const Value& item : items) {
        bind(s.target, item, scope);
        if (eval(*s.filter).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      scope.clear();
      exec_body(s.else_body, out);
      return;
    }
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scope.clear();
      bind(s.target, items[size_t(i)], scope);
      Dict loop;
      loop.set("index0", Value(i));
      loop.set("index", Value(i + 1));
      loop.set("revindex0", Value(n - 1 - i));
      loop.set("revindex", Value(n - i));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == n - 1));
      loop.set("length", Value(n));
      loop.set("depth", Value(int64_t(1)));
      loop.set("depth0", Value(int64_t(0)));
      loop.set("previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item"));
      loop.set("nextitem", i + 1 < n ? items[size_t(i + 1)] : Value::undefined("there is no next item"));
      loop.set("cycle", Value::callable("loop.cycle", [i](CallArgs& a) {
                 LOCKSTEP_CHECK(!a.positional.empty(), "loop.cycle() needs at least one value");
                 return a.positional[size_t(i) % a.positional.size()];
               }));
      scope.insert_or_assign("loop", Value::dict(std::move(loop)));
      if (exec_body(s.body, out) == Flow::break_) break;
    }
  }

  Value make_macro(const Stmt& s) {
    const Stmt* macro = &s;
    return Value::callable(s.text, [this, macro](CallArgs& a) {
      Scope frame;
      LOCKSTEP_CHECK(a.positional.size() <= macro->params.size(), "macro '", macro->text, "' takes ",
                     macro->params.size(), " arguments (", a.positional.size(), " given)");
      for (size_t i = 0; i < macro->params.size(); ++i) {
        Value v = i < a.positional.size() ? a.positional[i] : Value();
        if (i >= a.positional.size()) {
          auto kw = std::find_if(a.keyword.begin(), a.keyword.end(),
                                 [&](const auto& k) { return k.first == macro->params[i]; });
          if (kw != a.keyword.end()) v = kw->second;
          else if (macro->defaults[i]) v = eval(*macro->defaults[i]);
          else v = Value::undefined("parameter '" + macro->params[i] + "' was not provided");
        }
        frame[macro->params[i]] = v;
      }
      for (const auto& [k, v] : a.keyword) {
        const bool known = std::find(macro->params.begin(), macro->params.end(), k) != macro->params.end();
        LOCKSTEP_CHECK(known || k == "caller", "macro '", macro->text, "' takes no keyword argument '", k, "'");
        if (k == "caller") frame[k] = v;
      }
      // A macro calling itself without end overflowed the stack (found by tests/fuzz/fuzz_jinja.cpp);
      // jinja2 stops at Python's recursion limit. Chat templates nest macros a level or two.
      constexpr int kMaxMacroDepth = 100;
      LOCKSTEP_CHECK(macro_depth_ < kMaxMacroDepth, "macro '", macro->text, "': more than ",
                     kMaxMacroDepth, " macro calls deep (a recursion without end?)");
      std::vector<Scope*> saved = scopes_;
      scopes_ = {root_.get(), &frame};
      std::string text;
      ++macro_depth_;
      exec_body(macro->body, text);  // an error ends the whole render, so no restore is needed then
      --macro_depth_;
      scopes_ = saved;
      return Value(text);
    });
  }

  // ---- names and lookups
  Value lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    if (name == "range") return Value::callable("range", [](CallArgs& a) { return range(a); });
    if (name == "namespace" || name == "dict") {
      const bool ns = name == "namespace";
      return Value::callable(name, [ns](CallArgs& a) {
        Dict d;
        for (const Value& p : a.positional) {
          LOCKSTEP_CHECK(p.kind() == Value::Kind::dict, ns ? "namespace" : "dict", "() takes a mapping");
          for (const auto& [k, v] : p.as_dict().items) d.set(k, v);
        }
        for (const auto& [k, v] : a.keyword) d.set(k, v);
        return ns ? Value::namespace_object(std::move(d)) : Value::dict(std::move(d));
      });
    }
    if (name == "raise_exception")
      return Value::callable("raise_exception", [](CallArgs& a) -> Value {
        fail("raise_exception: " + (a.positional.empty() ? std::string() : a.positional[0].str()));
      });
    if (name == "strftime_now") return Value::callable("strftime_now", [this](CallArgs& a) { return strftime_now(a); });
    return Value::undefined("'" + name + "' is undefined");
  }

  static Value range(CallArgs& a) {
    LOCKSTEP_CHECK(a.keyword.empty() && !a.positional.empty() && a.positional.size() <= 3,
                   "range() takes 1 to 3 integer arguments");
    for (const Value& v : a.positional)
      LOCKSTEP_CHECK(v.kind() == Value::Kind::integer, "range() needs integers, got ", v.type_name());
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) stop = a.positional[0].as_int();
    else start = a.positional[0].as_int(), stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
    LOCKSTEP_CHECK(step != 0, "range() step must not be zero");
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      LOCKSTEP_CHECK(out.size() < 100000, "range() too big (more than 100000 items, the sandbox's limit)");
      out.emplace_back(i);
    }
    return Value::list(std::move(out));
  }

  Value strftime_now(CallArgs& a) {
    LOCKSTEP_CHECK(a.positional.size() == 1 && a.positional[0].is_string(), "strftime_now(format) needs a format string");
    std::tm tm{};
    if (options_.now) {
      tm = *options_.now;
    } else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, a.positional[0].as_string().c_str(), &tm);
    return Value(std::string(buf, n));
  }

  static std::string describe_object(const Value& v) {
    return v.kind() == Value::Kind::none ? "None" : v.type_name() + " object";
  }

  Value get_attribute(const Value& v, std::string_view name) {
    if (v.is_undefined()) fail(v.undefined_reason());
    if (v.kind() == Value::Kind::ns) {
      if (const Value* found = v.namespace_attrs().find(name)) return *found;
    } else {
      if (std::optional<Value> method = method_of(v, name)) return *method;
      if (v.kind() == Value::Kind::dict)
        if (const Value* found = v.as_dict().find(name)) return *found;
    }
    return Value::undefined(detail::concat("'", describe_object(v), "' has no attribute '", name, "'"));
  }

  Value get_item(const Value& v, const Value& key) {
    if (v.is_undefined()) fail(v.undefined_reason());
    if (key.kind() == Value::Kind::integer || key.kind() == Value::Kind::boolean) {
      const int64_t i = key.kind() == Value::Kind::boolean ? int64_t(key.as_bool()) : key.as_int();
      if (v.kind() == Value::Kind::list || v.is_string()) {
        if (v.is_string()) {
          const std::u32string u = utf8_to_u32(v.as_string());
          const int64_t at = i < 0 ? i + int64_t(u.size()) : i;
          if (at >= 0 && at < int64_t(u.size())) return Value(u32_to_utf8(std::u32string(1, u[size_t(at)])));
        } else {
          const int64_t n = int64_t(v.as_list().size());
          const int64_t at = i < 0 ? i + n : i;
          if (at >= 0 && at < n) return v.as_list()[size_t(at)];
        }
        return Value::undefined(describe_object(v) + " has no element " + std::to_string(i));
      }
    }
    if (key.is_string()) {
      if (v.kind() == Value::Kind::dict)
        if (const Value* found = v.as_dict().find(key.as_string())) return *found;
      return get_attribute(v, key.as_string());
    }
    return Value::undefined(describe_object(v) + " has no element " + key.repr());
  }

  Value get_slice(const Value& v, const Value& start, const Value& stop, const Value& step) {
    if (v.is_undefined()) fail(v.undefined_reason());
    if (v.is_string()) {
      const std::u32string u = utf8_to_u32(v.as_string());
      std::u32string out;
      for (size_t i : slice_positions(int64_t(u.size()), start, stop, step)) out += u[i];
      return Value(u32_to_utf8(out));
    }
    if (v.kind() == Value::Kind::list) {
      std::vector<Value> out;
      for (size_t i : slice_positions(int64_t(v.as_list().size()), start, stop, step)) out.push_back(v.as_list()[i]);
      return Value::list(std::move(out), v.is_tuple());
    }
    fail("'" + v.type_name() + "' object is not subscriptable");
  }

  // ---- expressions
  CallArgs eval_args(const Expr& e, size_t first = 1) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.keywords) a.keyword.emplace_back(k, eval(*v));
    return a;
  }

  Value call_value(const Value& callee, CallArgs& args) {
    if (callee.is_undefined()) fail(callee.undefined_reason());
    if (callee.kind() != Value::Kind::callable) fail("'" + callee.type_name() + "' object is not callable");
    return callee.as_callable()(args);
  }

  Value eval(const Expr& e) {
    line_ = e.line;
    const NestingLevel nested(render_nesting_, kMaxRenderNesting, too_deep);
    switch (e.kind) {
      case Expr::Kind::constant: return e.value;
      case Expr::Kind::name: return lookup(e.text);
      case Expr::Kind::attribute: return get_attribute(eval(*e.args[0]), e.text);
      case Expr::Kind::subscript: {
        const Value obj = eval(*e.args[0]);
        return get_item(obj, eval(*e.args[1]));
      }
      case Expr::Kind::slice: {
        const Value obj = eval(*e.args[0]);
        const auto opt = [&](const ExprPtr& p) { return p ? eval(*p) : Value::none(); };
        return get_slice(obj, opt(e.args[1]), opt(e.args[2]), opt(e.args[3]));
      }
      case Expr::Kind::call: {
        const Value callee = eval(*e.args[0]);
        CallArgs a = eval_args(e);
        line_ = e.line;
        return call_value(callee, a);
      }
      case Expr::Kind::filter: {
        const Value v = eval(*e.args[0]);
        CallArgs a = eval_args(e);
        line_ = e.line;
        return apply_filter(v, e.text, a, ctx_);
      }
      case Expr::Kind::test: {
        const Value v = eval(*e.args[0]);
        CallArgs a = eval_args(e);
        line_ = e.line;
        return Value(apply_test(v, e.text, a, ctx_) != e.negated);
      }
      case Expr::Kind::unary: {
        const Value v = eval(*e.args[0]);
        if (e.text == "not") return Value(!v.truthy());
        if (v.kind() == Value::Kind::integer || v.kind() == Value::Kind::boolean) {
          const int64_t i = v.kind() == Value::Kind::boolean ? int64_t(v.as_bool()) : v.as_int();
          LOCKSTEP_CHECK(e.text != "-" || i != INT64_MIN, "integer overflow: -(", i, ") does not fit in 64 bits");
          return Value(e.text == "-" ? -i : i);
        }
        if (v.kind() == Value::Kind::floating) return Value(e.text == "-" ? -v.as_double() : v.as_double());
        if (v.is_undefined()) fail(v.undefined_reason());
        fail("bad operand type for unary " + e.text + ": '" + v.type_name() + "'");
      }
      case Expr::Kind::binary: return binary(e);
      case Expr::Kind::conditional:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if's condition was false and it has no else");
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        std::vector<Value> items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return Value::list(std::move(items), e.kind == Expr::Kind::tuple);
      }
      case Expr::Kind::dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i]);
          LOCKSTEP_CHECK(key.is_string(), "dict literal keys must be strings here, got ", key.type_name());
          d.set(key.as_string(), eval(*e.args[i + 1]));
        }
        return Value::dict(std::move(d));
      }
    }
    fail("unknown expression");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.text;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    const Value a = eval(*e.args[0]);
    const Value b = eval(*e.args[1]);
    line_ = e.line;
    if (op == "~") return Value(a.str() + b.str());
    if (op == "==") return Value(a.equals(b));
    if (op == "!=") return Value(!a.equals(b));
    if (op == "in" || op == "not in") return Value(contains(b, a) == (op == "in"));
    if (a.is_undefined()) fail(a.undefined_reason());
    if (b.is_undefined()) fail(b.undefined_reason());
    if (op == "<") return Value(less_than(a, b));
    if (op == ">") return Value(less_than(b, a));
    if (op == "<=") return Value(!less_than(b, a));
    if (op == ">=") return Value(!less_than(a, b));
    return arithmetic(op, a, b);
  }

  static bool contains(const Value& container, const Value& item) {
    switch (container.kind()) {
      case Value::Kind::undefined: return false;
      case Value::Kind::string:
        LOCKSTEP_CHECK(item.is_string(), "'in <string>' requires string as left operand, not ", item.type_name());
        return container.as_string().find(item.as_string()) != std::string::npos;
      case Value::Kind::list:
        for (const Value& v : container.as_list())
          if (v.equals(item)) return true;
        return false;
      case Value::Kind::dict: return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
      default: fail("argument of type '" + container.type_name() + "' is not iterable");
    }
  }

  static Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    const auto unsupported = [&]() -> Value {
      fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    };
    const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::boolean; };
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_string()) fail("can only concatenate str (not \"" + b.type_name() + "\") to str");
      if (a.kind() == Value::Kind::list && b.kind() == Value::Kind::list && a.is_tuple() == b.is_tuple()) {
        std::vector<Value> items = a.as_list();
        items.insert(items.end(), b.as_list().begin(), b.as_list().end());
        return Value::list(std::move(items), a.is_tuple());
      }
    }
    if (op == "*") {
      const Value* seq = a.is_string() || a.kind() == Value::Kind::list ? &a : b.is_string() || b.kind() == Value::Kind::list ? &b : nullptr;
      const Value* count = seq == &a ? &b : &a;
      if (seq && (count->kind() == Value::Kind::integer || count->kind() == Value::Kind::boolean)) {
        const int64_t n = count->kind() == Value::Kind::boolean ? int64_t(count->as_bool()) : count->as_int();
        LOCKSTEP_CHECK(n <= 1000000, "repeating a sequence ", n, " times is beyond the sandbox's limit");
        if (seq->is_string()) {
          std::string out;
          for (int64_t i = 0; i < n; ++i) out += seq->as_string();
          return Value(out);
        }
        std::vector<Value> items;
        for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->as_list().begin(), seq->as_list().end());
        return Value::list(std::move(items), seq->is_tuple());
      }
    }
    if (!numeric(a) || !numeric(b)) return unsupported();
    const bool ints = a.kind() != Value::Kind::floating && b.kind() != Value::Kind::floating;
    const auto as_i = [](const Value& v) { return v.kind() == Value::Kind::boolean ? int64_t(v.as_bool()) : v.as_int(); };
    const auto as_d = [](const Value& v) { return v.kind() == Value::Kind::boolean ? double(v.as_bool()) : v.as_double(); };
    if (ints) {
      // Python's integers have no bound; these are 64-bit, and a result that does not fit is an
      // error (signed overflow found by tests/fuzz/fuzz_jinja.cpp: `2 ** 78`).
      const int64_t x = as_i(a), y = as_i(b);
      int64_t r = 0;
      const auto checked = [&](bool overflowed) {
        LOCKSTEP_CHECK(!overflowed, "integer overflow: ", x, " ", op, " ", y, " does not fit in 64 bits");
        return Value(r);
      };
      if (op == "+") return checked(__builtin_add_overflow(x, y, &r));
      if (op == "-") return checked(__builtin_sub_overflow(x, y, &r));
      if (op == "*") return checked(__builtin_mul_overflow(x, y, &r));
      if (op == "/") {
        LOCKSTEP_CHECK(y != 0, "division by zero");
        return Value(double(x) / double(y));
      }
      if (op == "//" || op == "%") {
        LOCKSTEP_CHECK(y != 0, "integer division or modulo by zero");
        if (y == -1) return op == "//" ? checked(__builtin_sub_overflow(int64_t(0), x, &r)) : Value(int64_t(0));
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) q -= 1, m += y;  // Python floors
        return Value(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) return Value(std::pow(double(x), double(y)));
        // By squaring: log2(y) steps, so `2 ** 10**18` ends (in an overflow error) at once.
        r = 1;
        bool overflowed = false;
        for (int64_t base = x, e = y; e > 0 && !overflowed; e >>= 1) {
          if (e & 1) overflowed = __builtin_mul_overflow(r, base, &r);
          if (e > 1 && !overflowed) overflowed = __builtin_mul_overflow(base, base, &base);
        }
        return checked(overflowed);
      }
    } else {
      const double x = as_d(a), y = as_d(b);
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "/") {
        LOCKSTEP_CHECK(y != 0, "float division by zero");
        return Value(x / y);
      }
      if (op == "//" || op == "%") {
        LOCKSTEP_CHECK(y != 0, "float modulo by zero");
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        if (op == "%") return Value(r);
        const double div = (x - r) / y;  // as Python's float floor division
        double floor_div = std::floor(div);
        if (div - floor_div > 0.5) floor_div += 1;
        return Value(floor_div);
      }
      if (op == "**") return Value(std::pow(x, y));
    }
    return unsupported();
  }
};

}  // namespace
}  // namespace jinja

JinjaTemplate::JinjaTemplate(std::string_view source, std::string name)
    : template_(std::make_unique<jinja::Template>(jinja::parse(source, name, jinja::LexOptions{}))) {}

JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;

std::string JinjaTemplate::render(const nlohmann::ordered_json& variables, const JinjaRenderOptions& options) const {
  jinja::Renderer renderer(*template_, options);
  return renderer.render(variables);
}

const std::string& JinjaTemplate::name() const { return template_->name; }

}  // namespace lockstep
