#!/usr/bin/env python3
"""bench/lm-eval/make_task.py TEXT OUT_DIR N — a local lm-evaluation-harness multiple-choice
task from held-out text (a model folder's valid.txt): N lines of 14 words or more; the
context is a line's start, the right answer its next four words, three distractors four
words of other lines (seed 7). Writes OUT_DIR/items.jsonl and OUT_DIR/kjv_next_words.yaml.
Standard library only."""
import json
import os
import random
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lines = [l.strip() for l in open(src, encoding="utf-8") if len(l.split()) >= 14]
    if len(lines) < n:
        sys.exit(f"make_task: {src} has {len(lines)} lines of 14 words or more; {n} asked")
    rng = random.Random(7)
    items = []
    for v in rng.sample(lines, n):
        w = v.split()
        cut = rng.randrange(6, len(w) - 4)
        ctx, ans = " ".join(w[:cut]), " " + " ".join(w[cut:cut + 4])
        others = []
        while len(others) < 3:
            o = rng.choice(lines).split()
            c = rng.randrange(2, len(o) - 4)
            s = " " + " ".join(o[c:c + 4])
            if s != ans and s not in others:
                others.append(s)
        choices = others + [ans]
        rng.shuffle(choices)
        items.append({"context": ctx, "choices": choices, "label": choices.index(ans)})
    os.makedirs(out, exist_ok=True)
    data = os.path.abspath(os.path.join(out, "items.jsonl"))
    with open(data, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")
    with open(os.path.join(out, "kjv_next_words.yaml"), "w", encoding="utf-8") as f:
        f.write("task: kjv_next_words\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\n"
                'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: label\n'
                'target_delimiter: ""\nmetric_list:\n  - metric: acc\n')


main()
