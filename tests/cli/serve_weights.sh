#!/usr/bin/env bash
# serve_weights.sh — new weights and paused generation on a running server (the RL endpoints of sglang and
# vLLM), checked against `moerun generate` on each checkpoint (greedy, so every output has one right answer):
#  - --weight-version, /get_model_info, /get_weight_version, /weight_info, meta_info.weight_version;
#  - /update_weights_from_disk: the next requests run on the new checkpoint, token for token; a request
#    running when it comes runs to its end on the old weights (the update waits for it; a second update
#    meanwhile is a 409) and the one sent meanwhile waits and runs on the new ones; abort_all_requests ends
#    the running one; a checkpoint of another shape, a missing one, bad fields are 400s and nothing changes;
#  - /pause_generation in_place (nothing is computed: the token counter stands still; a new request waits),
#    /continue_generation (the held request ends as if never paused), retract (recomputed, the same tokens),
#    abort, a client that leaves while held (its request ends, its blocks go back); new weights while paused in place (flush_cache true is refused, false swaps under the held
#    request); vLLM's /pause?mode=wait (answers when the running request ended), /is_paused, /resume;
#  - /update_weight_version; SIGTERM while paused drains the held request and exits 0;
#  - the old weights' memory goes back to the system after an update.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
. "$(dirname "$0")/lib/serve.sh"
serve_test_begin
dims="--hidden 128 --layers 2 --experts 16 --top-k 2 --expert-dim 128 --heads 4 --kv-heads 1 --head-dim 32 --rotary-dim 16 --vocab 512"
for c in "A --seed 1" "B --seed 2" "C --seed 1 --layers 3"; do
    set -- $c
    "$M" gen-tiny "$S/$1" $dims "${@:2}" >/dev/null || { bad "gen-tiny $c"; exit 1; }
done
A=$S/A; B=$S/B
# the oracle: the greedy ids of a checkpoint (moerun generate, a fresh process)
want() { "$M" generate --model "$1" --prompt-ids "$2" -n "$3" --ignore-eos 2>/dev/null | sed -n 's/^\[0\] //p' | tr ' ' ','; }
gen() { # gen PROMPT N [CURL ARGS]: the server's greedy ids for the prompt
    curl -s --max-time 120 "$SV_URL/generate" "${@:3}" -d "{\"input_ids\":[$1],\"sampling_params\":{\"max_new_tokens\":$2,\"temperature\":0,\"ignore_eos\":true}}"
}
ids() { jq -r '.output_ids | map(tostring) | join(",")' "$1"; }
post() { curl -s --max-time 120 -o "$S/post.json" -w '%{http_code}' "$SV_URL$1" -d "${2:-}"; }
WA=$(want "$A" 5,6,7 12); WB=$(want "$B" 5,6,7 12)
[ -n "$WA" ] && [ "$WA" != "$WB" ] || { bad "the two checkpoints' oracles: '$WA' '$WB'"; exit 1; }
LONG=600 # tokens of a long request: 2 ms a step (--debug-step-delay-ms) make it last over 1.2 s
LA=$(want "$A" 9,8,7 $LONG); LB=$(want "$B" 9,8,7 $LONG)

start_server "$S/serve.log" --model "$A" --context-length 4096 --weight-version v0 --debug-step-delay-ms 2 || exit 1
for r in get_model_info get_weight_version weight_info; do
    [ "$(curl -s "$SV_URL/$r" | jq -r .weight_version)" = v0 ] || bad "/$r does not say v0"
done
gen 5,6,7 12 >"$S/g.json"
[ "$(ids "$S/g.json")" = "$WA" ] && [ "$(jq -r .meta_info.weight_version "$S/g.json")" = v0 ] || bad "before: $(cat "$S/g.json")"

