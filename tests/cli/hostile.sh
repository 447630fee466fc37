#!/usr/bin/env bash
# hostile.sh — bad input from strangers, across every command: missing and
# unknown arguments, flags without values, out-of-range numbers, bad paths,
# existing output folders, garbage prompt files, corrupt checkpoints (config
# fields, truncated / mistyped / misshapen safetensors, an index naming a
# missing shard). Each case pins the exit status (2 usage or resolution, 1
# file or runtime error), a substring of the one-line message, that nothing
# crashed (no sanitizer report, no signal) and that no partial output or
# scratch folder is left behind.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
rm -rf "$S"; mkdir -p "$S"
for v in $(env | sed -n 's/^\(MOERUN_[A-Z_0-9]*\)=.*/\1/p'); do unset "$v"; done
export OMP_NUM_THREADS=1
T=$DATA/model/tiny
fails=0
out=$S/.out; err=$S/.err

# expect RC SUBSTRING ARGS...: moerun ARGS exits RC, stderr holds SUBSTRING
# (fixed string; empty: not checked), and holds no sanitizer report.
expect() {
    local want=$1 msg=$2; shift 2
    timeout 120 "$M" "$@" >"$out" 2>"$err"
    local rc=$?
    if [ "$rc" != "$want" ]; then
        echo "FAIL: moerun $* -> exit $rc, want $want"; head -c 2000 "$err"; fails=$((fails+1)); return
    fi
    if [ -n "$msg" ] && ! grep -qF -- "$msg" "$err"; then
        echo "FAIL: moerun $*: stderr lacks '$msg':"; head -c 2000 "$err"; fails=$((fails+1)); return
    fi
    if grep -qE 'Sanitizer|runtime error:|LeakSanitizer' "$err"; then
        echo "FAIL: moerun $*: sanitizer report"; head -c 3000 "$err"; fails=$((fails+1))
    fi
}
# oneline: the last command's stderr is a single line
oneline() {
    local n; n=$(wc -l <"$err")
    if [ "$n" != 1 ]; then echo "FAIL: $1: expected a one-line error, got $n lines:"; cat "$err"; fails=$((fails+1)); fi
}
# clean: no scratch folder or partial output in $S (names given must be absent)
clean() {
    if ls -A "$S" | grep -q '\.tmp\.'; then echo "FAIL: $1: scratch folder left behind: $(ls -A "$S")"; fails=$((fails+1)); fi
    shift
    for p in "$@"; do
        if [ -e "$p" ]; then echo "FAIL: partial output $p left behind"; fails=$((fails+1)); fi
    done
}

# ---- commands and arguments
expect 2 "usage: moerun"
expect 2 "unknown command 'bogus'" bogus
expect 2 "unexpected argument 'x'" version x
expect 2 "unexpected argument '--bogus'" version --bogus
expect 2 "missing PATH" inspect
expect 2 "unknown option '--bogus'" inspect "$T" --bogus
expect 1 "No such file or directory" inspect "$S/none"
expect 1 "header too large" inspect /etc/passwd

# ---- resolve: every failure exits 2, options read cleanly once
expect 2 "--model DIR is required" resolve
expect 2 "moerun resolve: --model needs a value" resolve --model
expect 2 "--model needs a value (found the flag '--threads'" resolve --model --threads 1
expect 2 "no config.json" resolve --model "$S/none"
expect 2 "Not a directory" resolve --model /etc/passwd
expect 2 "moerun resolve: --moe-runner-backend: unknown value 'fusd'; valid values: auto, reference, routed, fused" \
    resolve --model "$T" --moe-runner-backend fusd
oneline "resolve --moe-runner-backend fusd"
expect 2 "moerun resolve: --threads: 100000 is out of range 0..4096" resolve --model "$T" --threads 100000
expect 2 "moerun resolve: --threads: -1 is out of range" resolve --model "$T" --threads -1
expect 2 "expected an integer in 0..4096, got '99999999999999999999'" resolve --model "$T" --threads 99999999999999999999
expect 2 "moerun resolve: --ep-size: expected an integer" resolve --model "$T" --ep-size abc
expect 2 "moerun resolve: unknown option '--bogus'" resolve --model "$T" --bogus
expect 2 "moerun resolve: --cpu-mask: unknown CPU feature 'foo'" resolve --model "$T" --cpu-mask foo
MOERUN_MOE_RUNNER_BACKEND=fusd expect 2 "environment MOERUN_MOE_RUNNER_BACKEND=fusd: unknown value 'fusd'" \
    resolve --model "$T"
if grep -qF "bad option" "$err" || grep -qF "moe_runner_backend: unknown" "$err"; then
    echo "FAIL: option errors repeat themselves: $(cat "$err")"; fails=$((fails+1))
fi

