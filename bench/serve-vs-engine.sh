#!/usr/bin/env bash
# bench/serve-vs-engine.sh MODEL TAG [CONCURRENCIES] — the serving targets of
# bench/README.md on one checkpoint, in one run, interleaved:
#   1. `moerun bench engine` at B = each concurrency (no HTTP), twice: the
#      prefill time of B prompts of IN tokens (--prompt IN), and the decode
#      step time at the served run's mean context, IN + OUT / 2 (--prompt
#      IN + OUT / 2 - 11: the bench's own warm-up and timed steps add about
#      11 positions; attention grows with the context, and on a small model
#      it is a large part of the step);
#   2. `moerun serve` + `moerun bench serve` at the same concurrencies
#      (completions, token-id prompts of IN tokens, OUT output tokens,
#      ignore_eos, temperature 0, WAVES x C requests, at least 4).
# The engine's prediction for the served run: all requests have the same
# lengths and start together, so the C running requests finish together and
# the run is WAVES waves of (the prefill of C prompts, each sampling its first
# token, then the remaining OUT - 1 decode steps at B = C, less those the
# requests prefilled first already ran while the others were prefilled):
#   predicted tok/s = C x OUT / (prefill_ms + steps_left x step_ms).
# The TTFT target at C = 1: the client's TTFT p50 against the engine's prefill
# time of one prompt + 10 ms (and the server's own mean TTFT from /metrics,
# which is that prefill plus the engine thread's queueing).
# ROUNDS times (default 2), then prints per concurrency and round the served
# output tok/s against the prediction (target >= 85%) and the plain decode
# tok/s at B = C. JSON to bench/results/serve_<TAG>_*.json.
# PERC=1 interleaves per concurrency instead of per round: the server is up
# for the whole round (idle, it takes no CPU) and each C runs the engine's
# two benches and then the served run back to back, so a host whose speed
# drifts over minutes moves the prediction and the served run together; it
# holds the model twice in memory (the server's and the bench's).
# Environment: MOERUN (build/moerun), IN (32), OUT (128), WAVES (4), ROUNDS
# (2), EXTRA (resolver options for both, e.g. "--threads 2"), PERC (0).
# Heavy: run it under `flock /tmp/moerun-heavy.lock` on a shared machine.
set -u
MODEL=$1; TAG=$2; CONC=${3:-1,16,64,128}
M=${MOERUN:-build/moerun}
IN=${IN:-32}; OUT=${OUT:-128}; WAVES=${WAVES:-4}; ROUNDS=${ROUNDS:-2}; EXTRA=${EXTRA:-}
R=bench/results
mkdir -p "$R"
maxc=$(echo "$CONC" | tr ',' '\n' | sort -n | tail -1)
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$MODEL/config.json" | head -1)
[ -n "$vocab" ] || { echo "no vocab_size in $MODEL/config.json"; exit 2; }
[ "$vocab" -gt 4096 ] && vocab=4096 # ids a tokenizer knows (the trained model's, or any of a random checkpoint)
ctx=$((IN + OUT + 16))
ectx=$((IN + OUT / 2 - 11)); [ $ectx -lt "$IN" ] && ectx=$IN
PERC=${PERC:-0}
engine() { # round, concurrencies, json suffix
    "$M" bench engine --model "$MODEL" --batch "$2" --prompt "$IN" --warmup 1 --steps 2 --rounds 3 $EXTRA \
        --json "$R/serve_${TAG}_prefill_$1$3.json" | grep -E "prefill of"
    "$M" bench engine --model "$MODEL" --batch "$2" --prompt "$ectx" --steps 16 --rounds 3 $EXTRA \
        --json "$R/serve_${TAG}_engine_$1$3.json" | grep -E "^ *[0-9]+ |^ *B |ceiling"
}
served() { # round, concurrency
    local n=$((WAVES * $2)); [ $n -lt 4 ] && n=4
    "$M" bench serve --base-url "http://127.0.0.1:$port" --concurrency "$2" --num-prompts "$n" --input-len "$IN" \
        --output-len "$OUT" --vocab "$vocab" --json "$R/serve_${TAG}_c$2_$1.json" | \
        grep -E "Output token throughput|Median TTFT|Median ITL|Failed requests"
}
for r in $(seq 1 "$ROUNDS"); do
    if [ "$PERC" != 1 ]; then echo "=== round $r: engine"; engine "$r" "$CONC" ""; fi
    echo "=== round $r: serve"
    log=$(mktemp)
    "$M" serve --model "$MODEL" --port 0 --max-running-requests "$maxc" --context-length "$ctx" --skip-self-check \
        $EXTRA >"$log" 2>&1 &
    pid=$!
    for i in $(seq 1 600); do grep -q "ready on" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
    grep -q "ready on" "$log" || { cat "$log"; kill $pid 2>/dev/null; exit 1; }
    port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$log" | head -1)
    for c in $(echo "$CONC" | tr ',' ' '); do
        if [ "$PERC" = 1 ]; then echo "=== round $r, C $c: engine, then served"; engine "$r" "$c" "_c$c"; fi
        served "$r" "$c"
    done
    kill -TERM $pid; wait $pid
    rm -f "$log"
    if [ "$PERC" = 1 ]; then # one file per round and bench, as without PERC
        for b in prefill engine; do
            jq -s '.[0] + {results: [.[].results[]]}' $(for c in $(echo "$CONC" | tr ',' ' '); do echo "$R/serve_${TAG}_${b}_${r}_c$c.json"; done) \
                >"$R/serve_${TAG}_${b}_$r.json.tmp" && mv "$R/serve_${TAG}_${b}_$r.json.tmp" "$R/serve_${TAG}_${b}_$r.json"
            for c in $(echo "$CONC" | tr ',' ' '); do rm -f "$R/serve_${TAG}_${b}_${r}_c$c.json"; done
        done
    fi
