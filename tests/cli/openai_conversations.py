"""The Conversations API (/v1/conversations) and a Responses request's `conversation`, through the official
`openai` client's conversations.* and responses.* against `moerun serve` (run by tests/cli/serve_openai.sh in its
private venv).

usage: openai_conversations.py TEXT_URL SMALL_URL OFF_URL

TEXT_URL: a MiniMax-form checkpoint's server started with --debug-forced-output (outputs dictated by the
requests). SMALL_URL: the same with --conversation-store-mb 1 (the bound). OFF_URL: a server with
--conversation-store-mb 0 (the API off).
The oracle for what the model was given: chat completions of the conversation written out (its prompt
tokens), and the Responses API given the same items as input. Prints one line per case; exits 1 on the first
failure."""
import json
import os
import sys
import time
import urllib.error
import urllib.request

import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from oaicheck import check, checks, ended, expect_exc  # noqa: E402

text_url, small_url, off_url = sys.argv[1], sys.argv[2], sys.argv[3]
tc = openai.OpenAI(base_url=text_url + "/v1", api_key="none", max_retries=0, timeout=120)
tmodel = tc.models.list().data[0].id
EOS = "[e~["
say = "Two plus two.</think>\n\nThe answer is 4." + EOS
call = ("Look it up.</think>\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo"
        "</parameter>\n<parameter name=\"days\">1</parameter>\n</invoke>\n</minimax:tool_call>" + EOS)
params = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}
rtools = [{"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": params}]
ctools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": params}}]






def poll(rid):
    return ended(tc, rid)


def items_of(cid, **kw):
    """Every item of the conversation, oldest first, through the client's auto-paging (two a page)."""
    return list(tc.conversations.items.list(cid, order="asc", limit=2, **kw))


def written(items):
    """The chat messages the items stand for (the independent rendering of the same conversation)."""
    msgs = []
    reasoning = None
    for it in items:
        if it.type == "message":
            text = "".join(p.text for p in it.content)
            m = {"role": it.role, "content": text}
            if it.role == "assistant" and reasoning is not None:
                m["reasoning_content"], reasoning = reasoning, None
            msgs.append(m)
        elif it.type == "reasoning":
            reasoning = "".join(p.text for p in it.content)
        elif it.type == "function_call":
            if not (msgs and msgs[-1]["role"] == "assistant"):
                msgs.append({"role": "assistant", "content": ""})
            if reasoning is not None:
                msgs[-1]["reasoning_content"], reasoning = reasoning, None
            msgs[-1].setdefault("tool_calls", []).append(
                {"id": it.call_id, "type": "function", "function": {"name": it.name, "arguments": it.arguments}})
        elif it.type == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": it.call_id, "content": it.output})
    return msgs


def prompt_tokens(msgs, tools=None):
    kw = {"tools": tools} if tools else {}
    return tc.chat.completions.create(model=tmodel, messages=msgs, max_tokens=4, extra_body={"debug_forced_output": "x"},
                                      **kw).usage.prompt_tokens


print("openai", openai.__version__)

# create, retrieve, update: the conversation object; its first items with ids, as given
t0 = int(time.time())
conv = tc.conversations.create(items=[{"type": "message", "role": "system", "content": "Be brief."}],
                               metadata={"topic": "weather"})
check(conv.id.startswith("conv_") and len(conv.id) > 40 and conv.object == "conversation" and
      conv.metadata == {"topic": "weather"} and abs(conv.created_at - t0) <= 5, f"created {conv}")
got = tc.conversations.retrieve(conv.id)
check(got.model_dump() == conv.model_dump(), f"retrieve {got} != {conv}")
upd = tc.conversations.update(conv.id, metadata={"topic": "weather", "city": "Oslo"})
check(upd.metadata == {"topic": "weather", "city": "Oslo"} and upd.id == conv.id and
      tc.conversations.retrieve(conv.id).metadata == upd.metadata, f"update {upd}")
