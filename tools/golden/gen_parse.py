#!/usr/bin/env python3
"""gen_parse.py — expected parses of MiniMax-M2 model outputs for moerun's
streaming parser (src/text/parse_output.c).

The reference here is a separate, whole-text implementation (regular
expressions, Python's json) of the format MiniMax documents in
MiniMax-AI/MiniMax-M2 docs/tool_calling_guide.md, plus the choices moerun
makes where the guide is silent (stated below). It knows nothing of
streaming; the C test feeds the same outputs in one piece and in random
pieces and must produce the same message.

Semantics:
  - reasoning: the text before </think> (the prompt ended with "<think>\n";
    a <think> the model writes itself at the start is skipped), str.strip()ed;
  - content: the rest; whitespace right before a <minimax:tool_call> and
    right after a </minimax:tool_call> (or after </think>) is dropped;
  - each <invoke name=...> is a call; names are str.strip()ed and unquoted;
  - a parameter value is str.strip()ed and converted by the tool's schema:
    "null" (any case) → null; then, as the schema's types allow, in this
    order: integer (Python int() of a plain decimal), number (float();
    integral values as integers), boolean (true/false/1/0), object/array
    (json.loads, of the right kind), anything else → string; no schema or
    no type → string; `type` lists and anyOf/oneOf/allOf add candidates;
  - a parameter given twice keeps its first value;
  - arguments are json.dumps(obj, ensure_ascii=False);
  - lenient closing: </invoke> or </minimax:tool_call> ends an open
    parameter, </minimax:tool_call> ends an open invoke, the end of the
    output ends everything.
Malformed markup (returned as content) is tested by hand-written cases in
tests/test_chat_parse.c, not here.

Writes tests/data/text/chat/golden_parse.json. Run from the repository
root: python3 tools/golden/gen_parse.py
"""
import json
import math
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "data", "text", "chat", "golden_parse.json")

TYPE_ALIASES = {"string": "string", "str": "string", "text": "string", "integer": "integer", "int": "integer",
                "number": "number", "float": "number", "boolean": "boolean", "bool": "boolean", "object": "object",
                "dict": "object", "array": "array", "list": "array", "null": "null"}


def schema_types(s, depth=0):
    if not isinstance(s, dict) or depth > 8:
        return set()
    t = set()
    ty = s.get("type")
    for name in ([ty] if isinstance(ty, str) else ty if isinstance(ty, list) else []):
        if isinstance(name, str):
            t.add(TYPE_ALIASES.get(name.lower(), "other"))
    for comb in ("anyOf", "oneOf", "allOf"):
        for e in s.get(comb, []) if isinstance(s.get(comb), list) else []:
            t |= schema_types(e, depth + 1)
    if not t and isinstance(s.get("enum"), list):
        for e in s["enum"]:
            if isinstance(e, bool):
                t.add("boolean")
            elif isinstance(e, str):
                t.add("string")
            elif isinstance(e, int):
                t.add("integer")
            elif isinstance(e, float):
                t.add("number")
            elif e is None:
                t.add("null")
    return t


