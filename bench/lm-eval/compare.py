#!/usr/bin/env python3
"""bench/lm-eval/compare.py HF_OUT SERVED_OUT TOL — the per-choice loglikelihoods of two
lm-evaluation-harness runs (--log_samples) of the same task: transformers in-process and
moerun serve. Prints both accuracies, the largest and mean |difference| and how many
is_greedy flags differ; exits 1 when the largest difference is above TOL (TOL < 0: report only)."""
import glob
import json
import sys


def load(d):
    files = glob.glob(d + "/**/samples_*.jsonl", recursive=True)
    if len(files) != 1:
        sys.exit(f"compare: {len(files)} sample files under {d}")
    out = {}
    for line in open(files[0], encoding="utf-8"):
        s = json.loads(line)
        out[s["doc_id"]] = (s["filtered_resps"], s["acc"])
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
    if a.keys() != b.keys():
        sys.exit("compare: the two runs scored different documents")
    d, greedy = [], 0
    for k in a:
        for x, y in zip(a[k][0], b[k][0]):
            d.append(abs(float(x[0]) - float(y[0])))
            greedy += x[1] != y[1]
    acc = [sum(r[k][1] for k in r) / len(r) for r in (a, b)]
    print(f"accuracy: transformers {acc[0]:.3f}, moerun serve {acc[1]:.3f} ({len(a)} items)")
    print(f"{len(d)} loglikelihoods: max |transformers - moerun| {max(d):.3g}, mean {sum(d) / len(d):.3g}; "
          f"is_greedy differs in {greedy}")
    if tol >= 0 and max(d) > tol:
        print(f"FAIL: above the tolerance {tol}")
        sys.exit(1)


main()
