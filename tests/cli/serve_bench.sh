#!/usr/bin/env bash
# serve_bench.sh — `moerun bench serve` against a running `moerun serve`:
# the sglang-style table per concurrency, the server's counters, the sweep
# summary, --json (every number; counts equal to what was asked), --plot (a
# PNG from gnuplot), --request-rate (the run lasts until the seeded schedule's
# last arrival), --random-range-ratio (drawn lengths, counted as the server
# counts them), --gsp-* (shared prefixes: the server's prefix-cache hits); failures are counted, not fatal (a server that refuses
# with 503 gives failed requests and exit 1); bad options are exit 2, an
# unreachable server exit 1; a hostile server (tests/cli/lib/hostile_server.py:
# endless bodies and lines, garbage, impossible usage counts) gives exit 1 with
# the reason named. Timings are not judged here, only consistency (TTFT <= E2E,
# measured concurrency <= C).
# Args: <moerun> <tests/data> <scratch dir>
set -u
M=$1; DATA=$2; S=$3
. "$(dirname "$0")/lib/serve.sh"
serve_test_begin
command -v jq >/dev/null || { echo "SKIPPED: jq is not installed (scripts/install-deps.sh installs it)"; exit 77; }
cp -r "$DATA/model/tiny" "$S/tiny"
start_server "$S/serve.log" --model "$S/tiny" --context-length 128 --skip-self-check || exit 1
"$M" bench serve --base-url "$SV_URL" --concurrency 1,4 --num-prompts 8 --input-len 8 --output-len 8 --vocab 256 \
    --json "$S/r.json" --plot "$S/r.png" >"$S/out" 2>&1
rc=$?
[ $rc = 0 ] || { bad "bench serve exited $rc"; cat "$S/out"; }
for k in "Serving Benchmark Result" "Successful requests:" "Output token throughput (tok/s):" "Median TTFT (ms):" \
         "P99 ITL (ms):" "Mean TPOT (ms):" "Median E2E Latency (ms):" "generation_tokens_total (delta):" "sweep:" \
         "engine steps (delta), mean step:" "step time forward / sample / other:"; do
    grep -qF "$k" "$S/out" || bad "the output lacks '$k'"
done
[ "$(grep -c 'Serving Benchmark Result' "$S/out")" = 2 ] || bad "not one table per concurrency"
jq -e '.results | length == 2' "$S/r.json" >/dev/null || bad "--json: not 2 results"
jq -e 'all(.results[]; .completed == 8 and .failed == 0 and .total_output_tokens == 64 and .total_input_tokens == 64
        and .server_counters_delta.generation_tokens == 64 and .server_counters_delta.success_length == 8
        and .server_counters_delta.engine_steps >= 8 and .server_counters_delta.engine_steps <= 64
        and .server_counters_delta.engine_forward_s > 0 and .server_counters_delta.engine_sample_s > 0
        and .mean_ttft_ms <= .mean_e2e_latency_ms and .concurrency <= .max_concurrency + 0.01
        and .output_throughput > 0 and .median_itl_ms >= 0)' "$S/r.json" >/dev/null || \
    { bad "--json numbers are not consistent"; jq . "$S/r.json" | head -60; }
jq -e '[.results[].max_concurrency] == [1, 4]' "$S/r.json" >/dev/null || bad "--json concurrencies"
[ "$(head -c 8 "$S/r.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || bad "--plot did not write a PNG"
ls "$S"/*.tmp 2>/dev/null && bad "a temporary file was left"
# without --vocab the random ids cover the model's vocabulary, as sglang's and vLLM's do: the server says it
# (/get_model_info vocab_size; this model has no tokenizer: its 256 ids); every request is taken
"$M" bench serve --base-url "$SV_URL" --concurrency 2 --num-prompts 4 --input-len 8 --output-len 2 --json "$S/v.json" \
    >"$S/outv" 2>&1 || bad "no --vocab: exit $?: $(tail -3 "$S/outv")"
grep -q "random prompts: token ids in \[10, 256), the server's vocab_size" "$S/outv" || bad "no --vocab: $(grep 'random prompts' "$S/outv")"
jq -e '.results[0].completed == 4 and .results[0].failed == 0' "$S/v.json" >/dev/null || bad "no --vocab: $(jq -c '.results[0] | {completed, failed}' "$S/v.json")"
# --base-url as users write it: an OpenAI client's (ending /v1), trailing slashes, HOST:PORT alone, all the
# server's root (its counters read); what cannot be one is exit 2, named
for u in "$SV_URL/v1" "$SV_URL//" "$SV_URL/v1/" "${SV_URL#http://}"; do
    "$M" bench serve --base-url "$u" --concurrency 1 --num-prompts 2 --input-len 4 --output-len 2 --vocab 256 \
        --json "$S/u.json" >"$S/outu" 2>&1 || bad "--base-url $u: exit $?: $(tail -2 "$S/outu")"
    jq -e --arg r "$SV_URL" '.base_url == $r and .results[0].server_counters_delta.generation_tokens == 4' \
        "$S/u.json" >/dev/null || bad "--base-url $u: not the root, or its counters not read: $(jq -c .base_url "$S/u.json")"
    case "$u" in */v1*) grep -q "is taken as the server's root" "$S/outu" || bad "--base-url $u: the change is not said";; esac
done
for u in "ftp://127.0.0.1:1" "$SV_URL?a=1" "$SV_URL#x" "http://a b" "http://$(head -c 2000 /dev/zero | tr '\0' a)"; do
    "$M" bench serve --base-url "$u" --concurrency 1 >/dev/null 2>"$S/err"; rc=$?
    [ $rc = 2 ] && grep -q -- "--base-url" "$S/err" || bad "--base-url '${u:0:40}': exit $rc, want 2 ($(head -c 200 "$S/err"))"
done
# --extra-request-body: merged into every request, its keys replacing the bench's own (max_tokens here: the
# server's counters say 3 tokens a request); a field the server refuses gives failed requests, exit 1
echo '{"max_tokens": 3, "stop_token_ids": [1]}' >"$S/extra.json"
"$M" bench serve --base-url "$SV_URL" --concurrency 2 --num-prompts 4 --input-len 8 --output-len 8 --vocab 256 \
    --extra-request-body @"$S/extra.json" --json "$S/x.json" >"$S/outx" 2>&1; rc=$?
