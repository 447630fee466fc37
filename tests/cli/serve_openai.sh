#!/usr/bin/env bash
# serve_openai.sh — compatibility with the official `openai` Python client
# (PyPI, in a private venv made by scripts/openai-venv.sh under the build
# tree): completions, streaming with include_usage, max_tokens, seed, n,
# stop_token_ids, and errors raised as the right exception classes
# (tests/cli/openai_client.py). Expected tokens come from `moerun generate`.
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
start_server "$S/a.log" --model "$T" --context-length 256 || exit 1
URL_A=$SV_URL; PID_A=$SV_PID
start_server "$S/b.log" --model "$T" --context-length 256 --api-key secret --skip-self-check || exit 1
URL_B=$SV_URL; PID_B=$SV_PID
"$VENV/bin/python" "$HERE/openai_client.py" "$URL_A" "$prompt" "$expected" "$URL_B"
rc=$?
SV_PID=$PID_A; stop_server; ra=$SV_RC
SV_PID=$PID_B; stop_server; rb=$SV_RC
[ $rc = 0 ] || exit 1
[ $ra = 0 ] && [ $rb = 0 ] || { echo "FAIL: the servers exited $ra / $rb"; exit 1; }
clean_log "$S/a.log" && clean_log "$S/b.log" || { echo "FAIL: sanitizer report in a server log"; exit 1; }
rm -rf "$S"
echo OK
