#!/usr/bin/env bash
# serve_lifecycle.sh — the life of `moerun serve` around its requests:
#  - the startup self-check: with the test-only mutation that swaps the
#    routed runner's gate and up projections, serve prints the probe report
#    (FAIL) and exits 1 without ever answering /health 200; --skip-self-check
#    serves anyway; without the mutation the check passes;
#  - /health is 503 while loading (a slow self-check on a larger model);
#  - SIGTERM drains: /health and new requests get 503 at once, the running
#    stream finishes whole, the server exits 0;
#  - the drain's timeout cancels what is still running and exits 0;
#  - a second SIGINT exits at once;
#  - vLLM's names of the engine's limits take effect;
#  - an FP8 KV cache (--kv-cache-dtype fp8_e4m3 / fp8 / fp8_e5m2): the self-check passes
#    on it, the ready line and /get_server_info name it, the same --kv-cache-memory holds
#    twice bf16's tokens, and it answers; an unknown dtype is a usage error;
#  - sglang's and vLLM's launch lines (their flag names, no-op flags, fixed values, vLLM's model
#    without --model) start it;
#  - bad flags are usage errors (exit 2; an empty --api-key or --served-model-name too) and a
#    port in use is exit 1; an IPv6 --host is printed as a bracketed URL that answers.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
. "$(dirname "$0")/lib/serve.sh"
serve_test_begin
tokens() { local n; n=$(grep -c '"token_ids"' "$1" 2>/dev/null); echo "${n:-0}"; }
T=$S/tiny
cp -r "$DATA/model/tiny" "$T"

# --- the self-check refuses a broken runner ---
timeout 120 "$M" serve --model "$T" --port 0 --debug-mutation swap-gate-up >"$S/mut.log" 2>&1
rc=$?
[ $rc = 1 ] || bad "a mutated runner: exit $rc, want 1"
grep -q "self-check: runner routed.*FAIL" "$S/mut.log" || bad "no FAIL report from the self-check"
grep -q "refusing to serve" "$S/mut.log" || bad "no refusal message"
grep -q "ready on" "$S/mut.log" && bad "the mutated server said it was ready"
clean_log "$S/mut.log" || bad "sanitizer report in the refused start"
start_server "$S/skip.log" --model "$T" --debug-mutation swap-gate-up --skip-self-check || exit 1
grep -q "self-check: skipped" "$S/skip.log" || bad "--skip-self-check did not say it skipped"
stop_server
start_server "$S/ok.log" --model "$T" || exit 1
grep -q "self-check: runner routed.*PASS" "$S/ok.log" || bad "the self-check did not pass on a sound runner"

# --- SIGTERM drains a running stream ---
curl -s -N -d '{"prompt":[1,2,3],"max_tokens":200,"ignore_eos":true,"stream":true}' "$SV_URL/v1/completions" \
    >"$S/drain.out" 2>/dev/null &
cpid=$!
for i in $(seq 1 200); do [ "$(tokens $S/drain.out)" -ge 3 ] && break; sleep 0.02; done
kill -TERM "$SV_PID"
sleep 0.1
h=$(curl -s -o "$S/h.out" -w '%{http_code}' "$SV_URL/health")
n=$(curl -s -o "$S/n.out" -w '%{http_code}' -d '{"prompt":[1],"max_tokens":2}' "$SV_URL/v1/completions")
hg=$(curl -s -o /dev/null -w '%{http_code}' "$SV_URL/health_generate")
wait "$cpid"
wait "$SV_PID"; rc=$?
# the stream may finish before the probes if the machine is fast; then the server is gone (000)
case "$h" in 503|000) ;; *) bad "/health while draining: $h, want 503";; esac
case "$n" in 503|000) ;; *) bad "a new request while draining: $n, want 503";; esac
case "$hg" in 503|000) ;; *) bad "/health_generate while draining: $hg, want 503";; esac
[ "$h" = 503 ] && ! grep -q 'shutting down' "$S/h.out" && bad "the 503 does not say it is shutting down"
[ $rc = 0 ] || bad "drain: exit $rc, want 0"
[ "$(grep -c '"token_ids"' "$S/drain.out")" = 200 ] || bad "the drained stream has $(grep -c '"token_ids"' "$S/drain.out") tokens, want 200"
grep -q '^data: \[DONE\]' "$S/drain.out" || bad "the drained stream did not end with [DONE]"

