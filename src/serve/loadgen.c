/* loadgen.c — the load generator of `moerun bench serve`: one thread drives
 * up to `concurrency` streaming requests at once through libcurl's multi
 * interface, with the definitions of sglang's bench_serving (serving.md
 * section 6):
 *   - all requests exist at t = 0 (request rate inf); at most C are in
 *     flight (the semaphore); a request's clock starts just before it is
 *     handed to curl;
 *   - TTFT: to the first event that carries text (choices[0].text, or
 *     delta.content / delta.reasoning_content) or, for a checkpoint served
 *     by ids, token ids; ITL: every gap between later such events, pooled
 *     over requests; latency: to the last line of the stream;
 *   - output_len: usage.completion_tokens of the stream (include_usage);
 *   - TPOT_i = (latency_i - TTFT_i) / (output_len_i - 1) when output_len_i > 1;
 *   - throughputs over the wall time from the first send to the last end;
 *     "concurrency" = sum of latencies / wall time;
 *   - percentiles interpolate linearly between closest ranks (numpy).
 * Prompts: input_len random token ids in [min_id, vocab) (completions), after
 * one of prefix_groups shared prefixes of prefix_len ids when asked, or
 * their text from the server's /detokenize (chat, or text_prompts); or the
 * rows of a dataset (dataset.c: ShareGPT's conversations), as text. */
#include <curl/curl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_internal.h"
#include "moerun/text.h"
#include "serve/serve_internal.h"

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double mr_percentile(double *v, size_t n, double pct) {
    if (n == 0) return 0.0;
    qsort(v, n, sizeof *v, cmp_double);
    double pos = pct / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

/* A uniform in (0, 1] (never 0: its log is finite). */
static double unit_open(uint64_t *s) { return ((double)(sv_splitmix64(s) >> 11) + 1.0) * (1.0 / 9007199254740992.0); }

/* Gamma(k, 1) by Marsaglia and Tsang's squeeze (k >= 1; k < 1 through Gamma(k + 1) x U^(1/k)), its normals
 * by Box and Muller. */
static double gamma_draw(double k, uint64_t *s) {
    if (k < 1.0) return gamma_draw(k + 1.0, s) * pow(unit_open(s), 1.0 / k);
    const double d = k - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        const double x = sqrt(-2.0 * log(unit_open(s))) * cos(6.283185307179586 * unit_open(s));
        double v = 1.0 + c * x;
        if (v <= 0.0) continue;
        v = v * v * v;
        const double u = unit_open(s);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v)) return d * v;
    }
}

void mr_bench_arrivals(double rate, double burstiness, uint64_t seed, int n, double *t) {
    uint64_t sa = seed * 0x94D049BB133111EBull + 13;
    if (n > 0) t[0] = 0.0;
    for (int i = 1; i < n; i++) {
        double gap;
        if (burstiness <= 0.0 || burstiness == 1.0) { /* exponential, as sglang's Poisson process */
            const double u = (double)(sv_splitmix64(&sa) >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
            gap = -log1p(-u) / rate;
        } else {
            gap = gamma_draw(burstiness, &sa) / (rate * burstiness);
        }
        t[i] = t[i - 1] + gap;
    }
}

static void summarize(double *v, size_t n, double *mean, double *median, double *p99, double *std) {
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s += v[i];
    *mean = n ? s / (double)n : 0;
    for (size_t i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *std = n ? sqrt(s2 / (double)n) : 0;
    *median = mr_percentile(v, n, 50);
    *p99 = mr_percentile(v, n, 99);
}

/* ---- a growable array of doubles ---- */
typedef struct {
    double *v;
    size_t n, cap;
} dvec;

static int dvec_push(dvec *d, double x) {
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 1024;
        double *p = realloc(d->v, c * sizeof *p);
        if (!p) return -1;
        d->v = p;
        d->cap = c;
    }
    d->v[d->n++] = x;
    return 0;
}

/* ---- HTTP GET ---- */

/* A server is a stranger: what it sends is bounded here. A GET body (/v1/models,
 * /metrics, /detokenize's answer) beyond MAX_BODY, or one SSE line beyond
 * MAX_LINE, ends the transfer with an error instead of growing the heap for as
 * long as the server keeps sending. */
enum { MAX_BODY = 64 << 20, MAX_LINE = 16 << 20 };

static size_t collect(char *p, size_t sz, size_t nm, void *ud) {
    sv_buf *b = ud;
    if (b->len + sz * nm > MAX_BODY) return 0; /* curl: CURLE_WRITE_ERROR */
    return sv_buf_add(b, p, sz * nm) ? 0 : sz * nm;
}

/* why a transfer into b failed: our cap, or curl's reason */
static const char *curl_why(CURLcode rc, const sv_buf *b) {
    return rc == CURLE_WRITE_ERROR && b->len + CURL_MAX_WRITE_SIZE > MAX_BODY ? "the answer is larger than 64 MiB"
                                                                              : curl_easy_strerror(rc);
}

/* The request's headers: a JSON body's type (json), and the API key as a bearer token (sglang's and vLLM's
 * benchmarks send OPENAI_API_KEY so) [api_key NULL: none]. NULL with *fail set when out of memory. */
static struct curl_slist *req_headers(bool json, const char *api_key, bool *fail) {
    struct curl_slist *hd = NULL, *t;
    *fail = false;
    if (json) {
        if (!(t = curl_slist_append(hd, "Content-Type: application/json"))) goto oom;
        hd = t;
    }
    if (api_key) {
        size_t n = strlen(api_key) + 32;
        char *line = malloc(n);
        if (!line) goto oom;
        snprintf(line, n, "Authorization: Bearer %s", api_key);
        t = curl_slist_append(hd, line);
        free(line);
        if (!t) goto oom;
        hd = t;
    }
    return hd;
oom:
    curl_slist_free_all(hd);
    *fail = true;
    return NULL;
}

/* GET (json NULL) or POST json to base_url + path; the answer, bounded, into *body */
static mr_status http_do(const char *base_url, const char *path, const char *json, const char *api_key,
                         double timeout_s, long *http, char **body) {
    *body = NULL;
    *http = 0;
    char url[2048];
    snprintf(url, sizeof url, "%s%s", base_url, path);
    bool fail;
    struct curl_slist *hd = req_headers(json != NULL, api_key, &fail);
    CURL *h = fail ? NULL : curl_easy_init();
    if (!h) {
        curl_slist_free_all(hd);
        return mr_error_set(MR_ENOMEM, "%s %s: out of memory", json ? "POST" : "GET", url);
    }
    sv_buf b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (hd) curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    if (json) curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, http);
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    if (rc != CURLE_OK) {
        const char *why = curl_why(rc, &b);
        sv_buf_free(&b);
        return mr_error_set(MR_EIO, "%s %s: %s", json ? "POST" : "GET", url, why);
    }
    if (sv_buf_lit(&b, "")) {
        sv_buf_free(&b);
        return MR_ENOMEM;
    }
    *body = b.p; /* mr_malloc'd: free() works (mr_free is free) */
    return MR_OK;
}

