#!/usr/bin/env bash
# engine.sh — `moerun generate --batch` through the engine's scheduler:
# prefix-cache hits when requests run one after the other, preemption in a
# KV pool too small for the batch, the same tokens either way as with room
# to spare; --stats counters; refusals of impossible limits with their numbers.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
T="$DATA/model/tiny"
export OMP_NUM_THREADS=1
rm -rf "$S"; mkdir -p "$S"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
ids() { grep -E '^\[[0-9]+\]' "$1"; }

# six prompts sharing a 32-token prefix (two full KV blocks), of different lengths
pre=$(seq 10 41 | paste -sd,)
: >"$S/b.txt"
for i in 1 2 3 4 5 6; do echo "$pre,$(seq $((50 + i)) $((50 + 3 * i)) | paste -sd,)" >>"$S/b.txt"; done
G="generate --model $T --threads 1 --batch $S/b.txt -n 30 --ignore-eos --stats"

"$M" $G >"$S/free.txt" 2>&1 || { cat "$S/free.txt"; fail "generate --batch"; }
[ "$(ids "$S/free.txt" | wc -l)" = 6 ] || fail "six outputs"
grep -q '; 0 preemptions;' "$S/free.txt" || fail "no preemption with room to spare"

# one request at a time: the later ones find the prefix in the cache
"$M" $G --max-running-requests 1 >"$S/one.txt" 2>&1 || { cat "$S/one.txt"; fail "--max-running-requests 1"; }
grep -q 'max 1 running requests' "$S/one.txt" || fail "--max-running-requests not applied"
grep -Eq 'prefix cache (160|[1-9][0-9]{2,}) of [0-9]+ tokens hit \(10 blocks shared\)' "$S/one.txt" ||
  { grep 'stats kv' "$S/one.txt"; fail "prefix hits: five later requests x 2 blocks"; }
diff <(ids "$S/free.txt") <(ids "$S/one.txt") >/dev/null || fail "prefix sharing changed the tokens"

# a pool of 10 blocks (40 KiB at 4 KiB a block) for six requests of 3-5 blocks: preemption, same tokens
"$M" $G --kv-cache-memory 40K >"$S/tight.txt" 2>&1 || { cat "$S/tight.txt"; fail "--kv-cache-memory 40K"; }
grep -q 'kv cache: bf16, 10 blocks of 16 tokens' "$S/tight.txt" || fail "--kv-cache-memory not applied"
grep -Eq '; [1-9][0-9]* preemptions;' "$S/tight.txt" || { grep 'stats kv' "$S/tight.txt"; fail "no preemption in a tight pool"; }
diff <(ids "$S/free.txt") <(ids "$S/tight.txt") >/dev/null || fail "preemption changed the tokens"

# refusals, exit 2, the numbers in the message
out=$("$M" $G --kv-cache-memory 1K 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q 'holds less than one KV block' || { echo "$out"; fail "a pool below one block"; }
out=$("$M" $G --max-batch-tokens 4 --max-running-requests 8 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q 'max_batch_tokens=4 is below max_running_requests=8' || { echo "$out"; fail "budget below the running set"; }
out=$("$M" generate --model "$T" --threads 1 --prompt-ids "$(seq 1 100 | paste -sd,)" -n 8 --kv-cache-memory 16K 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q 'need 7 KV blocks (112 tokens); the whole pool holds 4 blocks (64 tokens)' ||
  { echo "$out"; fail "a request larger than the pool"; }
out=$("$M" $G --kv-cache-memory lots 2>&1); rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "not a memory amount" || { echo "$out"; fail "a bad --kv-cache-memory"; }

rm -rf "$S"
[ $fails = 0 ] && echo OK
exit $((fails > 0))
