#!/usr/bin/env python3
"""gen_chat.py — golden renderings for moerun's chat-template interpreter.

The oracle is transformers itself (PyPI `transformers`, `jinja2`,
`tokenizers`): chat conversations are rendered by
AutoTokenizer.from_pretrained(folder).apply_chat_template(tokenize=False) on
model folders this script writes, and the small Jinja cases by the exact
environment apply_chat_template compiles templates with
(transformers.utils.chat_template_utils._compile_jinja_template:
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, its tojson,
raise_exception, strftime_now, namespace, dict, loop controls).
strftime_now is pinned to 2025-03-14 09:26:53 so that the goldens are
reproducible; the C test sets the same clock (TZ=UTC, now_unix below).

Writes, under tests/data/text/chat/:
  models/<name>/            tokenizer_config.json (+ chat_template.jinja, ...),
                            tokenizer.json (a tiny WordLevel model, so that
                            AutoTokenizer loads the folder)
  golden_chat.json          {"now_unix", "cases": [{model, messages, tools,
                            kwargs, add_generation_prompt, continue_final_message,
                            template_name, output | error}]}
  golden_jinja.json         {"now_unix", "cases": [{name, template, vars,
                            output | error, line}]}

Run from the repository root:  python3 tools/golden/gen_chat.py
Versions used are recorded in the JSON files.
"""
import datetime as _dt
import json
import os
import shutil
import sys
import traceback

import jinja2
import tokenizers
import transformers
import transformers.utils.chat_template_utils as ctu
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import AutoTokenizer, PreTrainedTokenizerFast

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "data", "text", "chat")
TPL = os.path.join(OUT, "templates")

FIXED = _dt.datetime(2025, 3, 14, 9, 26, 53)
NOW_UNIX = int(FIXED.replace(tzinfo=_dt.timezone.utc).timestamp())


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED


ctu.datetime = _FixedDatetime  # strftime_now reads datetime.now()