mr_status mr_http_get(const char *base_url, const char *path, const char *api_key, double timeout_s, long *http,
                      char **body) {
    return http_do(base_url, path, NULL, api_key, timeout_s, http, body);
}

mr_status mr_http_post(const char *base_url, const char *path, const char *json, const char *api_key,
                       double timeout_s, long *http, char **body) {
    return http_do(base_url, path, json, api_key, timeout_s, http, body);
}

/* ---- one request in flight ---- */
typedef struct {
    CURL *h;
    struct curl_slist *hd;
    char *body;           /* the request JSON */
    sv_buf line;          /* a partial SSE line */
    uint64_t t0, t_last_tok, t_last;
    double ttft;
    bool got_first, failed, saw_done;
    int64_t output_len;
    int64_t max_tokens;   /* the request's, times its choices (completion_tokens above it fails the request) */
    int64_t in_len;       /* its prompt's token count */
    int64_t n_output_events;
    bool has_usage;
    bool whole;           /* not streamed: line holds the whole answer, read as one event at the end */
    bool native;          /* sglang's /generate: an event with output is one whose meta_info.completion_tokens
                             grew; that count is the output length */
    dvec *itl;            /* pooled */
    bool details;         /* text and own_itl kept (--output-details) */
    sv_buf text;          /* its output text */
    bool abort;           /* end the transfer (the text grew past its bound) */
    dvec own_itl;         /* its ITLs */
    char err[256];
    int idx;
} flight;

/* Does the event carry output? (text, content, reasoning or token ids) */
static bool has_output(const json_t *ev) {
    const json_t *ch = json_object_get(ev, "choices");
    const json_t *c0 = json_array_get(ch, 0);
    if (!c0) return false;
    const json_t *t = json_object_get(c0, "text");
    if (json_is_string(t) && json_string_length(t)) return true;
    const json_t *d = json_object_get(c0, "delta");
    if (!d) d = json_object_get(c0, "message"); /* an answer not streamed */
    if (d) {
        const json_t *x = json_object_get(d, "content");
        if (json_is_string(x) && json_string_length(x)) return true;
        x = json_object_get(d, "reasoning_content");
        if (json_is_string(x) && json_string_length(x)) return true;
        x = json_object_get(d, "tool_calls");
        if (json_is_array(x) && json_array_size(x)) return true;
    }
    const json_t *ids = json_object_get(c0, "token_ids");
    return json_is_array(ids) && json_array_size(ids) > 0;
}

/* Did the request get its answer? Output, or a stream that ended whole with its token count before any text
 * (one without [DONE] has failed already): an answer that stopped at once (the model's EOS first, without
 * ignore_eos) is a success of no text, whose one event is its first (TTFT = its latency). */
static bool answered(const flight *f) { return !f->failed && (f->got_first || f->has_usage); }

/* the first reason a request failed is the one it reports */
static void fail_first(flight *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_first(flight *f, const char *fmt, ...) {
    if (!f->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->err, sizeof f->err, fmt, ap);
        va_end(ap);
    }
    f->failed = true;
}

static void on_event(flight *f, const json_t *ev, uint64_t now);

