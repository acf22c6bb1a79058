// io/jinja.h — a Jinja2 template engine for chat templates: the subset of jinja2 3.1 that the
// `chat_template`s of Hugging Face checkpoints use, rendered as transformers' apply_chat_template
// renders them (ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True and the
// loopcontrols extension; globals raise_exception and strftime_now; its own `tojson` filter).
//
// Why our own engine: no maintained C++ Jinja library is packaged (Debian 12 has Python's jinja2 and
// Rust's tera, PyPI no C++ one); Google's minja exists only as source to copy into the tree, which
// this project does not do; and embedding CPython + jinja2 would tie every binary, the GPU
// machines' included, to a Python runtime. Chat templates need a small, well-defined part of
// Jinja, written here in the files io/jinja_*.cpp:
//   jinja_lexer.cpp   source -> text / {{ }} / {% %} pieces with the whitespace rules, and tokens
//   jinja_parser.cpp  tokens -> syntax tree (jinja_syntax.h), jinja2's precedence
//   jinja_render.cpp  the tree -> text: scopes, loops, macros, attribute and item lookup
//   jinja_builtins.cpp filters, tests, and Python's str/dict methods
//   jinja_value.cpp   Python-like values (jinja_value.h), str()/repr(), json.dumps
//
// Supported: {{ }}, {% %}, {# #}, `-`/`+` whitespace control; if/elif/else; for (tuple targets,
// `for … if …`, else, the `loop` object: index, index0, revindex, revindex0, first, last, length,
// previtem, nextitem, cycle); break/continue; set (names, tuples, `ns.attr =` on namespace(),
// {% set x %}…{% endset %}); macro and {% call %}; transformers' {% generation %}; literals, lists,
// tuples, dicts, attributes, subscripts and slices, arithmetic, `~`, comparisons, in / not in,
// and/or/not, `a if c else b`, filters and tests (jinja_builtins.cpp lists them), and calls of the
// globals range, dict, namespace, raise_exception, strftime_now and of str/dict methods.
// Anything else (another statement, filter, test or method, {% include %}, …) is an error naming
// the construct and the template line. Undefined variables behave as jinja2's default Undefined.
//
// Checked by tests/io/test_jinja.cpp (constructs against jinja2's output) and
// tests/io/test_chat.cpp (the real templates of SmolLM2, Qwen2.5, Qwen3 and Llama 3.x).
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lockstep {

namespace jinja {
struct Template;
}

struct JinjaRenderOptions {
  // The local time `strftime_now(format)` formats (transformers: datetime.now()); empty: now.
  std::optional<std::tm> now;
};

class JinjaTemplate {
 public:
  // Parses `source`; a syntax error or an unsupported construct throws lockstep::Error starting
  // with "`name`:line: ".
  JinjaTemplate(std::string_view source, std::string name);
  ~JinjaTemplate();
  JinjaTemplate(JinjaTemplate&&) noexcept;
  JinjaTemplate& operator=(JinjaTemplate&&) noexcept;

  // Renders with the top-level variables of `variables` (a JSON object; its objects keep their
  // key order). Errors, raise_exception's included, throw lockstep::Error naming the line.
  std::string render(const nlohmann::ordered_json& variables, const JinjaRenderOptions& options = {}) const;

  const std::string& name() const;

 private:
  std::unique_ptr<jinja::Template> template_;
};

}  // namespace lockstep