def tpl(name):
    with open(os.path.join(TPL, name), encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------- model folders
MODELS = {
    # name: (how the template is stored, templates, special tokens)
    "minimax_m2": ("jinja_file", {"default": "minimax_m2.jinja"}, {"bos_token": "]~!b[", "eos_token": "[e~["}),
    "chatml": ("config_string", {"default": "chatml.jinja"}, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "llama3": ("config_string", {"default": "llama3.jinja"},
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "mistral": ("config_string", {"default": "mistral.jinja"},
                {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    # a list of named templates in tokenizer_config.json: "tool_use" is picked when tools are given
    "named": ("config_list", {"default": "chatml.jinja", "tool_use": "minimax_m2.jinja"},
              {"bos_token": {"__type": "AddedToken", "content": "]~!b[", "lstrip": False, "rstrip": False, "normalized": False,
                             "single_word": False, "special": True},
               "eos_token": "[e~["}),
    # chat_template.jinja beside a config that also has one: the file wins
    "file_wins": ("both", {"default": "llama3.jinja", "config": "chatml.jinja"},
                  {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
}


def write_model(name):
    kind, tpls, special = MODELS[name]
    d = os.path.join(OUT, "models", name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    vocab = {"<unk>": 0}
    for v in special.values():
        tok = v["content"] if isinstance(v, dict) else v
        vocab.setdefault(tok, len(vocab))
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(os.path.join(d, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
    cfg.update(special)
    if kind == "config_string":
        cfg["chat_template"] = tpl(tpls["default"])
    elif kind == "config_list":
        cfg["chat_template"] = [{"name": n, "template": tpl(f)} for n, f in tpls.items()]
    elif kind == "jinja_file":
        with open(os.path.join(d, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(tpl(tpls["default"]))
    elif kind == "both":
        cfg["chat_template"] = tpl(tpls["config"])
        with open(os.path.join(d, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(tpl(tpls["default"]))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ---------------------------------------------------------------- conversations
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and state, e.g., 'San Francisco, CA'"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Forecast length"},
            },
            "required": ["location", "unit"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_web",
        "description": "Search function.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {"type": "array", "items": {"type": "string"},
                               "description": "Keywords for search, list should contain 1 element."},
                "query_tag": {"type": "array", "items": {"type": "string"}, "description": "Category of query"},
            },
            "required": ["query_list", "query_tag"],
        },
    },
}
BARE_TOOL = {"name": "lookup", "description": "Looks a word up — «définition»", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}

UNICODE = ("Héllo 世界 — שלום 👩‍👩‍👧‍👦 e\u0301 \u00a0nbsp\u3000ideographic ✓ \U0001f600 "
           "\"quotes\" 'single' <tag> & \\backslash\\ \t tab")

CONVS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "  Why did the chicken cross the road?  "},
        {"role": "user", "content": "Why?"},
    ],
    "unicode": [
        {"role": "system", "content": UNICODE},
        {"role": "user", "content": "\u3000 " + UNICODE + " \u00a0\n"},
        {"role": "assistant", "content": "ok \U0001f44d"},
        {"role": "user", "content": "🙂"},
    ],
    "empty_messages": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "   "},
    ],
    "content_parts": [
        {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
    ],
    "null_values": [
        {"role": "user", "content": "Call nothing.", "name": None},
        {"role": "assistant", "content": "Done.", "tool_calls": None, "reasoning_content": None},
        {"role": "user", "content": "Thanks"},
    ],
    "reasoning_history": [
        {"role": "user", "content": "What is 17*3?"},
        {"role": "assistant", "content": "51", "reasoning_content": "\n17*3 = 51.\n"},
        {"role": "user", "content": "And 17*4?"},
        {"role": "assistant", "content": "68", "reasoning_content": "17*4 = 68, since 17*3 was 51."},
    ],
    "thinking_alias": [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "Sure.", "thinking": "An aliased reasoning field."},
    ],
    "tool_calls": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris and Tokyo for 3 days, in celsius?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Two cities: two calls.",
         "tool_calls": [
             {"id": "call_a", "type": "function",
              "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius", "days": 3}}},
             {"id": "call_b", "type": "function",
              "function": {"name": "get_weather", "arguments": {"location": "Tōkyō", "unit": "celsius", "days": 3}}},
         ]},
        {"role": "tool", "tool_call_id": "call_a", "name": "get_weather",
         "content": "{\"temperature\": 18, \"sky\": \"clear\"}"},
        {"role": "tool", "tool_call_id": "call_b", "name": "get_weather", "content": "雨, 15°C"},
    ],
    "tool_call_no_content": [
        {"role": "user", "content": "Search for the latest OpenAI and Gemini announcements."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search_web", "arguments": {
                "query_tag": ["technology", "events"], "query_list": ["\"OpenAI\" \"latest\" \"release\""]}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "Result: found."}]},
        {"role": "assistant", "content": "Here is what I found."},
        {"role": "user", "content": "Thanks!"},
    ],
    "mistral_tools": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {
            "name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "abcdefghi", "content": "{\"temperature\": 18}"},
        {"role": "assistant", "content": "It is 18 °C."},
        {"role": "user", "content": "Thanks"},
    ],
    "llama_tool": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"location": "Oslo", "unit": "celsius"}}}]},
        {"role": "tool", "content": {"temperature": -3, "snow": True}},
    ],
    "not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "continue_final": [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Autumn moonlight —"},
    ],
}

# (model, conversation, tools, kwargs, add_generation_prompt, continue_final_message, template_name)
PLAN = []
for model in ("minimax_m2", "chatml", "llama3", "mistral"):
    for conv in ("single_user", "system_user", "multi_turn", "unicode", "empty_messages", "null_values"):
        for agp in (False, True):
            PLAN.append((model, conv, None, None, agp, False, None))
for model in ("minimax_m2", "chatml"):
    for conv in ("content_parts", "reasoning_history", "thinking_alias", "tool_calls", "tool_call_no_content"):
        PLAN.append((model, conv, [WEATHER, SEARCH], None, True, False, None))
        PLAN.append((model, conv, None, None, True, False, None))
PLAN += [
    ("minimax_m2", "single_user", [BARE_TOOL], None, True, False, None),
    ("minimax_m2", "tool_calls", [WEATHER], {"extra_flag": True}, False, False, None),
    ("minimax_m2", "continue_final", None, None, False, True, None),
    ("chatml", "continue_final", None, None, False, True, None),
    ("llama3", "llama_tool", [WEATHER], None, True, False, None),
    ("llama3", "system_user", [WEATHER, SEARCH], {"tools_in_user_message": False}, True, False, None),
    ("llama3", "system_user", None, {"date_string": "01 Jan 2030"}, True, False, None),
    ("mistral", "mistral_tools", [WEATHER], None, False, False, None),
    ("mistral", "not_alternating", None, None, True, False, None),
    ("mistral", "tool_calls", [WEATHER], None, False, False, None),  # ids of length 6: raise_exception
    ("named", "system_user", None, None, True, False, None),
    ("named", "system_user", [WEATHER], None, True, False, None),
    ("named", "system_user", None, None, True, False, "tool_use"),
    ("file_wins", "system_user", None, None, True, False, None),
]


