# serve.sh — sourced by the tests/cli/serve_*.sh scripts: start a `moerun
# serve` on a free loopback port (--port 0; the port is read from its first
# line), wait until it is ready, stop it, and check its log for sanitizer
# reports. Needs M (the moerun binary) and S (a scratch folder).

# serve_test_begin: the common start of a serve test script: a fresh scratch
# folder S, no MOERUN_* variable from the caller's environment (each test sets
# its own), one OpenMP thread, and the failure counter that bad MESSAGE bumps.
serve_test_begin() {
    rm -rf "$S"; mkdir -p "$S"
    local v
    for v in $(env | sed -n 's/^\(MOERUN_[A-Z_0-9]*\)=.*/\1/p'); do unset "$v"; done
    export OMP_NUM_THREADS=1
    fails=0
}
bad() { echo "FAIL: $*"; fails=$((fails+1)); }

# serve_test_end [LOG]: stop the server (it must exit 0 on SIGTERM), check its
# log (S/serve.log unless given) for sanitizer reports and crashes, and end the
# script: exit 1 after any failure, else remove S and print OK.
serve_test_end() {
    local log=${1:-$S/serve.log}
    stop_server
    [ "$SV_RC" = 0 ] || bad "the server exited $SV_RC on SIGTERM"
    clean_log "$log" || { bad "sanitizer report or crash in $(basename "$log")"; grep -A20 -E "ERROR|runtime error" "$log" | head -60; }
    [ $fails = 0 ] || exit 1
    rm -rf "$S"
    echo OK
    exit 0
}

# Every server started here is killed when the script exits, however it exits.
SV_ALL=
trap 'for p in $SV_ALL; do kill -KILL "$p" 2>/dev/null; done' EXIT

# start_server LOG ARGS...: sets SV_PID, SV_PORT, SV_URL. Returns 1 if the
# server exits before it is ready, or is not ready in SV_READY_S seconds (180 by
# default: a sanitizer build on a loaded 2-core host is slow); its log is printed,
# and for a server that is still running, where it waits (its threads' stacks).
start_server() {
    local log=$1; shift
    "$M" serve --port 0 "$@" >"$log" 2>&1 &
    SV_PID=$!
    SV_ALL="$SV_ALL $SV_PID"
    local limit=$(( $(now_ms) + ${SV_READY_S:-180} * 1000 ))
    while ! grep -q "ready on http" "$log" 2>/dev/null; do
        if ! kill -0 "$SV_PID" 2>/dev/null; then
            echo "FAIL: the server exited before it was ready:"; cat "$log"; return 1
        fi
        if [ "$(now_ms)" -gt "$limit" ]; then
            echo "FAIL: the server was not ready in ${SV_READY_S:-180} s; its log:"; cat "$log"
            df -h "$(dirname "$log")" | tail -1 | awk '{print "--- the log\x27s file system: " $4 " free of " $2}'
            server_stacks "$SV_PID"
            return 1
        fi
        sleep 0.05
    done
    SV_PORT=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$log" | head -1)
    SV_URL=http://127.0.0.1:$SV_PORT
}

# server_stacks PID: the process's state and every thread's stack (gdb), to
# tell a hang from a slow host
server_stacks() {
    echo "--- process $1: $(grep -E '^(State|Threads|VmRSS)' "/proc/$1/status" 2>/dev/null | tr -s '\t\n' '  ')"
    if command -v gdb >/dev/null; then
        timeout 60 gdb -p "$1" -batch -nx -ex 'thread apply all bt 20' 2>&1 | grep -E '^(Thread|#)' | head -150
    fi
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
