#!/usr/bin/env bash
# serve_keepalive.sh — requests back to back on kept-alive connections: 4 rounds
# of 2,500 short streaming requests at concurrency 128 from `moerun bench serve`
# (libcurl keeps each of its 128 connections open and sends the next request the
# moment a response ends). Every request must be read when it arrives: with
# libmicrohttpd 0.9.75's epoll loop, the next request on a connection was at times
# left unread in the socket until the header deadline closed the connection
# (10 s); curl then sent it again on a new connection, so the client saw every
# request succeed, 10 s late, while the server had run the first copy into a
# closed socket (an abort). Measured before the fix: 126-482 such requests in 3 of
# 5 rounds. Checks per round: zero failures, every token received, no request
# aborted on the server, the server's generated tokens equal the client's, and
# the slowest first token under 2 s (a healthy round here takes under a second).
# KA_SERVE_ARGS adds server options (e.g. --threads-http 2).
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
N=2500; C=128
. "$(dirname "$0")/lib/serve.sh"
serve_test_begin
cp -r "$DATA/model/tiny" "$S/tiny"
start_server "$S/serve.log" --model "$S/tiny" --context-length 64 --max-running-requests "$C" \
    --max-queued-requests $((C * 2)) --skip-self-check ${KA_SERVE_ARGS:-} || exit 1
slow_ms=2000
"$M" version 2>/dev/null | grep -q ASan && slow_ms=8000 # (the header deadline is 10 s)
for r in 1 2 3 4; do
    g0=$(metric 'moerun:generation_tokens_total{')
    "$M" bench serve --base-url "$SV_URL" --concurrency "$C" --num-prompts "$N" --input-len 8 --output-len 16 \
        --vocab 256 --no-warmup --timeout 60 --seed "$r" >"$S/bench$r.out" 2>&1 || bad "round $r: bench serve exited $?"
    g1=$(metric 'moerun:generation_tokens_total{')
    grep -q "^Failed requests: *0 *$" "$S/bench$r.out" || bad "round $r: failed requests"
    grep -q "^Total generated tokens: *$((N * 16)) *$" "$S/bench$r.out" || bad "round $r: the client did not receive $((N * 16)) tokens"
    grep -q "request_success_total (delta): *0 stop, $N length, 0 abort" "$S/bench$r.out" ||
        bad "round $r: the server ran requests the client did not get ($(grep 'request_success_total' "$S/bench$r.out" | sed 's/.*: *//'))"
    [ $((g1 - g0)) = $((N * 16)) ] || bad "round $r: the server generated $((g1 - g0)) tokens, the client received $((N * 16))"
    p99=$(sed -n 's/^P99 TTFT (ms): *\([0-9.]*\).*/\1/p' "$S/bench$r.out")
    awk -v p="${p99:-999999}" -v l="$slow_ms" 'BEGIN { exit !(p < l) }' || bad "round $r: P99 TTFT ${p99:-?} ms (limit $slow_ms ms)"
    echo "round $r: $(sed -n 's/^Output token throughput (tok\/s): *//p' "$S/bench$r.out" | tr -d ' ') tok/s, P99 TTFT ${p99:-?} ms"
done
serve_test_end
