#!/usr/bin/env bash
# serve.sh — `moerun serve` under mpirun -np 2 (rank 0 serves HTTP and
# schedules, rank 1 runs every step in lockstep):
#   - the official `openai` client test (tests/cli/openai_client.py: the
#     three servers of tests/cli/serve_openai.sh, each expert-parallel)
#     passes, its expected tokens from a one-process `moerun generate`;
#   - SIGTERM to rank 0 drains, stops rank 1 and the job exits 0;
#   - new weights (/update_weights_from_disk): every rank loads its experts, and
#     every rank swaps at the same step or none does (a load that fails on
#     rank 1 alone is a 400 naming it, and the answers stay as they were);
#   - /sleep gives every rank's KV pool back (rank 1's RssAnon drops), and
#     /wake_up goes on with the one-process tokens;
#   - a rank that stops answering (SIGSTOP) turns the next request into a 503
#     within the deadline, and the server exits non-zero;
#   - a rank that dies (SIGKILL) mid-stream: mpirun ends the job, the stream
#     ends without claiming completion, the job exits non-zero (no hang).
# SKIP (77) without mpirun or MPI, or when the openai client cannot be
# installed (the other checks run first and are reported).
# Args: <moerun> <source dir> <scratch dir>
set -u
M=$1; SRC=$2; S=$3
skip() { echo "SKIP: $*"; exit 77; }
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
"$M" version | grep -q "no MPI" && skip "this build has no MPI (install libopenmpi-dev and reconfigure)"
rm -rf "$S"; mkdir -p "$S"
for v in $(env | sed -n 's/^\(MOERUN_[A-Z_0-9]*\)=.*/\1/p'); do unset "$v"; done
export OMP_NUM_THREADS=1
# ASan builds: Open MPI's own allocations are not ours (tests/mpi/lsan.supp; the slow unwinder sees
# through its unloaded components)
export LSAN_OPTIONS="suppressions=$SRC/tests/mpi/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
VENV=$(cd "$(dirname "$M")" && pwd)/venv-openai
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

# start LOG ARGS...: an expert-parallel server on 2 ranks; sets EP_PID (mpirun), URL, R0, R1 (the ranks' pids)
start() {
    local log=$1; shift
    mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none \
        -x OMP_NUM_THREADS -x LSAN_OPTIONS -x ASAN_OPTIONS -np 2 "$M" serve --port 0 ${EP_FLAGS:---moe-a2a-backend mpi} "$@" >"$log" 2>&1 &
    EP_PID=$!
    local i
    for i in $(seq 1 3600); do
        grep -q "ready on http" "$log" 2>/dev/null && break
        kill -0 "$EP_PID" 2>/dev/null || { echo "the server exited before it was ready:"; cat "$log"; return 1; }
        sleep 0.05
    done
    grep -q "ready on http" "$log" || { echo "not ready in 180 s:"; cat "$log"; return 1; }
    URL=http://127.0.0.1:$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$log" | head -1)
    R0=; R1=
    for p in $(pgrep -P "$EP_PID"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0" && R0=$p
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && R1=$p
    done
    [ -n "$R0" ] && [ -n "$R1" ] || { echo "cannot find the ranks of mpirun $EP_PID"; return 1; }
}
# stop: SIGTERM to rank 0 (a drain, then rank 1 is told to stop); mpirun's status into EP_RC
stop() {
    kill -TERM "$R0" 2>/dev/null
    local i
    for i in $(seq 1 2400); do kill -0 "$EP_PID" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$EP_PID" 2>/dev/null && { kill -KILL "$EP_PID"; EP_RC=124; return; }
    wait "$EP_PID"; EP_RC=$?
}

T=$S/tiny
cp -r "$SRC/tests/data/model/tiny" "$T"
for p in 5,6,7 9,8,7,6 30,31 40,41,42,43; do
    line=$("$M" generate --model "$T" --prompt-ids "$p" -n 10 --threads 1 | grep '^\[0\]')
    case "$line" in *"<eos>"*) continue;; esac
    prompt=$p; expected=$(echo "$line" | sed 's/^\[0\] //; s/ /,/g'); break
done
[ -n "${prompt:-}" ] || { echo "FAIL: no prompt without an EOS in 10 tokens"; exit 1; }

