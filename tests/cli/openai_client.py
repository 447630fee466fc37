"""The official `openai` Python client against `moerun serve` (run by
tests/cli/serve_openai.sh inside a private venv).

usage: openai_client.py BASE_URL PROMPT_IDS EXPECTED_IDS [AUTH_URL [TEXT_URL]]

PROMPT_IDS / EXPECTED_IDS: comma lists; EXPECTED_IDS are `moerun generate`'s
greedy tokens for the prompt (an independent driver of the same model).
AUTH_URL: a second server started with --api-key secret.
TEXT_URL: a server of a MiniMax-form checkpoint with a tokenizer and chat
template, started with --debug-forced-output (its outputs are dictated by
the requests: chat, reasoning, tool calls and stop strings through the
client's own types).
Prints one line per case; exits 1 on the first failure."""
import json as _json_mod
import os
import sys

import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from oaicheck import check, checks, each, ended, expect_exc  # noqa: E402

base, prompt_s, expected_s = sys.argv[1], sys.argv[2], sys.argv[3]
auth_url = sys.argv[4] if len(sys.argv) > 4 else None
text_url = sys.argv[5] if len(sys.argv) > 5 else None
prompt = [int(x) for x in prompt_s.split(",")]
expected = [int(x) for x in expected_s.split(",")]
n_exp = len(expected)
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def extra(obj, key):
    d = getattr(obj, "model_extra", None) or {}
    return d.get(key)


print("openai", openai.__version__)
models = client.models.list()
ids = [m.id for m in models.data]
check(len(ids) == 1, f"one model, got {ids}")
model = ids[0]

# completions, not streaming: the exact tokens, usage, finish_reason
r = client.completions.create(model=model, prompt=prompt, max_tokens=n_exp, temperature=0,
                              extra_body={"ignore_eos": True})
check(r.object == "text_completion", f"object {r.object}")
check(r.choices[0].finish_reason == "length", f"finish_reason {r.choices[0].finish_reason}")
check(extra(r.choices[0], "token_ids") == expected, f"tokens {extra(r.choices[0], 'token_ids')} != {expected}")
check(r.usage.prompt_tokens == len(prompt), f"prompt_tokens {r.usage.prompt_tokens}")
check(r.usage.completion_tokens == n_exp, f"completion_tokens {r.usage.completion_tokens}")
check(r.usage.total_tokens == len(prompt) + n_exp, "total_tokens")
print("completions: ok")

# streaming with include_usage: one token per chunk, then a usage chunk with no choices
chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=n_exp, temperature=0, stream=True,
                                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
toks = [t for c in chunks if c.choices for t in (extra(c.choices[0], "token_ids") or [])]
per_chunk = [len(extra(c.choices[0], "token_ids") or []) for c in chunks if c.choices]
check(toks == expected, f"streamed tokens {toks} != {expected}")
check(max(per_chunk) == 1, "more than one token in a chunk")
check(chunks[-1].choices == [] and chunks[-1].usage is not None, "the last chunk is not the usage chunk")
check(chunks[-1].usage.completion_tokens == n_exp, f"streamed completion_tokens {chunks[-1].usage.completion_tokens}")
check(all(c.usage is None for c in chunks[:-1]), "usage before the last chunk")
fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check(fin == ["length"], f"finish reasons {fin}")
print("streaming + include_usage: ok")

# max_tokens, seed, n
r = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
check(extra(r.choices[0], "token_ids") == expected[:3], "max_tokens 3 is not the first 3 tokens")
a = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=1.0, seed=7, n=2,
                              extra_body={"ignore_eos": True})
b = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=1.0, seed=7, n=2,
                              extra_body={"ignore_eos": True})
check([extra(c, "token_ids") for c in a.choices] == [extra(c, "token_ids") for c in b.choices], "seed is not reproducible")
check(len(a.choices) == 2 and [c.index for c in a.choices] == [0, 1], "n=2 choices")
check(extra(a.choices[0], "token_ids") != extra(a.choices[1], "token_ids"), "the n choices are equal")
check(a.usage.completion_tokens == 24, f"n=2 completion_tokens {a.usage.completion_tokens}")
print("max_tokens, seed, n: ok")

# stop_token_ids: ends at the first occurrence, counted
stop = expected[2]
first = expected.index(stop)
r = client.completions.create(model=model, prompt=prompt, max_tokens=n_exp, temperature=0,
                              extra_body={"ignore_eos": True, "stop_token_ids": [stop]})
check(r.choices[0].finish_reason == "stop", f"stop_token_ids finish {r.choices[0].finish_reason}")
check(extra(r.choices[0], "token_ids") == expected[:first + 1], "stop_token_ids tokens")
check(r.usage.completion_tokens == first + 1, "stop_token_ids completion_tokens")
print("stop_token_ids: ok")

# logit_bias (the client's own parameter) and min_tokens (vLLM's): properties of greedy decoding.
# t: a token greedy never picks here, far from the special ids at the bottom of the vocabulary.
t = next(x for x in range(100, 200) if x not in expected)
r = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, logit_bias={str(t): 100},
                              extra_body={"ignore_eos": True})
check(extra(r.choices[0], "token_ids") == [t] * 5, f"logit_bias +100: {extra(r.choices[0], 'token_ids')}")
r = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0,
                              logit_bias={str(expected[0]): -100}, extra_body={"ignore_eos": True})
check(extra(r.choices[0], "token_ids")[0] != expected[0], "logit_bias -100 did not ban the greedy token")
# t as a stop id biased to the top: it ends the output at once, unless min_tokens masks it; masked, the
# rest of the row is the raw one, so the tokens before it are generate's
r = client.completions.create(model=model, prompt=prompt, max_tokens=n_exp, temperature=0, logit_bias={str(t): 100},
                              extra_body={"ignore_eos": True, "stop_token_ids": [t]})
check(extra(r.choices[0], "token_ids") == [t] and r.usage.completion_tokens == 1, "a biased stop id")
for stream in (False, True):
    kw = dict(model=model, prompt=prompt, max_tokens=n_exp, temperature=0, logit_bias={str(t): 100},
              extra_body={"ignore_eos": True, "stop_token_ids": [t], "min_tokens": 4})
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        got = [x for c in chunks if c.choices for x in (extra(c.choices[0], "token_ids") or [])]
        fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        ct = chunks[-1].usage.completion_tokens
    else:
        r = client.completions.create(**kw)
        got, fin, ct = extra(r.choices[0], "token_ids"), [r.choices[0].finish_reason], r.usage.completion_tokens
    check(got == expected[:4] + [t], f"min_tokens 4 (stream {stream}): {got}")
    check(fin == ["stop"] and ct == 5, f"min_tokens 4 (stream {stream}): finish {fin}, completion_tokens {ct}")
# allowed_token_ids (vLLM's): a set holding every greedy token leaves the output as generate's; without the
# first one, the first token is another id of the set
allowed = sorted(set(expected) | {t, t + 1})
r = client.completions.create(model=model, prompt=prompt, max_tokens=n_exp, temperature=0,
                              extra_body={"ignore_eos": True, "allowed_token_ids": allowed})
check(extra(r.choices[0], "token_ids") == expected, "allowed_token_ids holding the greedy tokens")
allowed = [x for x in allowed if x != expected[0]]
r = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0.8, seed=3,
                              extra_body={"ignore_eos": True, "allowed_token_ids": allowed})
got = extra(r.choices[0], "token_ids")
check(got[0] != expected[0] and all(x in allowed for x in got), f"allowed_token_ids sampled {got}")
# truncate_prompt_tokens (vLLM's): the last k prompt tokens, as if sent alone
r = client.completions.create(model=model, prompt=[9, 9, 9] + prompt, max_tokens=n_exp, temperature=0,
                              extra_body={"ignore_eos": True, "truncate_prompt_tokens": len(prompt)})
check(extra(r.choices[0], "token_ids") == expected and r.usage.prompt_tokens == len(prompt), "truncate_prompt_tokens")
# vLLM's prompt_logprobs over generate's greedy tokens: each is its position's most likely, rank 1
v = client.completions.create(model=model, prompt=prompt + expected, max_tokens=1, temperature=0,
                              extra_body={"prompt_logprobs": 3, "ignore_eos": True})
pl = extra(v.choices[0], "prompt_logprobs")
check(len(pl) == len(prompt) + n_exp and pl[0] is None, "prompt_logprobs shape")
for j, tk in enumerate(expected):
    d = pl[len(prompt) + j]
    check(d[str(tk)]["rank"] == 1 and d[str(tk)]["decoded_token"] == f"token_id:{tk}", f"greedy token {tk}: {d}")
    check(sorted(x["rank"] for k, x in d.items() if k != str(tk)) == [2, 3], f"alternatives of {tk}: {d}")
    check(all(x["logprob"] <= d[str(tk)]["logprob"] for x in d.values()), f"the greedy token is not the likeliest: {d}")
print("logit_bias, min_tokens, allowed_token_ids, truncate_prompt_tokens: ok")

# errors: the right exception class, with the server's message and param
def created_and_streamed(create, stream, final, kw):
    """(False, the created answer), then (True, the final answer its client's stream accumulator built)."""
    yield False, create(**kw)
    with stream(**kw) as st:
        for _ in st:
            pass
        yield True, getattr(st, final)()




expect_exc(openai.BadRequestError, lambda: client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                                                     extra_body={"bogus": 1}), param="bogus")
expect_exc(openai.BadRequestError, lambda: client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                                                     temperature=5), param="temperature")
expect_exc(openai.BadRequestError, lambda: client.completions.create(model=model, prompt=prompt, max_tokens=10**6),
           param="max_tokens")
expect_exc(openai.BadRequestError, lambda: client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                                                     best_of=2), param="best_of")
r = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=2,
                              extra_body={"ignore_eos": True})
lp = r.choices[0].logprobs
check(lp is not None and len(lp.token_logprobs) == 4 and len(lp.top_logprobs) == 4, "completions logprobs")
check(all(v <= 0 for v in lp.token_logprobs) and all(len(t) == 2 for t in lp.top_logprobs), "logprob values")
expect_exc(openai.BadRequestError, lambda: client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                                                     extra_body={"min_tokens": 5}), param="min_tokens",
           text="above max_tokens 4")
expect_exc(openai.BadRequestError, lambda: client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                                                     logit_bias={"7": 101}), param="logit_bias[7]")
expect_exc(openai.BadRequestError, lambda: client.completions.create(
    model=model, prompt=prompt, max_tokens=4, extra_body={"allowed_token_ids": []}), param="allowed_token_ids")
expect_exc(openai.BadRequestError, lambda: client.completions.create(
    model=model, prompt=prompt, max_tokens=4, extra_body={"bad_words": ["x"]}), param="bad_words", text="tokenizer")
expect_exc(openai.BadRequestError, lambda: client.completions.create(
    model=model, prompt=prompt, max_tokens=4, extra_body={"allowed_token_ids": [t], "stop_token_ids": [t],
                                                          "min_tokens": 2}), param="allowed_token_ids", text="banned")
expect_exc(openai.NotFoundError, lambda: client.completions.create(model="no-such-model", prompt=prompt, max_tokens=4),
           param="model", text="does not exist")
expect_exc(openai.BadRequestError, lambda: list(client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                                                          stream=True, extra_body={"n": 0}))),
if auth_url:
    for wrong in ("wrong", "secre", "secrets", "Secret", "s", "secretsecret"):  # a prefix or an extension is not the key
        bad_key = openai.OpenAI(base_url=auth_url + "/v1", api_key=wrong, max_retries=0)
        expect_exc(openai.AuthenticationError, lambda: bad_key.models.list())
    good_key = openai.OpenAI(base_url=auth_url + "/v1", api_key="secret", max_retries=0)
    check(len(good_key.models.list().data) == 1, "the right key is refused")
    import urllib.request as _ur0  # the health checks and /version need no key (vLLM's /ping: GET and POST)
    for req in (_ur0.Request(auth_url + "/ping"), _ur0.Request(auth_url + "/ping", data=b"{}", method="POST"),
                _ur0.Request(auth_url + "/health")):
        with _ur0.urlopen(req, timeout=30) as rr:
            check(rr.status == 200 and _json_mod.loads(rr.read()) == {"status": "ok"}, f"{req.get_method()} {req.full_url}")
    with _ur0.urlopen(auth_url + "/health_generate", timeout=60) as rr:  # sglang's: no key either
        check(rr.status == 200 and _json_mod.loads(rr.read())["usage"]["completion_tokens"] == 1, "/health_generate")
    try:  # /get_model_info is not a health check: the key is needed
        _ur0.urlopen(auth_url + "/get_model_info", timeout=30)
        check(False, "/get_model_info without the key was answered")
    except _ur0.HTTPError as he:
        check(he.code == 401, f"/get_model_info without the key: {he.code}")
    with _ur0.urlopen(auth_url + "/version", timeout=30) as rr:
        check(_json_mod.loads(rr.read()).get("version", "").count(".") == 2, "/version")
    import anthropic as _anth  # Anthropic's clients send the key as x-api-key
    try:
        _anth.Anthropic(base_url=auth_url, api_key="wrong", max_retries=0).messages.count_tokens(
            model=model, messages=[{"role": "user", "content": "x"}])
        check(False, "a wrong x-api-key was taken")
    except _anth.AuthenticationError as e:
        check(isinstance(e.body, dict) and e.body.get("type") == "error", f"401 body {e.body}")
    try:
        _anth.Anthropic(base_url=auth_url, api_key="secret", max_retries=0).messages.count_tokens(
            model=model, messages=[{"role": "user", "content": "x"}])
    except _anth.AuthenticationError:
        check(False, "the right x-api-key is refused")
    except _anth.APIStatusError:
        pass  # past the key (this model may have no chat template)
print("errors: ok")