def no_dupes(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key")
    return dict(pairs)


INT_RE = re.compile(r"[+-]?\d+(?:_\d+)*")


def convert(v, schema):
    if v.lower() == "null":
        return None
    types = schema_types(schema) or {"string"}
    if "integer" in types and INT_RE.fullmatch(v) and v.isascii():
        return int(v)
    if "number" in types:
        try:
            f = float(v)
            if math.isfinite(f):
                return int(f) if f == math.floor(f) and abs(f) < 2 ** 53 else f
        except ValueError:
            pass
    if "boolean" in types:
        if v.lower() in ("true", "1"):
            return True
        if v.lower() in ("false", "0"):
            return False
    if types & {"object", "array", "other"}:
        try:
            j = json.loads(v, object_pairs_hook=no_dupes)
            if "other" in types or (isinstance(j, dict) and "object" in types) or \
                    (isinstance(j, list) and "array" in types):
                return j
        except ValueError:
            pass
    return v


def tool_props(tools, name):
    for t in tools or []:
        f = t.get("function") if isinstance(t.get("function"), dict) else t
        if f.get("name") == name:
            params = f.get("parameters") if isinstance(f.get("parameters"), dict) else f.get("input_schema")
            props = params.get("properties") if isinstance(params, dict) else None
            return props if isinstance(props, dict) else None
    return None


def unquote(s):
    s = s.strip()
    if len(s) >= 2 and s[0] in "\"'" and s[-1] == s[0]:
        s = s[1:-1]
    return s


BLOCK_RE = re.compile(r"<minimax:tool_call>(.*?)(?:</minimax:tool_call>|\Z)", re.S)
INVOKE_RE = re.compile(r"<invoke\s+name\s*=([^>]*)>(.*?)(?:</invoke>|\Z)", re.S)
PARAM_RE = re.compile(r"<parameter\s+name\s*=([^>]*)>(.*?)(?:</parameter>|\Z)", re.S)


def ref_parse(text, tools=None, think_open=True, reasoning=True, tool_calls=True):
    reasoning_text = ""
    s = text
    drop_lead = False
    if reasoning:
        t = s.lstrip()
        if t.startswith("<think>"):
            s, in_reason = t[len("<think>"):], True
        else:
            in_reason = think_open
        if in_reason:
            i = s.find("</think>")
            if i < 0:
                reasoning_text, s = s.strip(), ""
            else:
                reasoning_text, s = s[:i].strip(), s[i + len("</think>"):]
                drop_lead = True
    calls = []
    parts = []
    pos = 0
    blocks = list(BLOCK_RE.finditer(s)) if tool_calls else []
    for b in blocks:
        seg = s[pos:b.start()]
        if drop_lead:
            seg = seg.lstrip()
        parts.append(seg.rstrip())
        for inv in INVOKE_RE.finditer(b.group(1)):
            name = unquote(inv.group(1))
            props = tool_props(tools, name) or {}
            args = {}
            for prm in PARAM_RE.finditer(inv.group(2)):
                key = unquote(prm.group(1))
                if key in args:
                    continue
                args[key] = convert(prm.group(2).strip(), props.get(key))
            calls.append({"name": name, "arguments": json.dumps(args, ensure_ascii=False)})
        pos = b.end()
        drop_lead = True
    seg = s[pos:]
    if drop_lead:
        seg = seg.lstrip()
    parts.append(seg)
    content = "".join(parts)
    return {"reasoning_content": reasoning_text or None, "content": content or None, "tool_calls": calls}


# ---------------------------------------------------------------- inputs
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}, "unit": {"type": "string"}}}}}]
SEARCH = [{"type": "function", "function": {"name": "search_web", "parameters": {"type": "object", "properties": {
    "query_list": {"type": "array", "items": {"type": "string"}},
    "query_tag": {"type": "array", "items": {"type": "string"}}}, "required": ["query_list", "query_tag"]}}}]
TYPED = [{"name": "typed", "parameters": {"type": "object", "properties": {
    "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"}, "o": {"type": "object"},
    "a": {"type": "array"}, "s": {"type": "string"}, "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "opt": {"type": ["integer", "null"]}, "e": {"enum": [1, 2, 3]}, "u": {"type": "any"}, "nt": {"description": "no type"},
    "f": {"type": "float"}, "bl": {"type": "bool"}}}}]

DOC_WEATHER = ("Let me help you query the weather.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
               "<parameter name=\"location\">San Francisco</parameter>\n<parameter name=\"unit\">celsius</parameter>\n"
               "</invoke>\n</minimax:tool_call>")
DOC_SEARCH = ("<minimax:tool_call>\n<invoke name=\"search_web\">\n"
              "<parameter name=\"query_tag\">[\"technology\", \"events\"]</parameter>\n"
              "<parameter name=\"query_list\">[\"\\\"OpenAI\\\" \\\"latest\\\" \\\"release\\\"\"]</parameter>\n"
              "</invoke>\n<invoke name=\"search_web\">\n<parameter name=\"query_tag\">[\"technology\", \"events\"]</parameter>\n"
              "<parameter name=\"query_list\">[\"\\\"Gemini\\\" \\\"latest\\\" \\\"release\\\"\"]</parameter>\n</invoke>\n"
              "</minimax:tool_call>")


