#!/usr/bin/env python3
"""Writes the chat-template test fixtures under tests/data/, rendered by the real libraries —
transformers' own chat-template renderer (jinja2 in its ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception and strftime_now), jinja2, and
HF `tokenizers` for ids — never by lockstep's own code.

  pip install transformers jinja2 tokenizers
  python3 scripts/dev/gen_chat_fixtures.py [--shared-data ../shared/data]

Inputs (committed, verbatim copies of the models' published templates; data, not code):
  tests/data/chat_templates/smollm2-135m-instruct.jinja  SmolLM2-135M-Instruct (its GGUF's tokenizer.chat_template)
  tests/data/chat_templates/qwen2.5-instruct.jinja       Qwen2.5-*-Instruct
  tests/data/chat_templates/qwen3.jinja                  Qwen3 (= ../shared/data/qwen3-tokenizer/tokenizer_config.json's)
  tests/data/chat_templates/llama-3.2-instruct.jinja     Llama-3.2-*-Instruct (strftime_now for the date)
  tests/data/chat_templates/llama-3.3-instruct.jinja     Llama-3.3-70B-Instruct (fixed date, builtin_tools); the
                                                         published Llama-3.1-8B-Instruct template is reported
                                                         byte-identical (not checked here)
(Copied from the copies kept under models/templates/ in llama.cpp, the SmolLM2 GGUF and the shared Qwen3
tokenizer_config.json, with "\n" line ends — jinja2 normalizes line ends anyway.)

Outputs (small, committed):
  tests/data/chat_cases.json           the written-out formats (io/chat.h ChatFormat) against the Qwen3 and
                                       Llama-3 templates, with HF ids
  tests/data/chat_template_cases.json  each template above rendered for a set of conversations (system +
                                       user, user only, multi-turn, tool calls, newlines/unicode/quotes/
                                       braces), with and without a generation prompt, Qwen3 with thinking on,
                                       off and unset; errors the templates raise; Qwen3 through
                                       AutoTokenizer.apply_chat_template (text and ids)
  tests/data/chat_jinja_cases.json     small templates, one Jinja construct each, and their renders
"""
import argparse
import datetime as dt
import json
import pathlib

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import AutoTokenizer

from gen_tokenizer_fixtures import write_json  # one JSON layout for every fixture

REPO = pathlib.Path(__file__).resolve().parents[2]  # scripts/dev/ -> the repository root
OUT = REPO / "tests" / "data"
TEMPLATES = OUT / "chat_templates"

# strftime_now's clock in the fixtures; the C++ test passes the same local time.
NOW = dt.datetime(2025, 3, 7, 9, 30, 0)


class FixedDatetime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


ctu.datetime = FixedDatetime  # transformers' strftime_now calls datetime.now()

# The special tokens transformers passes to each template (tokenizer.special_tokens_map of the model).
SPECIAL_TOKENS = {
    "smollm2-135m-instruct": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                              "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>",
                              "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]},
    "qwen2.5-instruct": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                         "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]},
    "qwen3": None,  # from ../shared/data/qwen3-tokenizer/tokenizer_config.json
    "llama-3.2-instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama-3.3-instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}

TRICKY = ("Line one\n  line two\n\n\tTabbed: Üñíçødé ✓ 你好 😀 — \"double\" 'single' \\backslash\\ "
          "{{ not a tag }} {% raw %} {# nor a comment #} <|im_end|> </s>")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city — °C or °F.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "a + b",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "number"}, "b": {"type": "number"}}}}},
]

CONVERSATIONS = {
    "system_user": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is 2+2?"}],
    "user_only": [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April. How many?"}],
    "empty_system": [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}],
    "padded": [{"role": "system", "content": "  Be brief. \n"}, {"role": "user", "content": "\n  padded question \n\n"}],
    "tricky_text": [{"role": "system", "content": "Answer in \"quotes\" {like} this."},
                    {"role": "user", "content": TRICKY}],
    "multi_turn": [{"role": "system", "content": "You are terse."},
                   {"role": "user", "content": "What is 3*4?"},
                   {"role": "assistant", "content": "12"},
                   {"role": "user", "content": "And 12/5?"}],
    "multi_turn_thinking": [{"role": "user", "content": "Pick a number."},
                            {"role": "assistant", "content": "<think>\nAny will do.\n</think>\n\n7"},
                            {"role": "user", "content": "Another?"},
                            {"role": "assistant", "content": "<think>\nlast one\n</think>\n\n9"}],
}

