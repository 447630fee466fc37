#!/bin/bash
# moerun serve on real2-fp8-kjv; bench serve with shared prefixes against the same prompt length without
set -u
B=/work/main/build/moerun
LOG=/tmp/gsp_serve.log
$B serve --model /work/ckpt/real2-fp8-kjv --port 0 --skip-self-check > $LOG 2>&1 &
SP=$!
for i in $(seq 120); do grep -q 'ready on' $LOG && break; sleep 1; done
URL=$(grep -o 'http://127.0.0.1:[0-9]*' $LOG | head -1)
echo "server $URL"
for r in 1 2; do
  $B bench serve --base-url $URL --concurrency 16 --num-prompts 64 --input-len 32 --output-len 32 --vocab 8192 \
     --gsp-system-prompt-len 512 --gsp-num-groups 4 --flush-cache --json /tmp/gsp_on_$r.json > /tmp/gsp_on_$r.txt 2>&1
  $B bench serve --base-url $URL --concurrency 16 --num-prompts 64 --input-len 544 --output-len 32 --vocab 8192 \
     --flush-cache --json /tmp/gsp_off_$r.json > /tmp/gsp_off_$r.txt 2>&1
done
kill -TERM $SP; wait $SP
for f in /tmp/gsp_on_1 /tmp/gsp_off_1 /tmp/gsp_on_2 /tmp/gsp_off_2; do
  echo "== $f"; grep -E 'Benchmark duration|Output token throughput|Median TTFT|P99 TTFT|Median ITL|Total input|prefix cache hits|Failed' $f.txt
done
