#!/usr/bin/env bash
# tokenize.sh MOERUN DATA SCRATCH — `moerun tokenize` / `moerun detokenize`
# against the ids and decodes that huggingface/tokenizers produced
# (text/<form>/cli_cases.tsv, written by tools/golden/gen_tokenizers.py):
# text from --text, --file and stdin, --no-special, --json, detokenize with
# --skip-special; then bad input of every kind exits 2 with a clear message
# and never crashes.
set -u
MOERUN=$1
DATA=$2
SCRATCH=$3
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
unhex() { printf "$(printf '%s' "$1" | sed 's/../\\x&/g')"; }
tohex() { od -An -v -tx1 | tr -d ' \n'; }

checked=0
for form in minimax gpt2 llama3 normseq fallback subword; do
    M="$DATA/text/$form"
    while IFS=$'\t' read -r hex ids plain skip; do
        unhex "$hex" >"$SCRATCH/in.txt"
        got=$("$MOERUN" tokenize --model "$M" --file "$SCRATCH/in.txt" 2>"$SCRATCH/err") ||
            fail "$form tokenize --file $hex: $(cat "$SCRATCH/err")"
        [ "$got" = "$ids" ] || fail "$form tokenize --file $hex: got $got want $ids"
        got=$("$MOERUN" tokenize --model "$M" --no-special <"$SCRATCH/in.txt" 2>"$SCRATCH/err")
        [ "$got" = "$plain" ] || fail "$form tokenize --no-special (stdin) $hex: got $got want $plain"
        if [ -n "$ids" ]; then
            got=$("$MOERUN" detokenize --model "$M" --ids "$ids" --skip-special | tohex)
            [ "$got" = "$skip" ] || fail "$form detokenize --skip-special $ids: got $got want $skip"
        fi
        checked=$((checked + 1))
    done < <(head -n 8 "$M/cli_cases.tsv")
done
[ $checked -ge 30 ] || fail "only $checked CLI cases checked"

M="$DATA/text/minimax"
# --text and the folder's tokenizer.json path give the same ids
a=$("$MOERUN" tokenize --model "$M" --text "Hello]~!b[ world")
b=$("$MOERUN" tokenize --model "$M/tokenizer.json" --text "Hello]~!b[ world")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "--text via folder ($a) and file ($b)"
echo "$a" | grep -q ",200034," || fail "special token ]~!b[ not encoded as 200034: $a"
c=$("$MOERUN" tokenize --model "$M" --split-special --text "Hello]~!b[ world")
echo "$c" | grep -q "200034" && fail "--split-special still gives 200034: $c"
# --json: ids, pieces, texts
j=$("$MOERUN" tokenize --model "$M" --json --text "Hi there")
for k in '"count":' '"ids":[' '"piece":"\u0120there"' '"text":" there"'; do
    echo "$j" | grep -qF "$k" || fail "tokenize --json lacks $k: $j"
done
j=$("$MOERUN" detokenize --model "$M" --json --ids "$(echo "$a" | tr -d '\n')")
echo "$j" | grep -qF '"text":"Hello]~!b[ world"' || fail "detokenize --json: $j"
# detokenize reads ids from stdin too, separated by spaces or commas
t=$(echo "$a" | tr ',' ' ' | "$MOERUN" detokenize --model "$M" --skip-special)
[ "$t" = "Hello world" ] || fail "detokenize stdin --skip-special: '$t'"
# invalid UTF-8: refused with the offset, or replaced
printf 'ab\xffc' >"$SCRATCH/bad.txt"
"$MOERUN" tokenize --model "$M" --file "$SCRATCH/bad.txt" >/dev/null 2>"$SCRATCH/err"
rc=$?
[ $rc -eq 2 ] || fail "invalid UTF-8: exit $rc"
grep -q "byte offset 2" "$SCRATCH/err" || fail "invalid UTF-8 message: $(cat "$SCRATCH/err")"
"$MOERUN" tokenize --model "$M" --replace-invalid --file "$SCRATCH/bad.txt" >/dev/null || fail "--replace-invalid"

# --- bad input: exit 2, a message, no crash ---
expect2() { # description, then the command
    local what=$1
    shift
    "$@" >"$SCRATCH/out" 2>"$SCRATCH/err" </dev/null
    local rc=$?
    [ $rc -eq 2 ] || fail "$what: exit $rc (want 2): $(head -c 300 "$SCRATCH/err")"
    [ -s "$SCRATCH/err" ] || fail "$what: no message"
    grep -qi "$MATCH" "$SCRATCH/err" || fail "$what: message lacks '$MATCH': $(head -c 300 "$SCRATCH/err")"
}
mk() { mkdir -p "$SCRATCH/$1" && printf '%s' "$2" >"$SCRATCH/$1/tokenizer.json"; }
MATCH="cannot open" expect2 "missing folder" "$MOERUN" tokenize --model "$SCRATCH/none" --text a
mkdir -p "$SCRATCH/empty"
MATCH="tokenizer.json" expect2 "folder without tokenizer.json" "$MOERUN" tokenize --model "$SCRATCH/empty" --text a
MATCH="bad JSON"
mk badjson '{"model": {'
expect2 "bad JSON" "$MOERUN" tokenize --model "$SCRATCH/badjson" --text a
MATCH="normalizer"
mk badnorm '{"normalizer":{"type":"BertNormalizer"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}'
expect2 "unknown normalizer" "$MOERUN" tokenize --model "$SCRATCH/badnorm" --text a
MATCH="pre-tokenizer"
mk badpre '{"pre_tokenizer":{"type":"Metaspace2"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}'
expect2 "unknown pre-tokenizer" "$MOERUN" tokenize --model "$SCRATCH/badpre" --text a
MATCH="model"
mk badmodel '{"model":{"type":"Unigram","vocab":[]}}'
expect2 "unknown model" "$MOERUN" tokenize --model "$SCRATCH/badmodel" --text a
MATCH="decoder"
mk baddec '{"decoder":{"type":"WordPiece"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}'
expect2 "unknown decoder" "$MOERUN" tokenize --model "$SCRATCH/baddec" --text a
MATCH="merge"
mk badmerge '{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}}'
expect2 "merge result not in vocab" "$MOERUN" tokenize --model "$SCRATCH/badmerge" --text a
MATCH="regex"
mk badre '{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(a"},"behavior":"Isolated","invert":false},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}'
expect2 "bad regex" "$MOERUN" tokenize --model "$SCRATCH/badre" --text a
MATCH="not a token id" expect2 "non-numeric id" "$MOERUN" detokenize --model "$M" --ids 1,two,3
MATCH="names no token" expect2 "id out of range" "$MOERUN" detokenize --model "$M" --ids 5,300000
MATCH="names no token" expect2 "negative id" "$MOERUN" detokenize --model "$M" --ids -1
MATCH="names no token" expect2 "id in the hole below the specials" "$MOERUN" detokenize --model "$M" --ids 150000
MATCH="cannot open" expect2 "missing --file" "$MOERUN" tokenize --model "$M" --file "$SCRATCH/nofile"
MATCH="required" expect2 "no --model" "$MOERUN" tokenize --text a
MATCH="unknown option" expect2 "unknown option" "$MOERUN" tokenize --model "$M" --bogus
MATCH="needs a value" expect2 "option without value" "$MOERUN" detokenize --model "$M" --ids

if [ $fails -ne 0 ]; then
    echo "tokenize.sh: $fails failure(s)"
    exit 1
fi
echo "tokenize.sh: $checked golden CLI cases and the bad-input checks passed"
