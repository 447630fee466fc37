#!/bin/bash
# moerun serve on real2-fp8-kjv with and without the prefix cache, sglang's generated-shared-prefix dataset
M=build/moerun; D=/work/ckpt/real2-fp8-kjv; R=bench/results/zen3_1207b
for round in 1 2; do
  for mode in cache nocache; do
    [ $round = 2 ] && mode=$([ $mode = cache ] && echo nocache || echo cache)
    extra=; [ $mode = nocache ] && extra=--disable-radix-cache
    $M serve --model $D --port 30140 --context-length 1024 --max-running-requests 16 --skip-self-check $extra >/tmp/gsv.log 2>&1 &
    pid=$!
    for i in $(seq 600); do curl -sf 127.0.0.1:30140/health >/dev/null && break; sleep 0.2; done
    $M bench serve --port 30140 --dataset-name generated-shared-prefix --gsp-num-groups 4 --gsp-prompts-per-group 8 \
      --gsp-system-prompt-len 512 --gsp-question-len 64 --gsp-output-len 32 --max-concurrency 1,16 --flush-cache \
      --seed $round --json $R/gsp_real2fp8_${mode}_r$round.json > $R/gsp_real2fp8_${mode}_r$round.txt 2>&1
    echo "round $round $mode: $(jq -c '[.results[] | {c: .max_concurrency, tok_s: (.output_throughput*10|round/10), ttft_p50: (.median_ttft_ms|round), e2e_p50: (.median_e2e_latency_ms|round), hits: .server_counters_delta.prefix_cache_hits, prompt: .server_counters_delta.prompt_tokens}]' $R/gsp_real2fp8_${mode}_r$round.json)"
    kill -TERM $pid; wait $pid
  done
done
