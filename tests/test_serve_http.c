/* test_serve_http.c — `moerun serve` end to end over HTTP (libcurl, as a
 * client would): the binary is started on a free loopback port with the
 * committed tiny model, and every answer is parsed as JSON.
 *
 * Oracles: token ids come from an in-process greedy run of the same
 * checkpoint through mr_model_forward, one prompt alone (so a server answer
 * that depends on what else is in its batch, or on the HTTP path, differs);
 * usage and /metrics counters against the counts the test itself made;
 * the event grammar of serving.md section 2; the error shape of section 3. */
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moerun/model.h"
#include "serve_testutil.h"

static char g_model[4096]; /* a copy of the tiny model */

/* ---- the oracle: greedy tokens of one prompt alone ---- */

/* Up to n_new greedy tokens, ending early at an EOS id of the model (which is
 * generated and counted) unless ignore_eos; *n_out their number. */
static int32_t *oracle_eos(const int32_t *prompt, int n_prompt, int n_new, bool ignore_eos, int *n_out) {
    mr_model_opts mo = {.max_batch = 1, .max_ctx = n_prompt + n_new + 1, .runner = "routed"};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(g_model, &mo, &m), MR_OK);
    int64_t V = mr_model_config_of(m)->vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    int32_t *out = malloc((size_t)n_new * sizeof(int32_t));
    int seq = 0;
    int64_t nt = n_prompt;
    mr_batch b = {.n_seq = 1, .seq = &seq, .n_tok = &nt, .tokens = prompt};
    *n_out = n_new;
    for (int i = 0; i < n_new; i++) {
        assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
        out[i] = mr_argmax(lg, V);
        nt = 1;
        b.tokens = &out[i];
        if (!ignore_eos && mr_model_is_eos(m, out[i])) {
            *n_out = i + 1;
            break;
        }
    }
    free(lg);
    mr_model_close(m);
    return out;
}

/* Exactly n_new greedy tokens (the requests that use it set ignore_eos). */
static int32_t *oracle(const int32_t *prompt, int n_prompt, int n_new) {
    int n;
    return oracle_eos(prompt, n_prompt, n_new, true, &n);
}

/* Greedy with the engine's penalties applied by the test itself (engine.h:
 * repetition over prompt and output, a positive logit divided, a negative one
 * multiplied; then logit -= frequency * count + presence * (count > 0) over
 * the output). lsm, when not NULL, gets log-softmax of the raw logits of every
 * step, [n_new][V]. */