[ $rc = 0 ] || { bad "--extra-request-body: exit $rc"; tail -3 "$S/outx"; }
jq -e '.results[0].server_counters_delta.generation_tokens <= 12 and .results[0].completed == 4
       and .extra_request_body.max_tokens == 3' "$S/x.json" >/dev/null || bad "--extra-request-body was not sent as asked"
# vLLM's `vllm bench serve` command line: --endpoint, --ignore-eos, --save-result into a --result-dir it makes
# (vLLM's file name: backend, rate, concurrency, model, date), --save-detailed, --percentile-metrics and
# --metric-percentiles (against numpy's linear percentile of the saved TTFTs and ITLs, computed here), --goodput
# (the saved TTFTs within the SLO over the duration), --burstiness with --request-rate, --metadata
"$M" bench serve --backend vllm --base-url "$SV_URL" --endpoint /v1/completions --dataset-name random \
    --random-input-len 8 --random-output-len 6 --num-prompts 12 --max-concurrency 3 --request-rate 300 --burstiness 0.5 \
    --percentile-metrics ttft,itl,e2el --metric-percentiles 25,90,99.5 --goodput ttft:4 e2el:100000 --ignore-eos \
    --vocab 256 --save-result --result-dir "$S/vres" --save-detailed --metadata host=ci run=1 --num-warmups 2 \
    >"$S/outv" 2>&1 || bad "vLLM's flags: exit $?: $(tail -3 "$S/outv")"
vf=$(ls "$S"/vres/vllm-300qps-concurrency3-tiny-*.json 2>/dev/null | head -1)
[ -n "$vf" ] || bad "vLLM's flags: no result named as vLLM names it in $S/vres: $(ls "$S/vres" 2>&1)"
grep -q "P99.5 ITL (ms):" "$S/outv" && grep -q "P25 E2EL (ms):" "$S/outv" && grep -q "Request goodput (req/s):" "$S/outv" &&
    ! grep -q "P90 TPOT (ms):" "$S/outv" || bad "vLLM's flags: the table's percentile or goodput lines"
[ -n "$vf" ] && python3 - "$vf" <<'EOF2' || bad "vLLM's flags: the saved result is not what was asked"
import json, math, sys
d = json.load(open(sys.argv[1]))
r = d["results"][0]
def pct(v, q):  # numpy.percentile, linear (its documented definition)
    v = sorted(v)
    pos = q / 100 * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)
ttft = [t * 1e3 for t in r["ttfts"]]
itl = [g * 1e3 for gaps in r["itls"] for g in gaps]
ok = r["completed"] == 12 and len(ttft) == 12 and r["burstiness"] == 0.5 and d["metadata"] == {"host": "ci", "run": "1"}
for q, name in ((25, "25"), (90, "90"), (99.5, "99.5")):
    ok &= abs(r[f"p{name}_ttft_ms"] - pct(ttft, q)) < 1e-6 and abs(r[f"p{name}_itl_ms"] - pct(itl, q)) < 1e-6
    ok &= f"p{name}_e2el_ms" in r and f"p{name}_tpot_ms" not in r
ok &= r["p25_e2el_ms"] <= r["p90_e2el_ms"] <= r["p99.5_e2el_ms"] and abs(r["median_e2el_ms"] - r["median_e2e_latency_ms"]) < 1e-9
good = sum(t <= 4 for t in ttft)
ok &= abs(r["request_goodput"] * r["duration"] - good) < 1e-6
if not ok:
    print(json.dumps({k: v for k, v in r.items() if k not in ("generated_texts", "itls")})[:2000], good)
sys.exit(0 if ok else 1)
EOF2
# sglang's native /generate on moerun serve: every request completes with its tokens (the server's counters)
"$M" bench serve --base-url "$SV_URL" --backend sglang --concurrency 3 --num-prompts 6 --input-len 8 --output-len 5 \
    --vocab 256 --return-logprob --json "$S/gen.json" >"$S/outgen" 2>&1 || bad "--backend sglang: exit $?: $(tail -3 "$S/outgen")"
jq -e '.backend == "sglang" and (.results[0] | .completed == 6 and .total_output_tokens == 30 and
       .server_counters_delta.generation_tokens == 30 and .server_counters_delta.prompt_tokens == 48)' "$S/gen.json" >/dev/null ||
    bad "--backend sglang: $(jq -c '[.backend, .results[0].completed, .results[0].total_output_tokens, .results[0].server_counters_delta.generation_tokens]' "$S/gen.json")"
# --disable-stream: one JSON answer a request (completions, and /generate), counted from its usage; TTFT is
# the latency, and there is no ITL
for be in sglang-oai sglang; do
    "$M" bench serve --base-url "$SV_URL" --backend $be --disable-stream --concurrency 2 --num-prompts 4 --input-len 8 \
        --output-len 6 --vocab 256 --json "$S/ns.json" >"$S/outns" 2>&1 || bad "--disable-stream $be: exit $?: $(tail -3 "$S/outns")"
    jq -e '.results[0] | .completed == 4 and .total_output_tokens == 24 and .server_counters_delta.generation_tokens == 24
           and .stream == false and (.mean_ttft_ms - .mean_e2e_latency_ms | fabs) < 0.001 and .mean_itl_ms == 0' \
        "$S/ns.json" >/dev/null || bad "--disable-stream $be: $(jq -c '.results[0] | [.completed, .total_output_tokens,
        .mean_ttft_ms, .mean_e2e_latency_ms, .mean_itl_ms]' "$S/ns.json")"
done
# n choices a request: its usage counts them all, within max_tokens x n (not a failure)
"$M" bench serve --base-url "$SV_URL" --concurrency 2 --num-prompts 2 --input-len 8 --output-len 8 --vocab 256 \
    --extra-request-body '{"n": 2}' --json "$S/n2.json" >"$S/outn" 2>&1 || bad "n 2: $(tail -3 "$S/outn")"
jq -e '.results[0] | .completed == 2 and .total_output_tokens == 32' "$S/n2.json" >/dev/null ||
    bad "n 2: not 2 x 2 x 8 tokens: $(jq -c '.results[0] | [.completed, .total_output_tokens, .first_error]' "$S/n2.json")"
