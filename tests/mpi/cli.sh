#!/usr/bin/env bash
# cli.sh — the moerun commands under mpirun with the mpi transport, against
# the same commands in one process:
#   - generate (bf16, fp8, nvfp4; 9 experts, which neither 2 nor 4 ranks
#     divide; greedy and seeded sampling; a batch of prompts scheduled
#     together) prints the same tokens with 2 and 4 ranks as one process,
#     also over the TCP transport from a hostfile (the README's two-machine
#     command, both slots on this machine);
#   - probe prints the same comparison lines (the same logit errors: the
#     expert-parallel runs are bit-identical);
#   - (mpi, fused) is refused on every rank with the same message and exit 2,
#     before anything is loaded; chat refuses to run expert-parallel;
#   - a rank that dies (SIGKILL) or hangs mid-run (MOERUN_EP_FAULT) does not
#     hang the others: every survivor says so, the job exits non-zero within
#     the deadline (each mpirun here has its own timeout);
#   - bench moe runs, its outputs equal one process, and it reports rows
#     per rank and each rank's RSS.
# Args: <moerun> <source dir> <scratch dir>. SKIP (77) without mpirun or MPI.
set -u
B=$1; SRC=$2; S=$3
skip() { echo "SKIP: $*"; exit 77; }
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
"$B" version | grep -q "no MPI" && skip "this build has no MPI (install libopenmpi-dev and reconfigure)"
rm -rf "$S"; mkdir -p "$S"
export OMP_NUM_THREADS=1
# ASan builds: Open MPI's own allocations are not ours (tests/mpi/lsan.supp; the slow unwinder sees
# through its unloaded components)
export LSAN_OPTIONS="suppressions=$SRC/tests/mpi/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
mpi() { local np=$1; shift
  timeout "${TMO:-300}" mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS -x LSAN_OPTIONS -x ASAN_OPTIONS ${MPIX:-} \
    -np "$np" "$B" "$@"; }
tokens() { grep -E '^\[[0-9]+\]' <<< "$1"; }

"$B" gen-tiny "$S/bf16" --seed 5 --layers 2 --experts 9 --top-k 3 --vocab 256 >/dev/null || fail "gen-tiny"
"$B" quantize "$S/bf16" "$S/fp8" --to fp8 >/dev/null || fail "quantize fp8"
"$B" quantize "$S/bf16" "$S/nvfp4" --to nvfp4 >/dev/null || fail "quantize nvfp4"
printf '1,2,3,4,5\n7,8\n9,10,11,12,13,14,15,16,17,18,19,20\n' > "$S/batch.txt"

# generate: the same tokens as one process (every format with 2 and 4 ranks; nvfp4 w4a16, whose gemv takes
# x as fixed point; a batch and sampling with fp8)
for run in "bf16 2,4 --prompt-ids 3,1,4,1,5,9,2,6 -n 12" "fp8 2,4 --prompt-ids 3,1,4,1,5,9,2,6 -n 12" \
           "nvfp4 2,4 --prompt-ids 3,1,4,1,5,9,2,6 -n 12" "fp8 2 --batch $S/batch.txt -n 6" \
           "nvfp4 2 --prompt-ids 3,1,4,1,5,9,2,6 -n 12 --activation-mode w4a16" \
           "fp8 4 --prompt-ids 3,1,4 -n 10 --temperature 0.8 --top-k 20 --seed 11"; do
  read -r q nps args <<< "$run"
  {
    one=$("$B" generate --model "$S/$q" $args --ignore-eos --threads 1 2>&1) || { echo "$one"; fail "$q one process: $args"; continue; }
    for np in ${nps//,/ }; do
      ep=$(mpi $np generate --model "$S/$q" $args --ignore-eos --moe-a2a-backend mpi 2>&1)
      rc=$?
      [ $rc -eq 0 ] || { echo "$ep"; fail "$q np $np: exit $rc: $args"; continue; }
      [ -n "$(tokens "$one")" ] && [ "$(tokens "$one")" = "$(tokens "$ep")" ] ||
        { echo "one: $(tokens "$one")"; echo "ep:  $(tokens "$ep")"; fail "$q np $np tokens differ: $args"; }
      grep -q "expert parallel: $np ranks" <<< "$ep" || fail "$q np $np: no per-rank placement line"
    done
  }
done
# the README's two-machine command (a hostfile, the TCP transport) with both slots on this machine
printf 'localhost slots=2\n' > "$S/hosts"
one=$("$B" generate --model "$S/nvfp4" --prompt-ids 3,1,4,1,5 -n 12 --ignore-eos --threads 1 2>&1)
ep=$(MPIX="--hostfile $S/hosts --mca btl tcp,self --mca btl_tcp_if_include lo" mpi 2 generate --model "$S/nvfp4" \
     --prompt-ids 3,1,4,1,5 -n 12 --ignore-eos --moe-a2a-backend mpi 2>&1) || { echo "$ep"; fail "hostfile + tcp: exit"; }
[ -n "$(tokens "$one")" ] && [ "$(tokens "$one")" = "$(tokens "$ep")" ] ||
  { echo "one: $(tokens "$one")"; echo "ep:  $(tokens "$ep")"; fail "hostfile + tcp: tokens differ"; }
# each rank holds its experts only: with 4 ranks, 9 experts are 3, 2, 2, 2
ep=$(mpi 4 generate --model "$S/fp8" --prompt-ids 1,2 -n 1 --moe-a2a-backend mpi 2>&1)
grep -q "rank 0 experts 0..2 .*rank 1 experts 3..4 .*rank 2 experts 5..6 .*rank 3 experts 7..8" <<< "$ep" ||
  { echo "$ep"; fail "placement of 9 experts over 4 ranks"; }

# probe: the same numbers as one process
one=$("$B" probe --model "$S/fp8" --prompts 3 --steps 5 --threads 1 2>&1) || { echo "$one"; fail "probe one process"; }
ep=$(mpi 2 probe --model "$S/fp8" --prompts 3 --steps 5 --moe-a2a-backend mpi 2>&1) || { echo "$ep"; fail "probe np 2"; }
a=$(grep -A1 "^runner routed" <<< "$one"); b=$(grep -A1 "^runner routed" <<< "$ep")
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "one: $a"; echo "ep:  $b"; fail "probe lines differ"; }
grep -q "probe: 1 runner compared with the reference: PASS" <<< "$ep" || fail "probe np 2 verdict"

