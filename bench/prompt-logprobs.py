#!/usr/bin/env python3
"""bench/prompt-logprobs.py URL N L C — scoring throughput of `moerun serve` (or any
OpenAI-compatible server): N completions requests of L random token ids each, C at a
time, once as plain prefill (max_tokens 1) and once as lm-evaluation-harness's
loglikelihood request (max_tokens 1, echo, logprobs 1: every prompt token's
log-probability), interleaved for ROUNDS (env, 3) rounds. The prompts differ per round
and mode, so that the prefix cache serves neither. Prints requests/s and prompt
tokens/s per run and the ratio echo / plain. Standard library only."""
import json
import os
import random
import sys
import threading
import time
import urllib.request


def run(url, prompts, echo, conc):
    lock, nxt, done = threading.Lock(), [0], [0]
    errors = []

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(prompts) or errors:
                return
            body = {"prompt": prompts[i], "max_tokens": 1, "temperature": 0}
            if echo:
                body.update(echo=True, logprobs=1)
            rq = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                        headers={"Content-Type": "application/json"})
            try:
                r = json.loads(urllib.request.urlopen(rq, timeout=600).read())
                if echo and len(r["choices"][0]["logprobs"]["token_logprobs"]) != len(prompts[i]) + 1:
                    raise ValueError("wrong number of logprobs")
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))
                return
            with lock:
                done[0] += 1

    t = time.time()
    th = [threading.Thread(target=worker) for _ in range(conc)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    if errors:
        sys.exit(f"prompt-logprobs: a request failed: {errors[0]}")
    return time.time() - t


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    url, n, L, conc = sys.argv[1].rstrip("/"), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    vocab = 1000  # ids 3 .. 999: inside every vocabulary this project serves
    rng = random.Random(5)
    ratios = []
    for rnd in range(int(os.environ.get("ROUNDS", "3"))):
        res = {}
        for mode in ("plain", "echo"):
            prompts = [[rng.randrange(3, vocab) for _ in range(L)] for _ in range(n)]
            dt = run(url, prompts, mode == "echo", conc)
            res[mode] = dt
            print(f"round {rnd + 1} {mode:5s}: {n} requests of {L} tokens at C={conc}: {dt:.2f} s, "
                  f"{n / dt:.1f} req/s, {n * L / dt:.0f} prompt tok/s", flush=True)
        ratios.append(res["plain"] / res["echo"])
    print(f"echo+logprobs / plain prefill throughput: {min(ratios):.2f}-{max(ratios):.2f}")


main()
