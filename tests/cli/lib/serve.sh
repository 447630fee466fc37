# serve.sh — sourced by the tests/cli/serve_*.sh scripts: start a `moerun
# serve` on a free loopback port (--port 0; the port is read from its first
# line), wait until it is ready, stop it, and check its log for sanitizer
# reports. Needs M (the moerun binary) and S (a scratch folder).

# Every server started here is killed when the script exits, however it exits.
SV_ALL=
trap 'for p in $SV_ALL; do kill -KILL "$p" 2>/dev/null; done' EXIT

# start_server LOG ARGS...: sets SV_PID, SV_PORT, SV_URL. Returns 1 if the
# server exits before it is ready (its log is printed).
start_server() {
    local log=$1; shift
    "$M" serve --port 0 "$@" >"$log" 2>&1 &
    SV_PID=$!
    SV_ALL="$SV_ALL $SV_PID"
    local i
    for i in $(seq 1 1200); do
        grep -q "ready on http" "$log" 2>/dev/null && break
        if ! kill -0 "$SV_PID" 2>/dev/null; then
            echo "FAIL: the server exited before it was ready:"; cat "$log"; return 1
        fi
        sleep 0.05
    done
    grep -q "ready on http" "$log" || { echo "FAIL: the server was not ready in 60 s"; cat "$log"; return 1; }
    SV_PORT=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$log" | head -1)
    SV_URL=http://127.0.0.1:$SV_PORT
}

# stop_server: SIGTERM, wait; the exit status goes to SV_RC (call it in this
# shell, not in $(...): the server is this shell's child).
stop_server() {
    kill -TERM "$SV_PID" 2>/dev/null
    wait "$SV_PID"
    SV_RC=$?
}

# clean_log LOG: no sanitizer report and no crash in it.
clean_log() {
    ! grep -qE "ERROR: AddressSanitizer|runtime error:|LeakSanitizer|Segmentation|Aborted" "$1"
}

# metric NAME: the value of the first series whose text starts with NAME.
metric() {
    curl -s "$SV_URL/metrics" | grep -F "$1" | grep -v '^#' | head -1 | awk '{print $NF}'
}

# now_ms: a monotonic clock in milliseconds (/proc/uptime, 10 ms steps), for
# the elapsed times the tests check: `date` is the wall clock, which a VM's time
# sync can step by seconds in the middle of a measurement
now_ms() {
    awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime
}