static void on_line(flight *f, const char *s, size_t n) {
    while (n && (s[n - 1] == '\r' || s[n - 1] == ' ')) n--;
    if (n == 0) return;
    uint64_t now = mr_now_ns();
    f->t_last = now;
    if (n < 5 || memcmp(s, "data:", 5)) return;
    s += 5, n -= 5;
    while (n && *s == ' ') s++, n--;
    if (n == 6 && !memcmp(s, "[DONE]", 6)) {
        f->saw_done = true;
        return;
    }
    json_error_t je;
    json_t *ev = mr__json_loadb(s, n, JSON_ALLOW_NUL, &je, NULL); /* a model may well write a NUL byte */
    if (!ev) {
        fail_first(f, "an event is not JSON: %s", je.text);
        return;
    }
    on_event(f, ev, now);
    json_decref(ev);
}

/* The event's output text into f->text: completions' text, chat's reasoning_content and content (a delta, or
 * the message of an answer not streamed), or /generate's text so far (it replaces). */
static void add_text(flight *f, const json_t *ev) {
    if (f->native) {
        const json_t *t = json_object_get(ev, "text");
        if (json_is_string(t)) {
            f->text.len = 0;
            if (sv_buf_add(&f->text, json_string_value(t), json_string_length(t))) fail_first(f, "out of memory");
        }
        return;
    }
    const json_t *c0 = json_array_get(json_object_get(ev, "choices"), 0), *d = json_object_get(c0, "delta");
    if (!d) d = json_object_get(c0, "message");
    const json_t *parts[3] = {json_object_get(c0, "text"), json_object_get(d, "reasoning_content"),
                              json_object_get(d, "content")};
    for (int k = 0; k < 3; k++) {
        if (!json_is_string(parts[k])) continue;
        if (f->text.len + json_string_length(parts[k]) > MAX_BODY) { /* a server that never stops talking */
            fail_first(f, "the answer's text is larger than 64 MiB");
            f->abort = true;
            return;
        }
        if (sv_buf_add(&f->text, json_string_value(parts[k]), json_string_length(parts[k]))) fail_first(f, "out of memory");
    }
}

/* One event of the stream (or the whole answer): its output, timed, and its token count. */
static void on_event(flight *f, const json_t *ev, uint64_t now) {
    if (f->details) add_text(f, ev);
    const json_t *e = json_object_get(ev, "error");
    if (e) {
        const char *m = json_string_value(json_object_get(e, "message"));
        fail_first(f, "the stream reported an error: %s", m ? m : "?");
    } else {
        const json_t *ct = json_object_get(json_object_get(ev, f->native ? "meta_info" : "usage"), "completion_tokens");
        if (f->native ? json_is_integer(ct) && json_integer_value(ct) > f->output_len : has_output(ev)) {
            f->n_output_events++;
            if (!f->got_first) {
                f->got_first = true;
                f->ttft = (double)(now - f->t0) * 1e-9;
            } else if (dvec_push(f->itl, (double)(now - f->t_last_tok) * 1e-9) ||
                       (f->details && dvec_push(&f->own_itl, (double)(now - f->t_last_tok) * 1e-9))) {
                fail_first(f, "out of memory");
            }
            f->t_last_tok = now;
        }
        if (ct && !json_is_null(ct)) {
            /* a count the request cannot have produced would make every throughput a fiction */
            const json_int_t v = json_integer_value(ct); /* 0 for a non-integer, refused first */
            if (!json_is_integer(ct)) {
                fail_first(f, "usage.completion_tokens is not an integer");
            } else if (v < 0 || v > f->max_tokens) {
                fail_first(f, "usage.completion_tokens is %lld, outside [0, %lld] (the request's max_tokens x n)",
                           (long long)v, (long long)f->max_tokens);
            } else {
                f->output_len = (int64_t)v;
                f->has_usage = true;
            }
        }
    }
}

static size_t on_data(char *p, size_t sz, size_t nm, void *ud) {
    flight *f = ud;
    const size_t n = sz * nm;
    const char *s = p, *end = p + n;
    if (f->whole) { /* the answer, read at the end */
        if (f->line.len + n > MAX_BODY) {
            fail_first(f, "the answer is larger than 64 MiB");
            return 0;
        }
        return sv_buf_add(&f->line, p, n) ? 0 : n;
    }
    while (s < end) { /* whole lines straight from curl's buffer; only a partial one is copied */
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        if (f->line.len + (size_t)((nl ? nl : end) - s) > MAX_LINE) {
            fail_first(f, "an event line longer than 16 MiB");
            return 0; /* curl ends the transfer */
        }
        if (!nl) return sv_buf_add(&f->line, s, (size_t)(end - s)) ? 0 : n;
        if (f->line.len) {
            if (sv_buf_add(&f->line, s, (size_t)(nl - s))) return 0;
            on_line(f, f->line.p, f->line.len);
            f->line.len = 0;
        } else {
            on_line(f, s, (size_t)(nl - s));
        }
        if (f->abort) return 0; /* curl ends the transfer */
        s = nl + 1;
    }
    return n;
}

/* ---- prompts ---- */


/* What the bench knows of a request body: its prompt's token count, and the most completion tokens
 * its usage may report (max_tokens, or max_completion_tokens, times n, after --extra-request-body) */
