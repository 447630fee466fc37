#!/usr/bin/env bash
# serve_hostile.sh — `moerun serve` against hostile clients: malformed JSON,
# wrong types, invalid UTF-8, deep nesting, oversize bodies (declared and
# chunked), oversize headers, garbage request lines, a client that sends one
# byte a second (closed by --header-timeout), one that sends nothing (closed
# by --idle-timeout), clients that vanish mid-stream (their sequences are
# freed: /metrics), and 200 connections at once beyond the queue (503s
# counted by the server exactly, the rest complete, no crash, and the
# server's thread count stays flat: an event loop, not a thread per
# connection). Afterwards the server still answers, stops with exit 0 on
# SIGTERM, and its log holds no sanitizer report. This server runs two HTTP
# event loops (--threads-http 2). A second server: a non-streaming client
# that leaves while its long request waits for the engine has it cancelled
# (the watchdog sees the hang-up; the request would otherwise run for
# seconds).
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
. "$(dirname "$0")/lib/serve.sh"
serve_test_begin
cp -r "$DATA/model/tiny" "$S/tiny"

start_server "$S/serve.log" --model "$S/tiny" --context-length 512 --max-running-requests 2 \
    --max-queued-requests 4 --max-body-bytes 10000 --header-timeout 6 --idle-timeout 2 --threads-http 2 \
    --skip-self-check || exit 1

