/* cmd_bench_serve.c — `moerun bench serve`: the serving benchmark against a
 * running OpenAI-compatible server (ours or another), a sweep over
 * concurrencies. Per concurrency it prints sglang bench_serving's table and
 * the server's own counters from /metrics (their change over the run), then
 * a summary over the sweep; --json writes every number, --plot draws output
 * tok/s and the TTFT / ITL percentiles against concurrency with gnuplot.
 * The measurement itself is the library's (serve/loadgen.c). */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_model.h"
#include "moerun/io.h"
#include "moerun/serve.h"
#include "moerun/text.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moerun bench serve --base-url URL [--concurrency 1,16,64,128] [--num-prompts N]\n"
            "                          [--input-len L] [--output-len O] [--chat] [--text-prompts]\n"
            "                          [--model NAME] [--vocab V] [--seed S] [--timeout S] [--no-warmup] [--flush-cache]\n"
            "                          [--api-key KEY]\n"
            "                          [--tokenizer DIR] [--extra-request-body JSON|@FILE]\n"
            "                          [--request-rate R] [--random-range-ratio X]\n"
            "                          [--gsp-system-prompt-len P --gsp-num-groups G]\n"
            "                          [--dataset-name generated-shared-prefix [--gsp-*]]\n"
            "                          [--dataset-name sharegpt --dataset-path FILE [--sharegpt-output-len O]\n"
            "                           [--sharegpt-context-len C] [--apply-chat-template] [--tokenize-prompt]]\n"
            "                          [--json FILE] [--plot FILE.png] [--output-file FILE.jsonl]\n"
            "                          [--warmup-requests N] [--disable-ignore-eos] [--disable-stream]\n\n"
            "Serving benchmark with sglang bench_serving's definitions: at each concurrency C, N requests\n"
            "(default 4 x C, at least 16) of L random prompt tokens (default 128) and O output tokens\n"
            "(default 128; ignore_eos, temperature 0, streamed with include_usage), at most C in flight, one\n"
            "warm-up request first. Completions take the prompt as token ids; --chat (or --text-prompts)\n"
            "sends their text from the server's /detokenize. Prints TTFT, TPOT, ITL and E2E (mean, median,\n"
            "p99), the throughputs and the server's /metrics counters over the run. --tokenizer DIR decodes the\n"
            "text prompts here with DIR/tokenizer.json (for servers without /detokenize). A server that sends\n"
            "no usage counts one output token per event.\n");
    fprintf(f,
            "sglang's bench_serving command lines run as they are: --max-concurrency (= --concurrency),\n"
            "--random-input-len / --random-output-len (= --input-len / --output-len), --host H --port P (in\n"
            "place of --base-url; 127.0.0.1 and 30000 unless given), --backend sglang-oai | vllm | lmdeploy\n"
            "(completions, the default) or sglang-oai-chat | vllm-chat | lmdeploy-chat (= --chat), or sglang |\n"
            "sglang-native (sglang's POST /generate: input_ids, or text with --text-prompts or a dataset).\n"
            "  --warmup-requests N  N warm-up requests, sent together, each the run's first prompt (sglang's);\n"
            "              0 = --no-warmup [1]\n"
            "  --disable-ignore-eos  requests may end at the model's EOS before their output length\n"
            "  --disable-stream  answers not streamed: one JSON body each; TTFT is then the latency (sglang's)\n"
            "  --output-file FILE.jsonl  append one JSON line per concurrency as its run ends (sglang's)\n"
            "  --output-details  each request's input_lens, output_lens, ttfts, itls (seconds), generated_texts\n"
            "              and errors in those lines and in --json's results (sglang's); --disable-tqdm is accepted\n"
            "  --return-logprob  /generate requests ask for the output's log-probabilities (sglang's)\n"
            "  --api-key KEY  sent as Authorization: Bearer KEY on every request, /metrics and /tokenize too,\n"
            "              for a server started with an API key [the environment's OPENAI_API_KEY, as sglang's\n"
            "              and vLLM's benchmarks read it; the key is never printed]\n"
            "  --vocab V   token ids are drawn in [10, V) [the model's vocabulary without its added tokens: that\n"
            "              of --tokenizer DIR, else the server's vocab_size (moerun serve's /get_model_info), else 1000]\n"
            "  --extra-request-body JSON|@FILE  a JSON object merged into every request, its keys replacing\n"
            "              the bench's own (sglang's flag): e.g. '{\"response_format\": {\"type\": \"json_schema\", ...}}'\n"
            "              to measure structured outputs\n"
            "  --flush-cache  POST /flush_cache before each concurrency's run (after its warm-up): every run\n"
            "              starts with an empty prefix cache (sglang's flag; moerun serve and sglang answer it)\n"
            "  --profile [--profile-dir DIR]  POST /start_profile before each concurrency's run and /stop_profile\n"
            "              after it (sglang's flag): moerun serve's Chrome trace of the run's engine steps is written\n"
            "              to DIR/moerun-trace-cC.json (DIR made if missing) [.]\n"
            "  --request-rate R  requests arrive as a Poisson process of R per second (exponential gaps, the\n"
            "              first at once, from --seed), each sent when it has arrived and one of the C slots is\n"
            "              free; the duration includes the waits (sglang's flag) [inf: all at t = 0]\n"
            "  --random-range-ratio X  each request's input and output lengths uniform in\n"
            "              [max(1, floor(L * X)), L] and [max(1, floor(O * X)), O], from --seed (sglang's random\n"
            "              dataset; its default is 0) [fixed lengths L and O]\n"
            "  --gsp-system-prompt-len P, --gsp-num-groups G  shared prefixes on random prompts: each\n"
            "              prompt is one of G random P-token prefixes (request i: group i mod G) followed by its\n"
            "              own L tokens, to measure a server's prefix cache [P 0: no prefix; G 1]\n"
            );
    fprintf(f,
            "  --dataset-name generated-shared-prefix  sglang's dataset of that name: G x Q requests\n"
            "              (--gsp-prompts-per-group Q), each a group's P-token system prompt and its own\n"
            "              --gsp-question-len tokens, --gsp-output-len tokens out, in a shuffled order; every\n"
            "              concurrency runs all [G 8, Q 8, P 512, question 64, output 64: sglang's 64, 16, 2048,\n"
            "              128, 256 are sized for GPUs]\n"
            "  --dataset-name random|sharegpt  random (sglang's random-ids): the prompts above [the default];\n"
            "              with --dataset-path FILE (sglang's random): each prompt a conversation's first turn,\n"
            "              its tokens repeated and cut to the drawn length (real text for the router)\n"
            "              sharegpt: sglang's default dataset, real conversations from --dataset-path FILE\n"
            "              (ShareGPT's JSON, e.g. ShareGPT_V3_unfiltered_cleaned_split.json; nothing is\n"
            "              downloaded): each prompt is a\n"
            "              conversation's first turn as text, its output length the token count of its second,\n"
            "              the conversations shuffled from --seed, those with a prompt or output under 2 tokens,\n"
            "              or longer together than the context, skipped (as sglang samples them); counted by the\n"
            "              server's /tokenize, or by --tokenizer DIR. N rows are drawn once (default 4 x the\n"
            "              largest C, at least 16); each concurrency runs its first N\n"
            "  --sharegpt-output-len O  every output O tokens (>= 2) [the second turn's length]\n"
            "  --sharegpt-context-len C  skip rows of prompt + output > C [the server's max_model_len]\n"
            "  --apply-chat-template  each prompt rendered first by the chat template of --tokenizer DIR as one\n"
            "              user message with the generation prompt, the BOS token's text taken out (sglang's;\n"
            "              for completions and /generate: a chat request is rendered by the server)\n"
            "  --tokenize-prompt  send each row's token ids (those counted) in place of its text (sglang's):\n"
            "              the server runs exactly the lengths counted (random prompts are ids already)\n");
    fprintf(f,
            "vLLM's `vllm bench serve` flags: --endpoint /v1/completions | /v1/chat/completions (= --chat) | /generate\n"
            "(= --backend sglang); --ignore-eos (this bench's default; --disable-ignore-eos for vLLM's); --num-warmups N\n"
            "(= --warmup-requests); --random-prefix-len P (one random P-token prefix before every prompt);\n"
            "--save-result [--result-dir DIR (made if missing)] [--result-filename NAME] [--label L]: the JSON of --json\n"
            "in DIR/NAME [. and LABEL-RATEqps-concurrencyC-MODEL-DATE.json, LABEL the --backend]; --save-detailed\n"
            "(= --output-details); --metadata KEY=VALUE ... (under \"metadata\" in that file)\n"
            "  --burstiness B  with --request-rate R: gaps gamma-distributed of shape B and mean 1/R (1: Poisson,\n"
            "              below 1 burstier, above 1 more even) [1]\n"
            "  --percentile-metrics ttft,tpot,itl,e2el  --metric-percentiles 50,90,99  these percentiles of these\n"
            "              metrics, printed and as vLLM's p{P}_{metric}_ms keys [ttft,tpot,itl; 99]\n"
            "  --goodput ttft:MS tpot:MS e2el:MS  service-level objectives (any of them): requests/s of completed\n"
            "              requests within every one given (Request goodput; request_goodput in the JSON)\n"
            "  --temperature, --top-p, --top-k, --min-p, --frequency-penalty, --presence-penalty,\n"
            "              --repetition-penalty X  set in every OpenAI request's body [the bench's: temperature 0]\n");
}

/* The value of the first series named `name` (with any labels) in a
 * Prometheus text, or NAN. With label (e.g. finished_reason="stop"), the
 * series whose labels contain it. */