typedef struct {
    int64_t in_len, max_out;
} body_info;

/* A length uniform in [max(1, floor(L * ratio)), L] (sglang's random dataset), or L without random lengths. */
static int64_t draw_len(const mr_bench_serve_opts *o, int64_t L, uint64_t *s) {
    if (!o->random_lengths) return L;
    int64_t lo = (int64_t)floor((double)L * o->range_ratio);
    if (lo < 1) lo = 1;
    return lo + (int64_t)(sv_splitmix64(s) % (uint64_t)(L - lo + 1));
}

/* The bench's own fields: greedy, olen tokens whatever the model ends with (unless keep_eos), streamed with
 * the usage chunk; on /generate in sampling_params, as sglang's bench_serving sends them. */
static json_t *base_req(const mr_bench_serve_opts *o, const char *model, int64_t olen) {
    if (o->native) {
        json_t *sp = json_pack("{s:f,s:I}", "temperature", 0.0, "max_new_tokens", (json_int_t)olen);
        if (sp && !o->keep_eos) json_object_set_new(sp, "ignore_eos", json_true());
        json_t *r = sp ? json_pack("{s:o,s:b}", "sampling_params", sp, "stream", !o->whole) : NULL;
        if (r && o->return_logprob) json_object_set_new(r, "return_logprob", json_true());
        return r;
    }
    json_t *r = o->whole ? json_pack("{s:s,s:f,s:I,s:b}", "model", model, "temperature", 0.0, "max_tokens",
                                     (json_int_t)olen, "stream", 0)
                         : json_pack("{s:s,s:f,s:I,s:b,s:{s:b}}", "model", model, "temperature", 0.0, "max_tokens",
                                     (json_int_t)olen, "stream", 1, "stream_options", "include_usage", 1);
    if (r && !o->keep_eos) json_object_set_new(r, "ignore_eos", json_true());
    return r;
}

/* The prompt into req: text (chat: the user's message; /generate: "text"; else "prompt"), or, text NULL,
 * the token ids (consumed; /generate: "input_ids"). */
static void put_prompt(json_t *req, const mr_bench_serve_opts *o, const char *text, json_t *ids) {
    if (!text)
        json_object_set_new(req, o->native ? "input_ids" : "prompt", ids);
    else if (o->chat)
        json_object_set_new(req, "messages", json_pack("[{s:s,s:s}]", "role", "user", "content", text));
    else
        json_object_set_new(req, o->native ? "text" : "prompt", json_string(text));
}

/* The body as sent: req (consumed; NULL: out of memory) with the extra fields merged over it, and the limit its
 * usage is held to, from that body: max_completion_tokens or max_tokens, times n. */
static mr_status finish_body(json_t *req, json_t *extra, char **body, body_info *info) {
    mr_status st = req ? MR_OK : MR_ENOMEM;
    if (!st && extra && json_object_update(req, extra)) st = MR_ENOMEM;
    if (!st) {
        const json_t *sp = json_object_get(req, "sampling_params"); /* /generate's */
        const json_t *mt = json_object_get(req, "max_completion_tokens"), *nc = json_object_get(req, "n");
        if (!json_is_integer(mt)) mt = json_object_get(req, "max_tokens");
        if (!json_is_integer(mt)) mt = json_object_get(sp, "max_new_tokens");
        if (!nc) nc = json_object_get(sp, "n");
        const int64_t per = json_is_integer(mt) && json_integer_value(mt) > 0 ? (int64_t)json_integer_value(mt) : INT32_MAX;
        const int64_t nn = json_is_integer(nc) && json_integer_value(nc) > 1 && json_integer_value(nc) <= 4096
                               ? (int64_t)json_integer_value(nc) : 1;
        info->max_out = per * nn;
    }
    if (!st && !(*body = json_dumps(req, JSON_COMPACT))) st = MR_ENOMEM;
    json_decref(req);
    return st;
}

/* The request bodies: num_prompts (+1 for the warm-up, index num_prompts, of the full input length),
 * and what info[] says of each. */
