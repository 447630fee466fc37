#!/usr/bin/env bash
# quantize_edges.sh — `moerun quantize` on a checkpoint with a NaN or an
# infinite weight: exit status 2 (as --help says), one message naming the
# tensor and the element's index, and nothing written (no OUT, no scratch
# folder); for nvfp4 the check comes before calibration, so a NaN in the
# router is reported as such, not as a routing failure. The values are
# patched into the file at the offsets `inspect --json` gives.
# (The numerical edge cases are in tests/test_quantize_edges.c.)
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; S=$3
rm -rf "$S"; mkdir -p "$S"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
"$M" gen-tiny "$S/in" --hidden 128 --layers 2 --experts 4 --top-k 2 --expert-dim 128 --heads 4 --kv-heads 2 \
  --head-dim 32 --rotary-dim 16 --vocab 96 >/dev/null || fail "gen-tiny"
"$M" quantize --help | grep -q "NaN" || fail "quantize --help does not mention NaN weights"
# the absolute file offset of a tensor's data, from inspect --json
offset() {
  "$M" inspect "$S/in" --json | tr -d ' \n' | sed 's/},{/}\n{/g' | grep -F "\"name\":\"$1\"" |
    sed -n 's/.*"offset":\([0-9]*\).*/\1/p'
}
# patch <tensor> <byte offset in the tensor> <printf bytes>
patch() {
  local o; o=$(offset "$1"); [ -n "$o" ] || fail "no offset for $1"
  printf "$3" | dd of="$S/in/model.safetensors" bs=1 seek=$((o + $2)) conv=notrunc status=none || fail "patch $1"
}
refused() { # <fp8|nvfp4> <tensor> <index> <NaN|infinite>
  out=$("$M" quantize "$S/in" "$S/out" --to "$1" --calib-tokens 16 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "quantize --to $1 with a $4 in $2: exit $rc (want 2): $out"
  echo "$out" | grep -qF "$2 [$3]" || fail "quantize --to $1: the message does not name $2 [$3]: $out"
  echo "$out" | grep -qF "$4" || fail "quantize --to $1: the message does not say $4: $out"
  [ "$(echo "$out" | wc -l)" -eq 1 ] || fail "quantize --to $1: more than one line: $out"
  [ ! -e "$S/out" ] || fail "quantize --to $1 left $S/out"
  ls "$S" | grep -q '\.tmp\.' && fail "quantize --to $1 left a scratch folder"
  return 0
}
gate=model.layers.1.block_sparse_moe.gate.weight
w1=model.layers.0.block_sparse_moe.experts.2.w1.weight
# a NaN in the router of layer 1 at [3, 17] (bf16 0x7FC1, little-endian)
patch $gate $(( 2 * (3 * 128 + 17) )) '\xc1\x7f'
refused nvfp4 $gate "3, 17" NaN
refused fp8 $gate "3, 17" NaN
patch $gate $(( 2 * (3 * 128 + 17) )) '\x00\x00'
# +inf in an expert's w1 at [0, 127] (bf16 0x7F80)
patch $w1 $(( 2 * 127 )) '\x80\x7f'
refused fp8 $w1 "0, 127" infinite
refused nvfp4 $w1 "0, 127" infinite
patch $w1 $(( 2 * 127 )) '\x00\x00'
# finite again: both quantize
"$M" quantize "$S/in" "$S/q8" --to fp8 >/dev/null 2>&1 || fail "quantize fp8 of the repaired checkpoint"
"$M" quantize "$S/in" "$S/q4" --to nvfp4 --calib-tokens 16 >/dev/null 2>&1 || fail "quantize nvfp4 of the repaired checkpoint"
rm -rf "$S"
echo ok
