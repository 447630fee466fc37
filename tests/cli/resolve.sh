#!/usr/bin/env bash
# resolve.sh — `moerun resolve` end to end: exit codes (0 resolved, 2
# resolution/usage failure of any kind, 1 out of memory), the messages, flag > env >
# default, --json, --explain and the generated docs/options.md.
# Usage: bash resolve.sh <moerun> <tests/data> <scratch dir>
set -u
BIN=$1; DATA=$2; TMP=$3
mkdir -p "$TMP"
for v in $(env | sed -n 's/^\(MOERUN_[A-Z_0-9]*\)=.*/\1/p'); do unset "$v"; done
C=$DATA/configs
fails=0
out=$TMP/out; err=$TMP/err

# run EXPECTED_RC ARGS...: runs moerun resolve, checks the exit status
run() {
    local want=$1; shift
    "$BIN" resolve "$@" >"$out" 2>"$err"
    local rc=$?
    if [ "$rc" != "$want" ]; then
        echo "FAIL: resolve $* -> exit $rc, want $want"; cat "$out" "$err"; fails=$((fails+1))
    fi
}
# has FILE TEXT: the file contains TEXT (fixed string)
has() {
    if ! grep -qF -- "$2" "$1"; then
        echo "FAIL: missing '$2' in $1:"; cat "$1"; fails=$((fails+1))
    fi
}

# the MiniMax-M2 NVFP4 story
run 0 --model "$C/minimax_m2_nvfp4_flat" --explain --cpu-features avx512
has "$out" "model_overrides [MiniMaxM2ForCausalLM]"
has "$out" "moe_runner_backend x fused"
has "$out" "routing method minimax2 is not implemented by fused"
has "$out" "moe_runner_backend = routed         default auto > model_overrides routed > moe_runner routed"
has "$out" "router_dtype       = fp32           default auto > model_overrides fp32"
has "$out" "ok: published"

# plain table
run 0 --model "$C/minimax_m2_fp8"
has "$out" "moe_runner_backend   routed           moe_runner"
has "$out" "quantization         fp8              checkpoint"

# an explicit runner that cannot work: exit 2 with the spec's message
run 2 --model "$C/minimax_m2_nvfp4_hf" --moe-runner-backend fused
has "$err" "moe_runner_backend=fused cannot run MiniMaxM2ForCausalLM: routing method minimax2 is not implemented by fused"
has "$err" "runners that can: routed, reference"

# the environment is explicit too (never overridden), and a flag beats it
MOERUN_MOE_RUNNER_BACKEND=fused run 2 --model "$C/minimax_m2_nvfp4_groups"
has "$err" "moe_runner_backend=fused cannot run"
MOERUN_MOE_RUNNER_BACKEND=fused run 0 --model "$C/minimax_m2_nvfp4_groups" --moe-runner-backend routed --explain
has "$out" "--moe-runner-backend routed"
MOERUN_MODEL="$C/mixtral_bf16" run 0
has "$out" "fused"

# a2a pairs: mpi + fused fails at resolution; mpi + auto resolves to routed
run 2 --model "$C/mixtral_bf16" --moe-a2a-backend mpi --moe-runner-backend fused
has "$err" "moe_a2a_backend=mpi cannot be combined with moe_runner_backend=fused"
run 0 --model "$C/mixtral_bf16" --moe-a2a-backend=mpi --json
has "$out" '"runner": "routed"'
has "$out" '"schema": "moerun.resolve/1"'

# GPU devices: planned for, but no GPU runner is built
run 2 --model "$C/minimax_m2_nvfp4_flat" --device sm100
has "$err" "no GPU runner is built"

# usage errors
run 2 --model "$C/mixtral_bf16" --moe-runner-backnd fused
has "$err" "valid options: --model, --moe-runner-backend"
run 2 --model "$C/mixtral_bf16" --quantization int4
has "$err" "valid values: auto, bf16, fp8, modelopt_fp4"
run 2
has "$err" "--model DIR is required"

# bad configs: 2; a missing folder: 2 as well (every resolution failure exits 2)
run 2 --model "$C/bad_unknown_arch"
has "$err" "known architectures: MiniMaxM2ForCausalLM"
run 2 --model "$C/bad_block_size" --json
has "$out" '"ok": false'
run 2 --model "$TMP/no/such/model"

# help and the generated docs
run 0 --help
has "$out" "--moe-a2a-backend"
run 0 --print-options-md
if ! cmp -s "$out" "$DATA/../../docs/options.md"; then
    echo "FAIL: docs/options.md is stale (moerun resolve --print-options-md > docs/options.md)"; fails=$((fails+1))
fi

if [ "$fails" != 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "ok"