static int32_t *oracle_pen(const int32_t *prompt, int n_prompt, int n_new, float presence, float frequency,
                           float repetition, double *lsm) {
    mr_model_opts mo = {.max_batch = 1, .max_ctx = n_prompt + n_new + 1, .runner = "routed"};
    mr_model *m = NULL;
    assert_int_equal(mr_model_open(g_model, &mo, &m), MR_OK);
    int64_t V = mr_model_config_of(m)->vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    int *count = calloc((size_t)V, sizeof(int));
    bool *in_prompt = calloc((size_t)V, sizeof(bool));
    int32_t *out = malloc((size_t)n_new * sizeof(int32_t));
    for (int i = 0; i < n_prompt; i++) in_prompt[prompt[i]] = true;
    int seq = 0;
    int64_t nt = n_prompt;
    mr_batch b = {.n_seq = 1, .seq = &seq, .n_tok = &nt, .tokens = prompt};
    for (int i = 0; i < n_new; i++) {
        assert_int_equal(mr_model_forward(m, &b, lg), MR_OK);
        if (lsm) {
            double mx = -INFINITY, z = 0;
            for (int64_t v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
            for (int64_t v = 0; v < V; v++) z += exp((double)lg[v] - mx);
            for (int64_t v = 0; v < V; v++) lsm[(size_t)i * (size_t)V + (size_t)v] = (double)lg[v] - mx - log(z);
        }
        for (int64_t v = 0; v < V; v++) {
            if (repetition != 1.0f && (in_prompt[v] || count[v]))
                lg[v] = lg[v] > 0 ? lg[v] / repetition : lg[v] * repetition;
            if (count[v]) lg[v] -= frequency * (float)count[v] + presence;
        }
        out[i] = mr_argmax(lg, V);
        count[out[i]]++;
        nt = 1;
        b.tokens = &out[i];
    }
    free(lg);
    free(count);
    free(in_prompt);
    mr_model_close(m);
    return out;
}

static void prompt_of(int k, int32_t *p, int *n) {
    *n = 3 + k % 7;
    for (int i = 0; i < *n; i++) p[i] = (int32_t)(4 + (k * 37 + i * 11) % 250);
}

static char *ids_json(const int32_t *p, int n) {
    sv_buf b = {0};
    sv_buf_lit(&b, "[");
    for (int i = 0; i < n; i++) sv_buf_printf(&b, "%s%d", i ? "," : "", p[i]);
    sv_buf_lit(&b, "]");
    return b.p;
}

static void check_ids(const json_t *arr, const int32_t *want, int n) {
    assert_true(json_is_array(arr));
    if ((int)json_array_size(arr) != n) fprintf(stderr, "got %zu ids, want %d\n", json_array_size(arr), n);
    assert_int_equal(json_array_size(arr), n);
    for (int i = 0; i < n; i++) {
        if (json_integer_value(json_array_get(arr, (size_t)i)) != want[i])
            fprintf(stderr, "token %d: got %lld want %d\n", i, (long long)json_integer_value(json_array_get(arr, (size_t)i)),
                    want[i]);
        assert_int_equal(json_integer_value(json_array_get(arr, (size_t)i)), want[i]);
    }
}

/* ---- streams ---- */
typedef struct {
    sv_buf line;
    int n_events, n_tokens, n_done, bad;
    json_t *tokens;      /* all token ids in order */
    json_t *last_choice; /* the last event with a choice */
    json_t *usage;       /* the usage event */
    bool usage_null_seen;
    int after_done;
    char err[256];
} stream;

static void stream_line(stream *s, const char *l, size_t n) {
    if (n == 0) return;
    if (n < 6 || memcmp(l, "data: ", 6)) {
        s->bad++;
        snprintf(s->err, sizeof s->err, "not an SSE data line: %.80s", l);
        return;
    }
    if (s->n_done) s->after_done++;
    if (n == 12 && !memcmp(l + 6, "[DONE]", 6)) {
        s->n_done++;
        return;
    }
    json_error_t je;
    json_t *ev = json_loadb(l + 6, n - 6, 0, &je);
    if (!ev) {
        s->bad++;
        snprintf(s->err, sizeof s->err, "event is not one JSON object: %s", je.text);
        return;
    }
    s->n_events++;
    json_t *ch = json_object_get(ev, "choices");
    if (json_array_size(ch) == 0) {
        if (s->usage) s->bad++;
        s->usage = json_incref(json_object_get(ev, "usage"));
    } else {
        json_t *c0 = json_array_get(ch, 0);
        json_t *ids = json_object_get(c0, "token_ids");
        if (ids) {
            if (json_array_size(ids) != 1) s->bad++; /* one token per event */
            json_array_extend(s->tokens, ids);
            s->n_tokens++;
        }
        if (json_is_null(json_object_get(ev, "usage"))) s->usage_null_seen = true;
        json_decref(s->last_choice);
        s->last_choice = json_incref(c0);
    }
    json_decref(ev);
}

static size_t stream_sink(char *p, size_t sz, size_t nm, void *ud) {
    stream *s = ud;
    for (size_t i = 0; i < sz * nm; i++) {
        if (p[i] == '\n') {
            stream_line(s, s->line.p ? s->line.p : "", s->line.len);
            s->line.len = 0;
        } else {
            sv_buf_add(&s->line, p + i, 1);
        }
    }
    return sz * nm;
}

static void stream_init(stream *s) {
    memset(s, 0, sizeof *s);
    s->tokens = json_array();
}
static void stream_free(stream *s) {
    sv_buf_free(&s->line);
    json_decref(s->tokens);
    json_decref(s->last_choice);
    json_decref(s->usage);
}

static CURL *stream_handle(const char *body, stream *s, struct curl_slist **hd) {
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "%s/v1/completions", g_srv.url);
    *hd = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hd);
    curl_easy_setopt(h, CURLOPT_COPYPOSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stream_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    return h;
}