# --- new weights between requests ---
code=$(post /update_weights_from_disk "{\"model_path\":\"$B\",\"weight_version\":\"v1\"}")
[ "$code" = 200 ] && [ "$(jq -r .success "$S/post.json")" = true ] || bad "update to B: $code $(cat "$S/post.json")"
gen 5,6,7 12 >"$S/g.json"
[ "$(ids "$S/g.json")" = "$WB" ] && [ "$(jq -r .meta_info.weight_version "$S/g.json")" = v1 ] || bad "after B: $(cat "$S/g.json")"
# sglang's OpenAI answers carry it too (metadata.weight_version), unstreamed
m=$(curl -s "$SV_URL/v1/completions" -d '{"prompt":[5,6,7],"max_tokens":2}' | jq -r .metadata.weight_version)
[ "$m" = v1 ] || bad "completions' metadata.weight_version: $m"
[ "$(metric moerun:weight_updates_total)" = 1 ] || bad "weight_updates_total: $(metric moerun:weight_updates_total)"
# refusals leave B running
for body in "{\"model_path\":\"$S/C\"}|num_hidden_layers is 2 in the running model and 3" \
            "{\"model_path\":\"$S/none\"}|no config.json" "{\"model_path\":5}|model_path" \
            "{\"model_path\":\"$A\",\"bogus\":1}|bogus" "{\"model_path\":\"$A\",\"is_async\":true}|is_async" \
            "{\"model_path\":\"$A\",\"load_format\":\"dummy\"}|load_format" "{\"model_path\":\"$A\",\"flush_cache\":1}|flush_cache" \
            "{\"model_path\":\"$A\",\"weight_version\":\"\"}|weight_version" "[1]|object" "{|JSON"; do
    code=$(post /update_weights_from_disk "${body%|*}")
    [ "$code" = 400 ] && grep -q "${body##*|}" "$S/post.json" || bad "refusal ${body%|*}: $code $(cat "$S/post.json")"
done
gen 5,6,7 12 >"$S/g.json"
[ "$(ids "$S/g.json")" = "$WB" ] || bad "a refused update changed the answers: $(cat "$S/g.json")"
[ "$(curl -s "$SV_URL/get_weight_version" | jq -r .weight_version)" = v1 ] || bad "a refused update changed the version"

# --- an update while a request runs: it waits for it; the request sent meanwhile runs on the new weights ---
running() { [ "$(metric moerun:num_requests_running)" = 1 ]; }
wait_running() { local i; for i in $(seq 400); do running && return 0; sleep 0.01; done; return 1; }
( gen 9,8,7 $LONG >"$S/long.json"; echo "$(now_ms)" >"$S/long.t" ) &
JL=$!
wait_running || bad "the long request is not running"
( post /update_weights_from_disk "{\"model_path\":\"$A\",\"weight_version\":\"v2\"}" >"$S/upd.code"; cp "$S/post.json" "$S/upd.json"
  echo "$(now_ms)" >"$S/upd.t" ) &
JU=$!
sleep 0.2
code=$(curl -s -o "$S/second.json" -w '%{http_code}' "$SV_URL/update_weights_from_disk" -d "{\"model_path\":\"$A\"}")
[ "$code" = 409 ] || bad "a second update during the first: $code $(cat "$S/second.json")"
gen 5,6,7 12 >"$S/during.json"
wait $JL $JU
[ "$(cat "$S/upd.code")" = 200 ] || bad "the update during a request: $(cat "$S/upd.code") $(cat "$S/upd.json")"
[ "$(ids "$S/long.json")" = "$LB" ] && [ "$(jq -r .meta_info.weight_version "$S/long.json")" = v1 ] ||
    bad "the request running during the update did not end on the old weights: $(jq -c .meta_info "$S/long.json")"
[ "$(cat "$S/upd.t")" -ge "$(cat "$S/long.t")" ] || bad "the update answered before the running request ended"
[ "$(ids "$S/during.json")" = "$WA" ] && [ "$(jq -r .meta_info.weight_version "$S/during.json")" = v2 ] ||
    bad "the request sent during the update: $(cat "$S/during.json")"
# abort_all_requests ends the running one at once
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (abort)"
code=$(post /update_weights_from_disk "{\"model_path\":\"$B\",\"abort_all_requests\":true,\"weight_version\":\"v3\"}")
wait $JL
[ "$code" = 200 ] && [ "$(jq -r .meta_info.finish_reason.type "$S/long.json")" = abort ] ||
    bad "abort_all_requests: $code $(jq -c .meta_info "$S/long.json")"

