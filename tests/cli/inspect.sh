#!/usr/bin/env bash
# inspect.sh MOERUN DATA SCRATCH — `moerun inspect` on the golden checkpoint
# written by tools/golden/gen_io.py with Python safetensors: every tensor line
# of io/ckpt_listing.txt (what the reference reader reports) must appear in
# the text output, the totals must add up, --json must match
# io/ckpt_golden.json (checked with jq when it is installed), and bad files and
# bad usage give exit statuses 1 and 2 with clear messages.
set -u
MOERUN=$1
DATA=$2
SCRATCH=$3
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
norm() { sed -e 's/[[:space:]]\+/ /g' -e 's/^ //' -e 's/ $//'; }

# --- text output vs the reference listing ---
"$MOERUN" inspect "$DATA/io/ckpt" >"$SCRATCH/out.txt" 2>"$SCRATCH/err.txt"
rc=$?
[ $rc -eq 0 ] || fail "inspect folder: exit $rc: $(cat "$SCRATCH/err.txt")"
norm <"$SCRATCH/out.txt" >"$SCRATCH/out.norm"
n=0
while IFS= read -r line; do
    n=$((n + 1))
    grep -Fxq -- "$line" "$SCRATCH/out.norm" || fail "missing line: $line"
done <"$DATA/io/ckpt_listing.txt"
[ $n -ge 10 ] || fail "listing has only $n lines"
total=$(awk '{s += $(NF-1)} END {print s}' "$DATA/io/ckpt_listing.txt")
grep -Fxq "all $n $total" "$SCRATCH/out.norm" || fail "totals line 'all $n $total' missing"
# per-dtype totals
for dt in BF16 F8_E4M3 U8 F32; do
    cnt=$(awk -v d="$dt" '$2 == d {c++} END {print c + 0}' "$DATA/io/ckpt_listing.txt")
    sum=$(awk -v d="$dt" '$2 == d {s += $(NF-1)} END {print s + 0}' "$DATA/io/ckpt_listing.txt")
    grep -Fxq "$dt $cnt $sum" "$SCRATCH/out.norm" || fail "dtype total '$dt $cnt $sum' missing"
done
grep -q "sharded index, 2 files" "$SCRATCH/out.norm" || fail "header line"
# the index and one shard give the same or a subset of lines
"$MOERUN" inspect "$DATA/io/ckpt/model.safetensors.index.json" | norm >"$SCRATCH/idx.norm" || fail "inspect index"
diff <(tail -n +2 "$SCRATCH/out.norm") <(tail -n +2 "$SCRATCH/idx.norm") >/dev/null || fail "folder and index differ"
"$MOERUN" inspect "$DATA/io/ckpt/model-00001-of-00002.safetensors" | norm >"$SCRATCH/s1.norm" || fail "inspect shard"
grep -F "model-00001-of-00002.safetensors" "$DATA/io/ckpt_listing.txt" | while IFS= read -r line; do
    grep -Fxq -- "$line" "$SCRATCH/s1.norm" || echo "$line"
done >"$SCRATCH/s1.missing"
[ -s "$SCRATCH/s1.missing" ] && fail "shard listing lacks: $(cat "$SCRATCH/s1.missing")"

# --- JSON output ---
"$MOERUN" inspect --json "$DATA/io/ckpt" >"$SCRATCH/out.json" || fail "inspect --json"
if command -v jq >/dev/null 2>&1; then
    want=$(jq -c '[.tensors[] | {name, dtype, shape, bytes, file}]' "$DATA/io/ckpt_golden.json")
    got=$(jq -c '[.tensors[] | {name, dtype, shape, bytes, file}]' "$SCRATCH/out.json")
    [ "$want" = "$got" ] || fail "--json tensors differ from the golden listing"
    [ "$(jq -c '[.files[] | {name, size, header_size, metadata}]' "$SCRATCH/out.json")" = \
      "$(jq -c '[.files[] | {name, size, header_size, metadata}]' "$DATA/io/ckpt_golden.json")" ] || fail "--json files differ"
    [ "$(jq '.totals.bytes' "$SCRATCH/out.json")" = "$total" ] || fail "--json total bytes"
    [ "$(jq '.totals.tensors' "$SCRATCH/out.json")" = "$n" ] || fail "--json total tensors"
    [ "$(jq '.sharded' "$SCRATCH/out.json")" = "true" ] || fail "--json sharded"
else
    echo "jq not installed: checking --json by text only"
    grep -q '"name": "lm_head.weight"' "$SCRATCH/out.json" || fail "--json lacks lm_head.weight"
    grep -q "\"bytes\": $total" "$SCRATCH/out.json" || fail "--json lacks the total"
fi

# --- bad files: exit 1 with the validation error ---
head -c 5000 "$DATA/io/ckpt/model-00001-of-00002.safetensors" >"$SCRATCH/trunc.safetensors"
"$MOERUN" inspect "$SCRATCH/trunc.safetensors" >/dev/null 2>"$SCRATCH/err.txt"
rc=$?
[ $rc -eq 1 ] || fail "truncated file: exit $rc"
grep -q "trunc.safetensors: file size mismatch" "$SCRATCH/err.txt" || fail "truncated file message: $(cat "$SCRATCH/err.txt")"
printf 'abc' >"$SCRATCH/tiny.safetensors"
"$MOERUN" inspect --json "$SCRATCH/tiny.safetensors" >"$SCRATCH/o" 2>"$SCRATCH/err.txt"
rc=$?
[ $rc -eq 1 ] || fail "tiny file: exit $rc"
grep -q "header too small" "$SCRATCH/err.txt" || fail "tiny file message"
[ -s "$SCRATCH/o" ] && fail "tiny file: output on stdout"
mkdir -p "$SCRATCH/shards"
cp "$DATA/io/ckpt/model-00001-of-00002.safetensors" "$SCRATCH/shards/"
cp "$DATA/io/ckpt/model.safetensors.index.json" "$SCRATCH/shards/"
"$MOERUN" inspect "$SCRATCH/shards" >/dev/null 2>"$SCRATCH/err.txt"
rc=$?
[ $rc -eq 1 ] || fail "missing shard: exit $rc"
grep -q "model-00002-of-00002.safetensors" "$SCRATCH/err.txt" || fail "missing shard message"
"$MOERUN" inspect "$SCRATCH/does-not-exist" >/dev/null 2>&1
[ $? -eq 1 ] || fail "missing path: exit status"

# --- usage: exit 2; --help: exit 0 ---
"$MOERUN" inspect >/dev/null 2>&1
[ $? -eq 2 ] || fail "no PATH: exit status"
"$MOERUN" inspect --bogus "$DATA/io/ckpt" >/dev/null 2>"$SCRATCH/err.txt"
[ $? -eq 2 ] || fail "unknown option: exit status"
# a usage error is one line on stderr, naming the problem (not the whole help)
[ "$(wc -l < "$SCRATCH/err.txt")" -eq 1 ] || fail "unknown option: more than one line of error"
grep -q "unknown option '--bogus'" "$SCRATCH/err.txt" || fail "unknown option message"
"$MOERUN" inspect "$DATA/io/ckpt" "$DATA/io/ckpt" >/dev/null 2>&1
[ $? -eq 2 ] || fail "two paths: exit status"
"$MOERUN" inspect --help | grep -q "usage: moerun inspect" || fail "--help"

rm -rf "$SCRATCH"
if [ $fails -ne 0 ]; then
    echo "inspect.sh: $fails failure(s)" >&2
    exit 1
fi
echo "inspect.sh: ok ($n tensors)"