/* ---- the cases ---- */

static void test_health_models_metrics(void **st) {
    (void)st;
    long code;
    json_t *j = http_json(g_srv.url, "/health", NULL, &code);
    assert_int_equal(code, 200);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
    j = http_json(g_srv.url, "/v1/models", NULL, &code);
    assert_int_equal(code, 200);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    json_t *d = json_object_get(j, "data");
    assert_int_equal(json_array_size(d), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(d, 0), "id")), "tiny-test");
    json_decref(j);
    j = http_json(g_srv.url, "/v1/models/tiny-test", NULL, &code);
    assert_int_equal(code, 200);
    json_decref(j);
    expect_error("/v1/models/other", NULL, 404, "not_found_error", "model", "does not exist");
    char *t = NULL;
    assert_int_equal(http(g_srv.url, "/metrics", NULL, &t), 200);
    assert_non_null(strstr(t, "moerun:num_requests_running{model_name=\"tiny-test\"}"));
    free(t);
}

static void test_completions_match_oracle(void **st) {
    (void)st;
    for (int k = 0; k < 4; k++) {
        int32_t p[16];
        int n;
        prompt_of(k, p, &n);
        int32_t *want = oracle(p, n, 12);
        char *ids = ids_json(p, n);
        char body[1024];
        snprintf(body, sizeof body, "{\"model\":\"tiny-test\",\"prompt\":%s,\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}", ids);
        long code;
        json_t *j = http_json(g_srv.url, "/v1/completions", body, &code);
        assert_int_equal(code, 200);
        assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        check_ids(json_object_get(c0, "token_ids"), want, 12);
        assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
        json_t *u = json_object_get(j, "usage");
        assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), n);
        assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 12);
        assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), n + 12);
        json_decref(j);
        free(ids);
        free(want);
    }
}

static void test_stream_grammar_and_usage(void **st) {
    (void)st;
    int32_t p[16];
    int n;
    prompt_of(5, p, &n);
    int32_t *want = oracle(p, n, 20);
    char *ids = ids_json(p, n);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":20,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             ids);
    stream s;
    stream_init(&s);
    struct curl_slist *hd;
    CURL *h = stream_handle(body, &s, &hd);
    assert_int_equal(curl_easy_perform(h), CURLE_OK);
    long code;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    char *ct = NULL;
    curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
    assert_int_equal(code, 200);
    assert_non_null(ct);
    assert_non_null(strstr(ct, "text/event-stream"));
    if (s.bad) fprintf(stderr, "%s\n", s.err);
    assert_int_equal(s.bad, 0);
    assert_int_equal(s.n_tokens, 20); /* one token per event */
    check_ids(s.tokens, want, 20);
    assert_int_equal(s.n_done, 1);
    assert_int_equal(s.after_done, 0); /* [DONE] is last */
    assert_true(s.usage_null_seen);
    assert_string_equal(json_string_value(json_object_get(s.last_choice, "finish_reason")), "length");
    assert_non_null(s.usage);
    assert_int_equal(json_integer_value(json_object_get(s.usage, "completion_tokens")), 20);
    assert_int_equal(json_integer_value(json_object_get(s.usage, "prompt_tokens")), n);
    assert_non_null(json_object_get(json_object_get(s.usage, "prompt_tokens_details"), "cached_tokens"));
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    stream_free(&s);
    free(ids);
    free(want);
}

