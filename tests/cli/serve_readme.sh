#!/usr/bin/env bash
# serve_readme.sh — the README's serving walk-through on the trained default
# model (models/tiny-kjv): `moerun serve --model models/tiny-kjv`, then the
# curl calls. Oracle: `moerun generate` (another driver of the same engine,
# no HTTP): the completion's text is generate's continuation of the prompt,
# the chat answer's reasoning and content are generate --chat's, and the
# streamed chat reassembles to the non-streamed one.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=$ROOT/models/tiny-kjv
. "$(dirname "$0")/lib/serve.sh"
serve_test_begin
command -v jq >/dev/null || { echo "SKIPPED: jq is not installed (scripts/install-deps.sh installs it)"; exit 77; }
[ -f "$MODEL/tokenizer.json" ] || { echo "FAIL: $MODEL is missing"; exit 1; }
# generate's answers (greedy)
"$M" generate --model "$MODEL" --prompt "And God said," -n 32 2>/dev/null | sed -n 3p >"$S/gen.txt"
"$M" generate --model "$MODEL" --chat --prompt "Genesis 1:3" -n 80 2>/dev/null | sed '1,2d;$d' >"$S/genchat.txt"
start_server "$S/serve.log" --model "$MODEL" --kv-cache-memory 64M || exit 1
P=$SV_PORT
curl -s localhost:$P/v1/completions -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "prompt": "And God said,", "max_tokens": 32, "temperature": 0}' >"$S/c.json"
got="And God said,$(jq -r '.choices[0].text' "$S/c.json")"
[ "$got" = "$(cat "$S/gen.txt")" ] || bad "completion: '$got' differs from generate's '$(cat "$S/gen.txt")'"
[ "$(jq -r '.usage.completion_tokens > 0 and .usage.prompt_tokens > 0' "$S/c.json")" = true ] || bad "completion usage"
# the first request: /metrics' token counters are exactly its usage (the self-check at start is not counted)
m=$(curl -s localhost:$P/metrics)
mp=$(echo "$m" | sed -n 's/^moerun:prompt_tokens_total{[^}]*} //p'); mg=$(echo "$m" | sed -n 's/^moerun:generation_tokens_total{[^}]*} //p')
[ "$mp" = "$(jq -r .usage.prompt_tokens "$S/c.json")" ] && [ "$mg" = "$(jq -r .usage.completion_tokens "$S/c.json")" ] ||
    bad "/metrics after the first request: $mp prompt and $mg generated tokens, its usage $(jq -c .usage "$S/c.json")"
# sglang's /generate with return_logprob and return_text_in_logprobs: the entries' texts spell generate's
# continuation, their ids are output_ids, one a completion token
curl -s localhost:$P/generate -H 'Content-Type: application/json' -d '{"text": "And God said,", "sampling_params":
     {"max_new_tokens": 32, "temperature": 0}, "return_logprob": true, "return_text_in_logprobs": true}' >"$S/g.json"
got="And God said,$(jq -r '[.meta_info.output_token_logprobs[][2]] | join("")' "$S/g.json")"
got=${got%"[e~["} # the EOS that ended it is a completion token too, with its text (the answer's text leaves it out)
[ "$got" = "$(cat "$S/gen.txt")" ] || bad "/generate logprob texts: '$got' differ from generate's '$(cat "$S/gen.txt")'"
jq -e '.meta_info | (.output_token_logprobs | length) == .completion_tokens and
       ([.output_token_logprobs[][0]] | all(. <= 0))' "$S/g.json" >/dev/null &&
    jq -e '[.meta_info.output_token_logprobs[][1]] == .output_ids' "$S/g.json" >/dev/null || bad "/generate logprobs: $(head -c 300 "$S/g.json")"