TOOL_CONVERSATIONS = {
    "tool_call": [{"role": "system", "content": "Use tools when needed."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"type": "function", "function": {"name": "get_weather",
                                                        "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                  {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
                  {"role": "tool", "content": "second result"}],
}


def special_tokens(name, qwen3_config):
    if name != "qwen3":
        return SPECIAL_TOKENS[name]
    keys = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
            "additional_special_tokens"]
    return {k: qwen3_config[k] for k in keys if qwen3_config.get(k) is not None}


def render(template, messages, add_generation_prompt, variables):
    """transformers' apply_chat_template(tokenize=False) rendering; ('error', message) if it raises."""
    try:
        out, _ = ctu.render_jinja_template(conversations=[messages], chat_template=template,
                                           add_generation_prompt=add_generation_prompt, **variables)
        return out[0], None
    except jinja2.exceptions.TemplateError as e:
        return None, str(e)


def template_cases(qwen3_config):
    templates, cases = {}, []
    for path in sorted(TEMPLATES.glob("*.jinja")):
        name = path.stem
        source = path.read_text(encoding="utf-8")
        templates[name] = {"file": f"chat_templates/{path.name}", "variables": special_tokens(name, qwen3_config)}
        if name == "qwen3":
            assert source == qwen3_config["chat_template"], "qwen3.jinja differs from the shared tokenizer_config"
        variants = [{}]
        if name == "qwen3":
            variants = [{}, {"enable_thinking": True}, {"enable_thinking": False}]
        if name == "llama-3.3-instruct":
            variants = [{}, {"date_string": "01 Jan 2026"}]
        conversations = dict(CONVERSATIONS)
        if name != "smollm2-135m-instruct":  # SmolLM2's template has no tool support
            conversations.update(TOOL_CONVERSATIONS)
        for conv_name, messages in conversations.items():
            for extra in variants:
                for gen in (True, False):
                    tools = TOOLS if conv_name in TOOL_CONVERSATIONS else None
                    variables = dict(templates[name]["variables"], **extra)
                    try:
                        out, _ = ctu.render_jinja_template(conversations=[messages], tools=tools,
                                                           chat_template=source, add_generation_prompt=gen,
                                                           **variables)
                        text, error = out[0], None
                    except jinja2.exceptions.TemplateError as e:
                        text, error = None, str(e)
                    case = {"template": name, "conversation": conv_name, "messages": messages,
                            "tools": tools, "add_generation_prompt": gen, "extra": extra}
                    case.update({"text": text} if error is None else {"error": error})
                    cases.append(case)
    # Errors the templates raise themselves (raise_exception) and that jinja2 raises.
    two_calls = [{"role": "user", "content": "Two things"},
                 {"role": "assistant", "content": "", "tool_calls": [
                     {"function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
                     {"function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]}]
    for name in ("llama-3.2-instruct", "llama-3.3-instruct"):
        source = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
        _, error = render(source, two_calls, True, templates[name]["variables"])
        assert error == "This model only supports single tool-calls at once!", error
        cases.append({"template": name, "conversation": "two_tool_calls", "messages": two_calls, "tools": None,
                      "add_generation_prompt": True, "extra": {}, "error": error})
    # Llama 3.3 with builtin tools: reject/join filters, `| items`, the ipython turn's end token.
    builtin = [{"role": "user", "content": "Search it"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "brave_search", "arguments": {"query": "lockstep \"fp8\"", "n": "3"}}}]},
               {"role": "ipython", "content": {"results": ["a", "b"], "score": 0.5, "ok": True, "none": None}}]
    source = (TEMPLATES / "llama-3.3-instruct.jinja").read_text(encoding="utf-8")
    extra = {"builtin_tools": ["code_interpreter", "brave_search", "wolfram_alpha"]}
    text, error = render(source, builtin, True, dict(templates["llama-3.3-instruct"]["variables"], **extra))
    assert error is None, error
    cases.append({"template": "llama-3.3-instruct", "conversation": "builtin_tools", "messages": builtin,
                  "tools": None, "add_generation_prompt": True, "extra": extra, "text": text})
    return templates, cases


def qwen3_apply_chat_template(shared):
    """Qwen3 end to end: AutoTokenizer.apply_chat_template's text and ids from the checkpoint folder."""
    tok = AutoTokenizer.from_pretrained(str(shared / "qwen3-tokenizer"))
    cases = []
    for conv_name in ("system_user", "user_only", "tricky_text", "multi_turn"):
        for extra in ({}, {"enable_thinking": False}):
            messages = CONVERSATIONS[conv_name]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
            ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False,
                                          **extra)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            cases.append({"conversation": conv_name, "messages": messages, "extra": extra, "text": text,
                          "ids": list(ids)})
    return cases


# One construct each, rendered in transformers' environment: (template, variables).
JINJA_CASES = [
    ("{{ 'a' }}  {{- ' b' }} {{ 'c' -}}   \n d", {}),
    ("x\n  {% if true %}\n    y\n  {% endif %}\nz", {}),
    ("x\n  {%+ if true %}y{% endif %}\n{# c #}\n  {#- c2 -#}  w\n", {}),
    ("{% for i in [1, 2, 3] %}{{ i }}{% endfor %}\n", {}),
    ("a\n\u3000 {% if true %}b{% endif %}\n\f{% if true %}c{% endif %} {% if true %}d{% endif %}\r\ne", {}),
    ("a  {% if true %}b{% endif %}  c\n    {{ 'kept indent' }}\n", {}),
    ("{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
     "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }}/"
     "{{ loop.cycle('odd', 'even') }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs if x > 1 %}{{ x }}{{ ',' if not loop.last }}{% else %}none{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | items %}{{ k }}{% endfor %}",
     {"d": {"z": 1, "a": [1, 2], "m": None}}),
    ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}"
     "{{ x }}{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
     "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set c %}block {{ a }}{% endset %}[{{ c }}]", {}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} "
     "{{ greet('B', '?') }} {{ greet(name='C', punct='.') }}", {}),
    ("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inside {{ 1 + 1 }}{% endcall %}", {}),
    ("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} "
     "{{ 2 ** 10 }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 3.0 }} {{ -0.0 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }} {{ (1, 2) }} {{ (1,) }} "
     "{{ {'k': 'v', 'q': \"it's\"} }} {{ none }} {{ [none, true, 1.0, 'x\\ny'] }}", {}),
    ("{{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 2 < 3 <= 3 }} {{ 'b' > 'a' }} {{ 1 in [1, 2] }} {{ 'x' not in 'abc' }} "
     "{{ 'k' in {'k': 1} }} {{ true and 'yes' }} {{ 0 or 'fallback' }} {{ not none }}", {}),
    ("{{ 'yes' if x else 'no' }} {{ 'shown' if y }}|{{ x if x is defined else 'undef' }}", {"x": 0}),
    ("{{ s[0] }}{{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[:-1] }} {{ xs[1:] }} {{ xs[::-1] }} {{ xs[::2] }} "
     "{{ xs[-2:] }} {{ xs[5:] }}", {"s": "héllo", "xs": [1, 2, 3, 4]}),
    ("{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d.missing }}|{{ d.missing is defined }} {{ xs.0 }} {{ d.get('a') }} "
     "{{ d.get('zz', 'dflt') }} {{ d.keys() | list }} {{ d.values() | list | length }}",
     {"d": {"a": 1, "b": {"c": "deep"}}, "xs": ["first"]}),
    ("{{ undefined_name }}|{{ undefined_name is defined }}|{{ undefined_name | length }}|"
     "{% for x in undefined_name %}never{% endfor %}|{{ undefined_name | default('d') }}|"
     "{{ undefined_name is none }}|{{ none is none }}|{{ '' | default('empty', true) }}", {}),
    ("{{ x is string }} {{ x is mapping }} {{ d is mapping }} {{ xs is iterable }} {{ 3 is number }} "
     "{{ 3 is integer }} {{ 3.5 is float }} {{ true is boolean }} {{ false is false }} {{ true is true }} "
     "{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 2 is in [1, 2] }} {{ 'a' is eq 'a' }} "
     "{{ x is not none }} {{ none is sameas none }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ x is defined }}",
     {"x": "s", "d": {}, "xs": [1]}),
    ("[{{ '  pad \\n' | trim }}] [{{ 'xxhixx' | trim('x') }}] {{ 'abc' | length }} {{ [1, 2] | count }} "
     "{{ 'Hi' | upper }} {{ 'Hi' | lower }} {{ 'hello world-wide (x)' | title }} {{ 'hELLO' | capitalize }} "
     "{{ 'a-b-c' | replace('-', '+') }} {{ 'a-b-c' | replace('-', '', 1) }} {{ [1, 'b', none] | join(', ') }} "
     "{{ 'abc' | first }} {{ [1, 2] | last }} {{ 'abc' | list }} {{ [1, 2, 3] | reverse | list }} "
     "{{ 'abc' | reverse }} {{ 42 | string }} {{ '12' | int + 1 }} {{ '2.5' | float }} {{ -3 | abs }} "
     "{{ 'a b  c' | wordcount }} {{ '<b>' | safe }}", {}),
    ("{{ users | map(attribute='name') | join('/') }} {{ users | selectattr('admin') | map(attribute='name') | list }} "
     "{{ users | rejectattr('admin') | list | length }} {{ users | selectattr('name', 'equalto', 'bo') | list }} "
     "{{ [1, 2, 3, 4] | select('odd') | list }} {{ ['a', 'b', 'c'] | reject('equalto', 'b') | list }} "
     "{{ ['a', 'B'] | map('upper') | list }} {{ users | map(attribute='age', default=0) | list }}",
     {"users": [{"name": "al", "admin": True, "age": 30}, {"name": "bo", "admin": False}]}),
    ("{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(separators=(',', ':')) }}\n"
     "{{ d | tojson(sort_keys=true) }}\n{{ d | tojson(ensure_ascii=true) }}\n{{ [] | tojson(indent=4) }} "
     "{{ {} | tojson }} {{ 'q\"\\\\\\n\\t\\u0001' | tojson }}",
     {"d": {"z": [1, 2.5, None, True], "a": {"nested": "ü €😀"}, "s": "line\nbreak \"q\" </tag>", "e": []}}),
    ("{{ s.startswith('ab') }} {{ s.endswith(('x', 'yz')) }} [{{ p.strip() }}] [{{ p.lstrip() }}] "
     "[{{ p.rstrip() }}] [{{ '--a--'.strip('-') }}] {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} "
     "{{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'a b c'.split(None, 1) }} "
     "{{ s.replace('b', 'B') }} {{ s.upper() }} {{ 'ÀB'.lower() }} {{ 'hello wORLD'.title() }} "
     "{{ 'x'.join(['1', '2']) }} {{ s.find('c') }} {{ 'aaa'.count('a') }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }} "
     "{{ 'hello world'.capitalize() }}",
     {"s": "abcxyz", "p": "  \t padded \n "}),
    ("{{ 'one' \"two\" }} {{ '\\x41\\u00e9\\q' }} {{ \"it's\" }} {{ 'tab\\there' }} {{ 1_000 }}", {}),
    ("{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}"
     "{% if not a and (b or c) %}!{% endif %}", {"a": 0, "b": "", "c": [0]}),
    ("{{ 'Date: ' + strftime_now('%d %b %Y %H:%M') }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }}", {}),
    ("{%- for m in messages -%}\n  {{- m.role }}: {{ m.content | trim }}\n{% endfor -%}\n{{ 'end' }}",
     {"messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo\n"}]}),
    ("{% generation %}tracked {{ 1 }}{% endgeneration %} {{ x.y | default('no y') }}", {"x": {}}),
]

