#!/usr/bin/env bash
# serve_openai.sh — compatibility with the official `openai` Python client
# (PyPI, in a private venv made by scripts/openai-venv.sh under the build
# tree): completions, streaming with include_usage, max_tokens, seed, n,
# stop_token_ids, errors raised as the right exception classes, and, on a
# MiniMax-form checkpoint with its tokenizer and chat template, chat with
# reasoning, tool calls (and the next turn), stop strings
# (tests/cli/openai_client.py); the Conversations API (tests/cli/openai_conversations.py). Expected tokens come
# from `moerun generate`.
# SKIPPED (exit 77) only when Python's venv/pip or PyPI is not reachable.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=$(cd "$(dirname "$M")" && pwd)/venv-openai
rm -rf "$S"; mkdir -p "$S"
for v in $(env | sed -n 's/^\(MOERUN_[A-Z_0-9]*\)=.*/\1/p'); do unset "$v"; done
export OMP_NUM_THREADS=1
. "$HERE/lib/serve.sh"
bash "$ROOT/scripts/openai-venv.sh" "$VENV"
rc=$?
if [ $rc = 77 ]; then echo "SKIPPED: the openai client cannot be installed here (see above)"; exit 77; fi
[ $rc = 0 ] || { echo "FAIL: scripts/openai-venv.sh exited $rc"; exit 1; }
T=$S/tiny
cp -r "$DATA/model/tiny" "$T"
# a prompt whose 10 greedy tokens hold no EOS (the server is asked to ignore it; generate stops at it)
for p in 5,6,7 9,8,7,6 30,31 40,41,42,43; do
    line=$("$M" generate --model "$T" --prompt-ids "$p" -n 10 | grep '^\[0\]')
    case "$line" in *"<eos>"*) continue;; esac
    prompt=$p; expected=$(echo "$line" | sed 's/^\[0\] //; s/ /,/g'); break
done
[ -n "${prompt:-}" ] || { echo "FAIL: no prompt without an EOS in 10 tokens"; exit 1; }
start_server "$S/a.log" --model "$T" --context-length 256 --conversation-store-mb 0 || exit 1
URL_A=$SV_URL; PID_A=$SV_PID
start_server "$S/b.log" --model "$T" --context-length 256 --api-key secret --skip-self-check || exit 1
URL_B=$SV_URL; PID_B=$SV_PID
# a MiniMax-form checkpoint (its vocabulary, tokenizer and chat template), random weights: outputs are dictated
MM=$S/minimax-form
"$M" gen-tiny "$MM" --vocab 200064 --hidden 16 --layers 1 --experts 4 --top-k 2 --expert-dim 32 --heads 2 \
    --kv-heads 1 --head-dim 32 --rotary-dim 16 >/dev/null || { echo "FAIL: gen-tiny"; exit 1; }
cp "$DATA/text/minimax/tokenizer.json" "$DATA/text/minimax/tokenizer_config.json" \
    "$DATA/text/chat/models/minimax_m2/chat_template.jinja" "$MM/"
printf '{"bos_token_id": 200034, "eos_token_id": [200020]}\n' >"$MM/generation_config.json"
sed -i 's/"eos_token_id": [0-9]*/"eos_token_id": 200020/; s/"bos_token_id": [0-9]*/"bos_token_id": 200034/' "$MM/config.json"
start_server "$S/c.log" --model "$MM" --context-length 1024 --debug-forced-output --enable-return-routed-experts --skip-self-check || exit 1
URL_C=$SV_URL; PID_C=$SV_PID
"$VENV/bin/python" "$HERE/openai_client.py" "$URL_A" "$prompt" "$expected" "$URL_B" "$URL_C"
rc=$?
# the Conversations API: on C, on a server whose conversation store is 1 MiB, and on A, where it is off
start_server "$S/cv.log" --model "$MM" --context-length 1024 --skip-self-check --conversation-store-mb 1 || exit 1
"$VENV/bin/python" "$HERE/openai_conversations.py" "$URL_C" "$SV_URL" "$URL_A" || rc=1
stop_server; [ $SV_RC = 0 ] && clean_log "$S/cv.log" || { echo "FAIL: the 1 MiB conversation store's server: $SV_RC"; rc=1; }
# CORS (the fetch standard's checks, as a browser makes them): a preflight is answered without the key, with
# the origin, the method and the asked headers allowed; every answer, a 401 included, names the origin
pre=$(curl -s -o /dev/null -D - -X OPTIONS "$URL_B/v1/chat/completions" -H "Origin: http://app.example" \
      -H "Access-Control-Request-Method: POST" -H "Access-Control-Request-Headers: authorization, content-type" | tr -d '\r')
