#!/usr/bin/env bash
# serve_soak.sh — a soak of `moerun serve`: N streaming requests (default
# 2000) at concurrency C (default 64) from `moerun bench serve`, after a
# warm-up of 4 x C requests, in four quarters of N/4 (each opens its C connections afresh, so threads and their
# memory come and go four times). Checks: zero failures; every output
# complete; the server's counters equal to what the client received; and the
# server's resident memory steady: the peak RSS sampled during the last
# quarter within 5% of the first quarter's (each quarter has the same ramp
# of connections, so like is compared with like; a mean would weigh the
# ramp by how fast the shared machine happened to run).
# SOAK_REQUESTS / SOAK_CONCURRENCY change the size (scripts/soak-serve.sh
# runs 10000 at 128).
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
N=${SOAK_REQUESTS:-2000}; C=${SOAK_CONCURRENCY:-64}
Q=$((N / 4))
. "$(dirname "$0")/lib/serve.sh"
serve_test_begin
cp -r "$DATA/model/tiny" "$S/tiny"
start_server "$S/serve.log" --model "$S/tiny" --context-length 64 --max-running-requests "$C" \
    --max-queued-requests $((C * 2)) --skip-self-check || exit 1
# warm-up, not measured: the process's first-touch memory (model pages,
# malloc arenas) comes in here rather than in the first quarter
"$M" bench serve --base-url "$SV_URL" --concurrency "$C" --num-prompts $((C * 4)) --input-len 8 --output-len 16 \
    --vocab 256 --no-warmup --timeout 300 >"$S/warm.out" 2>&1 || { bad "the warm-up failed"; cat "$S/warm.out"; }
g0=$(metric 'moerun:generation_tokens_total{')
for q in 1 2 3 4; do
    # RSS samples (kB) while this quarter runs
    ( while kill -0 "$SV_PID" 2>/dev/null; do
          while read -r k v _; do [ "$k" = VmRSS: ] && echo "$v"; done <"/proc/$SV_PID/status"
          sleep 0.02
      done ) >"$S/rss$q" 2>/dev/null &
    spid=$!
    "$M" bench serve --base-url "$SV_URL" --concurrency "$C" --num-prompts "$Q" --input-len 8 --output-len 16 \
        --vocab 256 --no-warmup --timeout 300 --seed $q >"$S/bench$q.out" 2>&1
    brc=$?
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    [ $brc = 0 ] || { bad "quarter $q: bench serve exited $brc"; grep -E "Failed|First failure" "$S/bench$q.out"; }
    grep -q "^Successful requests: *$Q *$" "$S/bench$q.out" || bad "quarter $q: not all $Q requests succeeded"
    grep -q "^Failed requests: *0 *$" "$S/bench$q.out" || bad "quarter $q: failed requests"
    grep -q "^Total generated tokens: *$((Q * 16)) *$" "$S/bench$q.out" || bad "quarter $q: the client did not receive $((Q * 16)) tokens"
    grep -q "request_success_total (delta): *0 stop, $Q length, 0 abort" "$S/bench$q.out" || bad "quarter $q: the server's finish reasons differ"
    echo "quarter $q: $(grep 'Output token throughput' "$S/bench$q.out" | awk '{print $NF}') tok/s, $(wc -l <"$S/rss$q") RSS samples, mean $(awk '{s+=$1} END {printf "%d", s/NR}' "$S/rss$q") kB, peak $(sort -n "$S/rss$q" | tail -1) kB"
done
g1=$(metric 'moerun:generation_tokens_total{')
[ $((g1 - g0)) = $((4 * Q * 16)) ] || bad "the server generated $((g1 - g0)) tokens, the clients received $((4 * Q * 16))"
asan=; "$M" version 2>/dev/null | grep -q ASan && asan=1
first=$(sort -n "$S/rss1" | tail -1)
last=$(sort -n "$S/rss4" | tail -1)
if [ -n "$asan" ]; then
    echo "RSS not judged under AddressSanitizer: its quarantine keeps freed memory resident (peaks $first -> $last kB)"
else
    awk -v a="$first" -v b="$last" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d <= 0.05) }' || \
        bad "peak RSS moved more than 5% from the first quarter to the last: $first kB -> $last kB"
fi
serve_test_end
