#!/usr/bin/env python3
"""serve-apis.py URL [C] [N] [ROUNDS] -- the same streamed answers through the three chat-shaped APIs of
`moerun serve`, interleaved: /v1/chat/completions, /v1/responses (OpenAI's Responses API) and /v1/messages
(Anthropic's). N requests of 128 output tokens (ignore_eos, temperature 0) at concurrency C per API and
round; prints output tok/s per API and round. Standard library only (threads and http.client), so the
client's cost is the same for the three."""
import http.client
import json
import sys
import threading
import time
from urllib.parse import urlparse

url = urlparse(sys.argv[1])
C = int(sys.argv[2]) if len(sys.argv) > 2 else 16
N = int(sys.argv[3]) if len(sys.argv) > 3 else 64
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 4
OUT = 128


def one(path, body, out):
    hc = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
    hc.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = hc.getresponse()
    data = r.read()
    hc.close()
    out.append((r.status, data.count(b"\n\n")))


def run(path, body):
    out, sem, threads = [], threading.Semaphore(C), []

    def worker():
        with sem:
            one(path, body, out)
    t0 = time.time()
    for _ in range(N):
        t = threading.Thread(target=worker)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    wall = time.time() - t0
    bad = [o for o in out if o[0] != 200 or o[1] < OUT * 3 // 4]
    if bad:
        sys.exit(f"serve-apis: {path}: {len(bad)} answers failed or were short: {bad[:3]}")
    return N * OUT / wall


msgs = [{"role": "user", "content": "In the beginning"}]
apis = {"chat": ("/v1/chat/completions", {"messages": msgs, "max_tokens": OUT}),
        "responses": ("/v1/responses", {"input": msgs, "max_output_tokens": OUT}),
        "messages": ("/v1/messages", {"messages": msgs, "max_tokens": OUT})}
for _, b in apis.values():
    b.update(ignore_eos=True, stream=True, temperature=0)
run(*apis["chat"])  # warm-up
res = {k: [] for k in apis}
for _ in range(ROUNDS):
    for k, (p, b) in apis.items():
        res[k].append(run(p, b))
print(f"C = {C}, {N} requests x {OUT} tokens per API and round, output tok/s:")
for k, v in res.items():
    print(f"  {k:10s} " + " ".join(f"{x:8.0f}" for x in v) + f"   (min {min(v):.0f}, max {max(v):.0f})")