# --- SIGTERM waits for what the engine ended but the event loop has not sent ---
# (--debug-slow-stream: the loop sleeps 50 ms per write of a stream's events, so it falls far
# behind the engine, as it can on a loaded host; the drain once stopped the server when the
# engine was done, and the stream ended at 170 of 200 tokens without [DONE])
start_server "$S/lag.log" --model "$T" --skip-self-check --debug-slow-stream || exit 1
curl -s -N -d '{"prompt":[1,2,3],"max_tokens":200,"ignore_eos":true,"stream":true}' "$SV_URL/v1/completions" \
    >"$S/lag.out" 2>/dev/null &
cpid=$!
for i in $(seq 1 200); do [ "$(tokens $S/lag.out)" -ge 1 ] && break; sleep 0.02; done
kill -TERM "$SV_PID"
wait "$cpid"
wait "$SV_PID"; rc=$?
[ $rc = 0 ] || bad "drain behind a slow event loop: exit $rc, want 0"
[ "$(tokens "$S/lag.out")" = 200 ] || bad "drained behind a slow event loop, the stream has $(tokens "$S/lag.out") tokens, want 200"
grep -q '^data: \[DONE\]' "$S/lag.out" || bad "drained behind a slow event loop, the stream did not end with [DONE]"
clean_log "$S/lag.log" || bad "sanitizer report in the server drained behind a slow event loop"
grep -q "moerun serve: stopped" "$S/ok.log" || bad "no 'stopped' line"
clean_log "$S/ok.log" || bad "sanitizer report in the drained server"

# --- the drain's timeout cancels what is left, exit 0 ---
start_server "$S/to.log" --model "$T" --context-length 4096 --shutdown-timeout 1 --skip-self-check || exit 1
curl -s -N -d '{"prompt":[1,2,3],"max_tokens":4000,"n":16,"ignore_eos":true,"stream":true}' "$SV_URL/v1/completions" \
    >"$S/to.out" 2>/dev/null &
cpid=$!
for i in $(seq 1 200); do [ "$(tokens $S/to.out)" -ge 3 ] && break; sleep 0.02; done
t0=$(now_ms)
kill -TERM "$SV_PID"; wait "$SV_PID"; rc=$?
ms=$(( $(now_ms) - t0 ))
wait "$cpid"
[ $rc = 0 ] || bad "drain timeout: exit $rc, want 0"
[ $ms -lt 20000 ] || bad "drain timeout: the server took $ms ms to exit (--shutdown-timeout 1)"
grep -q "cancelled" "$S/to.log" || bad "the drain timeout did not say what it cancelled"
clean_log "$S/to.log" || bad "sanitizer report after the drain timeout"

# --- a second SIGINT exits at once ---
start_server "$S/int.log" --model "$T" --context-length 4096 --shutdown-timeout 600 --skip-self-check || exit 1
curl -s -N -d '{"prompt":[1,2,3],"max_tokens":4000,"n":16,"ignore_eos":true,"stream":true}' "$SV_URL/v1/completions" \
    >"$S/int.out" 2>/dev/null &
cpid=$!
for i in $(seq 1 200); do [ "$(tokens $S/int.out)" -ge 3 ] && break; sleep 0.02; done
kill -INT "$SV_PID"; sleep 0.3; kill -INT "$SV_PID"
t0=$(now_ms)
wait "$SV_PID"; rc=$?
ms=$(( $(now_ms) - t0 ))
wait "$cpid"
[ $rc = 130 ] || bad "second SIGINT: exit $rc, want 130"
[ $ms -lt 10000 ] || bad "second SIGINT: $ms ms to exit"
grep -q "draining" "$S/int.log" || bad "the first SIGINT did not start a drain"