first = items_of(conv.id)
check(len(first) == 1 and first[0].type == "message" and first[0].role == "system" and first[0].id and
      first[0].content[0].type == "input_text" and first[0].content[0].text == "Be brief." and first[0].status == "completed",
      f"first items {first}")
print("conversations create / retrieve / update: ok")

# a response in the conversation is given its items before its input, and adds its input and output to it
r1 = tc.responses.create(model=tmodel, conversation=conv.id, input="Weather in Oslo?", tools=rtools, max_output_tokens=200,
                         extra_body={"debug_forced_output": call})
check(r1.conversation is not None and r1.conversation.id == conv.id and r1.status == "completed", f"r1 {r1.conversation}")
after1 = items_of(conv.id)
check([i.type for i in after1] == ["message", "message", "reasoning", "function_call"] and
      after1[1].role == "user" and after1[1].content[0].text == "Weather in Oslo?" and
      [i.id for i in after1[2:]] == [o.id for o in r1.output], f"items after r1: {[i.type for i in after1]}")
check(r1.usage.input_tokens == prompt_tokens(written(after1[:2]), ctools),
      f"r1's prompt {r1.usage.input_tokens} vs the conversation written out")
fc = after1[3]
out_item = {"type": "function_call_output", "call_id": fc.call_id, "output": "Cold"}
# the next turn, created and streamed (each in a copy of the conversation made from its items): the prompt is
# the conversation's items and the input, as the same items given as input make it
for stream in (False, True):
    cp = tc.conversations.create(items=[json.loads(i.model_dump_json(exclude_none=True)) for i in after1])
    kw = dict(model=tmodel, conversation={"id": cp.id}, input=[out_item], tools=rtools, max_output_tokens=64,
              extra_body={"debug_forced_output": say})
    if stream:
        with tc.responses.stream(**kw) as st:
            for _ in st:
                pass
            r2 = st.get_final_response()
    else:
        r2 = tc.responses.create(**kw)
    explicit = tc.responses.create(model=tmodel, input=[json.loads(i.model_dump_json(exclude_none=True)) for i in after1] +
                                   [out_item], tools=rtools, max_output_tokens=64, store=False,
                                   extra_body={"debug_forced_output": say})
    msgs = written(after1) + [{"role": "tool", "tool_call_id": fc.call_id, "content": "Cold"}]
    check(r2.output_text == "The answer is 4." and r2.usage.input_tokens == explicit.usage.input_tokens ==
          prompt_tokens(msgs, ctools), f"r2 (stream={stream}): {r2.usage.input_tokens} vs {explicit.usage.input_tokens}")
    after2 = items_of(cp.id)
    check([i.type for i in after2] == [i.type for i in after1] + ["function_call_output", "reasoning", "message"] and
          after2[4].output == "Cold" and after2[-1].content[0].text == "The answer is 4." and
          len({i.id for i in after2}) == len(after2), f"items after r2 (stream={stream}): {[i.type for i in after2]}")
    # a third turn sees both
    r3 = tc.responses.create(model=tmodel, conversation=cp.id, input="Thanks.", max_output_tokens=64,
                             extra_body={"debug_forced_output": say})
    check(r3.usage.input_tokens == prompt_tokens(written(after2) + [{"role": "user", "content": "Thanks."}]),
          f"r3 (stream={stream}): {r3.usage.input_tokens}")
    check(len(items_of(cp.id)) == len(after2) + 3, "r3's items added")
print("responses in a conversation (created, streamed, chained): ok")

# newest first by default, pages, after
desc = tc.conversations.items.list(cp.id, limit=3)
allc = items_of(cp.id)
check([i.id for i in desc.data] == [i.id for i in reversed(allc)][:3] and desc.has_more and
      [i.id for i in desc] == [i.id for i in reversed(allc)], "items pages, newest first")