static double prom(const char *text, const char *name, const char *label) {
    if (!text) return NAN;
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (*p == '#' || strncmp(p, name, n) || (p[n] != '{' && p[n] != ' ')) continue;
        const char *eol = strchr(p, '\n');
        const char *sp = p + n;
        if (*sp == '{') {
            const char *close = strchr(sp, '}');
            if (!close || (eol && close > eol)) continue;
            if (label) {
                char *hit = strstr(sp, label);
                if (!hit || hit > close) continue;
            }
            sp = close + 1;
        } else if (label) {
            continue;
        }
        return strtod(sp, NULL);
    }
    return NAN;
}

typedef struct {
    double prompt, gen, ok_stop, ok_len, abort, err, preempt, pq, ph, ttft_sum, ttft_n, itl_sum, itl_n, e2e_sum,
        e2e_n, q_sum, q_n, rej, steps, step_s[4]; /* engine steps, and their seconds: schedule, forward, sample, complete */
    char family[16]; /* whose names the server's /metrics has ("moerun:", "vllm:", ...; "" when none was read) */
} counters;

/* A counter of the server's family: moerun serve's, vLLM's and sglang's share the names after their prefix
 * (vLLM's are the model moerun's follow); llama-server's (llamacpp:) has its own for the two token counts. */
static double pm(const char *t, const char *pre, const char *name, const char *label) {
    char full[128];
    if (!strcmp(pre, "llamacpp:")) {
        if (strcmp(name, "prompt_tokens_total") && strcmp(name, "generation_tokens_total")) return NAN;
        name = !strcmp(name, "generation_tokens_total") ? "tokens_predicted_total" : name;
    }
    snprintf(full, sizeof full, "%s%s", pre, name);
    return prom(t, full, label);
}

static void read_counters(const char *base, const char *key, counters *c) {
    long http = 0;
    char *t = NULL;
    memset(c, 0, sizeof *c);
    if (mr_http_get(base, "/metrics", key, 30, &http, &t) || http != 200) {
        free(t);
        t = NULL;
    }
    /* whose names: the first family that has a prompt or a generation token count */
    static const char *const fam[] = {"moerun:", "vllm:", "sglang:", "llamacpp:"};
    const char *p = NULL;
    for (size_t i = 0; i < sizeof fam / sizeof fam[0] && !p; i++)
        if (!isnan(pm(t, fam[i], "prompt_tokens_total", NULL)) || !isnan(pm(t, fam[i], "generation_tokens_total", NULL)))
            p = fam[i];
    snprintf(c->family, sizeof c->family, "%s", !t ? "" : p ? p : "?");
    if (!p) p = fam[0];
    c->prompt = pm(t, p, "prompt_tokens_total", NULL);
    c->gen = pm(t, p, "generation_tokens_total", NULL);
    c->ok_stop = pm(t, p, "request_success_total", "finished_reason=\"stop\"");
    c->ok_len = pm(t, p, "request_success_total", "finished_reason=\"length\"");
    c->abort = pm(t, p, "request_success_total", "finished_reason=\"abort\"");
    c->err = pm(t, p, "request_success_total", "finished_reason=\"error\"");
    c->preempt = pm(t, p, "num_preemptions_total", NULL);
    c->pq = pm(t, p, "prefix_cache_queries_total", NULL);
    c->ph = pm(t, p, "prefix_cache_hits_total", NULL);
    c->ttft_sum = pm(t, p, "time_to_first_token_seconds_sum", NULL);
    c->ttft_n = pm(t, p, "time_to_first_token_seconds_count", NULL);
    c->itl_sum = pm(t, p, "inter_token_latency_seconds_sum", NULL);
    c->itl_n = pm(t, p, "inter_token_latency_seconds_count", NULL);
    c->e2e_sum = pm(t, p, "e2e_request_latency_seconds_sum", NULL);
    c->e2e_n = pm(t, p, "e2e_request_latency_seconds_count", NULL);
    c->q_sum = pm(t, p, "request_queue_time_seconds_sum", NULL);
    c->q_n = pm(t, p, "request_queue_time_seconds_count", NULL);
    c->rej = pm(t, p, "request_rejected_total", "reason=\"queue_full\"");
    c->steps = pm(t, p, "engine_steps_total", NULL);
    static const char *const phase[4] = {"phase=\"schedule\"", "phase=\"forward\"", "phase=\"sample\"",
                                         "phase=\"complete\""};
    for (int i = 0; i < 4; i++) c->step_s[i] = pm(t, p, "engine_step_seconds_total", phase[i]);
    free(t);
}

/* --flush-cache: the server's prefix cache dropped before a run (sglang's /flush_cache, which moerun serve
 * and sglang answer); 1 with the reason printed when it was not. */
static int flush_cache(const char *base, const char *key) {
    long http = 0;
    char *body = NULL;
    if (mr_http_post(base, "/flush_cache", "", key, 60, &http, &body) || http != 200) {
        fprintf(stderr, "moerun bench serve: --flush-cache: POST %s/flush_cache: %s%.300s\n", base,
                http ? "" : mr_error_last(), body ? body : "");
        free(body);
        return 1;
    }
    free(body);
    return 0;
}

/* --profile: the server's step profile of one concurrency's run (sglang's /start_profile, /stop_profile): 0,
 * or 1 with the reason printed. stop: the trace (moerun serve's answer) written to DIR/moerun-trace-cC.json
 * whole or not at all. */
static int profile_call(const char *base, const char *key, bool stop, const char *dir, int c) {
    long http = 0;
    char *body = NULL;
    const char *path = stop ? "/stop_profile" : "/start_profile";
    if (mr_http_post(base, path, "", key, 60, &http, &body) || http != 200) {
        fprintf(stderr, "moerun bench serve: --profile: POST %s%s: %s%.300s\n", base, path, http ? "" : mr_error_last(),
                body ? body : "");
        free(body);
        return 1;
    }
    int rc = 0;
    if (stop) {
        char file[4096];
        snprintf(file, sizeof file, "%s/moerun-trace-c%d.json", dir, c);
        if (mr_write_file_atomic(file, body, strlen(body))) {
            fprintf(stderr, "moerun bench serve: --profile: %s\n", mr_error_last());
            rc = 1;
        } else {
            printf("profile: the server's steps of this run in %s (Perfetto, chrome://tracing)\n", file);
        }
    }
    free(body);
    return rc;
}

/* Random prompts without --vocab: ids drawn over the model's vocabulary (its added tokens aside), as sglang's
 * and vLLM's random datasets draw them: --tokenizer DIR's, else the server's vocab_size (moerun serve's
 * /get_model_info), else 1000, said. 1 when the tokenizer cannot be read (printed). */
static int random_vocab(mr_bench_serve_opts *o) {
    int64_t v = 0;
    const char *from = NULL;
    if (o->tokenizer) {
        mr_tokenizer *tk = NULL;
        if (mr_tokenizer_load(o->tokenizer, &tk)) {
            fprintf(stderr, "moerun bench serve: --tokenizer %s: %s\n", o->tokenizer, mr_error_last());
            return 1;
        }
        v = (int64_t)mr_tokenizer_model_vocab_size(tk);
        mr_tokenizer_free(tk);
        from = "the vocabulary of --tokenizer";
    } else {
        long http = 0;
        char *body = NULL;
        if (!mr_http_get(o->base_url, "/get_model_info", o->api_key, 30, &http, &body) && http == 200 && body) {
            json_t *j = json_loads(body, 0, NULL);
            const json_t *x = json_object_get(j, "vocab_size");
            if (json_is_integer(x) && json_integer_value(x) <= INT32_MAX) {
                v = (int64_t)json_integer_value(x);
                from = "the server's vocab_size (/get_model_info)";
            }
            json_decref(j);
        }
        free(body);
    }
    if (v > o->min_id) o->vocab = v;
    else from = NULL;
    printf("random prompts: token ids in [%lld, %lld), %s\n", (long long)o->min_id, (long long)o->vocab,
           from ? from : "the default (the server does not say its vocabulary: --vocab V or --tokenizer DIR)");
    return 0;
}

/* sglang's name of the API spoken (its bench_serving's Backend line) */
static const char *backend_name(const mr_bench_serve_opts *o) {
    return o->native ? "sglang" : o->chat ? "openai-chat" : "openai-completions";
}

static void line(const char *k, double v) { printf("%-40s %-10.2f\n", k, v); }

static void print_table(const mr_bench_serve_result *r, const mr_bench_serve_opts *o) {
    printf("\n============ Serving Benchmark Result ============\n");
    printf("%-40s %-10s\n", "Backend:", backend_name(o));
    if (o->request_rate > 0)
        printf("%-40s %-10.2f\n", "Traffic request rate:", o->request_rate);
    else
        printf("%-40s %-10s\n", "Traffic request rate:", "inf");
    printf("%-40s %-10d\n", "Max request concurrency:", r->concurrency);
    printf("%-40s %-10d\n", "Successful requests:", r->completed);
    printf("%-40s %-10d\n", "Failed requests:", r->failed);
    line("Benchmark duration (s):", r->duration_s);
    printf("%-40s %-10lld\n", "Total input tokens:", (long long)r->total_input);
    printf("%-40s %-10lld\n", "Total generated tokens:", (long long)r->total_output);
    line("Request throughput (req/s):", r->request_throughput);
    if (o->slo_ttft_ms > 0 || o->slo_tpot_ms > 0 || o->slo_e2el_ms > 0) line("Request goodput (req/s):", r->request_goodput);
    line("Input token throughput (tok/s):", r->input_throughput);
    line("Output token throughput (tok/s):", r->output_throughput);
    line("Total token throughput (tok/s):", r->total_throughput);
    line("Concurrency:", r->concurrency_measured);
    printf("----------------End-to-End Latency----------------\n");
    line("Mean E2E Latency (ms):", r->e2e_mean);
    line("Median E2E Latency (ms):", r->e2e_median);
    line("P99 E2E Latency (ms):", r->e2e_p99);
    printf("---------------Time to First Token----------------\n");
    line("Mean TTFT (ms):", r->ttft_mean);
    line("Median TTFT (ms):", r->ttft_median);
    line("P99 TTFT (ms):", r->ttft_p99);
    printf("-----Time per Output Token (excl. 1st token)------\n");
    line("Mean TPOT (ms):", r->tpot_mean);
    line("Median TPOT (ms):", r->tpot_median);
    line("P99 TPOT (ms):", r->tpot_p99);
    printf("---------------Inter-Token Latency----------------\n");
    line("Mean ITL (ms):", r->itl_mean);
    line("Median ITL (ms):", r->itl_median);
    line("P95 ITL (ms):", r->itl_p95);
    line("P99 ITL (ms):", r->itl_p99);
    line("Max ITL (ms):", r->itl_max);
    if (o->request_rate > 0) line("Last request due at (s):", r->last_arrival_s);
    if (r->failed) printf("%-40s %s\n", "First failure:", r->first_error);
}

