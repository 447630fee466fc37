#!/usr/bin/env bash
# fuzz.sh SECONDS — build the libFuzzer targets with clang and run each for a
# bounded time on its seed corpus (tests/fuzz/corpus/<target>). A crash, a leak, or one
# input running past 60 s (a hang) fails.
set -euo pipefail
SECS=${1:-60}
if [ ! -d tests/fuzz ]; then echo "fuzz: no fuzz targets"; exit 0; fi
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DMOERUN_FUZZ=ON -DMOERUN_TESTS=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target fuzz_targets
for t in build-fuzz/tests/fuzz/fuzz_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  corpus_src="tests/fuzz/corpus/${name#fuzz_}"
  work=$(mktemp -d)
  [ -d "$corpus_src" ] && cp -r "$corpus_src"/. "$work"/
  echo "fuzz: $name for ${SECS}s"
  log="$work.log"
  if ! "$t" -max_total_time="$SECS" -timeout=60 -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 "$work" >"$log" 2>&1; then
    # a crash: the whole report (its stack, the sanitizer's summary) and the unit, to replay with "$t" FILE
    grep -v -e '^#[0-9]*[[:space:]]*\(NEW\|REDUCE\|pulse\|INITED\|RELOAD\)' "$log" | tail -80
    for u in crash-* leak-* timeout-* oom-*; do [ -f "$u" ] && { echo "fuzz: unit $u (base64):"; base64 -w0 "$u" | head -c 16384; echo; }; done
    rm -rf "$work" "$log"
    exit 1
  fi
  tail -15 "$log"
  rm -rf "$work" "$log"
done