# ---- gen-tiny: shapes, values, output folders
expect 2 "missing DIR" gen-tiny
expect 2 "--hidden: '0' is not an integer" gen-tiny "$S/g" --hidden 0
expect 2 "--hidden needs a value" gen-tiny "$S/g" --hidden
expect 2 "--quant needs a value" gen-tiny "$S/g" --quant
expect 2 "--quant must be bf16, fp8 or nvfp4" gen-tiny "$S/g" --quant int4
expect 2 "--seed:" gen-tiny "$S/g" --seed -1
expect 2 "--vocab must be at least 8" gen-tiny "$S/g" --vocab 3
expect 2 "--top-k 999 exceeds --experts 32" gen-tiny "$S/g" --top-k 999
expect 2 "--top-k 4 exceeds --experts 1" gen-tiny "$S/g" --experts 1
expect 2 "limit 1024 GiB" gen-tiny "$S/g" --hidden 1048576 --vocab 1048576
expect 2 "unexpected argument" gen-tiny "$S/g" "$S/h"
clean "gen-tiny usage errors" "$S/g" "$S/h"
mkdir "$S/full"; echo keep >"$S/full/keep"
expect 1 "exists and is not empty" gen-tiny "$S/full"
[ "$(ls -A "$S/full")" = keep ] || { echo "FAIL: gen-tiny touched a non-empty folder"; fails=$((fails+1)); }
expect 1 "exists and is not a folder" gen-tiny "$S/full/keep"
expect 1 "cannot create a scratch folder" gen-tiny "$S/no/such/parent/x"
clean "gen-tiny output errors"
DIMS="--hidden 64 --layers 1 --experts 4 --top-k 2 --expert-dim 32 --heads 2 --kv-heads 1 --head-dim 16 --rotary-dim 8 --vocab 64"
mkdir "$S/empty"
expect 0 "" gen-tiny "$S/empty" $DIMS # an empty folder is fine
[ -f "$S/empty/config.json" ] || { echo "FAIL: gen-tiny into an empty folder"; fails=$((fails+1)); }
expect 1 "already holds a checkpoint" gen-tiny "$S/empty" $DIMS
clean "gen-tiny into an existing checkpoint"

# ---- quantize
expect 2 "missing IN and OUT" quantize
expect 2 "missing OUT" quantize "$T"
expect 2 "--to fp8|nvfp4 is required" quantize "$T" "$S/q"
expect 2 "--to needs a value" quantize "$T" "$S/q" --to
expect 2 "--to must be fp8 or nvfp4" quantize "$T" "$S/q" --to int4
expect 2 "--calib-tokens: '0' is not an integer" quantize "$T" "$S/q" --to nvfp4 --calib-tokens 0
expect 2 "unknown option '--bogus'" quantize "$T" "$S/q" --to fp8 --bogus
expect 1 "no config.json" quantize "$S/none" "$S/q" --to fp8
expect 1 "exists and is not empty" quantize "$T" "$S/full" --to nvfp4
[ "$(ls -A "$S/full")" = keep ] || { echo "FAIL: quantize touched a non-empty folder"; fails=$((fails+1)); }
expect 1 "already holds a checkpoint" quantize "$T" "$T" --to nvfp4
clean "quantize errors" "$S/q"

