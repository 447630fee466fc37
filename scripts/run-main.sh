#!/usr/bin/env bash
# run-main.sh — the main job of `make run`, on the trained default model
# models/tiny-kjv (tools/train_tiny.py: a small MiniMax-M2 trained on the King
# James Bible): a text continuation of a fixed prompt, then a chat answer
# (reasoning, then the answer) through the model's chat template. Each run
# prints the resolution line first, then the text as it is generated, then
# the prefill / decode throughput (tokens/s).
set -euo pipefail
BUILD=${1:-build}
M="$BUILD/moerun"
MODEL="$(cd "$(dirname "$0")/.." && pwd)/models/tiny-kjv"
"$M" version
echo
"$M" generate --model "$MODEL" --prompt "And God said," -n 64 --temperature 0.7 --top-p 0.9 --seed 3
echo
"$M" generate --model "$MODEL" --chat --prompt "Genesis 1:3" -n 64 --temperature 0.5 --seed 1