def render_chat():
    cases = []
    toks = {}
    for model, conv, tools, kwargs, agp, cont, tname in PLAN:
        if model not in toks:
            toks[model] = AutoTokenizer.from_pretrained(os.path.join(OUT, "models", model))
        tok = toks[model]
        messages = json.loads(json.dumps(CONVS[conv]))  # fresh copy
        case = {"model": model, "conversation": conv, "messages": messages, "tools": tools,
                "kwargs": kwargs, "add_generation_prompt": agp, "continue_final_message": cont,
                "template_name": tname}
        try:
            out = tok.apply_chat_template(json.loads(json.dumps(messages)), tools=tools, tokenize=False,
                                          add_generation_prompt=agp, continue_final_message=cont,
                                          chat_template=tname, **(kwargs or {}))
            case["output"] = out
        except Exception as e:  # the C side must fail too
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    return cases


# ---------------------------------------------------------------- small Jinja cases
J = []


def case(name, template, **vars):
    J.append((name, template, vars))


# whitespace control (trim_blocks + lstrip_blocks) and comments
case("ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter")
case("ws_lstrip", "line\n    {% if true %}x{% endif %}\n  {{ 'v' }}\n")
case("ws_minus", "a  {%- if true -%}  b  {%- endif -%}  c")
case("ws_minus_var", "a \n {{- 'x' -}} \n b")
case("ws_plus", "a\n  {%+ if true +%}\nb\n  {%+ endif %}\nc")
case("ws_comment", "a\n  {# comment #}\nb {#- c -#} d\n{# multi\nline #}\ne")
case("ws_raw", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|\n  {%- raw -%}  x  {%- endraw -%}  |")
case("ws_trailing_newline", "text\n")
case("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\rc\r\n")
case("ws_unicode_strip", "x\u3000 {%- if true %}y{% endif -%}\u00a0 z")
case("ws_lstrip_after_var", "{{ 'a' }}  {% if true %}b{% endif %}")
case("ws_block_line_start", "{% for i in [1,2] %}\n  {% if i %}[{{ i }}]{% endif %}\n{% endfor %}\n")
# literals and operators
case("lit_strings", "{{ 'a\\nb' }}|{{ \"q\\\"x\" }}|{{ 'it''s' }}|{{ '\\u00e9\\x41\\101' }}|{{ '\\d' }}|{{ 'é\\é' }}")
case("lit_numbers", "{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e3 }} {{ 2.50 }} {{ 1e-5 }} {{ 1e16 }} {{ 123456789.0 }}")
case("lit_containers", "{{ [1, 'a', none, true, 1.0] }} {{ (1,) }} {{ (1, 2) }} {{ () }} {{ {'k': 'v', 2: [3]} }} {{ [] }} {{ {} }}")
case("lit_bools", "{{ true }} {{ False }} {{ none }} {{ None }}")
case("arith", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} "
     "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 0.1 + 0.2 }} {{ 1 + true }} {{ -(3) }} {{ +4 }}")
case("string_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * '-' }} {{ 'x' ~ 1 ~ none ~ true ~ 2.5 }} {{ [1] + [2] }}")
case("compare", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 != 'a' }} "
     "{{ none == none }} {{ 'é' > 'z' }}")
case("in_ops", "{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k':1} }} {{ 'x' not in 'abc' }} {{ '' in 'a' }} {{ 3 not in [3] }}")
case("logic", "{{ true and 'x' }}|{{ 0 or 'y' }}|{{ not '' }}|{{ '' or [] or none }}|{{ 1 and 0 }}")
case("ternary", "{{ 'yes' if 1 else 'no' }}|{{ 'yes' if 0 else 'no' }}|{{ 'x' if false }}|{{ 'a' if 0 else 'b' if 1 else 'c' }}")
case("precedence", "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 'a' ~ (1 + 2) }} {{ 2 * 3 ~ 4 }} {{ not 1 == 2 }} "
     "{{ -3|abs }} {{ - 2|string }}")
