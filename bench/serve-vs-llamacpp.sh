#!/usr/bin/env bash
# bench/serve-vs-llamacpp.sh MODEL_DIR MODEL.gguf TAG [CONCURRENCIES] — moerun
# serve beside llama.cpp's server on the same model, with the same client:
# llama-cpp-python's OpenAI server (`python -m llama_cpp.server`, llama.cpp
# built by bench/peers/llamacpp_setup.sh) on MODEL.gguf, and `moerun serve` on
# MODEL_DIR, both with the same threads. MODEL.gguf must tokenize as
# MODEL_DIR does (bench/peers/gguf_tokenizer.py gives a converted GGUF file
# MODEL_DIR's tokenizer.json; bench/peers/pad_tokenizer.py first gives every
# id of the model's vocabulary a text, so that each generated token is one
# streamed event with text on both servers).
#
# One server runs at a time (the two real-shape checkpoints do not fit in
# memory together on a small host): per round, each server is started, runs
# every concurrency C, and is stopped; the order alternates between rounds.
# At each C: `moerun bench serve` with max(C, 4) requests of IN-token text
# prompts (the client decodes random ids of MODEL_DIR's tokenizer), OUT output
# tokens, temperature 0, ignore_eos (moerun; llama-cpp-python has no such
# field: an EOS ends its answer early, which the token counts show), stream.
# Prints output tok/s of both and the ratio (target >= 3x at C >= 16).
#
# llama-cpp-python's server runs one request at a time (one Llama object
# behind a lock). By default it also ends a streaming answer as soon as
# another request waits (--interrupt_requests True), which at C > 1 would
# cut every answer short: it runs with --interrupt_requests False.
# llama-cpp-python sends no usage chunk: its output is counted one token per
# event with text (it sends one event per token).
# With LLAMA_SERVER=path (bench/peers/llamacpp_setup.sh server builds
# $PEERS/llama-server/bin/llama-server) the peer is llama.cpp's own C++
# server instead: --parallel max(C) slots with continuous batching (its
# default), a context of max(C) x the per-request context (it splits the
# context among the slots), -t / -tb THREADS, no web UI. It takes ignore_eos
# and sends a usage chunk, as moerun does. MOERUN_CPU_MASK=avx512 with
# LLAMA_SERVER=$PEERS/llama-server-avx2/bin/llama-server (llamacpp_setup.sh
# server-avx2) puts the two AVX2 builds side by side on an AVX-512 host.
# GSP_LEN=P GSP_GROUPS=G give every prompt one of G shared P-token prefixes
# (bench serve's --gsp-system-prompt-len / --gsp-num-groups, sglang's
# generated-shared-prefix workload: a system prompt per group) before its IN
# tokens; NPROMPTS=K sends K x max(C, 4) requests per C, so that later waves
# can reuse what earlier ones cached. DATASET=F.json takes ShareGPT-shaped
# conversations instead (bench serve --dataset-name sharegpt, counted with
# MODEL_DIR's tokenizer, rows longer than DATASET_CTX tokens (1024) skipped,
# the same rows for both servers; bench/synth_sharegpt.py makes a synthetic
# one); IN and OUT then do not apply, and DISABLE_EOS=1 lets answers end at EOS.
# Environment: MOERUN (build/moerun), PEER_PY (the peer venv's python,
# $PEERS/venv-native/bin/python), LLAMA_SERVER (unset: llama-cpp-python's
# server), THREADS (2), IN (32), OUT (32), ROUNDS (2), GSP_LEN (0), GSP_GROUPS
# (1), NPROMPTS (1), DATASET (none), DATASET_CTX (1024), DISABLE_EOS (0).
# JSON to bench/results/peer_<TAG>_*.json. Heavy: run it under
# `flock /tmp/moerun-heavy.lock`.
set -u
DIR=$1; GGUF=$2; TAG=$3; CONC=${4:-1,16,64,128}
M=${MOERUN:-build/moerun}
PEERS=${PEERS:-build/peers}
PY=${PEER_PY:-$PEERS/venv-native/bin/python}
LS=${LLAMA_SERVER:-}
[ -z "$LS" ] || [ -x "$LS" ] || { echo "serve-vs-llamacpp: LLAMA_SERVER=$LS is not an executable" >&2; exit 2; }
# the peer tokenizes the text prompts with the GGUF's tokenizer (llama-server aborts at the first request
# to a GGUF without one; bench/peers/gguf_tokenizer.py adds it): checked before anything starts
python3 - "$(dirname "$0")/peers" "$GGUF" <<'EOF_PY' || exit 2
import sys
sys.path.insert(0, sys.argv[1])
from llamacpp_bench import gguf_tokenizer_problem
why = gguf_tokenizer_problem(sys.argv[2])
if why:
    sys.exit(f"serve-vs-llamacpp: {why}")