# ---- generate: arguments and prompts
G="generate --model $T --threads 1"
expect 2 "--model DIR is required" generate --prompt-ids 1
expect 2 "exactly one of --prompt, --prompt-ids and --batch" $G
expect 2 "--prompt-ids needs a value" $G --prompt-ids
expect 2 "bad token id near ',2'" $G --prompt-ids 1,,2
expect 2 "bad token id near 'abc'" $G --prompt-ids abc
expect 2 "ends with a comma" $G --prompt-ids 1,
expect 2 "empty prompt" $G --prompt-ids ""
expect 2 "token id 99999 is outside the vocabulary (256)" $G --prompt-ids 99999
expect 2 "-n: '-1' is not an integer in [0, 1048576]" $G --prompt-ids 1 -n -1
expect 2 "-n: '99999999' is not an integer" $G --prompt-ids 1 -n 99999999
expect 2 "--top-k: '-3'" $G --prompt-ids 1 --top-k -3
expect 2 "--temperature: 'nan'" $G --prompt-ids 1 --temperature nan
expect 2 "--temperature: '1e999'" $G --prompt-ids 1 --temperature 1e999
# a subnormal temperature is a number in range (strtof's underflow ERANGE), and samples as
# its limit, the largest logit: the tokens of temperature 0
expect 0 "" $G --prompt-ids 1,2,3 -n 6 --temperature 0
grep '^\[0\]' "$out" >"$S/t0.out"
expect 0 "" $G --prompt-ids 1,2,3 -n 6 --temperature 1e-45
grep '^\[0\]' "$out" | cmp -s - "$S/t0.out" && [ -s "$S/t0.out" ] || { echo "FAIL: --temperature 1e-45 gave other tokens than 0:"; cat "$out" "$S/t0.out"; fails=$((fails+1)); }
expect 2 "--threads: 100000 is out of range" $G --prompt-ids 1 --threads 100000
expect 2 "unknown argument '--bogus'" $G --prompt-ids 1 --bogus
expect 2 "cannot open $S/none" $G --batch "$S/none"
expect 2 "Is a directory" $G --batch "$S"
printf 'garbage\n' >"$S/garbage.txt"
expect 2 "garbage.txt:1: bad token id near 'garbage'" $G --batch "$S/garbage.txt"
oneline "generate --batch garbage"
printf '\n# only a comment\n\n' >"$S/blank.txt"
expect 2 "holds no prompt" $G --batch "$S/blank.txt"
printf '1,2\n3,\x01\n' >"$S/ctrl.txt"
expect 2 "ctrl.txt:2: bad token id near '?'" $G --batch "$S/ctrl.txt"
oneline "generate --batch with control bytes"
printf '1,2\n3,\0004\n' >"$S/nul.txt"
expect 2 "NUL byte" $G --batch "$S/nul.txt"
# a line longer than any fixed buffer is one prompt, not several
{ printf '1,'; head -c 70000 /dev/zero | tr '\0' ' '; printf '2\n'; } >"$S/long.txt"
expect 0 "" generate --model "$T" --threads 1 --batch "$S/long.txt" -n 1
grep -q '^\[0\]' "$out" && ! grep -q '^\[1\]' "$out" || { echo "FAIL: a long line was split into prompts"; cat "$out"; fails=$((fails+1)); }

# a KV cache no machine holds is refused before loading, not left to the allocator;
# requests longer than the context are refused at admission, with both numbers
for _ in $(seq 1 40000); do echo 1,2; done >"$S/many.txt"
expect 2 "more than this machine's" generate --model "$T" --threads 1 --batch "$S/many.txt" -n 1 --kv-cache-memory 1000TiB
oneline "generate with an impossible KV cache"
expect 2 "2 prompt tokens + max_tokens 1048576 = 1048578 exceed the context length of 4096" generate --model "$T" --threads 1 --batch "$S/many.txt" -n 1048576
oneline "generate beyond the context"

# ---- probe: arguments
expect 2 "--model DIR is required" probe
expect 2 "--steps needs a value" probe --model "$T" --steps
expect 2 "--steps: '99999' is not an integer in [0, 4096]" probe --model "$T" --steps 99999
expect 2 "--prompts: '0'" probe --model "$T" --prompts 0
expect 2 "unknown argument 'extra'" probe --model "$T" extra
expect 2 "--against needs a value" probe --model "$T" --against

# ---- corrupt checkpoints: copies of the tiny model with one thing broken
mk() { mkdir -p "$S/c/$1"; cp "$T/config.json" "$T/generation_config.json" "$S/c/$1/"; cp "$T/model.safetensors" "$S/c/$1/"; }
# field VALUE: config.json with "field": VALUE (VALUE "-" removes the field)
cfg() {
    local name=$1 field=$2 value=$3
    mk "$name"
    if [ "$value" = - ]; then
        sed -i "/\"$field\":/d" "$S/c/$name/config.json"
    else
        sed -i "s/\"$field\": [^,]*,/\"$field\": $value,/" "$S/c/$name/config.json"
    fi
    grep -q "\"$field\": $value," "$S/c/$name/config.json" || [ "$value" = - ] || { echo "FAIL: test setup $name"; fails=$((fails+1)); }
}
bad_cfg() { # name field value rc message
    cfg "$1" "$2" "$3"
    expect "$4" "$5" generate --model "$S/c/$1" --prompt-ids 1,2 -n 2 --threads 1
    oneline "generate on $1"
    expect "$4" "$5" probe --model "$S/c/$1" --prompts 1 --steps 1 --threads 1
    expect 2 "$5" resolve --model "$S/c/$1"
}
bad_cfg layers_huge num_hidden_layers 1000000000 2 "'num_hidden_layers' = 1000000000 is out of range"
bad_cfg layers_zero num_hidden_layers 0 2 "'num_hidden_layers' = 0 is out of range"
bad_cfg layers_missing num_hidden_layers - 2 "'num_hidden_layers' is missing"
bad_cfg head_dim_zero head_dim 0 2 "'head_dim' = 0 is out of range"
bad_cfg vocab_neg vocab_size -1 2 "'vocab_size' = -1 is out of range"
bad_cfg vocab_2p40 vocab_size 1099511627776 2 "'vocab_size' = 1099511627776 is out of range"
bad_cfg hidden_str hidden_size '"x"' 2 "'hidden_size' must be an integer"
bad_cfg topk_gt num_experts_per_tok 9 2 "num_experts_per_tok (9) exceeds num_local_experts (8)"
bad_cfg heads_notdiv num_attention_heads 3 2 "not a multiple of num_key_value_heads"
bad_cfg eps_zero rms_norm_eps 0 2 "rms_norm_eps must be positive"
bad_cfg scoring_bad scoring_func '"x"' 2 "unknown scoring_func"
# dimensions that pass the config checks but disagree with the tensors: the
# loader names the tensor, before allocating for the claimed size
cfg vocab_big vocab_size 1000000000
expect 1 "model.embed_tokens.weight: expected shape [1000000000, 64], found [256, 64]" \
    generate --model "$S/c/vocab_big" --prompt-ids 1 --threads 1