echo "$pre" | grep -q '^HTTP/1.1 204' && echo "$pre" | grep -qi '^access-control-allow-origin: http://app.example$' &&
    echo "$pre" | grep -qi '^access-control-allow-methods: .*POST' &&
    echo "$pre" | grep -qi '^access-control-allow-headers: authorization, content-type$' ||
    { echo "FAIL: CORS preflight: $pre"; rc=1; }
for key in secret wrong; do
    got=$(curl -s -o /dev/null -D - "$URL_B/v1/models" -H "Origin: http://app.example" -H "Authorization: Bearer $key" | tr -d '\r')
    echo "$got" | grep -qi '^access-control-allow-origin: http://app.example$' || { echo "FAIL: CORS on a ($key key) answer: $got"; rc=1; }
done
# a stored response's routes refuse other methods (405), other paths and unknown or overlong ids (404)
long=$(printf 'a%.0s' $(seq 300))
codes=$(for req in "PUT /v1/responses/x" "POST /v1/responses/x/input_items" "GET /v1/responses/x/cancel" \
                   "GET /v1/responses/x/y" "DELETE /v1/responses/x" "GET /v1/responses/$long" "POST /v1/responses/x/cancel"; do
    set -- $req; curl -s -o /dev/null -w '%{http_code} ' -X "$1" "$URL_C$2"; done)
[ "$codes" = "405 405 405 404 404 404 404 " ] || { echo "FAIL: stored-response routes: $codes"; rc=1; }
codes=$(curl -s -o /dev/null -w '%{http_code} ' -X POST "$URL_B/flush_cache"
        curl -s -o /dev/null -w '%{http_code} ' -X POST "$URL_B/flush_cache" -H "Authorization: Bearer secret"
        curl -s -o /dev/null -w '%{http_code}' "$URL_B/get_server_info")
[ "$codes" = "401 200 401" ] || { echo "FAIL: /flush_cache, /get_server_info and the API key: $codes"; rc=1; }
# the key's scheme is case-insensitive (RFC 9110 11.1); a 401 says which scheme (WWW-Authenticate); a 405 lists
# what the route takes (Allow); HEAD is safe: it never flushes the cache
codes=$(for a in "bearer secret" "BEARER  secret" "Bearer secretx" "Basic secret"; do
    curl -s -o /dev/null -w '%{http_code} ' "$URL_B/v1/models" -H "Authorization: $a"; done)
[ "$codes" = "200 200 401 401 " ] || { echo "FAIL: Authorization schemes: $codes"; rc=1; }
curl -s -o /dev/null -D - "$URL_B/v1/models" | tr -d '\r' | grep -qi '^www-authenticate: bearer' ||
    { echo "FAIL: a 401 without WWW-Authenticate"; rc=1; }