"$M" bench serve --base-url "$SV_URL" --concurrency 1 --num-prompts 2 --input-len 8 --output-len 8 --vocab 256 \
    --extra-request-body '{"temperature": 7}' >"$S/outy" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "warm-up request failed: HTTP 400" "$S/outy" || bad "a refused extra field: exit $rc, $(tail -3 "$S/outy")"
# --flush-cache: the same prompts (same seed) again hit the prefix cache, unless it was flushed before the run
for f in "" "" --flush-cache; do
    "$M" bench serve --base-url "$SV_URL" --concurrency 1 --num-prompts 2 --input-len 40 --output-len 4 --vocab 256 \
        --seed 77 --no-warmup $f --json "$S/f.json" >"$S/outf" 2>&1 || { bad "bench serve $f: $(tail -2 "$S/outf")"; break; }
    hits="${hits:-}$(jq '.results[0].server_counters_delta.prefix_cache_hits' "$S/f.json") "
done
set -- $hits
[ "$2" -ge 64 ] && [ "$3" = 0 ] || bad "--flush-cache: prefix-cache hits of three runs of the same prompts: $hits"
# --profile: each concurrency's run as the server's trace of its steps, written whole: the run's prompt tokens
# (the cache flushed before it) in the prefill slices and its tokens but each request's last in the decode ones
"$M" bench serve --base-url "$SV_URL" --concurrency 1,2 --num-prompts 2 --input-len 8 --output-len 4 --vocab 256 \
    --flush-cache --profile --profile-dir "$S/prof" >"$S/outp" 2>&1 || bad "--profile: $(tail -2 "$S/outp")"
for c in 1 2; do
    jq -e '[.traceEvents[] | select(.name == "step") | .args] | (map(.prefill_tokens) | add) == 16 and
           (map(.decode_tokens) | add) == 6' "$S/prof/moerun-trace-c$c.json" >/dev/null ||
        bad "--profile c$c: $(head -c 300 "$S/prof/moerun-trace-c$c.json" 2>&1)"
done
"$M" bench serve --base-url "$SV_URL" --num-prompts 2 --profile-dir "$S/prof" >"$S/outp2" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- "--profile-dir says where --profile" "$S/outp2" || bad "--profile-dir alone: exit $rc"
# --request-rate: a Poisson arrival schedule (seeded; its last arrival in the JSON): the run lasts at least
# until then, which all-at-once would not (6 short requests take a few ms here)
"$M" bench serve --base-url "$SV_URL" --concurrency 6 --num-prompts 6 --input-len 8 --output-len 4 --vocab 256 \
    --request-rate 5 --json "$S/rate.json" >"$S/outr" 2>&1 || bad "--request-rate: $(tail -2 "$S/outr")"
jq -e '.results[0] | .request_rate == 5 and .last_arrival_s > 0.2 and .duration >= .last_arrival_s
       and .completed == 6' "$S/rate.json" >/dev/null || { bad "--request-rate: the schedule was not kept"; jq -c '.results[0]' "$S/rate.json"; }
grep -q "Traffic request rate: *5.00" "$S/outr" || bad "--request-rate: the table does not show the rate"
# --random-range-ratio: lengths drawn per request, counted as sent: the totals are the server's own counts, inside
# [N x floor(L / 2), N x L] and not the fixed N x L
"$M" bench serve --base-url "$SV_URL" --concurrency 4 --num-prompts 8 --input-len 16 --output-len 8 --vocab 256 \
    --random-range-ratio 0.5 --json "$S/rr.json" >"$S/outrr" 2>&1 || bad "--random-range-ratio: $(tail -2 "$S/outrr")"
jq -e '.results[0] | .random_range_ratio == 0.5 and .completed == 8
       and .total_input_tokens == .server_counters_delta.prompt_tokens
       and .total_output_tokens == .server_counters_delta.generation_tokens
       and .total_input_tokens >= 64 and .total_input_tokens < 128
       and .total_output_tokens >= 32 and .total_output_tokens < 64' "$S/rr.json" >/dev/null ||
    { bad "--random-range-ratio: the lengths or their counts"; jq -c '.results[0]' "$S/rr.json"; }
# --gsp-*: sglang's generated-shared-prefix prompts: 2 groups of a 64-token prefix before 8 tokens each, one at a
# time after a flush: every request after the first of its group finds its group's 64 tokens in the server's
# prefix cache (4 blocks of 16), so the server counts (8 - 2) x 64 hits
"$M" bench serve --base-url "$SV_URL" --concurrency 1 --num-prompts 8 --input-len 8 --output-len 4 --vocab 256 \
    --gsp-system-prompt-len 64 --gsp-num-groups 2 --flush-cache --json "$S/gsp.json" >"$S/outg" 2>&1 ||
    bad "--gsp-*: $(tail -2 "$S/outg")"
jq -e '.results[0] | .total_input_tokens == 576 and .server_counters_delta.prompt_tokens == 576
       and .server_counters_delta.prefix_cache_hits == 384 and .gsp_num_groups == 2' "$S/gsp.json" >/dev/null ||
    { bad "--gsp-*: the shared prefixes"; jq -c '.results[0]' "$S/gsp.json"; }
# the warm-up request carries no group's prefix: without a flush (new prefixes from another seed), still 384
"$M" bench serve --base-url "$SV_URL" --concurrency 1 --num-prompts 8 --input-len 8 --output-len 4 --vocab 256 \
    --gsp-system-prompt-len 64 --gsp-num-groups 2 --seed 99 --json "$S/gsp2.json" >"$S/outg2" 2>&1 ||
    bad "--gsp-* --seed 99: $(tail -2 "$S/outg2")"
jq -e '.results[0].server_counters_delta.prefix_cache_hits == 384' "$S/gsp2.json" >/dev/null ||
    bad "--gsp-*: the warm-up warmed a group: $(jq -c '.results[0].server_counters_delta' "$S/gsp2.json")"
# sglang's --dataset-name generated-shared-prefix: groups x prompts-per-group requests, the same 2 x 4 prompts of
# 64 + 8 tokens, one at a time: the same 384 hits whatever the (shuffled) order
"$M" bench serve --base-url "$SV_URL" --concurrency 1 --dataset-name generated-shared-prefix --gsp-num-groups 2 \
    --gsp-prompts-per-group 4 --gsp-system-prompt-len 64 --gsp-question-len 8 --gsp-output-len 4 --vocab 256 \
    --flush-cache --json "$S/gspd.json" >"$S/outgd" 2>&1 || bad "--dataset-name generated-shared-prefix: $(tail -2 "$S/outgd")"
