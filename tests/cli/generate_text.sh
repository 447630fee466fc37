#!/usr/bin/env bash
# generate_text.sh MOERUN DATA SCRATCH — `moerun generate` with text in and
# out on the trained default model: greedy text for a plain prompt and for a
# --chat prompt equals what transformers generated from the same prompt
# (train_log.json greedy_samples, tools/train_tiny.py: 25 greedy tokens decoded
# by HF tokenizers); --prompt-ids still prints ids; bad combinations and bad
# text exit 2 with a message.
set -u
MOERUN=$1
DATA=$2
SCRATCH=$3
M="$DATA/../../models/tiny-kjv"
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
golden() { grep -o '"greedy": "[^"]*"' "$M/train_log.json" | sed -n "$1p" | sed 's/^"greedy": "//; s/"$//'; }
# the generated text: what stdout holds between the "loaded:" line and the "prefill:" line
text_of() { awk '/^prefill: /{exit} p{print} /^loaded: /{p=1}' "$1"; }

# 1. plain prompt: the prompt, then the continuation, then " ..." (stopped at -n)
"$MOERUN" generate --model "$M" --threads 1 --prompt "In the beginning God created" -n 25 >"$SCRATCH/o1" 2>"$SCRATCH/e1" ||
    fail "plain: exit $? ($(cat "$SCRATCH/e1"))"
want="In the beginning God created$(golden 1) ..."
[ "$(text_of "$SCRATCH/o1")" = "$want" ] || fail "plain: got '$(text_of "$SCRATCH/o1")' want '$want'"
grep -q "^resolved: " "$SCRATCH/o1" || fail "plain: no resolution line"
grep -q "tok/s" "$SCRATCH/o1" || fail "plain: no tokens/s"

# 2. --chat: the template's generation prompt, then the raw answer (reasoning, </think>, content)
"$MOERUN" generate --model "$M" --threads 1 --chat --prompt "John 3:16" -n 25 >"$SCRATCH/o2" 2>"$SCRATCH/e2" ||
    fail "chat: exit $? ($(cat "$SCRATCH/e2"))"
want="$(printf '%b' "$(golden 3)") ..."
[ "$(text_of "$SCRATCH/o2")" = "$want" ] || fail "chat: got '$(text_of "$SCRATCH/o2")' want '$want'"
# the same through a system message equal to the template's default
"$MOERUN" generate --model "$M" --threads 1 --chat --system "You are a helpful assistant." --prompt "John 3:16" -n 25 \
    >"$SCRATCH/o3" 2>&1 || fail "chat --system: exit $?"
[ "$(text_of "$SCRATCH/o3")" = "$want" ] || fail "chat --system: got '$(text_of "$SCRATCH/o3")'"

# 3. ids still work
"$MOERUN" generate --model "$M" --threads 1 --prompt-ids 5,6,7 -n 3 >"$SCRATCH/o4" 2>&1 || fail "ids: exit $?"
grep -Eq '^\[0\]( [0-9]+){1,3}' "$SCRATCH/o4" || fail "ids: no id line ($(cat "$SCRATCH/o4"))"

# 4. bad input
expect2() { # WHAT PATTERN ARGS...
    local what=$1 pat=$2
    shift 2
    "$MOERUN" generate "$@" >"$SCRATCH/out" 2>"$SCRATCH/err"
    local rc=$?
    [ $rc = 2 ] || fail "$what: exit $rc, want 2 ($(cat "$SCRATCH/err"))"
    grep -q -- "$pat" "$SCRATCH/err" || fail "$what: message '$(cat "$SCRATCH/err")' lacks '$pat'"
}
mkdir -p "$SCRATCH/notok" && cp "$M/config.json" "$M/model.safetensors" "$SCRATCH/notok/"
expect2 "two prompts" "exactly one" --model "$M" --prompt hi --prompt-ids 1
expect2 "--chat alone" "goes with --prompt" --model "$M" --chat --prompt-ids 1
expect2 "--system without --chat" "needs --chat" --model "$M" --prompt hi --system s
expect2 "invalid UTF-8" "byte offset 2" --model "$M" --prompt $'ab\xffcd'
expect2 "empty prompt" "empty" --model "$M" --prompt ""
expect2 "no tokenizer" "tokenizer" --model "$SCRATCH/notok" --prompt hi
expect2 "invalid UTF-8 chat" "UTF-8" --model "$M" --chat --prompt $'ab\xffcd'

rm -rf "$SCRATCH"
if [ $fails -gt 0 ]; then
    echo "$fails failed"
    exit 1
fi
echo "generate_text.sh: all checks passed"