for req in "PUT /health|GET, HEAD" "GET /v1/completions|POST" "HEAD /flush_cache|GET, POST" \
           "PUT /v1/responses/x|GET, HEAD, DELETE" "GET /v1/responses/x/cancel|POST" "PATCH /v1/conversations|GET, HEAD, POST, DELETE" \
           "DELETE /v1/conversations/x/items|GET, HEAD, POST" "POST /v1/conversations/x/items/y|GET, HEAD, DELETE"; do
    r=${req%%|*}; want=${req#*|}; set -- $r
    if [ "$1" = HEAD ]; then got=$(curl -s -I "$URL_C$2" | tr -d '\r'); else got=$(curl -s -o /dev/null -D - -X "$1" "$URL_C$2" | tr -d '\r'); fi
    echo "$got" | grep -q '^HTTP/1.1 405' && echo "$got" | grep -qx "Allow: $want" ||
        { echo "FAIL: $r: want 405 with Allow: $want, got $(echo "$got" | grep -E '^HTTP|^Allow' | tr '\n' ' ')"; rc=1; }
done
SV_PID=$PID_A; stop_server; ra=$SV_RC
SV_PID=$PID_B; stop_server; rb=$SV_RC
SV_PID=$PID_C; stop_server; rc3=$SV_RC
[ $rc = 0 ] || exit 1
[ $ra = 0 ] && [ $rb = 0 ] && [ $rc3 = 0 ] || { echo "FAIL: the servers exited $ra / $rb / $rc3"; exit 1; }
# --chat-template (vLLM's and sglang's flag): a file, or the template's text, in place of the folder's; the
# rendered chat tokenizes as the text the template writes (the tokenizer on that text is the oracle)
printf '%s\n%s' '{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}' \
    '{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}' >"$S/t.jinja"
for tmpl in "$S/t.jinja" "$(cat "$S/t.jinja")"; do
    start_server "$S/d.log" --model "$MM" --context-length 1024 --skip-self-check --chat-template "$tmpl" \
        --debug-forced-output || exit 1
    bos=$(jq -r '.bos_token | if type == "object" then .content else . end' "$MM/tokenizer_config.json")
    want=$(curl -s "$SV_URL/tokenize" -d "$(jq -cn --arg p "${bos}[user] hi there
[assistant]" '{prompt: $p, add_special_tokens: false}')" | jq -c .tokens)
    got=$(curl -s "$SV_URL/tokenize" -d '{"messages":[{"role":"user","content":"hi there"}]}' | jq -c .tokens)
    # a template without a tool-call format: tool_choice required is vLLM's JSON list of calls, whose end is the
    # only way on (the grammar is complete), turned into tool_calls
    calls=$(curl -s "$SV_URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"w?"}],"tool_choice":"required",
        "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":
        {"city":{"type":"string"}},"required":["city"]}}}],"max_tokens":60,
        "debug_forced_output":"[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}]"}' |
        jq -c '.choices[0] | [.finish_reason, .message.content, .message.tool_calls[0].function.name,
                              (.message.tool_calls[0].function.arguments | fromjson)]')
    stop_server
    [ "$calls" = '["tool_calls",null,"get_weather",{"city":"Rome"}]' ] ||
        { echo "FAIL: tool_choice required with a plain template: $calls"; exit 1; }
    [ "$got" = "$want" ] && [ "$got" != null ] || { echo "FAIL: --chat-template ${tmpl:0:40}: $got, want $want"; exit 1; }
    clean_log "$S/d.log" || { echo "FAIL: sanitizer report with --chat-template"; exit 1; }
done
# vLLM's MiniMax-M2 launch flags: --reasoning-parser minimax_m2_append_think keeps the reasoning in content after
# "<think>" (streamed alike), --tool-call-parser minimax_m2 still parses the calls; --enable-auto-tool-choice and
# --trust-remote-code are accepted; an unknown parser is a usage error, a parser for another template exit 1
start_server "$S/f.log" --model "$MM" --context-length 1024 --skip-self-check --debug-forced-output \
    --reasoning-parser minimax_m2_append_think --tool-call-parser minimax_m2 --enable-auto-tool-choice --trust-remote-code \
    --response-store-mb 0 --allowed-origins 'http://a.example, http://b.example' || exit 1