JINJA_ERRORS = [
    ("{{ raise_exception('Conversation roles must alternate') }}", {}),
    ("{{ undefined_name.attr }}", {}),
    ("{{ d.missing.deeper }}", {"d": {}}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 1 + none }}", {}),
    ("{{ undefined_name + 'x' }}", {}),
    ("{{ messages[0]['content'] }}", {"messages": []}),
]


def jinja_cases():
    env_template = ctu._compile_jinja_template
    cases = []
    for source, variables in JINJA_CASES:
        text = env_template(source).render(**variables)
        cases.append({"template": source, "variables": variables, "text": text})
    for source, variables in JINJA_ERRORS:
        try:
            env_template(source).render(**variables)
            raise AssertionError(f"{source!r} rendered without an error")
        except (jinja2.exceptions.TemplateError, TypeError) as e:
            cases.append({"template": source, "variables": variables, "error": f"{type(e).__name__}: {e}"})
    return cases


def chat_format_cases(qwen3_config, qwen3, llama):
    """The written-out formats (ChatFormat) against the Qwen3 and Llama-3 templates, via plain jinja2."""
    # Meta-Llama-3-8B-Instruct's chat_template, which scripts/dev/gen_tokenizer_fixtures.py puts in the
    # Llama-3-style tokenizer's config.
    llama3_template = json.loads((OUT / "tokenizer_llama3_style_config.json").read_text())["chat_template"]
    def jinja(template, messages, **kwargs):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        return env.from_string(template).render(messages=messages, add_generation_prompt=True, **kwargs)

    users = ["What is 2+2?", "", "  padded question \n", "multi\nline\n\nquestion",
             "contains <|im_start|> and <think> tokens"]
    systems = [None, "", "You are a helpful assistant.", " spaced system \n"]
    cases = []
    for user in users:
        for system in systems:
            messages = ([] if system is None else [{"role": "system", "content": system}])
            messages.append({"role": "user", "content": user})
            think = jinja(qwen3_config["chat_template"], messages)
            no_think = jinja(qwen3_config["chat_template"], messages, enable_thinking=False)
            llama3 = jinja(llama3_template, messages, bos_token="<|begin_of_text|>")
            cases.append({
                "user": user, "system": system,
                "chatml": think, "chatml_qwen3_no_think": no_think, "llama3": llama3,
                "qwen3_ids_no_think": qwen3.encode(no_think, add_special_tokens=False).ids,
                "llama3_style_ids": llama.encode(llama3, add_special_tokens=False).ids,
            })
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared-data", default=str(REPO.parent / "shared" / "data"))
    args = ap.parse_args()
    shared = pathlib.Path(args.shared_data)

    qwen3_config = json.loads((shared / "qwen3-tokenizer" / "tokenizer_config.json").read_text())
    qwen3 = Tokenizer.from_file(str(shared / "qwen3-tokenizer" / "tokenizer.json"))
    # The Llama-3-style tokenizer scripts/dev/gen_tokenizer_fixtures.py trained (committed).
    llama = Tokenizer.from_file(str(OUT / "tokenizer_llama3_style.json"))

    write_json(OUT / "chat_cases.json", {"generator": "scripts/dev/gen_chat_fixtures.py",
                                         "cases": chat_format_cases(qwen3_config, qwen3, llama)})
    templates, cases = template_cases(qwen3_config)
    write_json(OUT / "chat_template_cases.json", {
        "generator": "scripts/dev/gen_chat_fixtures.py", "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "now": NOW.isoformat(), "templates": templates, "cases": cases,
        "qwen3_apply_chat_template": qwen3_apply_chat_template(shared)})
    write_json(OUT / "chat_jinja_cases.json", {"generator": "scripts/dev/gen_chat_fixtures.py",
                                               "now": NOW.isoformat(), "cases": jinja_cases()})


if __name__ == "__main__":
    main()