# --- /health is 503 while loading: a real-shape layer makes the self-check take a while ---
"$M" gen-tiny "$S/wide" --hidden 1024 --layers 2 --experts 16 --expert-dim 512 --vocab 4096 >/dev/null 2>&1 || bad "gen-tiny failed"
"$M" serve --model "$S/wide" --port 0 >"$S/load.log" 2>&1 &
SV_PID=$!
SV_ALL="$SV_ALL $SV_PID"
lim=$(( $(now_ms) + 60000 )) # "listening" comes before the load (a slow sanitizer host: allow a minute)
while ! grep -q "listening on" "$S/load.log" && [ "$(now_ms)" -lt $lim ]; do sleep 0.01; done
grep -q "listening on" "$S/load.log" || { bad "no listening line in 60 s: $(cat "$S/load.log")"; server_stacks "$SV_PID"; }
SV_PORT=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$S/load.log" | head -1)
SV_URL=http://127.0.0.1:$SV_PORT
h=$(curl -s -o "$S/hl.out" -w '%{http_code}' "$SV_URL/health")
g=$(curl -s -o /dev/null -w '%{http_code}' -d '{"prompt":[1],"max_tokens":2}' "$SV_URL/v1/completions")
hg=$(curl -s -o /dev/null -w '%{http_code}' "$SV_URL/health_generate")
if grep -q "ready on" "$S/load.log"; then
    echo "note: the model was ready before the probe; the loading case was not exercised"
else
    [ "$h" = 503 ] || bad "/health while loading: $h, want 503"
    grep -q "loading" "$S/hl.out" || bad "the loading 503 does not say so: $(cat "$S/hl.out")"
    [ "$g" = 503 ] || bad "a request while loading: $g, want 503"
    [ "$hg" = 503 ] || bad "/health_generate while loading: $hg, want 503"
fi
lim=$(( $(now_ms) + 180000 ))
while ! grep -q "ready on" "$S/load.log" && [ "$(now_ms)" -lt $lim ]; do sleep 0.05; done
grep -q "ready on" "$S/load.log" || { bad "not ready in 180 s: $(cat "$S/load.log")"; server_stacks "$SV_PID"; }
[ "$(curl -s -o /dev/null -w '%{http_code}' "$SV_URL/health")" = 200 ] || bad "/health after loading is not 200"
# sglang's /health_generate: one token through the engine (a completion of it), without a key like /health
curl -s "$SV_URL/health_generate" -o "$S/hg.out" -w '%{http_code}' | grep -q 200 &&
    jq -e '.usage.completion_tokens == 1' "$S/hg.out" >/dev/null || bad "/health_generate after loading: $(head -c 300 "$S/hg.out")"
# sglang's /get_model_info (its frontend's RuntimeEndpoint reads it first)
curl -s "$SV_URL/get_model_info" | jq -e --arg d "$S/wide" '.model_path == $d and .tokenizer_path == $d and
    .is_generation == true and .preferred_sampling_params == null' >/dev/null || bad "/get_model_info: $(curl -s "$SV_URL/get_model_info")"
stop_server
[ "$SV_RC" = 0 ] || bad "exit $SV_RC after loading"

# --- vLLM's names for the engine's limits take effect (--max-model-len, --max-num-seqs, --max-num-batched-tokens) ---
start_server "$S/alias.log" --model "$T" --skip-self-check --max-model-len 96 --max-num-seqs 3 \
    --max-num-batched-tokens 32 --tensor-parallel-size 1 --trust-remote-code || exit 1