# variables, attributes, items
case("attr_item", "{{ d.a }} {{ d['a'] }} {{ d.l[1] }} {{ d.l.0 }} {{ d.l[-1] }} {{ d.missing }}|{{ d.n.x }}|{{ s[1] }} {{ s[-1] }}",
     d={"a": 1, "l": [10, 20, 30], "n": None}, s="héllo")
case("dict_methods_shadow", "{{ d.items is callable }}|{{ d['items'] }}|{{ d.get('items') }}|{{ d.keys() | list }}",
     d={"items": "ITEMS", "b": 2})
case("slicing", "{{ s[1:3] }} {{ s[::-1] }} {{ s[:2] }} {{ s[-2:] }} {{ l[::2] }} {{ l[1:] }} {{ l[5:] }} {{ s[::2] }} {{ l[-10:2] }}",
     s="héllo wörld", l=[1, 2, 3, 4, 5])
case("undefined_print", "[{{ nope }}][{{ nope | default('d') }}][{{ nope is defined }}][{{ nope | length }}]")
case("undefined_iter", "{% for x in nope %}{{ x }}{% else %}empty{% endfor %}")
case("none_attr", "[{{ n.x }}][{{ n is none }}]", n=None)
# control flow and scoping
case("if_elif", "{% for x in [1,2,3,4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}other{% endif %} {% endfor %}")
case("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}")
case("for_prev_next", "{% for x in [1,2,3] %}({{ loop.previtem | default('-') }},{{ loop.nextitem | default('-') }}){% endfor %}")
case("for_cycle_changed", "{% for x in [1,1,2,2,3] %}{{ loop.cycle('a','b') }}{% if loop.changed(x) %}!{% endif %}{% endfor %}")
case("for_filter_else", "{% for x in [1,2,3,4,5] if x % 2 %}{{ x }}{{ loop.index }}{{ loop.length }} {% else %}none{% endfor %}|"
     "{% for x in [] %}x{% else %}empty{% endfor %}")
case("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1,2],(3,4)] %}{{ a + b }}{% endfor %}",
     d={"x": 1, "y": [2]})
case("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", d={"b": 1, "a": 2})
case("for_nested_loop", "{% for i in [1,2] %}{% set outer = loop %}{% for j in 'ab' %}{{ outer.index }}{{ loop.index }}{{ j }} {% endfor %}{% endfor %}")
case("for_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}")
case("scope_for", "{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}[{{ x }}]{% endfor %}{{ x }}")
case("scope_for_fresh", "{% for i in [1,2,3] %}[{{ y }}]{% set y = i %}{% endfor %}[{{ y }}]")
case("scope_if_leaks", "{% if true %}{% set z = 'set in if' %}{% endif %}{{ z }}")
case("namespace", "{% set ns = namespace(n=0, items=[]) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}"
     "{% set ns.items = ns.items + [i * 2] %}{% endfor %}{{ ns.n }} {{ ns.items }} {{ ns }}")
case("namespace_dict_arg", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}")
case("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 3, 4 %}{{ t }}")
case("set_block", "{% set x %}  inner {{ 1 + 1 }}  {% endset %}[{{ x }}]{% set y | upper | trim %}  abc  {% endset %}[{{ y }}]")
case("with_block", "{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}")
case("filter_block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}|{% filter replace('a', 'o') | title %}banana bread{% endfilter %}")
case("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', '?') }} "
     "{{ greet(punct='.', name='Cy') }}")
case("macro_closure", "{% set g = 3 %}{% macro m(a) %}{{ a }}{{ g }}{{ h }}{% endmacro %}{% set h = 4 %}{{ m(1) }}")
case("macro_recursion", "{% macro count(n) %}{{ n }}{% if n > 0 %},{{ count(n - 1) }}{% endif %}{% endmacro %}{{ count(5) }}")
case("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}][{{ b }}]{% endmacro %}{{ m(1) }}")
case("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 }}{% endcall %}")
case("generation_tag", "a{% generation %}b{{ 'c' }}{% endgeneration %}d")
case("print_stmt", "{% print 'x', 1 %}")
# tests
case("tests", "{{ 1 is odd }}{{ 2 is even }}{{ 9 is divisibleby 3 }}{{ x is defined }}{{ y is undefined }}{{ none is none }}"
     "{{ true is boolean }}{{ false is false }}{{ true is true }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}"
     "{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 'a' is string }}{{ {} is mapping }}{{ 1 is number }}{{ true is number }}"
     "{{ [] is sequence }}{{ 'a' is sequence }}{{ {} is sequence }}{{ 1 is sequence }}{{ 'a' is iterable }}{{ 1 is iterable }}"
     "{{ range is callable }}{{ 'x' is callable }}{{ 2 is in [1,2] }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 1 is ne 2 }}"
     "{{ 3 is gt 2 }}{{ 3 is ge 3 }}{{ 1 is lt 2 }}{{ 1 is le 0 }}{{ 2 is greaterthan 1 }}{{ 1 is lessthan 1 }}"
     "{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' is test }}{{ x is not none }}{{ none is sameas none }}"
     "{{ 'a'|e is escaped }}", x=1)