aft = tc.conversations.items.list(cp.id, order="asc", after=allc[1].id, limit=100)
check([i.id for i in aft.data] == [i.id for i in allc[2:]] and not aft.has_more, "after")
expect_exc(openai.BadRequestError, lambda: tc.conversations.items.list(cp.id, limit=101), param="limit")
expect_exc(openai.BadRequestError, lambda: tc.conversations.items.list(cp.id, after="msg_none"), param="after")
expect_exc(openai.BadRequestError, lambda: tc.conversations.items.list(cp.id, include=["file_search_call.results"]),
           param="include")
enc = tc.conversations.items.list(cp.id, include=["reasoning.encrypted_content"], order="asc", limit=100)
rs = [i for i in enc.data if i.type == "reasoning"]
check(rs and all(i.encrypted_content for i in rs), "include reasoning.encrypted_content")
# the encrypted reasoning given back as input renders as the reasoning it stands for (the stateless form)
back = tc.responses.create(model=tmodel, input=[json.loads(i.model_dump_json(exclude_none=True, exclude={"content"}))
                                                if i.type == "reasoning" else json.loads(i.model_dump_json(exclude_none=True))
                                                for i in enc.data] + [{"role": "user", "content": "More?"}],
                           max_output_tokens=8, store=False, extra_body={"debug_forced_output": say})
check(back.usage.input_tokens == prompt_tokens(written(allc) + [{"role": "user", "content": "More?"}]),
      "encrypted reasoning of the listed items")
print("conversation items list: ok")

# add, retrieve, delete items
added = tc.conversations.items.create(conv.id, items=[{"role": "user", "content": "And Bergen?"},
                                                       {"type": "message", "role": "assistant",
                                                        "content": [{"type": "output_text", "text": "Rain."}]}])
check(len(added.data) == 2 and added.data[0].id and added.data[1].content[0].type == "output_text" and
      added.first_id == added.data[0].id and added.last_id == added.data[1].id and not added.has_more, f"added {added}")
one = tc.conversations.items.retrieve(added.data[0].id, conversation_id=conv.id)
check(one.id == added.data[0].id and one.content[0].text == "And Bergen?" and one.role == "user", f"retrieve item {one}")
n_before = len(items_of(conv.id))
left = tc.conversations.items.delete(added.data[0].id, conversation_id=conv.id)
check(left.id == conv.id and left.object == "conversation" and len(items_of(conv.id)) == n_before - 1, "delete item")
expect_exc(openai.NotFoundError, lambda: tc.conversations.items.retrieve(added.data[0].id, conversation_id=conv.id),
           param="item_id")
expect_exc(openai.NotFoundError, lambda: tc.conversations.items.delete(added.data[0].id, conversation_id=conv.id),
           param="item_id")
print("conversation items create / retrieve / delete: ok")

# what is added and what is not: store false still adds (the conversation is its own record); an incomplete
# response adds its items; a background one adds them when it ends; a failed one adds nothing
c2 = tc.conversations.create()
check(items_of(c2.id) == [] and c2.metadata == {}, "an empty conversation")
nk = tc.responses.create(model=tmodel, conversation=c2.id, input="2+2?", store=False, max_output_tokens=64,
                         extra_body={"debug_forced_output": say})
check(nk.store is False and len(items_of(c2.id)) == 3, "store false adds to the conversation")
inc = tc.responses.create(model=tmodel, conversation=c2.id, input="again", max_output_tokens=3,
                          extra_body={"debug_forced_output": say})
it2 = items_of(c2.id)
check(inc.status == "incomplete" and len(it2) == 3 + 1 + len(inc.output) and it2[-1].status == "incomplete" and
      [i.id for i in it2[4:]] == [o.id for o in inc.output], f"incomplete adds: {len(it2)}")
bg = tc.responses.create(model=tmodel, conversation=c2.id, input="bg", background=True, max_output_tokens=64,
                         extra_body={"debug_forced_output": say})
