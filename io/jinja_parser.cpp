// io/jinja_parser.cpp — pieces and tokens to the syntax tree, with jinja2's grammar and operator
// precedence (jinja2/parser.py), loosest first:
//   a if c else b;  or;  and;  not;  == != < <= > >= in `not in`;  + -;  ~;  * / // %;  **;
//   unary - +;  then postfix .attr [index] [a:b:c] (call), and the filter/test chain | f, is t.
// So `'x' + y | trim` is `'x' + (y | trim)`, and `not x is defined` is `not (x is defined)`.
#include <algorithm>
#include <optional>
#include <set>

#include "core/error.h"
#include "io/jinja_builtins.h"
#include "io/jinja_syntax.h"

namespace lockstep::jinja {
namespace {

class Parser {
 public:
  Parser(std::vector<Piece> pieces, std::string_view name) : pieces_(std::move(pieces)), name_(name) {}

  Body parse_template() {
    Body body = parse_body({});
    return body;
  }

 private:
  std::vector<Piece> pieces_;
  std::string name_;
  size_t piece_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  size_t tok_ = 0;

  // Parsing, rendering and freeing a syntax tree recurse once per level of nesting, so a template
  // nested without bound (`{{ ++++…x }}`, `{{ 1+1+…+1 }}`, `{% if %}` in `{% if %}`…) overflowed
  // the stack (found by tests/fuzz/fuzz_jinja.cpp). jinja2 stops at Python's recursion limit;
  // chat templates nest a few levels.
  static constexpr int kMaxNesting = 100;
  int expression_nesting_ = 0;  // prefix operators and brackets being parsed
  int block_nesting_ = 0;       // statement bodies being parsed

  // A NestingLevel's action past kMaxNesting levels: an error naming `what` and the line.
  auto too_deep(int line, const char* what) const {
    return [this, line, what] {
      error(line, std::string(what) + " nested more than " + std::to_string(kMaxNesting) + " deep");
    };
  }

  [[noreturn]] void error(int line, const std::string& what) const {
    fail(name_ + ":" + std::to_string(line) + ": " + what);
  }

  // ---- token stream of the current tag
  const Token& peek(size_t ahead = 0) const {
    const size_t i = std::min(tok_ + ahead, tokens_->size() - 1);
    return (*tokens_)[i];
  }
  const Token& next() {
    const Token& t = peek();
    if (tok_ + 1 < tokens_->size()) ++tok_;
    return t;
  }
  bool at_op(std::string_view op) const { return peek().kind == Token::Kind::op && peek().text == op; }
  bool at_name(std::string_view n, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::name && peek(ahead).text == n;
  }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!at_name(n)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::end: return "end of tag";
      case Token::Kind::string: return "string literal";
      case Token::Kind::integer:
      case Token::Kind::floating: return "number";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) error(peek().line, "expected '" + std::string(op) + "', found " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::name) error(peek().line, "expected a name, found " + describe(peek()));
    return next().text;
  }
  void expect_end() {
    if (peek().kind != Token::Kind::end) error(peek().line, "expected end of tag, found " + describe(peek()));
  }

  // ---- statements
  // Parses pieces until a statement whose keyword is in `ends` (left current); at the top level
  // (`ends` empty) until the end of the template.
  Body parse_body(const std::set<std::string>& ends) {
    std::optional<NestingLevel> nested;  // the template's own body is no nesting
    if (!ends.empty())
      nested.emplace(block_nesting_, kMaxNesting,
                     too_deep(piece_ > 0 ? pieces_[piece_ - 1].line : 1, "statement blocks"));
    Body body;
    while (piece_ < pieces_.size()) {
      const Piece& p = pieces_[piece_];
      if (p.kind == Piece::Kind::text) {
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::text;
        s->text = p.text;
        s->line = p.line;
        body.push_back(s);
        ++piece_;
        continue;
      }
      tokens_ = &p.tokens;
      tok_ = 0;
      if (p.kind == Piece::Kind::output) {
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::output;
        s->line = p.line;
        s->expr = parse_tuple_expression();
        expect_end();
        body.push_back(s);
        ++piece_;
        continue;
      }
      if (peek().kind != Token::Kind::name) error(p.line, "expected a statement name after '{%'");
      const std::string keyword = peek().text;
      if (ends.count(keyword)) return body;
      ++piece_;
      next();
      body.push_back(parse_statement(keyword, p.line));
    }
    if (!ends.empty()) {
      std::string expected;
      for (const auto& e : ends) expected += (expected.empty() ? "'" : " or '") + e + "'";
      error(pieces_.empty() ? 1 : pieces_.back().line, "unexpected end of template: expected " + expected);
    }
    return body;
  }

