#!/usr/bin/env bash
# bench/moe-runs.sh TAG [F:M ...] — one repeat of the quick `bench moe` set
# behind bench/README.md's three-run tables: for each format:mode (default:
# every format and mode of the routed runner) a standard run at T = 1, 8, 32,
# 512 (5 iterations) and an isolation run at T = 1, 8, 32 (7 rounds), 2
# threads. JSON to $OUT/moe_<F>_<M>_<TAG>.json and _isolate_<TAG>.json; the
# result rows and the target lines to stdout. About 30 s per format:mode on a
# 2-core host. Set MOERUN_CPU_MASK=avx512 to time the AVX2 path on an AVX-512
# host. Environment: MOERUN (build/moerun), OUT (bench/results). Heavy: run it
# under `flock /tmp/moerun-heavy.lock`.
set -u
[ $# -ge 1 ] || { echo "usage: $0 TAG [F:M ...]" >&2; exit 2; }
M=${MOERUN:-build/moerun}
OUT=${OUT:-bench/results}
tag=$1; shift
[ -x "$M" ] || { echo "bench/moe-runs.sh: no moerun binary at $M (run make, or set MOERUN)" >&2; exit 2; }
[ $# -gt 0 ] || set -- fp8:w8a8 fp8:w8a16 nvfp4:w4a4 nvfp4:w4a8 nvfp4:w4a16 bf16:w16a16
mkdir -p "$OUT"
rc=0
for fm in "$@"; do
    F=${fm%%:*} A=${fm##*:}
    echo "=== $F $A $tag $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    "$M" bench moe --format "$F" --act-mode "$A" --tokens 1,8,32,512 --iters 5 --threads 2 \
        --json "$OUT/moe_${F}_${A}_$tag.json" >"$OUT/.moe-runs.$$" 2>&1 || rc=1
    grep -E '^\s+(1|8|32|512) |ceilings|decode T|prefill|kernels:|error' "$OUT/.moe-runs.$$"
    "$M" bench moe --format "$F" --act-mode "$A" --tokens 1,8,32 --iters 7 --threads 2 --isolate \
        --json "$OUT/moe_${F}_${A}_isolate_$tag.json" >"$OUT/.moe-runs.$$" 2>&1 || rc=1
    grep -E 'isolate \(|instruction probe in|error' "$OUT/.moe-runs.$$"
done
rm -f "$OUT/.moe-runs.$$"
exit $rc