g = poll(bg.id)
check(g.status == "completed" and g.conversation.id == c2.id and len(items_of(c2.id)) == len(it2) + 3,
      f"background adds: {g.status}")
n_c2 = len(items_of(c2.id))
bad = tc.responses.create(model=tmodel, conversation=c2.id, input="x", background=True, max_output_tokens=30, text={
    "format": {"type": "json_schema", "name": "a", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}},
    extra_body={"debug_forced_output": "T.</think>nope"})
g = poll(bad.id)
check(g.status == "failed" and len(items_of(c2.id)) == n_c2, f"a failed response adds nothing: {g.status}")


def create_when_free(**kw):
    """A response in a conversation, retried while the one before still holds it (a 409, the client's
    ConflictError: its claim ends with the request's last reference, just after a failed or cancelled one)."""
    for _ in range(200):
        try:
            return tc.responses.create(**kw)
        except openai.ConflictError:
            time.sleep(0.02)
    check(False, "the conversation stayed claimed")


# one response at a time in a conversation: another one while it runs is a 409 and changes nothing; the
# claim ends with the response, however it ends (a cancel adds nothing); the next turn then runs
lg = create_when_free(model=tmodel, conversation=c2.id, input="long", background=True, max_output_tokens=900,
                      extra_body={"ignore_eos": True})
expect_exc(openai.ConflictError, lambda: tc.responses.create(model=tmodel, conversation=c2.id, input="x", max_output_tokens=4,
                                                             extra_body={"debug_forced_output": say}), param="conversation")
tc.responses.cancel(lg.id)
g = poll(lg.id)
check(g.status == "cancelled" and len(items_of(c2.id)) == n_c2, f"a cancelled response adds nothing: {g.status}")
ok = create_when_free(model=tmodel, conversation=c2.id, input="2+2?", max_output_tokens=64,
                      extra_body={"debug_forced_output": say})
check(ok.status == "completed" and len(items_of(c2.id)) == n_c2 + 3, f"the next turn: {ok.status}")
# sequential turns never meet the claim of the turn before (given up before its answer is out), streamed too
for i in range(6):
    if i % 2:
        with tc.responses.stream(model=tmodel, conversation=c2.id, input=f"turn {i}", max_output_tokens=64,
                                 extra_body={"debug_forced_output": say}) as st:
            for _ in st:
                pass
    else:
        tc.responses.create(model=tmodel, conversation=c2.id, input=f"turn {i}", max_output_tokens=64,
                            extra_body={"debug_forced_output": say})
check(len(items_of(c2.id)) == n_c2 + 3 + 18, "six sequential turns")
n_c2 = len(items_of(c2.id))
print("what a response adds, one at a time: ok")

# refusals: the client's exception class and the field at fault
expect_exc(openai.NotFoundError, lambda: tc.conversations.retrieve("conv_none"), param="conversation_id")
expect_exc(openai.NotFoundError, lambda: tc.responses.create(model=tmodel, conversation="conv_none", input="x"),
           param="conversation")
expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, conversation=conv.id, input="x",
                                                               previous_response_id=r1.id), param="conversation")
expect_exc(openai.BadRequestError, lambda: tc.responses.create(model=tmodel, conversation=7, input="x"), param="conversation")
expect_exc(openai.BadRequestError, lambda: tc.conversations.create(items=[{"role": "user", "content": "x"}] * 21),
           param="items")
expect_exc(openai.BadRequestError, lambda: tc.conversations.create(items=[{"role": "user", "content": "x"},
                                                                           {"type": "input_image", "image_url": "x"}]),
           param="items[1]")