# only the origins given: another's preflight is a 403, its answers carry no CORS header
cors=$(for o in http://b.example http://c.example; do
    curl -s -o /dev/null -w '%{http_code} ' -X OPTIONS "$SV_URL/v1/responses" -H "Origin: $o" -H "Access-Control-Request-Method: POST"
    curl -s -o /dev/null -D - "$SV_URL/health" -H "Origin: $o" | tr -d '\r' | grep -ci '^access-control-allow-origin'
done | tr '\n' ' ')
[ "$cors" = "204 1 403 0 " ] || { echo "FAIL: --allowed-origins: $cors"; exit 1; }
# no response store: a Response says store false, previous_response_id is a 400 that says why, a lookup a 404
kept=$(curl -s "$SV_URL/v1/responses" -d '{"input": "x", "max_output_tokens": 2}' | jq -c .store)
prev=$(curl -s -w ' %{http_code}' "$SV_URL/v1/responses" -d '{"input": "x", "previous_response_id": "resp_x"}')
look=$(curl -s -o /dev/null -w '%{http_code}' "$SV_URL/v1/responses/resp_x")
[ "$kept" = false ] && [ "${prev##* }" = 400 ] && [ "$look" = 404 ] && echo "$prev" | grep -q -- '--response-store-mb 0' ||
    { echo "FAIL: without a response store: store $kept, previous_response_id $prev, GET $look"; exit 1; }
# the prefix cache flushed (sglang's /flush_cache, GET or POST; vLLM's POST /reset_prefix_cache): the same chat
# prompt hits the cache, then after a flush hits nothing; while a request runs a flush is a 400 that leaves the
# cache; the key is asked where the server has one
cached() { curl -s "$SV_URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Tell me about the prefix cache of this server, at length."}],
    "max_tokens":2}' | jq -c '.usage.prompt_tokens_details.cached_tokens'; }
f0=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$SV_URL/flush_cache"); c0=$(cached); c1=$(cached)
f1=$(curl -s -w ' %{http_code}' -X POST "$SV_URL/flush_cache"); c2=$(cached)
f2=$(curl -s -o /dev/null -w '%{http_code}' "$SV_URL/flush_cache"); c3=$(cached)
f3=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$SV_URL/reset_prefix_cache"); c4=$(cached)
[ "$f0" = 200 ] && [ "$c0" = 0 ] && [ "$c1" -gt 0 ] && [ "$c2" = 0 ] && [ "$c3" = 0 ] && [ "$c4" = 0 ] && [ "${f1##* }" = 200 ] &&
    [ "$f2" = 200 ] && [ "$f3" = 200 ] && echo "$f1" | grep -q 'Cache flushed' ||
    { echo "FAIL: flush: cached $c0 $c1 $c2 $c3 $c4, flushes $f1 / $f2 / $f3"; exit 1; }
c5=$(cached)
# busy: 16 answers of 900 tokens over a 200k vocabulary (tens of seconds here); the flush is refused at once
curl -sN "$SV_URL/v1/completions" -d '{"prompt":"x","n":16,"max_tokens":900,"ignore_eos":true,"stream":true}' >/dev/null &
busy=$!
sleep 1
f4=$(curl -s -w ' %{http_code}' -X POST "$SV_URL/flush_cache")
kill $busy 2>/dev/null; wait $busy 2>/dev/null
f5=000
for i in $(seq 1 100); do f5=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$SV_URL/reset_prefix_cache"); [ "$f5" = 200 ] && break; sleep 0.1; done
[ "${f4##* }" = 400 ] && echo "$f4" | grep -q 'running or waiting' && [ "$c5" -gt 0 ] && [ "$f5" = 200 ] ||
    { echo "FAIL: flush while busy: $f4 (cached before: $c5), after the client left: $f5"; exit 1; }