# filters
case("f_strings", "{{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hello'|upper }}|{{ 'Hello'|lower }}|"
     "{{ 'hello wORLD-foo(bar'|title }}|{{ 'hELLO world'|capitalize }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'ab'|replace('', '-') }}|"
     "{{ 'abc'|center(9) }}|{{ 'abcd'|center(9) }}|{{ 'a b  c'|wordcount }}|{{ 'héllo'|length }}|{{ 'abc'|reverse }}|"
     "{{ '<a href=\"x\">&\\'</a>'|e }}|{{ '<b>'|safe|e }}|{{ '<b>'|forceescape }}")
case("f_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('> ', blank=true) }}|{{ ''|indent(first=true) }}")
case("f_truncate", "{{ 'The quick brown fox jumps over the lazy dog'|truncate(20) }}|"
     "{{ 'The quick brown fox jumps over the lazy dog'|truncate(20, true) }}|{{ 'short'|truncate(10) }}|"
     "{{ 'abcdefghijkl'|truncate(9, leeway=0) }}")
case("f_numbers", "{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ '0x1A'|int(base=16) }} {{ 3.9|int }} "
     "{{ '3.25'|float }} {{ 'x'|float }} {{ 2|float }} {{ -3|abs }} {{ -2.5|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} "
     "{{ 3.5|round }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(0, 'floor') }} {{ 7|round }} {{ ' 12 '|int }} {{ '1_000'|int }}")
case("f_lists", "{{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','c']|sort }} {{ ['b','A','c']|sort(case_sensitive=true) }} "
     "{{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ []|first is defined }} {{ [1,2,3]|length }} {{ [1,2,2,'a','A']|unique|list }} "
     "{{ [1,2,3]|sum }} {{ [1.5,2]|sum(start=1) }} {{ [4,2,9]|min }} {{ [4,2,9]|max }} {{ ['a','B']|max }} {{ 'abc'|list }} "
     "{{ [1,2,3]|reverse|list }} {{ [1,2,3,4,5]|batch(2)|list }} {{ [1,2,3]|batch(2, 0)|list }} {{ [1,2]|join }} "
     "{{ [1,2]|join(', ') }} {{ {'a':1}|list }} {{ 'ab'|first }}")
case("f_attr_lists", "{{ users|map(attribute='name')|join(',') }} {{ users|map(attribute='age', default=0)|list }} "
     "{{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|rejectattr('admin')|map(attribute='name')|list }} "
     "{{ users|selectattr('name', 'equalto', 'bo')|list|length }} {{ users|sort(attribute='name')|map(attribute='name')|list }} "
     "{{ users|sort(attribute='age,name', reverse=true)|map(attribute='name')|list }} {{ users|join('|', attribute='name') }} "
     "{{ users|sum(attribute='age') }} {{ users|min(attribute='age')|attr('name') }} {{ [1,2,3,4]|select('odd')|list }} "
     "{{ [1,2,3,4]|reject('odd')|list }} {{ ['a','b']|map('upper')|list }} {{ [0,1,'',2]|select|list }} "
     "{{ users|map(attribute='tags.0')|list }} {{ users|unique(attribute='admin')|map(attribute='name')|list }}",
     users=[{"name": "cy", "age": 31, "admin": True, "tags": ["x"]}, {"name": "ann", "age": 25, "admin": False, "tags": ["y"]},
            {"name": "bo", "age": 31, "admin": False, "tags": ["z"]}])
case("f_dicts", "{{ d|dictsort }} {{ d|dictsort(by='value') }} {{ d|dictsort(reverse=true) }} {{ d|items|list }} {{ nope|items|list }} "
     "{{ d|length }} {{ d.values()|list }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.get('B') }}",
     d={"b": 2, "a": 3, "C": 1, "B": 0})