expect_exc(openai.BadRequestError, lambda: tc.conversations.create(metadata={str(i): "v" for i in range(17)}), param="metadata")
expect_exc(openai.BadRequestError, lambda: tc.conversations.create(metadata={"k": "v" * 513}), param="metadata")
expect_exc(openai.BadRequestError, lambda: tc.conversations.update(conv.id, metadata={"k": 1}), param="metadata")
expect_exc(openai.BadRequestError, lambda: tc.conversations.items.create(conv.id, items=[]), param="items")
expect_exc(openai.BadRequestError, lambda: tc.conversations.create(extra_body={"colour": "red"}), param="colour")
check(len(items_of(conv.id)) == n_before - 1, "refused requests changed the conversation")
gone = tc.conversations.delete(c2.id)
check(gone.deleted and gone.id == c2.id and gone.object == "conversation.deleted", f"delete {gone}")
expect_exc(openai.NotFoundError, lambda: tc.conversations.retrieve(c2.id), param="conversation_id")
expect_exc(openai.NotFoundError, lambda: tc.conversations.delete(c2.id), param="conversation_id")
expect_exc(openai.NotFoundError, lambda: tc.responses.create(model=tmodel, conversation=c2.id, input="x"),
           param="conversation")
print("conversation refusals: ok")


def raw(url, method, path, body=None):
    q = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                               headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(q, timeout=60) as a:
            return a.status, json.loads(a.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# the bound (--conversation-store-mb 1): what would pass it is refused with a 400 naming the flag, and nothing
# held is dropped; a response is refused at admission once the store is full
sc = openai.OpenAI(base_url=small_url + "/v1", api_key="none", max_retries=0, timeout=120)
big = [{"role": "user", "content": "w" * 60000} for _ in range(4)]
kept = []
for i in range(40):
    try:
        kept.append(sc.conversations.create(items=big, metadata={"n": str(i)}).id)
    except openai.BadRequestError as e:
        check("--conversation-store-mb" in str(e), f"the refusal names the flag: {e}")
        break
check(0 < len(kept) < 40, f"the bound refused a create after {len(kept)}")
st, _ = raw(small_url, "POST", f"/v1/conversations/{kept[0]}/items", {"items": big})
check(st == 400, f"adding items past the bound: {st}")
for i, cid in enumerate(kept):
    c = sc.conversations.retrieve(cid)
    check(c.metadata == {"n": str(i)} and len(list(sc.conversations.items.list(cid, limit=100))) == 4,
          f"conversation {i} kept whole")
st, _ = raw(small_url, "POST", "/v1/responses", {"input": "x", "conversation": kept[0], "max_output_tokens": 4})
check(st == 400, f"a response in a full store: {st}")
sc.conversations.delete(kept[-1])
check(sc.conversations.create(items=big[:1]).id, "room again after a delete")
mt = urllib.request.urlopen(small_url + "/metrics", timeout=30).read().decode()
vals = {ln.split("{")[0]: float(ln.split()[-1]) for ln in mt.splitlines() if ln.startswith("moerun:conversations_")}
check(vals.get("moerun:conversations_stored") == len(kept) and 0 < vals.get("moerun:conversations_store_bytes", 0) <= 1 << 20,
      f"conversation metrics {vals}")
print("the conversation store's bound: ok")

# the API off: /v1/conversations is a 404 saying so, and a response's conversation a 400
st, b = raw(off_url, "POST", "/v1/conversations", {})
check(st == 404 and "--conversation-store-mb 0" in b["error"]["message"], f"off: {st} {b}")
st, b = raw(off_url, "POST", "/v1/responses", {"input": "x", "conversation": "conv_x"})
check(st == 400 and b["error"]["param"] == "conversation", f"off, a response's conversation: {st} {b}")
st, b = raw(text_url, "PUT", f"/v1/conversations/{conv.id}", {})
check(st == 405, f"PUT: {st}")
st, b = raw(text_url, "GET", f"/v1/conversations/{conv.id}/things")
check(st == 404, f"an unknown route under a conversation: {st}")
print(f"conversations: all {checks()} checks passed")