jq -e '[.results[] | .num_prompts == 8 and .total_input_tokens == 576 and .total_output_tokens == 32 and
        .server_counters_delta.prefix_cache_hits == 384 and .dataset_name == "generated-shared-prefix" and
        .gsp_prompts_per_group == 4] == [true]' "$S/gspd.json" >/dev/null ||
    { bad "--dataset-name generated-shared-prefix: the requests"; jq -c '.results[] | [.num_prompts, .server_counters_delta]' "$S/gspd.json"; }
# --output-details (sglang's): each request's lengths, TTFT, ITLs, text and error, in request order; its tokens
# are the server's count, one ITL between each two of them (a token an event), no error
"$M" bench serve --base-url "$SV_URL" --concurrency 3 --num-prompts 6 --input-len 8 --output-len 5 --vocab 256 \
    --output-details --disable-tqdm --output-file "$S/det.jsonl" --json "$S/det.json" >"$S/outd" 2>&1 ||
    bad "--output-details: $(tail -2 "$S/outd")"
for f in "$S/det.json" "$S/det.jsonl"; do
    jq -e '(.results[0] // .) as $r | ($r.input_lens | length) == 6 and ($r.output_lens | add) == $r.total_output_tokens
           and ($r.output_lens | add) == ($r.server_counters_delta.generation_tokens // $r.total_output_tokens)
           and ($r.input_lens | all(. == 8)) and ($r.ttfts | all(. > 0))
           and ([$r.itls[] | length] == [$r.output_lens[] | . - 1]) and ($r.itls | flatten | all(. >= 0))
           and ($r.generated_texts | length) == 6 and ($r.errors | all(. == ""))' "$f" >/dev/null ||
        { bad "--output-details in $f"; jq -c '(.results[0] // .) | [.input_lens, .output_lens, .ttfts, .errors]' "$f"; }
done
"$M" bench serve --base-url "$SV_URL" --concurrency 1 --num-prompts 2 --output-details >/dev/null 2>"$S/err"; rc=$?
[ $rc = 2 ] && grep -q "output-details (--save-detailed) goes with" "$S/err" || bad "--output-details without a file: exit $rc"
jq -e '.disable_radix_cache == false' <(curl -s "$SV_URL/get_server_info") >/dev/null || bad "get_server_info: the prefix cache"
# text prompts through /detokenize need a tokenizer: a clear refusal here
"$M" bench serve --base-url "$SV_URL" --concurrency 1 --num-prompts 2 --chat >"$S/out2" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "tokenizer" "$S/out2" || bad "--chat without a tokenizer: exit $rc: $(tail -2 "$S/out2")"
stop_server
# --disable-radix-cache (sglang's; vLLM's --no-enable-prefix-caching): the shared prefixes above find nothing,
# every prompt token is computed
start_server "$S/nopc.log" --model "$S/tiny" --context-length 128 --disable-radix-cache --skip-self-check || exit 1
grep -q "prefix cache off" "$S/nopc.log" || bad "--disable-radix-cache: not said at start"
"$M" bench serve --base-url "$SV_URL" --concurrency 1 --num-prompts 8 --input-len 8 --output-len 4 --vocab 256 \
    --gsp-system-prompt-len 64 --gsp-num-groups 2 --json "$S/nopc.json" >"$S/outn" 2>&1 || bad "no prefix cache: $(tail -2 "$S/outn")"
jq -e '.results[0].server_counters_delta | .prompt_tokens == 576 and .prefix_cache_hits == 0' "$S/nopc.json" >/dev/null ||
    bad "--disable-radix-cache: $(jq -c '.results[0].server_counters_delta' "$S/nopc.json")"
jq -e '.disable_radix_cache == true' <(curl -s "$SV_URL/get_server_info") >/dev/null || bad "get_server_info: disable_radix_cache"
stop_server
# a server that refuses: failures are counted and the exit is 1
# (long answers, so that the one admitted request surely outlasts the arrival of the other five,
# however the host schedules the client)
start_server "$S/busy.log" --model "$S/tiny" --context-length 1024 --max-running-requests 1 --max-queued-requests 0 \
    --skip-self-check || exit 1
"$M" bench serve --base-url "$SV_URL" --concurrency 6 --num-prompts 12 --input-len 8 --output-len 1000 --vocab 256 \
    --no-warmup --output-details --json "$S/busy.json" >"$S/out3" 2>&1; rc=$?
[ $rc = 1 ] || bad "refused requests: exit $rc, want 1"
grep -q "Failed requests: *[1-9]" "$S/out3" || bad "no failed requests counted"
grep -q "First failure: *HTTP 503" "$S/out3" || bad "the first failure is not the 503: $(grep 'First failure' "$S/out3")"
jq -e '.results[0] as $r | ($r.errors | map(select(. == "HTTP 503")) | length) == $r.failed and $r.failed >= 1 and
       ([range(12) | select($r.errors[.] != "") | $r.output_lens[.]] | all(. == 0))' "$S/busy.json" >/dev/null ||
    bad "--output-details: the refused requests' errors: $(jq -c '.results[0] | [.failed, .errors, .output_lens]' "$S/busy.json")"
stop_server
# a server started with an API key: the bench sends it (--api-key, or OPENAI_API_KEY as sglang's and vLLM's
# benchmarks read it) on every request, /metrics too (the server's counters come back), and never prints it;
# a wrong or missing key is the server's 401, named; a key that cannot be a header is exit 2
key=sk-bench-7f3a9
start_server "$S/key.log" --model "$S/tiny" --context-length 128 --api-key "$key" --skip-self-check || exit 1
"$M" bench serve --base-url "$SV_URL" --concurrency 2 --num-prompts 4 --input-len 8 --output-len 4 --vocab 256 \
    --api-key "$key" --json "$S/k1.json" >"$S/outk1" 2>&1 || bad "--api-key: exit $?: $(tail -2 "$S/outk1")"
OPENAI_API_KEY=$key "$M" bench serve --base-url "$SV_URL" --backend sglang --concurrency 2 --num-prompts 4 \
    --input-len 8 --output-len 4 --vocab 256 --json "$S/k2.json" >"$S/outk2" 2>&1 ||
    bad "OPENAI_API_KEY: exit $?: $(tail -2 "$S/outk2")"
for f in k1 k2; do
    jq -e '.results[0] | .completed == 4 and .failed == 0 and .server_counters_delta.generation_tokens == 16' \
        "$S/$f.json" >/dev/null || bad "with the key ($f): $(jq -c '.results[0] | [.completed, .server_counters_delta]' "$S/$f.json")"
done
grep -q "api key: from OPENAI_API_KEY" "$S/outk2" || bad "the key's source is not said"
grep -l -- "$key" "$S/outk1" "$S/outk2" "$S/k1.json" "$S/k2.json" && bad "the key was printed"
for env in "" "OPENAI_API_KEY=sk-wrong"; do
    env $env "$M" bench serve --base-url "$SV_URL" --concurrency 1 --num-prompts 1 --vocab 256 >/dev/null 2>"$S/err"; rc=$?
    [ $rc = 1 ] && grep -q "/v1/models: HTTP 401" "$S/err" || bad "key '${env#*=}': exit $rc, want 1 with the 401 ($(head -c 300 "$S/err"))"
done
for k in "" "a b" "$(printf 'a\rb')" "$(printf 'sk\001')" "clé"; do
    "$M" bench serve --base-url "$SV_URL" --concurrency 1 --api-key "$k" >/dev/null 2>"$S/err"; rc=$?
    [ $rc = 2 ] && grep -q -- "--api-key" "$S/err" || bad "--api-key '$k': exit $rc, want 2 ($(head -c 300 "$S/err"))"
done
OPENAI_API_KEY="a b" "$M" bench serve --base-url "$SV_URL" --concurrency 1 >/dev/null 2>"$S/err"; rc=$?
[ $rc = 2 ] && grep -q "OPENAI_API_KEY: the key must be" "$S/err" || bad "OPENAI_API_KEY='a b': exit $rc, want 2"
stop_server
# bad options and an unreachable server
for args in "--concurrency 1" "--base-url http://127.0.0.1:1 --concurrency 0" "--base-url http://127.0.0.1:1 --concurrency 1,x" \
            "--base-url http://127.0.0.1:1 --num-prompts -3" "--base-url http://127.0.0.1:1 --json $S/no/such/dir/f.json" \
            "--base-url http://127.0.0.1:1 --bogus" "--base-url http://127.0.0.1:1 --extra-request-body [1]" \
            "--base-url http://127.0.0.1:1 --extra-request-body {bad" "--base-url http://127.0.0.1:1 --extra-request-body @$S/none.json" \
            "--base-url http://127.0.0.1:1 --request-rate 0" "--base-url http://127.0.0.1:1 --request-rate -2" \
            "--base-url http://127.0.0.1:1 --request-rate fast" "--base-url http://127.0.0.1:1 --random-range-ratio 1.5" \
            "--base-url http://127.0.0.1:1 --random-range-ratio -0.1" "--base-url http://127.0.0.1:1 --gsp-num-groups 0" \
            "--base-url http://127.0.0.1:1 --gsp-system-prompt-len -4"; do
    "$M" bench serve $args >/dev/null 2>"$S/err"; rc=$?
    [ $rc = 2 ] || bad "bench serve $args: exit $rc, want 2 ($(head -1 "$S/err"))"
done
"$M" bench serve --base-url http://127.0.0.1:1 --concurrency 1 --json "$S/unreach.json" >/dev/null 2>"$S/err"; rc=$?
[ $rc = 1 ] || bad "an unreachable server: exit $rc, want 1"
[ -e "$S/unreach.json" ] && bad "an unreachable server: --json left a file ($(wc -c <"$S/unreach.json") bytes)"
# sglang's command line as it is: --backend, --host / --port, --max-concurrency, --random-input-len /
# the server's counters under vLLM's, sglang's and llama-server's names (the recording server counts what it
# answered): the deltas are the run's tokens and requests
for fam in vllm: sglang: llamacpp:; do
    rm -f "$S/hport"
    python3 "$(dirname "$0")/lib/hostile_server.py" record "$S/recm.jsonl" $fam >"$S/hport" & hp=$!
    for _ in $(seq 100); do grep -q '^[0-9]' "$S/hport" 2>/dev/null && break; sleep 0.1; done
    "$M" bench serve --base-url "http://127.0.0.1:$(cat "$S/hport")" --concurrency 2 --num-prompts 3 --input-len 4 \
        --output-len 2 --vocab 256 --warmup-requests 0 --json "$S/rm.json" >"$S/outm" 2>&1 || bad "$fam metrics: exit $?"
    kill $hp; wait $hp 2>/dev/null
    grep -q "metric names: *$fam" "$S/outm" || bad "$fam metrics: $(grep 'metric names' "$S/outm")"
    want='.server_counters_delta.generation_tokens == 6'
    [ $fam != llamacpp: ] && want="$want and .server_counters_delta.success_length == 3"
    jq -e ".results[0] | $want" "$S/rm.json" >/dev/null || bad "$fam metrics: $(jq -c '.results[0].server_counters_delta' "$S/rm.json")"
done

# --random-output-len, --warmup-requests (sent together, each the run's first prompt, as sglang's are),
# --disable-ignore-eos, --output-file (a JSON line per run, appended). What the bench sent is what a
# recording server saw.
rm -f "$S/hport" "$S/rec.jsonl" "$S/rec.jsonl.auth" "$S/o.jsonl"
python3 "$(dirname "$0")/lib/hostile_server.py" record "$S/rec.jsonl" >"$S/hport" & hp=$!
for _ in $(seq 100); do grep -q '^[0-9]' "$S/hport" 2>/dev/null && break; sleep 0.1; done
"$M" bench serve --backend vllm-chat --host 127.0.0.1 --port "$(cat "$S/hport")" --max-concurrency 2 \
    --random-input-len 6 --random-output-len 5 --num-prompts 4 --warmup-requests 3 --disable-ignore-eos \
    --tokenizer "$DATA/../../models/tiny-kjv" --vocab 256 --output-file "$S/o.jsonl" >"$S/outr" 2>&1 ||
    bad "sglang's flags, chat: exit $?: $(tail -2 "$S/outr")"
"$M" bench serve --backend sglang-oai --host 127.0.0.1 --port "$(cat "$S/hport")" --max-concurrency 4 \
    --random-input-len 6 --random-output-len 1 --num-prompts 4 --warmup-requests 0 --vocab 256 \
    --output-file "$S/o.jsonl" >"$S/outr2" 2>&1 || bad "sglang's flags, completions: exit $?: $(tail -2 "$S/outr2")"
"$M" bench serve --backend sglang --port "$(cat "$S/hport")" --max-concurrency 2 --random-input-len 5 \
    --random-output-len 3 --num-prompts 2 --no-warmup --vocab 256 --output-details --return-logprob \
    --json "$S/r3.json" >"$S/outr3" 2>&1 ||
    bad "sglang's flags, /generate: exit $?: $(tail -2 "$S/outr3")"
# with --tokenizer DIR (the recording server says no vocabulary): the ids cover that tokenizer's model vocabulary
# (4032 tokens in tiny-kjv, its 7 added tokens aside)
python3 "$(dirname "$0")/lib/hostile_server.py" record "$S/reck.jsonl" >"$S/hportk" & hpk=$!
for _ in $(seq 100); do grep -q '^[0-9]' "$S/hportk" 2>/dev/null && break; sleep 0.1; done
"$M" bench serve --port "$(cat "$S/hportk")" --concurrency 2 --num-prompts 8 --input-len 64 --output-len 2 \
    --tokenizer "$DATA/../../models/tiny-kjv" >"$S/outk" 2>&1 || bad "--tokenizer vocabulary: exit $?: $(tail -2 "$S/outk")"
kill $hpk; wait $hpk 2>/dev/null
grep -q "random prompts: token ids in \[10, 4032), the vocabulary of --tokenizer" "$S/outk" || bad "--tokenizer vocabulary: $(grep 'random prompts' "$S/outk")"
python3 - "$S/reck.jsonl" <<'EOF2' || bad "--tokenizer vocabulary: the ids sent are not over [10, 4032)"
import json, sys
ids = [t for l in open(sys.argv[1]) for t in json.loads(l)["body"]["prompt"]]
sys.exit(not (ids and min(ids) >= 10 and max(ids) < 4032 and max(ids) >= 1000))
EOF2
grep -q "Total generated tokens: *4 *$" "$S/outr3" || bad "/generate: not 2 x 2 tokens counted: $(grep 'generated' "$S/outr3")"
# /generate's events carry the text so far: the text is the last one's, not their concatenation
jq -e '.results[0].generated_texts == ["aa", "aa"]' "$S/r3.json" >/dev/null ||
    bad "--output-details, /generate: $(jq -c '.results[0].generated_texts' "$S/r3.json")"
# the key goes on every request of a run: /v1/models, /tokenize (a dataset counted by the server), the warm-up,
# the requests, /metrics; and on none without one
cp "$S/rec.jsonl" "$S/rec0.jsonl"
# generated-shared-prefix as sglang makes it: each group's prompts share their first 5 ids, 3 a group, in a
# shuffled order (not group i mod 2)
"$M" bench serve --port "$(cat "$S/hport")" --dataset-name generated-shared-prefix --gsp-num-groups 2 \
    --gsp-prompts-per-group 3 --gsp-system-prompt-len 5 --gsp-question-len 2 --gsp-output-len 1 --vocab 256 \
    --max-concurrency 1 --no-warmup --seed 3 >"$S/outr5" 2>&1 || bad "generated-shared-prefix, recorded: $(tail -2 "$S/outr5")"
python3 - "$S/rec0.jsonl" "$S/rec.jsonl" <<'EOF2' || bad "generated-shared-prefix: not 2 groups of 3 in a shuffled order"
import json, sys
n0 = len(open(sys.argv[1]).readlines())
sent = [json.loads(l)["body"]["prompt"] for l in open(sys.argv[2]).readlines()[n0:]]
heads = [tuple(p[:5]) for p in sent]
ok = len(sent) == 6 and all(len(p) == 7 for p in sent) and len(set(heads)) == 2
ok &= sorted(heads.count(h) for h in set(heads)) == [3, 3] and len({tuple(p[5:]) for p in sent}) == 6
ok &= [heads.index(h) % 2 for h in heads] != [0, 1, 0, 1, 0, 1]
if not ok:
    print(heads)
sys.exit(0 if ok else 1)
EOF2
# sglang's random dataset over a file (--dataset-name random --dataset-path F): each prompt its row's first-turn
# tokens (this server's /tokenize: 0 1 2 3 for "one two three" with its special token) repeated and cut to the
# drawn length
cp "$S/rec.jsonl" "$S/rec1.jsonl"
echo '[{"conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "four"}]},
       {"conversations": [{"from": "human", "value": "five six"}, {"from": "gpt", "value": "seven"}]}]' >"$S/sg1.json"
