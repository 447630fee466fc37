#!/usr/bin/env bash
# model_oracle.sh — `moerun generate` on the committed tiny checkpoint gives
# the greedy tokens that Hugging Face transformers produced
# (tools/oracle/gen_minimax_m2.py), with every runner that accepts it.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2
export OMP_NUM_THREADS=1
want="[0] 244 184 141 166 235 85 83 203 239 63 181 170 114 139 203 249 222"
for r in reference routed; do
  out=$("$M" generate --model "$DATA/model/tiny" --prompt-ids 1,17,42,99,3 -n 17 --moe-runner-backend $r --threads 1) || { echo "$out"; exit 1; }
  echo "$out" | grep -qxF "$want" || { echo "$out"; echo "FAIL: runner $r tokens differ from the oracle"; exit 1; }
done
# prompt 3 of the oracle reaches EOS (id 2) at its 9th token: generation stops there
out=$("$M" generate --model "$DATA/model/tiny" --prompt-ids 77,31,9 -n 17 --threads 1) || exit 1
echo "$out" | grep -qxF "[0] 143 182 37 50 176 101 171 100 2 <eos>" || { echo "$out"; echo "FAIL: EOS stop"; exit 1; }
# the three oracle prompts as one batch (different lengths; one stops early at EOS)
S=$3; rm -rf "$S"; mkdir -p "$S"
printf '1,17,42,99,3\n200,5,5,7,250,128,64,11,13\n77,31,9\n' > "$S/b.txt"
out=$("$M" generate --model "$DATA/model/tiny" --batch "$S/b.txt" -n 17 --threads 1) || exit 1
echo "$out" | grep -qxF "$want" || { echo "$out"; echo "FAIL: batch row 0"; exit 1; }
echo "$out" | grep -qxF "[1] 31 233 216 180 115 186 168 215 210 45 159 140 211 125 75 63 213" || { echo "$out"; echo "FAIL: batch row 1"; exit 1; }
echo "$out" | grep -qxF "[2] 143 182 37 50 176 101 171 100 2 <eos>" || { echo "$out"; echo "FAIL: batch row 2"; exit 1; }
rm -rf "$S"
echo OK