# post BODY_FILE WANT_STATUS WANT_PARAM(or -) : the error body names the field
post() {
    local body=$1 want=$2 param=$3 got
    got=$(curl -s -o "$S/resp" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$body" "$SV_URL/v1/completions")
    if [ "$got" != "$want" ]; then bad "$(head -c 80 "$body"): HTTP $got, want $want: $(head -c 300 "$S/resp")"; return; fi
    grep -q '"error":{"message":' "$S/resp" || bad "$(head -c 80 "$body"): no error body: $(head -c 300 "$S/resp")"
    if [ "$param" != - ] && ! grep -qF "\"param\":\"$param\"" "$S/resp"; then
        bad "$(head -c 80 "$body"): param is not $param: $(head -c 300 "$S/resp")"
    fi
}
b=$S/body
printf '{"prompt":[1,2,3],' >"$b"; post "$b" 400 -
printf '{"prompt":[1,2,3],"max_tokens":"many"}' >"$b"; post "$b" 400 max_tokens
printf '{"prompt":[1,2,3],"n":[1]}' >"$b"; post "$b" 400 n
printf '{"prompt":{"a":1}}' >"$b"; post "$b" 400 prompt
printf '{"prompt":[1,2,3],"stop_token_ids":[9999]}' >"$b"; post "$b" 400 'stop_token_ids[0]'
printf '{"prompt":[1,2,3],"temperature":1e999}' >"$b"; post "$b" 400 -
# a subnormal temperature is in [0, 2] and samples its limit, the largest logit: the tokens of
# temperature 0 (l / T once overflowed and every draw took token 0); the ids, as this model has no tokenizer
for t in 0 1e-45 1e-38; do
    curl -s -H 'Content-Type: application/json' -d "{\"prompt\":[1,2,3],\"max_tokens\":8,\"ignore_eos\":true,\"temperature\":$t}" \
        "$SV_URL/v1/completions" | jq -c '.choices[0].token_ids' >"$S/temp_$t"
done
[ -s "$S/temp_0" ] && cmp -s "$S/temp_0" "$S/temp_1e-45" && cmp -s "$S/temp_0" "$S/temp_1e-38" ||
    bad "temperature 1e-45 / 1e-38 gave other tokens than 0: $(cat "$S/temp_0" "$S/temp_1e-45" "$S/temp_1e-38")"
printf '{"prompt":"\xff\xfe"}' >"$b"; post "$b" 400 -
printf '{"prompt":[1,2],"user":"a\0b"}' >"$b"; post "$b" 400 -
printf '\x00\x01\x02garbage' >"$b"; post "$b" 400 -
printf 'null' >"$b"; post "$b" 400 -
: >"$b"; post "$b" 400 -
{ printf '{"prompt":[1],"logit_bias":'; head -c 100000 /dev/zero | tr '\0' '['; } >"$b"
post "$b" 413 -                                        # over --max-body-bytes, by Content-Length
{ printf '{"prompt":[1],"logit_bias":'; head -c 5000 /dev/zero | tr '\0' '['; } >"$b"
post "$b" 400 -                                        # deep nesting, under the size limit
# chunked upload over the limit (no Content-Length)
{ printf '{"prompt":[1],"user":"'; head -c 20000 /dev/zero | tr '\0' 'a'; printf '"}'; } >"$b"
got=$(curl -s -o "$S/resp" -w '%{http_code}' -H 'Transfer-Encoding: chunked' --data-binary @"$b" "$SV_URL/v1/completions")
[ "$got" = 413 ] || bad "chunked oversize body: HTTP $got, want 413"
# a compressed body: no body is decompressed, so a 415 that says so (not a JSON error about byte 0x1f)
printf '{"prompt":[1,2,3],"max_tokens":2}' | gzip -c >"$b"
got=$(curl -s -o "$S/resp" -w '%{http_code}' -H 'Content-Type: application/json' -H 'Content-Encoding: gzip' \
      --data-binary @"$b" "$SV_URL/v1/completions")
[ "$got" = 415 ] && grep -q '"type":"invalid_request_error"' "$S/resp" && grep -q "Content-Encoding 'gzip'" "$S/resp" ||
    bad "a gzip body: HTTP $got: $(head -c 300 "$S/resp")"
# a 100 KB header
got=$(curl -s -o /dev/null -w '%{http_code}' -H "X-Big: $(head -c 100000 /dev/zero | tr '\0' 'x')" "$SV_URL/health")
case "$got" in 4*|000) ;; *) bad "oversize header: HTTP $got, want a 4xx or a closed connection";; esac
# garbage and half requests on raw sockets
for junk in 'GARBAGE\r\n\r\n' 'GET / HTTP/9.9\r\n\r\n' 'POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n' \
            'POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{' '\x16\x03\x01\x02\x00\x01\x00'; do
    exec 3<>/dev/tcp/127.0.0.1/"$SV_PORT"
    printf "$junk" >&3 2>/dev/null
    timeout 5 cat <&3 >/dev/null 2>&1
    exec 3>&-
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$SV_URL/health")" = 200 ] || bad "the server does not answer after the junk"
# framing a proxy could read otherwise (RFC 9112 6.3): Content-Length values that differ are a 400, a
# Transfer-Encoding other than chunked a 501, both at once from the head (no wait for a body)
b='{"prompt":[1,2],"max_tokens":2}'
for case in "Content-Length: ${#b}\r\nContent-Length: 5|400" "Transfer-Encoding: gzip|501" \
            "Content-Length: ${#b}\r\nContent-Length: ${#b}|200"; do
    exec 3<>/dev/tcp/127.0.0.1/"$SV_PORT"
    printf "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n${case%|*}\r\n\r\n$b" >&3 2>/dev/null
    got=$(timeout 5 head -c 12 <&3)
    exec 3>&-
    [ "$got" = "HTTP/1.1 ${case#*|}" ] || bad "framing '${case%|*}': '$got', want ${case#*|}"
done

# closed_after SECONDS_MAX MODE: opens a connection; MODE slow sends one byte a
# second, MODE idle sends nothing. Prints the seconds until the server closed it.
closed_after() {
    local max=$1 mode=$2 t0 rc i
    exec 4<>/dev/tcp/127.0.0.1/"$SV_PORT"
    t0=$(now_ms)
    for i in $(seq 1 "$max"); do
        [ "$mode" = slow ] && { printf 'G' >&4 2>/dev/null || break; }
        read -r -t 1 -u 4 _; rc=$?
        [ $rc -gt 128 ] || break           # not a timeout: EOF (closed) or data
    done
    exec 4>&-
    echo $(( $(now_ms) - t0 ))
}
ms=$(closed_after 20 slow)
{ [ "$ms" -ge 5000 ] && [ "$ms" -le 12000 ]; } || bad "a one-byte-a-second client was closed after $ms ms (want the 6 s header timeout)"
ms=$(closed_after 20 idle)
{ [ "$ms" -ge 1000 ] && [ "$ms" -le 5000 ]; } || bad "a silent client was closed after $ms ms (want the 2 s idle timeout)"