"$M" bench serve --port "$(cat "$S/hport")" --dataset-name random --dataset-path "$S/sg1.json" --random-input-len 10 \
    --random-output-len 2 --num-prompts 3 --max-concurrency 1 --no-warmup --json "$S/r6.json" >"$S/outr6" 2>&1 ||
    bad "random over a file, recorded: $(tail -2 "$S/outr6")"
python3 - "$S/rec1.jsonl" "$S/rec.jsonl" "$S/r6.json" <<'EOF2' || bad "random over a file: not the rows' tokens repeated and cut, the rows in turn"
import json, sys
n0 = len(open(sys.argv[1]).readlines())
sent = [json.loads(l)["body"]["prompt"] for l in open(sys.argv[2]).readlines()[n0:]]
rows = [r["source"] for r in json.load(open(sys.argv[3]))["dataset"]["rows"]]
tokens = {0: [0, 1, 2, 3], 1: [0, 1, 2]}  # a word a token, one more for the special token
cut = lambda t: (t * 10)[:10]
ok = sorted(rows) == [0, 1] and sent == [cut(tokens[rows[0]]), cut(tokens[rows[1]]), cut(tokens[rows[0]])]
if not ok:
    print(rows, sent)
sys.exit(0 if ok else 1)
EOF2
# --output-details, completions: each request's text is its events' text, in request order
"$M" bench serve --port "$(cat "$S/hport")" --max-concurrency 2 --random-input-len 6 --random-output-len 4 \
    --num-prompts 2 --no-warmup --vocab 256 --output-details --json "$S/r2.json" >"$S/outr2b" 2>&1 ||
    bad "--output-details, completions: exit $?: $(tail -2 "$S/outr2b")"
