#!/usr/bin/env bash
# kernel_isa.sh — the resolved kernel ISA is the ISA that runs: an explicit
# --kernel-isa (or a lower level chosen by resolution) selects that kernel
# table (`loaded: ... kernels <isa>`), every level produces the same greedy
# tokens on a tiny model, and an explicit ISA above what the CPU offers (here
# hidden with MOERUN_CPU_MASK) is refused at resolution with exit 2.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; S=$3
rm -rf "$S"; mkdir -p "$S"
fail() { echo "FAIL: $*"; exit 1; }
"$M" gen-tiny "$S/m" --quant fp8 --hidden 128 --layers 2 --experts 8 --top-k 2 --expert-dim 128 \
  --heads 4 --kv-heads 2 --head-dim 32 --rotary-dim 16 --vocab 128 >/dev/null || fail "gen-tiny"
# the levels this host offers: up to the best one resolution finds (under MOERUN_CPU_MASK, the
# best one the mask leaves); the features each level needs are the binary's fact, not this script's
best=$("$M" resolve --model "$S/m" --explain | sed -n 's/^ *kernel_isa *= *\([a-z0-9]*\) *the best level.*/\1/p')
case "$best" in
  generic) levels="generic" ;;
  avx2) levels="generic avx2" ;;
  avx512) levels="generic avx2 avx512" ;;
  *) fail "resolve --explain names no best kernel level: '$best'" ;;
esac
ref=""
for isa in $levels; do
  out=$("$M" generate --model "$S/m" --prompt-ids 1,2,3,4 -n 12 --kernel-isa $isa) || fail "generate --kernel-isa $isa"
  echo "$out" | grep -q "isa=$isa" || fail "summary does not say isa=$isa"
  echo "$out" | grep -q "kernels $isa," || fail "kernel table is not $isa: $(echo "$out" | grep loaded)"
  ids=$(echo "$out" | grep '^\[0\]')
  [ -z "$ref" ] && ref=$ids
  [ "$ids" = "$ref" ] || fail "tokens differ with $isa: '$ids' vs '$ref'"
done
# a hidden level requested explicitly is an error, not a silent downgrade
out=$(MOERUN_CPU_MASK=avx2 "$M" generate --model "$S/m" --prompt-ids 1,2 -n 2 --kernel-isa avx2 2>&1)
[ $? -eq 2 ] || fail "explicit kernel_isa above the CPU must exit 2: $out"
echo "$out" | grep -qi "avx2" || fail "message does not name the ISA: $out"
# auto under a mask follows the mask
out=$(MOERUN_CPU_MASK=avx2 "$M" generate --model "$S/m" --prompt-ids 1,2 -n 2) || fail "generate under mask"
echo "$out" | grep -q "kernels generic," || fail "mask not followed: $out"
rm -rf "$S"
echo "kernel_isa: OK ($levels)"
