#!/usr/bin/env python3
"""sharegpt_oracle.py — the rows `moerun bench serve --dataset-name sharegpt`
must send, computed here from the dataset's definition (src/serve/dataset.c's
header: sglang's sample_sharegpt_requests, with our shuffle), and checked
against what the bench wrote to --json.

    sharegpt_oracle.py FILE URL SEED NUM CONTEXT FIXED_OUT RESULT.json [MODEL_DIR]

Tokens are counted by the server's /tokenize (vLLM's request, special tokens
added), over HTTP from here, whatever the bench counted with. CONTEXT 0: the
max_model_len that /tokenize reports. FIXED_OUT 0: the second turn's tokens.
Checks the rows (their conversations, in order, and lengths), the counts of
entries, malformed and pruned ones, and each concurrency's run: every request
completed, the input tokens the rows' sum, and the server's own counters (the
tokens it generated; with text prompts on completions, its prompt tokens).
With MODEL_DIR (--apply-chat-template), each prompt is the chat the server
renders for one user message with the generation prompt (its /tokenize of
messages, then /detokenize: the server's template engine is checked against
transformers by the chat goldens), every occurrence of the BOS token's text
(MODEL_DIR/tokenizer_config.json) taken out, as sglang's sampler does, and
counted as above.
Prints OK, or each difference and exits 1."""
import json
import sys
import urllib.request

M64 = (1 << 64) - 1


def splitmix(state):
    state[0] = (state[0] + 0x9E3779B97F4A7C15) & M64
    z = state[0]
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def post(url, path, obj):
    req = urllib.request.Request(url + path, data=json.dumps(obj).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def tokenize(url, text):
    a = post(url, "/tokenize", {"prompt": text})
    return len(a["tokens"]), a.get("max_model_len")


def templated(url, text, bos):
    ids = post(url, "/tokenize", {"messages": [{"role": "user", "content": text}], "add_generation_prompt": True})
    chat = post(url, "/detokenize", {"tokens": ids["tokens"]})["prompt"]
    return chat.replace(bos, "") if bos else chat


def text_of(turn):
    v = turn.get("value") if isinstance(turn, dict) else None
    return v if isinstance(v, str) and "\0" not in v else None


def shuffled(data, seed):
    """The usable entries' indices in the order they are taken; the counts of usable and malformed entries."""
    usable, malformed, order = 0, 0, []
    for i, e in enumerate(data):
        conv = e.get("conversations", e.get("conversation")) if isinstance(e, dict) else None
        two = isinstance(conv, list) and len(conv) >= 2
        ok = two and text_of(conv[0]) is not None and text_of(conv[1]) is not None
        usable += two
        if ok:
            order.append(i)
        elif two or not isinstance(e, dict):
            malformed += 1
    st = [(seed * 0x9E3779B97F4A7C15 + 0x5EED) & M64]
    for i in range(len(order), 1, -1):  # Fisher-Yates from the top
        j = splitmix(st) % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return order, usable, malformed


def main():
    path, url, seed, num, ctx, fixed, result = sys.argv[1:8]
    bos = None
    if len(sys.argv) > 8:
        bos = json.load(open(sys.argv[8] + "/tokenizer_config.json")).get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
    seed, num, ctx, fixed = int(seed), int(num), int(ctx), int(fixed)
    data = json.load(open(path, encoding="utf-8"))
    order, usable, malformed = shuffled(data, seed)
    if ctx == 0:
        ctx = tokenize(url, "")[1] or 0
    rows, visited, short, long_ = [], 0, 0, 0
    for i in order:
        if len(rows) == num:
            break
        conv = data[i].get("conversations", data[i].get("conversation"))
        visited += 1
        pl = tokenize(url, templated(url, conv[0]["value"], bos) if len(sys.argv) > 8 else conv[0]["value"])[0]
        ol = fixed or tokenize(url, conv[1]["value"])[0]
        if pl < 2 or ol < 2:
            short += 1
        elif ctx and pl + ol > ctx:
            long_ += 1
        else:
            rows.append({"source": i, "prompt_len": pl, "output_len": ol})
    got = json.load(open(result))
    d = got["dataset"]
    errs = []
    want = {"entries": len(data), "usable": usable, "malformed": malformed, "visited": visited, "short_pruned": short,
            "long_pruned": long_, "context_len": ctx, "sharegpt_output_len": fixed, "seed": seed,
            "apply_chat_template": len(sys.argv) > 8}
    for k, v in want.items():
        if d.get(k) != v:
            errs.append(f"dataset.{k}: {d.get(k)}, want {v}")
    if d["rows"] != rows:
        errs.append(f"rows differ: got {d['rows'][:6]}..., want {rows[:6]}... ({len(d['rows'])} / {len(rows)})")
    chat = got["backend"] == "openai-chat"
    for r in got["results"]:
        n = r["num_prompts"]
        first = rows[:n]
        c = r["server_counters_delta"]
        checks = [("num_prompts", n, min(len(rows), n)), ("completed", r["completed"], n), ("failed", r["failed"], 0),
                  ("total_input_tokens", r["total_input_tokens"], sum(x["prompt_len"] for x in first)),
                  ("total_output_tokens", r["total_output_tokens"], sum(x["output_len"] for x in first)),
                  ("server generation_tokens", c["generation_tokens"], sum(x["output_len"] for x in first))]
        if not chat:  # the completions prompt is the text itself, tokenized as /tokenize does
            checks.append(("server prompt_tokens", c["prompt_tokens"], sum(x["prompt_len"] for x in first)))
        for what, g, w in checks:
            if g != w:
                errs.append(f"C {r['max_concurrency']}: {what} {g}, want {w}")
    for e in errs:
        print("FAIL:", e)
    if not errs:
        print(f"OK: {len(rows)} rows, {visited} counted, {short} short, {long_} long, {malformed} malformed")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