curl -s localhost:$P/v1/chat/completions -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "messages": [{"role": "user", "content": "Genesis 1:3"}], "max_tokens": 80, "temperature": 0}' >"$S/chat.json"
reasoning=$(jq -r '.choices[0].message.reasoning_content' "$S/chat.json")
content=$(jq -r '.choices[0].message.content' "$S/chat.json")
# generate --chat prints "<reasoning>\n</think>\n\n<content>"
want_r=$(sed -n '1p' "$S/genchat.txt"); want_c=$(sed -n '4,$p' "$S/genchat.txt")
[ "$reasoning" = "$want_r" ] || bad "chat reasoning '$reasoning' differs from generate --chat's '$want_r'"
[ "$content" = "$want_c" ] || bad "chat content '$content' differs from generate --chat's '$want_c'"
# sglang's native /generate (what sglang.bench_serving's default backend sends): the same continuation,
# whole and streamed (each event holds the text so far and the token count)
curl -s localhost:$P/generate -H 'Content-Type: application/json' \
     -d '{"text": "And God said,", "sampling_params": {"max_new_tokens": 32, "temperature": 0}}' >"$S/gen.json"
[ "And God said,$(jq -r '.text' "$S/gen.json")" = "$(cat "$S/gen.txt")" ] || bad "/generate: $(head -c 300 "$S/gen.json")"
# an EOS ends it as a stop that names the token (the last id), else the length does
[ "$(jq -r '.meta_info.completion_tokens == (.output_ids | length) and (.meta_info.finish_reason.type == "length" or
     .meta_info.finish_reason.matched == .output_ids[-1])' "$S/gen.json")" = true ] ||
    bad "/generate meta_info: $(head -c 400 "$S/gen.json")"
ids=$(curl -s localhost:$P/tokenize -H 'Content-Type: application/json' -d '{"prompt": "And God said,"}' | jq -c .tokens)
curl -s localhost:$P/generate -H 'Content-Type: application/json' \
     -d '{"input_ids": '"$ids"', "sampling_params": {"max_new_tokens": 32, "temperature": 0}}' >"$S/genids.json"
[ "$(jq -r .text "$S/genids.json")" = "$(jq -r .text "$S/gen.json")" ] || bad "/generate by input_ids: $(head -c 300 "$S/genids.json")"
curl -sN localhost:$P/generate -H 'Content-Type: application/json' \
     -d '{"text": "And God said,", "sampling_params": {"max_new_tokens": 32, "temperature": 0}, "stream": true}' >"$S/gens.txt"
[ "$(sed -n 's/^data: //p' "$S/gens.txt" | tail -1)" = "[DONE]" ] || bad "/generate stream: no [DONE]"
[ "And God said,$(sed -n 's/^data: //p' "$S/gens.txt" | grep -v '^\[DONE\]$' | tail -1 | jq -r .text)" = "$(cat "$S/gen.txt")" ] ||
    bad "/generate stream: the last event's text differs from generate's"
[ "$(sed -n 's/^data: //p' "$S/gens.txt" | grep -v '^\[DONE\]$' | jq -s '[.[].meta_info.completion_tokens] | if . == sort then .[-1] else -1 end')" = \
  "$(jq '.meta_info.completion_tokens' "$S/gen.json")" ] || bad "/generate stream: completion_tokens do not grow to the whole answer's"
# the same answer through OpenAI's Responses API and Anthropic's Messages API
curl -s localhost:$P/v1/responses -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "input": "Genesis 1:3", "max_output_tokens": 80, "temperature": 0}' >"$S/resp.json"
[ "$(jq -r '.output[] | select(.type == "reasoning") | .content[0].text' "$S/resp.json")" = "$want_r" ] &&
[ "$(jq -r '.output[] | select(.type == "message") | .content[0].text' "$S/resp.json")" = "$want_c" ] ||
    bad "responses: $(head -c 400 "$S/resp.json") differs from generate --chat's"
