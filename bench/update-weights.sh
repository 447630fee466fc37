#!/usr/bin/env bash
# update-weights.sh — what a weight update (/update_weights_from_disk) costs a serving server: its wall time
# with and without requests running, the requests served during it and their latency against before, and the
# process's memory before, at its peak (both weight sets resident) and after.
# Usage: [NP=N] bench/update-weights.sh MODEL_DIR [NEW_DIR (default: MODEL_DIR again)] [MOERUN (default: build/moerun)]
# NP=N: an expert-parallel server on N ranks (mpirun, --moe-a2a-backend mpi); the memory is the ranks' sum.
# Needs curl and jq. The request loop sends 8-token greedy /generate requests, one at a time.
set -u
MODEL=${1:?usage: [NP=N] bench/update-weights.sh MODEL_DIR [NEW_DIR] [MOERUN]}
NEW=${2:-$MODEL}
M=${3:-build/moerun}
NP=${NP:-1}
LOG=$(mktemp); REQS=$(mktemp)
trap 'kill $PID 2>/dev/null; rm -f "$LOG" "$REQS"' EXIT
if [ "$NP" -gt 1 ]; then
    mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS -np "$NP" \
        "$M" serve --model "$MODEL" --port 0 --context-length 2048 --moe-a2a-backend mpi >"$LOG" 2>&1 &
else
    "$M" serve --model "$MODEL" --port 0 --context-length 2048 >"$LOG" 2>&1 &
fi
PID=$!
until grep -q 'ready on' "$LOG"; do kill -0 $PID 2>/dev/null || { cat "$LOG"; exit 1; }; sleep 0.5; done
U=http://127.0.0.1:$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$LOG" | head -1)
PIDS=$PID; [ "$NP" -gt 1 ] && PIDS=$(pgrep -P "$PID" | tr '\n' ' ')
ms() { echo $(( $(date +%s%N) / 1000000 )); }
kib() { local p; for p in $PIDS; do awk -v k="$1" '$1 == k":" {print $2}' "/proc/$p/status"; done | awk '{s += $1} END {print s}'; }
update() { # update VERSION: prints the wall time in ms
    local t0; t0=$(ms)
    local r; r=$(curl -s "$U/update_weights_from_disk" -d "{\"model_path\":\"$NEW\",\"weight_version\":\"$1\"}")
    [ "$(echo "$r" | jq -r .success)" = true ] || { echo "update failed: $r" >&2; exit 1; }
    echo $(( $(ms) - t0 ))
}
echo "model $MODEL, new weights $NEW, $NP rank(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "RssAnon before: $(( $(kib RssAnon) / 1024 )) MiB"
echo "update, idle server: $(update v1) ms; RssAnon after: $(( $(kib RssAnon) / 1024 )) MiB"
loop() { # one request at a time: "start_ms latency_ms version" per line
    while :; do
        local t0; t0=$(ms)
        local v; v=$(curl -s "$U/generate" -d '{"input_ids":[5,6,7],"sampling_params":{"max_new_tokens":8,"temperature":0,"ignore_eos":true}}' |
                      jq -r .meta_info.weight_version)
        echo "$t0 $(( $(ms) - t0 )) $v"
    done
}
loop >"$REQS" &
LP=$!
sleep 5
t_up=$(ms)
w=$(update v2)
t_end=$(ms)
sleep 3
kill $LP; wait $LP 2>/dev/null
echo "update under a request loop: $w ms; peak RSS (VmHWM, the sum over ranks) $(( $(kib VmHWM) / 1024 )) MiB; RssAnon after: $(( $(kib RssAnon) / 1024 )) MiB"
stats() { sort -n | awk '{a[NR] = $1} END {if (NR) printf "n %d, p50 %d ms, max %d ms", NR, a[int((NR + 1) / 2)], a[NR]; else printf "n 0"}'; }
echo "requests before the update: $(awk -v t="$t_up" '$1 < t - 500 {print $2}' "$REQS" | stats)"
echo "requests started during it: $(awk -v a="$t_up" -v b="$t_end" '$1 >= a && $1 < b {print $2}' "$REQS" | stats)"
echo "versions answered: $(awk '{print $3}' "$REQS" | uniq -c | awk '{printf "%s x%d ", $2, $1}')"
