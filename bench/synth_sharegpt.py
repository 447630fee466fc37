#!/usr/bin/env python3
"""bench/synth_sharegpt.py TEXT OUT.json [N] [PROMPT_MEDIAN] [OUTPUT_MEDIAN] [SEED] — a ShareGPT-shaped file
for `moerun bench serve --dataset-name sharegpt` on a host that cannot download ShareGPT: N conversations
(default 2000) of two turns, each a passage of TEXT's words (e.g. models/tiny-kjv/valid.txt) whose length in
words is drawn from a log-normal of the given median (default 40 and 48 words; sigma 0.9 and 0.8), capped
at 700 words. Synthetic: the lengths vary as a chat workload's do, but they are not ShareGPT's, and numbers
measured on it are labelled as such (bench/README.md)."""
import json
import math
import random
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    text, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    pm = float(sys.argv[4]) if len(sys.argv) > 4 else 40
    om = float(sys.argv[5]) if len(sys.argv) > 5 else 48
    rng = random.Random(int(sys.argv[6]) if len(sys.argv) > 6 else 1)
    words = open(text, encoding="utf-8").read().split()
    if len(words) < 800:
        sys.exit(f"synth_sharegpt: {text} has {len(words)} words; 800 or more are needed")

    def passage(median, sigma):
        k = max(2, min(700, int(rng.lognormvariate(math.log(median), sigma))))
        i = rng.randrange(0, len(words) - k)
        return " ".join(words[i:i + k])

    rows = [{"id": f"synth-{i}", "conversations": [{"from": "human", "value": passage(pm, 0.9)},
                                                    {"from": "gpt", "value": passage(om, 0.8)}]} for i in range(n)]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False)
    print(f"{out}: {n} conversations, prompt median {pm:g} words, output median {om:g} words")


if __name__ == "__main__":
    main()