static double dlt(double a, double b) { return isnan(a) || isnan(b) ? NAN : b - a; }

static void print_server(const counters *a, const counters *b) {
    printf("-------------Server counters (/metrics)-----------\n");
    printf("%-40s %s\n", "metric names:", !b->family[0]            ? "(no /metrics read)"
                                           : !strcmp(b->family, "?") ? "(none of moerun's, vLLM's, sglang's, llama-server's)"
                                                                     : b->family);
    printf("%-40s %-10.0f\n", "prompt_tokens_total (delta):", dlt(a->prompt, b->prompt));
    printf("%-40s %-10.0f\n", "generation_tokens_total (delta):", dlt(a->gen, b->gen));
    printf("%-40s %.0f stop, %.0f length, %.0f abort, %.0f error\n", "request_success_total (delta):",
           dlt(a->ok_stop, b->ok_stop), dlt(a->ok_len, b->ok_len), dlt(a->abort, b->abort), dlt(a->err, b->err));
    printf("%-40s %-10.0f\n", "num_preemptions_total (delta):", dlt(a->preempt, b->preempt));
    printf("%-40s %.0f / %.0f\n", "prefix cache hits / queries (delta):", dlt(a->ph, b->ph), dlt(a->pq, b->pq));
    printf("%-40s %-10.0f\n", "rejected, queue full (delta):", dlt(a->rej, b->rej));
    double n;
    n = dlt(a->ttft_n, b->ttft_n);
    printf("%-40s %-10.2f\n", "server mean TTFT (ms):", n > 0 ? 1e3 * dlt(a->ttft_sum, b->ttft_sum) / n : NAN);
    n = dlt(a->itl_n, b->itl_n);
    printf("%-40s %-10.2f\n", "server mean ITL (ms):", n > 0 ? 1e3 * dlt(a->itl_sum, b->itl_sum) / n : NAN);
    n = dlt(a->e2e_n, b->e2e_n);
    printf("%-40s %-10.2f\n", "server mean E2E (ms):", n > 0 ? 1e3 * dlt(a->e2e_sum, b->e2e_sum) / n : NAN);
    n = dlt(a->q_n, b->q_n);
    printf("%-40s %-10.2f\n", "server mean queue time (ms):", n > 0 ? 1e3 * dlt(a->q_sum, b->q_sum) / n : NAN);
    n = dlt(a->steps, b->steps); /* moerun serve's own: where the engine's steps spent their time */
    if (n > 0) {
        double ph[4], all = 0.0;
        for (int i = 0; i < 4; i++) all += ph[i] = dlt(a->step_s[i], b->step_s[i]);
        printf("%-40s %.0f, %.2f ms each\n", "engine steps (delta), mean step:", n, 1e3 * all / n);
        printf("%-40s %.1f / %.1f / %.1f%%\n", "step time forward / sample / other:", 100 * ph[1] / all,
               100 * ph[2] / all, 100 * (ph[0] + ph[3]) / all);
    }
    printf("==================================================\n");
}

static json_t *result_json(const mr_bench_serve_result *r, const counters *a, const counters *b) {
    json_t *o = json_pack(
        "{s:i,s:i,s:i,s:f,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
        "max_concurrency", r->concurrency, "completed", r->completed, "failed", r->failed, "duration", r->duration_s,
        "total_input_tokens", (json_int_t)r->total_input, "total_output_tokens", (json_int_t)r->total_output,
        "request_throughput", r->request_throughput, "input_throughput", r->input_throughput, "output_throughput",
        r->output_throughput, "total_throughput", r->total_throughput, "concurrency", r->concurrency_measured,
        "mean_ttft_ms", r->ttft_mean, "median_ttft_ms", r->ttft_median, "p99_ttft_ms", r->ttft_p99, "std_ttft_ms",
        r->ttft_std, "mean_tpot_ms", r->tpot_mean, "median_tpot_ms", r->tpot_median, "p99_tpot_ms", r->tpot_p99,
        "mean_itl_ms", r->itl_mean, "median_itl_ms", r->itl_median, "p95_itl_ms", r->itl_p95, "p99_itl_ms",
        r->itl_p99, "max_itl_ms", r->itl_max, "mean_e2e_latency_ms", r->e2e_mean, "median_e2e_latency_ms",
        r->e2e_median, "p99_e2e_latency_ms", r->e2e_p99, "std_e2e_latency_ms", r->e2e_std);
    if (!o) return NULL;
    json_t *sc = json_object();
    double d;
#define PUT(k, x)                                                   \
    d = dlt(a->x, b->x);                                            \
    if (!isnan(d)) json_object_set_new(sc, k, json_real(d));
    PUT("prompt_tokens", prompt);
    PUT("generation_tokens", gen);
    PUT("success_stop", ok_stop);
    PUT("success_length", ok_len);
    PUT("abort", abort);
    PUT("error", err);
    PUT("preemptions", preempt);
    PUT("prefix_cache_queries", pq);
    PUT("prefix_cache_hits", ph);
    PUT("rejected_queue_full", rej);
    PUT("engine_steps", steps);
    PUT("engine_schedule_s", step_s[0]);
    PUT("engine_forward_s", step_s[1]);
    PUT("engine_sample_s", step_s[2]);
    PUT("engine_complete_s", step_s[3]);
#undef PUT
    double n;
#define MEAN(k, sum, cnt)                                                         \
    n = dlt(a->cnt, b->cnt);                                                      \
    if (n > 0) json_object_set_new(sc, k, json_real(1e3 * dlt(a->sum, b->sum) / n));
    MEAN("mean_ttft_ms", ttft_sum, ttft_n);
    MEAN("mean_itl_ms", itl_sum, itl_n);
    MEAN("mean_e2e_ms", e2e_sum, e2e_n);
    MEAN("mean_queue_ms", q_sum, q_n);
#undef MEAN
    json_object_set_new(o, "server_counters_delta", sc);
    if (r->failed) json_object_set_new(o, "first_error", json_string(r->first_error));
    return o;
}

/* gnuplot: output tok/s (left axis) and TTFT / ITL percentiles (right, log) against concurrency. */
static int plot(const char *png, const mr_bench_serve_result *rs, int n, const char *title) {
    char dat[] = "/tmp/moerun-bench-serve-XXXXXX";
    int fd = mkstemp(dat);
    if (fd < 0) return 1;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(dat);
        return 1;
    }
    fprintf(f, "# concurrency out_tok_s ttft_p50 ttft_p99 itl_p50 itl_p99\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "%d %.3f %.3f %.3f %.3f %.3f\n", rs[i].concurrency, rs[i].output_throughput, rs[i].ttft_median,
                rs[i].ttft_p99, rs[i].itl_median, rs[i].itl_p99);
    fclose(f);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", png);
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        unlink(dat);
        return 1;
    }
    fprintf(g,
            "set terminal pngcairo size 1000,600 font ',10'\nset output '%s'\nset title '%s'\n"
            "set xlabel 'concurrency'\nset logscale x 2\nset ylabel 'output tokens/s'\nset y2label 'ms (log)'\n"
            "set logscale y2\nset ytics nomirror\nset y2tics\nset key left top\nset grid\n"
            "plot '%s' u 1:2 w lp lw 2 t 'output tok/s' axes x1y1, '' u 1:3 w lp t 'TTFT p50' axes x1y2,"
            " '' u 1:4 w lp t 'TTFT p99' axes x1y2, '' u 1:5 w lp t 'ITL p50' axes x1y2, '' u 1:6 w lp t 'ITL p99' axes x1y2\n",
            tmp, title, dat);
    int rc = pclose(g);
    unlink(dat);
    if (rc != 0 || rename(tmp, png)) {
        unlink(tmp);
        return 1;
    }
    return 0;
}

/* Checked up front, a sweep being long; a file the check made is removed at once, so that a run that fails
 * leaves none (--json goes through a .tmp renamed at the end; --output-file gets a line per finished run). */
static bool writable(const char *flag, const char *path) {
    if (!path) return true;
    const bool existed = access(path, F_OK) == 0;
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "moerun bench serve: %s %s: %s\n", flag, path, strerror(errno));
        return false;
    }
    fclose(f);
    if (!existed) unlink(path);
    return true;
}

/* One line of --output-file (sglang's JSONL: a run's numbers, appended as it ends); false when it cannot be
 * written whole. */
static bool append_line(const char *path, const json_t *j) {
    char *line = json_dumps(j, JSON_COMPACT);
    FILE *f = line ? fopen(path, "a") : NULL;
    bool ok = f && fprintf(f, "%s\n", line) > 0;
    if (f && fclose(f)) ok = false;
    free(line);
    if (!ok) fprintf(stderr, "moerun bench serve: --output-file %s: cannot append: %s\n", path, strerror(errno));
    return ok;
}