jq -e '.results[0] | .generated_texts == ["aa", "aa"] and .output_lens == [2, 2] and .input_lens == [6, 6]' \
    "$S/r2.json" >/dev/null || bad "--output-details, completions: $(jq -c '.results[0].generated_texts' "$S/r2.json")"
cp "$S/rec.jsonl.auth" "$S/auth0"
echo '[{"conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "four five"}]}]' \
    >"$S/sg.json"
OPENAI_API_KEY=sk-rec "$M" bench serve --port "$(cat "$S/hport")" --dataset-name sharegpt --dataset-path "$S/sg.json" \
    --max-concurrency 1 --num-prompts 1 --sharegpt-context-len 100 >"$S/outr4" 2>&1 ||
    bad "the key, on a recording server: exit $?: $(tail -2 "$S/outr4")"
python3 - "$S/auth0" "$S/rec.jsonl.auth" <<'EOF2' || bad "the key was not sent on every request, or sent without one"
import json, sys
before = [json.loads(l) for l in open(sys.argv[1])]
after = [json.loads(l) for l in open(sys.argv[2])][len(before):]
paths = {a["path"] for a in after}
ok = {"/v1/models", "/tokenize", "/v1/completions", "/metrics"} <= paths
ok &= all(a["auth"] == "Bearer sk-rec" for a in after) and all(b["auth"] is None for b in before)
if not ok:
    print(before[:3], after)