# clients that vanish mid-stream: their sequences end and free their KV
pids=
for i in $(seq 1 6); do
    # each one leaves after its first streamed byte (head exits, curl's next write fails and it closes),
    # so the request has surely started, however slow the machine
    { curl -s -N --max-time 30 -d '{"prompt":[1,2,3],"max_tokens":400,"ignore_eos":true,"stream":true}' \
        "$SV_URL/v1/completions" 2>/dev/null | head -c 1 >/dev/null; } &
    pids="$pids $!"
done
wait $pids
freed=
for i in $(seq 1 200); do
    [ "$(metric 'moerun:num_requests_running{')" = 0 ] && [ "$(metric 'moerun:kv_cache_used_blocks{')" = 0 ] && \
        [ "$(metric 'moerun:num_requests_waiting{')" = 0 ] && { freed=1; break; }
    sleep 0.05
done
[ -n "$freed" ] || bad "vanished clients still hold sequences: $(curl -s "$SV_URL/metrics" | grep -E 'running|waiting|used_tokens' | grep -v '#')"
[ "$(metric 'moerun:client_disconnects_total{')" -ge 1 ] 2>/dev/null || bad "no disconnect counted"

# 200 connections at once, beyond 2 running + 4 queued
rej0=$(metric 'reason="queue_full"')
mkdir -p "$S/many"
# the server's threads while the 200 are open (a thread per connection would be ~200)
( mx=0; while kill -0 "$SV_PID" 2>/dev/null && [ ! -f "$S/many/stop" ]; do
      n=$(ls "/proc/$SV_PID/task" 2>/dev/null | wc -l); [ "$n" -gt $mx ] && mx=$n; echo $mx >"$S/many/threads"; sleep 0.02
  done ) &
tpid=$!
pids=
for i in $(seq 1 200); do
    curl -s -N -o "$S/many/$i.out" -w '%{http_code}\n' --max-time 120 \
        -d '{"prompt":[4,5,6],"max_tokens":24,"ignore_eos":true,"stream":true}' "$SV_URL/v1/completions" \
        >"$S/many/$i.code" 2>/dev/null &
    pids="$pids $!"
done
wait $pids
touch "$S/many/stop"; wait $tpid
threads=$(cat "$S/many/threads" 2>/dev/null || echo 0)
echo "200 at once: at most $threads server threads"
{ [ "$threads" -ge 3 ] && [ "$threads" -le 16 ]; } || bad "200 connections: the server ran $threads threads (want an event loop: <= 16)"
ok=0; busy=0; other=0
for i in $(seq 1 200); do
    c=$(cat "$S/many/$i.code")
    case "$c" in
        200) if grep -q '^data: \[DONE\]' "$S/many/$i.out" && [ "$(grep -c '"token_ids"' "$S/many/$i.out")" = 24 ]; then ok=$((ok+1)); else other=$((other+1)); fi ;;
        503) grep -q '"type":"unavailable_error"' "$S/many/$i.out" && busy=$((busy+1)) || other=$((other+1)) ;;
        *) other=$((other+1)) ;;
    esac
done
echo "200 at once: $ok completed, $busy refused with 503, $other other"
[ $other = 0 ] || bad "200 connections: $other answers were neither a complete stream nor a 503"
[ $busy -ge 1 ] || bad "200 connections: no 503 beyond the queue"
[ $ok -ge 6 ] || bad "200 connections: only $ok completed"
rej1=$(metric 'reason="queue_full"')
[ $((rej1 - rej0)) = $busy ] || bad "the server counted $((rej1 - rej0)) queue-full refusals, the clients saw $busy"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$SV_URL/health")" = 200 ] || bad "the server does not answer after the flood"

stop_server
[ "$SV_RC" = 0 ] || bad "the server exited $SV_RC on SIGTERM"
clean_log "$S/serve.log" || { bad "sanitizer report or crash in the server log"; grep -E -A20 "ERROR|runtime error" "$S/serve.log" | head -60; }

# a non-streaming client leaves while its request waits: 64 choices x 4000 tokens at 2 running
# sequences are 128,000 engine steps (seconds on any host); it must end within seconds of the hang-up
start_server "$S/serve2.log" --model "$S/tiny" --context-length 4096 --max-running-requests 2 \
    --max-queued-requests 64 --skip-self-check || exit 1
