#!/usr/bin/env bash
# bench/serve-vs-llamacpp.sh MODEL_DIR MODEL.gguf TAG [CONCURRENCIES] — moerun
# serve beside llama.cpp's server on the same model, with the same client:
# llama-cpp-python's OpenAI server (`python -m llama_cpp.server`, llama.cpp
# built by bench/peers/llamacpp_setup.sh) on MODEL.gguf (made from MODEL_DIR
# by bench/peers/gguf_convert.py + bench/peers/gguf_tokenizer.py, so that
# both tokenize alike), and `moerun serve` on MODEL_DIR; both with the same
# threads. At each concurrency C, interleaved, ROUNDS times: `moerun bench
# serve` with C requests of IN-token text prompts (decoded by the client from
# MODEL_DIR's tokenizer), OUT output tokens, temperature 0. Prints output
# tok/s of both and the ratio (target >= 3x at C >= 16). llama-cpp-python's
# server takes no ignore_eos and sends no usage: its output is counted one
# token per event (it sends one per token) and may end early at an EOS.
# Environment: MOERUN (build/moerun), PEER_PY (the peer venv's python),
# PEER_DEPS (a folder with fastapi / uvicorn / sse-starlette /
# pydantic-settings / starlette-context, put on PYTHONPATH), THREADS (2),
# IN (32), OUT (64), ROUNDS (2). JSON to bench/results/peer_<TAG>_*.json.
set -u
DIR=$1; GGUF=$2; TAG=$3; CONC=${4:-1,16,64,128}
M=${MOERUN:-build/moerun}
PY=${PEER_PY:-build/peers/venv-native/bin/python}
DEPS=${PEER_DEPS:-build/peers/llama-server-deps}
THREADS=${THREADS:-2}; IN=${IN:-32}; OUT=${OUT:-64}; ROUNDS=${ROUNDS:-2}
R=bench/results
mkdir -p "$R"
maxc=$(echo "$CONC" | tr ',' '\n' | sort -n | tail -1)
ids=$(jq '[.model.vocab[]] | max + 1' "$DIR/tokenizer.json")
pids=
trap 'for p in $pids; do kill "$p" 2>/dev/null; done' EXIT
log=$(mktemp)
"$M" serve --model "$DIR" --port 0 --threads "$THREADS" --max-running-requests "$maxc" --context-length $((IN * 4 + OUT + 64)) \
    --skip-self-check >"$log" 2>&1 &
pids="$pids $!"
for i in $(seq 1 600); do grep -q "ready on" "$log" && break; sleep 0.2; done
mport=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$log" | head -1)
lport=$((mport + 1))
PYTHONPATH=$DEPS "$PY" -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port "$lport" --n_threads "$THREADS" \
    --n_ctx $(((IN * 4 + OUT + 64) * maxc)) >"$log.peer" 2>&1 &
pids="$pids $!"
for i in $(seq 1 300); do curl -s "127.0.0.1:$lport/v1/models" >/dev/null 2>&1 && break; sleep 0.2; done
echo "moerun: $("$M" version | head -1); peer: llama-cpp-python $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)') (python -m llama_cpp.server)"
for r in $(seq 1 "$ROUNDS"); do
    for c in $(echo "$CONC" | tr ',' ' '); do
        for who in moerun llamacpp; do
            port=$mport; [ $who = llamacpp ] && port=$lport
            "$M" bench serve --base-url "http://127.0.0.1:$port" --concurrency "$c" --num-prompts "$c" --input-len "$IN" \
                --output-len "$OUT" --text-prompts --tokenizer "$DIR" --vocab "$ids" --seed "$r" \
                --json "$R/peer_${TAG}_${who}_c${c}_$r.json" >"$log.out" 2>&1 || { echo "$who C=$c failed:"; tail -5 "$log.out"; }
            echo "round $r C $c $who: $(grep -E 'Output token throughput' "$log.out" | awk '{print $NF}') tok/s, $(grep 'Total generated tokens:' "$log.out" | awk '{print $NF}') tokens, TTFT p50 $(grep 'Median TTFT' "$log.out" | awk '{print $NF}') ms"
        done
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
rm -f "$log" "$log.peer" "$log.out"