if text_url:
    tc = openai.OpenAI(base_url=text_url + "/v1", api_key="none", max_retries=0, timeout=120)
    tmodel = tc.models.list().data[0].id
    EOS = "[e~["
    say = "Two plus two.</think>\n\nThe answer is 4." + EOS
    r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "2+2?"}], max_tokens=64,
                                   extra_body={"debug_forced_output": say})
    m = r.choices[0].message
    check(r.object == "chat.completion", f"object {r.object}")
    check(m.role == "assistant" and m.content == "The answer is 4.", f"content {m.content!r}")
    check(extra(m, "reasoning_content") == "Two plus two.", f"reasoning {extra(m, 'reasoning_content')!r}")
    check(r.choices[0].finish_reason == "stop", "chat finish_reason")
    print("chat + reasoning: ok")

    chunks = list(tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "2+2?"}],
                                             max_tokens=64, stream=True, stream_options={"include_usage": True},
                                             extra_body={"debug_forced_output": say}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(extra(c.choices[0].delta, "reasoning_content") or "" for c in chunks if c.choices)
    check(chunks[0].choices[0].delta.role == "assistant", "the first delta carries the role")
    check(content == "The answer is 4." and reasoning == "Two plus two.", f"streamed {content!r} / {reasoning!r}")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
          "streamed usage differs from the non-streamed one")
    print("chat streaming + include_usage: ok")

    # continue_final_message (vLLM's): the rendered prompt is the full conversation's render cut after the last
    # message's text (no end of turn, no new assistant turn); the output continues that message: content when
    # it is past its reasoning, reasoning when it stopped inside <think>
    import json as _json2
    import urllib.request as _ur2

    def rendered(body):
        q = _ur2.Request(text_url + "/tokenize", data=_json2.dumps(body).encode(), headers={"Content-Type": "application/json"})
        ids = _json2.loads(_ur2.urlopen(q, timeout=30).read())["tokens"]
        q = _ur2.Request(text_url + "/detokenize", data=_json2.dumps({"tokens": ids}).encode(),
                         headers={"Content-Type": "application/json"})
        return _json2.loads(_ur2.urlopen(q, timeout=30).read())["prompt"]

    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "The answer is"}]
    open_p = rendered({"messages": conv, "continue_final_message": True})
    full_p = rendered({"messages": conv, "add_generation_prompt": False})
    check(open_p.endswith("The answer is") and full_p.startswith(open_p) and len(full_p) > len(open_p),
          f"continue_final_message render {open_p[-40:]!r} / {full_p[-40:]!r}")
    for stream in (False, True):
        kw = dict(model=tmodel, messages=conv, max_tokens=16, extra_body={"continue_final_message": True,
                                                                          "debug_forced_output": " 4." + EOS})
        if stream:
            ch = list(tc.chat.completions.create(stream=True, **kw))
            got = ("".join(c.choices[0].delta.content or "" for c in ch if c.choices),
                   "".join(extra(c.choices[0].delta, "reasoning_content") or "" for c in ch if c.choices))
        else:
            m = tc.chat.completions.create(**kw).choices[0].message
            got = (m.content, extra(m, "reasoning_content") or "")
        check(got == (" 4.", ""), f"continue_final_message (stream={stream}): {got!r}")
    m = tc.chat.completions.create(model=tmodel, max_tokens=32, messages=[
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nTwo"}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "debug_forced_output": " plus two.</think>\n\nIt is 4." + EOS}).choices[0].message
    check(m.content == "It is 4." and extra(m, "reasoning_content") == "plus two.",
          f"continue_final_message inside <think>: {m.content!r} / {extra(m, 'reasoning_content')!r}")
    expect_exc(openai.BadRequestError, lambda: tc.chat.completions.create(
        model=tmodel, messages=conv, max_tokens=4, extra_body={"continue_final_message": True,
                                                              "add_generation_prompt": True}),
        param="continue_final_message", text="both true")
    print("continue_final_message: ok")


    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                             "required": ["city"]}}}]
    call = ("Look it up.</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris"
            "</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>" + EOS)
    r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "Weather?"}], tools=tools,
                                   max_tokens=200, extra_body={"debug_forced_output": call})
    tcs = r.choices[0].message.tool_calls
    check(r.choices[0].finish_reason == "tool_calls", f"finish {r.choices[0].finish_reason}")
    check(tcs is not None and len(tcs) == 1 and tcs[0].type == "function", f"tool_calls {tcs}")
    check(tcs[0].function.name == "get_weather", "tool name")
    import json as _json
    check(_json.loads(tcs[0].function.arguments) == {"city": "Paris", "days": 3}, f"arguments {tcs[0].function.arguments}")
    # the call and its result go back in the next turn
    r2 = tc.chat.completions.create(model=tmodel, tools=tools, max_tokens=64, messages=[
        {"role": "user", "content": "Weather?"}, r.choices[0].message,
        {"role": "tool", "tool_call_id": tcs[0].id, "content": "sunny"}],
        extra_body={"debug_forced_output": "ok</think>\n\nSunny." + EOS})
    check(r2.choices[0].message.content == "Sunny.", "the next turn after a tool result")
    stream_args = ""
    for c in tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "Weather?"}], tools=tools,
                                        max_tokens=200, stream=True, extra_body={"debug_forced_output": call}):
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            stream_args += d.function.arguments or ""
    check(_json.loads(stream_args) == {"city": "Paris", "days": 3}, f"streamed arguments {stream_args}")
    print("tool calls: ok")

    # the Responses API (POST /v1/responses) through the client's responses.create / .stream / .parse; the
    # same conversation through chat completions is the reference for what the model was given (usage)
    r = tc.responses.create(model=tmodel, input="2+2?", instructions="Be brief.", max_output_tokens=64,
                            extra_body={"debug_forced_output": say})
    cr = tc.chat.completions.create(model=tmodel, max_tokens=64, extra_body={"debug_forced_output": say}, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}])
    check(r.object == "response" and r.status == "completed" and r.output_text == "The answer is 4.",
          f"responses: {r.status} {r.output_text!r}")
    check([o.type for o in r.output] == ["reasoning", "message"] and r.output[0].content[0].text == "Two plus two.",
          f"responses output {[o.type for o in r.output]}")
    check(r.usage.input_tokens == cr.usage.prompt_tokens and r.usage.output_tokens == cr.usage.completion_tokens and
          0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens and r.instructions == "Be brief.",
          f"responses usage {r.usage} vs chat {cr.usage}")
    with tc.responses.stream(model=tmodel, input="2+2?", instructions="Be brief.", max_output_tokens=64,
                             extra_body={"debug_forced_output": say}) as st:
        kinds = [ev.type for ev in st]
        fin = st.get_final_response()
    check(fin.output_text == "The answer is 4." and fin.status == "completed" and fin.usage.output_tokens == r.usage.output_tokens,
          f"responses stream: {fin.output_text!r} {fin.status}")
    check(kinds[0] == "response.created" and kinds[-1] == "response.completed" and
          "response.reasoning_text.delta" in kinds and kinds.count("response.output_item.done") == 2, f"events {kinds}")
    # reasoning.summary (what many Responses clients send): taken and echoed; the reasoning comes back whole
    rsum = tc.responses.create(model=tmodel, input="2+2?", max_output_tokens=64, reasoning={"effort": "low", "summary": "auto"},
                               prompt_cache_key="k", prompt_cache_retention="24h", extra_body={"debug_forced_output": say})
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", prompt_cache_retention="1y"),
               param="prompt_cache_retention")
    check(rsum.reasoning.summary == "auto" and rsum.reasoning.effort == "low" and
          rsum.output[0].content[0].text == "Two plus two." and rsum.output_text == "The answer is 4.", f"summary {rsum.reasoning}")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", reasoning={"summary": "long"}),
               param="reasoning.summary")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", reasoning={"budget": 3}),
               param="reasoning")
    r = tc.responses.create(model=tmodel, input="2+2?", max_output_tokens=3, extra_body={"debug_forced_output": say})
    check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 3,
          f"responses incomplete: {r.status} {r.incomplete_details}")
    rtools = [{"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters":
               tools[0]["function"]["parameters"]}]
    for stream, r in created_and_streamed(tc.responses.create, tc.responses.stream, "get_final_response", dict(
            model=tmodel, input=[{"role": "user", "content": "Weather?"}], tools=rtools, max_output_tokens=200,
            extra_body={"debug_forced_output": call})):
        fc = [o for o in r.output if o.type == "function_call"]
        check(len(fc) == 1 and fc[0].name == "get_weather" and _json.loads(fc[0].arguments) == {"city": "Paris", "days": 3}
              and fc[0].call_id, f"responses function_call (stream={stream}): {r.output}")
    # a named function (tool_choice): the answer is that call, in the model's own format, held to its schema
    named = ("Thinking.</think>\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Rome"
             "</parameter>\n<parameter name=\"days\">2</parameter>\n</invoke>\n</minimax:tool_call>" + EOS)
    for stream, r in created_and_streamed(tc.responses.create, tc.responses.stream, "get_final_response", dict(
            model=tmodel, input="Weather?", tools=rtools, tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=100, extra_body={"debug_forced_output": named})):
        fc2 = [o for o in r.output if o.type == "function_call"]
        check(len(fc2) == 1 and fc2[0].name == "get_weather" and _json.loads(fc2[0].arguments) == {"city": "Rome", "days": 2},
              f"responses named tool_choice (stream={stream}): {r.output}")
    # the call and its output as input items render as the chat messages they stand for
    nxt = [{"role": "user", "content": "Weather?"}, {"type": "function_call", "call_id": fc[0].call_id, "name": "get_weather",
           "arguments": fc[0].arguments}, {"type": "function_call_output", "call_id": fc[0].call_id, "output": "Sunny"}]
    r = tc.responses.create(model=tmodel, input=nxt, tools=rtools, max_output_tokens=64,
                            extra_body={"debug_forced_output": say})
    cr = tc.chat.completions.create(model=tmodel, tools=tools, max_tokens=64, extra_body={"debug_forced_output": say},
                                    messages=[{"role": "user", "content": "Weather?"},
                                              {"role": "assistant", "content": "", "tool_calls": [
                                                  {"id": fc[0].call_id, "type": "function", "function": {
                                                      "name": "get_weather", "arguments": fc[0].arguments}}]},
                                              {"role": "tool", "tool_call_id": fc[0].call_id, "content": "Sunny"}])
    check(r.usage.input_tokens == cr.usage.prompt_tokens and r.output_text == "The answer is 4.",
          f"responses tool turn: {r.usage.input_tokens} vs {cr.usage.prompt_tokens}")
    import typing as _typing
    import pydantic as _pyd

    class Pick(_pyd.BaseModel):
        color: _typing.Literal["red", "green"]
        n: int = _pyd.Field(ge=0, le=9)

    parsed = 0
    for seed in range(3):
        r = tc.responses.parse(model=tmodel, input="pick", text_format=Pick, max_output_tokens=200, temperature=1.0,
                               extra_body={"seed": seed, "debug_forced_output": "Thinking.</think>"})
        if r.status == "completed":
            check(isinstance(r.output_parsed, Pick), f"responses.parse: {r.output_text!r}")
            parsed += 1
    check(parsed >= 2, f"responses.parse: {parsed} of 3 ended")
    # clients that leave a Responses stream after its first event: their sequences end and free their KV
    import http.client as _hc
    import time as _time
    from urllib.parse import urlparse as _up
    u = _up(text_url)
    import urllib.request as _ur

    def metric(name, label="{"):
        q = _ur.urlopen(text_url + "/metrics", timeout=30).read().decode()
        vals = [float(ln.split()[-1]) for ln in q.splitlines() if ln.startswith(name + label)]
        return vals[0] if vals else 0.0

    gone0 = metric("moerun:client_disconnects_total")
    for _ in range(4):
        hc = _hc.HTTPConnection(u.hostname, u.port, timeout=30)
        hc.request("POST", "/v1/responses", body=_json2.dumps({"input": "x", "stream": True, "max_output_tokens": 900,
                                                                "ignore_eos": True}),
                   headers={"Content-Type": "application/json"})
        resp = hc.getresponse()
        first = resp.read(1)
        check(resp.status == 200 and first == b"e", f"responses stream: {resp.status} {first!r} {resp.read(300) if resp.status != 200 else b''}")
        resp.close()  # the socket closes once the response's file object lets it go too
        hc.sock.close()
        hc.close()

    # until the server has seen them go, and nothing runs, waits or holds KV blocks: up to ~2 minutes, since under
    # ctest -j2 the expert-parallel servers' ranks share the 2 cores with another test (a masked run here once read
    # 1 running, 2 KV blocks after the former ~30 s)
    for _ in range(2400):
        if (metric("moerun:client_disconnects_total") - gone0 >= 3 and metric("moerun:num_requests_running") == 0 and
                metric("moerun:num_requests_waiting") == 0 and metric("moerun:kv_cache_used_blocks") == 0):
            break
        _time.sleep(0.05)
    check(metric("moerun:num_requests_running") == 0 and metric("moerun:kv_cache_used_blocks") == 0,
          f"responses clients that left still hold sequences: {metric('moerun:num_requests_running')} running, "
          f"{metric('moerun:num_requests_waiting')} waiting, {metric('moerun:kv_cache_used_blocks')} KV blocks used")
    check(metric("moerun:client_disconnects_total") - gone0 >= 3, "responses clients that left were not counted as gone")
    # include reasoning.encrypted_content (clients that keep no server state): the reasoning item's blob, given
    # back in the next turn, is the reasoning the template renders there (the turn after a tool call)
    r = tc.responses.create(model=tmodel, input="Weather?", tools=rtools, max_output_tokens=200, store=False,
                            include=["reasoning.encrypted_content"], extra_body={"debug_forced_output": call})
    rs_item = [o for o in r.output if o.type == "reasoning"][0]
    fcall = [o for o in r.output if o.type == "function_call"][0]
    check(isinstance(rs_item.encrypted_content, str) and rs_item.content[0].text == "Look it up.", f"encrypted {rs_item}")
    nxt2 = [{"role": "user", "content": "Weather?"},
            {"type": "reasoning", "id": rs_item.id, "summary": [], "encrypted_content": rs_item.encrypted_content},
            {"type": "function_call", "call_id": fcall.call_id, "name": "get_weather", "arguments": fcall.arguments},
            {"type": "function_call_output", "call_id": fcall.call_id, "output": "Sunny"}]
    r2 = tc.responses.create(model=tmodel, input=nxt2, tools=rtools, max_output_tokens=64, extra_body={"debug_forced_output": say})
    r3 = tc.responses.create(model=tmodel, input=[nxt2[0]] + nxt2[2:], tools=rtools, max_output_tokens=64,
                             extra_body={"debug_forced_output": say})
    cu = tc.chat.completions.create(model=tmodel, tools=tools, max_tokens=64, extra_body={"debug_forced_output": say},
                                    messages=[{"role": "user", "content": "Weather?"},
                                              {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
                                               "tool_calls": [{"id": fcall.call_id, "type": "function", "function": {
                                                   "name": "get_weather", "arguments": fcall.arguments}}]},
                                              {"role": "tool", "tool_call_id": fcall.call_id, "content": "Sunny"}]).usage
    check(r2.usage.input_tokens == cu.prompt_tokens and r2.usage.input_tokens > r3.usage.input_tokens,
          f"encrypted reasoning given back: {r2.usage.input_tokens} vs chat {cu.prompt_tokens} (without: {r3.usage.input_tokens})")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input=[
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB..."}, {"role": "user", "content": "x"}]),
        param="input[0]", text="not this server's")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", include=["file_search_call.results"]),
               param="include")
    expect_exc(openai.NotFoundError, lambda: tc.responses.create(model=tmodel, input="x", previous_response_id="resp_1"),
               param="previous_response_id", text="not found")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", previous_response_id=7),
               param="previous_response_id")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", tools=[{"type": "web_search"}]),
               param="tools[0]")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", max_output_tokens=0),
               param="max_output_tokens")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", max_output_tokens=10 ** 6),
               param="max_output_tokens", text="max_output_tokens is 1000000")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x" * 200, max_output_tokens=1000),
               param="max_output_tokens", text="maximum context length")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input=[{"type": "input_image"}]),
               param="input[0]")
    # logprobs (include message.output_text.logprobs, top_logprobs): an entry for each token of the message's
    # text and none for the reasoning's, a call's or the markup's (</think>, the blank line after it), so that
    # their bytes are the text's, UTF-8 split across tokens included; the values are chat's for the same tokens
    # (chat lists every token, the EOS too); streamed, the deltas carry them and add up to the final ones
    lsay = "Two plus two.</think>\n\nThe answer is 4, \u00e9 \u65e5\u672c." + EOS
    lkw = dict(model=tmodel, input="2+2?", max_output_tokens=64, include=["message.output_text.logprobs"], top_logprobs=3,
               extra_body={"debug_forced_output": lsay})
    ch = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "2+2?"}], max_tokens=64,
                                    logprobs=True, top_logprobs=3, extra_body={"debug_forced_output": lsay}).choices[0].logprobs.content
    for stream, r in created_and_streamed(tc.responses.create, tc.responses.stream, "get_final_response", lkw):
        part = [o for o in r.output if o.type == "message"][0].content[0]
        lps = part.logprobs or []
        check(part.text == "The answer is 4, \u00e9 \u65e5\u672c." and bytes(b for x in lps for b in x.bytes) == part.text.encode(),
              f"responses logprobs (stream={stream}): {part.text!r} from {[x.token for x in lps]}")
        check(r.top_logprobs == 3 and all(len(x.top_logprobs) == 3 and x.logprob <= 0 and
                                          all(isinstance(t.bytes, list) for t in x.top_logprobs) and
                                          [t.logprob for t in x.top_logprobs] == sorted((t.logprob for t in x.top_logprobs), reverse=True)
                                          for x in lps), f"responses top_logprobs (stream={stream}): {lps[:2]}")
        tail = ch[len(ch) - 1 - len(lps):len(ch) - 1]
        check([(x.token, x.logprob, x.bytes) for x in lps] == [(x.token, x.logprob, x.bytes) for x in tail],
              f"responses logprobs vs chat's (stream={stream})")
    ev = list(tc.responses.create(stream=True, **lkw))
    dl = [x.logprob for e in ev if e.type == "response.output_text.delta" for x in e.logprobs]
    fin = [e.response for e in ev if e.type == "response.completed"][0]
    check(dl == [x.logprob for x in fin.output[-1].content[0].logprobs] and len(dl) == len(lps), "streamed logprobs deltas")
    r = tc.responses.create(model=tmodel, input="Weather?", tools=rtools, max_output_tokens=200, top_logprobs=2,
                            extra_body={"debug_forced_output": "Hm.</think>\n\nLet me see.\n" + call.split("</think>\n\n")[1]})
    part = [o for o in r.output if o.type == "message"][0].content[0]
    joined = bytes(b for x in part.logprobs for b in x.bytes)  # the last token, ".\n", is partly the text's
    check([o.type for o in r.output] == ["reasoning", "message", "function_call"] and part.text == "Let me see." and
          joined.startswith(part.text.encode()) and len(joined) - len(part.text) < len(part.logprobs[-1].bytes),
          f"logprobs beside a call: {r.output}")
    r = tc.responses.create(model=tmodel, input="2+2?", max_output_tokens=64, extra_body={"debug_forced_output": lsay})
    check(r.output[-1].content[0].logprobs == [] and r.top_logprobs == 0, "logprobs given unasked")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", top_logprobs=21), param="top_logprobs")
    # truncation "auto" (OpenAI's): a conversation past the context drops its first items, the fewest that make
    # it fit, the instructions kept; the oracle is the same conversation without its first k items, truncation
    # disabled, for the smallest k the server takes
    conv = [{"role": "user", "content": "one " * 400}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "two " * 400}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "three " * 350}, {"role": "user", "content": "2+2?"}]
    tkw = dict(model=tmodel, instructions="Be brief.", max_output_tokens=300, extra_body={"debug_forced_output": say})
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(input=conv, **tkw), param="input")
    fit = None
    for k in range(1, len(conv)):
        try:
            fit = (k, tc.responses.create(input=conv[k:], **tkw))
            break
        except openai.BadRequestError:
            pass
    for stream, rt in created_and_streamed(tc.responses.create, tc.responses.stream, "get_final_response",
                                           dict(input=conv, truncation="auto", **tkw)):
        check(fit is not None and fit[0] >= 2 and rt.usage.input_tokens == fit[1].usage.input_tokens and
              rt.truncation == "auto" and rt.output_text == "The answer is 4.",
              f"truncation auto (stream={stream}): {rt.usage.input_tokens} tokens, {rt.truncation}; without the first "
              f"{fit and fit[0]} items: {fit and fit[1].usage.input_tokens}")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(input=[conv[1], {"role": "user", "content": "four " * 800}],
                                                                   truncation="auto", **tkw), text="maximum context length")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(input="x", truncation="middle", **tkw), param="truncation")
    print("responses: ok")

    # the phases of one request on the idle server, read back from /metrics: its lengths are its usage, the
    # phases add up (ttft = queue + prefill, e2e = ttft + decode, inference = prefill + decode), and the steps
    # computed the prompt's uncached tokens and every output token but the last
    ph = ["request_prompt_tokens", "request_generation_tokens", "time_to_first_token_seconds",
          "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
          "e2e_request_latency_seconds", "request_inference_time_seconds", "iteration_tokens_total"]

    def phase_sums():
        return {n: (metric(f"moerun:{n}_sum"), metric(f"moerun:{n}_count")) for n in ph}

    def step_time():  # engine_steps_total, and engine_step_seconds_total by phase
        q = _ur.urlopen(text_url + "/metrics", timeout=30).read().decode()
        st = {"steps": sum(float(ln.split()[-1]) for ln in q.splitlines() if ln.startswith("moerun:engine_steps_total{"))}
        for ln in q.splitlines():
            if ln.startswith("moerun:engine_step_seconds_total{"):
                st[ln.split('phase="')[1].split('"')[0]] = float(ln.split()[-1])
        return st

    p0, s0 = phase_sums(), step_time()
    pu = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "phases?"}], max_tokens=64,
                                    extra_body={"debug_forced_output": say}).usage
    p1, s1 = phase_sums(), step_time()
    d = {n: p1[n][0] - p0[n][0] for n in ph}
    dn = {n: p1[n][1] - p0[n][1] for n in ph}
    q, pf, dc = d["request_queue_time_seconds"], d["request_prefill_time_seconds"], d["request_decode_time_seconds"]
    check(all(dn[n] == 1 for n in ph[:-1]) and d["request_prompt_tokens"] == pu.prompt_tokens and
          d["request_generation_tokens"] == pu.completion_tokens, f"request histograms: {dn} {d} vs {pu}")
    check(abs(q + pf - d["time_to_first_token_seconds"]) < 1e-5 and abs(q + pf + dc - d["e2e_request_latency_seconds"]) < 1e-5
          and abs(pf + dc - d["request_inference_time_seconds"]) < 1e-5 and min(q, pf, dc) >= 0, f"phases {d}")
    check(d["iteration_tokens_total"] == pu.prompt_tokens - pu.prompt_tokens_details.cached_tokens + pu.completion_tokens - 1
          and dn["iteration_tokens_total"] == pu.completion_tokens, f"iteration tokens {d['iteration_tokens_total']} in "
          f"{dn['iteration_tokens_total']} steps for {pu}")
    # the engine's own step counters over the same request: one step per iteration the histogram saw, every
    # phase took time, and together they fit in the request's life (arrival to last token)
    ds = {k: s1[k] - s0[k] for k in s1}
    check(set(ds) == {"steps", "schedule", "forward", "sample", "complete"} and ds["steps"] == dn["iteration_tokens_total"]
          and min(ds[k] for k in ("schedule", "forward", "sample", "complete")) > 0
          and sum(ds[k] for k in ("schedule", "forward", "sample", "complete")) <= d["e2e_request_latency_seconds"] + 1e-6,
          f"engine step metrics {ds} for {dn['iteration_tokens_total']} steps in {d['e2e_request_latency_seconds']} s")
    print("request phase metrics: ok")

    # stored responses (store is true unless false, as OpenAI's default): retrieve gives the Response back,
    # previous_response_id puts its conversation before the new input (without its instructions), input_items
    # lists what came before the output, delete removes it. The oracle for what the model was given: chat
    # completions of the conversation written out (prompt tokens, and the prefix cache's hits on its blocks).
    cw = "Look it up.</think>\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo" \
         "</parameter>\n<parameter name=\"days\">1</parameter>\n</invoke>\n</minimax:tool_call>" + EOS
    s1 = tc.responses.create(model=tmodel, input="Weather in Oslo?", instructions="Be brief.", tools=rtools,
                             max_output_tokens=200, extra_body={"debug_forced_output": cw})
    g1 = tc.responses.retrieve(s1.id)
    check(s1.store is True and g1.id == s1.id and g1.model_dump() == s1.model_dump() and len(s1.id) > 40,
          f"stored response: {s1.id} {s1.store} / {g1.id}")
    call1 = [o for o in s1.output if o.type == "function_call"][0]
    chain_kw = dict(model=tmodel, previous_response_id=s1.id, tools=rtools, max_output_tokens=64,
                    input=[{"type": "function_call_output", "call_id": call1.call_id, "output": "Cold"}],
                    extra_body={"debug_forced_output": say})
    for stream, s2 in created_and_streamed(tc.responses.create, tc.responses.stream, "get_final_response", chain_kw):
        written = [{"role": "user", "content": "Weather in Oslo?"},
                   {"role": "assistant", "content": "", "reasoning_content": "Look it up.", "tool_calls": [
                       {"id": call1.call_id, "type": "function", "function": {"name": "get_weather",
                                                                              "arguments": call1.arguments}}]},
                   {"role": "tool", "tool_call_id": call1.call_id, "content": "Cold"}]
        cw2 = tc.chat.completions.create(model=tmodel, tools=tools, max_tokens=64, messages=written,
                                         extra_body={"debug_forced_output": say}).usage
        check(s2.previous_response_id == s1.id and s2.output_text == "The answer is 4." and
              s2.usage.input_tokens == cw2.prompt_tokens and cw2.prompt_tokens_details.cached_tokens >= cw2.prompt_tokens - 16,
              f"previous_response_id (stream={stream}): {s2.usage} vs the conversation written out {cw2}")
        g2 = tc.responses.retrieve(s2.id)
        check(g2.output_text == s2.output_text and g2.previous_response_id == s1.id, f"stored chained (stream={stream})")
        # a third turn on the second: the whole chain is carried, the first instructions are not
        s3 = tc.responses.create(model=tmodel, previous_response_id=s2.id, input="Thanks.", max_output_tokens=64,
                                 extra_body={"debug_forced_output": say})
        cw3 = tc.chat.completions.create(model=tmodel, max_tokens=64, extra_body={"debug_forced_output": say}, messages=written + [
            {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "Two plus two."},
            {"role": "user", "content": "Thanks."}]).usage
        check(s3.usage.input_tokens == cw3.prompt_tokens, f"a chain of three (stream={stream}): {s3.usage} vs {cw3}")
        items = list(tc.responses.input_items.list(s3.id, order="asc"))
        want = ["message", "reasoning", "function_call", "function_call_output", "reasoning", "message", "message"]
        check([i.type for i in items] == want and all(i.id for i in items) and len({i.id for i in items}) == len(items) and
              items[-1].content[0].text == "Thanks." and items[3].output == "Cold", f"input_items: {[i.type for i in items]}")
        desc = tc.responses.input_items.list(s3.id, limit=2)  # newest first, two a page, the client pages on
        check([i.id for i in desc.data] == [items[-1].id, items[-2].id] and desc.has_more and
              [i.id for i in desc] == [i.id for i in reversed(items)], "input_items pages")
    # store false: nothing kept; delete: gone for retrieve and for previous_response_id
    nk = tc.responses.create(model=tmodel, input="x", max_output_tokens=8, store=False, extra_body={"debug_forced_output": say})
    check(nk.store is False, f"store false echoed {nk.store}")
    expect_exc(openai.NotFoundError, lambda: tc.responses.retrieve(nk.id), param="response_id")
    tc.responses.delete(s1.id)
    expect_exc(openai.NotFoundError, lambda: tc.responses.retrieve(s1.id), param="response_id")
    expect_exc(openai.NotFoundError, lambda: tc.responses.create(model=tmodel, input="x", previous_response_id=s1.id),
               param="previous_response_id")
    expect_exc(openai.NotFoundError, lambda: tc.responses.delete(s1.id))
    expect_exc(openai.BadRequestError, lambda: tc.responses.cancel(s2.id), param="response_id", text="background")
    expect_exc(openai.BadRequestError, lambda: tc.responses.input_items.list(s2.id, limit=101), param="limit")
    print("stored responses: ok")

    # background responses: answered at once (queued), run without the connection, read back by polling;
    # the same answer as in the foreground; cancel ends a running one (status cancelled, its sequence freed)
    def poll(rid):
        return ended(tc, rid)

    fg = tc.responses.create(model=tmodel, input="2+2?", max_output_tokens=64, extra_body={"debug_forced_output": say})
    bg = tc.responses.create(model=tmodel, input="2+2?", max_output_tokens=64, background=True,
                             extra_body={"debug_forced_output": say})
    check(bg.status in ("queued", "in_progress") and bg.background is True and not bg.output, f"background at once: {bg.status}")
    bgd = poll(bg.id)
    check(bgd.status == "completed" and bgd.output_text == fg.output_text and bgd.usage.output_tokens == fg.usage.output_tokens
          and bgd.usage.input_tokens == fg.usage.input_tokens, f"background answer: {bgd.status} {bgd.output_text!r} {bgd.usage}")
    check(tc.responses.cancel(bg.id).status == "completed", "cancel of an ended background response gives it as it is")
    # one that fails in the engine (its forced output leaves its schema) ends as failed, with the error
    bf = poll(tc.responses.create(model=tmodel, input="x", max_output_tokens=30, background=True, text={"format": {
        "type": "json_schema", "name": "a", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}},
        extra_body={"debug_forced_output": "T.</think>nope"}).id)
    check(bf.status == "failed" and "grammar" in bf.error.message, f"a failed background response: {bf.status} {bf.error}")
    chained = tc.responses.create(model=tmodel, previous_response_id=bg.id, input="Thanks.", max_output_tokens=64,
                                  extra_body={"debug_forced_output": say})
    check(chained.status == "completed", "previous_response_id of a background response")
    long_kw = dict(model=tmodel, input="count", max_output_tokens=900, background=True, extra_body={"ignore_eos": True})
    aborted0 = metric("moerun:request_success_total", '{model_name="%s",finished_reason="abort"}' % tmodel)
    lg = tc.responses.create(**long_kw)
    cancelled = tc.responses.cancel(lg.id)
    lgd = poll(lg.id)
    check(cancelled.status == "cancelled" and lgd.status == "cancelled" and lgd.usage.output_tokens < 900,
          f"cancel: {cancelled.status} then {lgd.status} ({lgd.usage})")
    dl = tc.responses.create(**long_kw)
    tc.responses.delete(dl.id)  # a running one: cancelled, and gone when it ends
    for _ in range(600):  # both ended by their cancel in the engine, and nothing holds KV blocks
        if (metric("moerun:request_success_total", '{model_name="%s",finished_reason="abort"}' % tmodel) - aborted0 >= 2 and
                metric("moerun:num_requests_running") == 0 and metric("moerun:kv_cache_used_blocks") == 0):
            break
        _time.sleep(0.05)
    expect_exc(openai.NotFoundError, lambda: tc.responses.retrieve(dl.id), param="response_id")
    check(metric("moerun:num_requests_running") == 0 and metric("moerun:kv_cache_used_blocks") == 0,
          "cancelled background responses still hold sequences")
    expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, input="x", background=True, store=False),
               param="background")
    print("background responses: ok")

    # background and stream: the events stream as the foreground's do (the same text, consecutive sequence
    # numbers from 0), and are kept: GET ?stream=true&starting_after=N gives them again from N + 1, while the
    # response runs (followed to its end) and after; a client that leaves the stream does not end the response
    def seqs(events):
        return [e.sequence_number for e in events]

    bkw = dict(model=tmodel, input="2+2?", max_output_tokens=64, background=True, extra_body={"debug_forced_output": say})
    evs = list(tc.responses.create(stream=True, **bkw))
    fg_evs = list(tc.responses.create(stream=True, **{k: v for k, v in bkw.items() if k != "background"}))
    check(seqs(evs) == list(range(len(evs))) and [e.type for e in evs] == [e.type for e in fg_evs] and
          evs[-1].type == "response.completed" and evs[-1].response.output_text == fg.output_text and
          evs[-1].response.background is True, f"background stream: {[e.type for e in evs]}")
    bid = evs[0].response.id
    check(tc.responses.retrieve(bid).output_text == fg.output_text, "the streamed background response is stored")
    again = list(tc.responses.retrieve(bid, stream=True))
    tail = list(tc.responses.retrieve(bid, stream=True, starting_after=3))
    check([e.model_dump() for e in again] == [e.model_dump() for e in evs] and
          [e.model_dump() for e in tail] == [e.model_dump() for e in evs[4:]], "the events given again after the end")
    # a long one: the client leaves after a few events; another follows from where it left, to the end
    lkw = dict(model=tmodel, input="count", max_output_tokens=300, background=True, stream=True,
               extra_body={"ignore_eos": True})
    st = tc.responses.create(**lkw)
    first = []
    for e in st:
        first.append(e)
        if len(first) == 6:
            break
    st.close()
    lid = first[0].response.id
    rest = list(tc.responses.retrieve(lid, stream=True, starting_after=first[-1].sequence_number))
    done = tc.responses.retrieve(lid)
    deltas = "".join(e.delta for e in first + rest if e.type in ("response.output_text.delta", "response.reasoning_text.delta"))
    check(seqs(first + rest) == list(range(len(first) + len(rest))) and rest[-1].type == "response.incomplete" and
          done.status == "incomplete" and done.usage.output_tokens == 300, f"followed to the end: {done.status} {rest[-1].type}")
    check(deltas == "".join(p.text for o in done.output for p in (o.content or [])), "the deltas add up to the output")
    # several followers at once, one cancelled midway: each sees the same events to the same end
    import threading as _th
    import time as _time
    st = tc.responses.create(**dict(lkw, max_output_tokens=900))
    head = next(iter(st))
    st.close()
    cid = head.response.id
    got = {}

    def follow(k):
        got[k] = list(tc.responses.retrieve(cid, stream=True, starting_after=0))

    ths = [_th.Thread(target=follow, args=(k,)) for k in range(3)]
    for t in ths:
        t.start()
    _time.sleep(0.3)
    tc.responses.cancel(cid)
    for t in ths:
        t.join(120)
    check(all(not t.is_alive() for t in ths) and len(got) == 3 and
          all([e.model_dump() for e in got[k]] == [e.model_dump() for e in got[0]] for k in got) and
          seqs(got[0]) == list(range(1, len(got[0]) + 1)) and poll(cid).status == "cancelled",
          f"followers of a cancelled response: {[len(v) for v in got.values()]}")
    # refusals: a background response not streamed, a foreground one, an unknown id, a bad starting_after
    expect_exc(openai.BadRequestError, lambda: list(tc.responses.retrieve(bg.id, stream=True)), param="stream")
    expect_exc(openai.BadRequestError, lambda: list(tc.responses.retrieve(fg.id, stream=True)), param="stream")
    expect_exc(openai.NotFoundError, lambda: list(tc.responses.retrieve("resp_none", stream=True)), param="response_id")
    expect_exc(openai.BadRequestError, lambda: list(tc.responses.retrieve(bid, stream=True, extra_query={"starting_after": "x"})),
               param="starting_after")
    print("background streams: ok")

    # Anthropic's Messages API (POST /v1/messages) through the official `anthropic` client: create, stream (its
    # accumulator checks the events), tools, tool results, stop sequences, count_tokens; chat completions of
    # the same conversation are the reference for what the model was given
    import anthropic
    ac = anthropic.Anthropic(base_url=text_url, api_key="none", max_retries=0, timeout=120)

    def chat_usage(msgs, **kw):
        return tc.chat.completions.create(model=tmodel, max_tokens=64, messages=msgs, **kw).usage

    m = ac.messages.create(model=tmodel, max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": "2+2?"}],
                           extra_body={"debug_forced_output": say})
    cu = chat_usage([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
                    extra_body={"debug_forced_output": say})
    check([b.type for b in m.content] == ["thinking", "text"] and m.content[0].thinking == "Two plus two." and
          m.content[1].text == "The answer is 4." and m.stop_reason == "end_turn" and m.role == "assistant",
          f"messages: {m.content} {m.stop_reason}")
    check(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == cu.prompt_tokens and
          m.usage.output_tokens == cu.completion_tokens, f"messages usage {m.usage} vs chat {cu}")
    with ac.messages.stream(model=tmodel, max_tokens=64, system=[{"type": "text", "text": "Be brief.",
                            "cache_control": {"type": "ephemeral"}}], messages=[{"role": "user", "content": "2+2?"}],
                            extra_body={"debug_forced_output": say}) as st:
        streamed = "".join(st.text_stream)
        fm = st.get_final_message()
    check(streamed == "The answer is 4." and [b.type for b in fm.content] == ["thinking", "text"] and
          fm.content[0].thinking == "Two plus two." and fm.stop_reason == "end_turn" and
          fm.usage.output_tokens == m.usage.output_tokens, f"messages stream: {streamed!r} {fm.content} {fm.stop_reason}")
    atools = [{"name": "get_weather", "description": "Weather of a city", "input_schema": tools[0]["function"]["parameters"],
               "cache_control": {"type": "ephemeral"}}]
    for stream, m in created_and_streamed(ac.messages.create, ac.messages.stream, "get_final_message", dict(
            model=tmodel, max_tokens=200, tools=atools, messages=[{"role": "user", "content": "Weather?"}],
            extra_body={"debug_forced_output": call})):
        tu = [b for b in m.content if b.type == "tool_use"]
        check(m.stop_reason == "tool_use" and len(tu) == 1 and tu[0].name == "get_weather" and
              tu[0].input == {"city": "Paris", "days": 3} and tu[0].id, f"messages tool_use (stream={stream}): {m.content}")
    for stream, m in created_and_streamed(ac.messages.create, ac.messages.stream, "get_final_message", dict(
            model=tmodel, max_tokens=100, tools=atools, tool_choice={"type": "tool", "name": "get_weather"},
            messages=[{"role": "user", "content": "Weather?"}],
            extra_body={"debug_forced_output": named})):
        tu2 = [b for b in m.content if b.type == "tool_use"]
        check(m.stop_reason == "tool_use" and len(tu2) == 1 and tu2[0].input == {"city": "Rome", "days": 2},
              f"messages tool_choice tool (stream={stream}): {m.content} {m.stop_reason}")
    turn = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": tu[0].id, "name": "get_weather", "input": tu[0].input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu[0].id, "content": "Sunny",
                                          "cache_control": {"type": "ephemeral"}}]}]
    m = ac.messages.create(model=tmodel, max_tokens=64, tools=atools, messages=turn, extra_body={"debug_forced_output": say})
    cu = chat_usage([{"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": "", "tool_calls": [{"id": tu[0].id, "type": "function", "function": {
                         "name": "get_weather", "arguments": _json.dumps(tu[0].input, separators=(",", ":"))}}]},
                     {"role": "tool", "tool_call_id": tu[0].id, "content": "Sunny"}],
                    tools=tools, extra_body={"debug_forced_output": say})
    check(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == cu.prompt_tokens and
          m.content[-1].text == "The answer is 4.", f"messages tool_result turn: {m.usage} vs {cu}")
    ct = ac.messages.count_tokens(model=tmodel, tools=atools, messages=turn)
    check(ct.input_tokens == cu.prompt_tokens, f"count_tokens {ct.input_tokens} vs chat {cu.prompt_tokens}")
    m = ac.messages.create(model=tmodel, max_tokens=64, messages=[{"role": "user", "content": "2+2?"}],
                           stop_sequences=["answer"], extra_body={"debug_forced_output": say})
    check(m.stop_reason == "stop_sequence" and m.stop_sequence == "answer" and m.content[-1].text == "The ",
          f"messages stop_sequences: {m.stop_reason} {m.stop_sequence!r} {m.content}")
    m = ac.messages.create(model=tmodel, max_tokens=3, messages=[{"role": "user", "content": "2+2?"}],
                           extra_body={"debug_forced_output": say})
    check(m.stop_reason == "max_tokens" and m.usage.output_tokens == 3, f"messages max_tokens: {m.stop_reason}")

    def anth_exc(cls, fn, text):
        try:
            fn()
        except cls as e:
            check(isinstance(e.body, dict) and e.body.get("type") == "error" and text in str(e), f"{cls.__name__}: {e}")
            return
        except Exception as e:  # noqa: BLE001
            check(False, f"expected {cls.__name__}, got {type(e).__name__}: {e}")
        check(False, f"expected {cls.__name__}, got no error")

    anth_exc(anthropic.BadRequestError, lambda: ac.messages.create(model=tmodel, max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]),
        "images")
    anth_exc(anthropic.BadRequestError, lambda: ac.messages.create(model=tmodel, max_tokens=8, messages=[
        {"role": "user", "content": "x"}], tools=[{"type": "web_search_20250305", "name": "web_search"}]), "client tools")
    anth_exc(anthropic.BadRequestError, lambda: ac.messages.create(model=tmodel, max_tokens=10 ** 6, messages=[
        {"role": "user", "content": "x"}]), "max_tokens")
    anth_exc(anthropic.NotFoundError, lambda: ac.messages.create(model="no-such-model", max_tokens=8, messages=[
        {"role": "user", "content": "x"}]), "does not exist")
    print("anthropic messages: ok")

    r = tc.completions.create(model=tmodel, prompt="Go:", max_tokens=40, stop=["STOP"],
                              extra_body={"debug_forced_output": "alpha beta STOP gamma" + EOS})
    check(r.choices[0].text == "alpha beta " and r.choices[0].finish_reason == "stop", f"stop string {r.choices[0].text!r}")
    # streamed: a stop string split over tokens is held back, the one that completes first wins, neither is sent
    s = "".join(c.choices[0].text for c in tc.completions.create(
        model=tmodel, prompt="Go:", max_tokens=40, stop=["STOP", "pha b"], stream=True,
        extra_body={"debug_forced_output": "alpha beta STOP gamma" + EOS}) if c.choices)
    check(s == "al", f"streamed stop strings {s!r}")
    # min_tokens with stop strings (vLLM's rule): no stop string ends the output before the min_tokens-th
    # token; the one completed by that token does. k: the token that completes the first STOP.
    say = "alpha beta STOP gamma STOP delta"
    r = tc.completions.create(model=tmodel, prompt="Go:", max_tokens=40, logprobs=0,
                              extra_body={"debug_forced_output": say + EOS})
    pieces = r.choices[0].logprobs.tokens
    check("".join(pieces).startswith(say), f"token texts {pieces}")
    k = next(i + 1 for i in range(len(pieces)) if "STOP" in "".join(pieces[:i + 1]))
    for mt, want in ((k, "alpha beta "), (k + 1, "alpha beta STOP gamma ")):
        r = tc.completions.create(model=tmodel, prompt="Go:", max_tokens=40, stop=["STOP"],
                                  extra_body={"debug_forced_output": say + EOS, "min_tokens": mt})
        check(r.choices[0].text == want and r.choices[0].finish_reason == "stop", f"min_tokens {mt}: {r.choices[0].text!r}")
        s = "".join(c.choices[0].text for c in tc.completions.create(
            model=tmodel, prompt="Go:", max_tokens=40, stop=["STOP"], stream=True,
            extra_body={"debug_forced_output": say + EOS, "min_tokens": mt}) if c.choices)
        check(s == want, f"streamed min_tokens {mt}: {s!r}")
    # an EOS (forced here) before min_tokens is an ordinary token, its text kept; the one after stops
    r = tc.completions.create(model=tmodel, prompt="Go:", max_tokens=40, logprobs=0,
                              extra_body={"debug_forced_output": "alpha" + EOS + " beta" + EOS, "ignore_eos": True,
                                          "skip_special_tokens": False})
    pieces = r.choices[0].logprobs.tokens
    i = pieces.index(EOS)
    r = tc.completions.create(model=tmodel, prompt="Go:", max_tokens=40,
                              extra_body={"debug_forced_output": "alpha" + EOS + " beta" + EOS, "min_tokens": i + 2,
                                          "skip_special_tokens": False})
    check(r.choices[0].text == "alpha" + EOS + " beta" and r.choices[0].finish_reason == "stop",
          f"an EOS before min_tokens: {r.choices[0].text!r}")
    # bad_words (vLLM's): A (+60) and B (+50), two one-token words, outrank the rest; "A A" bans A right after
    # A (the word as is and with a leading space), so greedy alternates where it would repeat A
    import json as _json
    import urllib.request

    def tokenize(text):
        q = urllib.request.Request(text_url + "/tokenize", data=_json.dumps(
            {"prompt": text, "add_special_tokens": False}).encode(), headers={"Content-Type": "application/json"})
        return _json.loads(urllib.request.urlopen(q, timeout=60).read())["tokens"]
    single = [w for w in (" the", " and", " world", " of", " to", " in", " is") if len(tokenize(w)) == 1]
    check(len(single) >= 2, f"two one-token words: {single}")
    A, B = single[0], single[1]
    bias = {str(tokenize(A)[0]): 60, str(tokenize(B)[0]): 50}
    r = tc.completions.create(model=tmodel, prompt="Go:", max_tokens=6, temperature=0, logit_bias=bias,
                              extra_body={"ignore_eos": True})
    check(r.choices[0].text == A * 6, f"biased: {r.choices[0].text!r}")
    for stream in (False, True):
        kw = dict(model=tmodel, prompt="Go:", max_tokens=6, temperature=0, logit_bias=bias,
                  extra_body={"ignore_eos": True, "bad_words": [A.strip() + A]})
        text = ("".join(c.choices[0].text for c in tc.completions.create(stream=True, **kw) if c.choices) if stream
                else tc.completions.create(**kw).choices[0].text)
        check(text == (A + B) * 3, f"bad_words (stream {stream}): {text!r}")
    r = tc.completions.create(model=tmodel, prompt="Go:", max_tokens=3, temperature=0, logit_bias=bias,
                              extra_body={"ignore_eos": True, "bad_words": ["  " + A.strip()]})
    check(r.choices[0].text == B * 3, f"a one-token bad word: {r.choices[0].text!r}")
    print("stop strings: ok")

    # chat logprobs: one item per generated token (the tags and the EOS included), the alternatives asked for
    forced = "why</think>\n\nOK" + EOS
    r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "hi"}], max_tokens=20,
                                   logprobs=True, top_logprobs=2, extra_body={"debug_forced_output": forced})
    lc = r.choices[0].logprobs.content
    check(len(lc) == r.usage.completion_tokens, f"chat logprobs: {len(lc)} items, {r.usage.completion_tokens} tokens")
    check("".join(t.token for t in lc) == forced, f"chat logprobs tokens {[t.token for t in lc]}")
    check(all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in lc), "chat logprob values")
    check(lc[0].bytes == list(lc[0].token.encode()), "chat logprobs bytes")
    st = [c for c in tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=20, logprobs=True, top_logprobs=2, stream=True,
                                                extra_body={"debug_forced_output": forced}) if c.choices]
    sl = [t for c in st if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    check([(t.token, t.logprob) for t in sl] == [(t.token, t.logprob) for t in lc], "streamed chat logprobs differ")
    check(all(len(c.choices[0].logprobs.content) == 1 for c in st if c.choices[0].logprobs), "one logprob per chunk")
    print("chat logprobs: ok")
    expect_exc(openai.BadRequestError, lambda: tc.chat.completions.create(
        model=tmodel, messages=[{"role": "robot", "content": "x"}], max_tokens=4), param="messages[0].role")
    print("chat errors: ok")

    # echo with logprobs (lm-evaluation-harness's loglikelihood request): the prompt tokens' log-probabilities
    # must be those the same tokens get when generated after the same prefix (decode path against prefill rows)
    import urllib.request

    def tokenize(text):
        rq = urllib.request.Request(text_url + "/tokenize", data=_json.dumps({"prompt": text}).encode(),
                                    headers={"Content-Type": "application/json"})
        return _json.loads(urllib.request.urlopen(rq, timeout=60).read())["tokens"]

    P, F = tokenize("Go: count"), tokenize(" one two three four")
    g = tc.completions.create(model=tmodel, prompt=P, max_tokens=len(F), logprobs=2, temperature=0,
                              extra_body={"ignore_eos": True, "debug_forced_output": F})
    glp = g.choices[0].logprobs.token_logprobs
    check(len(glp) == len(F), f"forced generation: {len(glp)} logprobs for {len(F)} tokens")
    e = tc.completions.create(model=tmodel, prompt=P + F, max_tokens=0, echo=True, logprobs=2)
    el = e.choices[0].logprobs
    check(e.usage.completion_tokens == 0 and e.usage.prompt_tokens == len(P) + len(F), f"echo-only usage {e.usage}")
    check(e.choices[0].finish_reason == "length", f"echo-only finish {e.choices[0].finish_reason}")
    e0 = tc.completions.create(model=tmodel, prompt=P, max_tokens=0, echo=True, extra_body={"debug_forced_output": EOS})
    check(e0.choices[0].finish_reason == "length", f"echo-only finish with an EOS unsent: {e0.choices[0].finish_reason}")
    check(len(el.tokens) == len(P) + len(F) and el.token_logprobs[0] is None and el.top_logprobs[0] is None,
          f"echo logprobs shape: {len(el.tokens)} tokens, first {el.token_logprobs[0]}")
    check("".join(el.tokens) == e.choices[0].text, f"echo tokens {el.tokens} do not spell {e.choices[0].text!r}")
    diff = max(abs(a - b) for a, b in zip(el.token_logprobs[len(P):], glp))
    check(diff < 2e-3, f"prompt logprobs differ from the generated tokens' by {diff}: {el.token_logprobs} / {glp}")
    check(all(el.tokens[i] in el.top_logprobs[i] and len(el.top_logprobs[i]) in (2, 3) for i in range(1, len(P) + len(F))),
          "echo top_logprobs: the prompt token and the 2 most likely")
    check(el.text_offset == sorted(el.text_offset) and el.text_offset[0] == 0, f"text_offset {el.text_offset}")
    # lm-eval's own request: token-id prompts (a batch), max_tokens 1, echo, logprobs 1, greedy
    lm = tc.completions.create(model=tmodel, prompt=[P + F, P], max_tokens=1, echo=True, logprobs=1, temperature=0,
                               seed=1234)
    check([len(c.logprobs.token_logprobs) for c in sorted(lm.choices, key=lambda c: c.index)] ==
          [len(P) + len(F) + 1, len(P) + 1], "lm-eval batch: prompt + 1 entries per choice")
    c0 = sorted(lm.choices, key=lambda c: c.index)[0]
    ll = sum(c0.logprobs.token_logprobs[len(P):len(P) + len(F)])
    check(abs(ll - sum(glp)) < 5e-3, f"lm-eval loglikelihood {ll} != {sum(glp)}")
    # streamed: the first event is the prompt with its logprobs, then one token per event
    st = [c for c in tc.completions.create(model=tmodel, prompt=P + F, max_tokens=2, echo=True, logprobs=2,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True}) if c.choices]
    check(st[0].choices[0].text == e.choices[0].text and st[0].choices[0].logprobs.token_logprobs ==
          el.token_logprobs, "streamed echo differs from the non-streamed one")
    check(sum(1 for c in st[1:] if c.choices[0].logprobs) == 2, "streamed tokens after the echo")
    expect_exc(openai.BadRequestError, lambda: tc.completions.create(model=tmodel, prompt=P, max_tokens=0),
               param="max_tokens")
    # vLLM's prompt_logprobs: the prompt token first, with its rank, then the k most likely other than it
    # (ranks 1..k); the values are the decode path's, and so are the small ranks (the forced generation's
    # top 2 above); chat's sit at the response's top
    v = tc.completions.create(model=tmodel, prompt=P + F, max_tokens=1, temperature=0,
                              extra_body={"prompt_logprobs": 2})
    pl, PF = extra(v.choices[0], "prompt_logprobs"), P + F
    check(len(pl) == len(PF) and pl[0] is None, f"prompt_logprobs shape: {len(pl)} for {len(PF)}")
    for i in range(1, len(PF)):
        ent = pl[i][str(PF[i])]
        check(abs(ent["logprob"] - el.token_logprobs[i]) < 1e-6 and ent["decoded_token"] == el.tokens[i],
              f"prompt_logprobs[{i}] {ent} against echo's {el.token_logprobs[i]} {el.tokens[i]!r}")
        others = sorted(x["rank"] for k, x in pl[i].items() if k != str(PF[i]))
        check(others == ([1, 2] if ent["rank"] > 2 else [r for r in (1, 2) if r != ent["rank"]]),
              f"prompt_logprobs[{i}] ranks {ent['rank']} / {others}")
    gtop = g.choices[0].logprobs.top_logprobs
    for j in range(len(F)):
        ent = pl[len(P) + j][str(F[j])]
        check(abs(ent["logprob"] - glp[j]) < 2e-3, f"prompt_logprobs against the decode path at {j}")
        order = sorted(gtop[j].items(), key=lambda kv: -kv[1])
        want = 1 if order[0][1] - glp[j] < 1e-3 else 2 if len(order) > 1 and order[1][1] - glp[j] < 1e-3 else None
        check(want is None and ent["rank"] > 2 or ent["rank"] == want or abs(order[0][1] - order[-1][1]) < 1e-3,
              f"rank {ent['rank']} at {j}: the decode path's top {order}, the token's {glp[j]}")
    cr = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                    extra_body={"prompt_logprobs": 0, "debug_forced_output": "ok"})
    cpl = extra(cr, "prompt_logprobs")
    check(cpl is not None and len(cpl) == cr.usage.prompt_tokens and cpl[0] is None and
          all(len(d) == 1 and list(d.values())[0]["rank"] >= 1 for d in cpl[1:]), "chat prompt_logprobs")
    expect_exc(openai.BadRequestError, lambda: list(tc.completions.create(
        model=tmodel, prompt=P, max_tokens=2, stream=True, extra_body={"prompt_logprobs": 1})), param="prompt_logprobs")
    print("echo + logprobs (prompt log-probabilities): ok")
    # structured outputs (response_format json_schema / json_object, guided_choice, tool_choice required and
    # named): random weights sample from the mask; every answer that ends is checked by jsonschema (PyPI), an
    # independent validator; the reasoning before </think> is free
    import json as _json2
    import jsonschema
    pet = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["cat", "dog", 3, None]},
                                            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                                            "id": {"type": "string", "format": "uuid"},
                                            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2,3}$"},
                                            "age": {"type": "integer", "minimum": 1, "maximum": 30}},
           "required": ["ok", "kind", "tags", "id", "code", "age"], "additionalProperties": False}
    fmt = jsonschema.FormatChecker()
    think = "Thinking.</think>\n"
    def pet_answer(seed):  # 1 when the answer ended (and then validates)
        stream = seed % 2 == 1
        kw = dict(model=tmodel, messages=[{"role": "user", "content": "a pet?"}], max_tokens=300, temperature=1.0,
                  seed=seed, response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": pet}},
                  extra_body={"debug_forced_output": think})
        if stream:
            chunks = list(tc.chat.completions.create(stream=True, **kw))
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            fin = fin[0] if fin else None
        else:
            r = tc.chat.completions.create(**kw)
            content, fin = r.choices[0].message.content, r.choices[0].finish_reason
            check(extra(r.choices[0].message, "reasoning_content") == "Thinking.", "structured: the reasoning is free")
        if fin != "stop":
            return 0
        jsonschema.validate(_json2.loads(content), pet, format_checker=fmt)
        return 1
    n_ended = sum(each(pet_answer, range(6)))
    print(f"structured outputs: {n_ended} of 6 json_schema answers ended")
    check(n_ended >= 4, f"structured outputs: only {n_ended} of 6 answers ended")
    # the client's own structured outputs: a pydantic model (bounded floats and ints, as Field(ge=..., lt=...)
    # writes them; a tuple; distinct enum items; a discriminated union, oneOf) through chat.completions.parse, which sends openai's strict schema and parses the answer
    # with pydantic (its validation the oracle: a number out of range raises)
    import pydantic
    from decimal import Decimal
    from ipaddress import IPv6Address
    from typing import Literal, Optional, Union

    class Cat(pydantic.BaseModel):
        kind: Literal["cat"]
        lives: int = pydantic.Field(ge=1, le=9)

    class Dog(pydantic.BaseModel):
        kind: Literal["dog"]
        good: bool

    class Reading(pydantic.BaseModel):
        sensor: Literal["a", "b"]
        celsius: float = pydantic.Field(ge=-273.15, le=1000)
        share: float = pydantic.Field(gt=0, lt=1)
        count: int = pydantic.Field(ge=0, le=500)
        note: Optional[str] = pydantic.Field(max_length=8)
        corner: tuple[int, Literal["n", "s"]]  # a tuple: prefixItems
        colors: list[Literal["r", "g", "b"]] = pydantic.Field(json_schema_extra={"uniqueItems": True})
        pet: Union[Cat, Dog] = pydantic.Field(discriminator="kind")  # oneOf told apart by a constant
        code: str = pydantic.Field(pattern=r"^[A-Z]{2}[0-9]+$", max_length=5)  # a pattern beside maxLength
        addr: IPv6Address  # format ipv6
    def reading(seed):
        try:
            r = tc.chat.completions.parse(model=tmodel, messages=[{"role": "user", "content": "a reading?"}],
                                          max_tokens=600, temperature=1.0, seed=100 + seed, response_format=Reading,
                                          extra_body={"debug_forced_output": think})
        except openai.LengthFinishReasonError:
            return 0
        m = r.choices[0].message.parsed
        check(isinstance(m, Reading) and 0 < m.share < 1 and -273.15 <= m.celsius <= 1000 and
              len(set(m.colors)) == len(m.colors) and len(m.code) <= 5, f"parse: {r.choices[0].message.content!r}")
        return 1
    parsed = sum(each(reading, range(6)))
    print(f"structured outputs: {parsed} of 6 pydantic answers parsed")
    check(parsed >= 3, f"parse: only {parsed} of 6 answers ended")

    # Decimal as pydantic 2.13's model_json_schema() writes it (2.14 leaves the string unconstrained): a number,
    # or a string whose pattern opens with a negative lookahead; pydantic's validation the oracle (a string
    # that is no decimal, or a number that reads as infinity, raises)
    class Priced(pydantic.BaseModel):
        price: Decimal
        prices: list[Decimal]
        code: str = pydantic.Field(pattern=r"^[A-Z]{2}[0-9]+$", max_length=5)
    dec = {"anyOf": [{"type": "number"}, {"type": "string", "pattern": r"^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$"}]}
    priced_schema = {"type": "object", "required": ["price", "prices", "code"],
                     "properties": {"price": dec, "prices": {"type": "array", "items": dec, "minItems": 1, "maxItems": 3},
                                    "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$", "maxLength": 5}}}
    def price(seed):
        r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "a price?"}], max_tokens=400,
                                       temperature=1.0, seed=200 + seed, extra_body={"debug_forced_output": think},
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "priced", "schema": priced_schema}})
        if r.choices[0].finish_reason != "stop":
            return 0
        m = Priced.model_validate_json(r.choices[0].message.content)
        check(m.price.is_finite() and len(m.code) <= 5, f"priced: {r.choices[0].message.content!r}")
        return 1
    priced = sum(each(price, range(6)))
    print(f"structured outputs: {priced} of 6 pydantic Decimal answers validated")
    check(priced >= 3, f"priced: only {priced} of 6 answers ended")
    r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "json"}], max_tokens=300,
                                    temperature=1.0, seed=9, response_format={"type": "json_object"},
                                    extra_body={"debug_forced_output": think + "{\"a\": [1, {\"b\": null}]"})
    if r.choices[0].finish_reason == "stop":
        check(isinstance(_json2.loads(r.choices[0].message.content), dict), "json_object: not an object")
    r = tc.completions.create(model=tmodel, prompt="pet", max_tokens=300, temperature=1.0, seed=4,
                              extra_body={"structured_outputs": {"json": pet, "disable_any_whitespace": True}})
    if r.choices[0].finish_reason == "stop":
        x = _json2.loads(r.choices[0].text)
        jsonschema.validate(x, pet, format_checker=fmt)
        in_str, esc, outside = False, False, []
        for ch in r.choices[0].text:  # the characters outside strings
            if in_str:
                in_str, esc = (in_str if esc or ch != '"' else False), (not esc and ch == "\\")
            else:
                in_str = ch == '"'
                outside.append(ch)
        check(not any(ch.isspace() for ch in outside), f"disable_any_whitespace: {r.choices[0].text!r}")
    r = tc.completions.create(model=tmodel, prompt="pick", max_tokens=20, temperature=1.0, seed=1,
                              extra_body={"guided_choice": ["red", "green", "blue sky"]})
    check(r.choices[0].text in ("red", "green", "blue sky") and r.choices[0].finish_reason == "stop",
          f"guided_choice: {r.choices[0].text!r}")
    # regex outputs (vLLM's structured_outputs.regex / guided_regex, sglang's regex): Python's re.fullmatch is
    # the oracle; in chat, after the free reasoning
    import re as _re
    for i, (field, rx) in enumerate((("structured_outputs", r"(yes|no)-[0-9]{3}"),
                                     ("guided_regex", r"^\w{2,5}@[a-z]{1,8}\.(com|org)$"),
                                     ("regex", r"[A-Z][a-z]{0,6} (is|was) (good|bad)\."))):
        body = {"structured_outputs": {"regex": rx}} if field == "structured_outputs" else {field: rx}
        r = tc.completions.create(model=tmodel, prompt="say", max_tokens=60, temperature=1.0, seed=20 + i, extra_body=body)
        txt = r.choices[0].text  # bounded patterns: the answer ends within 60 tokens
        check(r.choices[0].finish_reason == "stop" and _re.fullmatch(rx.strip("^$"), txt) is not None,
              f"{field} {rx!r}: {txt!r} ({r.choices[0].finish_reason})")
    r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "code?"}], max_tokens=40,
                                    temperature=1.0, seed=3, extra_body={"guided_regex": r"[A-F0-9]{4}",
                                                                         "debug_forced_output": think.rstrip()})
    check(r.choices[0].finish_reason == "stop" and _re.fullmatch(r"[A-F0-9]{4}", r.choices[0].message.content),
          f"chat regex: {r.choices[0].message.content!r} ({r.choices[0].finish_reason})")
    check(extra(r.choices[0].message, "reasoning_content") == "Thinking.", "chat regex: the reasoning is free")
    expect_exc(openai.BadRequestError, lambda: tc.completions.create(
        model=tmodel, prompt="x", max_tokens=4, extra_body={"guided_regex": "a(?=b)"}), param="guided_regex")
    print("regex outputs: ok")
    # EBNF grammars (vLLM's structured_outputs.grammar / guided_grammar, sglang's ebnf): arithmetic, whose
    # answers Python's own parser reads (ast: only numbers and + - * between them); bounded, so every answer ends
    import ast
    arith = ("root ::= term ([-+*] term){0,3}\n"
             "term ::= [1-9] | \"(\" [1-9] ([-+*] [1-9]){1,2} \")\"  # one level of parentheses\n")

    def arith_ok(txt):
        try:
            tree = ast.parse(txt, mode="eval")
        except SyntaxError:
            return False
        return all(isinstance(n, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult))
                   for n in ast.walk(tree)) and " " not in txt

    for i, body in enumerate(({"structured_outputs": {"grammar": arith}}, {"guided_grammar": arith}, {"ebnf": arith})):
        for stream in (False, True):
            kw = dict(model=tmodel, prompt="sum", max_tokens=60, temperature=1.0, seed=40 + i, extra_body=body)
            if stream:
                parts = list(tc.completions.create(stream=True, **kw))
                txt = "".join(c.choices[0].text for c in parts if c.choices)
                fin = [c.choices[0].finish_reason for c in parts if c.choices and c.choices[0].finish_reason]
                fin = fin[-1] if fin else None
            else:
                r = tc.completions.create(**kw)
                txt, fin = r.choices[0].text, r.choices[0].finish_reason
            check(fin == "stop" and arith_ok(txt), f"ebnf {list(body)[0]} stream={stream}: {txt!r} ({fin})")
    r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "sum?"}], max_tokens=60,
                                    temperature=1.0, seed=5, extra_body={"guided_grammar": arith,
                                                                         "debug_forced_output": think.rstrip()})
    check(r.choices[0].finish_reason == "stop" and arith_ok(r.choices[0].message.content),
          f"chat ebnf: {r.choices[0].message.content!r} ({r.choices[0].finish_reason})")
    check(extra(r.choices[0].message, "reasoning_content") == "Thinking.", "chat ebnf: the reasoning is free")
    expect_exc(openai.BadRequestError, lambda: tc.completions.create(
        model=tmodel, prompt="x", max_tokens=4, extra_body={"structured_outputs": {"grammar": "root ::= num\n"}}),
        param="structured_outputs.grammar", text="line 1 column 10: rule \"num\" is not defined")
    # a parse whose stacks double with every "a" (each may be closed by "b" or by "c"), with "a" pushed by a
    # logit bias: past the matcher's limits the choice ends with a 500 that says so, and the server goes on
    import urllib.request as _ur
    tq = _ur.Request(text_url + "/tokenize", data=_json2.dumps({"prompt": "a", "add_special_tokens": False}).encode(),
                     headers={"Content-Type": "application/json"})
    a_ids = _json2.loads(_ur.urlopen(tq, timeout=30).read())["tokens"]
    check(len(a_ids) == 1, f"/tokenize of 'a': {a_ids}")
    expect_exc(openai.InternalServerError, lambda: tc.completions.create(
        model=tmodel, prompt="x", max_tokens=40, logit_bias={str(a_ids[0]): 100},
        extra_body={"ebnf": 'root ::= s\ns ::= "a" s "b" | "a" s "c" | ""'}), text="too ambiguous")
    r = tc.completions.create(model=tmodel, prompt="x", max_tokens=40, temperature=1.0, seed=2,
                              extra_body={"ebnf": arith})
    check(r.choices[0].finish_reason == "stop" and arith_ok(r.choices[0].text), f"ebnf after a 500: {r.choices[0].text!r}")
    print("ebnf outputs: ok")
    # structural tags (vLLM's and sglang's response_format {"type": "structural_tag"}): free text until a trigger,
    # then the tag's JSON value and its end. The oracle: str.find for the first trigger, json's raw_decode for
    # the value, jsonschema for its schema
    wsch = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["city", "days"]}

    def tags_ok(txt, begins, end, once):
        """None when txt follows the tags (begins: name -> schema behind the trigger "<fn="), else why not."""
        tags = 0
        while True:
            i = txt.find("<fn=")
            if i < 0:
                return None if tags or not once else "no tag"
            hit = [b for b in begins if txt.startswith(b, i)]
            if not hit:
                return f"no begin at {txt[i:i + 20]!r}"
            j = i + len(hit[0])
            while txt[j:j + 1].isspace():
                j += 1
            try:
                val, k = _json2.JSONDecoder().raw_decode(txt, j)
                jsonschema.validate(val, begins[hit[0]])
            except (ValueError, jsonschema.ValidationError) as ex:
                return f"value at {txt[j:j + 30]!r}: {ex}"
            while txt[k:k + 1].isspace():
                k += 1
            if not txt.startswith(end, k):
                return f"no end at {txt[k:k + 20]!r}"
            txt, tags = txt[k + len(end):], tags + 1
            if once:
                return None if txt == "" else f"text after the first tag: {txt[:20]!r}"

    legacy = {"type": "structural_tag", "triggers": ["<fn="],
              "structures": [{"begin": "<fn=weather>", "schema": wsch, "end": "</fn>"},
                             {"begin": "<fn=now>", "schema": {"type": "object", "properties": {}}, "end": "</fn>"}]}
    begins = {"<fn=weather>": wsch, "<fn=now>": {"type": "object", "properties": {}, "additionalProperties": False}}
    def legacy_tags(seed):
        r = tc.completions.create(model=tmodel, prompt="weather", max_tokens=300, temperature=1.0, seed=60 + seed,
                                  extra_body={"response_format": legacy, "debug_forced_output": "Asking: <fn=weather>"})
        txt = r.choices[0].text
        check(txt.startswith("Asking: <fn=weather>"), f"structural tag: {txt!r}")
        if r.choices[0].finish_reason == "length":  # the value and its end came, then free text ran on
            txt = txt[:txt.rfind("<fn=")] if txt.count("</fn>") < txt.count("<fn=") else txt
        why = tags_ok(txt, begins, "</fn>", False)
        check(why is None and "</fn>" in r.choices[0].text, f"structural tag seed {seed}: {why}: {r.choices[0].text!r}")
    each(legacy_tags, range(3))
    # the format form, at least one tag and nothing after it, in chat after the free reasoning: the answer ends
    # (finish stop) right after the tag's end; the same spec as JSON text in structured_outputs (vLLM)
    fmt = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<fn="], "at_least_one": True, "stop_after_first": True,
        "tags": [{"type": "tag", "begin": "<fn=weather>", "content": {"type": "json_schema", "json_schema": wsch},
                  "end": "</fn>"}]}}
    for i, body in enumerate(({"response_format": fmt}, {"structured_outputs": {"structural_tag": _json2.dumps(fmt)}})):
        kw = dict(model=tmodel, messages=[{"role": "user", "content": "weather?"}], max_tokens=300, temperature=1.0,
                  seed=70 + i)
        rf = body.pop("response_format", None)
        r = tc.chat.completions.create(**kw, **({"response_format": rf} if rf else {}),
                                        extra_body={**body, "debug_forced_output": think + "Let me look: <fn=we"})
        c = r.choices[0]
        why = tags_ok(c.message.content or "", {"<fn=weather>": wsch}, "</fn>", True)
        check(c.finish_reason == "stop" and why is None, f"structural tag (format) {i}: {why}: {c.message.content!r} ({c.finish_reason})")
        check(extra(c.message, "reasoning_content") == "Thinking.", "structural tag: the reasoning is free")
    # sglang's /generate with return_logprob (what RL rollouts read: meta_info.output_token_logprobs): one
    # [logprob, id, text] entry a completion token, its ids output_ids, its texts the text, each position's
    # alternatives sorted with the greedy token first and at most 1 in probability, the values completions'
    # logprobs give for the same greedy request; streamed, every event has the whole lists so far
    import math as _math

    def sgl(body):
        rq = _ur.Request(text_url + "/generate", data=_json2.dumps(body).encode(), headers={"Content-Type": "application/json"})
        return _ur.urlopen(rq, timeout=120).read().decode()

    sb = {"text": "In the beginning", "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
          "return_logprob": True, "top_logprobs_num": 3, "return_text_in_logprobs": True}
    g = _json2.loads(sgl(sb))
    mi = g["meta_info"]
    lps, tops = mi["output_token_logprobs"], mi["output_top_logprobs"]
    check(len(lps) == len(tops) == mi["completion_tokens"] == 6 and [e[1] for e in lps] == g["output_ids"],
          f"/generate logprobs: {len(lps)} entries, {mi['completion_tokens']} tokens, ids {[e[1] for e in lps]} / {g['output_ids']}")
    for e in lps:  # a token's text is its own detokenization, or null where that is not whole UTF-8 alone
        rq = _ur.Request(text_url + "/detokenize", data=_json2.dumps({"tokens": [e[1]]}).encode(),
                         headers={"Content-Type": "application/json"})
        d = _json2.loads(_ur.urlopen(rq, timeout=60).read())["prompt"]
        check(e[2] == d if e[2] is not None else ("\ufffd" in d or d == ""), f"/generate logprob text {e} / {d!r}")
    check(all(len(t) == 3 and t[0][1] == e[1] and abs(t[0][0] - e[0]) < 1e-6 and t[0][0] >= t[1][0] >= t[2][0] and
              sum(_math.exp(x[0]) for x in t) <= 1 + 1e-6 for e, t in zip(lps, tops)), f"/generate top logprobs {tops}")
    cg = tc.completions.create(model=tmodel, prompt="In the beginning", max_tokens=6, temperature=0, logprobs=3,
                               extra_body={"ignore_eos": True}).choices[0].logprobs
    cl = cg.token_logprobs
    check(max(abs(a - e[0]) for a, e in zip(cl, lps)) < 1e-6, f"/generate logprobs {lps} / completions' {cl}")
    check(all(len({x[1] for x in t}) == 3 and max(abs(a - b) for a, b in zip(sorted(x[0] for x in t),
                                                                            sorted(ct.values())[-3:])) < 1e-6
              for t, ct in zip(tops, cg.top_logprobs)), f"/generate top logprobs {tops} / completions' {cg.top_logprobs}")
    sb.update(stream=True, return_text_in_logprobs=False, top_logprobs_num=0)
    evs = [_json2.loads(l[6:]) for l in sgl(sb).split("\n") if l.startswith("data: {")]
    seen = [[e[0:2] for e in ev["meta_info"]["output_token_logprobs"]] for ev in evs]
    check(seen[-1] == [e[0:2] for e in lps] and all(len(x) == ev["meta_info"]["completion_tokens"] for x, ev in zip(seen, evs))
          and all(a == b[:len(a)] for a, b in zip(seen, seen[1:])) and all(e[2] is None for e in evs[-1]["meta_info"]["output_token_logprobs"])
          and "output_top_logprobs" not in evs[-1]["meta_info"], f"streamed /generate logprobs {seen}")
    # the prompt's (logprob_start_len s): prompt tokens s.., [null, id, text] first (as sglang), then each token's
    # log-probability: vLLM's prompt_logprobs for the same prompt (checked against the decode path above, and
    # the engine's against transformers in test_model), the top lists theirs; -1 (the default) the last token
    # alone; streamed in every event; past the prompt's end a 400. With the prompt's first 16-token block in
    # the prefix cache, s 16 takes it (cached_tokens) and s 0 does not, the values the same.
    def tok(text):
        rq = _ur.Request(text_url + "/tokenize", data=_json2.dumps({"prompt": text}).encode(),
                         headers={"Content-Type": "application/json"})
        return _json2.loads(_ur.urlopen(rq, timeout=60).read())["tokens"]

    LP = "In the beginning God created the heaven and the earth. And the earth was without form, and void; and"
    lids = tok(LP)
    n = len(lids)
    check(n > 17, f"the long prompt has {n} tokens")
    vp = extra(tc.completions.create(model=tmodel, prompt=LP, max_tokens=1, temperature=0,
                                     extra_body={"prompt_logprobs": 3}).choices[0], "prompt_logprobs")
    base = {"text": LP, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, "return_logprob": True}
    _json2.loads(sgl(base))  # the plain request: the prompt's blocks in the prefix cache

    def want_input(s, g, top, text):
        il, mi = g["meta_info"]["input_token_logprobs"], g["meta_info"]
        check([e[1] for e in il] == lids[s:] and il[0][0] is None, f"/generate input ids from {s}: {il}")
        for p, e in zip(range(s + 1, n), il[1:]):
            ref = vp[p][str(lids[p])]["logprob"]
            check(abs(e[0] - ref) < 1e-6, f"/generate input logprob {p}: {e} / {ref}")
            check(not text or e[2] == ref_text[lids[p]], f"/generate input text {p}: {e} / {ref_text[lids[p]]!r}")
        if top:
            it = mi["input_top_logprobs"]
            check(len(it) == len(il) and it[0] is None, f"/generate input tops from {s}: {it}")
            for p, t in zip(range(s + 1, n), it[1:]):
                ranked = sorted((x["rank"], x["logprob"], int(k)) for k, x in vp[p].items() if x["rank"] <= top)
                check([x[1] for x in t] == [r[2] for r in ranked] and
                      max(abs(a[0] - b[1]) for a, b in zip(t, ranked)) < 1e-6, f"/generate input tops {p}: {t} / {ranked}")
        else:
            check("input_top_logprobs" not in mi, "/generate input tops without top_logprobs_num")

    ref_text = {}
    for i in set(lids):
        rq = _ur.Request(text_url + "/detokenize", data=_json2.dumps({"tokens": [i]}).encode(),
                         headers={"Content-Type": "application/json"})
        d = _json2.loads(_ur.urlopen(rq, timeout=60).read())["prompt"]
        ref_text[i] = None if "\ufffd" in d or d == "" else d
    for s, top, text in ((0, 3, True), (5, 0, False), (16, 2, False), (n - 1, 1, True), (-1, 0, False)):
        g = _json2.loads(sgl({**base, "logprob_start_len": s, "top_logprobs_num": top, "return_text_in_logprobs": text}))
        want_input(n - 1 if s < 0 else s, g, top, text)
        cached = g["meta_info"]["cached_tokens"]
        check(cached == (0 if 0 <= s < 16 else 16), f"/generate logprob_start_len {s}: {cached} cached tokens")
    g = _json2.loads(sgl({"text": LP, "sampling_params": {"max_new_tokens": 2}, "return_logprob": True}))
    check(len(g["meta_info"]["input_token_logprobs"]) == 1, "/generate default: the last prompt token's entry")
    evs = [_json2.loads(l[6:]) for l in sgl({**base, "stream": True, "logprob_start_len": 3, "top_logprobs_num": 2})
           .split("\n") if l.startswith("data: {")]
    check(len(evs) >= 1, f"streamed /generate: {len(evs)} events")
    for ev in evs:
        want_input(3, ev, 2, False)
    # sglang's frontend select (lang/backend/runtime_endpoint.py): the context alone (max_new_tokens 0) to
    # cache it, then every choice after it, scored from 2 tokens before the context's end: nothing
    # generated, the context's blocks from the cache, each choice's entries vLLM's prompt_logprobs of it
    ctx = LP[:-4]
    c0 = _json2.loads(sgl({"text": ctx, "sampling_params": {"max_new_tokens": 0}}))
    plen = c0["meta_info"]["prompt_tokens"]
    check(c0["text"] == "" and c0["output_ids"] == [] and c0["meta_info"]["completion_tokens"] == 0 and
          c0["meta_info"]["finish_reason"] == {"type": "length", "length": 0} and plen == len(tok(ctx)),
          f"/generate max_new_tokens 0: {c0}")
    choices = [" and", " darkness", " without form"]
    sel = _json2.loads(sgl({"text": [ctx + c for c in choices], "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                            "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": plen - 2}))
    check(isinstance(sel, list) and len(sel) == len(choices), f"select: {sel}")
    for c, r in zip(choices, sel):
        ids, mi = tok(ctx + c), r["meta_info"]
        ref = extra(tc.completions.create(model=tmodel, prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 0})
                    .choices[0], "prompt_logprobs")
        il = mi["input_token_logprobs"]
        check([e[1] for e in il] == ids[plen - 2:] and il[0][0] is None and mi["output_token_logprobs"] == [] and
              r["output_ids"] == [] and mi["cached_tokens"] == 16, f"select {c!r}: {r}")
        check(max(abs(e[0] - ref[p][str(ids[p])]["logprob"]) for p, e in zip(range(plen - 1, len(ids)), il[1:])) < 1e-6,
              f"select {c!r}: {il} / {ref}")
    unc = _json2.loads(sgl({"input_ids": [tok(c) for c in choices], "sampling_params": {"max_new_tokens": 0},
                            "return_logprob": True}))
    check([len(r["meta_info"]["input_token_logprobs"]) for r in unc] == [1, 1, 1], f"unconditional: {unc}")
    # sglang's token_ids_logprob: the ids' [logprob, id, text] at every output token and at every prompt position
    # from logprob_start_len (the first null), in the order asked, repeats too. The same numbers as the other
    # lists where they meet (the prompt token's, the sampled token's, the tops), and over the whole vocabulary
    # (requests of 1024 ids, the most one takes) they sum to 1 at every position. A batch takes a list per
    # prompt (null: none for it); without return_logprob nothing is sent; bad lists are 400s naming the field.
    rq = _ur.Request(text_url + "/get_model_info")
    with open(os.path.join(_json2.loads(_ur.urlopen(rq, timeout=60).read())["model_path"], "config.json")) as f:
        vocab = _json2.load(f)["vocab_size"]
    tb = {"text": LP, "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True},
          "return_logprob": True, "logprob_start_len": 0}
    mass_out, mass_in, outs = [0.0] * 3, [0.0] * n, set()
    for lo in range(0, vocab, 1024):
        ids = list(range(lo, min(lo + 1024, vocab)))
        mi = _json2.loads(sgl({**tb, "token_ids_logprob": ids}))["meta_info"]
        ot, it = mi["output_token_ids_logprobs"], mi["input_token_ids_logprobs"]
        outs.add(tuple(e[1] for e in mi["output_token_logprobs"]))
        check(len(ot) == 3 and all([e[1] for e in row] == ids for row in ot) and len(it) == n and it[0] is None and
              all([e[1] for e in row] == ids for row in it[1:]), f"token_ids_logprob {lo}..: the lists' ids")
        for k, row in enumerate(ot):
            mass_out[k] += sum(_math.exp(e[0]) for e in row)
        for p, row in zip(range(1, n), it[1:]):
            mass_in[p] += sum(_math.exp(e[0]) for e in row)
    check(len(outs) == 1 and max(abs(x - 1) for x in mass_out + mass_in[1:]) < 1e-4,
          f"token_ids_logprob over the vocabulary: masses {mass_out} {mass_in[1:]}, outputs {outs}")
    out_ids = list(next(iter(outs)))
    ask = [out_ids[0], lids[1], lids[2], out_ids[0], 7]
    g = _json2.loads(sgl({**tb, "token_ids_logprob": ask, "top_logprobs_num": 2, "return_text_in_logprobs": True}))
    mi = g["meta_info"]
    for k, (row, lp, tops) in enumerate(zip(mi["output_token_ids_logprobs"], mi["output_token_logprobs"], mi["output_top_logprobs"])):
        have = {e[1]: e[0] for e in row}
        check([e[1] for e in row] == ask and abs(have[lp[1]] - lp[0]) < 1e-6 if lp[1] in have else True,
              f"token_ids_logprob output {k}: {row} / {lp}")
        check(all(abs(have[t[1]] - t[0]) < 1e-6 for t in tops if t[1] in have), f"token_ids_logprob output {k}: {row} / tops {tops}")
        check(row[0] == row[3], f"token_ids_logprob: a repeated id {row}")
    check(abs(mi["output_token_ids_logprobs"][0][0][0] - mi["output_token_logprobs"][0][0]) < 1e-6,
          "token_ids_logprob: the first output token's own")
    for p, (row, il) in enumerate(zip(mi["input_token_ids_logprobs"][1:], mi["input_token_logprobs"][1:]), 1):
        have = {e[1]: e[0] for e in row}
        check(il[1] not in have or abs(have[il[1]] - il[0]) < 1e-6, f"token_ids_logprob input {p}: {row} / {il}")
        check(all(e[2] == ref_text.get(e[1], e[2]) for e in row), f"token_ids_logprob input text {p}: {row}")
    check(abs(mi["input_token_ids_logprobs"][1][1][0] - mi["input_token_logprobs"][1][0]) < 1e-6,
          "token_ids_logprob: the prompt token's own")
    evs = [_json2.loads(l[6:]) for l in sgl({**tb, "stream": True, "token_ids_logprob": ask}).split("\n") if l.startswith("data: {")]
    check([ev["meta_info"]["output_token_ids_logprobs"] for ev in evs][-1] == [[e[:2] + [None] for e in row] for row in mi["output_token_ids_logprobs"]]
          and all(len(ev["meta_info"]["output_token_ids_logprobs"]) == ev["meta_info"]["completion_tokens"] for ev in evs),
          "streamed token_ids_logprob")
    bt = _json2.loads(sgl({"text": [LP, "In the", LP], "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                           "return_logprob": True, "token_ids_logprob": [[5, 6], None, [out_ids[0]]]}))
    check([e[1] for e in bt[0]["meta_info"]["output_token_ids_logprobs"][0]] == [5, 6] and
          bt[0]["meta_info"]["input_token_ids_logprobs"] == [None] and "output_token_ids_logprobs" not in bt[1]["meta_info"]
          and [e[:2] for e in bt[2]["meta_info"]["output_token_ids_logprobs"][0]] == [bt[2]["meta_info"]["output_token_logprobs"][0][:2]],
          f"token_ids_logprob per prompt of a batch: {bt}")
    # vLLM's return_token_ids: the prompt's ids (the server's /tokenize of it; chat: of the rendered messages) and
    # each choice's completion ids (usage's count of them; their text the answer's); streamed: the prompt's in
    # the first chunk only, each chunk's new ids, together the whole answer's. return_tokens_as_token_ids:
    # the logprobs' tokens "token_id:N" of those same ids
    def detok(ids):
        rq = _ur.Request(text_url + "/detokenize", data=_json2.dumps({"tokens": ids}).encode(),
                         headers={"Content-Type": "application/json"})
        return _json2.loads(_ur.urlopen(rq, timeout=60).read())["prompt"]

    def tok_chat(msgs):
        rq = _ur.Request(text_url + "/tokenize", data=_json2.dumps({"messages": msgs}).encode(),
                         headers={"Content-Type": "application/json"})
        return _json2.loads(_ur.urlopen(rq, timeout=60).read())["tokens"]

    rt = tc.completions.create(model=tmodel, prompt=[LP, "And God said"], max_tokens=5, temperature=0, n=2, logprobs=2,
                               extra_body={"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True})
    for k, ch in enumerate(rt.choices):
        d = ch.model_dump()
        check(d["prompt_token_ids"] == tok([LP, "And God said"][k // 2]) and len(d["token_ids"]) == 5 and
              detok(d["token_ids"]) == ch.text and ch.logprobs.tokens == [f"token_id:{t}" for t in d["token_ids"]] and
              all(all(key.startswith("token_id:") for key in tp) for tp in ch.logprobs.top_logprobs),
              f"return_token_ids, choice {k}: {d}")
    check(rt.usage.completion_tokens == sum(len(ch.model_dump()["token_ids"]) for ch in rt.choices), "return_token_ids: usage")
    whole = rt.choices[0].model_dump()["token_ids"]
    chunks = list(tc.completions.create(model=tmodel, prompt=LP, max_tokens=5, temperature=0, stream=True,
                                        extra_body={"ignore_eos": True, "return_token_ids": True}))
    cd = [c.choices[0].model_dump() for c in chunks if c.choices]
    check(cd[0].get("prompt_token_ids") == lids and all(x.get("prompt_token_ids") is None for x in cd[1:]) and
          sum((x["token_ids"] for x in cd), []) == whole, f"streamed return_token_ids: {cd}")
    msgs = [{"role": "user", "content": "Genesis 1:3"}]
    rc = tc.chat.completions.create(model=tmodel, messages=msgs, max_tokens=6, temperature=0,
                                    extra_body={"return_token_ids": True})
    dc = rc.model_dump()
    check(dc["prompt_token_ids"] == tok_chat(msgs) and len(dc["choices"][0]["token_ids"]) == rc.usage.completion_tokens,
          f"chat return_token_ids: {dc}")
    sc = [c.model_dump() for c in tc.chat.completions.create(model=tmodel, messages=msgs, max_tokens=6, temperature=0,
                                                             stream=True, extra_body={"return_token_ids": True})]
    check(sc[0].get("prompt_token_ids") == dc["prompt_token_ids"] and all(x.get("prompt_token_ids") is None for x in sc[1:]) and
          sum((x["choices"][0]["token_ids"] for x in sc if x["choices"]), []) == dc["choices"][0]["token_ids"],
          f"streamed chat return_token_ids: {sc}")
    rl = tc.chat.completions.create(model=tmodel, messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                    extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True}).model_dump()
    check([x["token"] for x in rl["choices"][0]["logprobs"]["content"]] == [f"token_id:{t}" for t in rl["choices"][0]["token_ids"]],
          f"chat return_tokens_as_token_ids: {rl['choices'][0]}")
    plain = tc.completions.create(model=tmodel, prompt="x", max_tokens=1).choices[0].model_dump()
    check("token_ids" not in plain and "prompt_token_ids" not in plain, f"no return_token_ids: {plain}")
    for f in ("return_token_ids", "return_tokens_as_token_ids"):
        expect_exc(openai.BadRequestError, lambda: tc.completions.create(model=tmodel, prompt="x", max_tokens=1,
                                                                         extra_body={f: "yes"}), param=f)
    # vLLM's cache_salt: a prompt's cached blocks serve only requests of the same salt (an unsalted request, or
    # another salt, finds none of them), completions and chat alike; the text is the same; bad salts are 400s
    salty = "Salted prompts are new here: " + LP  # no earlier request began so
    def cached_of(salt, chat=False):
        eb = {"cache_salt": salt} if salt is not None else {}
        if chat:
            rc = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": salty}], max_tokens=2,
                                            temperature=0, extra_body=eb)
            return (rc.usage.prompt_tokens_details.cached_tokens or 0), rc.choices[0].message.content
        rc = tc.completions.create(model=tmodel, prompt=salty, max_tokens=2, temperature=0, extra_body=eb)
        return (rc.usage.prompt_tokens_details.cached_tokens or 0), rc.choices[0].text
    got = [cached_of(x) for x in ("s1", "s1", "s2", None, None, "s1")] + [cached_of(x, True) for x in ("s1", "s1", "s3")]
    hits = [h for h, _ in got]
    check(hits[0] == 0 and hits[1] >= 16 and hits[2] == 0 and hits[3] == 0 and hits[4] >= 16 and hits[5] >= 16 and
          hits[6] == 0 and hits[7] >= 16 and hits[8] == 0 and len({t for t, _ in [(t, 0) for _, t in got[:6]]}) == 1,
          f"cache_salt: cached tokens {hits}, texts {[t for _, t in got]}")
    for bad in ("", 5, "x" * 1025):
        expect_exc(openai.BadRequestError, lambda: tc.completions.create(model=tmodel, prompt="x", max_tokens=1,
                                                                         extra_body={"cache_salt": bad}), param="cache_salt")
    # sglang's /v1/score: each item after the query (before it with item_first), the labels' probabilities at the
    # next position, as vLLM's prompt_logprobs gives them for the prompt with the label appended (that path is
    # checked against transformers in test_model); with apply_softmax normalized over the labels; the prompt
    # alone on /generate gives the same numbers as its one output_token_ids_logprobs entry
    def score(body):
        rq = _ur.Request(text_url + "/v1/score", data=_json2.dumps(body).encode(), headers={"Content-Type": "application/json"})
        return _json2.loads(_ur.urlopen(rq, timeout=120).read())

    def label_lp(ids, label):
        vpl = extra(tc.completions.create(model=tmodel, prompt=ids + [label], max_tokens=1,
                                          extra_body={"prompt_logprobs": 0}).choices[0], "prompt_logprobs")
        return vpl[-1][str(label)]["logprob"]

    q, items, labels = "In the beginning God", [" created", " said unto", " the"], [out_ids[0], 259, 7, 259]
    for first in (False, True):
        sc = score({"query": q, "items": items, "label_token_ids": labels, "item_first": first, "model": tmodel})
        texts = [(it + q) if first else (q + it) for it in items]
        check(sc["object"] == "scoring" and sc["model"] == tmodel and len(sc["scores"]) == 3 and
              sc["usage"]["prompt_tokens"] == sum(len(tok(t)) for t in texts) and sc["usage"]["completion_tokens"] == 0,
              f"/v1/score: {sc}")
        for t, row in zip(texts, sc["scores"]):
            want = [_math.exp(label_lp(tok(t), lb)) for lb in labels]
            check(len(row) == 4 and max(abs(a - b) / b for a, b in zip(row, want)) < 1e-5, f"/v1/score {t!r}: {row} / {want}")
        sm = score({"query": q, "items": items, "label_token_ids": labels, "item_first": first, "apply_softmax": True})
        check(all(abs(sum(r) - 1) < 1e-9 and max(abs(a / sum(p) - b) for a, b in zip(p, r)) < 1e-6
                  for p, r in zip(sc["scores"], sm["scores"])), f"/v1/score apply_softmax: {sm} / {sc}")
    g = _json2.loads(sgl({"text": q + items[0], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                          "token_ids_logprob": labels}))
    oti = g["meta_info"]["output_token_ids_logprobs"]
    check(g["output_ids"] == [] and len(oti) == 1 and [e[1] for e in oti[0]] == labels and
          max(abs(_math.exp(e[0]) - p) for e, p in zip(oti[0], score({"query": q, "items": items[0], "label_token_ids": labels})["scores"][0])) < 1e-7,
          f"/generate prefill-only token_ids_logprob: {g}")
    qi, ii = tok(q), [tok(it) for it in items]
    si = score({"query": qi, "items": ii, "label_token_ids": labels[:2]})
    check(max(abs(a - _math.exp(label_lp(qi + x, lb))) for x, row in zip(ii, si["scores"]) for a, lb in zip(row, labels[:2])) < 1e-6,
          f"/v1/score with ids: {si}")
    for bad, param in (({"items": []}, "items"), ({"items": [[1]]}, "items[0]"), ({"label_token_ids": []}, "label_token_ids"),
                       ({"label_token_ids": [vocab]}, "label_token_ids[0]"), ({"label_token_ids": None}, "label_token_ids"),
                       ({"label_token_ids": [1.5]}, "label_token_ids[0]"), ({"query": 3}, "query"), ({"query": None}, "query"),
                       ({"apply_softmax": 1}, "apply_softmax"), ({"stream": True}, "stream"), ({"query": [1], "items": ["x"]}, "items[0]"),
                       ({"query": "x" * 5000}, "items")):
        try:
            score({"query": "a", "items": ["b"], "label_token_ids": [1], **bad})
            check(False, f"/v1/score {str(bad)[:80]} was taken")
        except _ur.HTTPError as he:
            got = _json2.loads(he.read())["error"]
            check(he.code == 400 and got["param"] == param, f"/v1/score {str(bad)[:80]}: {he.code} {got}")
    plain = _json2.loads(sgl({"text": LP, "sampling_params": {"max_new_tokens": 1}, "token_ids_logprob": [5]}))
    check("output_token_ids_logprobs" not in plain["meta_info"], "token_ids_logprob without return_logprob")
    for bad, param in (({"token_ids_logprob": "x"}, "token_ids_logprob"), ({"token_ids_logprob": [vocab]}, "token_ids_logprob[0]"),
                       ({"token_ids_logprob": [1, 2.5]}, "token_ids_logprob[1]"), ({"token_ids_logprob": [[1], [2]]}, "token_ids_logprob"),
                       ({"token_ids_logprob": list(range(1025))}, "token_ids_logprob"),
                       ({"text": ["a", "b"], "token_ids_logprob": [[1]]}, "token_ids_logprob"),
                       ({"text": ["a", "b"], "token_ids_logprob": [[1], [vocab + 5]]}, "token_ids_logprob[1][0]"),
                       ({"text": ["x"] * 17, "sampling_params": {"max_new_tokens": 1000},  # 17 x 1001 x 1024 > 2^24
                         "token_ids_logprob": list(range(1024))}, "token_ids_logprob")):
        try:
            sgl({"text": "x", "return_logprob": True, **bad})
            check(False, f"/generate {str(bad)[:80]} was taken")
        except _ur.HTTPError as he:
            got = _json2.loads(he.read())["error"]
            check(he.code == 400 and got["param"] == param, f"/generate {str(bad)[:80]}: {he.code} {got}")
    for bad, param in (({"text": LP, "logprob_start_len": n}, "logprob_start_len"), ({"logprob_start_len": 2**62}, "logprob_start_len"), ({"logprob_start_len": "0"}, "logprob_start_len"),
                       ({"text": ["x", LP], "logprob_start_len": 3}, "logprob_start_len"),
                       ({"top_logprobs_num": 21}, "top_logprobs_num"), ({"return_logprob": "yes"}, "return_logprob")):
        try:
            sgl({"text": "x", "return_logprob": True, **bad})
            check(False, f"/generate {bad} was taken")
        except _ur.HTTPError as he:
            check(he.code == 400 and _json2.loads(he.read())["error"]["param"] == param, f"/generate {bad}: {he.code}")
    print("sglang logprobs: ok")
    # sglang's /abort_request (RL frameworks end rollouts so): a running /generate with a rid, and a completions
    # stream by its id, end at once, finish abort, the tokens so far kept; abort_all ends every one; an unknown
    # rid ends nothing (200, 0); a bad body is a 400 naming the field
    def abort(body):
        rq = _ur.Request(text_url + "/abort_request", data=_json2.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
        return _json2.loads(_ur.urlopen(rq, timeout=60).read())

    def open_stream(path, body):
        rq = _ur.Request(text_url + path, data=_json2.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = _ur.urlopen(rq, timeout=120)
        first = None
        while first is None:  # the first event with output: the request is running
            line = resp.readline().decode()
            check(line != "", f"{path}: the stream ended before its first event")
            if line.startswith("data: {"):
                first = _json2.loads(line[6:])
        return resp, first

    def rest(resp):
        evs = [_json2.loads(l[6:]) for l in resp.read().decode().split("\n") if l.startswith("data: {")]
        resp.close()
        return evs

    long_sp = {"max_new_tokens": 1000, "ignore_eos": True, "temperature": 0}  # the context is 1024
    gs, _ = open_stream("/generate", {"text": "In", "rid": "rl-1", "stream": True, "sampling_params": long_sp})
    check(abort({"rid": "rl-1"}) == {"aborted": 1}, "/abort_request by rid")
    last = rest(gs)[-1]["meta_info"]
    check(last["finish_reason"] == {"type": "abort"} and 0 < last["completion_tokens"] < 1000,
          f"/abort_request: the /generate stream ended {last['finish_reason']} after {last['completion_tokens']}")
    cs, first = open_stream("/v1/completions", {"model": tmodel, "prompt": "In", "max_tokens": 1000, "stream": True,
                                                 "ignore_eos": True})
    check(abort({"rid": first["id"], "finished_reason": None}) == {"aborted": 1}, "/abort_request by a completions id")
    fins = [c["choices"][0]["finish_reason"] for c in rest(cs) if c.get("choices")]
    check(fins[-1:] == ["abort"], f"/abort_request: the completions stream ended {fins[-3:]}")
    a, _ = open_stream("/generate", {"text": "In", "rid": "rl-2", "stream": True, "sampling_params": long_sp})
    b, _ = open_stream("/generate", {"text": "The", "rid": "rl-3", "stream": True, "sampling_params": long_sp})
    check(abort({"rid": "rl-2"}) == {"aborted": 1}, "/abort_request: one of two running")
    check(rest(a)[-1]["meta_info"]["finish_reason"] == {"type": "abort"}, "/abort_request: rl-2 ended")
    c3, _ = open_stream("/generate", {"text": "And", "rid": "rl-4", "stream": True, "sampling_params": long_sp})
    check(abort({"abort_all": True}) == {"aborted": 2}, "/abort_request abort_all: rl-3 (still running) and rl-4")
    check(all(rest(x)[-1]["meta_info"]["finish_reason"] == {"type": "abort"} for x in (b, c3)), "abort_all: both ended")
    check(abort({"rid": "rl-1"}) == {"aborted": 0}, "/abort_request of an ended request")
    # one prompt of a /generate batch, by its own id: a list of rids (one per prompt) or rid-i of one rid; the
    # others run to their end
    import threading as _th
    import time as _time
    for rid, target in ((["rb-a", "rb-b"], "rb-b"), ("rb", "rb-1")):
        got = {}
        th = _th.Thread(target=lambda: got.update(r=_json2.loads(sgl({"text": ["In", "And"], "rid": rid, "sampling_params": long_sp}))))
        th.start()
        t0, n_ab = _time.time(), 0
        while n_ab == 0 and _time.time() - t0 < 60:  # until the batch is in the server
            n_ab = abort({"rid": target})["aborted"]
        th.join(120)
        ids = [x["meta_info"]["id"] for x in got.get("r", [])]
        fr = [x["meta_info"]["finish_reason"]["type"] for x in got.get("r", [])]
        check(n_ab == 1 and ids == (rid if isinstance(rid, list) else ["rb-0", "rb-1"]) and fr == ["length", "abort"] and
              got["r"][0]["meta_info"]["completion_tokens"] == 1000, f"/abort_request of {target} in a batch: {n_ab}, {ids}, {fr}")
    for bad in ({"text": "x", "rid": ["a"]}, {"text": ["x", "y"], "rid": ["a"]}, {"text": ["x", "y"], "rid": ["a", 3]},
                {"text": ["x"], "rid": []}):
        try:
            sgl(bad)
            check(False, f"/generate {bad} was taken")
        except _ur.HTTPError as he:
            check(he.code == 400 and _json2.loads(he.read())["error"]["param"] == "rid", f"/generate {bad}: {he.code}")
    for bad, param in (({"rid": 5}, "rid"), ({"abort_all": "yes"}, "abort_all"), ({}, "rid"), ({"rid": ""}, "rid"),
                       ({"rid": "x", "ridd": 1}, "ridd")):
        try:
            abort(bad)
            check(False, f"/abort_request {bad} was taken")
        except _ur.HTTPError as he:
            check(he.code == 400 and _json2.loads(he.read())["error"]["param"] == param, f"/abort_request {bad}: {he.code}")
    print("sglang abort_request: ok")
    # sglang's expert distribution: counted from start to stop, every token of every forward (the prompt's
    # not served from the cache, the generated but the last), k selections a token in each layer; frozen
    # after stop, zero after a new start; the dump also by GET
    def post(path, body=b""):
        return _ur.urlopen(_ur.Request(text_url + path, data=body, method="POST"), timeout=60).read()

    check(post("/start_expert_distribution_record") == b"Start recording the expert distribution.\n", "expert record start")
    ep = "Expert counting starts with a prompt that no earlier request has sent"
    r = tc.completions.create(model=tmodel, prompt=ep, max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
    want = r.usage.prompt_tokens - (r.usage.prompt_tokens_details.cached_tokens or 0 if r.usage.prompt_tokens_details else 0) + 6
    check(post("/stop_expert_distribution_record") == b"Stop recording the expert distribution.\n", "expert record stop")
    d = _json2.loads(post("/dump_expert_distribution_record"))
    k, E, L = d["top_k"], d["experts"], d["layers"]
    check(not d["recording"] and L == len(d["logical_count"]) and d["tokens"] == [want] * L and
          all(len(row) == E and sum(row) == want * k for row in d["logical_count"]) and
          all(abs(b - sum(row) / E / max(row)) < 1e-12 for b, row in zip(d["balancedness"], d["logical_count"])),
          f"expert distribution of {want} tokens: {d}")
    tc.completions.create(model=tmodel, prompt="Not counted", max_tokens=3)
    check(_json2.loads(_ur.urlopen(text_url + "/dump_expert_distribution_record", timeout=60).read()) == d,
          "expert distribution: frozen after stop (GET)")
    post("/start_expert_distribution_record")
    z = _json2.loads(post("/dump_expert_distribution_record"))
    check(z["recording"] and all(sum(row) == 0 for row in z["logical_count"]), f"expert distribution restarted: {z}")
    post("/stop_expert_distribution_record")
    # sglang's return_routed_experts (RL routing replay): base64 of int32 [prompt + completion - 1][layers][top_k],
    # every position that went through the model; the experts valid ids; a batch's two answers each its own, the
    # same prompt giving the same rows; and for a request run alone their histogram is what the expert
    # distribution recorder counted meanwhile (the model's own counters, another path); cached blocks are not
    # used (every position has its rows); without the server flag this is a 400 (the other servers of this test)
    import base64 as _b64, struct as _st

    def rows_of(meta):
        raw = _b64.b64decode(meta["routed_experts"])
        ids = _st.unpack("<%di" % (len(raw) // 4), raw)
        return [ids[i:i + L * k] for i in range(0, len(ids), L * k)]

    post("/start_expert_distribution_record")
    rr = _json2.loads(sgl({"text": LP, "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
                           "return_routed_experts": True}))
    post("/stop_expert_distribution_record")
    dd = _json2.loads(post("/dump_expert_distribution_record"))
    L, k, E = dd["layers"], dd["top_k"], dd["experts"]
    mi = rr["meta_info"]
    rows = rows_of(mi)
    hist = [[sum(r[l * k:(l + 1) * k].count(x) for r in rows) for x in range(E)] for l in range(L)]
    check(len(rows) == mi["prompt_tokens"] + mi["completion_tokens"] - 1 and mi["cached_tokens"] == 0 and
          all(0 <= x < E for r in rows for x in r) and hist == dd["logical_count"],
          f"routed_experts: {len(rows)} rows, {mi}, histogram {hist} / recorder {dd['logical_count']}")
    rb = _json2.loads(sgl({"text": [LP, "In the"], "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                           "return_routed_experts": True}))
    ra, rb2 = rows_of(rb[0]["meta_info"]), rows_of(rb[1]["meta_info"])
    alone = rows_of(_json2.loads(sgl({"text": "In the", "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                                      "return_routed_experts": True}))["meta_info"])
    check(len(ra) == rb[0]["meta_info"]["prompt_tokens"] + 2 and len(rb2) == rb[1]["meta_info"]["prompt_tokens"] + 2 and
          ra[:len(lids)] == rows[:len(lids)] and rb2 == alone, f"routed_experts of a batch: {rb2} / alone {alone}")
    for where, body, why in ((text_url, {"text": "x", "return_routed_experts": "yes"}, "a string"),
                             (sys.argv[1], {"input_ids": [5, 6], "return_routed_experts": True}, "a server without the flag")):
        try:
            _ur.urlopen(_ur.Request(where + "/generate", data=_json2.dumps(body).encode(),
                                    headers={"Content-Type": "application/json"}), timeout=60)
            check(False, f"return_routed_experts, {why}: taken")
        except _ur.HTTPError as he:
            got = _json2.loads(he.read())["error"]
            check(he.code == 400 and got["param"] == "return_routed_experts", f"return_routed_experts, {why}: {got}")
    # sglang's /start_profile and /stop_profile: the steps between them as a Chrome trace; the prompt's tokens
    # (none from the cache) in the prefill slices, the generated ones but the last in the decode slices, each
    # phase inside its step and in order, the forward's parts within it; num_steps caps the steps; the 400s
    def post_err(path, body=b""):
        try:
            post(path, body)
            return None
        except _ur.HTTPError as he:
            return he.code, _json2.loads(he.read())["error"]

    check(post_err("/stop_profile")[0] == 400, "/stop_profile with none recording")
    check(post("/start_profile") == b"Start profiling.\n" and post_err("/start_profile")[0] == 400, "/start_profile twice")
    r = tc.completions.create(model=tmodel, prompt="Profiles time every step of a fresh prompt", max_tokens=6,
                              temperature=0, extra_body={"ignore_eos": True})
    tr = _json2.loads(post("/stop_profile"))
    ev = [x for x in tr["traceEvents"] if x.get("ph") == "X"]
    steps = [x for x in ev if x["name"] == "step"]
    cached = (r.usage.prompt_tokens_details.cached_tokens or 0) if r.usage.prompt_tokens_details else 0
    check(sum(x["args"]["prefill_tokens"] for x in steps) == r.usage.prompt_tokens - cached and
          sum(x["args"]["decode_tokens"] for x in steps) == 5 and tr["otherData"]["steps"] == len(steps) > 0 and
          not tr["otherData"]["cut"] and tr["otherData"]["model"] == tmodel, f"profile steps: {tr['otherData']} {[x['args'] for x in steps]}")
    for st in steps:
        ph = {x["name"]: x for x in ev if x["name"] != "step" and st["ts"] <= x["ts"] < st["ts"] + st["dur"] + 1e-3}
        sc, fw, co = ph["schedule"], ph["forward"], ph["complete"]
        a = fw["args"]
        check(abs(sc["ts"] - st["ts"]) < 1e-3 and abs(fw["ts"] - sc["ts"] - sc["dur"]) < 2e-3 and
              abs(co["ts"] - fw["ts"] - fw["dur"]) < 2e-3 and co["ts"] + co["dur"] <= st["ts"] + st["dur"] + 2e-3 and
              (a["attention_ms"] + a["moe_ms"] + a["other_ms"]) * 1e3 <= fw["dur"] + 5 and
              a["tokens"] == st["args"]["prefill_tokens"] + st["args"]["decode_tokens"],
              f"profile step {st['args']['step']}: {st} {ph}")
    post("/start_profile", _json2.dumps({"num_steps": 2, "activities": ["CPU"]}).encode())
    tc.completions.create(model=tmodel, prompt="A second profiled prompt", max_tokens=6)
    check(_json2.loads(post("/stop_profile"))["otherData"]["steps"] == 2, "/start_profile num_steps 2")
    for bad, param in (({"output_dir": "/tmp"}, "output_dir"), ({"num_steps": 0}, "num_steps"), ({"num_step": 3}, "num_step"),
                       ({"activities": "CPU"}, "activities")):
        got = post_err("/start_profile", _json2.dumps(bad).encode())
        check(got is not None and got[0] == 400 and got[1]["param"] == param, f"/start_profile {bad}: {got}")
    check(post_err("/stop_profile")[0] == 400, "no profile left recording")
    # sglang's /generate takes it as JSON text in sampling_params
    q = _ur.Request(text_url + "/generate", data=_json2.dumps({"text": "w", "sampling_params": {
        "max_new_tokens": 300, "temperature": 1.0, "structural_tag": _json2.dumps(fmt)}}).encode(),
        headers={"Content-Type": "application/json"})
    g = _json2.loads(_ur.urlopen(q, timeout=120).read())
    if g["meta_info"]["finish_reason"]["type"] == "stop":
        why = tags_ok(g["text"], {"<fn=weather>": wsch}, "</fn>", True)
        check(why is None, f"/generate structural tag: {why}: {g['text']!r}")
    expect_exc(openai.BadRequestError, lambda: tc.completions.create(
        model=tmodel, prompt="x", max_tokens=4, extra_body={"response_format": {
            "type": "structural_tag", "triggers": ["<fn="],
            "structures": [{"begin": "<tool>", "schema": wsch, "end": "</tool>"}]}}),
        param="response_format", text="triggers: \"<fn=\" starts no tag's begin")
    expect_exc(openai.BadRequestError, lambda: tc.completions.create(
        model=tmodel, prompt="x", max_tokens=4, extra_body={"structured_outputs": {"structural_tag": "{"}}),
        param="structured_outputs.structural_tag", text="is a string that is not a structural tag")
    print("structural tags: ok")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                 "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"enum": [1, 2, 3]}},
                 "required": ["city", "days"]}}},
             {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    # tool_choice required on this MiniMax-form model: the calls in its own XML block, held to the tools (the
    # bias on "]" served vLLM's JSON form, which a model without a tool-call format gets: serve_openai.sh);
    # every answer that ends as calls is validated by jsonschema
    import urllib.request
    tq = urllib.request.Request(text_url + "/tokenize", data=_json2.dumps({"prompt": "]", "add_special_tokens": False}).encode(),
                                headers={"Content-Type": "application/json"})
    close_ids = _json2.loads(urllib.request.urlopen(tq, timeout=30).read())["tokens"]
    check(len(close_ids) == 1, f"/tokenize of ']': {close_ids}")
    def required_call(seed):  # 1 when the answer ended as calls (and then validates)
        r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "weather?"}], tools=tools,
                                        tool_choice="required", max_tokens=300, temperature=1.0, seed=seed,
                                        logit_bias={str(close_ids[0]): 8},
                                        extra_body={"debug_forced_output": think})
        c = r.choices[0]
        if c.finish_reason != "tool_calls":
            return 0
        check(c.message.tool_calls and c.message.content is None, f"required: {c.message}")
        for tcall in c.message.tool_calls:
            jsonschema.validate(_json2.loads(tcall.function.arguments), by_name[tcall.function.name])
        return 1
    called = sum(each(required_call, range(8)))
    print(f"tool_choice required: {called} of 8 answers ended as calls")
    check(called >= 5, f"tool_choice required: {called} of 8 answers were calls")
    # parallel_tool_calls false: one call, however much the model would like a ',' before the next
    tq = urllib.request.Request(text_url + "/tokenize", data=_json2.dumps({"prompt": ",", "add_special_tokens": False}).encode(),
                                headers={"Content-Type": "application/json"})
    comma = _json2.loads(urllib.request.urlopen(tq, timeout=30).read())["tokens"]
    def one_call(seed):
        r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "weather?"}], tools=tools,
                                        tool_choice="required", parallel_tool_calls=False, max_tokens=300,
                                        temperature=1.0, seed=seed, logit_bias={str(comma[0]): 30},
                                        extra_body={"debug_forced_output": think})
        c = r.choices[0]
        check(c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1,
              f"parallel_tool_calls false: {c.finish_reason}, {c.message.tool_calls}")
    each(one_call, range(3))
    def r_usage_ct(chunks):
        return [c.usage for c in chunks if c.usage][0].completion_tokens

    r = tc.chat.completions.create(model=tmodel, messages=[{"role": "user", "content": "weather?"}], tools=tools,
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                    max_tokens=300, temperature=1.0, seed=3, stream=True,
                                    stream_options={"include_usage": True}, extra_body={"debug_forced_output": think})
    chunks = list(r)
    calls = [t for c in chunks if c.choices and c.choices[0].delta.tool_calls for t in c.choices[0].delta.tool_calls]
    fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    # streamed as it comes: the first delta has the id and the name, the rest argument text
    check(len(calls) >= 2 and calls[0].id and calls[0].function.name == "get_weather" and
          all(t.index == 0 and not t.id and not t.function.name for t in calls[1:]), f"named tool deltas: {calls}")
    check(fin in (["tool_calls"], ["length"]), f"named tool: finish {fin}")
    args = "".join(t.function.arguments or "" for t in calls)
    if fin == ["tool_calls"]:  # ended by the EOS, not by max_tokens
        check(r_usage_ct(chunks) < 300, "named tool: finish tool_calls at max_tokens")
        jsonschema.validate(_json2.loads(args), by_name["get_weather"])
    # strict tools with tool_choice auto: free text, and a tool-call block in MiniMax-M2's XML that follows the
    # tools (the calls read back by the server's own parser; jsonschema is the oracle of their arguments)
    stools = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
                  "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                   "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                                   "unit": {"enum": ["c", "f"]}},
                  "required": ["city", "days"], "additionalProperties": False}}}]
    for stream in (False, True):
        kw = dict(model=tmodel, messages=[{"role": "user", "content": "weather?"}], tools=stools, max_tokens=300,
                  temperature=1.0, seed=11, parallel_tool_calls=False,
                  extra_body={"debug_forced_output": think + "Let me check.\n<minimax:tool_call>\n<invoke name=\"get_weather\">"})
        if stream:
            parts = list(tc.chat.completions.create(stream=True, **kw))
            fin = [c.choices[0].finish_reason for c in parts if c.choices and c.choices[0].finish_reason]
            deltas = [t for c in parts if c.choices and c.choices[0].delta.tool_calls for t in c.choices[0].delta.tool_calls]
            names = [t.function.name for t in deltas if t.function.name]
            args = "".join(t.function.arguments or "" for t in deltas)
        else:
            c = tc.chat.completions.create(**kw).choices[0]
            fin, names = [c.finish_reason], [t.function.name for t in (c.message.tool_calls or [])]
            args = c.message.tool_calls[0].function.arguments if c.message.tool_calls else ""
            check(c.message.content == "Let me check.", f"strict tools: content {c.message.content!r}")
        check(fin == ["tool_calls"] and names == ["get_weather"], f"strict tools stream={stream}: {fin} {names}")
        a = _json2.loads(args)
        jsonschema.validate(a, stools[0]["function"]["parameters"])
        check(list(a)[:2] == ["city", "days"], f"strict tools: declared order {a}")
    # the Responses API's function tools carry strict alike
    r = tc.responses.create(model=tmodel, input="weather?", max_output_tokens=300, temperature=1.0, parallel_tool_calls=False,
                            tools=[{"type": "function", "name": "get_weather", "strict": True,
                                    "parameters": stools[0]["function"]["parameters"]}],
                            extra_body={"seed": 12, "debug_forced_output": think + "<minimax:tool_call>\n<invoke name=\"get_weather\">"})
    fc = [o for o in r.output if o.type == "function_call"]
    check(r.status == "completed" and len(fc) == 1 and fc[0].name == "get_weather", f"responses strict: {r.status} {r.output}")
    jsonschema.validate(_json2.loads(fc[0].arguments), stools[0]["function"]["parameters"])
    expect_exc(openai.BadRequestError, lambda: tc.chat.completions.create(
        model=tmodel, messages=[{"role": "user", "content": "x"}], max_tokens=4, tools=stools,
        response_format={"type": "json_object"}), param="response_format", text="strict tools")
    expect_exc(openai.BadRequestError, lambda: tc.chat.completions.create(
        model=tmodel, messages=[{"role": "user", "content": "x"}], max_tokens=4, tools=[{"type": "function", "function": {
            "name": "f", "strict": True, "parameters": {"type": "object", "properties": {
                "s": {"type": "string", "pattern": "^[a-z]+$"}}}}}]),
        param="tools", text="pattern is not enforced")
    print("strict tools: ok")
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a)\\1"}}}
    expect_exc(openai.BadRequestError, lambda: tc.chat.completions.create(
        model=tmodel, messages=[{"role": "user", "content": "x"}], max_tokens=4, response_format=bad),
        param="response_format.json_schema.schema", text="backreferences")
    expect_exc(openai.BadRequestError, lambda: tc.chat.completions.create(
        model=tmodel, messages=[{"role": "user", "content": "x"}], max_tokens=4, tools=tools,
        tool_choice={"type": "function", "function": {"name": "nope"}}), param="tool_choice.function.name")
    expect_exc(openai.BadRequestError, lambda: tc.chat.completions.create(
        model=tmodel, messages=[{"role": "user", "content": "x"}], max_tokens=4, tool_choice="required"),
        param="tool_choice")
    print("structured outputs: ok")
    # last: a background response still running when the server is told to stop (it drains, then exits 0)
    tc.responses.create(**long_kw)
print(f"OK ({checks()} checks)")