case("f_default", "{{ none|default('x') }}|{{ none|default('x', true) }}|{{ ''|default('x', true) }}|{{ 0|d('z') }}|{{ nope|d }}")
case("f_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ 'é\"\\\\\\n\\t\\u0001\\x7f<>&\\''|tojson }}|"
     "{{ 'é'|tojson(ensure_ascii=true) }}|{{ [1.0, 1e20, 2.5e-7, -0.0, 100.0, 0.1]|tojson }}|{{ {1: 'a', true: 'b'}|tojson }}|"
     "{{ [[], {}, [1]]|tojson(indent=1) }}|{{ d|tojson(separators=(',', ':')) }}|{{ '😀'|tojson(ensure_ascii=true) }}|"
     "{{ 'a'|tojson(indent='\\t') }}|{{ {'x': [1, {'y': none}]}|tojson(indent='--') }}",
     d={"z": 1, "a": [True, None, "s"], "m": {"k": 1.5}})
case("f_string", "{{ [1,'a']|string }} {{ none|string }} {{ 1.0|string }} {{ {'a': \"it's\"}|string }} {{ ['a\\nb', 'x\"y', \"'\"]|string }}")
case("f_format", "{{ '%s-%d-%05.2f-%x-%r'|format('a', 7, 3.14159, 255, 'q') }}|{{ '%(a)s'|format(a='kw') }}|{{ '%%'|format() }}")
# str methods
case("m_strip", "[{{ '  a b  '.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ '  a'.lstrip() }}][{{ 'a  '.rstrip() }}][{{ '\\n\\na\\n'.strip('\\n') }}]"
     "[{{ '\u3000a\u00a0'.strip() }}]")
case("m_split", "{{ ' a  b c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ ' a b c '.split(none, 1) }} "
     "{{ 'a,b,c'.rsplit(',', 1) }} {{ ' a b c '.rsplit(none, 1) }} {{ 'x'.split('x') }} {{ ''.split() }} {{ ''.split(',') }} "
     "{{ 'a\\nb\\r\\nc\\n'.splitlines() }} {{ 'a\\nb'.splitlines(true) }}")
case("m_misc", "{{ 'abc'.startswith('ab') }} {{ 'abc'.startswith(('x','a')) }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith('b', 1) }} "
     "{{ 'aXbX'.replace('X', '-') }} {{ 'aXbX'.replace('X', '-', 1) }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} "
     "{{ 'hello'.find('z') }} {{ 'héllo'.index('l') }} {{ 'banana'.count('a') }} {{ '-'.join(['a','b']) }} {{ 'ab'.upper() }} "
     "{{ 'AB'.lower() }} {{ 'hello world'.title() }} {{ \"they're\".title() }} {{ 'hello'.capitalize() }} {{ '42'.isdigit() }} "
     "{{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'a1'.isalnum() }} {{ '5'.zfill(3) }} {{ '-5'.zfill(4) }} {{ 'a'.center(5, '*') }} "
     "{{ 'a'.ljust(3, '.') }} {{ 'a'.rjust(3) }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.py'.removesuffix('.py') }} "
     "{{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'AbC'.swapcase() }}")
case("m_format", "{{ '{} and {}'.format('a', 1) }}|{{ '{0}{1}{0}'.format('x', 'y') }}|{{ '{name}!'.format(name='N') }}|"
     "{{ '{:>5}|{:<5}|{:^5}|{:05d}|{:.2f}|{:+d}|{:x}|{:,}'.format('a', 'b', 'c', 42, 3.14159, 5, 255, 1234567) }}|"
     "{{ '{{literal}}'.format() }}|{{ '{0[k]} {1[1]}'.format({'k': 'v'}, [3, 4]) }}|{{ '{!r}'.format('q') }}")
case("m_list_dict", "{{ [1,2,3].index(2) }} {{ [1,1,2].count(1) }} {{ d.items()|list }} {{ d.keys()|list }} {{ d|length }}",
     d={"a": 1, "b": 2})
# globals
case("g_range", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}")
case("g_dict", "{{ dict(a=1, b=2) }} {{ dict({'x': 1}, y=2) }} {{ dict([('p', 1)]) }}")
case("g_cycler_joiner", "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}{% set j = joiner('|') %}"
     "{% for x in [1,2,3] %}{{ j() }}{{ x }}{% endfor %}")