# a conversation (OpenAI's Conversations API): the response in it is the same answer, and its turn is kept
conv=$(curl -s localhost:$P/v1/conversations -H 'Content-Type: application/json' -d '{}' | jq -r .id)
curl -s localhost:$P/v1/responses -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "conversation": "'"$conv"'", "input": "Genesis 1:3", "max_output_tokens": 80, "temperature": 0}' >"$S/cresp.json"
curl -s "localhost:$P/v1/conversations/$conv/items?order=asc" >"$S/items.json"
[ "$(jq -r '.output[] | select(.type == "message") | .content[0].text' "$S/cresp.json")" = "$want_c" ] &&
[ "$(jq -r '.conversation.id' "$S/cresp.json")" = "$conv" ] &&
[ "$(jq -c '[.data[] | [.type, .role]]' "$S/items.json")" = '[["message","user"],["reasoning",null],["message","assistant"]]' ] &&
[ "$(jq -r '.data[0].content[0].text' "$S/items.json")" = "Genesis 1:3" ] &&
[ "$(jq -r '.data[2].content[0].text' "$S/items.json")" = "$want_c" ] ||
    bad "conversation $conv: $(head -c 300 "$S/cresp.json") / items $(head -c 300 "$S/items.json")"
curl -s localhost:$P/v1/messages -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "max_tokens": 80, "temperature": 0, "messages": [{"role": "user", "content": "Genesis 1:3"}]}' >"$S/msg.json"
[ "$(jq -r '.content[] | select(.type == "thinking") | .thinking' "$S/msg.json")" = "$want_r" ] &&
[ "$(jq -r '.content[] | select(.type == "text") | .text' "$S/msg.json")" = "$want_c" ] ||
    bad "messages: $(head -c 400 "$S/msg.json") differs from generate --chat's"
# structured outputs: the answer is JSON (jq parses it) that follows the schema
curl -s localhost:$P/v1/chat/completions -H 'Content-Type: application/json' \
     -d '{"messages": [{"role": "user", "content": "Genesis 1:3"}], "max_tokens": 200, "temperature": 0,
          "response_format": {"type": "json_schema", "json_schema": {"name": "verse", "schema": {"type": "object",
          "properties": {"book": {"type": "string", "maxLength": 20}, "chapter": {"type": "integer", "minimum": 1,
          "maximum": 150}}, "required": ["book", "chapter"]}}}}' >"$S/so.json"
[ "$(jq -r '.choices[0].finish_reason' "$S/so.json")" = stop ] || bad "structured output did not end: $(cat "$S/so.json")"
jq -r '.choices[0].message.content' "$S/so.json" | jq -e '(keys | sort) == ["book", "chapter"] and
    (.book | type == "string" and length <= 20) and (.chapter | type == "number" and . == floor and . >= 1 and . <= 150)' \
    >/dev/null || bad "structured output does not follow the schema: $(jq -r '.choices[0].message.content' "$S/so.json")"
curl -sN localhost:$P/v1/chat/completions -H 'Content-Type: application/json' \
     -d '{"messages": [{"role": "user", "content": "Genesis 1:3"}], "max_tokens": 80, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' >"$S/stream.txt"
sc=$(sed -n 's/^data: //p' "$S/stream.txt" | grep -v '^\[DONE\]$' | jq -j '.choices[0].delta.content // empty')
sr=$(sed -n 's/^data: //p' "$S/stream.txt" | grep -v '^\[DONE\]$' | jq -j '.choices[0].delta.reasoning_content // empty')
[ "$sc" = "$content" ] && [ "$sr" = "$reasoning" ] || bad "the streamed chat differs from the non-streamed one"
[ "$(sed -n 's/^data: //p' "$S/stream.txt" | grep -v '^\[DONE\]$' | tail -1 | jq '.usage.completion_tokens')" = \
  "$(jq '.usage.completion_tokens' "$S/chat.json")" ] || bad "the streamed usage differs"
curl -s localhost:$P/metrics | grep -v '^#' | grep -q '^moerun:num_requests_running{model_name="tiny-kjv"} 0' || bad "/metrics"
# requests by the API they came through: this walk-through's own count of each
for want in completions:1 chat_completions:3 responses:2 messages:1 generate:4; do
    got=$(curl -s localhost:$P/metrics | sed -n "s/^moerun:requests_total{model_name=\"tiny-kjv\",api=\"${want%%:*}\"} //p")
    [ "$got" = "${want#*:}" ] || bad "/metrics requests_total of ${want%%:*}: '$got', want ${want#*:}"