ab0=$(metric 'finished_reason="abort"'); ab0=${ab0:-0}
ln0=$(metric 'finished_reason="length"'); ln0=${ln0:-0}
curl -s -o /dev/null --max-time 1 -d '{"prompt":[1,2,3],"max_tokens":4000,"n":64,"ignore_eos":true}' \
    "$SV_URL/v1/completions" 2>/dev/null
t0=$(now_ms); freed=
for i in $(seq 1 200); do
    [ "$(metric 'moerun:num_requests_running{')" = 0 ] && [ "$(metric 'moerun:num_requests_waiting{')" = 0 ] && \
        [ "$(metric 'moerun:kv_cache_used_blocks{')" = 0 ] && { freed=1; break; }
    sleep 0.05
done
ms=$(( $(now_ms) - t0 ))
for i in $(seq 1 40); do # the finish counters, once they account for all 64 (or after 2 s)
    ab1=$(metric 'finished_reason="abort"'); ln1=$(metric 'finished_reason="length"')
    [ $((ab1 - ab0 + ln1 - ln0)) -ge 64 ] && break
    sleep 0.05
done
gen=$(metric 'moerun:generation_tokens_total{')
echo "non-streaming client gone: freed after $ms ms, $((ab1 - ab0)) choices aborted, $((ln1 - ln0)) finished before, $gen tokens generated"
[ -n "$freed" ] || bad "a gone non-streaming client's request still runs: $(curl -s "$SV_URL/metrics" | grep -E 'running|waiting|used_blocks' | grep -v '#')"
# every choice that had not finished when the client left is aborted: a fast host finishes
# a few of the 4000-token choices within the client's second (2 run at a time), no more
[ $((ab1 - ab0 + ln1 - ln0)) = 64 ] || bad "the gone client's 64 choices: $((ab1 - ab0)) aborted, $((ln1 - ln0)) finished"
[ $((ab1 - ab0)) -ge 56 ] || bad "the gone client's choices were not aborted: only $((ab1 - ab0)) of 64"
[ "${gen:-0}" -lt 256000 ] || bad "the gone client's request ran to the end ($gen tokens)"
[ "$(metric 'moerun:client_disconnects_total{')" -ge 1 ] 2>/dev/null || bad "no disconnect counted"
stop_server
[ "$SV_RC" = 0 ] || bad "the second server exited $SV_RC on SIGTERM"
clean_log "$S/serve2.log" || bad "sanitizer report or crash in the second server's log"

# a client that reads a large non-streamed answer (~6.8 MB, beyond what the sockets buffer) slowly but
# steadily is not idle: it gets every byte, though the reading takes several --idle-timeout; one that
# stops reading is closed
start_server "$S/serve3.log" --model "$S/tiny" --context-length 2048 --idle-timeout 1 --skip-self-check || exit 1
python3 - "$SV_PORT" >"$S/slowread.txt" 2>&1 <<'PY' || bad "slow steady reader: $(cat "$S/slowread.txt")"
import json, re, socket, sys, time
body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 1500, "n": 8, "ignore_eos": True, "logprobs": 20,
                   "temperature": 0}).encode()
def fetch(rate, stall):
    # the answer comes whole after ~12,000 tokens: minutes under a sanitizer on a loaded host
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=300)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    got, t0, cl, hl = b"", time.time(), None, 0
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += d
        if cl is None and b"\r\n\r\n" in got:
            cl, hl = int(re.search(rb"Content-Length: (\d+)", got).group(1)), got.index(b"\r\n\r\n") + 4
            if stall:
                time.sleep(stall)
        time.sleep(len(d) / rate)
    return cl, len(got) - hl, time.time() - t0
cl, n, t = fetch(1.5e6, 0)
print("steady reader: %d of %s bytes in %.1f s" % (n, cl, t))
assert cl and cl > 5e6 and n == cl and t > 3, "cut off or too fast to tell"
cl, n, t = fetch(1e9, 4)
print("stalled reader: %d of %s bytes" % (n, cl))
assert n < cl, "a reader that stalled 4 s past a 1 s idle timeout got everything"
PY
cat "$S/slowread.txt"
serve_test_end "$S/serve3.log"
