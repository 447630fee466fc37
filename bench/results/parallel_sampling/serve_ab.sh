#!/usr/bin/env bash
# serve_ab.sh OUT: old and new servers alternated on /tmp/bigv, top-p 0.95 T 1, C 16 and 64
OUT=$1; : > "$OUT"
for r in 1 2; do for b in /tmp/old/build/moerun /work/main/build/moerun; do
  port=$((31000 + RANDOM % 1000))
  $b serve --model /tmp/bigv --port $port --max-running-requests 64 --context-length 256 > /tmp/sp/serve.log 2>&1 &
  pid=$!
  for i in $(seq 1 300); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
  echo "== round $r $b $(date -u +%T)" >> "$OUT"
  for c in 16 64; do
    /work/main/build/moerun bench serve --base-url http://127.0.0.1:$port --concurrency $c --num-prompts 64 \
      --input-len 32 --output-len 32 --vocab 200064 --extra-request-body '{"temperature": 1, "top_p": 0.95}' >> "$OUT" 2>&1
  done
  kill -TERM $pid; wait $pid
done; done
