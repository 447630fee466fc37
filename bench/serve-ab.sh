#!/usr/bin/env bash
# bench/serve-ab.sh MODEL C N ROUNDS BINARY... — served output tok/s of several
# moerun builds on one model, interleaved: per round, each BINARY in turn starts
# `serve` on a free loopback port, its own `bench serve` runs N requests at
# concurrency C (IN-token id prompts, OUT output tokens, ignore_eos), and the
# server is stopped. Prints every reading, then per binary the mean and all
# readings. For A/B runs of a server change (build the old tree into another
# folder, or copy its build/moerun aside); the host's drift reaches both alike.
# Environment: IN (32), OUT (128), EXTRA (options for serve, e.g. "--threads 2").
# Heavy: run it under `flock /tmp/moerun-heavy.lock` on a shared machine.
set -u
[ $# -ge 5 ] || { sed -n '2,10p' "$0"; exit 2; }
MODEL=$1; C=$2; N=$3; ROUNDS=$4; shift 4
IN=${IN:-32}; OUT=${OUT:-128}; EXTRA=${EXTRA:-}
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$MODEL/config.json" | head -1)
[ -n "$vocab" ] || { echo "no vocab_size in $MODEL/config.json"; exit 2; }
[ "$vocab" -gt 4096 ] && vocab=4096
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for r in $(seq 1 "$ROUNDS"); do
    for b in "$@"; do
        "$b" serve --model "$MODEL" --port 0 --max-running-requests "$C" --context-length $((IN + OUT + 16)) \
            --skip-self-check $EXTRA >"$log" 2>&1 &
        pid=$!
        for i in $(seq 1 600); do grep -q "ready on" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
        grep -q "ready on" "$log" || { cat "$log"; kill $pid 2>/dev/null; exit 1; }
        port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$log" | head -1)
        tps=$("$b" bench serve --base-url "http://127.0.0.1:$port" --concurrency "$C" --num-prompts "$N" \
                  --input-len "$IN" --output-len "$OUT" --vocab "$vocab" | sed -n 's/^Output token throughput[^0-9]*\([0-9.]*\).*/\1/p')
        kill -TERM $pid
        wait $pid
        echo "round $r $b ${tps:-failed}"
    done
done | awk '{ print; if ($4 != "failed") { s[$3] += $4; n[$3]++; v[$3] = v[$3] " " $4 } }
            END { for (k in s) printf "%s: mean %.1f tok/s over %d (%s)\n", k, s[k] / n[k], n[k], v[k] }'