static mr_status make_bodies(const mr_bench_serve_opts *o, const char *model, char ***out, body_info *info) {
    int n = o->num_prompts + 1;
    char **b = calloc((size_t)n, sizeof *b);
    if (!b) return MR_ENOMEM;
    mr_tokenizer *tok = NULL;
    if (o->tokenizer && (o->chat || o->text_prompts) && mr_tokenizer_load(o->tokenizer, &tok)) {
        free(b);
        return mr_error_set(MR_EIO, "bench serve: --tokenizer %s: %s", o->tokenizer, mr_error_last());
    }
    if (tok && !o->dataset_tokens && o->vocab > mr_tokenizer_id_limit(tok)) {
        mr_tokenizer_free(tok);
        free(b);
        return mr_error_set(MR_EINVAL, "bench serve: --vocab %lld is above the tokenizer's %d ids", (long long)o->vocab,
                            (int)mr_tokenizer_id_limit(tok));
    }
    json_t *extra = NULL;
    if (o->extra_body) {
        json_error_t je;
        extra = json_loads(o->extra_body, 0, &je);
        if (!json_is_object(extra)) {
            json_decref(extra);
            mr_tokenizer_free(tok);
            free(b);
            return mr_error_set(MR_EINVAL, "bench serve: the extra request body is not a JSON object (%s)", je.text);
        }
    }
    uint64_t s = o->seed * 0x9E3779B97F4A7C15ull + 7;
    uint64_t sl = o->seed * 0xD1B54A32D192ED03ull + 11; /* the lengths: their own stream, so that the prompts
                                                            of a seed with fixed lengths stay what they were */
    int64_t lo = o->min_id, hi = o->vocab;
    mr_status st = MR_OK;
    const mr_bench_dataset *ds = o->dataset;
    if (ds && !o->dataset_tokens && o->num_prompts > ds->n) {
        json_decref(extra);
        mr_tokenizer_free(tok);
        free(b);
        return mr_error_set(MR_EINVAL, "bench serve: %d prompts asked of a dataset of %d rows", o->num_prompts, ds->n);
    }
    int *perm = NULL; /* sglang's generated-shared-prefix dataset: request i is prompt perm[i] of the groups'
                         prompts_per_group each, in group order, shuffled (Fisher-Yates from the top, the prefix's
                         seed stream) */
    if (o->prompts_per_group > 0 && o->prefix_len > 0) {
        if (!(perm = malloc((size_t)o->num_prompts * sizeof *perm))) st = MR_ENOMEM;
        uint64_t sg = o->seed * 0xA24BAED4963EE407ull + 5;
        for (int i = 0; perm && i < o->num_prompts; i++) perm[i] = i;
        for (int i = o->num_prompts; perm && i > 1; i--) {
            const int j = (int)(sv_splitmix64(&sg) % (uint64_t)i), t = perm[i - 1];
            perm[i - 1] = perm[j];
            perm[j] = t;
        }
    }
    for (int i = 0; i < n && !st; i++) {
        const bool warm = i == o->num_prompts;
        if (i > 0 && !warm && o->repeat_first) {
            info[i] = info[0];
            if (!(b[i] = strdup(b[0]))) st = MR_ENOMEM;
            continue;
        }
        const mr_bench_row *row = ds && !o->dataset_tokens ? &ds->rows[warm ? 0 : i] : NULL;
        const mr_bench_row *src = ds && o->dataset_tokens ? &ds->rows[warm ? 0 : i % ds->n] : NULL;
        const int64_t ilen = warm ? o->input_len : draw_len(o, o->input_len, &sl);
        int64_t olen = warm ? (o->output_len < 32 ? o->output_len : 32) : draw_len(o, o->output_len, &sl);
        if (row) { /* the row's prompt text and output length, within output_len (32 for the warm-up) */
            info[i].in_len = row->prompt_len;
            olen = row->output_len < olen ? row->output_len : olen;
            json_t *req = base_req(o, model, olen), *rid = NULL;
            if (req && row->ids) { /* the ids that were counted (--tokenize-prompt) */
                rid = json_array();
                for (int64_t k = 0; rid && k < row->prompt_len; k++)
                    if (json_array_append_new(rid, json_integer(row->ids[k]))) json_decref(rid), rid = NULL;
                if (!rid) json_decref(req), req = NULL;
            }
            if (req) put_prompt(req, o, rid ? NULL : row->prompt, rid);
            st = finish_body(req, extra, &b[i], &info[i]);
            continue;
        }
        const int64_t plen = o->prefix_len > 0 && !warm ? o->prefix_len : 0; /* the warm-up warms no group */
        info[i].in_len = plen + ilen;
        json_t *ids = json_array();
        if (plen) { /* the group's shared prefix: its own stream, the same ids for every request of the group */
            const int ng = o->prefix_groups > 0 ? o->prefix_groups : 1;
            const int g = (perm ? perm[i] / o->prompts_per_group : i) % ng;
            uint64_t sp = o->seed * 0xA24BAED4963EE407ull + 17 + 0x9FB21C651E98DF25ull * (uint64_t)g;
            for (int64_t k = 0; ids && k < plen; k++)
                json_array_append_new(ids, json_integer(lo + (json_int_t)(sv_splitmix64(&sp) % (uint64_t)(hi - lo))));
        }
        for (int64_t k = 0; ids && k < ilen; k++) /* a source row's ids repeated and cut (sglang's), or random ids */
            json_array_append_new(ids, json_integer(src ? src->ids[k % src->prompt_len]
                                                        : lo + (json_int_t)(sv_splitmix64(&s) % (uint64_t)(hi - lo))));
        json_t *req = base_req(o, model, olen);
        if (!ids || !req) {
            json_decref(ids);
            json_decref(req);
            st = MR_ENOMEM;
            break;
        }
        if ((o->chat || o->text_prompts) && tok) { /* text decoded here */
            const size_t nid = json_array_size(ids);
            int32_t *v = malloc(nid * sizeof(int32_t));
            for (size_t k = 0; v && k < nid; k++) v[k] = (int32_t)json_integer_value(json_array_get(ids, k));
            char *t = NULL;
            size_t tn;
            st = v ? mr_tokenizer_decode(tok, v, nid, true, &t, &tn) : MR_ENOMEM;
            free(v);
            if (!st) put_prompt(req, o, t, NULL);
            mr_free(t);
            json_decref(ids);
        } else if (o->chat || o->text_prompts) {
            /* text: the server's detokenization of the random ids (sglang's random dataset does the same) */
            json_t *dq = json_pack("{s:O}", "tokens", ids);
            char *dqs = dq ? json_dumps(dq, JSON_COMPACT) : NULL;
            json_decref(dq);
            long http = 0;
            char *resp = NULL;
            st = dqs ? mr_http_post(o->base_url, "/detokenize", dqs, o->api_key, 60, &http, &resp) : MR_ENOMEM;
            free(dqs);
            json_t *r = NULL;
            if (!st) {
                json_error_t je;
                r = mr__json_loads(resp, 0, &je, NULL);
                const char *t = json_string_value(json_object_get(r, "prompt"));
                if (http != 200 || !t) {
                    st = mr_error_set(MR_EUNSUPPORTED, "bench serve: /detokenize answered %ld (%.200s): text prompts need "
                                      "a server with a tokenizer", http, resp ? resp : "");
                } else {
                    put_prompt(req, o, t, NULL);
                }
            }
            json_decref(r);
            free(resp);
            json_decref(ids);
        } else {
            put_prompt(req, o, NULL, ids);
        }
        if (st) json_decref(req);
        else st = finish_body(req, extra, &b[i], &info[i]);
    }
    free(perm);
    mr_tokenizer_free(tok);
    json_decref(extra);
    if (st) {
        for (int i = 0; i < n; i++) free(b[i]);
        free(b);
        return st;
    }
    *out = b;
    return MR_OK;
}

