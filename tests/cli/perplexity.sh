#!/usr/bin/env bash
# perplexity.sh MOERUN DATA SCRATCH — `moerun perplexity` on the trained
# default model (models/tiny-kjv) and its held-out chapters (valid.txt):
#   - bf16 equals the perplexity transformers computed over the same first
#     8192 tokens (train_log.json, written by tools/train_tiny.py);
#   - window accounting: non-overlapping windows score N - windows tokens,
#     a stride below ctx scores every token but the first (N - 1);
#   - quantization quality: the bf16 model quantized here by `moerun
#     quantize` to FP8 (w8a8) and NVFP4 (w4a16, w4a4), perplexity at most
#     1%, 3% and 5% above bf16 (the quantized folders carry the tokenizer);
#   - the KV cache: --kv-cache-dtype fp32 (the paged pool the server keeps)
#     gives the default's (the contiguous fp32 cache's) perplexity exactly, the
#     same arithmetic; bf16, fp8_e4m3 and fp8_e5m2 within 0.1%, 0.5% and 2% of
#     it (each a different number: the pool really holds that type);
#   - bad input exits 2 with a message: missing / empty / invalid UTF-8 file,
#     stride > ctx, a folder without tokenizer.json, unknown options.
set -u
MOERUN=$1
DATA=$2
SCRATCH=$3
M="$DATA/../../models/tiny-kjv"
V="$M/valid.txt"
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
field() { sed -n "s/.*\"$1\": \\([^,}]*\\).*/\\1/p"; }
ppl() { # DIR [options] -> perplexity JSON line on stdout
    "$MOERUN" perplexity --threads 1 --model "$@" --file "$V" --ctx 256 --max-tokens 8192 --json 2>"$SCRATCH/err" ||
        { fail "perplexity $*: $(cat "$SCRATCH/err")"; echo '{}'; }
}

# 1. bf16 against transformers
j=$(ppl "$M")
bf16=$(printf '%s' "$j" | field perplexity)
want=$(sed -n 's/.*"valid_ppl_bf16_torch_first8192": \([0-9.e+-]*\).*/\1/p' "$M/train_log.json")
echo "bf16: moerun $bf16, transformers $want"
awk -v a="$bf16" -v b="$want" 'BEGIN { d = a / b - 1; if (d < 0) d = -d; exit !(a > 0 && d < 1e-4) }' ||
    fail "bf16 perplexity $bf16 is not transformers' $want (1e-4 relative)"
[ "$(printf '%s' "$j" | field tokens_scored)" = $((8192 - 32)) ] || fail "stride 256: scored $(printf '%s' "$j" | field tokens_scored), want 8160"
j2=$("$MOERUN" perplexity --threads 1 --model "$M" --file "$V" --ctx 256 --stride 128 --max-tokens 2048 --json 2>"$SCRATCH/err") ||
    fail "stride 128: $(cat "$SCRATCH/err")"
[ "$(printf '%s' "$j2" | field tokens_scored)" = 2047 ] || fail "stride 128: scored $(printf '%s' "$j2" | field tokens_scored), want 2047"
[ "$(printf '%s' "$j2" | field windows)" = 15 ] || fail "stride 128: $(printf '%s' "$j2" | field windows) windows, want 15"

# 2. quantization quality on the held-out split
"$MOERUN" quantize "$M" "$SCRATCH/fp8" --to fp8 >/dev/null 2>"$SCRATCH/err" || fail "quantize fp8: $(cat "$SCRATCH/err")"
"$MOERUN" quantize "$M" "$SCRATCH/nvfp4" --to nvfp4 >/dev/null 2>"$SCRATCH/err" || fail "quantize nvfp4: $(cat "$SCRATCH/err")"
check() { # NAME DIR MODE LIMIT_PERCENT
    local p
    p=$(ppl "$2" --activation-mode "$3" | field perplexity)
    awk -v n="$1" -v p="$p" -v b="$bf16" -v l="$4" 'BEGIN {
        printf "%-14s ppl %9.4f  %+7.3f%% vs bf16 (limit %s%%)\n", n, p, 100 * (p / b - 1), l
        exit !(p > 0 && p <= b * (1 + l / 100)) }' || fail "$1: perplexity $p is more than $4% above bf16 $bf16"
}
check "fp8 w8a8" "$SCRATCH/fp8" w8a8 1
check "nvfp4 w4a16" "$SCRATCH/nvfp4" w4a16 3
check "nvfp4 w4a4" "$SCRATCH/nvfp4" w4a4 5

# 3. the KV cache's type
p32=$(ppl "$M" --kv-cache-dtype fp32 | field perplexity)
[ "$p32" = "$bf16" ] || fail "--kv-cache-dtype fp32: perplexity $p32, the contiguous cache's $bf16"
seen=" $bf16 "
for t in bf16:0.1 fp8_e4m3:0.5 fp8_e5m2:2; do
    p=$(ppl "$M" --kv-cache-dtype "${t%%:*}" | field perplexity)
    awk -v n="${t%%:*}" -v p="$p" -v b="$bf16" -v l="${t##*:}" 'BEGIN {
        d = 100 * (p / b - 1); printf "KV %-9s ppl %9.4f  %+7.3f%% vs the fp32 cache (limit %s%%)\n", n, p, d, l
        exit !(p > 0 && (d < 0 ? -d : d) <= l) }' || fail "KV ${t%%:*}: perplexity $p is more than ${t##*:}% off $bf16"
    case "$seen" in *" $p "*) fail "KV ${t%%:*}: perplexity $p equals another cache type's";; esac
    seen="$seen$p "
done

# 4. bad input
expect2() { # WHAT PATTERN ARGS...
    local what=$1 pat=$2
    shift 2
    "$MOERUN" perplexity "$@" >"$SCRATCH/out" 2>"$SCRATCH/err"
    local rc=$?
    [ $rc = 2 ] || fail "$what: exit $rc, want 2 ($(cat "$SCRATCH/err"))"
    grep -q -- "$pat" "$SCRATCH/err" || fail "$what: message '$(cat "$SCRATCH/err")' lacks '$pat'"
}
: >"$SCRATCH/empty.txt"
printf 'In the beginning\xff God' >"$SCRATCH/bad.txt"
mkdir -p "$SCRATCH/notok" && cp "$M/config.json" "$M/model.safetensors" "$SCRATCH/notok/"
expect2 "missing file" "cannot open" --model "$M" --file "$SCRATCH/none.txt"
expect2 "empty file" "at least 2" --model "$M" --file "$SCRATCH/empty.txt"
expect2 "invalid UTF-8" "byte offset 16" --model "$M" --file "$SCRATCH/bad.txt"
expect2 "stride > ctx" "must not exceed" --model "$M" --file "$V" --ctx 64 --stride 65
expect2 "ctx 1" "--ctx" --model "$M" --file "$V" --ctx 1
expect2 "no tokenizer" "tokenizer" --model "$SCRATCH/notok" --file "$V"
expect2 "unknown option" "unknown argument" --model "$M" --file "$V" --bogus
expect2 "no --file" "required" --model "$M"

rm -rf "$SCRATCH"
if [ $fails -gt 0 ]; then
    echo "$fails failed"
    exit 1
fi
echo "perplexity.sh: all checks passed"
