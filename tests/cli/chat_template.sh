#!/usr/bin/env bash
# chat_template.sh MOERUN DATA SCRATCH — `moerun chat-template` renders the
# golden conversations byte for byte as transformers did
# (text/chat/golden_chat.json, tools/golden/gen_chat.py), from a request body
# on stdin and from files; `moerun parse-output` gives the message and the
# streamed deltas; bad input exits 2 with a message, never a crash.
set -u
MOERUN=$1
DATA=$2
SCRATCH=$3
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
M=$DATA/text/chat/models
export TZ=UTC
NOW=$(jq .now_unix "$DATA/text/chat/golden_chat.json")

# golden renderings through the CLI (the cases without kwargs/continue/template name)
cases=$(jq -c '.cases[] | select(.output != null and .kwargs == null and .continue_final_message == false and .template_name == null)' \
  "$DATA/text/chat/golden_chat.json" 2>/dev/null | head -40)
if [ -z "$cases" ]; then
  fail "jq is needed to read the goldens"
fi
n=0
while IFS= read -r c; do
  [ -z "$c" ] && continue
  model=$(jq -r .model <<<"$c")
  jq -c '{messages: .messages, tools: .tools}' <<<"$c" >"$SCRATCH/req.json"
  jq -j .output <<<"$c" >"$SCRATCH/want.txt"
  agp=""
  [ "$(jq -r .add_generation_prompt <<<"$c")" = true ] && agp=--add-generation-prompt
  if ! "$MOERUN" chat-template --model "$M/$model" --messages - --now "$NOW" $agp <"$SCRATCH/req.json" >"$SCRATCH/got.txt"; then
    fail "chat-template $model $(jq -r .conversation <<<"$c") exited non-zero"
  elif ! cmp -s "$SCRATCH/want.txt" "$SCRATCH/got.txt"; then
    fail "chat-template $model $(jq -r .conversation <<<"$c") differs from transformers"
  fi
  n=$((n + 1))
done <<<"$cases"
[ "$n" -ge 20 ] || fail "only $n golden cases ran"

# the request's chat_template_kwargs and --kwargs reach the template
printf '{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"date_string": "02 Feb 2031"}}' >"$SCRATCH/kw.json"
"$MOERUN" chat-template --model "$M/llama3" --messages "$SCRATCH/kw.json" | grep -q "Today Date: 02 Feb 2031" || fail "chat_template_kwargs not applied"
"$MOERUN" chat-template --model "$M/llama3" --messages '[{"role": "user", "content": "hi"}]' --kwargs '{"date_string": "x"}' |
  grep -q "Today Date: x" || fail "--kwargs not applied"
"$MOERUN" chat-template --model "$M/named" --list | grep -q "template: tool_use" || fail "--list misses a named template"

# parse-output: message and deltas
out='Plan.
</think>

Ok.
<minimax:tool_call>
<invoke name="get_weather"><parameter name="location">Paris</parameter><parameter name="days">2</parameter></invoke>
</minimax:tool_call>'
tools='[{"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {"days": {"type": "integer"}}}}}]'
printf '%s' "$out" | "$MOERUN" parse-output --tools "$tools" --seed 5 >"$SCRATCH/msg.json" || fail "parse-output exited non-zero"
[ "$(jq -r '.tool_calls[0].function.arguments' "$SCRATCH/msg.json")" = '{"location": "Paris", "days": 2}' ] || fail "parse-output arguments"
[ "$(jq -r '.content' "$SCRATCH/msg.json")" = 'Ok.' ] || fail "parse-output content"
[ "$(jq -r '.reasoning_content' "$SCRATCH/msg.json")" = 'Plan.' ] || fail "parse-output reasoning"
printf '%s' "$out" | "$MOERUN" parse-output --tools "$tools" --seed 5 --deltas 3 >"$SCRATCH/deltas.txt" || fail "parse-output --deltas"
args=$(head -n -1 "$SCRATCH/deltas.txt" | grep '^{"' | jq -rj 'select(.tool_calls) | .tool_calls[].function.arguments')
[ "$args" = '{"location": "Paris", "days": 2}' ] || fail "streamed arguments concatenate to '$args'"
printf '<minimax:tool_call>junk' | "$MOERUN" parse-output --no-think-open 2>"$SCRATCH/warn.txt" >"$SCRATCH/m2.json" || fail "malformed exits non-zero"
grep -q warning "$SCRATCH/warn.txt" || fail "no warning for malformed markup"
[ "$(jq -r .content "$SCRATCH/m2.json")" = '<minimax:tool_call>junk' ] || fail "malformed markup is not content"

# bad input: exit 2 and a message
expect2() {
  local what=$1
  shift
  "$@" >/dev/null 2>"$SCRATCH/err.txt"
  local rc=$?
  [ $rc -eq 2 ] || fail "$what: exit $rc, want 2"
  [ -s "$SCRATCH/err.txt" ] || fail "$what: no message"
}
expect2 "no folder" "$MOERUN" chat-template --model "$SCRATCH/none" --messages '[]'
expect2 "empty conversation" "$MOERUN" chat-template --model "$M/chatml" --messages '[]'
expect2 "bad JSON" "$MOERUN" chat-template --model "$M/chatml" --messages '[{"role": '
expect2 "raise_exception" "$MOERUN" chat-template --model "$M/mistral" --messages '[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]'
grep -q "alternate" "$SCRATCH/err.txt" || fail "raise_exception message not shown"
mkdir -p "$SCRATCH/badtpl"
printf '{{ x |nosuch }}' >"$SCRATCH/badtpl/chat_template.jinja"
expect2 "unknown filter" "$MOERUN" chat-template --model "$SCRATCH/badtpl" --messages '[{"role": "user", "content": "a"}]'
grep -q "line 1" "$SCRATCH/err.txt" || fail "template error does not name the line"
expect2 "unknown option" "$MOERUN" chat-template --bogus
expect2 "bad format" "$MOERUN" parse-output --format nope
expect2 "bad deltas" "$MOERUN" parse-output --deltas 0

if [ $fails -ne 0 ]; then
  echo "chat_template.sh: $fails failure(s)"
  exit 1
fi
echo "chat_template.sh: $n golden renderings and the parse/bad-input checks passed"
