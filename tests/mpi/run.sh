#!/usr/bin/env bash
# run.sh — one expert-parallel test under mpirun (tests/CMakeLists.txt):
#   run.sh TEST_EP MOERUN NP MODE SCRATCH SRC
# MODE moe | mismatch: TEST_EP MODE under mpirun -np NP.
# MODE model: a checkpoint made here (gen-tiny bf16 with 9 experts, which no
# rank count here divides), the committed tiny model and the default model
# (models/tiny-kjv), each in bf16 and quantized here to fp8 and nvfp4, each
# compared one process against NP ranks by TEST_EP model, also with every rank
# on a copy that lacks the other ranks' experts; and the made checkpoint in each
# format with the weights of another seed loaded and swapped in on every rank,
# against one process on that checkpoint.
# SKIP (77) with the reason when mpirun is missing or moerun has no MPI.
set -u
TEST_EP=$1; B=$2; NP=$3; MODE=$4; S=$5; SRC=$6
skip() { echo "SKIP: $*"; exit 77; }
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
[ "$TEST_EP" != none ] && [ -x "$TEST_EP" ] || skip "this build has no MPI (install libopenmpi-dev and reconfigure)"
rm -rf "$S"; mkdir -p "$S"
# every rank one thread (2 cores in CI); --bind-to none: OpenMPI's default binding could pin a rank's
# threads to one core; no single-copy (CMA): containers often forbid process_vm_readv
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none
        -x OMP_NUM_THREADS=1 -x MOERUN_THREADS=1 -x LSAN_OPTIONS -x ASAN_OPTIONS -np "$NP")
export OMP_NUM_THREADS=1
# ASan builds: Open MPI's own allocations are not ours (tests/mpi/lsan.supp; the slow unwinder sees
# through its unloaded components)
export LSAN_OPTIONS="suppressions=$SRC/tests/mpi/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
case "$MODE" in
  moe)
    timeout 600 "${MPIRUN[@]}" "$TEST_EP" moe; rc=$? ;;
  model)
    "$B" gen-tiny "$S/bf16" --quant bf16 --seed 7 --layers 2 --experts 9 --top-k 3 >/dev/null || { echo "FAIL: gen-tiny"; exit 1; }
    dirs=("$S/bf16")
    srcs=("tiny=$SRC/tests/data/model/tiny" "kjv=$SRC/models/tiny-kjv")
    for sm in "${srcs[@]}"; do dirs+=("${sm#*=}"); done
    # every model in fp8 and nvfp4 too
    for q in fp8 nvfp4; do
      "$B" quantize "$S/bf16" "$S/$q" --to $q >/dev/null || { echo "FAIL: quantize $q"; exit 1; }
      dirs+=("$S/$q")
      for sm in "${srcs[@]}"; do
        "$B" quantize "${sm#*=}" "$S/${sm%%=*}-$q" --to $q >/dev/null || { echo "FAIL: quantize ${sm#*=} $q"; exit 1; }
        dirs+=("$S/${sm%%=*}-$q")
      done
    done
    # new weights on every rank: the made checkpoint's twin of another seed, in each format
    "$B" gen-tiny "$S/bf16-new" --quant bf16 --seed 8 --layers 2 --experts 9 --top-k 3 >/dev/null || { echo "FAIL: gen-tiny"; exit 1; }
    swaps=(--swap "$S/bf16" "$S/bf16-new")
    for q in fp8 nvfp4; do
      "$B" quantize "$S/bf16-new" "$S/$q-new" --to $q >/dev/null || { echo "FAIL: quantize new $q"; exit 1; }
      swaps+=(--swap "$S/$q" "$S/$q-new")
    done
    mkdir -p "$S/copies"
    timeout 600 "${MPIRUN[@]}" "$TEST_EP" model --local-copies "$S/copies" "${dirs[@]}" "${swaps[@]}" > "$S/log"; rc=$?
    cat "$S/log"
    n=$(grep -c "^model .*: new weights from .* swapped in on every rank" "$S/log"); [ "$n" -eq 3 ] || { echo "FAIL: $n of 3 weight swaps compared"; rc=1; }
    # every checkpoint compared, in one process and on the per-rank copies
    n=$(grep -c "^model .* runner auto: " "$S/log"); [ "$n" -eq ${#dirs[@]} ] || { echo "FAIL: $n of ${#dirs[@]} checkpoints compared"; rc=1; }
    n=$(grep -c "^model .*: each rank on a copy" "$S/log"); [ "$n" -eq ${#dirs[@]} ] || { echo "FAIL: $n of ${#dirs[@]} per-rank copies compared"; rc=1; } ;;
  mismatch)
    out=$(timeout 300 "${MPIRUN[@]}" "$TEST_EP" mismatch 2>&1); echo "$out"
    rc=0
    n=$(grep -c "MISMATCH REFUSED" <<< "$out"); [ "$n" -eq "$NP" ] || { echo "FAIL: $n of $NP ranks refused the mismatch"; rc=1; }
    n=$(grep -c "BROKEN STAYS BROKEN" <<< "$out"); [ "$n" -eq "$NP" ] || { echo "FAIL: $n of $NP ranks kept the group broken"; rc=1; } ;;
  *) echo "run.sh: unknown mode $MODE"; exit 2 ;;
esac
[ $rc -eq 124 ] && echo "FAIL: timed out (a hang)"
rm -rf "$S"
exit $rc