/* 24 streams at once, of different prompts and lengths: each equals its prompt alone. */
static void test_concurrent_streams(void **st) {
    (void)st;
    enum { N = 24 };
    stream s[N];
    struct curl_slist *hd[N];
    int32_t *want[N];
    int len[N];
    CURLM *mh = curl_multi_init();
    for (int k = 0; k < N; k++) {
        int32_t p[16];
        int n;
        prompt_of(100 + k, p, &n);
        int max = 5 + (k * 7) % 23;
        want[k] = oracle_eos(p, n, max, k % 2, &len[k]); /* odd: ignore_eos; even: EOS stops */
        char *ids = ids_json(p, n);
        char body[1024];
        snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"stream\":true,\"ignore_eos\":%s}",
                 ids, max, k % 2 ? "true" : "false");
        free(ids);
        stream_init(&s[k]);
        curl_multi_add_handle(mh, stream_handle(body, &s[k], &hd[k]));
    }
    int running = 1;
    while (running) {
        curl_multi_perform(mh, &running);
        if (running) curl_multi_poll(mh, NULL, 0, 100, NULL);
    }
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(mh, &left))) {
        assert_int_equal(m->data.result, CURLE_OK);
        curl_multi_remove_handle(mh, m->easy_handle);
        curl_easy_cleanup(m->easy_handle);
    }
    curl_multi_cleanup(mh);
    for (int k = 0; k < N; k++) {
        assert_int_equal(s[k].bad, 0);
        check_ids(s[k].tokens, want[k], len[k]);
        stream_free(&s[k]);
        curl_slist_free_all(hd[k]);
        free(want[k]);
    }
}

static json_t *complete(const char *body) {
    long code;
    json_t *j = http_json(g_srv.url, "/v1/completions", body, &code);
    if (code != 200) {
        char *d = j ? json_dumps(j, 0) : NULL;
        fprintf(stderr, "%s -> %ld %s\n", body, code, d ? d : "");
        free(d);
    }
    assert_int_equal(code, 200);
    return j;
}

static json_t *choice_ids(json_t *j, size_t i) {
    return json_object_get(json_array_get(json_object_get(j, "choices"), i), "token_ids");
}

static void test_sampling_seed_and_n(void **st) {
    (void)st;
    const char *b1 = "{\"prompt\":[5,6,7],\"max_tokens\":16,\"temperature\":1.0,\"seed\":42,\"n\":3}";
    json_t *a = complete(b1), *b = complete(b1);
    json_t *c = complete("{\"prompt\":[5,6,7],\"max_tokens\":16,\"temperature\":1.0,\"seed\":43,\"n\":3}");
    assert_int_equal(json_array_size(json_object_get(a, "choices")), 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(a, "choices"), i), "index")),
                         (json_int_t)i);
        assert_true(json_equal(choice_ids(a, i), choice_ids(b, i))); /* same seed, same tokens */
    }
    assert_false(json_equal(choice_ids(a, 0), choice_ids(a, 1))); /* choices differ */
    assert_false(json_equal(choice_ids(a, 0), choice_ids(c, 0))); /* another seed, other tokens */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "usage"), "completion_tokens")), 48);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "usage"), "prompt_tokens")), 3);
    json_decref(a);
    json_decref(b);
    json_decref(c);
    /* a batch of prompts: one choice each, in order */
    json_t *d = complete("{\"prompt\":[[5,6,7],[8,9]],\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true}");
    int32_t p1[] = {5, 6, 7}, p2[] = {8, 9};
    int32_t *w1 = oracle(p1, 3, 4), *w2 = oracle(p2, 2, 4);
    check_ids(choice_ids(d, 0), w1, 4);
    check_ids(choice_ids(d, 1), w2, 4);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(d, "usage"), "prompt_tokens")), 5);
    free(w1);
    free(w2);
    json_decref(d);
    /* seeded sampling of a list of prompts: each prompt's choice k as that prompt alone with the seed (choice
     * k: seed + k, as vLLM); without a seed the same prompt twice samples twice */
    json_t *l = complete("{\"prompt\":[[5,6,7],[8,9]],\"max_tokens\":16,\"temperature\":1.0,\"seed\":42,\"n\":2}");
    json_t *l1 = complete("{\"prompt\":[8,9],\"max_tokens\":16,\"temperature\":1.0,\"seed\":42,\"n\":2}");
    json_t *l0 = complete("{\"prompt\":[5,6,7],\"max_tokens\":16,\"temperature\":1.0,\"seed\":42,\"n\":2}");
    for (size_t k = 0; k < 2; k++) {
        assert_true(json_equal(choice_ids(l, k), choice_ids(l0, k)));
        assert_true(json_equal(choice_ids(l, 2 + k), choice_ids(l1, k)));
    }
    json_t *u = complete("{\"prompt\":[[5,6,7],[5,6,7]],\"max_tokens\":16,\"temperature\":1.0}");
    assert_false(json_equal(choice_ids(u, 0), choice_ids(u, 1)));
    json_decref(l), json_decref(l1), json_decref(l0), json_decref(u);
}