# --- pause in place: nothing is computed, a new request waits; continue ends the held one as if unpaused ---
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (pause)"
code=$(post /pause_generation '{"mode":"in_place"}')
[ "$code" = 200 ] && [ "$(jq -r .status "$S/post.json")" = ok ] || bad "pause in place: $code $(cat "$S/post.json")"
[ "$(curl -s "$SV_URL/is_paused" | jq -r .is_paused)" = true ] || bad "/is_paused after a pause"
[ "$(metric moerun:generation_paused)" = 1 ] || bad "generation_paused gauge"
t1=$(metric moerun:generation_tokens_total); sleep 0.5; t2=$(metric moerun:generation_tokens_total)
[ "$t1" = "$t2" ] || bad "tokens were generated while paused: $t1 -> $t2"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$SV_URL/generate" -d '{"input_ids":[1],"sampling_params":{"max_new_tokens":1}}')
[ "$code" = 000 ] || bad "a request answered while paused: $code"
code=$(post /pause_generation '{"mode":"sideways"}')
[ "$code" = 400 ] || bad "an unknown pause mode: $code"
# new weights while paused in place: flushing the cache is refused (the held request holds KV blocks)
code=$(post /update_weights_from_disk "{\"model_path\":\"$A\"}")
[ "$code" = 400 ] && grep -q "paused in place" "$S/post.json" || bad "flush while held in place: $code $(cat "$S/post.json")"
[ "$(curl -s "$SV_URL/get_weight_version" | jq -r .weight_version)" = v3 ] || bad "the refused update changed the version"
code=$(post /continue_generation '{}')
[ "$code" = 200 ] || bad "continue: $code"
wait $JL
[ "$(ids "$S/long.json")" = "$LB" ] || bad "the request held in place: $(jq -c .meta_info "$S/long.json")"
[ "$(curl -s "$SV_URL/is_paused" | jq -r .is_paused)" = false ] || bad "/is_paused after continue"
# retract: the held request recomputes (the same weights: the same tokens)
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (retract)"
[ "$(post /pause_generation '{"mode":"retract"}')" = 200 ] || bad "pause retract"
[ "$(metric moerun:num_requests_running)" = 0 ] || bad "a retracted request still runs"
[ "$(post /continue_generation)" = 200 ] || bad "continue after retract"
wait $JL
[ "$(ids "$S/long.json")" = "$LB" ] || bad "the retracted request: $(jq -c .meta_info "$S/long.json")"
# in place, then new weights without the flush: the held request goes on under them
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (swap in place)"
[ "$(post /pause_generation '{"mode":"in_place"}')" = 200 ] || bad "pause in place (2)"
code=$(post /update_weights_from_disk "{\"model_path\":\"$A\",\"flush_cache\":false,\"weight_version\":\"v4\"}")
[ "$code" = 200 ] && [ "$(jq -r .num_paused_requests "$S/post.json")" = 1 ] || bad "swap in place: $code $(cat "$S/post.json")"
[ "$(post /continue_generation)" = 200 ] || bad "continue after the swap"
wait $JL
[ "$(jq -r .meta_info.finish_reason.type "$S/long.json")" = length ] && [ "$(ids "$S/long.json")" != "$LB" ] &&
    [ "$(jq -r .meta_info.weight_version "$S/long.json")" = v4 ] || bad "the request across the swap: $(jq -c .meta_info "$S/long.json")"
gen 5,6,7 12 >"$S/g.json"
[ "$(ids "$S/g.json")" = "$WA" ] || bad "after the swap in place: $(cat "$S/g.json")"
# a client that leaves while its request is held in place: the request ends and its KV blocks go back
curl -s --max-time 120 "$SV_URL/generate" -o /dev/null \
    -d "{\"input_ids\":[9,8,7],\"sampling_params\":{\"max_new_tokens\":$LONG,\"ignore_eos\":true}}" &
JL=$! # curl itself (not a function's subshell): killing it closes the connection
wait_running || bad "the long request is not running (client leaves)"
[ "$(post /pause_generation '{"mode":"in_place"}')" = 200 ] || bad "pause in place (3)"
[ "$(metric moerun:kv_cache_used_blocks)" -gt 0 ] || bad "the held request holds no KV blocks"
kill $JL; wait $JL 2>/dev/null
for i in $(seq 300); do [ "$(metric moerun:num_requests_running)" = 0 ] && break; sleep 0.02; done
[ "$(metric moerun:num_requests_running)" = 0 ] && [ "$(metric moerun:kv_cache_used_blocks)" = 0 ] ||
    bad "a held request whose client left: running $(metric moerun:num_requests_running), blocks $(metric moerun:kv_cache_used_blocks)"
[ "$(post /continue_generation)" = 200 ] || bad "continue after the client left"
# abort
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (abort pause)"
[ "$(post /pause_generation '{}')" = 200 ] || bad "pause (abort)"
wait $JL
[ "$(jq -r .meta_info.finish_reason.type "$S/long.json")" = abort ] || bad "pause abort: $(jq -c .meta_info "$S/long.json")"
[ "$(post /continue_generation)" = 200 ] || bad "continue after abort"