sys.exit(0 if ok else 1)
EOF2
# vLLM's sampling flags, in every request's body (over the bench's temperature 0)
cp "$S/rec.jsonl" "$S/rec2.jsonl"
"$M" bench serve --port "$(cat "$S/hport")" --max-concurrency 2 --random-input-len 4 --random-output-len 2 \
    --num-prompts 2 --no-warmup --vocab 256 --temperature 0.7 --top-p 0.9 --top-k 5 --min-p 0.05 \
    --frequency-penalty 0.1 --presence-penalty -0.2 --repetition-penalty 1.1 >"$S/outr7" 2>&1 ||
    bad "vLLM's sampling flags, recorded: $(tail -2 "$S/outr7")"
python3 - "$S/rec2.jsonl" "$S/rec.jsonl" <<'EOF2' || bad "vLLM's sampling flags were not sent as given"
import json, sys
n0 = len(open(sys.argv[1]).readlines())
sent = [json.loads(l)["body"] for l in open(sys.argv[2]).readlines()[n0:] if '"/v1/completions"' in l]
want = {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "frequency_penalty": 0.1, "presence_penalty": -0.2,
        "repetition_penalty": 1.1}
ok = len(sent) == 2 and all(all(abs(b[k] - v) < 1e-9 and type(b[k]) is type(v) for k, v in want.items()) for b in sent)
if not ok:
    print(sent)
sys.exit(0 if ok else 1)
EOF2
kill $hp 2>/dev/null; wait $hp 2>/dev/null
python3 - "$S/rec0.jsonl" "$S/o.jsonl" <<'EOF2' || bad "sglang's flags: the requests sent or the lines written are not as asked"
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1])]
out = [json.loads(l) for l in open(sys.argv[2])]
ok = len(rec) == 3 + 4 + 4 + 2 and len(out) == 2
warm, run, run2, gen = rec[:3], rec[3:7], rec[7:11], rec[11:]
ok &= all(r["path"] == "/generate" and r["body"]["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 3,
          "ignore_eos": True} and len(r["body"]["input_ids"]) == 5 and r["body"]["stream"] is True and
          r["body"]["return_logprob"] is True for r in gen)
ok &= all(r["path"] == "/v1/chat/completions" and "ignore_eos" not in r["body"] and r["body"]["max_tokens"] == 5
          for r in warm + run)
ok &= warm[0]["body"] == warm[1]["body"] == warm[2]["body"]  # the first prompt, three times
ok &= len({json.dumps(r["body"]["messages"]) for r in run}) == 4
ok &= warm[0]["body"]["messages"] in [r["body"]["messages"] for r in run]
ok &= all(r["path"] == "/v1/completions" and r["body"]["ignore_eos"] is True and r["body"]["max_tokens"] == 1 and
          len(r["body"]["prompt"]) == 6 for r in run2)
ok &= [o["max_concurrency"] for o in out] == [2, 4] and [o["completed"] for o in out] == [4, 4]
ok &= [o["backend"] for o in out] == ["openai-chat", "openai-completions"] and [o["ignore_eos"] for o in out] == [False, True]
ok &= [o["total_output_tokens"] for o in out] == [8, 4]
if not ok:
    print(json.dumps(rec)[:1500], json.dumps(out)[:800])
sys.exit(0 if ok else 1)
EOF2
for args in "--backend sglang --chat --port 1" "--backend trt --port 1" "--base-url http://127.0.0.1:1 --host 127.0.0.1" \
            "--port 0" "--port 70000" "--host a/b --port 1" "--port 1 --warmup-requests -1" \
            "--port 1 --output-file $S/no/such/dir/o.jsonl" "--port 1 --random-input-len 0" \
            "--port 1 --dataset-name generated-shared-prefix --num-prompts 4" "--port 1 --gsp-question-len 4" \
            "--port 1 --dataset-name generated-shared-prefix --input-len 4" "--port 1 --dataset-name random-x" \
            "--port 1 --dataset-name generated-shared-prefix --gsp-prompts-per-group 0" \
            "--port 1 --dataset-path $S/x.json --vocab 100" "--port 1 --dataset-path $S/x.json --gsp-num-groups 2" \
            "--port 1 --dataset-name generated-shared-prefix --dataset-path $S/x.json" "--port 1 --return-logprob" \
            "--port 1 --burstiness 2" "--port 1 --request-rate 5 --burstiness 0" "--port 1 --result-dir $S/rd" \
            "--port 1 --save-result --json $S/j.json" "--port 1 --ignore-eos --disable-ignore-eos" "--port 1 --label x" \
            "--port 1 --goodput ttft:0" "--port 1 --goodput foo:3" "--port 1 --goodput" "--port 1 --goodput ttft:5x" \
            "--port 1 --metric-percentiles 0" "--port 1 --metric-percentiles 101" "--port 1 --metric-percentiles 50,,90" \
            "--port 1 --percentile-metrics ttft,foo" "--port 1 --endpoint /v1/embeddings" "--port 1 --metadata novalue" \
            "--port 1 --backend sglang --temperature 1" "--port 1 --top-k 1.5" "--port 1 --top-p 2" "--port 1 --temperature x" \
            "--port 1 --temperature 1 --extra-request-body {\"temperature\":1}" \
            "--port 1 --random-prefix-len 4 --gsp-num-groups 2" "--port 1 --random-prefix-len 4 --dataset-name generated-shared-prefix"; do
    "$M" bench serve $args >/dev/null 2>"$S/err"; rc=$?
    [ $rc = 2 ] && [ -s "$S/err" ] || bad "bench serve $args: exit $rc, want 2 ($(head -1 "$S/err"))"