EOF_PY
THREADS=${THREADS:-2}; IN=${IN:-32}; OUT=${OUT:-32}; ROUNDS=${ROUNDS:-2}
GSP_LEN=${GSP_LEN:-0}; GSP_GROUPS=${GSP_GROUPS:-1}; NPROMPTS=${NPROMPTS:-1}
DATASET=${DATASET:-}; DATASET_CTX=${DATASET_CTX:-1024}
gsp=()
[ "$GSP_LEN" -gt 0 ] && gsp=(--gsp-system-prompt-len "$GSP_LEN" --gsp-num-groups "$GSP_GROUPS")
[ -z "$DATASET" ] || [ -f "$DATASET" ] || { echo "serve-vs-llamacpp: DATASET=$DATASET is not a file" >&2; exit 2; }
eos=()
[ "${DISABLE_EOS:-0}" = 1 ] && eos=(--disable-ignore-eos)
R=bench/results
mkdir -p "$R"
maxc=$(echo "$CONC" | tr ',' '\n' | sort -n | tail -1)
ids=$(jq '[.model.vocab[]] | max + 1' "$DIR/tokenizer.json")
[ "$ids" -gt 4096 ] && ids=4096 # prompts from the trained part of a padded vocabulary
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null' EXIT
log=$(mktemp)
ctx=$(((GSP_LEN + IN) * 4 + OUT + 64))
[ -n "$DATASET" ] && ctx=$((DATASET_CTX + 64))

start() { # who: sets pid, port
    if [ "$1" = moerun ]; then
        "$M" serve --model "$DIR" --port 0 --threads "$THREADS" --max-running-requests "$maxc" --context-length "$ctx" \
            --skip-self-check >"$log" 2>&1 &
        pid=$!
        for _ in $(seq 1 1500); do grep -q "ready on" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
        grep -q "ready on" "$log" || { cat "$log"; exit 1; }
        port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$log" | head -1)
    else
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        if [ -n "$LS" ]; then
            "$LS" --model "$GGUF" --host 127.0.0.1 --port "$port" -t "$THREADS" -tb "$THREADS" --parallel "$maxc" \
                -c $((ctx * maxc)) --no-webui >"$log" 2>&1 &
        else
        "$PY" -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port "$port" --n_threads "$THREADS" \
            --n_threads_batch "$THREADS" --n_ctx "$ctx" --interrupt_requests False --verbose False >"$log" 2>&1 &
        fi
        pid=$!
        local ready=/v1/models
        [ -n "$LS" ] && ready=/health # 503 until its model is loaded
        for _ in $(seq 1 1500); do curl -sf "127.0.0.1:$port$ready" >/dev/null 2>&1 && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
        curl -sf "127.0.0.1:$port$ready" >/dev/null || { cat "$log"; exit 1; }
    fi
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null; pid=; }

echo "moerun: $("$M" version | head -1)"
if [ -n "$LS" ]; then
    echo "peer: llama.cpp llama-server ($LS): $("$LS" --version 2>&1 | grep -m1 '^version'), --parallel $maxc"
else
    echo "peer: llama-cpp-python $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)') (python -m llama_cpp.server), $("$PY" -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode())' | tr -s ' ' | cut -c1-160)"
fi
if [ -n "$DATASET" ]; then
    echo "dataset $DATASET (rows of at most $DATASET_CTX tokens), threads $THREADS, $NPROMPTS x max(C, 4) requests per C${eos:+, answers may end at EOS}"
else
    echo "IN $IN, OUT $OUT, threads $THREADS, $NPROMPTS x max(C, 4) requests per C, shared prefixes: $GSP_GROUPS x $GSP_LEN tokens"
fi
for r in $(seq 1 "$ROUNDS"); do
    order="moerun llamacpp"; [ $((r % 2)) = 0 ] && order="llamacpp moerun"
    for who in $order; do
        start "$who"
        for c in $(echo "$CONC" | tr ',' ' '); do
            n=$c; [ "$n" -lt 4 ] && n=4
            n=$((n * NPROMPTS))
            if [ -n "$DATASET" ]; then
                prompts=(--dataset-name sharegpt --dataset-path "$DATASET" --sharegpt-context-len "$DATASET_CTX")
            else
                prompts=(--input-len "$IN" --output-len "$OUT" --text-prompts --vocab "$ids" "${gsp[@]}")
            fi
            "$M" bench serve --base-url "http://127.0.0.1:$port" --concurrency "$c" --num-prompts "$n" "${prompts[@]}" \
                --tokenizer "$DIR" --seed "$r" "${eos[@]}" \
                --json "$R/peer_${TAG}_${who}_c${c}_$r.json" >"$log.out" 2>&1 || { echo "$who C=$c failed:"; tail -5 "$log.out"; }
            echo "round $r C $c $who: $(grep -E 'Output token throughput' "$log.out" | awk '{print $NF}') tok/s, $(grep 'Total generated tokens:' "$log.out" | awk '{print $NF}') tokens, TTFT p50 $(grep 'Median TTFT' "$log.out" | awk '{print $NF}') ms, ITL p50 $(grep 'Median ITL' "$log.out" | awk '{print $NF}') ms"
        done
        stop
    done
done
echo "=== output tok/s, moerun / llama.cpp (target >= 3x at C >= 16)"
for c in $(echo "$CONC" | tr ',' ' '); do
    for r in $(seq 1 "$ROUNDS"); do
        a=$(jq '.results[0].output_throughput' "$R/peer_${TAG}_moerun_c${c}_$r.json")
        b=$(jq '.results[0].output_throughput' "$R/peer_${TAG}_llamacpp_c${c}_$r.json")
        awk -v c="$c" -v r="$r" -v a="$a" -v b="$b" 'BEGIN { printf "C %4d round %d: moerun %9.1f, llama.cpp %9.1f tok/s: %.2fx\n", c, r, a, b, a / b }'
    done
done
rm -f "$log" "$log.out"
