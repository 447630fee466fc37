#!/usr/bin/env bash
# interrupt.sh — an interrupted gen-tiny (SIGINT, SIGTERM) leaves no
# DIR.tmp.* scratch folder and no DIR behind, and dies of the signal.
# The nvfp4 form holds two scratch folders at once (its bf16 source and the
# quantizer's output), so both are covered. The tool is signalled while a
# scratch folder exists; if it ever finishes first on a fast machine the
# case is reported as not exercised, and a larger one is tried.
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; S=$3
rm -rf "$S"; mkdir -p "$S"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
set -m # job control: a background job keeps SIGINT (otherwise bash makes it ignore it)

# run_and_signal SIG LAYERS NAME: starts gen-tiny, waits for its scratch
# folder, signals it. Prints "done" when it finished before the signal.
run_and_signal() {
  local sig=$1 layers=$2 name=$3
  "$M" gen-tiny "$S/$name" --quant nvfp4 --hidden 512 --layers "$layers" >/dev/null 2>&1 &
  local pid=$! i
  for i in $(seq 1 3000); do
    compgen -G "$S/$name.tmp.*" >/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
  done
  sleep 0.2 # well inside the work (writing / calibrating)
  kill -"$sig" $pid 2>/dev/null
  wait $pid
  local rc=$?
  if [ $rc -eq 0 ]; then echo done; return; fi
  [ $rc -gt 128 ] || fail "$sig: gen-tiny exited $rc, not by the signal"
  compgen -G "$S/$name.tmp.*" >/dev/null && { ls -la "$S"; fail "$sig: scratch folder left behind"; }
  [ -e "$S/$name" ] && fail "$sig: a partial $name was left"
  echo killed
}

for sig in INT TERM; do
  ok=
  for layers in 8 32 128; do
    r=$(run_and_signal $sig $layers "m_${sig}_$layers") || { echo "$r"; exit 1; }
    [ "$r" = killed ] && { ok=1; break; }
    rm -rf "$S/m_${sig}_$layers"
  done
  [ -n "$ok" ] || fail "$sig: gen-tiny always finished before the signal; case not exercised"
done
rm -rf "$S"
echo OK