# --- vLLM's /pause?mode=wait answers once the running request has ended; /resume ---
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (vLLM wait)"
code=$(curl -s -o "$S/post.json" -w '%{http_code}' -X POST "$SV_URL/pause?mode=wait")
t_pause=$(now_ms)
[ "$code" = 200 ] && [ "$(jq -r .status "$S/post.json")" = paused ] || bad "vLLM pause wait: $code $(cat "$S/post.json")"
[ "$(metric moerun:num_requests_running)" = 0 ] || bad "vLLM's wait answered with a request running"
wait $JL
[ "$(ids "$S/long.json")" = "$LA" ] || bad "the request vLLM's wait let finish: $(jq -c .meta_info "$S/long.json")"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$SV_URL/pause?mode=later")
[ "$code" = 400 ] || bad "vLLM pause mode later: $code"
code=$(curl -s -o "$S/post.json" -w '%{http_code}' -X POST "$SV_URL/resume")
[ "$code" = 200 ] && [ "$(jq -r .status "$S/post.json")" = resumed ] || bad "vLLM resume: $code"
# keep (with clear_cache, vLLM's default: the held request recomputes, the same weights giving the same tokens)
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (vLLM keep)"
code=$(curl -s -o "$S/post.json" -w '%{http_code}' -X POST "$SV_URL/pause?mode=keep")
[ "$code" = 200 ] && [ "$(curl -s "$SV_URL/is_paused" | jq -r .is_paused)" = true ] || bad "vLLM pause keep: $code"
[ "$(metric moerun:num_requests_running)" = 0 ] || bad "vLLM keep with clear_cache left the request running (not recomputed)"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$SV_URL/resume")" = 200 ] || bad "vLLM resume after keep"
wait $JL
[ "$(ids "$S/long.json")" = "$LA" ] || bad "the request vLLM's keep held: $(jq -c .meta_info "$S/long.json")"
# keep_pause: the update leaves generation paused
code=$(post /update_weights_from_disk "{\"model_path\":\"$A\",\"keep_pause\":true}")
[ "$code" = 200 ] && [ "$(curl -s "$SV_URL/is_paused" | jq -r .is_paused)" = true ] || bad "keep_pause: $code"
[ "$(post /continue_generation)" = 200 ] && [ "$(curl -s "$SV_URL/is_paused" | jq -r .is_paused)" = false ] ||
    bad "continue after keep_pause"

# --- the version alone ---
code=$(post /update_weight_version '{"new_version":"v9"}')
[ "$code" = 200 ] && [ "$(jq -r .new_version "$S/post.json")" = v9 ] || bad "update_weight_version: $code"
[ "$(curl -s "$SV_URL/get_weight_version" | jq -r .weight_version)" = v9 ] || bad "the version after update_weight_version"
[ "$(post /update_weight_version '{"new_version":""}')" = 400 ] || bad "an empty new_version"
[ "$(post /update_weight_version '{}')" = 400 ] || bad "no new_version"

# --- SIGTERM while paused: the held request runs to its end, exit 0 ---
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (drain)"
[ "$(post /pause_generation '{"mode":"in_place"}')" = 200 ] || bad "pause before SIGTERM"
stop_server
[ "$SV_RC" = 0 ] || bad "SIGTERM while paused: exit $SV_RC"
wait $JL
[ "$(ids "$S/long.json")" = "$LA" ] || bad "the request held at SIGTERM: $(jq -c .meta_info "$S/long.json" 2>&1 | head -c 300)"
clean_log "$S/serve.log" || bad "sanitizer report or crash"