/* false when out of memory (nothing started, nothing held) */
static bool flight_start(flight *f, const mr_bench_serve_opts *o, const char *body, CURLM *mh) {
    char url[2048];
    snprintf(url, sizeof url, "%s%s", o->base_url,
             o->native ? "/generate" : o->chat ? "/v1/chat/completions" : "/v1/completions");
    f->native = o->native;
    f->whole = o->whole;
    bool fail;
    f->hd = req_headers(true, o->api_key, &fail);
    f->h = fail ? NULL : curl_easy_init();
    if (!f->h) {
        curl_slist_free_all(f->hd);
        f->hd = NULL;
        return false;
    }
    curl_easy_setopt(f->h, CURLOPT_URL, url);
    curl_easy_setopt(f->h, CURLOPT_HTTPHEADER, f->hd);
    curl_easy_setopt(f->h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(f->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(f->h, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(f->h, CURLOPT_PRIVATE, f);
    curl_easy_setopt(f->h, CURLOPT_TIMEOUT_MS, (long)(o->timeout_s * 1000));
    curl_easy_setopt(f->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(f->h, CURLOPT_TCP_NODELAY, 1L);
    f->t0 = f->t_last = f->t_last_tok = mr_now_ns();
    curl_multi_add_handle(mh, f->h);
    return true;
}

/* Runs the bodies [first, first + count) at concurrency C; fills fl[]. Body i is due arrive[i - first]
 * seconds after the start (NULL: all at once) and is sent when it is due and one of the C slots is free. */
static mr_status drive(const mr_bench_serve_opts *o, char **bodies, const body_info *info, const double *arrive,
                       int first, int count, int C, flight *fl, dvec *itl) {
    CURLM *mh = curl_multi_init();
    if (!mh) return MR_ENOMEM;
    curl_multi_setopt(mh, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)C);
    int next = 0, running = 0, done = 0;
    const uint64_t t_start = mr_now_ns();
    while (done < count) {
        while (running < C && next < count && (!arrive || (double)(mr_now_ns() - t_start) * 1e-9 >= arrive[next])) {
            flight *f = &fl[next];
            memset(f, 0, sizeof *f);
            f->itl = itl;
            f->idx = first + next;
            f->in_len = info[first + next].in_len;
            f->details = o->details;
            f->max_tokens = info[first + next].max_out;
            next++;
            if (flight_start(f, o, bodies[first + next - 1], mh)) {
                running++;
            } else {
                fail_first(f, "out of memory starting the request");
                done++;
            }
        }
        int still;
        curl_multi_perform(mh, &still);
        CURLMsg *msg;
        int left, ended = 0;
        while ((msg = curl_multi_info_read(mh, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            flight *f;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&f);
            long http = 0;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &http);
            if (f->whole && msg->data.result == CURLE_OK && http == 200) { /* the answer, as one event */
                json_error_t je;
                json_t *ev = mr__json_loadb(f->line.len ? f->line.p : "", f->line.len, JSON_ALLOW_NUL, &je, NULL);
                f->t_last = mr_now_ns(); /* its end: the latency, and the TTFT (sglang's) */
                if (ev) on_event(f, ev, f->t_last);
                else fail_first(f, "the answer is not JSON: %s", je.text);
                json_decref(ev);
                f->saw_done = true;
            } else if (f->line.len && !f->whole) {
                on_line(f, f->line.p, f->line.len);
            }
            if (msg->data.result != CURLE_OK) {
                fail_first(f, "%s", curl_easy_strerror(msg->data.result)); /* ours first, if on_data ended it */
            } else if (http != 200) {
                f->failed = false; /* the status explains a body that is not a stream */
                fail_first(f, "HTTP %ld", http);
            } else if (!f->saw_done) {
                fail_first(f, "the stream ended without [DONE]");
            }
            curl_multi_remove_handle(mh, f->h);
            curl_easy_cleanup(f->h);
            curl_slist_free_all(f->hd);
            sv_buf_free(&f->line);
            f->h = NULL;
            running--;
            done++;
            ended++;
        }
        /* a request that ended frees a slot: the next one starts now, not after the poll's timeout; the
         * poll wakes by the next arrival too */
        int wait_ms = 50;
        if (arrive && next < count && running < C) {
            const double due = arrive[next] - (double)(mr_now_ns() - t_start) * 1e-9;
            wait_ms = due <= 0 ? 0 : due < 0.05 ? (int)ceil(due * 1e3) : 50;
        }
        if (done < count && !(ended && next < count) && wait_ms > 0) curl_multi_poll(mh, NULL, 0, wait_ms, NULL);
    }
    curl_multi_cleanup(mh);
    return MR_OK;
}

void mr_bench_serve_result_free(mr_bench_serve_result *r) {
    if (!r || !r->requests) return;
    for (int i = 0; i < r->completed + r->failed; i++) free(r->requests[i].itl_s), free(r->requests[i].text);
    free(r->requests);
    r->requests = NULL;
}

/* The requests' details into r (their text and ITLs moved out of the flights), as sglang records them: a failed
 * request's output length and TTFT are 0. */
static mr_status keep_details(flight *fl, int n, mr_bench_serve_result *r) {
    if (!(r->requests = calloc((size_t)n, sizeof *r->requests))) return MR_ENOMEM;
    for (int i = 0; i < n; i++) {
        flight *f = &fl[i];
        mr_bench_request *q = &r->requests[i];
        const bool ok = answered(f);
        q->input_len = f->in_len;
        q->output_len = ok ? f->output_len : 0;
        q->ttft_s = ok ? f->ttft : 0;
        if (!ok) snprintf(q->error, sizeof q->error, "%s", f->err[0] ? f->err : "no output in the stream");
        if (sv_buf_lit(&f->text, "")) {
            mr_bench_serve_result_free(r);
            return MR_ENOMEM;
        }
        q->text = f->text.p, q->text_len = f->text.len, f->text = (sv_buf){0};
        q->itl_s = f->own_itl.v, q->n_itl = f->own_itl.n, f->own_itl = (dvec){0};
    }
    return MR_OK;
}

mr_status mr_bench_serve_run(const mr_bench_serve_opts *o, mr_bench_serve_result *r) {
    memset(r, 0, sizeof *r);
    r->concurrency = o->concurrency;
    bool bad = o->concurrency < 1 || o->num_prompts < 1 || o->input_len < 1 || o->output_len < 1 ||
               o->vocab <= o->min_id || !(o->burstiness >= 0.0) || o->n_percentiles < 0 ||
               o->n_percentiles > MR_BENCH_MAX_PERCENTILES;
    for (int k = 0; !bad && k < o->n_percentiles; k++) bad = !(o->percentiles[k] >= 0.0 && o->percentiles[k] <= 100.0);
    if (bad) return mr_error_set(MR_EINVAL, "bench serve: bad options");
    static bool inited;
    if (!inited) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        inited = true;
    }
    char **bodies = NULL;
    body_info *info = malloc((size_t)(o->num_prompts + 1) * sizeof *info);
    double *arrive = o->request_rate > 0 ? malloc((size_t)o->num_prompts * sizeof *arrive) : NULL;
    if (!info || (o->request_rate > 0 && !arrive)) {
        free(info);
        free(arrive);
        return MR_ENOMEM;
    }
    mr_status st = make_bodies(o, o->model ? o->model : "default", &bodies, info);
    if (st) {
        free(info);
        free(arrive);
        return st;
    }
    if (arrive) { /* a Poisson process, as sglang's (or vLLM's gamma gaps): the first at t = 0 */
        mr_bench_arrivals(o->request_rate, o->burstiness, o->seed, o->num_prompts, arrive);
        r->last_arrival_s = arrive[o->num_prompts - 1];
    }
    flight *fl = calloc((size_t)o->num_prompts, sizeof *fl);
    dvec itl = {0}, warm_itl = {0};
    double *ttft = malloc((size_t)o->num_prompts * sizeof(double));
    double *tpot = malloc((size_t)o->num_prompts * sizeof(double));
    double *e2e = malloc((size_t)o->num_prompts * sizeof(double));
    if (!fl || !ttft || !tpot || !e2e) {
        st = MR_ENOMEM;
        goto out;
    }
    if (o->warmup) {
        flight w = {0};
        drive(o, bodies, info, NULL, o->num_prompts, 1, 1, &w, &warm_itl);
        sv_buf_free(&w.text);
        free(w.own_itl.v);
        if (!answered(&w)) {
            st = mr_error_set(MR_EIO, "bench serve: the warm-up request failed: %s", w.err[0] ? w.err : "no output");
            goto out;
        }
    }
    uint64_t t0 = mr_now_ns();
    if ((st = drive(o, bodies, info, arrive, 0, o->num_prompts, o->concurrency, fl, &itl))) goto out;
    uint64_t t1 = 0;
    size_t nt = 0, np = 0;
    double sum_lat = 0;
    for (int i = 0; i < o->num_prompts; i++) {
        flight *f = &fl[i];
        if (f->t_last > t1) t1 = f->t_last;
        if (!answered(f)) {
            if (!r->first_error[0])
                snprintf(r->first_error, sizeof r->first_error, "%s", f->err[0] ? f->err : "no output in the stream");
            r->failed++;
            continue;
        }
        double lat = (double)(f->t_last - f->t0) * 1e-9;
        if (!f->got_first) f->ttft = lat;
        if (!f->has_usage) f->output_len = f->n_output_events; /* one token per event */
        r->completed++;
        r->total_input += f->in_len;
        r->total_output += f->output_len;
        ttft[nt++] = f->ttft;
        e2e[r->completed - 1] = lat;
        sum_lat += lat;
        const double tp = f->output_len > 1 ? (lat - f->ttft) / (double)(f->output_len - 1) : 0.0; /* vLLM's 0 */
        if (f->output_len > 1) tpot[np++] = tp;
        r->good += (o->slo_ttft_ms <= 0 || 1e3 * f->ttft <= o->slo_ttft_ms) &&
                   (o->slo_tpot_ms <= 0 || 1e3 * tp <= o->slo_tpot_ms) && (o->slo_e2el_ms <= 0 || 1e3 * lat <= o->slo_e2el_ms);
    }
    r->duration_s = (double)(t1 > t0 ? t1 - t0 : 1) * 1e-9;
    r->request_throughput = r->completed / r->duration_s;
    r->input_throughput = (double)r->total_input / r->duration_s;
    r->output_throughput = (double)r->total_output / r->duration_s;
    r->total_throughput = (double)(r->total_input + r->total_output) / r->duration_s;
    r->concurrency_measured = sum_lat / r->duration_s;
    r->request_goodput = r->good / r->duration_s;
    for (size_t i = 0; i < nt; i++) ttft[i] *= 1e3;
    for (size_t i = 0; i < np; i++) tpot[i] *= 1e3;
    for (int i = 0; i < r->completed; i++) e2e[i] *= 1e3;
    for (size_t i = 0; i < itl.n; i++) itl.v[i] *= 1e3;
    summarize(ttft, nt, &r->ttft_mean, &r->ttft_median, &r->ttft_p99, &r->ttft_std);
    summarize(tpot, np, &r->tpot_mean, &r->tpot_median, &r->tpot_p99, &r->tpot_std);
    summarize(e2e, (size_t)r->completed, &r->e2e_mean, &r->e2e_median, &r->e2e_p99, &r->e2e_std);
    summarize(itl.v, itl.n, &r->itl_mean, &r->itl_median, &r->itl_p99, &r->itl_std);
    r->itl_p95 = mr_percentile(itl.v, itl.n, 95);
    for (int k = 0; k < o->n_percentiles; k++) { /* at most MR_BENCH_MAX_PERCENTILES: checked above */
        const double q = o->percentiles[k];
        r->pct_ttft[k] = mr_percentile(ttft, nt, q);
        r->pct_tpot[k] = mr_percentile(tpot, np, q);
        r->pct_itl[k] = mr_percentile(itl.v, itl.n, q);
        r->pct_e2e[k] = mr_percentile(e2e, (size_t)r->completed, q);
    }
    r->itl_max = itl.n ? itl.v[itl.n - 1] : 0; /* sorted by the percentiles */
    if (o->details) st = keep_details(fl, o->num_prompts, r);
out:
    for (int i = 0; bodies && i <= o->num_prompts; i++) free(bodies[i]);
    free(bodies);
    free(info);
    free(arrive);
    for (int i = 0; fl && i < o->num_prompts; i++) sv_buf_free(&fl[i].text), free(fl[i].own_itl.v);
    free(fl);
    free(itl.v);
    free(warm_itl.v);
    free(ttft);
    free(tpot);
    free(e2e);
    return st;
}

mr_status mr_bench_serve_warmup(const mr_bench_serve_opts *o) {
    mr_bench_serve_opts w = *o;
    w.num_prompts = o->warmup_requests > 1 ? o->warmup_requests : 1;
    if (o->dataset && w.num_prompts > o->dataset->n) w.num_prompts = o->dataset->n;
    w.concurrency = w.num_prompts;
    w.repeat_first = true;
    w.warmup = false;
    w.output_len = o->output_len < 32 ? o->output_len : 32;
    w.request_rate = 0;
    w.random_lengths = false;
    w.prefix_len = 0; /* the warm-up warms no group's prefix */
    w.details = false;
    mr_bench_serve_result r;
    mr_status st = mr_bench_serve_run(&w, &r);
    if (!st && r.completed == 0)
        st = mr_error_set(MR_EIO, "bench serve: the warm-up request failed: %s", r.first_error);
    return st;
}
