#!/usr/bin/env bash
# bench/run-all.sh — the whole `bench moe` measurement set (bench/README.md), one command:
# for every weight format and activation mode of the routed runner,
#   1. the standard run: T = 1, 8, 32, 512, 2048, 2 threads, 1-thread scaling, phases;
#   2. REPEAT interleaved-isolation runs at T = 1, 8, 32 (probe / call / stream-only rounds).
# JSON goes to $OUT (default bench/results): moe_<format>_<mode>.json and
# moe_<format>_<mode>_isolate[_<r>].json. Text output goes to stdout.
# Environment: MOERUN (default build/moerun), OUT, REPEAT (default 1),
# ONLY=isolate|standard to run one half. About 4 minutes per repeat of the
# isolation half and 5 minutes for the standard half on a 2-core host.
set -eu
M=${MOERUN:-build/moerun}
OUT=${OUT:-bench/results}
N=${REPEAT:-1}
ONLY=${ONLY:-}
[ -x "$M" ] || { echo "bench/run-all.sh: no moerun binary at $M (run make, or set MOERUN)" >&2; exit 2; }
mkdir -p "$OUT"
for fa in "fp8 w8a8" "fp8 w8a16" "nvfp4 w4a4" "nvfp4 w4a8" "nvfp4 w4a16" "bf16 w16a16"; do
  set -- $fa
  if [ "$ONLY" != isolate ]; then
    "$M" bench moe --format "$1" --act-mode "$2" --tokens 1,8,32,512,2048 --iters 7 --threads 2 --scaling --phases \
      --json "$OUT/moe_$1_$2.json"
  fi
  if [ "$ONLY" != standard ]; then
    for r in $(seq 1 "$N"); do
      sfx=""; [ "$N" -gt 1 ] && sfx="_$r"
      "$M" bench moe --format "$1" --act-mode "$2" --tokens 1,8,32 --iters 15 --threads 2 --isolate \
        --json "$OUT/moe_$1_$2_isolate$sfx.json"
    done
  fi
done