static void test_stop_ids_and_eos(void **st) {
    (void)st;
    int32_t p[] = {11, 12, 13, 14};
    int32_t *w = oracle(p, 4, 10);
    /* the first token equal to w[3] ends the completion, and is counted */
    int first = 0;
    while (w[first] != w[3]) first++;
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":[11,12,13,14],\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true,\"stop_token_ids\":[%d]}",
             w[3]);
    json_t *j = complete(body);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    check_ids(json_object_get(c0, "token_ids"), w, first + 1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), first + 1);
    json_decref(j);
    free(w);
}

/* A second server whose generation_config names the oracle's 3rd token as EOS. */
static void test_eos_and_ignore_eos(void **st) {
    (void)st;
    int32_t p[] = {21, 22, 23};
    int32_t *w = oracle(p, 3, 8);
    int first = 0;
    while (w[first] != w[2]) first++;
    char dir[4200], cmd[13000];
    snprintf(dir, sizeof dir, "%s/eos_model", g_dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, g_model, dir);
    assert_int_equal(system(cmd), 0);
    char gc[128];
    snprintf(gc, sizeof gc, "{\"eos_token_id\": [%d]}\n", w[2]);
    char path[4300];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    assert_int_equal(tu_write_file(path, gc, strlen(gc)), 0);
    snprintf(path, sizeof path, "%s/config.json", dir); /* config.json's eos too */
    char *cfg = read_text(path);
    char *e = strstr(cfg, "\"eos_token_id\": 2");
    assert_non_null(e);
    char fixed[8192];
    snprintf(fixed, sizeof fixed, "%.*s\"eos_token_id\": %d%s", (int)(e - cfg), cfg, w[2], e + strlen("\"eos_token_id\": 2"));
    assert_int_equal(tu_write_file(path, fixed, strlen(fixed)), 0);
    free(cfg);
    server s2;
    const char *args[] = {"--model", dir, "--context-length", "256", "--kv-cache-dtype", "fp32", "--skip-self-check", NULL};
    assert_int_equal(srv_start(&s2, args), 0);
    server saved = g_srv;
    g_srv = s2;
    json_t *j = complete("{\"prompt\":[21,22,23],\"max_tokens\":8,\"temperature\":0}");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    check_ids(json_object_get(c0, "token_ids"), w, first + 1);
    json_decref(j);
    j = complete("{\"prompt\":[21,22,23],\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}");
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
    check_ids(json_object_get(c0, "token_ids"), w, 8);
    json_decref(j);
    g_srv = saved;
    assert_int_equal(srv_stop(&s2), 0);
    free(w);
}