/* The dataset as --json records it: where it came from, what the sampling kept and pruned, and each row's
 * conversation (its index in the file) and lengths, in the order sent. */
static json_t *dataset_json(const mr_bench_dataset *d, const mr_bench_sharegpt_opts *so, long fixed_out) {
    json_t *rows = json_array();
    for (int i = 0; rows && i < d->n; i++)
        json_array_append_new(rows, json_pack("{s:I,s:I,s:I}", "source", (json_int_t)d->rows[i].source, "prompt_len",
                                              (json_int_t)d->rows[i].prompt_len, "output_len",
                                              (json_int_t)d->rows[i].output_len));
    return json_pack("{s:s,s:s,s:I,s:b,s:b,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "name", so->prompts_only ? "random" : "sharegpt", "path",
                     so->path, "seed", (json_int_t)so->seed, "apply_chat_template", so->apply_chat_template,
                     "tokenize_prompt", so->tokenize_prompt, "sharegpt_output_len", (json_int_t)fixed_out, "context_len",
                     (json_int_t)d->context_len, "entries", (json_int_t)d->entries, "usable", (json_int_t)d->usable,
                     "malformed", (json_int_t)d->malformed, "visited", (json_int_t)d->visited, "short_pruned",
                     (json_int_t)d->short_pruned, "long_pruned", (json_int_t)d->long_pruned, "rows", rows);
}

/* sglang's --output-details: each request's lengths, TTFT and ITLs (seconds), text and error, under its keys,
 * in request order; 1 when out of memory. */
static int details_json(json_t *j, const mr_bench_serve_result *r) {
    json_t *in = json_array(), *out = json_array(), *tt = json_array(), *it = json_array(), *tx = json_array(),
           *er = json_array();
    int bad = !in || !out || !tt || !it || !tx || !er;
    for (int i = 0; !bad && i < r->completed + r->failed; i++) {
        const mr_bench_request *q = &r->requests[i];
        json_t *gaps = json_array();
        for (size_t g = 0; gaps && g < q->n_itl; g++) bad |= json_array_append_new(gaps, json_real(q->itl_s[g]));
        bad |= !gaps || json_array_append_new(it, gaps) || json_array_append_new(in, json_integer(q->input_len)) ||
               json_array_append_new(out, json_integer(q->output_len)) ||
               json_array_append_new(tt, json_real(q->ttft_s)) || json_array_append_new(er, json_string(q->error));
        json_t *t = json_stringn(q->text ? q->text : "", q->text_len); /* each event's text was UTF-8 */
        bad |= json_array_append_new(tx, t ? t : json_string("")) != 0;
    }
    bad |= json_object_set_new(j, "input_lens", in) | json_object_set_new(j, "output_lens", out) |
           json_object_set_new(j, "ttfts", tt) | json_object_set_new(j, "itls", it) |
           json_object_set_new(j, "generated_texts", tx) | json_object_set_new(j, "errors", er);
    return bad ? (fprintf(stderr, "moerun bench serve: --output-details: out of memory\n"), 1) : 0;
}

/* A key that can go in a header line as it is: visible ASCII (RFC 9110's token68 and the keys servers issue,
 * which never hold spaces or control characters), not empty, not huge. */
static bool api_key_ok(const char *k) {
    size_t n = 0;
    for (; k[n]; n++)
        if ((unsigned char)k[n] <= 0x20 || (unsigned char)k[n] >= 0x7f || n >= 4096) return false;
    return n > 0;
}

/* The server's root from --base-url: an http(s) URL (HOST:PORT alone: http) without a query or fragment,
 * its trailing slashes dropped, and the "/v1" an OpenAI client's base URL ends with (the bench adds /v1/... itself, and
 * /metrics, /tokenize and /generate live at the root); 1 with the reason printed when it is no such URL. */
static int server_root(const char *url, char *root, size_t cap) {
    const bool bare = !strstr(url, "://"); /* HOST:PORT, as curl takes it: http */
    const size_t n = strlen(url) + (bare ? 7 : 0);
    const char *why = NULL;
    if (!bare && strncasecmp(url, "http://", 7) && strncasecmp(url, "https://", 8))
        why = "is not an http:// or https:// URL";
    else if (n >= cap)
        why = "is too long";
    else if (strpbrk(url, "?#"))
        why = "has a query or a fragment (the bench appends the API's paths to it)";
    for (size_t i = 0; !why && url[i]; i++)
        if ((unsigned char)url[i] <= 0x20 || (unsigned char)url[i] >= 0x7f) why = "holds a space, a control or a non-ASCII byte";
    if (why) {
        fprintf(stderr, "moerun bench serve: --base-url '%.200s' %s\n", url, why);
        return 1;
    }
    snprintf(root, cap, "%s%s", bare ? "http://" : "", url);
    size_t k = n;
    while (k > 8 && root[k - 1] == '/') root[--k] = 0;
    if (k > 10 && !strcmp(root + k - 3, "/v1")) {
        k -= 3;
        root[k] = 0;
        while (k > 8 && root[k - 1] == '/') root[--k] = 0;
        fprintf(stderr, "moerun bench serve: --base-url: %s is taken as the server's root (an OpenAI client's "
                "base URL ends with /v1; the bench adds /v1/... itself)\n", root);
    }
    return 0;
}

/* vLLM's sampling flags: the body field each sets, its range, integer or not. */
static const struct {
    const char *flag, *field;
    double lo, hi;
    bool integer;
} SAMPLING[] = {{"--temperature", "temperature", 0, 1e4, false},      {"--top-p", "top_p", 1e-9, 1, false},
                {"--top-k", "top_k", -1, 1 << 30, true},               {"--min-p", "min_p", 0, 1, false},
                {"--frequency-penalty", "frequency_penalty", -2, 2, false}, {"--presence-penalty", "presence_penalty", -2, 2, false},
                {"--repetition-penalty", "repetition_penalty", 1e-9, 1e4, false}};
enum { N_SAMPLING = sizeof SAMPLING / sizeof SAMPLING[0] };

static int sampling_index(const char *flag) {
    for (int i = 0; i < N_SAMPLING; i++)
        if (!strcmp(flag, SAMPLING[i].flag)) return i;
    return -1;
}

/* A sampling flag's value, checked; 1 with the reason printed. */
static int sampling_value(const char *flag, const char *text, double *d) {
    const int i = sampling_index(flag);
    char *end;
    errno = 0;
    *d = strtod(text, &end);
    if (end == text || *end || errno || !(*d >= SAMPLING[i].lo && *d <= SAMPLING[i].hi) ||
        (SAMPLING[i].integer && *d != floor(*d))) {
        fprintf(stderr, "moerun bench serve: %s '%s': %s in [%g, %g]\n", flag, text,
                SAMPLING[i].integer ? "an integer" : "a number", SAMPLING[i].lo, SAMPLING[i].hi);
        return 1;
    }
    return 0;
}

/* One of vLLM's --goodput values, METRIC:MILLISECONDS (ttft, tpot or e2el, above 0), into o; 1 with the reason
 * printed. */
static int slo_parse(const char *kv, mr_bench_serve_opts *o) {
    const char *c = strchr(kv, ':');
    char *end = NULL;
    const double ms = c ? strtod(c + 1, &end) : 0.0;
    double *slot = !c ? NULL : !strncmp(kv, "ttft:", 5) ? &o->slo_ttft_ms : !strncmp(kv, "tpot:", 5) ? &o->slo_tpot_ms
                             : !strncmp(kv, "e2el:", 5) ? &o->slo_e2el_ms : NULL;
    if (!slot || end == c + 1 || *end || !(ms > 0 && ms < 1e9)) {
        fprintf(stderr, "moerun bench serve: --goodput '%s': METRIC:MS with METRIC ttft, tpot or e2el and MS above 0 "
                "(milliseconds, as vLLM's)\n", kv);
        return 1;
    }
    *slot = ms;
    return 0;
}

/* vLLM's --percentile-metrics (ttft, tpot, itl, e2el) as a mask, and --metric-percentiles into o; 1 with the
 * reason printed. */
enum { PM_TTFT = 1, PM_TPOT = 2, PM_ITL = 4, PM_E2EL = 8 };
static int percentiles_parse(const char *metrics, const char *list, int *mask, mr_bench_serve_opts *o) {
    static const char *NAMES[] = {"ttft", "tpot", "itl", "e2el"};
    *mask = 0;
    for (const char *p = metrics; p && *p;) {
        const size_t n = strcspn(p, ",");
        int k = 0;
        while (k < 4 && (strlen(NAMES[k]) != n || strncmp(p, NAMES[k], n))) k++;
        if (k == 4) {
            fprintf(stderr, "moerun bench serve: --percentile-metrics '%s': a comma list of ttft, tpot, itl, e2el\n", metrics);
            return 1;
        }
        *mask |= 1 << k;
        p += n + (p[n] == ',');
    }
    if (!metrics) *mask = PM_TTFT | PM_TPOT | PM_ITL; /* vLLM's defaults */
    o->n_percentiles = 0;
    for (const char *p = list ? list : "99"; *p;) {
        char *end;
        errno = 0;
        const double q = strtod(p, &end);
        if (end == p || errno || !(q > 0 && q <= 100) || (*end && *end != ',') || o->n_percentiles == MR_BENCH_MAX_PERCENTILES) {
            fprintf(stderr, "moerun bench serve: --metric-percentiles '%s': a comma list of at most %d numbers in (0, 100]\n",
                    list, MR_BENCH_MAX_PERCENTILES);
            return 1;
        }
        o->percentiles[o->n_percentiles++] = q;
        p = *end ? end + 1 : end;
    }
    if (*mask == 0) {
        fprintf(stderr, "moerun bench serve: --percentile-metrics is empty\n");
        return 1;
    }
    return 0;
}