  // The current piece is the end tag `keyword`; consume it.
  void take_end(const std::string& keyword) {
    const Piece& p = pieces_[piece_];
    tokens_ = &p.tokens;
    tok_ = 0;
    if (!skip_name(keyword)) error(p.line, "expected '{% " + keyword + " %}'");
    ++piece_;
  }

  // Enters the statement piece at piece_ (an `elif`/`else`/end tag found by parse_body).
  std::string enter_current() {
    const Piece& p = pieces_[piece_];
    tokens_ = &p.tokens;
    tok_ = 0;
    ++piece_;
    return next().text;
  }

  std::shared_ptr<const Stmt> parse_statement(const std::string& keyword, int line) {
    auto s = std::make_shared<Stmt>();
    s->line = line;
    if (keyword == "if") {
      s->kind = Stmt::Kind::if_;
      ExprPtr cond = parse_expression();
      expect_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"});
        s->branches.emplace_back(cond, std::move(b));
        const std::string k = enter_current();
        if (k == "elif") {
          cond = parse_expression();
          expect_end();
          continue;
        }
        if (k == "else") {
          expect_end();
          s->else_body = parse_body({"endif"});
          enter_current();
        }
        expect_end();
        break;
      }
    } else if (keyword == "for") {
      s->kind = Stmt::Kind::for_;
      s->target = parse_target();
      if (!skip_name("in")) error(peek().line, "expected 'in' in the for statement, found " + describe(peek()));
      s->expr = parse_tuple_expression(/*stop_at_if=*/true);
      if (skip_name("if")) s->filter = parse_expression();
      if (at_name("recursive")) error(peek().line, "recursive for loops are not supported");
      expect_end();
      s->body = parse_body({"else", "endfor"});
      if (enter_current() == "else") {
        expect_end();
        s->else_body = parse_body({"endfor"});
        enter_current();
      }
      expect_end();
    } else if (keyword == "set") {
      s->target = parse_target();
      if (skip_op("=")) {
        s->kind = Stmt::Kind::set;
        s->expr = parse_tuple_expression();
        expect_end();
      } else {
        if (at_op("|")) error(peek().line, "filtered block assignment ({% set x | filter %}) is not supported");
        s->kind = Stmt::Kind::set_block;
        if (s->target.tuple || !s->target.attribute.empty())
          error(line, "a block assignment needs a plain name");
        expect_end();
        s->body = parse_body({"endset"});
        take_end("endset");
        expect_end();
      }
    } else if (keyword == "macro") {
      s->kind = Stmt::Kind::macro;
      s->text = expect_name();
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (skip_op(")")) break;
        s->params.push_back(expect_name());
        s->defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
      }
      expect_end();
      s->body = parse_body({"endmacro"});
      take_end("endmacro");
      expect_end();
    } else if (keyword == "call") {
      s->kind = Stmt::Kind::call_block;
      if (at_op("(")) error(line, "{% call(args) %} with caller arguments is not supported");
      s->expr = parse_expression();
      if (s->expr->kind != Expr::Kind::call) error(line, "{% call %} needs a macro call");
      expect_end();
      s->body = parse_body({"endcall"});
      take_end("endcall");
      expect_end();
    } else if (keyword == "break" || keyword == "continue") {
      s->kind = keyword == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_;
      expect_end();
    } else if (keyword == "generation") {
      // transformers' AssistantTracker extension: marks assistant text; renders its body.
      s->kind = Stmt::Kind::generation;
      expect_end();
      s->body = parse_body({"endgeneration"});
      take_end("endgeneration");
      expect_end();
    } else {
      static const std::set<std::string> known = {"block", "extends", "include", "import", "from", "raw",
                                                  "filter", "with", "autoescape", "do", "trans"};
      if (known.count(keyword))
        error(line, "the '{% " + keyword + " %}' statement is not supported by lockstep's Jinja subset");
      error(line, "unknown statement '{% " + keyword + " %}'");
    }
    return s;
  }

  Target parse_target() {
    Target t;
    const bool paren = skip_op("(");
    t.names.push_back(expect_name());
    if (skip_op(".")) {
      t.attribute = expect_name();
      if (paren) expect_op(")");
      return t;
    }
    while (skip_op(",")) {
      t.tuple = true;
      if (peek().kind != Token::Kind::name) break;
      t.names.push_back(expect_name());
    }
    if (paren) {
      expect_op(")");
      t.tuple = true;
    }
    return t;
  }

  // ---- expressions
  ExprPtr make(Expr::Kind kind, int line, std::vector<ExprPtr> args = {}, std::string text = {}) const {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->line = line;
    e->args = std::move(args);
    e->text = std::move(text);
    return bounded(std::move(e));
  }

  // Sets e's depth from its operands'; a tree deeper than kMaxNesting is an error. Operators that
  // chain without recursing in the parser (`1+1+…`, `x|f|f…`, `a.b.c…`) grow the tree here.
  ExprPtr bounded(std::shared_ptr<Expr> e) const {
    for (const ExprPtr& a : e->args)
      if (a) e->depth = std::max(e->depth, a->depth + 1);
    for (const auto& [key, value] : e->keywords) e->depth = std::max(e->depth, value->depth + 1);
    if (e->depth > kMaxNesting)
      error(e->line, "expression nested more than " + std::to_string(kMaxNesting) + " deep");
    return e;
  }

  // `a, b` without parentheses makes a tuple (as in `{% set x = 1, 2 %}`).
  ExprPtr parse_tuple_expression(bool stop_at_if = false) {
    const int line = peek().line;
    ExprPtr first = stop_at_if ? parse_or() : parse_expression();
    if (!at_op(",")) return first;
    std::vector<ExprPtr> items{first};
    while (skip_op(",")) {
      if (peek().kind == Token::Kind::end || at_name("if")) break;
      items.push_back(stop_at_if ? parse_or() : parse_expression());
    }
    return make(Expr::Kind::tuple, line, std::move(items));
  }

  ExprPtr parse_expression() {
    ExprPtr e = parse_or();
    while (at_name("if")) {
      const int line = next().line;
      ExprPtr cond = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression() : nullptr;
      e = make(Expr::Kind::conditional, line, {e, cond, otherwise});
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (at_name("or")) {
      const int line = next().line;
      e = make(Expr::Kind::binary, line, {e, parse_and()}, "or");
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (at_name("and")) {
      const int line = next().line;
      e = make(Expr::Kind::binary, line, {e, parse_not()}, "and");
    }
    return e;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      const int line = next().line;
      const NestingLevel nested(expression_nesting_, kMaxNesting, too_deep(line, "expression"));
      return make(Expr::Kind::unary, line, {parse_not()}, "not");
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const int line = peek().line;
      std::string op;
      if (peek().kind == Token::Kind::op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
           peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return e;
      }
      e = make(Expr::Kind::binary, line, {e, parse_math1()}, op);
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& t = next();
      e = make(Expr::Kind::binary, t.line, {e, parse_concat()}, t.text);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (at_op("~")) {
      const int line = next().line;
      e = make(Expr::Kind::binary, line, {e, parse_math2()}, "~");
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& t = next();
      e = make(Expr::Kind::binary, t.line, {e, parse_pow()}, t.text);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    while (at_op("**")) {
      const int line = next().line;
      e = make(Expr::Kind::binary, line, {e, parse_unary()}, "**");
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter = true) {
    const NestingLevel nested(expression_nesting_, kMaxNesting, too_deep(peek().line, "expression"));
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const Token& t = next();
      e = make(Expr::Kind::unary, t.line, {parse_unary(false)}, t.text);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(e);
    if (with_filter) e = parse_filter_chain(e);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = next();
    switch (t.kind) {
      case Token::Kind::name: {
        if (t.text == "true" || t.text == "True") return constant(Value(true), t.line);
        if (t.text == "false" || t.text == "False") return constant(Value(false), t.line);
        if (t.text == "none" || t.text == "None") return constant(Value::none(), t.line);
        return make(Expr::Kind::name, t.line, {}, t.text);
      }
      case Token::Kind::string: {
        std::string s = t.text;
        while (peek().kind == Token::Kind::string) s += next().text;  // adjacent literals join
        return constant(Value(std::move(s)), t.line);
      }
      case Token::Kind::integer: return constant(Value(t.integer), t.line);
      case Token::Kind::floating: return constant(Value(t.floating), t.line);
      case Token::Kind::op: {
        if (t.text == "(") {
          if (skip_op(")")) return make(Expr::Kind::tuple, t.line);
          ExprPtr first = parse_expression();
          if (skip_op(")")) return first;
          std::vector<ExprPtr> items{first};
          while (skip_op(",")) {
            if (at_op(")")) break;
            items.push_back(parse_expression());
          }
          expect_op(")");
          return make(Expr::Kind::tuple, t.line, std::move(items));
        }
        if (t.text == "[") {
          std::vector<ExprPtr> items;
          while (!skip_op("]")) {
            if (!items.empty()) expect_op(",");
            if (skip_op("]")) break;
            items.push_back(parse_expression());
          }
          return make(Expr::Kind::list, t.line, std::move(items));
        }
        if (t.text == "{") {
          std::vector<ExprPtr> items;
          while (!skip_op("}")) {
            if (!items.empty()) expect_op(",");
            if (skip_op("}")) break;
            items.push_back(parse_expression());
            expect_op(":");
            items.push_back(parse_expression());
          }
          return make(Expr::Kind::dict, t.line, std::move(items));
        }
        break;
      }
      default: break;
    }
    error(t.line, "unexpected " + describe(t) + " in an expression");
  }

  ExprPtr constant(Value v, int line) {
    auto e = std::make_shared<Expr>();
    e->kind = Expr::Kind::constant;
    e->value = std::move(v);
    e->line = line;
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (at_op(".")) {
        const int line = next().line;
        const Token& t = next();
        if (t.kind == Token::Kind::name) {
          e = make(Expr::Kind::attribute, line, {e}, t.text);
        } else if (t.kind == Token::Kind::integer) {
          e = make(Expr::Kind::subscript, line, {e, constant(Value(t.integer), line)});
        } else {
          error(line, "expected an attribute name after '.', found " + describe(t));
        }
      } else if (at_op("[")) {
        e = parse_subscript(e);
      } else if (at_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr e) {
    const int line = next().line;  // '['
    ExprPtr start, stop, step;
    bool is_slice = false;
    if (!at_op(":")) start = parse_expression();
    if (skip_op(":")) {
      is_slice = true;
      if (!at_op("]") && !at_op(":")) stop = parse_expression();
      if (skip_op(":") && !at_op("]")) step = parse_expression();
    }
    expect_op("]");
    if (!is_slice) return make(Expr::Kind::subscript, line, {e, start});
    return make(Expr::Kind::slice, line, {e, start, stop, step});
  }

  // Call arguments `(a, b, k=v)` into e's args (after those it has) and keywords.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (at_op("*") || at_op("**")) error(peek().line, "*args and **kwargs in calls are not supported");
      if (peek().kind == Token::Kind::name && peek(1).kind == Token::Kind::op && peek(1).text == "=") {
        std::string key = next().text;
        next();
        e.keywords.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.keywords.empty()) error(peek().line, "a positional argument follows a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = std::make_shared<Expr>();
    e->kind = Expr::Kind::call;
    e->line = peek().line;
    e->args.push_back(callee);
    parse_call_args(*e);
    return bounded(std::move(e));
  }

  ExprPtr parse_filter_chain(ExprPtr e) {
    while (true) {
      if (at_op("|")) {
        const int line = next().line;
        std::string filter = expect_name();
        while (skip_op(".")) filter += "." + expect_name();
        if (!is_known_filter(filter))
          error(line, "unknown filter '" + filter + "' (not in lockstep's Jinja subset)");
        auto f = std::make_shared<Expr>();
        f->kind = Expr::Kind::filter;
        f->line = line;
        f->text = filter;
        f->args.push_back(e);
        if (at_op("(")) parse_call_args(*f);
        e = bounded(std::move(f));
      } else if (at_name("is")) {
        const int line = next().line;
        auto t = std::make_shared<Expr>();
        t->kind = Expr::Kind::test;
        t->line = line;
        t->negated = skip_name("not");
        t->text = expect_name();
        while (skip_op(".")) t->text += "." + expect_name();
        if (!is_known_test(t->text))
          error(line, "unknown test '" + t->text + "' (not in lockstep's Jinja subset)");
        t->args.push_back(e);
        if (at_op("(")) {
          parse_call_args(*t);
        } else if ((peek().kind == Token::Kind::name || peek().kind == Token::Kind::string ||
                    peek().kind == Token::Kind::integer || peek().kind == Token::Kind::floating ||
                    at_op("[") || at_op("{")) &&
                   !at_name("else") && !at_name("or") && !at_name("and")) {
          // `x is divisibleby 3`, `x is sameas false`: one argument without parentheses.
          if (at_name("is")) error(peek().line, "tests cannot be chained with 'is'");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = bounded(std::move(t));
      } else if (at_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Template parse(std::string_view source, std::string_view name, const LexOptions& options) {
  Parser parser(lex(source, name, options), name);
  return Template{std::string(name), parser.parse_template()};
}

}  // namespace lockstep::jinja