done
echo "=== summary (IN $IN, OUT $OUT, WAVES x C requests; served output tok/s / the engine's prediction, target >= 85%;"
echo "    TTFT p50 at C = 1 against the engine's prefill of one prompt + 10 ms)"
for c in $(echo "$CONC" | tr ',' ' '); do
    for r in $(seq 1 "$ROUNDS"); do
        ej=$(jq -c --argjson b "$c" '.results[] | select(.B == $b)' "$R/serve_${TAG}_engine_$r.json")
        pj=$(jq -c --argjson b "$c" '.results[] | select(.B == $b)' "$R/serve_${TAG}_prefill_$r.json")
        e=$(echo "$ej" | jq .decode_tok_per_s); pf=$(echo "$pj" | jq .prefill_ms); pd=$(echo "$pj" | jq .prefill_decode_tokens)
        s=$(jq '.results[0].output_throughput' "$R/serve_${TAG}_c${c}_$r.json")
        t=$(jq '.results[0].median_ttft_ms' "$R/serve_${TAG}_c${c}_$r.json")
        st=$(jq '.results[0].server_counters_delta.mean_ttft_ms // "null"' "$R/serve_${TAG}_c${c}_$r.json")
        awk -v c="$c" -v r="$r" -v e="$e" -v s="$s" -v t="$t" -v pf="$pf" -v pd="$pd" -v out="$OUT" -v st="$st" 'BEGIN {
            step = 1000 * c / e; left = out - 1 - pd / c; if (left < 0) left = 0;
            pred = c * out / ((pf + left * step) / 1000);
            printf "C %4d round %d: served %9.1f tok/s, predicted %9.1f (prefill %.1f ms + %.1f steps x %.2f ms; decode alone %.1f tok/s): %5.1f%% (%s)",
                   c, r, s, pred, pf, left, step, e, 100 * s / pred, (s >= 0.85 * pred) ? "met" : "NOT met";
            if (c == 1) printf "; TTFT p50 %.2f ms vs prefill %.2f ms + 10 (%s), server TTFT %s ms", t, pf, (t <= pf + 10) ? "met" : "NOT met", st;
            printf "\n" }'
    done
done
