#!/usr/bin/env bash
# serve_invariance.sh — batch invariance through the server, end to end, on the
# trained default model (models/tiny-kjv). 120 requests (completions and chat,
# streamed and whole, greedy and seeded sampling, prompts of ~40-1600 tokens cut
# from six shared prefixes) give the same text from a server that runs them one
# at a time with room to spare (A) and, in two rounds, from one that runs 64 at
# once in a 96-block KV pool with 128-token prefill chunks (B), where they share
# prefix blocks, are preempted and recomputed, and a fifth of the clients leave
# mid-request; prompts longer than B's whole pool get a 400 naming
# --kv-cache-memory. Under the sanitizers: 80 requests, one round of B.
# Oracle: the engine's batch-invariance property (a request's tokens do not
# depend on the others), checked here across the HTTP layer, the scheduler's
# chunked prefill, the prefix cache, preemption and cancellation. After each
# round B must hold no request and no KV block, and count every client that
# left as an abort (tests/cli/serve_invariance.py, with the official `openai`
# client). A prefix-cache hit that claimed one token too many (a mutation of
# match_prefix) fails it.
# SKIPPED (exit 77) only when Python's venv/pip or PyPI is not reachable.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=$(cd "$HERE/../.." && pwd)/models/tiny-kjv
VENV=$(cd "$(dirname "$M")" && pwd)/venv-openai
. "$HERE/lib/serve.sh"
serve_test_begin
[ -f "$MODEL/valid.txt" ] || { echo "FAIL: $MODEL is missing"; exit 1; }
bash "$HERE/../../scripts/openai-venv.sh" "$VENV"
rc=$?
if [ $rc = 77 ]; then echo "SKIPPED: the openai client cannot be installed here (see above)"; exit 77; fi
[ $rc = 0 ] || { echo "FAIL: scripts/openai-venv.sh exited $rc"; exit 1; }
start_server "$S/a.log" --model "$MODEL" || exit 1
URL_A=$SV_URL; PID_A=$SV_PID
start_server "$S/serve.log" --model "$MODEL" --kv-cache-memory 3M --max-batch-tokens 128 --max-running-requests 64 || exit 1
PID_B=$SV_PID
rounds=2; n=120
"$M" version 2>/dev/null | grep -q ASan && rounds=1 n=80 # (~2 minutes at 2 x 120 under the sanitizers)
"$VENV/bin/python" "$HERE/serve_invariance.py" "$URL_A" "$SV_URL" tiny-kjv "$MODEL/valid.txt" $rounds $n || bad "see above"
SV_PID=$PID_A; stop_server
[ "$SV_RC" = 0 ] || bad "server A exited $SV_RC on SIGTERM"
clean_log "$S/a.log" || bad "sanitizer report or crash in a.log"
SV_PID=$PID_B
serve_test_end