def typed_call(**params):
    body = "".join(f"<parameter name=\"{k}\">{v}</parameter>\n" for k, v in params.items())
    return f"<minimax:tool_call>\n<invoke name=\"typed\">\n{body}</invoke>\n</minimax:tool_call>"


CASES = [
    # (name, text, tools, options)
    ("doc_weather", DOC_WEATHER, WEATHER, {}),
    ("doc_weather_no_reasoning_mode", DOC_WEATHER, WEATHER, {"think_open": False}),
    ("doc_weather_reasoning", "The user wants weather.\nI'll call the tool.\n</think>\n\n" + DOC_WEATHER, WEATHER, {}),
    ("doc_search_two_invokes", "Searching both.\n</think>\n\n" + DOC_SEARCH, SEARCH, {}),
    ("doc_search_no_tools", "x</think>" + DOC_SEARCH, None, {}),
    ("plain_reasoning_content", "\nLet me think.\nYes.\n</think>\n\nThe answer is 42.", None, {}),
    ("reasoning_only_truncated", "Still thinking about it...", None, {}),
    ("model_writes_think", "<think>\nI write the tag myself.\n</think>\nHi!", None, {}),
    ("think_open_false_with_think", "  <think>reason</think>  content  ", None, {"think_open": False}),
    ("think_open_false_no_think", "  just content  ", None, {"think_open": False}),
    ("reasoning_disabled", "a</think>b" + DOC_WEATHER, WEATHER, {"reasoning": False}),
    ("tool_calls_disabled", "r</think>" + DOC_WEATHER, WEATHER, {"tool_calls": False}),
    ("tool_call_inside_reasoning", "maybe " + DOC_WEATHER + " no</think>final", WEATHER, {}),
    ("content_after_block", "r</think>Before." + DOC_WEATHER + "\n\nAfter the call.", WEATHER, {}),
    ("two_blocks", "r</think>A " + DOC_WEATHER + "\n B \n" + DOC_SEARCH + " C", WEATHER + SEARCH, {}),
    ("quotes_and_spacing", "r</think><minimax:tool_call><invoke name='get_weather'><parameter name = location >Paris"
     "</parameter><parameter  name=\" unit \">f</parameter></invoke></minimax:tool_call>", WEATHER, {}),
    ("multiline_string", "r</think><minimax:tool_call>\n<invoke name=\"write\">\n<parameter name=\"code\">\n"
     "def f(x):\n    return \"<b>\" + x\n\n</parameter>\n</invoke>\n</minimax:tool_call>", None, {}),
    ("unicode_values", "推理\n</think>\n\n好的 👩‍👩‍👧\n<minimax:tool_call><invoke name=\"get_weather\">"
     "<parameter name=\"location\">東京 — Tōkyō 🌧</parameter><parameter name=\"unit\">°C</parameter></invoke>"
     "</minimax:tool_call>", WEATHER, {}),
    ("types_ok", "r</think>" + typed_call(i="42", n="3.5", b="True", o="{\"k\": [1, 2.5, null]}", a="[1, \"x\"]",
                                          s="  some text  ", any="17", opt="NULL", e="2", u="{\"z\": true}", nt="7",
                                          f="2.0", bl="0"), TYPED, {}),
    ("types_fallback", "r</think>" + typed_call(i="4.5", n="abc", b="yes", o="[1]", a="{not json", s="null", any="x1",
                                                opt="x", e="four", u="plain words", nt="[1]", f="1e400", bl="maybe"),
     TYPED, {}),
    ("types_more_numbers", "r</think>" + typed_call(i="+7", n="1e3", f="-0.25", opt="-12", any="1_000", e=" 3 ", b="1", bl="FALSE"),
     TYPED, {}),
    ("unknown_tool_and_param", "r</think><minimax:tool_call><invoke name=\"mystery\"><parameter name=\"x\">5"
     "</parameter><parameter name=\"y\">{\"a\": 1}</parameter></invoke></minimax:tool_call>", TYPED, {}),
    ("empty_invoke", "r</think><minimax:tool_call><invoke name=\"ping\"></invoke></minimax:tool_call>", None, {}),
    ("empty_value", "r</think><minimax:tool_call><invoke name=\"typed\"><parameter name=\"s\"></parameter>"
     "<parameter name=\"i\">  </parameter></invoke></minimax:tool_call>", TYPED, {}),
    ("duplicate_param", "r</think><minimax:tool_call><invoke name=\"get_weather\"><parameter name=\"location\">A"
     "</parameter><parameter name=\"location\">B</parameter></invoke></minimax:tool_call>", WEATHER, {}),
    ("string_null_like", "r</think>" + typed_call(s="nullish", i="nul"), TYPED, {}),
    ("lenient_missing_param_close", "r</think><minimax:tool_call><invoke name=\"get_weather\"><parameter "
     "name=\"location\">Oslo</invoke></minimax:tool_call>", WEATHER, {}),
    ("lenient_missing_invoke_close", "r</think><minimax:tool_call><invoke name=\"get_weather\"><parameter "
     "name=\"location\">Oslo</parameter></minimax:tool_call>tail", WEATHER, {}),
    ("lenient_missing_both", "r</think><minimax:tool_call><invoke name=\"get_weather\"><parameter "
     "name=\"location\">Oslo</minimax:tool_call>tail", WEATHER, {}),
    ("truncated_in_value", "r</think>ok<minimax:tool_call><invoke name=\"get_weather\"><parameter "
     "name=\"location\">Osl", WEATHER, {}),
    ("truncated_after_invoke", "r</think>ok<minimax:tool_call><invoke name=\"get_weather\"></invoke>\n", WEATHER, {}),
    ("angle_brackets_in_content", "r</think>a < b and <b>bold</b> <minimax:tool and </think> too", None, {}),
    ("value_with_tags", "r</think><minimax:tool_call><invoke name=\"w\"><parameter name=\"html\"><p>hi</p>"
     "<parameter x></parameter></invoke></minimax:tool_call>", None, {}),
    ("escapes_in_values", "r</think><minimax:tool_call><invoke name=\"w\"><parameter name=\"s\">tab\there \"q\" "
     "back\\slash \x01 ctrl</parameter></invoke></minimax:tool_call>", None, {}),
    ("whitespace_everywhere", "  \n r \n </think> \n\n c1 \n\n<minimax:tool_call> \n <invoke name=\"get_weather\"> \n "
     "<parameter name=\"unit\"> \n c \n </parameter> \n </invoke> \n </minimax:tool_call> \n\n c2 \n ", WEATHER, {}),
    ("many_calls", "r</think>" + "".join(f"<minimax:tool_call><invoke name=\"get_weather\"><parameter "
                                         f"name=\"location\">city{i}</parameter></invoke></minimax:tool_call>"
                                         for i in range(5)), WEATHER, {}),
    ("bare_schema_tools", "r</think><minimax:tool_call><invoke name=\"typed\"><parameter name=\"i\">9</parameter>"
     "</invoke></minimax:tool_call>", [{"name": "typed", "input_schema": {"properties": {"i": {"type": "integer"}}}}],
     {}),
]


def main():
    out = []
    for name, text, tools, opts in CASES:
        exp = ref_parse(text, tools, think_open=opts.get("think_open", True), reasoning=opts.get("reasoning", True),
                        tool_calls=opts.get("tool_calls", True))
        for c in exp["tool_calls"]:
            json.loads(c["arguments"])
        out.append({"name": name, "text": text, "tools": tools, "options": {
            "think_open": opts.get("think_open", True), "reasoning": opts.get("reasoning", True),
            "tool_calls": opts.get("tool_calls", True)}, "expect": exp})
    doc = {"generator": "tools/golden/gen_parse.py", "python": sys.version.split()[0], "cases": out}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"gen_parse: {len(out)} cases -> {OUT}")


if __name__ == "__main__":
    main()
