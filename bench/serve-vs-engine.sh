#!/usr/bin/env bash
# bench/serve-vs-engine.sh MODEL TAG [CONCURRENCIES] — the serving targets of
# bench/README.md on one checkpoint, in one run, interleaved:
#   1. `moerun bench engine` decode tokens/s at B = each concurrency (the
#      engine's prediction for a batch of that size, no HTTP);
#   2. `moerun serve` + `moerun bench serve` at the same concurrencies
#      (completions, token-id prompts of IN tokens, OUT output tokens,
#      ignore_eos, temperature 0, 4 x C requests, at least 4);
#   3. for the TTFT target at concurrency 1: the server's own mean time to
#      first token over the C = 1 run (/metrics; the engine is otherwise idle,
#      so it is the prefill step of one prompt plus its queueing), against
#      the client's TTFT p50: what HTTP, tokenizing and streaming add;
# ROUNDS times (default 2), then prints per concurrency the served output tok/s
# against the engine's decode tok/s (target >= 85%) and TTFT p50 at C = 1
# against prefill + 10 ms. JSON to bench/results/serve_<TAG>_*.json.
# Environment: MOERUN (build/moerun), IN (32), OUT (128), ROUNDS (2), EXTRA
# (resolver options for both, e.g. "--threads 2").
# Heavy: run it under `flock /tmp/moerun-heavy.lock` on a shared machine.
set -u
MODEL=$1; TAG=$2; CONC=${3:-1,16,64,128}
M=${MOERUN:-build/moerun}
IN=${IN:-32}; OUT=${OUT:-128}; ROUNDS=${ROUNDS:-2}; EXTRA=${EXTRA:-}
R=bench/results
mkdir -p "$R"
maxc=$(echo "$CONC" | tr ',' '\n' | sort -n | tail -1)
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$MODEL/config.json" | head -1)
[ -n "$vocab" ] || { echo "no vocab_size in $MODEL/config.json"; exit 2; }
[ "$vocab" -gt 4096 ] && vocab=4096 # ids a tokenizer knows (the trained model's, or any of a random checkpoint)
ctx=$((IN + OUT + 16))
for r in $(seq 1 "$ROUNDS"); do
    echo "=== round $r: engine"
    "$M" bench engine --model "$MODEL" --batch "$CONC" --prompt "$IN" --steps 16 --rounds 2 $EXTRA \
        --json "$R/serve_${TAG}_engine_$r.json" | tail -n +1 | grep -E "^ *B|decode|tok/s" | head -20
    echo "=== round $r: serve"
    log=$(mktemp)
    "$M" serve --model "$MODEL" --port 0 --max-running-requests "$maxc" --context-length "$ctx" --skip-self-check \
        $EXTRA >"$log" 2>&1 &
    pid=$!
    for i in $(seq 1 600); do grep -q "ready on" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
    grep -q "ready on" "$log" || { cat "$log"; kill $pid 2>/dev/null; exit 1; }
    port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$log" | head -1)
    for c in $(echo "$CONC" | tr ',' ' '); do
        n=$((4 * c)); [ $n -lt 4 ] && n=4
        "$M" bench serve --base-url "http://127.0.0.1:$port" --concurrency "$c" --num-prompts "$n" --input-len "$IN" \
            --output-len "$OUT" --vocab "$vocab" --json "$R/serve_${TAG}_c${c}_$r.json" | \
            grep -E "Output token throughput|Median TTFT|Median ITL|Failed requests"
    done
    kill -TERM $pid; wait $pid
    rm -f "$log"
done
echo "=== summary (served output tok/s / engine decode tok/s at B = C; TTFT p50 at C = 1 vs the server's own TTFT + 10 ms)"
for c in $(echo "$CONC" | tr ',' ' '); do
    for r in $(seq 1 "$ROUNDS"); do
        e=$(jq --argjson b "$c" '.results[] | select(.B == $b) | .decode_tok_per_s' "$R/serve_${TAG}_engine_$r.json")
        s=$(jq '.results[0].output_throughput' "$R/serve_${TAG}_c${c}_$r.json")
        t=$(jq '.results[0].median_ttft_ms' "$R/serve_${TAG}_c${c}_$r.json")
        pf=$(jq '.results[0].server_counters_delta.mean_ttft_ms' "$R/serve_${TAG}_c${c}_$r.json")
        awk -v c="$c" -v r="$r" -v e="$e" -v s="$s" -v t="$t" -v pf="$pf" 'BEGIN {
            printf "C %4d round %d: served %9.1f tok/s, engine %9.1f tok/s, ratio %5.1f%%", c, r, s, e, 100 * s / e;
            if (c == 1) printf "; TTFT p50 %.2f ms vs the server'"'"'s %.2f ms + 10 (%s)", t, pf, t <= pf + 10 ? "met" : "NOT met";
            printf "\n" }'
    done
done