static void test_errors(void **st) {
    (void)st;
    expect_error("/v1/completions", "{\"prompt\":[1,2", 400, "invalid_request_error", NULL, "not valid JSON");
    /* valid JSON with a NUL in a string: refused saying so (not in jansson's words) */
    expect_error("/v1/completions", "{\"prompt\":[1,2],\"user\":\"a\\u0000b\"}", 400, "invalid_request_error", NULL,
                 "holds \\u0000 (NUL)");
    expect_error("/v1/completions", "{\"prompt\":[1,2],\"max_tokens\":\"x\"}", 400, "invalid_request_error", "max_tokens",
                 "integer");
    expect_error("/v1/completions", "{\"prompt\":[1,2],\"bogus\":1}", 400, "invalid_request_error", "bogus", "unknown");
    expect_error("/v1/completions", "{\"prompt\":[1,2],\"model\":\"gpt-4\"}", 404, "not_found_error", "model",
                 "does not exist");
    expect_error("/v1/completions", "{\"prompt\":\"text\"}", 400, "invalid_request_error", "prompt", "token ids");
    expect_error("/v1/completions", "{\"prompt\":[1,2],\"stop\":\"x\"}", 400, "invalid_request_error", "stop",
                 "stop_token_ids");
    expect_error("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 400,
                 "invalid_request_error", "messages", "chat template");
    expect_error("/v1/completions", "{\"prompt\":[1,2],\"max_tokens\":255}", 400, "invalid_request_error", "max_tokens",
                 "maximum context length is 256 tokens");
    expect_error("/v1/completions", "{\"prompt\":[1,2],\"max_tokens\":300}", 400, "invalid_request_error", "max_tokens",
                 "--max-completion-tokens");
    /* a prompt longer than the context: both numbers */
    sv_buf b = {0};
    sv_buf_lit(&b, "{\"prompt\":[");
    for (int i = 0; i < 300; i++) sv_buf_printf(&b, "%s7", i ? "," : "");
    sv_buf_lit(&b, "]}");
    expect_error("/v1/completions", b.p, 400, "invalid_request_error", "prompt", "300 tokens, above this server's limit of 255");
    sv_buf_free(&b);
    expect_error("/v1/nothing", "{}", 404, "not_found_error", NULL, "no route");
    expect_error("/v1/completions", NULL, 405, "invalid_request_error", NULL, "takes POST");
    expect_error("/tokenize", "{\"prompt\":\"x\"}", 400, "invalid_request_error", NULL, "no tokenizer");
    /* over --max-body-bytes (65536 here), declared by Content-Length */
    char *big = malloc(70000);
    memset(big, ' ', 69999);
    big[0] = '{';
    big[69998] = '}';
    big[69999] = 0;
    expect_error("/v1/completions", big, 413, "invalid_request_error", NULL, "limit of 65536");
    free(big);
}

/* A client that leaves mid-stream: its sequence is cancelled and its KV freed. */
static size_t leave_after_three(char *p, size_t sz, size_t nm, void *ud) {
    int *events = ud;
    for (size_t i = 0; i < sz * nm; i++)
        if (p[i] == '\n' && i > 0 && p[i - 1] == '\n') ++*events;
    return *events >= 3 ? 0 : sz * nm; /* 0: curl aborts the transfer and closes */
}

static double metric(const char *name) {
    char *t = NULL;
    http(g_srv.url, "/metrics", NULL, &t);
    char *p = t ? strstr(t, name) : NULL;
    double v = -1;
    if (p) {
        p = strchr(p, ' ');
        v = p ? strtod(p, NULL) : -1;
    }
    free(t);
    return v;
}

/* Choices that ended as aborted. */
static double aborted(void) {
    return metric("moerun:request_success_total{model_name=\"tiny-test\",finished_reason=\"abort\"}");
}

/* On a server of its own with a long context: a request of 250 tokens can end before the server
 * has written the stream its client has already left (fast hosts). */
