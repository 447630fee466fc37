/* metrics.c — the server's counters, gauges and histograms, and their
 * Prometheus text exposition (format 0.0.4). Names follow vLLM's with the
 * prefix "moerun:" (serving.md section 5); every series carries the label
 * model_name. The engine thread and the HTTP threads update them under mu;
 * /metrics renders a consistent snapshot under the same lock. */
#include <stdio.h>
#include <string.h>

#include "serve/serve_internal.h"

/* Bucket bounds in seconds (chosen to cover a tiny CPU model's sub-ms steps
 * and a large model's multi-second prefills). */
static const double b_ttft[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
static const double b_itl[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                               0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0};
static const double b_e2e[] = {0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0,
                               10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0};

/* tokens: vLLM's 1-2-5 series for the request lengths, its batch sizes for a step's tokens */
static const double b_len[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
                               200000, 500000, 1000000};
static const double b_iter[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

#define NB(a) ((int)(sizeof(a) / sizeof((a)[0])))
_Static_assert(NB(b_ttft) <= SV_HIST_MAX_BUCKETS && NB(b_itl) <= SV_HIST_MAX_BUCKETS &&
                   NB(b_e2e) <= SV_HIST_MAX_BUCKETS && NB(b_len) <= SV_HIST_MAX_BUCKETS &&
                   NB(b_iter) <= SV_HIST_MAX_BUCKETS, "histogram bucket tables fit sv_hist");

void sv_metrics_init(sv_metrics *m, const char *model_name) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    /* a label value: no quotes, backslashes or newlines */
    size_t j = 0;
    for (size_t i = 0; model_name[i] && j + 1 < sizeof m->model_name; i++) {
        char c = model_name[i];
        m->model_name[j++] = (c == '"' || c == '\\' || c == '\n') ? '_' : c;
    }
    m->model_name[j] = 0;
    m->ttft = (sv_hist){.n = NB(b_ttft), .le = b_ttft};
    m->itl = (sv_hist){.n = NB(b_itl), .le = b_itl};
    m->e2e = (sv_hist){.n = NB(b_e2e), .le = b_e2e};
    m->queue = (sv_hist){.n = NB(b_e2e), .le = b_e2e};
    m->prefill = m->decode = m->inference = m->queue;
    m->prompt_len = (sv_hist){.n = NB(b_len), .le = b_len};
    m->gen_len = m->prompt_len;
    m->iter = (sv_hist){.n = NB(b_iter), .le = b_iter};
}

void sv_metrics_free(sv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void sv_hist_observe(sv_hist *h, double v) {
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

static void hist(sv_buf *b, const char *mn, const char *name, const char *help, const sv_hist *h) {
    sv_buf_printf(b, "# HELP moerun:%s %s\n# TYPE moerun:%s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->count[i];
        sv_buf_printf(b, "moerun:%s_bucket{model_name=\"%s\",le=\"%g\"} %llu\n", name, mn, h->le[i],
                      (unsigned long long)cum);
    }
    cum += h->count[h->n];
    sv_buf_printf(b, "moerun:%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", name, mn, (unsigned long long)cum);
    sv_buf_printf(b, "moerun:%s_sum{model_name=\"%s\"} %.9g\n", name, mn, h->sum);
    sv_buf_printf(b, "moerun:%s_count{model_name=\"%s\"} %llu\n", name, mn, (unsigned long long)h->total);
}

static void one(sv_buf *b, const char *mn, const char *type, const char *name, const char *help, double v) {
    sv_buf_printf(b, "# HELP moerun:%s %s\n# TYPE moerun:%s %s\nmoerun:%s{model_name=\"%s\"} %.17g\n", name, help,
                  name, type, name, mn, v);
}

char *sv_metrics_render(sv_metrics *m) {
    sv_buf b = {0};
    static const char *const fr[SV_FR_COUNT] = {"stop", "length", "abort", "error"};
    pthread_mutex_lock(&m->mu);
    const char *mn = m->model_name;
    one(&b, mn, "gauge", "num_requests_running", "Requests in the engine's running batch.", (double)m->running);
    one(&b, mn, "gauge", "num_requests_waiting", "Requests admitted and waiting for a slot.", (double)m->waiting);
    one(&b, mn, "gauge", "kv_cache_usage_perc", "Fraction of the KV cache in use (0 to 1).", m->kv_usage);
    one(&b, mn, "gauge", "kv_cache_used_blocks", "KV cache blocks referenced by requests.", (double)m->kv_used_blocks);
    one(&b, mn, "gauge", "kv_cache_total_blocks", "KV cache blocks in the pool.", (double)m->kv_total_blocks);
    one(&b, mn, "counter", "prompt_tokens_total", "Prompt tokens processed (prefill).", (double)m->prompt_tokens);
    one(&b, mn, "counter", "generation_tokens_total", "Tokens generated.", (double)m->generation_tokens);
    sv_buf_printf(&b, "# HELP moerun:request_success_total Finished requests by finish reason.\n"
                      "# TYPE moerun:request_success_total counter\n");
    for (int i = 0; i < SV_FR_COUNT; i++)
        sv_buf_printf(&b, "moerun:request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %llu\n", mn, fr[i],
                      (unsigned long long)m->success[i]);
    one(&b, mn, "counter", "num_preemptions_total", "Requests preempted (recomputed later).", (double)m->preemptions);
    one(&b, mn, "counter", "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
        (double)m->prefix_queries);
    one(&b, mn, "counter", "prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", (double)m->prefix_hits);
    sv_buf_printf(&b, "# HELP moerun:request_rejected_total Requests refused before admission.\n"
                      "# TYPE moerun:request_rejected_total counter\n"
                      "moerun:request_rejected_total{model_name=\"%s\",reason=\"queue_full\"} %llu\n"
                      "moerun:request_rejected_total{model_name=\"%s\",reason=\"draining\"} %llu\n"
                      "moerun:request_rejected_total{model_name=\"%s\",reason=\"invalid\"} %llu\n",
                  mn, (unsigned long long)m->rejected_queue_full, mn, (unsigned long long)m->rejected_draining, mn,
                  (unsigned long long)m->bad_requests);
    static const char *const api[SV_API_COUNT] = {"completions", "chat_completions", "responses", "messages", "generate", "score"};
    sv_buf_printf(&b, "# HELP moerun:requests_total Requests admitted, by the API they came through.\n"
                      "# TYPE moerun:requests_total counter\n");
    for (int i = 0; i < SV_API_COUNT; i++)
        sv_buf_printf(&b, "moerun:requests_total{model_name=\"%s\",api=\"%s\"} %llu\n", mn, api[i],
                      (unsigned long long)m->by_api[i]);
    one(&b, mn, "counter", "client_disconnects_total", "Requests whose client went away before the end.",
        (double)m->disconnects);
    one(&b, mn, "counter", "weight_updates_total", "New weights swapped in (/update_weights_from_disk).",
        (double)m->weight_updates);
    one(&b, mn, "gauge", "generation_paused", "1 while generation is paused (/pause_generation, /pause).",
        (double)m->paused);
    one(&b, mn, "counter", "engine_steps_total", "Engine steps that ran a batch through the model.", (double)m->steps);
    static const char *const phase[4] = {"schedule", "forward", "sample", "complete"};
    sv_buf_printf(&b, "# HELP moerun:engine_step_seconds_total Time of those steps by phase: scheduling, the forward "
                      "pass, sampling (masks, penalties, filters, log-probabilities), the rest of completing them.\n"
                      "# TYPE moerun:engine_step_seconds_total counter\n");
    for (int i = 0; i < 4; i++)
        sv_buf_printf(&b, "moerun:engine_step_seconds_total{model_name=\"%s\",phase=\"%s\"} %.9f\n", mn, phase[i],
                      (double)m->step_ns[i] * 1e-9);
    if (m->stored_cap) {
        one(&b, mn, "gauge", "responses_stored", "Responses kept for previous_response_id and GET /v1/responses/{id}.",
            (double)m->stored);
        one(&b, mn, "gauge", "responses_store_bytes", "Bytes the stored responses take (the bound: --response-store-mb).",
            (double)m->stored_bytes);
        one(&b, mn, "counter", "responses_evicted_total", "Stored responses dropped, least recently used first, to stay "
            "within the bound.", (double)m->stored_evicted);
    }
    if (m->convs_cap) {
        one(&b, mn, "gauge", "conversations_stored", "Conversations of the Conversations API.", (double)m->convs);
        one(&b, mn, "gauge", "conversations_store_bytes", "Bytes the conversations take (the bound: "
            "--conversation-store-mb; never evicted).", (double)m->convs_bytes);
    }
    hist(&b, mn, "time_to_first_token_seconds", "Arrival to first generated token.", &m->ttft);
    hist(&b, mn, "inter_token_latency_seconds", "Time between consecutive tokens of a request.", &m->itl);
    hist(&b, mn, "e2e_request_latency_seconds", "Arrival to last token.", &m->e2e);
    hist(&b, mn, "request_queue_time_seconds", "Arrival to first scheduled.", &m->queue);
    hist(&b, mn, "request_prefill_time_seconds", "First scheduled to first token.", &m->prefill);
    hist(&b, mn, "request_decode_time_seconds", "First token to last token.", &m->decode);
    hist(&b, mn, "request_inference_time_seconds", "First scheduled to last token.", &m->inference);
    hist(&b, mn, "request_prompt_tokens", "Prompt tokens of a finished request.", &m->prompt_len);
    hist(&b, mn, "request_generation_tokens", "Tokens generated by a finished request.", &m->gen_len);
    hist(&b, mn, "iteration_tokens_total", "Tokens (prefill and decode) in one engine step.", &m->iter);
    pthread_mutex_unlock(&m->mu);
    if (!b.p) return NULL;
    return b.p; /* sv_buf_printf failures leave a shorter text; an empty one is NULL */
}