# sglang's /get_server_info (and /server_info): the settings this server was started with, what the ready line
# says, and the resolver's decision as `moerun resolve --json` gives it for the same model and flags
info=$(curl -s "$SV_URL/get_server_info")
blocks=$(sed -n 's/.*context 1024, \([0-9]*\) KV blocks of 16 tokens.*/\1/p' "$S/f.log")
"$M" resolve --model "$MM" --context-length 1024 --json >"$S/resolve.json" || { echo "FAIL: moerun resolve --json"; exit 1; }
echo "$info" | jq -e --arg mm "$MM" --argjson blocks "${blocks:-0}" --slurpfile rj "$S/resolve.json" '
    .served_model_name == "minimax-form" and .tokenizer_path == $mm and .context_length == 1024 and
    .response_store_bytes == 0 and .page_size == 16 and .max_total_num_tokens == $blocks * 16 and $blocks > 0 and
    .internal_states[0].memory_usage.token_capacity == $blocks * 16 and .disable_radix_cache == false and
    .resolution.options == $rj[0].options and .moe_runner == $rj[0].options.moe_runner_backend.value' >/dev/null ||
    { echo "FAIL: /get_server_info: $(echo "$info" | jq -c 'del(.resolution)'), $blocks blocks in the log"; exit 1; }
[ "$(curl -s "$SV_URL/server_info" | jq -c 'del(.internal_states)')" = "$(echo "$info" | jq -c 'del(.internal_states)')" ] ||
    { echo "FAIL: /server_info differs from /get_server_info"; exit 1; }
codes=$(curl -s -o /dev/null -w '%{http_code} ' -X PUT "$SV_URL/flush_cache"
        curl -s -o /dev/null -w '%{http_code} ' -X POST "$SV_URL/get_server_info"
        curl -s -o /dev/null -w '%{http_code}' "$SV_URL/reset_prefix_cache")
[ "$codes" = "405 405 405" ] || { echo "FAIL: flush and server-info routes: $codes"; exit 1; }
BODY=$(jq -cn --arg f $'Thinking.</think>\n\n<minimax:tool_call>\n<invoke name="w">\n<parameter name="c">Rome</parameter>\n</invoke>\n</minimax:tool_call>' \
    '{messages: [{role: "user", content: "w?"}], max_tokens: 60, temperature: 0, debug_forced_output: $f, tools: [{type: "function",
      function: {name: "w", parameters: {type: "object", properties: {c: {type: "string"}}}}}]}')
one=$(curl -s "$SV_URL/v1/chat/completions" -d "$BODY")
str=$(curl -sN "$SV_URL/v1/chat/completions" -d "$(echo "$BODY" | jq -c '.stream = true')" | sed -n 's/^data: //p' |
      grep -v '^\[DONE\]' | jq -rj '.choices[0].delta.content // empty')
stop_server
echo "$one" | jq -e '(.choices[0].message.content | startswith("<think>Thinking.</think>")) and
                     (.choices[0].message.reasoning_content == null) and
                     (.choices[0].message.tool_calls[0].function.arguments | fromjson | .c == "Rome")' >/dev/null ||
    { echo "FAIL: append-think: $one"; exit 1; }
[ "$str" = "$(echo "$one" | jq -rj ".choices[0].message.content")" ] || { echo "FAIL: append-think streamed: $(printf %q "$str") vs $(echo "$one" | jq .choices[0].message.content)"; exit 1; }
"$M" serve --model "$MM" --port 0 --reasoning-parser deepseek_r1 >"$S/g.log" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "not a parser served here" "$S/g.log" || { echo "FAIL: an unknown parser: exit $rc"; exit 1; }
timeout 60 "$M" serve --model "$MM" --port 0 --skip-self-check --chat-template '{{ messages[0].content }}' \
    --tool-call-parser minimax-m2 >"$S/g.log" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "not MiniMax-M2's" "$S/g.log" || { echo "FAIL: a parser for another template: exit $rc"; exit 1; }
for tmpl in "$S/none.jinja" '{% for m in messages %}'; do
    timeout 60 "$M" serve --model "$MM" --port 0 --skip-self-check --chat-template "$tmpl" >"$S/e.log" 2>&1; rc=$?
    [ $rc = 1 ] && grep -q "chat template" "$S/e.log" || { echo "FAIL: a bad --chat-template: exit $rc: $(tail -1 "$S/e.log")"; exit 1; }
done
clean_log "$S/a.log" && clean_log "$S/b.log" && clean_log "$S/c.log" || { echo "FAIL: sanitizer report in a server log"; exit 1; }
rm -rf "$S"
echo OK