# the same tokens over HTTP from the expert-parallel server
start "$S/a.log" --model "$T" --context-length 256 || exit 1
URL_A=$URL; PID_A=$EP_PID; A0=$R0; A1=$R1
grep -q "expert parallel: 2 ranks" "$S/a.log" || fail "server A is not expert-parallel"
body=$(curl -s -m 120 "$URL_A/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"tiny\",\"prompt\":[$prompt],\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true}")
got=$(sed -n 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/p' <<< "$body")
[ "$got" = "$expected" ] || fail "completion tokens '$got', one process '$expected' ($body)"
# a pause holds the ranks' steps (the heartbeat goes on) and continue gives the same tokens
code=$(curl -s -m 120 -o /dev/null -w '%{http_code}' "$URL_A/pause_generation" -d '{"mode":"in_place"}')
[ "$code" = 200 ] || fail "pause under EP: $code"
curl -s -m 120 "$URL_A/v1/completions" -o "$S/p.body" -d "{\"model\":\"tiny\",\"prompt\":[$prompt],\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true}" &
PC=$!
sleep 1.5 # past the EP heartbeat: the ranks stay together while paused
kill -0 "$PC" 2>/dev/null || fail "a completion answered while paused: $(cat "$S/p.body")"
code=$(curl -s -m 120 -o /dev/null -w '%{http_code}' "$URL_A/continue_generation" -d '{}')
[ "$code" = 200 ] || fail "continue under EP: $code"
wait "$PC"
got=$(sed -n 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/p' "$S/p.body")
[ "$got" = "$expected" ] || fail "the completion held by the pause: '$got', one process '$expected'"

# new weights: every rank loads its own experts, and all swap at the same step or none does. The oracle is a
# one-process `moerun generate` on each checkpoint (greedy). WC is WA without one expert of rank 1's half
# (experts 8..15): only rank 1's load fails, and rank 0 must not swap alone (the answers would mix WA's
# experts and WB's).
# (4 KV heads of 64: 2 KiB of bf16 K and V a token, for the sleep below)
dims="--hidden 128 --layers 2 --experts 16 --top-k 2 --expert-dim 128 --heads 4 --kv-heads 4 --head-dim 64 --rotary-dim 32 --vocab 512"
"$M" gen-tiny "$S/WA" $dims --seed 1 >/dev/null && "$M" gen-tiny "$S/WB" $dims --seed 2 >/dev/null || { echo "FAIL: gen-tiny"; exit 1; }
cp -r "$S/WA" "$S/WC"
LC_ALL=C sed -i 's/layers\.1\.block_sparse_moe\.experts\.12\.w1/layers.1.block_sparse_moe.experts.12.q1/' "$S/WC/model.safetensors"
cmp -s "$S/WA/model.safetensors" "$S/WC/model.safetensors" && { echo "FAIL: WC is WA"; exit 1; }
want() { "$M" generate --model "$1" --prompt-ids "$2" -n "$3" --ignore-eos --threads 1 2>/dev/null | sed -n 's/^\[0\] //p' | tr ' ' ','; }
gen() { curl -s -m 120 "$URL/generate" -d "{\"input_ids\":[$1],\"sampling_params\":{\"max_new_tokens\":$2,\"temperature\":0,\"ignore_eos\":true}}"; }
ids() { jq -r '(.output_ids | map(tostring) | join(",")) + " " + .meta_info.weight_version' "$1"; }
update() { curl -s -m 300 -o "$S/u.body" -w '%{http_code}' "$URL/update_weights_from_disk" -d "$1"; }
WA=$(want "$S/WA" 5,6,7 12); WB=$(want "$S/WB" 5,6,7 12); LA=$(want "$S/WA" 9,8,7 300)
[ -n "$WA" ] && [ "$WA" != "$WB" ] || fail "the checkpoints' oracles: '$WA' '$WB'"
# (vLLM's flag and sglang's size name for the same thing)
EP_FLAGS="--enable-expert-parallel --ep 2" start "$S/w.log" --model "$S/WA" --context-length 8192 --weight-version v0 \
    --debug-step-delay-ms 5 || exit 1
grep -q "expert parallel: 2 ranks" "$S/w.log" || fail "--enable-expert-parallel: not expert-parallel"
curl -s -m 10 "$URL/get_server_info" | jq -e '.ep_size == 2' >/dev/null || fail "--enable-expert-parallel: ep_size $(curl -s "$URL/get_server_info" | jq .ep_size)"
gen 5,6,7 12 >"$S/g.json"; [ "$(ids "$S/g.json")" = "$WA v0" ] || fail "before the update: $(cat "$S/g.json")"
# a request running when the update comes runs to its end on the old weights on both ranks
gen 9,8,7 300 >"$S/long.json" &
JL=$!
for i in $(seq 1 400); do
    curl -s -m 10 "$URL/metrics" | grep -q '^moerun:num_requests_running{[^}]*} 1' && break; sleep 0.01
done
code=$(update "{\"model_path\":\"$S/WB\",\"weight_version\":\"v1\"}")
[ "$code" = 200 ] || fail "an update under EP: $code $(cat "$S/u.body")"
wait "$JL"
[ "$(ids "$S/long.json")" = "$LA v0" ] || fail "the request running during the update: $(head -c 300 "$S/long.json")"
gen 5,6,7 12 >"$S/g.json"; [ "$(ids "$S/g.json")" = "$WB v1" ] || fail "after the update: $(cat "$S/g.json")"
# rank 1 alone fails: a 400 naming it, and no rank swapped
code=$(update "{\"model_path\":\"$S/WC\",\"weight_version\":\"v2\"}")
[ "$code" = 400 ] && grep -q "rank 1 of 2: tensor model.layers.1.block_sparse_moe.experts.12.w1.weight is missing" "$S/u.body" ||
    fail "an update that fails on rank 1: $code $(cat "$S/u.body")"
code=$(update "{\"model_path\":\"$S/none\"}")
[ "$code" = 400 ] && grep -q "no config.json" "$S/u.body" || fail "an update from no checkpoint: $code $(cat "$S/u.body")"
gen 5,6,7 12 >"$S/g.json"; [ "$(ids "$S/g.json")" = "$WB v1" ] || fail "after the refused updates: $(cat "$S/g.json")"
# while paused in place, the swap is at once, under the held request
code=$(curl -s -m 120 -o /dev/null -w '%{http_code}' "$URL/pause_generation" -d '{"mode":"in_place"}')
[ "$code" = 200 ] || fail "pause under EP: $code"
code=$(update "{\"model_path\":\"$S/WA\",\"weight_version\":\"v3\",\"flush_cache\":false}")
[ "$code" = 200 ] || fail "an update while paused under EP: $code $(cat "$S/u.body")"
curl -s -m 120 -o /dev/null "$URL/continue_generation" -d '{}'
gen 5,6,7 12 >"$S/g.json"; [ "$(ids "$S/g.json")" = "$WA v3" ] || fail "after the update while paused: $(cat "$S/g.json")"
# sleep (vLLM's /sleep): every rank's KV pool goes back to the system (rank 1's too: its RssAnon); a request
# sent meanwhile waits, and after /wake_up runs to the one-process tokens (WA's weights now)
anon1() { awk '/^RssAnon:/ {print int($2 / 1024)}' "/proc/$R1/status"; }
big_ids=$(seq 0 7999 | awk '{print 10 + $1 % 400}' | paste -sd,) # 8000 tokens: about 16 MiB of pool pages a rank
gen "$big_ids" 2 >"$S/bigp.json"
[ "$(jq -r .meta_info.prompt_tokens "$S/bigp.json")" = 8000 ] || fail "the big prompt under EP: $(head -c 200 "$S/bigp.json")"
before=$(anon1)
code=$(curl -s -m 120 -o "$S/sleep.json" -w '%{http_code}' -X POST "$URL/sleep?level=1")
after=$(anon1)
[ "$code" = 200 ] && [ "$(curl -s -m 10 "$URL/is_sleeping" | jq -r .is_sleeping)" = true ] || fail "sleep under EP: $code $(cat "$S/sleep.json")"
[ "$after" -lt $((before - 10)) ] || fail "rank 1 kept its KV pool: RssAnon $before MiB before the sleep, $after MiB after"
gen 5,6,7 12 >"$S/g.json" &
JG=$!
sleep 1.5 # past the EP heartbeat
kill -0 $JG 2>/dev/null || fail "a request answered while asleep under EP: $(head -c 200 "$S/g.json")"
[ "$(curl -s -m 10 -o /dev/null -w '%{http_code}' -X POST "$URL/wake_up")" = 200 ] || fail "wake_up under EP"
wait $JG
[ "$(ids "$S/g.json")" = "$WA v3" ] || fail "after wake_up under EP: $(head -c 300 "$S/g.json")"
stop; [ $EP_RC = 0 ] || { cat "$S/w.log"; fail "the weights server exited $EP_RC"; }

# a rank that stops answering: the next request gets 503 within the deadline, the server exits non-zero
start "$S/d.log" --model "$T" --context-length 256 --ep-timeout 3 || exit 1
kill -STOP "$R1"
# no timing assertion (a loaded CI host): the 503 names the 3 s deadline; curl's own limit catches a hang
code=$(curl -s -m 120 -o "$S/d.body" -w '%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","prompt":[1,2,3],"max_tokens":4}')
[ "$code" = 503 ] || fail "a hung rank: HTTP $code, expected 503 ($(cat "$S/d.body"))"
grep -q "did not complete within 3.0 s" "$S/d.body" || fail "a hung rank: the 503 does not say why: $(cat "$S/d.body")"
for i in $(seq 1 1200); do kill -0 "$EP_PID" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$EP_PID" 2>/dev/null; then fail "a hung rank: the server did not exit"; kill -KILL "$EP_PID"; kill -KILL "$R1"
else wait "$EP_PID"; rc=$?; [ $rc -ne 0 ] || fail "a hung rank: the server exited 0"; fi
grep -q "serve \[rank 0/2\]: stopping: the engine failed" "$S/d.log" || { cat "$S/d.log"; fail "a hung rank: no stopping message"; }

# a rank that dies mid-stream (SIGKILL): mpirun ends the job; the stream ends (no hang), the job exits non-zero
start "$S/e.log" --model "$T" --context-length 4096 || exit 1
curl -s -N -m 120 "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","prompt":[1,2,3],"max_tokens":4000,"ignore_eos":true,"stream":true}' >"$S/e.body" 2>&1 &
CURL=$!
for i in $(seq 1 600); do grep -q '"text"' "$S/e.body" 2>/dev/null && break; sleep 0.05; done
kill -KILL "$R1"
for i in $(seq 1 2400); do kill -0 "$EP_PID" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$EP_PID" 2>/dev/null; then fail "a killed rank: the server did not exit"; kill -KILL "$EP_PID" "$R0"
else wait "$EP_PID"; rc=$?; [ $rc -ne 0 ] || fail "a killed rank: the job exited 0"; fi
wait "$CURL"; crc=$?
[ $crc -ne 28 ] || fail "a killed rank: the client's stream hung until curl's limit"
grep -q '"text"' "$S/e.body" || fail "a killed rank: the stream had not started (the check did not test a stream)"
grep -q "data: \[DONE\]" "$S/e.body" && fail "a killed rank: the stream claims to have completed"

# the openai client (PyPI, private venv shared with tests/cli/serve_openai.sh)
bash "$SRC/scripts/openai-venv.sh" "$VENV"; vrc=$?
if [ $vrc = 0 ]; then
    EP_PID=$PID_A; R0=$A0; R1=$A1
    start "$S/b.log" --model "$T" --context-length 256 --api-key secret --skip-self-check || exit 1
    URL_B=$URL; PID_B=$EP_PID; B0=$R0
    MM=$S/minimax-form
    "$M" gen-tiny "$MM" --vocab 200064 --hidden 16 --layers 1 --experts 4 --top-k 2 --expert-dim 32 --heads 2 \
        --kv-heads 1 --head-dim 32 --rotary-dim 16 >/dev/null || { echo "FAIL: gen-tiny"; exit 1; }
    cp "$SRC/tests/data/text/minimax/tokenizer.json" "$SRC/tests/data/text/minimax/tokenizer_config.json" \
        "$SRC/tests/data/text/chat/models/minimax_m2/chat_template.jinja" "$MM/"
    printf '{"bos_token_id": 200034, "eos_token_id": [200020]}\n' >"$MM/generation_config.json"
    sed -i 's/"eos_token_id": [0-9]*/"eos_token_id": 200020/; s/"bos_token_id": [0-9]*/"bos_token_id": 200034/' "$MM/config.json"
    start "$S/c.log" --model "$MM" --context-length 1024 --debug-forced-output --enable-return-routed-experts --skip-self-check || exit 1
    URL_C=$URL; PID_C=$EP_PID; C0=$R0
    "$VENV/bin/python" "$SRC/tests/cli/openai_client.py" "$URL_A" "$prompt" "$expected" "$URL_B" "$URL_C" ||
        fail "the openai client against the expert-parallel servers"
    EP_PID=$PID_B; R0=$B0; stop; [ $EP_RC = 0 ] || { cat "$S/b.log"; fail "server B exited $EP_RC"; }
    EP_PID=$PID_C; R0=$C0; stop; [ $EP_RC = 0 ] || { cat "$S/c.log"; fail "server C exited $EP_RC"; }
fi
EP_PID=$PID_A; R0=$A0; stop
[ $EP_RC = 0 ] || { cat "$S/a.log"; fail "SIGTERM to rank 0: mpirun exited $EP_RC, expected 0 (drain, then rank 1 stops)"; }
grep -q "moerun serve: stopped" "$S/a.log" || fail "server A did not drain"
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
rm -rf "$S"
if [ $vrc = 77 ]; then echo "SKIPPED: the openai client cannot be installed here (the other checks passed)"; exit 77; fi
[ $vrc = 0 ] || { echo "FAIL: scripts/openai-venv.sh exited $vrc"; exit 1; }
echo PASS