static void test_disconnect_frees(void **st) {
    (void)st;
    server s2;
    const char *args[] = {"--model", g_model, "--context-length", "4096", "--max-running-requests", "8",
                          "--skip-self-check", NULL};
    assert_int_equal(srv_start_logged(&s2, args), 0);
    const server saved = g_srv;
    g_srv = s2;
    double aborts0 = aborted();
    double gone0 = metric("moerun:client_disconnects_total{");
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "%s/v1/completions", g_srv.url);
    int events = 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "{\"prompt\":[1,2,3],\"max_tokens\":4000,\"ignore_eos\":true,\"stream\":true}");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, leave_after_three);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &events);
    assert_int_equal(curl_easy_perform(h), CURLE_WRITE_ERROR);
    curl_easy_cleanup(h);
    /* within a few seconds: nothing running, nothing held in the KV cache, one abort counted */
    bool freed = false;
    for (int i = 0; i < 500 && !freed; i++) {
        freed = metric("moerun:num_requests_running{") == 0 && metric("moerun:kv_cache_used_blocks{") == 0 &&
                aborted() == aborts0 + 1;
        if (!freed) usleep(10000);
    }
    if (!freed)
        fprintf(stderr, "running %g, kv %g, aborts %g (before %g)\n", metric("moerun:num_requests_running{"),
                metric("moerun:kv_cache_used_blocks{"), aborted(), aborts0);
    const bool stream_freed = freed && metric("moerun:client_disconnects_total{") >= gone0 + 1;
    /* the same for a client that gives up on a non-streaming request: its 8 choices aborted (the
     * gauges alone read zero while it still waits for admission) */
    const double aborts1 = aborted();
    h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "{\"prompt\":[1,2,3],\"max_tokens\":4000,\"ignore_eos\":true,\"n\":8}");
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    sv_buf junk = {0};
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &junk);
    curl_easy_perform(h);
    curl_easy_cleanup(h);
    sv_buf_free(&junk);
    freed = false;
    for (int i = 0; i < 500 && !freed; i++) {
        freed = aborted() == aborts1 + 8 && metric("moerun:num_requests_running{") == 0 &&
                metric("moerun:kv_cache_used_blocks{") == 0;
        if (!freed) usleep(10000);
    }
    if (!freed)
        fprintf(stderr, "aborted %g (before %g), running %g, kv %g\n", aborted(), aborts1,
                metric("moerun:num_requests_running{"), metric("moerun:kv_cache_used_blocks{"));
    g_srv = saved;
    assert_int_equal(srv_stop(&s2), 0);
    assert_true(stream_freed);
    assert_true(freed);
}

/* generation_tokens_total over a few requests equals the completion tokens they reported. */
static void test_metrics_count(void **st) {
    (void)st;
    double g0 = metric("moerun:generation_tokens_total{"), p0 = metric("moerun:prompt_tokens_total{");
    long total = 0, prompt = 0;
    for (int k = 0; k < 5; k++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":[%d,%d],\"max_tokens\":%d,\"temperature\":0}", 30 + k, 40 + k, 3 + k);
        json_t *j = complete(body);
        total += (long)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
        prompt += (long)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
        json_decref(j);
    }
    assert_int_equal((long)(metric("moerun:generation_tokens_total{") - g0), total);
    assert_int_equal((long)(metric("moerun:prompt_tokens_total{") - p0), prompt);
}

/* --max-running-requests 1 --max-queued-requests 0: a second request while one runs is a 503 at once. */
static void test_queue_full(void **st) {
    (void)st;
    server s2;
    const char *args[] = {"--model", g_model, "--served-model-name", "q", "--context-length", "1024",
                          "--max-running-requests", "1", "--max-queued-requests", "0", "--skip-self-check", NULL};
    assert_int_equal(srv_start(&s2, args), 0);
    CURLM *mh = curl_multi_init();
    stream s;
    stream_init(&s);
    struct curl_slist *hd;
    server saved = g_srv;
    g_srv = s2;
    CURL *h = stream_handle("{\"prompt\":[1,2,3],\"max_tokens\":1000,\"ignore_eos\":true,\"stream\":true}", &s, &hd);
    curl_multi_add_handle(mh, h);
    int running = 1;
    while (s.n_tokens < 2 && running) { /* the first is running */
        curl_multi_perform(mh, &running);
        curl_multi_poll(mh, NULL, 0, 50, NULL);
    }
    uint64_t t0 = mr_now_ns();
    expect_error("/v1/completions", "{\"prompt\":[4,5],\"max_tokens\":4}", 503, "unavailable_error", NULL,
                 "--max-queued-requests");
    assert_true(mr_now_ns() - t0 < 5000000000ull); /* at once, not after the first */
    g_srv = saved;
    curl_multi_remove_handle(mh, h);
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    curl_multi_cleanup(mh);
    stream_free(&s);
    assert_int_equal(srv_stop(&s2), 0);
}

