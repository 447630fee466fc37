#!/usr/bin/env bash
# model_tools.sh — gen-tiny (bf16, fp8, nvfp4), quantize, generate and probe
# end to end on small checkpoints: every runner that accepts each format
# agrees with the reference (probe exits 0), quantize output loads and is
# compared with --against, and usage / capacity errors exit with 2 / 1.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
rm -rf "$S"; mkdir -p "$S"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
DIMS="--hidden 128 --layers 2 --experts 8 --top-k 2 --expert-dim 128 --heads 4 --kv-heads 2 --head-dim 32 --rotary-dim 16 --vocab 128"

# gen-tiny in the three forms, deterministic
for q in bf16 fp8 nvfp4; do
  "$M" gen-tiny "$S/$q" --quant $q --seed 3 $DIMS >/dev/null || fail "gen-tiny --quant $q"
  [ -f "$S/$q/config.json" ] && [ -f "$S/$q/model.safetensors" ] || fail "gen-tiny $q files"
done
"$M" gen-tiny "$S/bf16b" --seed 3 $DIMS >/dev/null || fail "gen-tiny again"
cmp -s "$S/bf16/model.safetensors" "$S/bf16b/model.safetensors" || fail "gen-tiny is not deterministic"
grep -q '"quant_method": "fp8"' "$S/fp8/config.json" || fail "fp8 quantization_config"
grep -q '"quant_algo": "NVFP4"' "$S/nvfp4/hf_quant_config.json" || fail "nvfp4 hf_quant_config"
ls "$S" | grep -q '\.tmp\.' && fail "scratch folder left behind"

# gen-tiny refuses bad shapes (exit 2) and an existing checkpoint (exit 1)
"$M" gen-tiny "$S/x" --quant fp8 --hidden 96 >/dev/null 2>&1; [ $? -eq 2 ] || fail "fp8 shape constraint"
"$M" gen-tiny "$S/x" --heads 3 --kv-heads 2 >/dev/null 2>&1; [ $? -eq 2 ] || fail "heads/kv-heads"
"$M" gen-tiny "$S/bf16" $DIMS >/dev/null 2>&1; [ $? -eq 1 ] || fail "overwrite refused"

# probe: every runner vs the reference, for each format
for q in bf16 fp8 nvfp4; do
  out=$("$M" probe --model "$S/$q" --prompts 3 --steps 6 --threads 1) || { echo "$out"; fail "probe $q"; }
  echo "$out" | grep -q "runner routed" || { echo "$out"; fail "probe $q did not compare routed"; }
  echo "$out" | grep -q "PASS$" || fail "probe $q verdict"
done

# probe can fail: with --tol 0 any logit difference is a failure (exit 1);
# the verdict must follow the numbers it prints
out=$("$M" probe --model "$S/bf16" --prompts 2 --steps 2 --threads 1 --tol 0); rc=$?
err=$(echo "$out" | sed -n 's/^runner routed.*max |logit err| \([^ ]*\).*/\1/p')
[ -n "$err" ] || { echo "$out"; fail "probe --tol 0 printed no routed error"; }
if [ "$err" = 0 ]; then [ $rc -eq 0 ] || fail "probe --tol 0: exact agreement but exit $rc"
else [ $rc -eq 1 ] && echo "$out" | grep -q "FAIL$" || { echo "$out"; fail "probe --tol 0: error $err but exit $rc"; }; fi
# probe takes --explain like every command that takes --model
out=$("$M" probe --model "$S/bf16" --prompts 1 --steps 1 --threads 1 --explain) || fail "probe --explain"
echo "$out" | grep -q '^resolved:' || fail "probe: no resolution summary"
echo "$out" | grep -q 'model_overrides' || { echo "$out"; fail "probe --explain: no story"; }

# quantize the bf16 checkpoint and compare against it (reports, exit 0)
"$M" quantize "$S/bf16" "$S/q8" --to fp8 >/dev/null || fail "quantize fp8"
cmp -s "$S/q8/model.safetensors" "$S/fp8/model.safetensors" || fail "quantize fp8 != gen-tiny --quant fp8"
"$M" quantize "$S/bf16" "$S/q4" --to nvfp4 --calib-tokens 64 >/dev/null || fail "quantize nvfp4"
out=$("$M" probe --model "$S/bf16" --against "$S/q4" --prompts 2 --steps 4 --threads 1) || fail "probe --against"
echo "$out" | grep -q "top-1 agreement" || fail "against report"
"$M" quantize "$S/fp8" "$S/qq" --to nvfp4 >/dev/null 2>&1; [ $? -eq 2 ] || fail "quantize of a quantized checkpoint"
"$M" quantize "$S/bf16" >/dev/null 2>&1; [ $? -eq 2 ] || fail "quantize usage"

# generate: ids, throughput line, batch file, stats
out=$("$M" generate --model "$S/bf16" --prompt-ids 1,2,3 -n 5 --stats --threads 1) || fail "generate"
echo "$out" | grep -q '^resolved:' || fail "no resolution summary"
echo "$out" | grep -Eq '^\[0\]( [0-9]+){1,5}' || fail "no ids"
echo "$out" | grep -q 'decode:.*tok/s' || fail "no throughput"
echo "$out" | grep -q '^stats decode:' || fail "no stats"
printf '1,2,3\n4, 5\n\n6,7,8,9\n' > "$S/batch.txt"
out=$("$M" generate --model "$S/nvfp4" --batch "$S/batch.txt" -n 3 --temperature 0.8 --top-k 5 --seed 9 --threads 1) || fail "generate batch"
echo "$out" | grep -q '^\[2\]' || fail "batch of 3"
"$M" generate --model "$S/bf16" --prompt-ids 1,x >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad prompt exit 2"
"$M" generate --model "$S/bf16" --prompt-ids 1,500 >/dev/null 2>&1; [ $? -eq 2 ] || fail "id outside vocab exit 2"
"$M" generate --model "$S/bf16" --prompt-ids 1 --moe-runner-backend fused >/dev/null 2>&1; [ $? -eq 2 ] || fail "fused refused"
"$M" generate --model "$S/nope" --prompt-ids 1 >/dev/null 2>&1; [ $? -ne 0 ] || fail "missing model"
rm -rf "$S"
echo OK
