#!/usr/bin/env bash
# run-main.sh — the main job of `make run`, on the built-in tiny default
# model: writes it with `moerun gen-tiny` into $BUILD/tiny when absent, then
# generates from it (the resolution summary comes first, then the ids and
# the prefill / decode throughput with the time split).
set -euo pipefail
BUILD=${1:-build}
M="$BUILD/moerun"
"$M" version
if [ ! -f "$BUILD/tiny/config.json" ]; then
  "$M" gen-tiny "$BUILD/tiny"
fi
"$M" generate --model "$BUILD/tiny" --prompt-ids 1,2,3,4,5,6,7,8 -n 16 --stats