grep -q "(3 running + .*, context 96, .*, 32 tokens per step)" "$S/alias.log" || bad "vLLM's option names: $(grep 'ready on' "$S/alias.log")"
curl -s "$SV_URL/v1/models" | grep -q '"max_model_len": *96' || bad "--max-model-len is not the served context"
stop_server

# --- an FP8 KV cache: the same memory, twice bf16's tokens ---
start_server "$S/kvb.log" --model "$T" --kv-cache-memory 1M --skip-self-check || exit 1
tok_b=$(curl -s "$SV_URL/get_server_info" | jq -r '.max_total_num_tokens')
[ "$(curl -s "$SV_URL/get_server_info" | jq -r '.kv_cache_dtype')" = bf16 ] || bad "the default KV dtype is not bf16"
stop_server
for dt in fp8_e4m3 fp8 fp8_e5m2; do
    want=$dt; [ $dt = fp8 ] && want=fp8_e4m3
    start_server "$S/kv8.log" --model "$T" --kv-cache-memory 1M --kv-cache-dtype $dt || exit 1
    grep -q "self-check: runner routed.*PASS" "$S/kv8.log" || bad "$dt: the self-check did not pass"
    grep -q "KV blocks of 16 tokens in $want," "$S/kv8.log" || bad "$dt: the ready line: $(grep 'ready on' "$S/kv8.log")"
    info=$(curl -s "$SV_URL/get_server_info")
    echo "$info" | jq -e --arg w $want --argjson b "${tok_b:-0}" '.kv_cache_dtype == $w and
        .max_total_num_tokens == 2 * $b and $b > 0' >/dev/null ||
        bad "$dt: /get_server_info $(echo "$info" | jq -c '{kv_cache_dtype, max_total_num_tokens}'), bf16 held $tok_b tokens"
    n=$(curl -s -d '{"prompt":[1,2,3],"max_tokens":40,"ignore_eos":true}' "$SV_URL/v1/completions" |
        jq -r '.usage.completion_tokens')
    [ "$n" = 40 ] || bad "$dt: a completion gave $n tokens, want 40"
    stop_server
    [ "$SV_RC" = 0 ] || bad "$dt: exit $SV_RC"
    clean_log "$S/kv8.log" || bad "$dt: sanitizer report"
done
# --- a KV pool smaller than one context: chat without max_tokens runs until the pool is full (vLLM's and
# sglang's default is the rest of the context, which this pool can never hold); an explicit max_tokens past
# it is a 400 naming the cache ---
KJV=$(cd "$DATA/../.." && pwd)/models/tiny-kjv
start_server "$S/pool.log" --model "$KJV" --kv-cache-memory 256K --skip-self-check || exit 1
cap=$(curl -s "$SV_URL/get_server_info" | jq -r '.max_total_num_tokens')
[ "$cap" -gt 16 ] && [ "$cap" -lt 4096 ] || bad "a 256K pool holds $cap tokens"
chat='{"messages":[{"role":"user","content":"In the beginning"}],"ignore_eos":true'
curl -s "$SV_URL/v1/chat/completions" -d "$chat}" >"$S/pool.json"
jq -e --argjson c "$cap" '.usage.total_tokens == $c and .usage.completion_tokens > 0 and
    .choices[0].finish_reason == "length"' "$S/pool.json" >/dev/null || bad "chat without max_tokens, pool $cap: $(head -c 300 "$S/pool.json")"
