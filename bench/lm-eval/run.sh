#!/usr/bin/env bash
# bench/lm-eval/run.sh [MODEL] — lm-evaluation-harness against `moerun serve`, checked against
# transformers. It installs lm-eval[api,hf] (PyPI; with torch and transformers, ~3 GB) into a
# private venv, makes a local multiple-choice task from MODEL/valid.txt (make_task.py), serves
# MODEL on a free loopback port and runs the task twice: through the server (lm-eval's
# local-completions model: its loglikelihood requests are /v1/completions with echo and
# logprobs) and in-process with transformers (lm-eval's hf model, fp32). compare.py prints both
# accuracies and the largest per-choice loglikelihood difference; with KV=fp32 (default) it
# fails above TOL (1e-3). KV=bf16 (the server's default cache) reports only.
# Not part of `make test` (the download); a check for a developer or a user.
# Environment: MOERUN (build/moerun), VENV (build/venv-lmeval), N (100 items), KV (fp32),
# TOL (1e-3), LMEVAL (the pip requirement, lm-eval[api,hf]==0.4.13).
set -u
MODEL=${1:-models/tiny-kjv}
M=${MOERUN:-build/moerun}
VENV=${VENV:-build/venv-lmeval}
N=${N:-100}; KV=${KV:-fp32}; TOL=${TOL:-1e-3}; LMEVAL=${LMEVAL:-lm-eval[api,hf]==0.4.13}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$M" ] || { echo "lm-eval/run.sh: no moerun binary at $M (run make)" >&2; exit 2; }
[ -f "$MODEL/valid.txt" ] || { echo "lm-eval/run.sh: $MODEL has no valid.txt to make the task from" >&2; exit 2; }
[ -f "$MODEL/tokenizer.json" ] || { echo "lm-eval/run.sh: $MODEL has no tokenizer.json (lm-eval tokenizes)" >&2; exit 2; }
case $KV in fp32) ;; bf16) TOL=-1 ;; *) echo "lm-eval/run.sh: KV is fp32 or bf16" >&2; exit 2 ;; esac
if ! "$VENV/bin/python" -c "import lm_eval, tenacity, transformers, torch" 2>/dev/null; then
    echo "installing $LMEVAL into $VENV (torch and transformers come with it)"
    { [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"; } && "$VENV/bin/pip" install -q "$LMEVAL" >"$VENV.log" 2>&1 ||
        { echo "lm-eval/run.sh: pip failed, see $VENV.log" >&2; exit 1; }
fi
W=$(mktemp -d)
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$W"' EXIT
python3 "$HERE/make_task.py" "$MODEL/valid.txt" "$W/task" "$N" || exit 1
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$M" serve --model "$MODEL" --port "$PORT" --kv-cache-dtype "$KV" >"$W/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 $PID 2>/dev/null || { cat "$W/serve.log"; echo "lm-eval/run.sh: the server did not start" >&2; exit 1; }
    sleep 0.2
done
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
MODEL_ABS=$(cd "$MODEL" && pwd)
name=$(basename "$MODEL_ABS")
"$VENV/bin/lm_eval" --model local-completions --tasks kjv_next_words --include_path "$W/task" --log_samples \
    --model_args "model=$name,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=huggingface,tokenizer=$MODEL_ABS,num_concurrent=8,max_retries=1" \
    --output_path "$W/served" >"$W/served.log" 2>&1 || { tail -20 "$W/served.log"; exit 1; }
grep -E '^\|' "$W/served.log"
"$VENV/bin/lm_eval" --model hf --model_args "pretrained=$MODEL_ABS,dtype=float32" --device cpu \
    --tasks kjv_next_words --include_path "$W/task" --log_samples --output_path "$W/hf" >"$W/hf.log" 2>&1 ||
    { tail -20 "$W/hf.log"; exit 1; }
ver() { "$VENV/bin/pip" show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
echo "lm-eval $(ver lm-eval), transformers $(ver transformers), torch $(ver torch); KV cache $KV"
python3 "$HERE/compare.py" "$W/hf" "$W/served" "$TOL"