/* vLLM's key for percentile q of a metric: p99, p99.9 */
static void pct_key(char *k, size_t cap, double q, const char *metric) {
    if (q == floor(q)) snprintf(k, cap, "p%d_%s_ms", (int)q, metric);
    else snprintf(k, cap, "p%g_%s_ms", q, metric);
}

/* The table's lines for --metric-percentiles, and their keys in the result's JSON. */
static void percentiles_out(const mr_bench_serve_result *r, const mr_bench_serve_opts *o, int mask, json_t *j) {
    static const char *NAMES[] = {"ttft", "tpot", "itl", "e2el"}, *TITLES[] = {"TTFT", "TPOT", "ITL", "E2EL"};
    const double *v[] = {r->pct_ttft, r->pct_tpot, r->pct_itl, r->pct_e2e};
    if (!j) printf("---------Percentiles (--metric-percentiles)--------\n");
    for (int m = 0; m < 4; m++) {
        if (!(mask & (1 << m))) continue;
        for (int k = 0; k < o->n_percentiles; k++) {
            char key[64], title[64];
            pct_key(key, sizeof key, o->percentiles[k], NAMES[m]);
            snprintf(title, sizeof title, "P%g %s (ms):", o->percentiles[k], TITLES[m]);
            if (j) json_object_set_new(j, key, json_real(v[m][k]));
            else line(title, v[m][k]);
        }
    }
    if (j && (mask & PM_E2EL)) { /* vLLM's names of the E2E latency's summary */
        json_object_set_new(j, "mean_e2el_ms", json_real(r->e2e_mean));
        json_object_set_new(j, "median_e2el_ms", json_real(r->e2e_median));
        json_object_set_new(j, "std_e2el_ms", json_real(r->e2e_std));
    }
}