case("g_strftime", "{{ strftime_now('%Y-%m-%d %H:%M:%S %d %b %Y %A %j') }}")
case("g_adjacent_strings", "{{ 'a' 'b' \"c\" }}")
case("repr_unicode", "{{ ['é', '😀', '\\x00', '\\u00a0', '\\u200b', '\\t', 'a\\'b', \"a\\\"b\", 'a\\'\"b'] }}")
case("float_repr", "{{ 1e15 }} {{ 1e16 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.5e-10 }} {{ 123456789012345678.0 }} {{ 3.0 }} {{ 2.5e300 * 1e10 }} "
     "{{ -1e-7 }} {{ 1/3 }} {{ 2/3 }} {{ 10/3 }}")
case("vars_types", "{{ i }} {{ f }} {{ b }} {{ n }} {{ s }} {{ l }} {{ d }} {{ big }} {{ neg }}",
     i=42, f=2.5, b=True, n=None, s="str", l=[1, "x", None], d={"k": [1, {"z": False}]}, big=2**62, neg=-17)
case("message_like", "{% for m in messages %}{{ m.role }}:{{ m['content'] }}{% if not loop.last %}\n{% endif %}{% endfor %}",
     messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
# idioms of published chat templates (Qwen3, DeepSeek, gpt-oss, Llama, Gemma shapes)
MSGS = [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
        {"role": "user", "content": "q2"}, {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "content": "out"}, {"role": "assistant", "content": "done"}]
case("idiom_reverse_last_query",
     "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
     "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
     "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string and not"
     "(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
     "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
     "{{ ns.last_query_index }}", messages=MSGS)
case("idiom_think_split",
     "{%- for m in messages if m.role == 'assistant' and m.content %}{%- set content = m.content %}"
     "{%- if '</think>' in content %}{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}"
     "{%- set content = content.split('</think>')[-1].lstrip('\n') %}[{{ reasoning }}|{{ content }}]"
     "{%- else %}[{{ content }}]{%- endif %}{%- endfor %}", messages=MSGS)
case("idiom_tool_args_string_or_mapping",
     "{%- for m in messages %}{%- for tc in m.tool_calls or [] %}{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}"
     "<{{ tc.name }}>{%- if tc.arguments is string %}{{ tc.arguments }}{%- else %}{{ tc.arguments | tojson }}{%- endif %}"
     "{%- endfor %}{%- endfor %}", messages=MSGS)
case("idiom_deepseek_ns",
     "{%- set ns = namespace(is_first=false, is_tool=false, system_prompt='', is_first_sp=true) %}"
     "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
     "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}"
     "{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}"
     "{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}"
     "{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"
     "{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}<call>{{ tool['function']['name'] }}{%- set ns.is_first = true -%}"
     "{%- else %}<more>{%- endif %}{%- endfor %}{%- endif %}{%- endfor %}", messages=MSGS, bos_token="<B>")
case("idiom_gemma_role_map",
     "{%- for message in messages %}{%- if (message['role'] == 'assistant') %}{%- set role = 'model' %}"
     "{%- else %}{%- set role = message['role'] %}{%- endif %}{{ '<start_of_turn>' + role + '\n' + (message['content'] or '') | trim + '<end_of_turn>\n' }}"
     "{%- endfor %}{%- if add_generation_prompt %}{{'<start_of_turn>model\n'}}{%- endif %}", messages=MSGS, add_generation_prompt=True)
case("idiom_gptoss_macro",
     "{%- macro render_params(props, required) -%}{%- for name, spec in props.items() -%}"
     "{{ name }}{{ '?' if name not in required }}: {{ spec.type | default('any') }}"
     "{%- if spec.enum is defined %} // {{ spec.enum | map('tojson') | join(' | ') }}{%- endif %}{{ ', ' if not loop.last }}"
     "{%- endfor -%}{%- endmacro -%}{%- for t in tools %}type {{ t.function.name }} = ({{ render_params(t.function.parameters.properties, "
     "t.function.parameters.required | default([])) }}) => any;\n{%- endfor %}",
     tools=[{"type": "function", "function": {"name": "w", "parameters": {"properties": {
         "unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string"}, "n": {}}, "required": ["city"]}}}])
