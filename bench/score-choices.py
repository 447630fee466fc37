#!/usr/bin/env python3
"""bench/score-choices.py URL N CTX K CH — sglang's frontend `select` against `moerun serve` (or sglang):
N rounds of one CTX-token random context and K choices of CH tokens after it, each round sent as
sglang's RuntimeEndpoint.select sends it (the context alone with max_new_tokens 0, then the K
context + choice prompts as one batch with return_logprob and logprob_start_len = CTX - 2), and
once more with logprob_start_len 0 (every prompt token scored, what a client without a start
position pays: no prefix-cache hit is possible then). Fresh contexts per round and mode, the two
modes interleaved for ROUNDS (env, 3) rounds. Prints choices/s per run, the ratio, and the
cached_tokens the server reported. Standard library only."""
import json
import os
import random
import sys
import time
import urllib.request


def post(url, body):
    rq = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(rq, timeout=600).read())


def run(url, rng, n, ctx, k, ch, from_end):
    cached = 0
    t = time.time()
    for _ in range(n):
        c = [rng.randrange(3, 1000) for _ in range(ctx)]
        choices = [[rng.randrange(3, 1000) for _ in range(ch)] for _ in range(k)]
        if from_end:  # sglang's select: cache the context first
            post(url, {"input_ids": c, "sampling_params": {"max_new_tokens": 0}})
        r = post(url, {"input_ids": [c + x for x in choices], "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                       "return_logprob": True, "logprob_start_len": ctx - 2 if from_end else 0})
        for x in r:
            want = ch + 2 if from_end else ctx + ch
            if len(x["meta_info"]["input_token_logprobs"]) != want:
                sys.exit(f"score-choices: {len(x['meta_info']['input_token_logprobs'])} entries, want {want}")
            cached += x["meta_info"]["cached_tokens"]
    return n * k / (time.time() - t), cached / (n * k)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    url = sys.argv[1].rstrip("/")
    n, ctx, k, ch = (int(a) for a in sys.argv[2:])
    rounds = int(os.environ.get("ROUNDS", "3"))
    rng = random.Random(11)
    ratios = []
    for i in range(rounds):
        a, ca = run(url, rng, n, ctx, k, ch, True)
        b, cb = run(url, rng, n, ctx, k, ch, False)
        ratios.append(a / b)
        print(f"round {i + 1}: from the context's end {a:.2f} choices/s (cached {ca:.0f} tokens a choice), "
              f"whole prompt {b:.2f} choices/s (cached {cb:.0f}); ratio {a / b:.2f}x")
    print(f"ratio over {rounds} rounds: {min(ratios):.2f}-{max(ratios):.2f}x "
          f"({n} contexts of {ctx} tokens x {k} choices of {ch} a run)")


if __name__ == "__main__":
    main()
