# serve_invariance.py — run by serve_invariance.sh: the same requests give the
# same outputs from a server that runs them one at a time with room to spare (A)
# and from one that runs 64 at once in a KV pool too small for them (B), where
# prompts are prefilled in chunks of 128 tokens beside other requests' decode
# steps, share cached prefix blocks, are preempted and recomputed, and a fifth of
# the clients leave mid-request. Greedy and seeded sampled requests, completions
# and chat, streamed and not. Prompts that cannot fit B's whole pool must be
# refused with a 400 naming --kv-cache-memory. After each round B holds no
# request and no KV block, and counted every client that left as an abort.
# Args: URL_A URL_B MODEL_NAME VALID_TXT ROUNDS [REQUESTS, 120]
import asyncio
import random
import sys
import time
import urllib.request

import openai

url_a, url_b, model, valid, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
BLOCKS_B = 96  # the test's --kv-cache-memory 3M of tiny-kjv: 96 blocks of 16 tokens (checked below)
text = open(valid, encoding="utf-8").read()
rng = random.Random(7)
# six shared prefixes of 300 to 6000 characters (about 75 to 1500 tokens), each request a cut of one and a
# tail of its own: their full blocks are shared in the prefix cache, their tails are not
prefixes = [text[o:o + n] for o, n in [(0, 6000), (9000, 3000), (20000, 1200), (40000, 4500), (60000, 300), (80000, 5000)]]
reqs = []
for i in range(int(sys.argv[6]) if len(sys.argv) > 6 else 120):
    p = prefixes[rng.randrange(len(prefixes))]
    cut = rng.randrange(len(p) // 2, len(p) + 1)
    o = rng.randrange(100000, len(text) - 400)
    sampled = rng.random() < 0.3
    reqs.append(dict(prompt=p[:cut] + text[o:o + rng.randrange(1, 400)], max_tokens=rng.randrange(8, 80),
                     temperature=0.9 if sampled else 0.0, seed=1000 + i if sampled else None,
                     stream=rng.random() < 0.6, chat=rng.random() < 0.25, leave=rng.random() < 0.2))

fails = 0


def bad(msg):
    global fails
    fails += 1
    print("FAIL:", msg, flush=True)


def metrics(base):
    out = {}
    for line in urllib.request.urlopen(base + "/metrics", timeout=30).read().decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k.split("{")[0] + ("{" + k.split(",", 1)[1] if "," in k else "")] = float(v)
    return out


async def one(cli, r, leave):
    kw = dict(model=model, max_tokens=r["max_tokens"], temperature=r["temperature"])
    if r["seed"] is not None:
        kw["seed"] = r["seed"]
    if r["chat"]:
        kw["messages"] = [{"role": "user", "content": r["prompt"]}]
        create = cli.chat.completions.create
    else:
        kw["prompt"] = r["prompt"]
        create = cli.completions.create
    if not r["stream"]:
        if leave:  # the client gives up while the request waits or runs
            try:
                await asyncio.wait_for(create(**kw), timeout=0.05)
            except (asyncio.TimeoutError, openai.APIError):
                pass
            return None
        res = await create(**kw)
        c = res.choices[0]
        if r["chat"]:
            return getattr(c.message, "reasoning_content", None), c.message.content, c.finish_reason
        return c.text, c.finish_reason
    s = await create(stream=True, **kw)
    out, reasoning, fin, n = [], [], None, 0
    async for ch in s:
        if not ch.choices:
            continue
        c = ch.choices[0]
        out.append((c.delta.content if r["chat"] else c.text) or "")
        if r["chat"]:
            reasoning.append(getattr(c.delta, "reasoning_content", None) or "")
        fin = c.finish_reason or fin
        n += 1
        if leave and n >= 3:  # leaves mid-stream
            await s.close()
            return None
    if r["chat"]:  # the whole answer's form: no reasoning is None, as in a whole response
        return "".join(reasoning) or None, "".join(out) or None, fin
    return "".join(out), fin


async def run(cli, conc, leaving):
    sem = asyncio.Semaphore(conc)

    async def guarded(r):
        async with sem:
            return await one(cli, r, leaving and r["leave"])

    t = time.time()
    res = await asyncio.gather(*[guarded(r) for r in reqs], return_exceptions=True)
    return res, time.time() - t


