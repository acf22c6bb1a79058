// io/jinja_syntax.h — the tokens and the syntax tree of a Jinja template (io/jinja.h): what the
// lexer (jinja_lexer.cpp) and the parser (jinja_parser.cpp) make and the renderer
// (jinja_render.cpp) walks.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/jinja_value.h"

namespace lockstep::jinja {

// ---- lexing

// One level of a nesting count for its lifetime: how the parser and the renderer bound how deep a
// template nests (each recursion level uses the stack). When `limit` levels are already open,
// `too_deep` runs instead; it must throw.
class NestingLevel {
 public:
  template <class TooDeep>
  NestingLevel(int& nesting, int limit, TooDeep too_deep) : nesting_(nesting) {
    if (nesting_ >= limit) too_deep();
    ++nesting_;
  }
  ~NestingLevel() { --nesting_; }
  NestingLevel(const NestingLevel&) = delete;
  NestingLevel& operator=(const NestingLevel&) = delete;

 private:
  int& nesting_;
};

struct Token {
  enum class Kind { name, string, integer, floating, op, end };
  Kind kind = Kind::end;
  std::string text;  // name, operator, or the decoded string literal
  int64_t integer = 0;
  double floating = 0;
  int line = 0;
};

// One piece of the template after whitespace control: literal text, {{ expression }}, or
// {% statement %} (comments are dropped).
struct Piece {
  enum class Kind { text, output, statement };
  Kind kind = Kind::text;
  std::string text;           // kind text
  std::vector<Token> tokens;  // output / statement, ending with a Token::Kind::end
  int line = 0;               // where it starts
};

struct LexOptions {
  bool trim_blocks = true;    // drop the first newline after a block tag
  bool lstrip_blocks = true;  // drop spaces and tabs from a line's start to a block tag
};

// Splits `source` into pieces as jinja2's lexer does (newlines normalized, one trailing newline
// dropped, `-`/`+` whitespace control, trim_blocks, lstrip_blocks). `name` is used in errors.
std::vector<Piece> lex(std::string_view source, std::string_view name, const LexOptions& options);

// ---- syntax tree

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    constant,   // value
    name,       // text
    attribute,  // args[0].text
    subscript,  // args[0][args[1]]
    slice,      // args[0][args[1]:args[2]:args[3]] (null: omitted)
    call,       // args[0](args[1..] , keywords)
    filter,     // args[0] | text(args[1..], keywords)
    test,       // args[0] is [not] text(args[1..])
    unary,      // text args[0]: "-", "+", "not"
    binary,     // args[0] text args[1]: + - * / // % ** ~ == != < <= > >= in "not in" and or
    conditional,  // args[0] if args[1] else args[2] (args[2] null: undefined)
    list, tuple,  // args
    dict,         // keys: args[2k], values: args[2k+1]
  };
  Kind kind = Kind::constant;
  std::string text;
  Value value;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  bool negated = false;  // test: `is not`
  int line = 0;
  int depth = 1;  // nodes on the longest path down from this one (the parser bounds it)
};

struct Stmt;
using Body = std::vector<std::shared_ptr<const Stmt>>;

// An assignment target: a name, `ns.attribute`, or a tuple of names.
struct Target {
  std::vector<std::string> names;  // one name, or the names of a tuple
  bool tuple = false;
  std::string attribute;  // `names[0].attribute = …` (namespace objects)
};

struct Stmt {
  enum class Kind { text, output, if_, for_, set, set_block, macro, call_block, break_, continue_, generation };
  Kind kind = Kind::text;
  int line = 0;
  std::string text;                      // text; macro name
  ExprPtr expr;                          // output; set value; for iterable; call_block call
  Target target;                         // set, set_block, for
  ExprPtr filter;                        // for … if filter
  std::vector<std::pair<ExprPtr, Body>> branches;  // if / elif
  Body body, else_body;                  // for, set_block, macro, call_block, generation; if/for else
  std::vector<std::string> params;       // macro parameters
  std::vector<ExprPtr> defaults;         // macro defaults (null: none), one per parameter
};

struct Template {
  std::string name;
  Body body;
};

// Parses a lexed template; unknown statements, filters and tests are errors naming them and
// their line.
Template parse(std::string_view source, std::string_view name, const LexOptions& options);

}  // namespace lockstep::jinja
