#!/usr/bin/env bash
# serve_invariance.sh — batch invariance through the server, end to end, on the
# trained default model (models/tiny-kjv). 120 requests (completions and chat,
# streamed and whole, greedy and seeded sampling with n = 1 or 2, stop strings,
# logprobs, prompts of ~20-800 tokens cut from six shared prefixes) give the
# same texts, finish reasons and log-probabilities, to the bit, from a server
# that runs them one at a time on one thread with room to spare (A) and, in
# two rounds, from one that runs 64 at once on all threads in a 48-block KV
# pool with 64-token prefill chunks (B), where they share prefix blocks, are
# preempted and recomputed, and a fifth
# of the clients leave mid-request; prompts longer than B's whole pool get a 400
# naming --kv-cache-memory. Under the sanitizers: 40 requests, one round of B.
# Oracle: batch invariance (a request's sums do not depend on the others, on
# the chunking or on what the cache held), checked across the HTTP layer, the
# scheduler's chunked prefill, the prefix cache, preemption and cancellation.
# Both servers run with --enable-deterministic-inference on the host's best
# kernels (the batch-invariant table: test_kernels / test_engine check it per
# kernel and per engine; here it is checked through everything above). Without
# the flag the FMA kernels of the AVX2 and AVX-512 levels change their sum
# order with the token count, and a last-bit difference flips a sampled token
# or a router's choice in about every round. After each round B must hold no request and no KV block, and count
# every client that left as an abort (tests/cli/serve_invariance.py, with the
# official `openai` client). A prefix-cache hit that claims one token too many
# (a mutation of match_prefix) fails it.
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
start_server "$S/a.log" --model "$MODEL" --enable-deterministic-inference --threads 1 || exit 1
URL_A=$SV_URL; PID_A=$SV_PID
start_server "$S/serve.log" --model "$MODEL" --enable-deterministic-inference --kv-cache-memory 1536K --max-batch-tokens 64 --max-running-requests 64 || exit 1
PID_B=$SV_PID
for u in "$URL_A" "$SV_URL"; do # the mode the servers say they run (sglang's server_info field)
    [ "$(curl -s "$u/get_server_info" | jq -r '.enable_deterministic_inference, .resolution.exec.enable_deterministic_inference' | tr '\n' ' ')" = "true true " ] ||
        bad "$u/get_server_info does not report the deterministic mode"
done
rounds=2; n=120
"$M" version 2>/dev/null | grep -q ASan && rounds=1 n=40 # (under the sanitizers: ~4 minutes at 80)
"$VENV/bin/python" "$HERE/serve_invariance.py" "$URL_A" "$SV_URL" tiny-kjv "$MODEL/valid.txt" $rounds $n || bad "see above"
SV_PID=$PID_A; stop_server
[ "$SV_RC" = 0 ] || bad "server A exited $SV_RC on SIGTERM"
clean_log "$S/a.log" || bad "sanitizer report or crash in a.log"
SV_PID=$PID_B
serve_test_end