done
# a stop string ends the output as a stop, whole and streamed, and /metrics counts it so (the engine's
# sequence is cancelled when the string is seen; that was once counted as an aborted request)
fin() { curl -s localhost:$P/metrics | sed -n "s/^moerun:request_success_total{model_name=\"tiny-kjv\",finished_reason=\"$1\"} //p"; }
s0=$(fin stop); a0=$(fin abort)
after=$(sed 's/^And God said,//' "$S/gen.txt"); want_s=${after%%, and*}
[ "$want_s" != "$after" ] || bad "generate's continuation '$after' holds no ', and' (the check below needs one)"
curl -s localhost:$P/v1/completions -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "prompt": "And God said,", "max_tokens": 32, "temperature": 0, "stop": [", and"]}' >"$S/stop.json"
[ "$(jq -r '.choices[0].text + "|" + .choices[0].finish_reason' "$S/stop.json")" = "$want_s|stop" ] ||
    bad "stop string: $(head -c 300 "$S/stop.json"), want '$want_s' and stop"
curl -sN localhost:$P/v1/completions -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "prompt": "And God said,", "max_tokens": 32, "temperature": 0, "stop": [", and"], "stream": true}' >"$S/stops.txt"
[ "$(sed -n 's/^data: //p' "$S/stops.txt" | grep -v '^\[DONE\]$' | jq -j '.choices[0].text')" = "$want_s" ] &&
[ "$(sed -n 's/^data: //p' "$S/stops.txt" | grep -v '^\[DONE\]$' | jq -r '.choices[0].finish_reason // empty')" = stop ] ||
    bad "streamed stop string: $(head -c 600 "$S/stops.txt")"
# (a stream's end is sent when the stop string is seen; the engine counts the finish when it drops the
# sequence at its next step, which a slow build may reach after the client has read /metrics: wait for it)
for i in $(seq 1 60); do [ "$(fin stop)" = $((s0 + 2)) ] && break; sleep 0.05; done
[ "$(fin stop)" = $((s0 + 2)) ] && [ "$(fin abort)" = "$a0" ] ||
    bad "/metrics after two stop strings: stop $s0 -> $(fin stop), abort $a0 -> $(fin abort) (want +2, +0)"
# input items whose content is text parts: the same prompt as the string (the parts are joined; this
# template reads content as a string), and a stored turn continued by previous_response_id: the prompt of
# the conversation written out as chat messages
curl -s localhost:$P/v1/responses -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Genesis"},
          {"type": "input_text", "text": " 1:3"}]}], "max_output_tokens": 80, "temperature": 0}' >"$S/rparts.json"
[ "$(jq .usage.input_tokens "$S/rparts.json")" = "$(jq .usage.input_tokens "$S/resp.json")" ] &&
[ "$(jq -r '.output[] | select(.type == "message") | .content[0].text' "$S/rparts.json")" = "$want_c" ] ||
    bad "responses with input_text parts: $(head -c 300 "$S/rparts.json") against the string's $(jq -c .usage "$S/resp.json")"
curl -s localhost:$P/v1/responses -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "previous_response_id": "'"$(jq -r .id "$S/resp.json")"'", "input": "Exodus 1:1",
          "max_output_tokens": 8, "temperature": 0}' >"$S/rprev.json"
jq -n --arg r "$want_r" --arg c "$want_c" '{model: "tiny-kjv", max_tokens: 8, temperature: 0, messages: [
    {role: "user", content: "Genesis 1:3"}, {role: "assistant", content: $c, reasoning_content: $r},
    {role: "user", content: "Exodus 1:1"}]}' >"$S/written.json"