async def main():
    # one client per server for the whole run: openai 3.63 (httpx2 2.17) hung some requests of a new
    # client when an earlier client, whose kept-alive connections the server had since closed, was
    # garbage-collected during its run (seen here; not with the old clients kept, nor without keep-alive)
    ca = openai.AsyncOpenAI(base_url=url_a + "/v1", api_key="x", max_retries=0, timeout=300)
    cb = openai.AsyncOpenAI(base_url=url_b + "/v1", api_key="x", max_retries=0, timeout=300)
    ref, t = await run(ca, 1, False)
    print(f"A, one at a time: {len(reqs)} requests in {t:.1f} s", flush=True)
    for i, x in enumerate(ref):
        if isinstance(x, Exception) or x is None:
            bad(f"A: request {i}: {x!r}"[:300])
    for rnd in range(rounds):
        m0 = metrics(url_b)
        res, t = await run(cb, 64, True)
        compared = refused = 0
        for i, (a, b) in enumerate(zip(ref, res)):
            if isinstance(b, openai.BadRequestError) and "--kv-cache-memory" in str(b) and "KV blocks" in str(b):
                refused += 1  # more than B's whole pool: a 400 at once (A, with room, answered it)
                continue
            if isinstance(b, Exception):
                bad(f"B round {rnd}: request {i}: {b!r}"[:300])
                continue
            if b is None:
                continue
            compared += 1
            if a != b:
                r = reqs[i]
                bad(f"B round {rnd}: request {i} ({'chat' if r['chat'] else 'completion'}, "
                    f"{'streamed' if r['stream'] else 'whole'}, temperature {r['temperature']}, "
                    f"{len(r['prompt'])} characters) differs from A: {a!r:.100} against {b!r:.100}")
        # B settles: every request ended, every block back (a client's leaving is seen within ~0.2 s)
        for _ in range(100):
            m1 = metrics(url_b)
            if m1["moerun:num_requests_running"] == 0 and m1["moerun:num_requests_waiting"] == 0 and \
                    m1["moerun:kv_cache_used_blocks"] == 0:
                break
            await asyncio.sleep(0.1)
        if m1.get("moerun:kv_cache_total_blocks") != BLOCKS_B:  # (the pool exists from the first step on)
            bad(f"B has {m1.get('moerun:kv_cache_total_blocks')} KV blocks, the test expects {BLOCKS_B}")
        d = {k: m1[k] - m0.get(k, 0) for k in m1}
        pre, hits = d["moerun:num_preemptions_total"], d["moerun:prefix_cache_hits_total"]
        aborts = d['moerun:request_success_total{finished_reason="abort"}']
        print(f"B round {rnd}: {t:.1f} s at 64 at once, {compared} outputs equal to A's of "
              f"{sum(1 for r in reqs if not r['leave'])} kept, {refused} refused as too long, "
              f"{int(pre)} preemptions, {int(hits)} prefix-cache block hits, {int(aborts)} aborted", flush=True)
        if m1["moerun:num_requests_running"] or m1["moerun:num_requests_waiting"] or m1["moerun:kv_cache_used_blocks"]:
            bad(f"B round {rnd}: after the round {m1['moerun:num_requests_running']} running, "
                f"{m1['moerun:num_requests_waiting']} waiting, {m1['moerun:kv_cache_used_blocks']} KV blocks used")
        if pre <= 0 or hits <= 0:
            bad(f"B round {rnd}: the round did not cover preemption ({pre}) and the prefix cache ({hits})")
        if aborts != d["moerun:client_disconnects_total"] or aborts <= 0:
            bad(f"B round {rnd}: {aborts} aborts against {d['moerun:client_disconnects_total']} clients that left")
        kept = sum(1 for r in reqs if not r["leave"])
        if compared + refused != kept:
            bad(f"B round {rnd}: {compared} compared + {refused} refused of {kept} kept requests")
        if refused == 0:
            bad(f"B round {rnd}: no prompt was too long for B's pool (the test's prompts changed?)")
    await ca.close()
    await cb.close()
    sys.exit(1 if fails else 0)


asyncio.run(main())