code=$(curl -s -o "$S/pool.json" -w '%{http_code}' "$SV_URL/v1/chat/completions" -d "$chat,\"max_tokens\":$cap}")
[ "$code" = 400 ] && grep -q "KV blocks" "$S/pool.json" || bad "max_tokens past the pool: $code $(cat "$S/pool.json")"
# a chat stream's first chunk (delta.role) comes with the first token, not at admission (vLLM's benchmark takes
# its TTFT from the first chunk): while generation is paused, nothing arrives
[ "$(curl -s -o /dev/null -w '%{http_code}' "$SV_URL/pause_generation" -d '{"mode":"in_place"}')" = 200 ] || bad "pause"
curl -s -N -m 60 "$SV_URL/v1/chat/completions" -d "$chat,\"max_tokens\":4,\"stream\":true}" >"$S/role.sse" &
CP=$!
sleep 1
[ -s "$S/role.sse" ] && bad "a paused chat stream sent: $(head -c 200 "$S/role.sse")"
curl -s -o /dev/null "$SV_URL/continue_generation" -d '{}'
wait "$CP"
head -1 "$S/role.sse" | grep -q '"delta":{"role":"assistant"' || bad "the stream's first chunk: $(head -c 200 "$S/role.sse")"
grep -qE '"(reasoning_)?content":"[^"]' "$S/role.sse" && grep -q '^data: \[DONE\]' "$S/role.sse" ||
    bad "the stream after continue: $(head -c 400 "$S/role.sse")"
stop_server
# OpenAI's and vLLM's chat reasoning_effort reaches the template as chat_template_kwargs.reasoning_effort (an
# explicit kwarg wins); the oracle: the rendered text's own ids (/tokenize of the prompt)
cp -r "$KJV" "$S/effort"
printf '%s' '{{ "effort=" ~ (reasoning_effort | default("unset")) ~ ";" }}{% for m in messages %}{{ m.content }}{% endfor %}' \
    >"$S/effort/chat_template.jinja"