expect 1 "model.embed_tokens.weight: expected shape [1000000000, 64]" probe --model "$S/c/vocab_big" --threads 1
cfg hidden_60 hidden_size 60
expect 1 "expected shape [256, 60], found [256, 64]" generate --model "$S/c/hidden_60" --prompt-ids 1 --threads 1
mk badjson; printf '{"architectures": [' >"$S/c/badjson/config.json"
expect 2 "not valid JSON" generate --model "$S/c/badjson" --prompt-ids 1 --threads 1
mk badgen; printf '{' >"$S/c/badgen/generation_config.json"
# generation_config.json is read with config.json (its EOS ids: one parser), so a broken one is the
# same configuration error as a broken config.json
expect 2 "generation_config.json: not valid JSON" generate --model "$S/c/badgen" --prompt-ids 1 --threads 1
expect 1 "generation_config.json: not valid JSON" quantize "$S/c/badgen" "$S/qg" --to fp8
clean "quantize of a checkpoint with a broken generation_config.json" "$S/qg"

# safetensors: truncated, empty, a folder, an index naming a missing shard
mk trunc; rm "$S/c/trunc/model.safetensors"; head -c 300000 "$T/model.safetensors" >"$S/c/trunc/model.safetensors"
expect 2 "truncated file?" generate --model "$S/c/trunc" --prompt-ids 1 --threads 1
expect 1 "truncated file?" inspect "$S/c/trunc"
mk empty; rm "$S/c/empty/model.safetensors"; : >"$S/c/empty/model.safetensors"
expect 2 "header too small" generate --model "$S/c/empty" --prompt-ids 1 --threads 1
mk nost; rm "$S/c/nost/model.safetensors"
expect 1 "holds neither model.safetensors.index.json nor model.safetensors" \
    generate --model "$S/c/nost" --prompt-ids 1 --threads 1
mk idx; rm "$S/c/idx/model.safetensors"
printf '{"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}\n' \
    >"$S/c/idx/model.safetensors.index.json"
expect 2 "model-00001-of-00002.safetensors: cannot open" generate --model "$S/c/idx" --prompt-ids 1 --threads 1
expect 2 "model-00001-of-00002.safetensors: cannot open" probe --model "$S/c/idx" --threads 1
printf '{"weight_map": {"a": "../../etc/passwd"}}\n' >"$S/c/idx/model.safetensors.index.json"
expect 2 "not a relative path inside the index's folder" resolve --model "$S/c/idx"

# wrong dtype / shape inside a valid file: the header is rewritten in place
# (same length), so the file stays consistent apart from the one tensor
retype() { # name from to
    mk "$1"; rm "$S/c/$1/model.safetensors"
    LC_ALL=C sed "1s/$2/$3/" "$T/model.safetensors" >"$S/c/$1/model.safetensors"
    cmp -s "$T/model.safetensors" "$S/c/$1/model.safetensors" && { echo "FAIL: test setup $1"; fails=$((fails+1)); }
}
retype f16 '"model.layers.0.self_attn.q_proj.weight":{"dtype":"BF16"' '"model.layers.0.self_attn.q_proj.weight":{"dtype":"F16" '
expect 1 "tensor model.layers.0.self_attn.q_proj.weight: expected dtype BF16, found F16" \
    generate --model "$S/c/f16" --prompt-ids 1 --threads 1
retype shape '"model.layers.0.self_attn.k_proj.weight":{"dtype":"BF16","shape":\[32,64\]' '"model.layers.0.self_attn.k_proj.weight":{"dtype":"BF16","shape":[64,32]'
expect 1 "tensor model.layers.0.self_attn.k_proj.weight: expected shape [32, 64], found [64, 32]" \
    probe --model "$S/c/shape" --threads 1

if ls -A "$S" | grep -q '\.tmp\.'; then echo "FAIL: scratch folders left behind"; fails=$((fails+1)); fi
if [ "$fails" != 0 ]; then echo "$fails failure(s)"; exit 1; fi
rm -rf "$S"
echo OK