/* Penalties at temperature 0 change the greedy path exactly as the oracle's own arithmetic says. */
static void test_penalties(void **st) {
    (void)st;
    int32_t p[] = {7, 7, 9, 7, 9, 11};
    struct {
        float pres, freq, rep;
    } cases[] = {{0, 0, 1}, {1.5f, 0, 1}, {0, 1.0f, 1}, {0, 0, 1.8f}, {0.5f, 0.5f, 1.2f}};
    int differ = 0;
    int32_t *plain = oracle_pen(p, 6, 24, 0, 0, 1, NULL);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int32_t *want = oracle_pen(p, 6, 24, cases[k].pres, cases[k].freq, cases[k].rep, NULL);
        char body[512];
        snprintf(body, sizeof body,
                 "{\"prompt\":[7,7,9,7,9,11],\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true,"
                 "\"presence_penalty\":%g,\"frequency_penalty\":%g,\"repetition_penalty\":%g}",
                 cases[k].pres, cases[k].freq, cases[k].rep);
        json_t *j = complete(body);
        check_ids(choice_ids(j, 0), want, 24);
        if (memcmp(want, plain, sizeof(int32_t) * 24)) differ++;
        json_decref(j);
        free(want);
    }
    free(plain);
    assert_true(differ >= 2); /* the penalties did change something */
}

/* logprobs: the sampled token's value is log-softmax of the raw logits; the alternatives are the top-k, in order. */
static void test_logprobs(void **st) {
    (void)st;
    int32_t p[] = {3, 4, 5};
    int64_t V = 256;
    double *lsm = malloc((size_t)6 * (size_t)V * sizeof(double));
    int32_t *want = oracle_pen(p, 3, 6, 0, 0, 1, lsm);
    json_t *j = complete("{\"prompt\":[3,4,5],\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":3}");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    check_ids(json_object_get(c0, "token_ids"), want, 6);
    json_t *lp = json_object_get(c0, "logprobs");
    json_t *vals = json_object_get(lp, "token_logprobs"), *tops = json_object_get(lp, "top_logprobs");
    assert_int_equal(json_array_size(vals), 6);
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), 6);
    for (size_t k = 0; k < 6; k++) {
        double got = json_number_value(json_array_get(vals, k)), exp_ = lsm[k * (size_t)V + (size_t)want[k]];
        if (fabs(got - exp_) > 1e-4) fprintf(stderr, "token %zu: logprob %g, want %g\n", k, got, exp_);
        assert_true(fabs(got - exp_) < 1e-4);
        json_t *t = json_array_get(tops, k);
        assert_int_equal(json_object_size(t), 3);
        /* the best alternative is the greedy token; every alternative's value is its log-softmax */
        const char *key;
        json_t *v;
        double prev = 1;
        json_object_foreach(t, key, v) {
            int id = atoi(key + strlen("token_id:"));
            assert_true(fabs(json_number_value(v) - lsm[k * (size_t)V + (size_t)id]) < 1e-4);
            assert_true(json_number_value(v) <= prev);
            prev = json_number_value(v);
        }
        char first[32];
        snprintf(first, sizeof first, "token_id:%d", want[k]);
        assert_non_null(json_object_get(t, first));
    }
    json_decref(j);
    free(want);
    free(lsm);
}

static int setup(void **st) {
    (void)st;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    g_dir = tu_tmpdir("serve_http");
    snprintf(g_model, sizeof g_model, "%s/tiny-test", g_dir);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", tu_data("model/tiny"), g_model);
    if (system(cmd)) return -1;
    const char *args[] = {"--model", g_model, "--context-length", "256", "--max-running-requests", "8",
                          "--max-body-bytes", "65536", "--kv-cache-dtype", "fp32", NULL};
    return srv_start_logged(&g_srv, args);
}

static int teardown(void **st) {
    (void)st;
    if (srv_stop_clean(&g_srv)) return -1;
    tu_rmtree(g_dir);
    free(g_dir);
    curl_global_cleanup();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_models_metrics), cmocka_unit_test(test_completions_match_oracle),
        cmocka_unit_test(test_stream_grammar_and_usage), cmocka_unit_test(test_concurrent_streams),
        cmocka_unit_test(test_sampling_seed_and_n),    cmocka_unit_test(test_stop_ids_and_eos),
        cmocka_unit_test(test_eos_and_ignore_eos),     cmocka_unit_test(test_errors),
        cmocka_unit_test(test_disconnect_frees),       cmocka_unit_test(test_metrics_count),
        cmocka_unit_test(test_queue_full),             cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logprobs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