start_server "$S/effort.log" --model "$S/effort" --skip-self-check || exit 1
tk() { curl -s "$SV_URL/tokenize" -d "$1" | jq -c .tokens; }
for c in 'high|"reasoning_effort":"high"' 'unset|' 'low|"reasoning_effort":"high","chat_template_kwargs":{"reasoning_effort":"low"}'; do
    extra=${c#*|}; [ -n "$extra" ] && extra=",$extra"
    got=$(tk "{\"messages\":[{\"role\":\"user\",\"content\":\"In the beginning\"}]$extra}")
    want=$(tk "{\"prompt\":\"effort=${c%%|*};In the beginning\",\"add_special_tokens\":false}")
    [ -n "$want" ] && [ "$got" = "$want" ] || bad "reasoning_effort ${c#*|}: $got, the rendered text's $want"
done
code=$(curl -s -o "$S/eff.json" -w '%{http_code}' "$SV_URL/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"reasoning_effort":"extreme"}')
[ "$code" = 400 ] && [ "$(jq -r .error.param "$S/eff.json")" = reasoning_effort ] || bad "reasoning_effort extreme: $code $(cat "$S/eff.json")"
stop_server
"$M" serve --model "$T" --kv-cache-dtype fp16 >/dev/null 2>"$S/e8"; rc=$?
[ $rc = 2 ] && grep -q "fp8_e4m3" "$S/e8" || bad "--kv-cache-dtype fp16: exit $rc: $(cat "$S/e8")"

# --- bad flags, busy port ---
"$M" serve --model "$T" --port 70000 >/dev/null 2>"$S/e1"; rc=$?
[ $rc = 2 ] && grep -q -- "--port" "$S/e1" || bad "--port 70000: exit $rc: $(cat "$S/e1")"
"$M" serve --model "$T" --max-queued-requests -1 >/dev/null 2>"$S/e2"; rc=$?
[ $rc = 2 ] || bad "--max-queued-requests -1: exit $rc"
"$M" serve --model "$T" --context-length 100 --max-prompt-tokens 200 >/dev/null 2>"$S/e3"; rc=$?
[ $rc = 2 ] && grep -q "below --context-length" "$S/e3" || bad "--max-prompt-tokens above the context: exit $rc"
"$M" serve --model "$T" --tp-size 4 >/dev/null 2>"$S/e7"; rc=$?
[ $rc = 2 ] && grep -q "moe-a2a-backend mpi" "$S/e7" || bad "--tp-size 4: exit $rc: $(cat "$S/e7")"
"$M" serve --model "$T" --bogus 1 >/dev/null 2>"$S/e4"; rc=$?
[ $rc = 2 ] || bad "--bogus: exit $rc"
"$M" serve --port 0 >/dev/null 2>"$S/e5"; rc=$?
[ $rc = 2 ] && grep -q -- "--model" "$S/e5" || bad "no --model: exit $rc"
# an empty key (--api-key "$KEY" with KEY unset) would serve everyone: refused, as an empty model id is
timeout 20 "$M" serve --model "$T" --port 0 --api-key "" >/dev/null 2>"$S/e9"; rc=$?
[ $rc = 2 ] && grep -q -- "--api-key is empty" "$S/e9" || bad "an empty --api-key: exit $rc: $(cat "$S/e9")"
timeout 20 "$M" serve --model "$T" --port 0 --served-model-name "" >/dev/null 2>"$S/e10"; rc=$?
[ $rc = 2 ] && grep -q -- "--served-model-name is empty" "$S/e10" || bad "an empty --served-model-name: exit $rc"
# sglang's and vLLM's launch lines as users write them: their names for moerun's settings, their no-op
# flags, and the fixed values moerun runs with, accepted; another value of those, or a GPU-only flag, is
# exit 2 with the reason
start_server "$S/sgl.log" --model-path "$T" --page-size 16 --stream-interval 1 --schedule-policy fcfs --enable-metrics \
    --log-level warning --disable-radix-cache --skip-self-check || exit 1
n=$(curl -s -d '{"prompt":[1,2,3],"max_tokens":5,"ignore_eos":true}' "$SV_URL/v1/completions" | jq -r '.usage.completion_tokens')
[ "$n" = 5 ] || bad "sglang's launch line: a completion gave '$n' tokens"
curl -s "$SV_URL/get_server_info" | jq -e '.disable_radix_cache == true' >/dev/null || bad "sglang's launch line: the radix cache"
stop_server
start_server "$S/vll.log" "$T" --max-model-len 256 --max-num-seqs 4 --block-size 16 --enable-prefix-caching \
    --disable-log-requests --disable-log-stats --log-level CRITICAL --skip-self-check || exit 1
curl -s "$SV_URL/get_server_info" | jq -e '.context_length == 256 and .max_running_requests == 4 and
    .disable_radix_cache == false' >/dev/null || bad "vLLM's launch line: $(curl -s "$SV_URL/get_server_info" | head -c 300)"
stop_server
# --scheduling-policy priority: with one running at a time, of two queued behind a long request the one with
# the lower priority value runs first though it came last; get_server_info says the policy; a first come, first
# served server refuses a priority, sglang's --enable-priority-scheduling needs its low-values-first flag
start_server "$S/prio.log" "$T" --scheduling-policy priority --max-running-requests 1 --skip-self-check || exit 1
curl -s "$SV_URL/get_server_info" | jq -e '.schedule_policy == "priority"' >/dev/null || bad "priority: get_server_info"
python3 - "$SV_URL" >"$S/prio.out" 2>&1 <<'PY' || bad "priority order: $(cat "$S/prio.out")"
import json, sys, threading, time, urllib.request as ur
url, done = sys.argv[1], []
def req(name, prio, n):
    body = {"prompt": [1, 2, 3], "max_tokens": n, "ignore_eos": True, "priority": prio}
    r = ur.urlopen(ur.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                              headers={"Content-Type": "application/json"}), timeout=120)
    json.loads(r.read())
    done.append(name)
def gauge(name):
    for line in ur.urlopen(url + "/metrics", timeout=30).read().decode().splitlines():
        if line.startswith("moerun:" + name + "{"):
            return float(line.split()[-1])
    return -1
def until(cond):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > 60: sys.exit("timed out waiting for the server's gauges")
        time.sleep(0.005)
# each runs alone for hundreds of tokens: the order the answers come in is the order they ran
ths = [threading.Thread(target=req, args=a) for a in (("long", 0, 1000), ("late-low", 7, 400), ("urgent", -3, 400))]
ths[0].start()
until(lambda: gauge("num_requests_running") == 1)
ths[1].start()
until(lambda: gauge("num_requests_waiting") == 1)
ths[2].start()
until(lambda: gauge("num_requests_waiting") == 2 or done)
for t in ths: t.join(120)
if done != ["long", "urgent", "late-low"]: sys.exit(f"finished in the order {done}")
PY
n=$(curl -s -d '{"prompt":[1,2,3],"max_tokens":2,"priority":"high"}' "$SV_URL/v1/completions" | jq -r .error.param)
[ "$n" = priority ] || bad "priority: a string accepted ($n)"
stop_server
start_server "$S/fcfs.log" "$T" --skip-self-check || exit 1
curl -s -d '{"prompt":[1,2,3],"max_tokens":2,"priority":1}' "$SV_URL/v1/completions" | jq -e '.error.param == "priority" and
    (.error.message | contains("--scheduling-policy priority"))' >/dev/null || bad "a priority on a first come, first served server"
[ "$(curl -s -d '{"prompt":[1,2,3],"max_tokens":2,"priority":0}' "$SV_URL/v1/completions" | jq .usage.completion_tokens)" = 2 ] ||
    bad "priority 0 on a first come, first served server"
stop_server
timeout 20 "$M" serve --model "$T" --port 0 --enable-priority-scheduling >/dev/null 2>"$S/e12"; rc=$?
[ $rc = 2 ] && grep -q -- "--schedule-low-priority-values-first" "$S/e12" || bad "--enable-priority-scheduling alone: exit $rc"
for case in "--page-size 32|pages are 16 tokens" "--block-size 8|pages are 16 tokens" "--stream-interval 4|only 1" \
            "--schedule-policy lpm|first come, first served" "--mem-fraction-static 0.9|--kv-cache-memory" \
            "--gpu-memory-utilization 0.9|GPU memory" "--log-level loud|--log" "$T|beside --model" \
            "--host 127.0.0.1 stray|'stray' beside --model" "stray --port 1 --host|unknown option or missing value" \
            "--all2all-backend pplx|GPU all-to-all" "--enable-dp-attention|attention runs replicated" \
            "--dp 2|attention runs replicated" "--enable-expert-parallel --moe-a2a-backend none|says none" \
            "--ep 2|moe_a2a_backend=none runs one rank" "--expert-parallel-size 2|moe_a2a_backend=none runs one rank"; do
    timeout 20 "$M" serve --model "$T" --port 0 ${case%|*} >/dev/null 2>"$S/e11"; rc=$?
    [ $rc = 2 ] && grep -q -- "${case#*|}" "$S/e11" || bad "${case%|*}: exit $rc: $(cat "$S/e11")"
done
# an IPv6 host is printed as a URL that works (RFC 3986 brackets), where the host has IPv6 loopback
if python3 -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
    start_server "$S/v6.log" --model "$T" --host ::1 --skip-self-check || exit 1
    u=$(grep -o 'ready on http://[^ ,]*' "$S/v6.log" | sed 's/ready on //')
    case "$u" in "http://[::1]:"[0-9]*) ;; *) bad "--host ::1: the ready line's URL is '$u'";; esac
    curl -sfg "$u/health" >/dev/null || bad "--host ::1: $u/health does not answer"
    stop_server
else
    echo "(no IPv6 loopback here: the --host ::1 check is skipped)"
fi
start_server "$S/p1.log" --model "$T" --skip-self-check || exit 1
timeout 60 "$M" serve --model "$T" --port "$SV_PORT" --skip-self-check >/dev/null 2>"$S/e6"; rc=$?
[ $rc = 1 ] && grep -q "cannot listen" "$S/e6" || bad "a port in use: exit $rc: $(cat "$S/e6")"
stop_server

[ $fails = 0 ] || exit 1
rm -rf "$S"
echo OK
