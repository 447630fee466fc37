#!/usr/bin/env bash
# bench.sh — `moerun bench moe` runs end to end on small shapes for every
# weight format, prints its ceilings and the target lines, and writes
# a JSON file with the fields bench/README.md reads; bad options are refused
# with exit 2 and a message, and an unwritable --json path fails without
# leaving a file. bench engine runs with sampling flags and records them in
# its JSON; bench grammar and bench dense refuse their bad input too.
# (Timings are not checked: machines here are shared.)
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; D=$2; S=$3
rm -rf "$S"; mkdir -p "$S"
fail() { echo "FAIL: $*"; exit 1; }
small="--experts 8 --hidden 256 --inter 128 --topk 2 --iters 2 --threads 2"
for fa in "fp8 w8a8" "fp8 w8a16" "nvfp4 w4a4" "nvfp4 w4a8" "nvfp4 w4a16" "bf16 w16a16"; do
  set -- $fa
  j="$S/$1_$2.json"
  out=$("$M" bench moe --format "$1" --act-mode "$2" --tokens 1,32 $small --scaling --phases --json "$j" 2>&1) \
    || fail "bench $1 $2: $out"
  for want in "ceilings (this run): read bandwidth" "read bandwidth with 1 thread" "the project's targets" \
              "decode T=1 bandwidth" "scaling 2 vs 1 thread" "phases per call" "peak RSS" "steady RSS"; do
    echo "$out" | grep -qF "$want" || fail "bench $1 $2: no '$want' in: $out"
  done
  [ -s "$j" ] || fail "no JSON from bench $1 $2"
  for key in '"format": "'"$1"'"' '"act_mode": "'"$2"'"' '"read_bw_gb_per_s"' '"read_bw_1thread_gb_per_s"' \
             '"peak_instr"' '"results"' '"median_ms_1thread"' '"rss_ratio"'; do
    grep -qF "$key" "$j" || fail "JSON of $1 $2 lacks $key"
  done
done
# bad input: exit 2 with a message naming the problem
for bad in "--tokens 0" "--tokens 1,,2" "--format nope" "--act-mode w4a4 --format fp8" "--iters 0" \
           "--threads 0" "--experts 4 --topk 8" "--hidden 100 --format nvfp4 --act-mode w4a4" "--frobnicate"; do
  out=$("$M" bench moe $bad --iters 1 2>&1 </dev/null); rc=$?
  case "$bad" in "--iters 0") out=$("$M" bench moe --iters 0 2>&1); rc=$? ;; esac
  [ $rc -eq 2 ] || fail "'bench moe $bad' must exit 2, got $rc: $out"
  [ -n "$out" ] || fail "'bench moe $bad' says nothing"
done
# empty token lists, and bench dense's own bad input
for args in "moe --tokens=" "dense --tokens=" "dense --tokens=513" "dense --iters=0" "dense --threads=x"; do
  set -- $args
  out=$("$M" bench "$1" "${2%%=*}" "${2#*=}" 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "'bench $1 ${2%%=*} ${2#*=}' must exit 2, got $rc: $out"
  [ -n "$out" ] || fail "'bench $args' says nothing"
done
# bench dense without the memory it needs (1 GiB probe + 640 MB of layers): exit 1 and a
# message, not a crash or a silent 0 (skipped under ASan, which reserves terabytes of address space)
if ! "$M" version 2>&1 | grep -q ASan; then
  out=$(ulimit -v 1400000; "$M" bench dense --tokens 1 --iters 1 2>&1); rc=$?
  [ $rc -eq 1 ] && echo "$out" | grep -q "out of memory" || fail "bench dense out of memory: exit $rc: $out"
fi
# bench grammar: a synthetic vocabulary and a model's, the ceiling beside the mask, its JSON; a bad schema
# and bad options are refused
j="$S/grammar.json"
out=$("$M" bench grammar --synthetic 3000 --steps 60 --json "$j" 2>&1) || fail "bench grammar: $out"
for want in "mask per token over 60 steps" "ceiling: one argmax pass" "mask / pass"; do
  echo "$out" | grep -qF "$want" || fail "bench grammar: no '$want' in: $out"
done
for key in '"mask_p50_ms"' '"argmax_ms"' '"vocab": 3000'; do grep -qF "$key" "$j" || fail "bench grammar JSON lacks $key"; done
out=$("$M" bench grammar --model "$D/text/minimax" --steps 40 2>&1) || fail "bench grammar --model: $out"
echo "$out" | grep -qF "200064 ids" || fail "bench grammar --model: $out"
printf '{"type":"string","pattern":"(a)\\\\1"}' >"$S/bad_schema.json"
out=$("$M" bench grammar --synthetic 3000 --steps 20 --schema "$S/bad_schema.json" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "backreferences" || fail "bench grammar bad schema: exit $rc: $out"
for bad in "--synthetic 10" "--steps 0" "--frobnicate"; do
  out=$("$M" bench grammar $bad 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "'bench grammar $bad' must exit 2, got $rc: $out"
done
# bench engine with sampling flags: the table, its JSON with the sampling it ran; bad flags exit 2 with a message
j="$S/engine.json"
out=$("$M" bench engine --model "$D/model/tiny" --batch 1,4 --rounds 1 --steps 2 --temperature 0.7 --top-p 0.9 \
      --top-k 20 --json "$j" 2>&1) || fail "bench engine: $out"
for want in "decode tok/s" "ceiling (this run): read bandwidth" "scheduling overhead"; do
  echo "$out" | grep -qF "$want" || fail "bench engine: no '$want' in: $out"
done
python3 - "$j" <<'PY' || fail "bench engine JSON: $(cat "$j")"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["sampling"]
assert abs(s["temperature"] - 0.7) < 1e-6 and s["top_k"] == 20 and abs(s["top_p"] - 0.9) < 1e-6, s
assert [x["B"] for x in r["results"]] == [1, 4] and all(x["decode_tok_per_s"] > 0 for x in r["results"]), r
PY
for bad in "--temperature -1" "--top-p 0" "--top-k x" "--temperature"; do
  out=$("$M" bench engine --model "$D/model/tiny" $bad 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -qF -- "${bad%% *}" || fail "'bench engine $bad' must exit 2 naming it, got $rc: $out"
done
# an unwritable JSON path: failure, and nothing left behind
out=$("$M" bench moe $small --tokens 1 --json "$S/no/such/dir/r.json" 2>&1); rc=$?
[ $rc -ne 0 ] || fail "unwritable --json must fail: $out"
[ ! -e "$S/no/such/dir/r.json" ] || fail "partial JSON left"
echo "ok"