# the refused pair: every rank, the same message, exit 2, nothing loaded
out=$(mpi 2 generate --model "$S/fp8" --prompt-ids 1,2 -n 2 --moe-a2a-backend mpi --moe-runner-backend fused 2>&1); rc=$?
[ $rc -eq 2 ] || fail "(mpi, fused): exit $rc, expected 2"
n=$(grep -c "resolution failed: moe_a2a_backend=mpi cannot be combined with moe_runner_backend=fused.*runners that can: routed, reference" <<< "$out")
[ "$n" -eq 2 ] || { echo "$out"; fail "(mpi, fused): $n of 2 ranks printed the refusal"; }
for r in 0 1; do grep -q "generate \[rank $r/2\]: resolution failed" <<< "$out" || fail "(mpi, fused): rank $r silent"; done
[ "$(grep "resolution failed" <<< "$out" | sed 's/\[rank [0-9]\/2\]//' | sort -u | wc -l)" -eq 1 ] || fail "(mpi, fused): the messages differ"
grep -q "^loaded:\|expert parallel:" <<< "$out" && fail "(mpi, fused): something was loaded"
out=$(mpi 2 bench moe --moe-a2a-backend mpi --runner fused --experts 8 --hidden 128 --inter 128 --tokens 1 2>&1); rc=$?
# (counted as matches, not lines: mpirun may still interleave the two ranks' lines)
[ $rc -eq 2 ] && [ "$(grep -o "routes inside" <<< "$out" | wc -l)" -eq 2 ] &&
  [ "$(grep -o "Runners that can: routed, reference" <<< "$out" | wc -l)" -eq 2 ] ||
  { echo "$out"; fail "bench moe (mpi, fused): exit $rc"; }
out=$(mpi 2 chat --model "$S/fp8" 2>&1 < /dev/null); rc=$?
[ $rc -eq 2 ] && grep -q "does not run expert-parallel" <<< "$out" || { echo "$out"; fail "chat under mpirun: exit $rc"; }

# a rank that dies, a rank that hangs: the others stop within the deadline, each saying so
for kind in die hang; do
  # no timing assertion (a loaded CI host): a hang is the mpirun's own timeout (124)
  out=$(MOERUN_EP_FAULT=1:40:$kind MPIX="-x MOERUN_EP_FAULT" TMO=180 mpi 3 generate --model "$S/fp8" --prompt-ids 1,2,3 -n 400 \
        --ignore-eos --moe-a2a-backend mpi --ep-timeout 3 2>&1); rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "$out"; fail "$kind: exit $rc (124: a hang)"; }
  grep -q "MOERUN_EP_FAULT: $( [ $kind = die ] && echo dying || echo hanging )" <<< "$out" || fail "$kind: the fault did not fire"
  # each survivor says why it stopped: its own deadline, or mpirun's SIGTERM once the other survivor's
  # deadline ended the job first (on a loaded host their 3 s can end far enough apart)
  for r in 0 2; do
    grep -q "generate \[rank $r/3\]: \(stopped by SIGTERM\|.*did not complete within\)" <<< "$out" ||
      { echo "$out"; fail "$kind: rank $r did not say why it stopped"; }
  done
  # a hang is found by a deadline: at least one survivor names it
  [ $kind = die ] || grep -q "generate \[rank [02]/3\]: .*did not complete within 3.0 s: a peer rank died or stopped answering" <<< "$out" ||
    { echo "$out"; fail "hang: no survivor reported the deadline"; }
done

# bench moe: runs, equals one process, rows per rank and RSS per rank
out=$(mpi 2 bench moe --moe-a2a-backend mpi --experts 9 --hidden 256 --inter 128 --topk 3 --tokens 1,8 --iters 3 \
      --format fp8 --threads 1 --json "$S/ep.json" 2>&1) || { echo "$out"; fail "bench moe np 2"; }
[ "$(grep -cE '^ +(1|8) .* same$' <<< "$out")" -eq 2 ] || { echo "$out"; fail "bench moe: outputs not the same as one process"; }
grep -q "^rank 1: experts 5..8" <<< "$out" || fail "bench moe: per-rank experts and RSS"
grep -q '"bench": "moe_ep"' "$S/ep.json" && grep -q '"rows_max"' "$S/ep.json" || fail "bench moe --json"

rm -rf "$S"
[ $fails -eq 0 ] && echo "PASS" || echo "$fails failure(s)"
[ $fails -eq 0 ]
