#!/usr/bin/env bash
# peer_scripts.sh — the checks bench/peers/llamacpp_bench.py makes before it
# starts llama-server, on GGUF files written here byte by byte from the GGUF
# specification (magic "GGUF", version, tensor count, metadata count, then
# key / type / value; ggml's docs/gguf.md), not by the gguf package (not
# installed in CI):
# - gguf_keys() lists the keys of a version 2 and a version 3 file, past
#   scalar, string and nested array values, and refuses a truncated file (a
#   length past its end too), an unknown value type, a wrong magic and an
#   unknown version;
# - the bench refuses (exit 2, with the file and the fix named) a GGUF without
#   tokenizer.ggml.model, which llama-server aborts on at its first request,
#   and a file that is not GGUF, before it starts anything; a GGUF with a
#   tokenizer passes that check (the run then stops at the next one, a
#   missing moerun binary).
# Args: <moerun> <tests/data> <scratch dir>
set -u
D=$2; S=$3
rm -rf "$S"; mkdir -p "$S"
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null || { echo "SKIPPED: no python3"; exit 77; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=$ROOT/bench/peers/llamacpp_bench.py

python3 - "$S" <<'EOF' || fail "writing the GGUF files"
import struct, sys
S = sys.argv[1]
def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b
def kv(key, typ, payload):
    return s(key) + struct.pack("<I", typ) + payload
def gguf(version, kvs):
    head = b"GGUF" + struct.pack("<I", version) + struct.pack("<QQ", 0, len(kvs))
    return head + b"".join(kvs)
common = [
    kv("general.architecture", 8, s("minimax-m2")),
    kv("general.alignment", 4, struct.pack("<I", 32)),
    kv("minimax-m2.rope.freq_base", 6, struct.pack("<f", 1e4)),
    kv("minimax-m2.flag", 7, b"\x01"),
    kv("minimax-m2.big", 10, struct.pack("<Q", 1 << 40)),
    kv("minimax-m2.f64", 12, struct.pack("<d", 0.5)),
    # an array of arrays: [[1, 2], [3]] as u16
    kv("minimax-m2.nested", 9, struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 2, 2) + struct.pack("<HH", 1, 2)
       + struct.pack("<IQ", 2, 1) + struct.pack("<H", 3)),
]
tok = [kv("tokenizer.ggml.model", 8, s("gpt2")),
       kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + s("a") + s("bc") + s("\u00e9"))]
open(f"{S}/tok3.gguf", "wb").write(gguf(3, common + tok))
open(f"{S}/tok2.gguf", "wb").write(gguf(2, tok + common))
open(f"{S}/notok.gguf", "wb").write(gguf(3, common))
full = gguf(3, common + tok)
open(f"{S}/trunc.gguf", "wb").write(full[:len(full) - 3])
open(f"{S}/badtype.gguf", "wb").write(gguf(3, [kv("x", 13, b"")] + tok))
open(f"{S}/v1.gguf", "wb").write(b"GGUF" + struct.pack("<I", 1) + b"\0" * 16)
open(f"{S}/notgguf.gguf", "wb").write(b"GGML" + b"\0" * 64)
# a key 2^62 bytes long in a 40-byte file: refused as truncated, not read (or allocated)
open(f"{S}/hugekey.gguf", "wb").write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 62) + b"abc")
EOF

keys() { python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from llamacpp_bench import gguf_keys
try:
    print(",".join(gguf_keys(sys.argv[2])))
except ValueError as e:
    print("ValueError:", e)' "$ROOT/bench/peers" "$1"; }
want3="general.architecture,general.alignment,minimax-m2.rope.freq_base,minimax-m2.flag,minimax-m2.big,minimax-m2.f64,minimax-m2.nested,tokenizer.ggml.model,tokenizer.ggml.tokens"
[ "$(keys "$S/tok3.gguf")" = "$want3" ] || fail "gguf_keys v3: $(keys "$S/tok3.gguf")"
want2="tokenizer.ggml.model,tokenizer.ggml.tokens,general.architecture,general.alignment,minimax-m2.rope.freq_base,minimax-m2.flag,minimax-m2.big,minimax-m2.f64,minimax-m2.nested"
[ "$(keys "$S/tok2.gguf")" = "$want2" ] || fail "gguf_keys v2: $(keys "$S/tok2.gguf")"
for bad in "trunc:truncated" "hugekey:truncated" "badtype:unknown value type 13" "v1:GGUF version 1" "notgguf:no GGUF magic"; do
  out=$(keys "$S/${bad%%:*}.gguf")
  case "$out" in "ValueError: ${bad#*:}"*) ;; *) fail "gguf_keys ${bad%%:*}: $out" ;; esac
done

# the bench's checks before it starts anything: a stand-in llama-server that must never run
srv=$S/llama-server/bin/llama-server
mkdir -p "$(dirname "$srv")"
printf '#!/bin/sh\ntouch %s/server-ran\nexit 1\n' "$S" >"$srv"; chmod +x "$srv"
ck=$S/ckpt; mkdir -p "$ck"; echo '{"vocab_size": 64}' >"$ck/config.json"
run() { python3 "$B" --isa native --llama-server "$srv" --moerun "$S/no-moerun" --pair "x=$ck:$1" 2>&1; }
out=$(run "$S/notok.gguf"); rc=$?
[ $rc = 2 ] || fail "no tokenizer: exit $rc: $out"
echo "$out" | grep -qF "$S/notok.gguf has no tokenizer" || fail "no tokenizer: $out"
echo "$out" | grep -qF "gguf_tokenizer.py" || fail "no tokenizer, the fix not named: $out"
for f in trunc notgguf; do
  out=$(run "$S/$f.gguf"); rc=$?
  [ $rc = 2 ] || fail "$f: exit $rc: $out"
  echo "$out" | grep -qF "$S/$f.gguf is not a readable GGUF file" || fail "$f: $out"
done
out=$(run "$S/tok3.gguf"); rc=$?
[ $rc = 2 ] || fail "with a tokenizer: exit $rc: $out"
echo "$out" | grep -qF "no-moerun is not an executable" || fail "with a tokenizer, not past the GGUF check: $out"
[ ! -e "$S/server-ran" ] || fail "llama-server was started"
echo "peer_scripts: ok"