case("idiom_loop_messages_offset",
     "{%- if messages[0]['role'] == 'system' %}{%- set loop_messages = messages[1:] %}{%- set system_message = messages[0]['content'] %}"
     "{%- else %}{%- set loop_messages = messages %}{%- set system_message = false %}{%- endif %}"
     "{%- for message in loop_messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
     "{%- if loop.index0 == 0 and system_message != false %}{%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}"
     "{%- else %}{%- set content = message['content'] %}{%- endif %}{{ '[' + message['role'] + ']' + content.strip() }}{%- endfor %}",
     messages=[{"role": "system", "content": "S "}, {"role": "user", "content": " u "}, {"role": "assistant", "content": "a"}])
case("err_idiom_alternation",
     "{%- for message in messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}{%- endfor %}",
     messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
# errors: each must fail, naming the line
case("err_unknown_filter", "line one\n{{ x | nosuch }}")
case("unknown_filter_dead_if", "{% if false %}\n{{ x | nosuch }}\n{% endif %}{{ 1 if true else x|nosuch }}")
case("err_unknown_filter_live_if", "{% if true %}\n{{ x | nosuch }}\n{% endif %}")
case("err_unknown_filter_in_for_in_if", "{% if false %}{% for i in [] %}\n{{ x | nosuch }}{% endfor %}{% endif %}")
case("err_unknown_test", "{% if x is nosuchtest %}{% endif %}")
case("err_raise", "a\nb\n{{ raise_exception('custom failure') }}")
case("err_syntax_unclosed", "{% if true %}\nno endif")
case("err_syntax_bad_expr", "{{ 1 + }}")
case("err_syntax_unclosed_var", "ok\n{{ 'x' ")
case("err_unknown_tag", "{% frobnicate %}")
case("err_undefined_call", "\n\n{{ nosuchfn() }}")
case("err_undefined_attr", "{{ a.b.c }}", a={})
case("err_undefined_math", "{{ nope + 1 }}")
case("err_type_add", "{{ 1 + 'a' }}")
case("err_div_zero", "{{ 1 / 0 }}")
case("err_mutation", "{% set l = [1] %}{{ l.append(2) }}")
case("err_dict_update", "{% set d = {} %}{{ d.update({'a': 1}) }}")
case("err_range_big", "{{ range(1000000)|length }}")
case("err_not_iterable", "{% for x in 5 %}{% endfor %}")
case("err_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}")
case("err_tojson_undefined", "{{ nope|tojson }}")
case("err_comment_unclosed", "{# never closed")
case("err_break_outside", "{% break %}")
case("err_macro_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}")
case("err_compare_types", "{{ 1 < 'a' }}")
case("err_ns_assign", "{% set x = 1 %}{% set x.y = 2 %}")
case("err_string_index", "{{ 'abc'.index('z') }}")
case("err_unbalanced", "{{ (1 }}")
case("err_concat_precedence", "{{ 'a' ~ 1 + 2 }}")


def error_line(exc):
    if isinstance(exc, SyntaxError) and not isinstance(exc, jinja2.TemplateSyntaxError):
        return None  # Python's own compile error: its line is in the generated code
    line = getattr(exc, "lineno", None)
    if line:
        return line
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        if fr.filename == "<template>":
            return fr.lineno
    return None


def render_jinja():
    cases = []
    for name, template, vars in J:
        c = {"name": name, "template": template, "vars": vars}
        try:
            c["output"] = ctu._compile_jinja_template(template).render(**vars)
        except Exception as e:
            c["error"] = f"{type(e).__name__}: {e}"
            c["line"] = error_line(e)
        if name.startswith("err_") != ("error" in c):
            raise SystemExit(f"case {name}: expected {'an error' if name.startswith('err_') else 'output'}, got {c}")
        cases.append(c)
    return cases


def main():
    for m in MODELS:
        write_model(m)
    versions = {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
                "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]}
    chat = {"generator": "tools/golden/gen_chat.py", "versions": versions, "now_unix": NOW_UNIX,
            "cases": render_chat()}
    jin = {"generator": "tools/golden/gen_chat.py", "versions": versions, "now_unix": NOW_UNIX,
           "cases": render_jinja()}
    for fname, obj in (("golden_chat.json", chat), ("golden_jinja.json", jin)):
        with open(os.path.join(OUT, fname), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, ensure_ascii=False)
            f.write("\n")
    n_err = sum("error" in c for c in chat["cases"])
    print(f"gen_chat: {len(chat['cases'])} chat cases ({n_err} errors), {len(jin['cases'])} jinja cases -> {OUT}")


if __name__ == "__main__":
    main()