# --- the old weights' memory goes back: three updates of a 195 MB checkpoint leave the process's anonymous
# memory where it was (glibc keeps freed heap pages unless trimmed; not under a sanitizer's allocator) ---
if ! ldd "$M" 2>/dev/null | grep -q 'libasan\|libtsan'; then
    big="--hidden 512 --layers 2 --experts 64 --top-k 2 --expert-dim 512 --heads 4 --kv-heads 1 --head-dim 64 --rotary-dim 32 --vocab 512"
    "$M" gen-tiny "$S/G1" $big --seed 1 >/dev/null && "$M" gen-tiny "$S/G2" $big --seed 2 >/dev/null || bad "gen-tiny (big)"
    start_server "$S/big.log" --model "$S/G1" --context-length 512 --skip-self-check || exit 1
    anon() { awk '/^RssAnon:/ {print int($2 / 1024)}' "/proc/$SV_PID/status"; }
    before=$(anon)
    for k in 2 1 2; do
        [ "$(post /update_weights_from_disk "{\"model_path\":\"$S/G$k\"}")" = 200 ] || bad "big update to G$k: $(cat "$S/post.json")"
    done
    after=$(anon)
    [ "$after" -lt $((before + 80)) ] || bad "the old weights' memory stayed: RssAnon $before MiB before three updates, $after MiB after"
    stop_server
    [ "$SV_RC" = 0 ] || bad "the big server exited $SV_RC"
fi
# --- sleep (vLLM's /sleep, sglang's /release_memory_occupation): the KV cache's memory goes back to the
# system; a request running when it comes goes back to the queue and, after /wake_up, ends with the tokens
# of an unbroken run; new requests wait meanwhile ---
kvd="--hidden 128 --layers 2 --experts 4 --top-k 2 --expert-dim 64 --heads 4 --kv-heads 4 --head-dim 64 --rotary-dim 32 --vocab 512"
"$M" gen-tiny "$S/K" $kvd --seed 3 >/dev/null || bad "gen-tiny (KV)"
KL=$(want "$S/K" 9,8,7 $LONG)
start_server "$S/kv.log" --model "$S/K" --context-length 8192 --skip-self-check --debug-step-delay-ms 2 || exit 1
anon() { awk '/^RssAnon:/ {print int($2 / 1024)}' "/proc/$SV_PID/status"; }
# an 8000-token prompt writes 8000 x 2 KiB of bf16 K and V (2 layers, 4 KV heads of 64): about 16 MiB of pool pages
big_ids=$(seq 0 7999 | awk '{print 10 + $1 % 400}' | paste -sd,)
gen "$big_ids" 2 >"$S/bigp.json"
[ "$(jq -r .meta_info.prompt_tokens "$S/bigp.json")" = 8000 ] || bad "the big prompt: $(head -c 200 "$S/bigp.json")"
gen 9,8,7 $LONG >"$S/long.json" &
JL=$!
wait_running || bad "the long request is not running (sleep)"
before=$(anon)
code=$(curl -s -o "$S/sleep.json" -w '%{http_code}' -X POST "$SV_URL/sleep?level=1")
after=$(anon)
[ "$code" = 200 ] && [ "$(curl -s "$SV_URL/is_sleeping" | jq -r .is_sleeping)" = true ] || bad "sleep: $code $(cat "$S/sleep.json")"
[ "$after" -lt $((before - 10)) ] && [ "$(jq -r .memory_released_bytes "$S/sleep.json")" -gt $((10 << 20)) ] ||
    bad "sleep gave back too little: RssAnon $before MiB before, $after MiB after ($(cat "$S/sleep.json"))"
gen 5,6,7 12 >"$S/during.json" &
JD=$!
sleep 0.5
kill -0 $JD 2>/dev/null || bad "a request answered while asleep: $(head -c 200 "$S/during.json")"
kill -0 $JL 2>/dev/null || bad "the long request ended while asleep"
for body in "level=2|level" "tags=weights|weights stay resident" "tags=gpu|tags are"; do
    code=$(curl -s -o "$S/post.json" -w '%{http_code}' -X POST "$SV_URL/sleep?${body%|*}")
    [ "$code" = 400 ] && grep -q "${body#*|}" "$S/post.json" || bad "sleep?${body%|*}: $code $(cat "$S/post.json")"
done
code=$(post /release_memory_occupation '{"tags":["weights"]}')
[ "$code" = 400 ] || bad "release_memory_occupation of the weights: $code"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$SV_URL/wake_up?tags=kv_cache&tags=weights")" = 200 ] &&
    [ "$(curl -s "$SV_URL/is_sleeping" | jq -r .is_sleeping)" = false ] || bad "wake_up"
wait $JL $JD
[ "$(ids "$S/long.json")" = "$KL" ] || bad "the request retracted by the sleep: $(jq -c .meta_info "$S/long.json" 2>&1 | head -c 300)"
[ "$(ids "$S/during.json")" = "$(want "$S/K" 5,6,7 12)" ] || bad "the request sent while asleep: $(head -c 300 "$S/during.json")"
# sglang's pair, with no tags (the KV cache)
[ "$(post /release_memory_occupation '{}')" = 200 ] && [ "$(jq -r .success "$S/post.json")" = true ] || bad "release_memory_occupation"
[ "$(post /resume_memory_occupation '{}')" = 200 ] && [ "$(curl -s "$SV_URL/is_sleeping" | jq -r .is_sleeping)" = false ] ||
    bad "resume_memory_occupation"
gen 5,6,7 12 >"$S/g.json"
[ "$(ids "$S/g.json")" = "$(want "$S/K" 5,6,7 12)" ] || bad "after resume_memory_occupation: $(head -c 300 "$S/g.json")"
stop_server
[ "$SV_RC" = 0 ] || bad "the KV server exited $SV_RC"
clean_log "$S/kv.log" || bad "sanitizer report or crash (sleep)"

[ $fails = 0 ] || { tail -20 "$S/serve.log"; exit 1; }
rm -rf "$S"
echo OK