int mr_cmd_bench_serve(int argc, char **argv) {
    mr_bench_serve_opts o = {.vocab = 1000, .min_id = 10, .seed = 1, .warmup = true, .timeout_s = 600, .input_len = 128,
                             .output_len = 128};
    const char *conc = "1,16,64,128", *json_path = NULL, *plot_path = NULL, *extra_arg = NULL;
    const char *dataset_name = "random", *dataset_path = NULL, *host = NULL, *jsonl_path = NULL;
    const char *key_from = NULL; /* where the API key came from (its value is never printed) */
    int port = 0;
    bool flush = false, random_only = false; /* random_only: an option of the random prompts was given */
    bool chat_tmpl = false, tok_prompt = false; /* --apply-chat-template, --tokenize-prompt */
    bool gsp_sys = false, len_given = false;    /* --gsp-system-prompt-len; a random prompt or output length */
    bool vocab_given = false;
    long gsp_per = 0, gsp_q = 0, gsp_out = 0;   /* the generated-shared-prefix dataset's own */
    /* vLLM's `vllm bench serve` flags */
    bool save_result = false, ignore_eos = false, vllm_prefix = false; /* --random-prefix-len given */
    const char *result_dir = NULL, *result_file = NULL, *pct_metrics = NULL, *pct_list = NULL, *label = NULL;
    bool profile = false;
    const char *profile_dir = ".";
    const char *backend_arg = NULL; /* --backend as given: --save-result's file name starts with it, as vLLM's */
    double samp[N_SAMPLING];                    /* --temperature ...: checked now, sent in each body */
    bool samp_set[N_SAMPLING] = {false};
    int meta_at = 0, meta_n = 0;                /* --metadata KEY=VALUE ...: argv[meta_at ..] */
    long num = 0, sg_out = 0, sg_ctx = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--chat")) {
            o.chat = true;
        } else if (!strcmp(a, "--text-prompts")) {
            o.text_prompts = random_only = true;
        } else if (!strcmp(a, "--no-warmup")) {
            o.warmup = false;
        } else if (!strcmp(a, "--disable-ignore-eos")) {
            o.keep_eos = true;
        } else if (!strcmp(a, "--disable-stream")) {
            o.whole = true;
        } else if (!strcmp(a, "--output-details")) {
            o.details = true;
        } else if (!strcmp(a, "--return-logprob")) {
            o.return_logprob = true;
        } else if (!strcmp(a, "--disable-tqdm")) {
            /* sglang's: no progress bar is drawn here */
        } else if (!strcmp(a, "--apply-chat-template")) {
            chat_tmpl = true;
        } else if (!strcmp(a, "--tokenize-prompt")) {
            tok_prompt = true;
        } else if (!strcmp(a, "--profile")) {
            profile = true;
        } else if (!strcmp(a, "--profile-dir") && i + 1 < argc) {
            profile_dir = argv[++i];
        } else if (!strcmp(a, "--flush-cache")) {
            flush = true;
        } else if (!strcmp(a, "--ignore-eos")) { /* vLLM's: this bench's default already */
            ignore_eos = true;
        } else if (!strcmp(a, "--save-result")) {
            save_result = true;
        } else if (!strcmp(a, "--save-detailed")) { /* vLLM's: each request's numbers in the saved result */
            o.details = true;
        } else if (!v) {
            fprintf(stderr, "moerun bench serve: %s: unknown option or missing value (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "--goodput") || !strcmp(a, "--metadata")) { /* vLLM's: one or more values */
            const bool gp = !strcmp(a, "--goodput");
            if (!gp) meta_at = i + 1, meta_n = 0;
            for (; i + 1 < argc && strncmp(argv[i + 1], "--", 2); i++) {
                if (gp ? slo_parse(argv[i + 1], &o) : !strchr(argv[i + 1], '=') || argv[i + 1][0] == '=') {
                    if (!gp) fprintf(stderr, "moerun bench serve: --metadata %s: KEY=VALUE\n", argv[i + 1]);
                    return 2;
                }
                meta_n += !gp;
            }
            if (gp ? !(o.slo_ttft_ms > 0 || o.slo_tpot_ms > 0 || o.slo_e2el_ms > 0) : meta_n == 0) {
                fprintf(stderr, "moerun bench serve: %s needs %s\n", a, gp ? "ttft:MS, tpot:MS and/or e2el:MS" : "KEY=VALUE ...");
                return 2;
            }
        } else if (!strcmp(a, "--endpoint")) {
            const char *ep = argv[++i];
            if (!strcmp(ep, "/v1/chat/completions")) o.chat = true;
            else if (!strcmp(ep, "/generate")) o.native = true;
            else if (strcmp(ep, "/v1/completions")) {
                fprintf(stderr, "moerun bench serve: --endpoint %s: this bench sends /v1/completions, /v1/chat/completions "
                        "or /generate\n", ep);
                return 2;
            }
        } else if (!strcmp(a, "--result-dir")) {
            result_dir = argv[++i];
        } else if (!strcmp(a, "--result-filename")) {
            result_file = argv[++i];
        } else if (!strcmp(a, "--label")) {
            label = argv[++i];
        } else if (!strcmp(a, "--percentile-metrics")) {
            pct_metrics = argv[++i];
        } else if (!strcmp(a, "--metric-percentiles")) {
            pct_list = argv[++i];
        } else if (!strcmp(a, "--burstiness")) {
            float f;
            if (mr_cli_parse_float(argv[++i], 1e-3f, 1e6f, &f)) {
                fprintf(stderr, "moerun bench serve: --burstiness: %s\n", mr_error_last());
                return 2;
            }
            o.burstiness = (double)f;
        } else if (!strcmp(a, "--num-warmups")) { /* vLLM's name for --warmup-requests */
            if (mr_cli_parse_long(argv[++i], 0, 4096, &x)) {
                fprintf(stderr, "moerun bench serve: --num-warmups: %s\n", mr_error_last());
                return 2;
            }
            o.warmup_requests = (int)x;
            o.warmup = x > 0;
        } else if (!strcmp(a, "--random-prefix-len")) { /* vLLM's: one prefix before every prompt */
            if (mr_cli_parse_long(argv[++i], 0, 1L << 20, &x)) {
                fprintf(stderr, "moerun bench serve: --random-prefix-len: %s\n", mr_error_last());
                return 2;
            }
            o.prefix_len = x, gsp_sys = vllm_prefix = random_only = true;
        } else if (sampling_index(a) >= 0) {
            const int s = sampling_index(a);
            if (sampling_value(a, argv[++i], &samp[s])) return 2;
            samp_set[s] = true;
        } else if (!strcmp(a, "--base-url")) {
            o.base_url = argv[++i];
        } else if (!strcmp(a, "--model")) {
            o.model = argv[++i];
        } else if (!strcmp(a, "--api-key")) {
            o.api_key = argv[++i];
            key_from = "--api-key";
        } else if (!strcmp(a, "--concurrency") || !strcmp(a, "--max-concurrency")) {
            conc = argv[++i];
        } else if (!strcmp(a, "--host")) {
            host = argv[++i];
        } else if (!strcmp(a, "--port")) {
            if (mr_cli_parse_long(argv[++i], 1, 65535, &x)) {
                fprintf(stderr, "moerun bench serve: --port: %s\n", mr_error_last());
                return 2;
            }
            port = (int)x;
        } else if (!strcmp(a, "--backend")) {
            const char *b = backend_arg = argv[++i];
            if (!strcmp(b, "sglang-oai-chat") || !strcmp(b, "vllm-chat") || !strcmp(b, "lmdeploy-chat")) {
                o.chat = true;
            } else if (!strcmp(b, "sglang") || !strcmp(b, "sglang-native")) {
                o.native = true;
            } else if (strcmp(b, "sglang-oai") && strcmp(b, "vllm") && strcmp(b, "lmdeploy")) {
                fprintf(stderr, "moerun bench serve: --backend %s: this bench speaks sglang's /generate (sglang, "
                        "sglang-native) and the OpenAI APIs: sglang-oai, vllm or lmdeploy (/v1/completions), "
                        "sglang-oai-chat, vllm-chat or lmdeploy-chat (/v1/chat/completions)\n", b);
                return 2;
            }
        } else if (!strcmp(a, "--output-file")) {
            jsonl_path = argv[++i];
        } else if (!strcmp(a, "--warmup-requests")) {
            if (mr_cli_parse_long(argv[++i], 0, 4096, &x)) {
                fprintf(stderr, "moerun bench serve: --warmup-requests: %s\n", mr_error_last());
                return 2;
            }
            o.warmup_requests = (int)x;
            o.warmup = x > 0;
        } else if (!strcmp(a, "--json")) {
            json_path = argv[++i];
        } else if (!strcmp(a, "--plot")) {
            plot_path = argv[++i];
        } else if (!strcmp(a, "--tokenizer")) {
            o.tokenizer = argv[++i];
        } else if (!strcmp(a, "--extra-request-body")) {
            extra_arg = argv[++i];
        } else if (!strcmp(a, "--dataset-name")) {
            dataset_name = argv[++i];
            if (!strcmp(dataset_name, "random-ids")) dataset_name = "random"; /* sglang's name for these */
            if (strcmp(dataset_name, "random") && strcmp(dataset_name, "sharegpt") &&
                strcmp(dataset_name, "generated-shared-prefix")) {
                fprintf(stderr, "moerun bench serve: --dataset-name: '%s' is not random (random-ids), sharegpt or "
                        "generated-shared-prefix\n", dataset_name);
                return 2;
            }
        } else if (!strcmp(a, "--dataset-path")) {
            dataset_path = argv[++i];
        } else if (!strcmp(a, "--sharegpt-output-len") || !strcmp(a, "--sharegpt-context-len")) {
            if (mr_cli_parse_long(argv[++i], 2, 1L << 30, &x)) {
                fprintf(stderr, "moerun bench serve: %s: %s\n", a, mr_error_last());
                return 2;
            }
            if (!strcmp(a, "--sharegpt-output-len")) sg_out = x;
            else sg_ctx = x;
        } else if (!strcmp(a, "--request-rate")) {
            float r;
            if (strcmp(v, "inf") && (mr_cli_parse_float(v, 1e-3f, 1e6f, &r) || !(r > 0))) {
                fprintf(stderr, "moerun bench serve: --request-rate: %s (or inf)\n", mr_error_last());
                return 2;
            }
            o.request_rate = strcmp(v, "inf") ? (double)r : 0.0;
            i++;
        } else if (!strcmp(a, "--gsp-system-prompt-len") || !strcmp(a, "--gsp-num-groups")) {
            if (mr_cli_parse_long(argv[++i], !strcmp(a, "--gsp-num-groups") ? 1 : 0, 1L << 20, &x)) {
                fprintf(stderr, "moerun bench serve: %s: %s\n", a, mr_error_last());
                return 2;
            }
            if (!strcmp(a, "--gsp-num-groups")) o.prefix_groups = (int)x;
            else o.prefix_len = x, gsp_sys = true;
            random_only = true;
        } else if (!strcmp(a, "--gsp-prompts-per-group") || !strcmp(a, "--gsp-question-len") ||
                   !strcmp(a, "--gsp-output-len")) {
            if (mr_cli_parse_long(argv[++i], 1, 1L << 20, &x)) {
                fprintf(stderr, "moerun bench serve: %s: %s\n", a, mr_error_last());
                return 2;
            }
            *(!strcmp(a, "--gsp-prompts-per-group") ? &gsp_per : !strcmp(a, "--gsp-question-len") ? &gsp_q : &gsp_out) = x;
        } else if (!strcmp(a, "--random-range-ratio")) {
            float r;
            if (mr_cli_parse_float(argv[++i], 0.0f, 1.0f, &r)) {
                fprintf(stderr, "moerun bench serve: --random-range-ratio: %s\n", mr_error_last());
                return 2;
            }
            o.random_lengths = random_only = true;
            o.range_ratio = (double)r;
        } else if (!strcmp(a, "--random-input-len") || !strcmp(a, "--random-output-len")) { /* sglang's names */
            if (mr_cli_parse_long(argv[++i], 1, 1L << 31, &x)) {
                fprintf(stderr, "moerun bench serve: %s: %s\n", a, mr_error_last());
                return 2;
            }
            if (!strcmp(a, "--random-input-len")) o.input_len = x;
            else o.output_len = x;
            random_only = len_given = true;
        } else if (!strcmp(a, "--num-prompts") || !strcmp(a, "--input-len") || !strcmp(a, "--output-len") ||
                   !strcmp(a, "--vocab") || !strcmp(a, "--seed") || !strcmp(a, "--timeout")) {
            if (mr_cli_parse_long(argv[++i], 1, 1L << 31, &x)) {
                fprintf(stderr, "moerun bench serve: %s: %s\n", a, mr_error_last());
                return 2;
            }
            if (!strcmp(a, "--num-prompts")) num = x;
            else if (!strcmp(a, "--input-len")) o.input_len = x, random_only = len_given = true;
            else if (!strcmp(a, "--output-len")) o.output_len = x, random_only = len_given = true;
            else if (!strcmp(a, "--vocab")) o.vocab = x, random_only = vocab_given = true;
            else if (!strcmp(a, "--seed")) o.seed = (uint64_t)x;
            else o.timeout_s = (double)x;
        } else {
            fprintf(stderr, "moerun bench serve: unknown argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    char hp_url[300];
    if ((host || port) && o.base_url) {
        fprintf(stderr, "moerun bench serve: --base-url, or --host and --port, not both\n");
        return 2;
    }
    if (host || port) { /* sglang's form: http://HOST:PORT, host 127.0.0.1 and port 30000 unless given */
        if (!host) host = "127.0.0.1";
        if (!*host || strlen(host) > 253 || strpbrk(host, "/?#@ ")) {
            fprintf(stderr, "moerun bench serve: --host '%s' is not a host name or address\n", host ? host : "");
            return 2;
        }
        snprintf(hp_url, sizeof hp_url, strchr(host, ':') ? "http://[%s]:%d" : "http://%s:%d", host,
                 port ? port : 30000);
        o.base_url = hp_url;
    }
    if (!o.base_url) {
        fprintf(stderr, "moerun bench serve: --base-url URL (or --host and --port) is required (e.g. "
                "http://127.0.0.1:30000)\n");
        return 2;
    }
    char root[1800];
    if (server_root(o.base_url, root, sizeof root)) return 2;
    o.base_url = root;
    if (o.return_logprob && !o.native) {
        fprintf(stderr, "moerun bench serve: --return-logprob asks sglang's /generate (--backend sglang) for "
                "the output's log-probabilities; the OpenAI routes take logprobs through --extra-request-body\n");
        return 2;
    }
    if (o.native && o.chat) {
        fprintf(stderr, "moerun bench serve: sglang's /generate (--backend sglang) takes no chat messages: drop --chat, or "
                "use --backend sglang-oai-chat\n");
        return 2;
    }
    const bool sharegpt = !strcmp(dataset_name, "sharegpt"), gsp = !strcmp(dataset_name, "generated-shared-prefix");
    /* vLLM's flags beside the rest */
    int pmask = 0;
    const char *clash = ignore_eos && o.keep_eos ? "--ignore-eos and --disable-ignore-eos contradict each other"
                        : (result_dir || result_file) && !save_result ? "--result-dir and --result-filename go with --save-result"
                        : save_result && json_path ? "--save-result and --json both name the result's file: give one"
                        : o.burstiness > 0 && !(o.request_rate > 0) ? "--burstiness shapes the gaps of --request-rate R; "
                                                                      "at the default rate (inf) every request is sent at once"
                        : vllm_prefix && (o.prefix_groups > 1 || gsp || strcmp(dataset_name, "random"))
                            ? "--random-prefix-len puts one prefix before every random prompt: not with --gsp-* or another dataset"
                        : label && !save_result ? "--label names the --save-result file"
                        : strcmp(profile_dir, ".") && !profile ? "--profile-dir says where --profile writes its traces" : NULL;
    for (int k = 0; !clash && k < N_SAMPLING; k++)
        if (samp_set[k] && o.native) clash = "vLLM's sampling flags (--temperature, --top-p, ...) go with the OpenAI routes; "
                                         "/generate's go in --extra-request-body's sampling_params";
    if (clash) {
        fprintf(stderr, "moerun bench serve: %s\n", clash);
        return 2;
    }
    if ((pct_metrics || pct_list) && percentiles_parse(pct_metrics, pct_list, &pmask, &o)) return 2;
    if (!gsp && (gsp_per || gsp_q || gsp_out)) {
        fprintf(stderr, "moerun bench serve: --gsp-prompts-per-group, --gsp-question-len and --gsp-output-len go with "
                "--dataset-name generated-shared-prefix\n");
        return 2;
    }
    if (gsp && (len_given || o.random_lengths || num)) {
        fprintf(stderr, "moerun bench serve: --dataset-name generated-shared-prefix makes --gsp-num-groups x "
                "--gsp-prompts-per-group requests of --gsp-question-len and --gsp-output-len tokens: --num-prompts, "
                "--input-len, --output-len and --random-* do not go with it\n");
        return 2;
    }
    if (gsp) { /* sglang's dataset, its sizes scaled for a CPU server (its own defaults: 64 groups of 16 prompts,
                  2048-token system prompts, 128-token questions, 256-token outputs) */
        o.prefix_groups = o.prefix_groups ? o.prefix_groups : 8;
        o.prompts_per_group = gsp_per ? (int)gsp_per : 8;
        o.prefix_len = gsp_sys ? o.prefix_len : 512;
        o.input_len = gsp_q ? gsp_q : 64;
        o.output_len = gsp_out ? gsp_out : 64;
        if ((long)o.prefix_groups * o.prompts_per_group > 1L << 20) {
            fprintf(stderr, "moerun bench serve: --gsp-num-groups x --gsp-prompts-per-group is above 2^20 requests\n");
            return 2;
        }
        num = (long)o.prefix_groups * o.prompts_per_group;
    }
    if (sharegpt && !dataset_path) {
        fprintf(stderr, "moerun bench serve: --dataset-name sharegpt needs --dataset-path FILE (ShareGPT's JSON, e.g. "
                "ShareGPT_V3_unfiltered_cleaned_split.json; this bench downloads nothing)\n");
        return 2;
    }
    if (!sharegpt && (sg_out || sg_ctx || (dataset_path && gsp))) {
        fprintf(stderr, "moerun bench serve: --sharegpt-* go with --dataset-name sharegpt, --dataset-path with sharegpt "
                "or random\n");
        return 2;
    }
    if (!sharegpt && dataset_path && (vocab_given || o.prefix_len > 0 || o.prefix_groups > 0)) {
        fprintf(stderr, "moerun bench serve: with --dataset-path the random prompts are the file's text: --vocab and "
                "--gsp-* do not go with it\n");
        return 2;
    }
    if (chat_tmpl && (!sharegpt || o.chat || !o.tokenizer)) {
        fprintf(stderr, "moerun bench serve: --apply-chat-template %s\n",
                !sharegpt ? "goes with --dataset-name sharegpt (random prompts are token ids)"
                : o.chat ? "renders prompts for completions or /generate; a chat request is rendered by the server "
                           "already (drop --chat or the chat backend)"
                         : "needs --tokenizer DIR: the model folder whose chat template renders the prompts");
        return 2;
    }
    if (tok_prompt && (o.chat || o.text_prompts)) {
        fprintf(stderr, "moerun bench serve: --tokenize-prompt sends token ids, which %s\n",
                o.chat ? "a chat request does not take" : "--text-prompts asks not to");
        return 2;
    }
    if (sharegpt && random_only) { /* they would be ignored: say so instead */
        fprintf(stderr, "moerun bench serve: --input-len, --output-len, --vocab, --text-prompts, --random-range-ratio "
                "and --gsp-* make random prompts; with --dataset-name sharegpt the dataset gives them "
                "(--sharegpt-output-len fixes the output)\n");
        return 2;
    }
    if (o.vocab <= o.min_id) {
        fprintf(stderr, "moerun bench serve: --vocab must be above %lld\n", (long long)o.min_id);
        return 2;
    }
    if (!o.api_key) { /* sglang's and vLLM's benchmarks read the key there */
        const char *k = getenv("OPENAI_API_KEY");
        if (k && *k) o.api_key = k, key_from = "OPENAI_API_KEY";
    }
    if (o.api_key && !api_key_ok(o.api_key)) {
        fprintf(stderr, "moerun bench serve: %s: %s\n", key_from,
                *o.api_key ? "the key must be visible ASCII characters (no spaces or control characters), at most 4096"
                           : "empty (an unset variable?); leave the option out for a server without a key");
        return 2;
    }
    if (!sharegpt && !dataset_path && !vocab_given && random_vocab(&o)) return 2;
    int cs[64], nc = 0;
    for (const char *p = conc; *p;) {
        char *end;
        errno = 0;
        long c = strtol(p, &end, 10);
        if (end == p || errno || c < 1 || c > 4096 || nc == 64 || (*end && *end != ',')) {
            fprintf(stderr, "moerun bench serve: --concurrency: '%s' is not a comma list of integers in [1, 4096]\n", conc);
            return 2;
        }
        cs[nc++] = (int)c;
        p = *end ? end + 1 : end;
    }
    if (nc == 0) {
        fprintf(stderr, "moerun bench serve: --concurrency is empty\n");
        return 2;
    }
    if (o.prefix_groups < 1) o.prefix_groups = 1; /* the default (one group) made explicit once */
    if (!writable("--json", json_path) || !writable("--output-file", jsonl_path)) return 2;
    if (o.details && !json_path && !jsonl_path && !save_result) {
        fprintf(stderr, "moerun bench serve: --output-details (--save-detailed) goes with --output-file, --json or "
                "--save-result (where they are written)\n");
        return 2;
    }
    char *extra_text = NULL; /* checked here, sent as text: --extra-request-body and vLLM's sampling flags */
    json_t *extra = NULL;
    if (extra_arg) {
        json_error_t je;
        extra = extra_arg[0] == '@' ? json_load_file(extra_arg + 1, 0, &je) : json_loads(extra_arg, 0, &je);
        if (!json_is_object(extra)) {
            fprintf(stderr, "moerun bench serve: --extra-request-body: %s\n",
                    extra ? "not a JSON object" : je.text);
            json_decref(extra);
            return 2;
        }
    }
    for (int k = 0; k < N_SAMPLING; k++) {
        if (!samp_set[k]) continue;
        const double d = samp[k];
        if (!extra && !(extra = json_object())) return 1;
        if (json_object_get(extra, SAMPLING[k].field)) {
            fprintf(stderr, "moerun bench serve: %s and --extra-request-body's \"%s\" both set it: give one\n",
                    SAMPLING[k].flag, SAMPLING[k].field);
            json_decref(extra);
            return 2;
        }
        json_object_set_new(extra, SAMPLING[k].field, SAMPLING[k].integer ? json_integer((json_int_t)d) : json_real(d));
    }
    if (extra) {
        extra_text = json_dumps(extra, JSON_COMPACT);
        json_decref(extra);
        if (!extra_text) return 1;
        o.extra_body = extra_text;
    }
    /* the model id: --model or the first of /v1/models */
    char model[256] = "";
    long http = 0;
    char *body = NULL;
    if (mr_http_get(o.base_url, "/v1/models", o.api_key, 30, &http, &body) || http != 200) {
        if (body && http) /* the status, and what the server said (an empty body says nothing) */
            fprintf(stderr, "moerun bench serve: %s/v1/models: HTTP %ld%s%.300s\n", o.base_url, http, *body ? ": " : "",
                    body);
        else
            fprintf(stderr, "moerun bench serve: %s/v1/models: %s\n", o.base_url, mr_error_last());
        free(body);
        free(extra_text);
        return 1;
    }
    json_error_t je;
    json_t *ms = json_loads(body, 0, &je);
    free(body);
    const char *mid = json_string_value(json_object_get(json_array_get(json_object_get(ms, "data"), 0), "id"));
    snprintf(model, sizeof model, "%s", o.model ? o.model : mid ? mid : "default");
    json_decref(ms);
    o.model = model;
    if (profile && mkdir(profile_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "moerun bench serve: --profile-dir %s: %s\n", profile_dir, strerror(errno));
        free(extra_text);
        return 2;
    }
    char saved[4096]; /* --save-result's file: DIR/NAME, or DIR/LABEL-RATEqps-concurrencyC-MODEL-DATE.json as vLLM names it */
    if (save_result) {
        const char *dir = result_dir ? result_dir : ".";
        if (result_dir && mkdir(result_dir, 0777) && errno != EEXIST) {
            fprintf(stderr, "moerun bench serve: --result-dir %s: %s\n", result_dir, strerror(errno));
            free(extra_text);
            return 2;
        }
        if (result_file) {
            snprintf(saved, sizeof saved, "%s/%s", dir, result_file);
        } else {
            char base[128], cl[128], rate[32], stamp[32];
            const char *slash = strrchr(model, '/');
            snprintf(base, sizeof base, "%s", slash ? slash + 1 : model);
            for (char *c = base; *c; c++)
                if (!(isalnum((unsigned char)*c) || *c == '.' || *c == '-' || *c == '_')) *c = '_';
            snprintf(cl, sizeof cl, "%s", conc);
            for (char *c = cl; *c; c++)
                if (*c == ',') *c = '_';
            if (o.request_rate > 0) snprintf(rate, sizeof rate, "%g", o.request_rate);
            else snprintf(rate, sizeof rate, "inf");
            const time_t now = time(NULL);
            struct tm tmv;
            strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime_r(&now, &tmv));
            snprintf(saved, sizeof saved, "%s/%s-%sqps-concurrency%s-%s-%s.json", dir, label ? label : backend_arg ? backend_arg : backend_name(&o), rate,
                     cl, base, stamp);
        }
        json_path = saved;
        if (strlen(saved) >= sizeof saved - 1 || !writable("--save-result", json_path)) {
            free(extra_text);
            return 2;
        }
    }
    mr_bench_dataset *ds = NULL;
    mr_bench_sharegpt_opts so = {0};
    if (dataset_path) { /* the rows, drawn once for the sweep: the largest run's */
        int maxc = 1;
        for (int k = 0; k < nc; k++) maxc = cs[k] > maxc ? cs[k] : maxc;
        so = (mr_bench_sharegpt_opts){.path = dataset_path, .num = num ? (int)num : (4 * maxc < 16 ? 16 : 4 * maxc),
                                      .seed = o.seed, .fixed_output_len = sg_out, .context_len = sharegpt ? sg_ctx : -1,
                                      .tokenizer = o.tokenizer, .base_url = o.base_url, .api_key = o.api_key,
                                      .apply_chat_template = chat_tmpl, .tokenize_prompt = tok_prompt,
                                      .prompts_only = !sharegpt};
        if (mr_bench_sharegpt_load(&so, &ds)) {
            mr_cli_fail("bench serve", NULL);
            free(extra_text);
            return 1;
        }
    }
    /* what is sent: /generate or completions as ids (random prompts, --tokenize-prompt) or text; or chat */
    const bool ids = sharegpt ? tok_prompt : !o.text_prompts;
    const char *api = o.native ? (ids ? "/generate (input_ids)" : "/generate (text)")
                      : o.chat ? "chat" : ids ? "completions (token ids)" : "completions (text)";
    if (sharegpt) {
        int64_t in = 0, out = 0;
        for (int r = 0; r < ds->n; r++) in += ds->rows[r].prompt_len, out += ds->rows[r].output_len;
        printf("bench serve: %s, model '%s', %s, dataset sharegpt %s%s, concurrency %s\n", o.base_url, model, api,
               dataset_path, chat_tmpl ? " (chat template applied)" : "", conc);
        printf("dataset: %d rows of %d asked (seed %llu), %lld input and %lld output tokens; of the file's %lld "
               "entries %lld have two turns, %lld are malformed; %lld counted, %lld pruned as too short (< 2 tokens), "
               "%lld as longer than the context (%lld%s)\n", ds->n, so.num, (unsigned long long)o.seed, (long long)in,
               (long long)out, (long long)ds->entries, (long long)ds->usable, (long long)ds->malformed,
               (long long)ds->visited, (long long)ds->short_pruned, (long long)ds->long_pruned,
               (long long)ds->context_len, ds->context_len ? "" : ": none");
        o.dataset = ds;
        o.output_len = 1 << 30; /* the rows' own lengths (the warm-up's within 32) */
    } else {
        printf("bench serve: %s, model '%s', %s, input %lld, output %lld tokens, concurrency %s\n", o.base_url, model,
               api, (long long)o.input_len, (long long)o.output_len, conc);
    }
    if (ds && !sharegpt) { /* sglang's random dataset over a file: its first turns' tokens, repeated and cut */
        printf("dataset: random lengths over the first turns of %s: %d rows of %d asked (seed %llu), each's tokens "
               "repeated and cut to its length; of the file's %lld entries %lld have two turns, %lld are malformed, "
               "%lld were empty\n", dataset_path, ds->n, so.num, (unsigned long long)o.seed, (long long)ds->entries,
               (long long)ds->usable, (long long)ds->malformed, (long long)ds->short_pruned);
        o.dataset = ds;
        o.dataset_tokens = true;
    }
    if (key_from) printf("api key: from %s, sent as Authorization: Bearer\n", key_from);
    if (extra_text) printf("extra request body: %.300s%s\n", extra_text, strlen(extra_text) > 300 ? " ..." : "");
    if (o.prefix_len > 0) {
        if (gsp)
            printf("dataset generated-shared-prefix: %d group(s) of %d prompts, each a group's %lld-token system "
                   "prompt before its own %lld-token question, in a shuffled order (--seed)\n", o.prefix_groups,
                   o.prompts_per_group, (long long)o.prefix_len, (long long)o.input_len);
        else
            printf("shared prefixes: %d group(s) of %lld tokens before each prompt's own %lld (request i: group i mod "
                   "%d)\n", o.prefix_groups, (long long)o.prefix_len, (long long)o.input_len, o.prefix_groups);
    }
    mr_bench_serve_result *rs = calloc((size_t)nc, sizeof *rs);
    json_t *all = json_array();
    int rc = 0;
    for (int k = 0; k < nc && rs; k++) {
        o.concurrency = cs[k];
        o.num_prompts = num ? (int)num : (4 * cs[k] < 16 ? 16 : 4 * cs[k]);
        if (ds && !o.dataset_tokens && o.num_prompts > ds->n) o.num_prompts = ds->n; /* a file with fewer rows: all */
        counters a, b;
        bool warm = o.warmup;
        if (warm && mr_bench_serve_warmup(&o)) { /* outside the counters too */
            mr_cli_fail("bench serve", NULL);
            rc = 1;
            break;
        }
        o.warmup = false;
        if (flush && flush_cache(o.base_url, o.api_key)) {
            rc = 1;
            break;
        }
        if (profile && profile_call(o.base_url, o.api_key, false, profile_dir, cs[k])) {
            rc = 1;
            break;
        }
        read_counters(o.base_url, o.api_key, &a);
        mr_status st = mr_bench_serve_run(&o, &rs[k]);
        o.warmup = warm;
        if (profile && profile_call(o.base_url, o.api_key, true, profile_dir, cs[k])) {
            rc = 1;
            break;
        }
        if (st) {
            mr_cli_fail("bench serve", NULL);
            rc = 1;
            break;
        }
        read_counters(o.base_url, o.api_key, &b);
        print_table(&rs[k], &o);
        if (pmask) percentiles_out(&rs[k], &o, pmask, NULL);
        print_server(&a, &b);
        fflush(stdout);
        json_t *j = result_json(&rs[k], &a, &b);
        if (j) {
            if (!ds) {
                json_object_set_new(j, "input_len", json_integer(o.input_len));
                json_object_set_new(j, "output_len", json_integer(o.output_len));
            }
            json_object_set_new(j, "num_prompts", json_integer(o.num_prompts));
            /* sglang writes inf for no rate; JSON has no inf, so null */
            json_object_set_new(j, "request_rate", o.request_rate > 0 ? json_real(o.request_rate) : json_null());
            if (o.request_rate > 0) json_object_set_new(j, "last_arrival_s", json_real(rs[k].last_arrival_s));
            if (o.random_lengths) json_object_set_new(j, "random_range_ratio", json_real(o.range_ratio));
            if (o.prefix_len > 0) {
                json_object_set_new(j, "gsp_system_prompt_len", json_integer(o.prefix_len));
                json_object_set_new(j, "gsp_num_groups", json_integer(o.prefix_groups));
                if (gsp) json_object_set_new(j, "gsp_prompts_per_group", json_integer(o.prompts_per_group));
            }
            json_object_set_new(j, "backend", json_string(backend_name(&o)));
            json_object_set_new(j, "dataset_name", json_string(dataset_name));
            json_object_set_new(j, "ignore_eos", json_boolean(!o.keep_eos));
            json_object_set_new(j, "stream", json_boolean(!o.whole));
            if (pmask) percentiles_out(&rs[k], &o, pmask, j);
            if (o.request_rate > 0) json_object_set_new(j, "burstiness", json_real(o.burstiness > 0 ? o.burstiness : 1.0));
            if (o.slo_ttft_ms > 0 || o.slo_tpot_ms > 0 || o.slo_e2el_ms > 0)
                json_object_set_new(j, "request_goodput", json_real(rs[k].request_goodput));
            if (o.details && details_json(j, &rs[k])) rc = 1;
            if (jsonl_path && !append_line(jsonl_path, j)) rc = 1;
            json_array_append_new(all, j);
        }
        if (rs[k].failed) rc = 1;
        mr_bench_serve_result_free(&rs[k]);
    }
    if (rs && json_array_size(all) > 1) {
        printf("\nsweep: concurrency | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms | failed\n");
        for (size_t k = 0; k < json_array_size(all); k++)
            printf("  %5d | %10.1f | %8.2f / %8.2f | %7.2f / %7.2f | %7.2f | %d\n", rs[k].concurrency,
                   rs[k].output_throughput, rs[k].ttft_median, rs[k].ttft_p99, rs[k].itl_median, rs[k].itl_p99,
                   rs[k].tpot_median, rs[k].failed);
    }
    if (json_path && all) {
        json_t *doc = json_pack("{s:s,s:s,s:s,s:s,s:O}", "bench", "serve", "base_url", o.base_url, "model", model,
                                "backend", backend_name(&o), "results", all);
        if (doc && ds) {
            json_object_set_new(doc, "dataset", dataset_json(ds, &so, sg_out));
        } else if (doc) {
            json_object_set_new(doc, "input_len", json_integer(o.input_len));
            json_object_set_new(doc, "output_len", json_integer(o.output_len));
        }
        if (doc && extra_text) json_object_set_new(doc, "extra_request_body", json_loads(extra_text, 0, NULL));
        if (doc && label) json_object_set_new(doc, "label", json_string(label));
        if (doc && meta_n) { /* vLLM's --metadata KEY=VALUE, as strings */
            json_t *md = json_object();
            for (int q = 0; md && q < meta_n; q++) {
                const char *kv = argv[meta_at + q], *eq = strchr(kv, '=');
                char key[256];
                snprintf(key, sizeof key, "%.*s", (int)(eq - kv < 255 ? eq - kv : 255), kv);
                json_object_set_new(md, key, json_string(eq + 1));
            }
            json_object_set_new(doc, "metadata", md);
        }
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", json_path);
        if (!doc || json_dump_file(doc, tmp, JSON_INDENT(2)) || rename(tmp, json_path)) {
            fprintf(stderr, "moerun bench serve: cannot write %s\n", json_path);
            unlink(tmp);
            rc = 1;
        }
        json_decref(doc);
    }
    if (plot_path && rs) {
        char title[400];
        if (ds)
            snprintf(title, sizeof title, "moerun bench serve: %s, sharegpt (%d rows)", model, ds->n);
        else
            snprintf(title, sizeof title, "moerun bench serve: %s, in %lld / out %lld tokens", model,
                     (long long)o.input_len, (long long)o.output_len);
        for (char *p = title; *p; p++)
            if (*p == '\'') *p = ' ';
        if (plot(plot_path, rs, (int)json_array_size(all), title)) {
            fprintf(stderr, "moerun bench serve: gnuplot could not write %s\n", plot_path);
            rc = 1;
        } else {
            printf("plot: %s\n", plot_path);
        }
    }
    json_decref(all);
    free(rs);
    free(extra_text);
    mr_bench_dataset_free(ds);
    return rc;
}