done
# a hostile server: what it sends is bounded and checked, and the reason is named (exit 1, no hang)
for case in "models404|HTTP 404" "modelsbig|larger than 64 MiB" "hugeline|an event line longer than 16 MiB" \
            "garbage|an event is not JSON" "usage_neg|usage.completion_tokens is -5, outside [0, 4]" \
            "usage_big|usage.completion_tokens is 99999999999, outside [0, 4]" "notext|no output in the stream" \
            "cutempty|the stream ended without [DONE]"; do
    mode=${case%%|*} want=${case#*|}
    rm -f "$S/hport"
    python3 "$(dirname "$0")/lib/hostile_server.py" "$mode" >"$S/hport" & hp=$!
    for _ in $(seq 100); do grep -q '^[0-9]' "$S/hport" 2>/dev/null && break; sleep 0.1; done
    timeout 60 "$M" bench serve --base-url "http://127.0.0.1:$(cat "$S/hport")" --concurrency 1 --num-prompts 2 \
        --input-len 4 --output-len 4 --timeout 20 --no-warmup >"$S/outh" 2>&1; rc=$?
    kill $hp 2>/dev/null; wait $hp 2>/dev/null
    [ $rc = 1 ] && grep -qF -- "$want" "$S/outh" || bad "hostile server $mode: exit $rc, want 1 and '$want': $(tail -3 "$S/outh")"
    grep -qE 'Sanitizer|runtime error:' "$S/outh" && bad "hostile server $mode: sanitizer report"
done
# --output-details keeps each answer's text, up to 64 MiB: a server that never stops talking fails the
# request with the reason, at once (not at --timeout), and the bench's memory stays bounded
rm -f "$S/hport"
python3 "$(dirname "$0")/lib/hostile_server.py" endlesstext >"$S/hport" & hp=$!
for _ in $(seq 100); do grep -q '^[0-9]' "$S/hport" 2>/dev/null && break; sleep 0.1; done
t0=$(date +%s)
timeout 120 python3 -c 'import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)' "$S/rss" "$M" bench serve --base-url "http://127.0.0.1:$(cat "$S/hport")" \
    --concurrency 1 --num-prompts 1 --input-len 4 --output-len 4 --timeout 100 --no-warmup --output-details \
    --json "$S/endless.json" >"$S/oute" 2>&1; rc=$?
kill $hp 2>/dev/null; wait $hp 2>/dev/null
[ $rc = 1 ] && grep -qF "the answer's text is larger than 64 MiB" "$S/oute" || bad "endless text: exit $rc: $(tail -3 "$S/oute")"
[ $(( $(date +%s) - t0 )) -lt 90 ] || bad "endless text: the request ran to --timeout"
echo "endless text: the bench peaked at $(cat "$S/rss") KB"
[ "$(cat "$S/rss" 2>/dev/null || echo 9999999)" -lt 1000000 ] || bad "endless text: the bench peaked at $(cat "$S/rss") KB"
# a NUL byte in the text is output like any other (random weights write one now and then)
rm -f "$S/hport"
python3 "$(dirname "$0")/lib/hostile_server.py" nultext >"$S/hport" & hp=$!
for _ in $(seq 100); do grep -q '^[0-9]' "$S/hport" 2>/dev/null && break; sleep 0.1; done
"$M" bench serve --base-url "http://127.0.0.1:$(cat "$S/hport")" --concurrency 2 --num-prompts 3 --input-len 4 \
    --output-len 4 --json "$S/nul.json" >"$S/outn0" 2>&1 || bad "nultext: exit $?: $(grep -i fail "$S/outn0" | head -2)"
kill $hp 2>/dev/null; wait $hp 2>/dev/null
jq -e '.results[0] | .completed == 3 and .total_output_tokens == 6' "$S/nul.json" >/dev/null || bad "nultext: not 3 x 2 tokens"
# an answer that ends at once (the model's EOS first, without ignore_eos) is a success of no text: its TTFT
# is its latency, its tokens the usage's
rm -f "$S/hport"
python3 "$(dirname "$0")/lib/hostile_server.py" eosfirst >"$S/hport" & hp=$!
for _ in $(seq 100); do grep -q '^[0-9]' "$S/hport" 2>/dev/null && break; sleep 0.1; done
"$M" bench serve --base-url "http://127.0.0.1:$(cat "$S/hport")" --concurrency 2 --num-prompts 3 --input-len 4 \
    --output-len 4 --disable-ignore-eos --json "$S/eos.json" >"$S/oute" 2>&1 || bad "eosfirst: exit $?: $(tail -2 "$S/oute")"
kill $hp 2>/dev/null; wait $hp 2>/dev/null
jq -e '.results[0] | .completed == 3 and .failed == 0 and .total_output_tokens == 3 and .mean_ttft_ms > 0 and
       (.mean_ttft_ms - .mean_e2e_latency_ms | fabs) < 0.001' "$S/eos.json" >/dev/null ||
    bad "eosfirst: $(jq -c '.results[0] | [.completed, .failed, .total_output_tokens, .mean_ttft_ms, .mean_e2e_latency_ms]' "$S/eos.json")"
clean_log "$S/serve.log" && clean_log "$S/busy.log" || bad "sanitizer report in a server log"
[ $fails = 0 ] || exit 1
rm -rf "$S"
echo OK