curl -s localhost:$P/v1/chat/completions -H 'Content-Type: application/json' -d @"$S/written.json" >"$S/cwritten.json"
[ "$(jq .usage.input_tokens "$S/rprev.json")" = "$(jq .usage.prompt_tokens "$S/cwritten.json")" ] ||
    bad "previous_response_id: $(jq -c .usage "$S/rprev.json"), the conversation written out $(jq -c .usage "$S/cwritten.json")"
# an id of the padded vocabulary (config.json's vocab_size is above the tokenizer's ids) has no text: 200
pad=$(($(jq .vocab_size "$MODEL/config.json") - 1))
code=$(curl -s -o "$S/detok.json" -w '%{http_code}' localhost:$P/detokenize -H 'Content-Type: application/json' \
       -d '{"tokens": ['"$pad"', 100]}')
[ "$code" = 200 ] && [ "$(jq -r .prompt "$S/detok.json")" = "$(curl -s localhost:$P/detokenize -d '{"tokens": [100]}' | jq -r .prompt)" ] ||
    bad "/detokenize of the padded id $pad: $code $(head -c 300 "$S/detok.json")"
# completions logprobs k: the sampled token is always among its position's top_logprobs (up to k + 1 of them)
curl -s localhost:$P/v1/completions -H 'Content-Type: application/json' \
     -d '{"model": "tiny-kjv", "prompt": "And God said,", "max_tokens": 24, "temperature": 2, "seed": 7, "logprobs": 1}' >"$S/lp.json"
[ "$(jq '.choices[0].logprobs as $l | [range(0; $l.tokens | length) as $i |
        ($l.top_logprobs[$i] | has($l.tokens[$i]) and length <= 2)] | length == 24 and all' "$S/lp.json")" = true ] ||
    bad "completions logprobs 1: a sampled token missing from its top_logprobs: $(head -c 600 "$S/lp.json")"
# errors of the translated APIs name the fields the client sent, in its words
err() { # route body -> "param|message"
    curl -s localhost:$P$1 -H 'Content-Type: application/json' -d "$2" | jq -r '.error.param + "|" + .error.message'
}
e=$(err /generate '{"text": "x", "sampling_params": {"max_new_tokens": -1}}')
[ "${e%%|*}" = sampling_params.max_new_tokens ] || bad "/generate max_new_tokens -1: $e"
# max_new_tokens 0 (sglang's frontend caching a prefix): the prompt alone, nothing generated
z=$(curl -s localhost:$P/generate -H 'Content-Type: application/json' -d '{"text": "And God said,", "sampling_params": {"max_new_tokens": 0}}' |
    jq -c '[.text, .output_ids, .meta_info.completion_tokens, .meta_info.finish_reason, .meta_info.prompt_tokens > 0]')
[ "$z" = '["",[],0,{"type":"length","length":0},true]' ] || bad "/generate max_new_tokens 0: $z"
e=$(err /generate '{"text": "x", "sampling_params": {"max_new_tokens": 3, "min_new_tokens": 5}}')
case $e in sampling_params.*"min_new_tokens 5"*"max_new_tokens 3"*) ;; *) bad "/generate min_new_tokens above max_new_tokens: $e" ;; esac
case $e in *max_tokens*|*min_tokens*) bad "/generate error in the completions' words: $e" ;; esac
e=$(err /generate '{"text": "x", "sampling_params": {"top_p": 2}}')
[ "${e%%|*}" = sampling_params.top_p ] || bad "/generate top_p 2: $e"
e=$(err /v1/responses '{"input": "x", "max_output_tokens": 100000000}')
case $e in max_output_tokens\|*max_output_tokens*) ;; *) bad "responses max_output_tokens: $e" ;; esac
case $e in *max_tokens*|*max_completion_tokens*) bad "responses error in the chat's words: $e" ;; esac
stop_server
[ "$SV_RC" = 0 ] || bad "exit $SV_RC"
clean_log "$S/serve.log" || bad "sanitizer report in the server log"
[ $fails = 0 ] || exit 1
rm -rf "$S"
echo OK
