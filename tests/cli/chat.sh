#!/usr/bin/env bash
# chat.sh MOERUN DATA SCRATCH — `moerun chat` on the trained default model:
#   - a piped transcript: two turns, /reset, an unknown command, /exit;
#     reasoning marked, or left out with --hide-reasoning;
#   - through a pseudo-terminal (script(1) from util-linux): the reasoning is
#     dimmed, Ctrl-C during an answer stops that answer and not the program,
#     Ctrl-C at the prompt discards the line, /exit leaves with status 0;
#   - bad options exit 2.
set -u
MOERUN=$1
DATA=$2
SCRATCH=$3
M="$DATA/../../models/tiny-kjv"
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
has() { grep -aqF -- "$2" "$1" || fail "$3: output lacks '$2' ($(tr -d '\033' <"$1" | head -c 600))"; }

# 1. piped transcript (greedy: the first answer is the golden one of test_trained)
printf 'John 3:16\nAnd he said\n/reset\n/bogus\nJohn 3:16\n/exit\nnever read\n' |
    "$MOERUN" chat --model "$M" --threads 1 --temperature 0 -n 40 >"$SCRATCH/t1" 2>"$SCRATCH/e1" ||
    fail "transcript: exit $? ($(cat "$SCRATCH/e1"))"
has "$SCRATCH/t1" "[reasoning] The user asks for John chapter 1, verse 8." transcript
has "$SCRATCH/t1" "(new conversation)" transcript
has "$SCRATCH/t1" "(unknown command /bogus" transcript
[ "$(grep -ac '^\[.* tokens, .* tok/s' "$SCRATCH/t1")" = 3 ] || fail "transcript: not 3 answers"
grep -aq "never read" "$SCRATCH/t1" && fail "transcript: input after /exit was read"
printf 'John 3:16\n' | "$MOERUN" chat --model "$M" --threads 1 --temperature 0 -n 40 --hide-reasoning \
    >"$SCRATCH/t2" 2>&1 || fail "hide-reasoning: exit $?"
grep -aq "The user asks" "$SCRATCH/t2" && fail "--hide-reasoning printed the reasoning"
has "$SCRATCH/t2" "And the angel of the LORD" "--hide-reasoning answer"

# 2. a pseudo-terminal: an endless answer (--ignore-eos) stopped by Ctrl-C
if command -v script >/dev/null; then
    # the keys follow the program's output (the prompt, the streaming answer), not the clock:
    # a Ctrl-C sent while the model still loads would end the program, however slow the machine.
    # script(1) runs the command with $SHELL -c (or /bin/sh): `exec` makes moerun the pty's
    # foreground process itself, or a shell that stays in between (dash) dies of the Ctrl-C (exit 130)
    : >"$SCRATCH/pty"
    count() { grep -aoF -- "$1" "$SCRATCH/pty" 2>/dev/null | wc -l; }
    wait_for() { # wait_for N TEXT: until TEXT was printed N times (60 s at most)
        local i
        for i in $(seq 600); do
            [ "$(count "$2")" -ge "$1" ] && return 0
            sleep 0.1
        done
        echo "chat.sh: waited in vain for '$2' x$1" >&2
    }
    {
        wait_for 1 '> '
        printf 'In the beginning\n'
        size0=$(stat -c %s "$SCRATCH/pty")
        for i in $(seq 600); do # the answer streams: some 200 bytes of it
            [ $(($(stat -c %s "$SCRATCH/pty") - size0)) -gt 200 ] && break
            sleep 0.1
        done
        printf '\003'
        wait_for 1 ', stopped]'
        wait_for 2 '> '
        printf 'half a line\003'
        wait_for 3 '> '
        printf '/exit\n'
        sleep 2
    } | timeout 120 script -q -e -c "exec '$MOERUN' chat --model '$M' --threads 1 -n 3000 --ignore-eos" /dev/null \
        >>"$SCRATCH/pty" 2>&1
    rc=$?
    [ $rc = 0 ] || fail "pty: exit $rc, want 0 (the program must survive Ctrl-C and leave at /exit)"
    has "$SCRATCH/pty" ", stopped]" "pty Ctrl-C"
    has "$SCRATCH/pty" $'\033[2m' "pty dim reasoning"
    n=$(grep -aoF '> ' "$SCRATCH/pty" | wc -l)
    [ "$n" -ge 3 ] || fail "pty: $n prompts, want 3 (start, after the stopped answer, after the discarded line)"
else
    echo "SKIP pty part: script(1) is missing"
fi

# 3. bad options
"$MOERUN" chat --model "$SCRATCH/none" </dev/null >/dev/null 2>"$SCRATCH/e3"
[ $? = 2 ] || fail "missing model: want exit 2"
grep -q tokenizer "$SCRATCH/e3" || fail "missing model: message '$(cat "$SCRATCH/e3")'"
"$MOERUN" chat --model "$M" --bogus </dev/null >/dev/null 2>&1
[ $? = 2 ] || fail "unknown option: want exit 2"
"$MOERUN" chat --model "$M" -n 0 </dev/null >/dev/null 2>&1
[ $? = 2 ] || fail "-n 0: want exit 2"

rm -rf "$SCRATCH"
if [ $fails -gt 0 ]; then
    echo "$fails failed"
    exit 1
fi
echo "chat.sh: all checks passed"
