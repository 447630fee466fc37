/* request.c — the JSON bodies of /v1/completions and /v1/chat/completions
 * into an sv_request, and the error shape of every refusal.
 *
 * Fields (serving.md section 1) are read from one table per endpoint. A
 * field that is not in the table is a 400 naming it; a field the server
 * knows but does not implement (best_of > 1, suffix, EBNF grammars,
 * ...) is a 400 naming it unless it carries its
 * neutral value (null, 0, 1, empty), which is what benchmark clients send. null is "absent" for every field.
 * Types and ranges are checked here, where the input enters; the checks
 * that need the tokenizer (prompt length against the context) come later,
 * in the HTTP layer. Integers may be written as integral reals (16.0), as
 * pydantic-based servers accept them. Duplicate keys are refused. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/json_internal.h"
#include "moerun/grammar.h"
#include "serve/serve_internal.h"

/* ---- errors ---- */

int sv_fail(sv_error *e, int http, const char *param, const char *fmt, ...) {
    e->http = http;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* the word w (not inside a longer name) in the message replaced by to, everywhere */
static void rename_word(char *msg, size_t cap, const char *w, const char *to) {
    const size_t n = strlen(w);
    for (char *p = msg; (p = strstr(p, w));) {
        const bool alone = (p == msg || !(isalnum((unsigned char)p[-1]) || p[-1] == '_')) &&
                           !(isalnum((unsigned char)p[n]) || p[n] == '_');
        if (!alone) {
            p += n;
            continue;
        }
        char tail[sizeof ((sv_error *)0)->message];
        snprintf(tail, sizeof tail, "%s", p + n);
        snprintf(p, cap - (size_t)(p - msg), "%s%s", to, tail);
        p += strlen(to);
        if ((size_t)(p - msg) >= cap - 1) break;
    }
}

void sv_error_rename(sv_error *e, const char *from, const char *to_param, const char *to_word) {
    const size_t n = strlen(from);
    if (to_word) rename_word(e->message, sizeof e->message, from, to_word);
    if (strncmp(e->param, from, n) || (e->param[n] && e->param[n] != '.' && e->param[n] != '[')) return;
    char rest[sizeof e->param];
    snprintf(rest, sizeof rest, "%s", e->param + n);
    snprintf(e->param, sizeof e->param, "%s%s", to_param, rest);
}

const char *sv_error_type(int http) {
    switch (http) {
    case 400: case 405: case 413: case 415: case 431: case 501: return "invalid_request_error";
    case 409: return "conflict_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 503: return "unavailable_error";
    default: return "server_error";
    }
}

char *sv_error_body(const sv_error *e) {
    /* written by hand rather than with json_pack: the message may quote the
     * client's bytes (jansson's parse errors do), and those need not be UTF-8 */
    sv_buf b = {0};
    if (sv_buf_lit(&b, "{\"error\":{\"message\":") || sv_buf_json_str(&b, e->message, strlen(e->message)) ||
        sv_buf_printf(&b, ",\"type\":\"%s\",\"param\":", sv_error_type(e->http)) ||
        (e->param[0] ? sv_buf_json_str(&b, e->param, strlen(e->param)) : sv_buf_lit(&b, "null")) ||
        sv_buf_printf(&b, ",\"code\":%d}}", e->http)) {
        sv_buf_free(&b);
        return NULL;
    }
    return b.p;
}

json_t *sv_body_object(const char *body, size_t len, sv_error *e) {
    if (!sv_json_depth_ok(body, len, SV_MAX_JSON_DEPTH, e)) return NULL;
    json_error_t je;
    json_t *req = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!req) return sv_fail(e, 400, NULL, "the body is not JSON: %s (line %d, column %d)", je.text, je.line, je.column), NULL;
    if (!json_is_object(req)) {
        json_decref(req);
        return sv_fail(e, 400, NULL, "the body must be a JSON object"), NULL;
    }
    return req;
}

bool sv_json_depth_ok(const char *body, size_t len, int max_depth, sv_error *e) {
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char ch = body[i];
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max_depth) {
                sv_fail(e, 400, NULL, "the body nests deeper than %d levels", max_depth);
                return false;
            }
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return true;
}

/* ---- request ---- */

void sv_request_free(sv_request *r) {
    if (!r) return;
    mr_free(r->model);
    mr_free(r->cache_salt);
    for (int i = 0; i < r->n_prompts; i++) {
        mr_free(r->prompts[i].text);
        mr_free(r->prompts[i].ids);
    }
    mr_free(r->prompts);
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->chat_template_kwargs);
    json_decref(r->resp_echo);
    json_decref(r->resp_ctx);
    json_decref(r->resp_conv_input);
    if (r->resp_convs) sv_conv_release(r->resp_convs, r->resp_conv, r->resp_id, r->resp_conv_reserved);
    json_decref(r->sgl_meta);
    mr_free(r->tool_name);
    json_decref(r->so_schema);
    json_decref(r->so_choice);
    mr_grammar_free(r->grammar);
    mr_grammar_free(r->grammar_native);
    for (int i = 0; i < r->n_stop; i++) mr_free(r->stop[i]);
    mr_free(r->forced_text);
    mr_free(r->forced_ids);
    mr_free(r->logit_bias);
    mr_free(r->allowed);
    for (int i = 0; i < r->n_bad_words; i++) mr_free(r->bad_words[i]);
    mr_free(r->bad_ids);
    memset(r, 0, sizeof *r);
}

const char *sv_json_type(const json_t *v) {
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* An integer (or an integral real) in [lo, hi]. */
static int get_int(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out, sv_error *e) {
    int64_t x = 0;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d == floor(d)) || !(fabs(d) < 9.0e18)) return sv_fail(e, 400, name, "%s must be an integer, got %g", name, d);
        x = (int64_t)d;
    } else {
        return sv_fail(e, 400, name, "%s must be an integer, got %s", name, sv_json_type(v));
    }
    if (x < lo || x > hi)
        return sv_fail(e, 400, name, "%s is %lld; it must be in [%lld, %lld]", name, (long long)x, (long long)lo,
                       (long long)hi);
    *out = x;
    return 0;
}

static int get_num(const json_t *v, const char *name, double lo, double hi, double *out, sv_error *e) {
    if (!json_is_number(v)) return sv_fail(e, 400, name, "%s must be a number, got %s", name, sv_json_type(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return sv_fail(e, 400, name, "%s is %g; it must be in [%g, %g]", name, x, lo, hi);
    *out = x;
    return 0;
}

/* a number in (0, hi] */
static int get_pos_num(const json_t *v, const char *name, double hi, double *out, sv_error *e) {
    if (!json_is_number(v)) return sv_fail(e, 400, name, "%s must be a number, got %s", name, sv_json_type(v));
    double x = json_number_value(v);
    if (!(x > 0.0 && x <= hi)) return sv_fail(e, 400, name, "%s is %g; it must be in (0, %g]", name, x, hi);
    *out = x;
    return 0;
}

static int get_bool(const json_t *v, const char *name, bool *out, sv_error *e) {
    if (!json_is_boolean(v)) return sv_fail(e, 400, name, "%s must be a boolean, got %s", name, sv_json_type(v));
    *out = json_is_true(v);
    return 0;
}

static int dup_string(const json_t *v, const char *name, char **out, sv_error *e) {
    if (!json_is_string(v)) return sv_fail(e, 400, name, "%s must be a string, got %s", name, sv_json_type(v));
    char *s = mr_malloc(json_string_length(v) + 1);
    if (!s) return sv_fail(e, 500, NULL, "out of memory");
    memcpy(s, json_string_value(v), json_string_length(v) + 1);
    *out = s;
    return 0;
}

/* Refuses a field the server does not implement unless it holds its neutral value. */
static int unsupported(const char *name, const char *what, sv_error *e) {
    return sv_fail(e, 400, name, "%s is not supported by this server%s%s", name, what ? ": " : "", what ? what : "");
}

/* ---- the fields ---- */

typedef int (*field_fn)(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e);

static int f_model(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return dup_string(v, "model", &r->model, e);
}

/* A list of token ids: a non-empty array of integers in [0, vocab). */
static int id_list(const json_t *v, const char *name, const sv_limits *lim, int32_t **ids, int64_t *n, sv_error *e) {
    size_t k = json_array_size(v);
    if (k == 0) return sv_fail(e, 400, name, "%s is an empty list of token ids", name);
    int32_t *p = mr_malloc(k * sizeof(int32_t));
    if (!p) return sv_fail(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < k; i++) {
        const json_t *x = json_array_get(v, i);
        char nm[96];
        snprintf(nm, sizeof nm, "%s[%zu]", name, i);
        int64_t id;
        if (!json_is_integer(x)) {
            mr_free(p);
            return sv_fail(e, 400, nm, "%s must be a token id (an integer), got %s", nm, sv_json_type(x));
        }
        id = (int64_t)json_integer_value(x);
        if (id < 0 || id >= lim->vocab) {
            mr_free(p);
            return sv_fail(e, 400, nm, "%s is token id %lld, outside the vocabulary [0, %lld)", nm, (long long)id,
                           (long long)lim->vocab);
        }
        p[i] = (int32_t)id;
    }
    *ids = p;
    *n = (int64_t)k;
    return 0;
}

static int f_prompt(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    if (json_is_string(v)) {
        if (!(r->prompts = mr_calloc(1, sizeof(sv_prompt)))) return sv_fail(e, 500, NULL, "out of memory");
        r->n_prompts = 1;
        return dup_string(v, "prompt", &r->prompts[0].text, e);
    }
    if (!json_is_array(v))
        return sv_fail(e, 400, "prompt", "prompt must be a string, a list of strings, a list of token ids or a list of "
                       "lists of token ids; got %s", sv_json_type(v));
    size_t k = json_array_size(v);
    if (k == 0) return sv_fail(e, 400, "prompt", "prompt is an empty list");
    const json_t *first = json_array_get(v, 0);
    if (json_is_integer(first)) { /* one prompt of ids */
        if (!(r->prompts = mr_calloc(1, sizeof(sv_prompt)))) return sv_fail(e, 500, NULL, "out of memory");
        r->n_prompts = 1;
        return id_list(v, "prompt", lim, &r->prompts[0].ids, &r->prompts[0].n_ids, e);
    }
    if (k > (size_t)lim->max_choices)
        return sv_fail(e, 400, "prompt", "prompt holds %zu prompts; this server takes at most %d per request "
                       "(--max-choices)", k, lim->max_choices);
    if (!(r->prompts = mr_calloc(k, sizeof(sv_prompt)))) return sv_fail(e, 500, NULL, "out of memory");
    r->n_prompts = (int)k;
    for (size_t i = 0; i < k; i++) {
        const json_t *x = json_array_get(v, i);
        char nm[48];
        snprintf(nm, sizeof nm, "prompt[%zu]", i);
        if (json_is_string(first)) {
            if (!json_is_string(x))
                return sv_fail(e, 400, nm, "%s must be a string like prompt[0], got %s", nm, sv_json_type(x));
            if (dup_string(x, nm, &r->prompts[i].text, e)) return -1;
        } else if (json_is_array(first)) {
            if (!json_is_array(x))
                return sv_fail(e, 400, nm, "%s must be a list of token ids like prompt[0], got %s", nm, sv_json_type(x));
            if (id_list(x, nm, lim, &r->prompts[i].ids, &r->prompts[i].n_ids, e)) return -1;
        } else {
            return sv_fail(e, 400, "prompt[0]", "prompt[0] must be a string, a token id or a list of token ids, got %s",
                           sv_json_type(first));
        }
    }
    return 0;
}

static int f_max_tokens_named(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e, const char *name) {
    int64_t x = 0;
    /* max_tokens 0: completions with echo only (checked after every field) */
    const int64_t lo = strcmp(name, "max_tokens") ? 1 : 0;
    if (get_int(v, name, INT64_MIN, INT64_MAX, &x, e)) return -1;
    if (x < lo) /* the range this server takes, as the max_tokens 0 error gives it */
        return sv_fail(e, 400, name, "%s is %lld; it must be in [1, %lld]", name, (long long)x,
                       (long long)lim->max_completion_tokens);
    if (x > lim->max_completion_tokens)
        return sv_fail(e, 400, name, "%s is %lld, above this server's limit of %lld (--max-completion-tokens)", name,
                       (long long)x, (long long)lim->max_completion_tokens);
    r->max_tokens = x;
    return 0;
}
static int f_max_tokens(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    return f_max_tokens_named(r, v, lim, e, "max_tokens");
}
static int f_max_completion_tokens(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    return f_max_tokens_named(r, v, lim, e, "max_completion_tokens");
}

static int f_temperature(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    double x = 0;
    if (get_num(v, "temperature", 0.0, 2.0, &x, e)) return -1;
    r->temperature = (float)x;
    r->has_temperature = true;
    return 0;
}
static int f_top_p(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    double x = 0;
    if (get_pos_num(v, "top_p", 1.0, &x, e)) return -1;
    r->top_p = (float)x;
    r->has_top_p = true;
    return 0;
}
static int f_top_k(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    int64_t x = 0;
    if (get_int(v, "top_k", -1, INT32_MAX, &x, e)) return -1;
    r->top_k = x < 0 ? 0 : (int)x; /* -1 (vLLM) and 0 (llama-server) both mean off */
    r->has_top_k = true;
    return 0;
}
static int f_min_p(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    double x = 0;
    if (get_num(v, "min_p", 0.0, 1.0, &x, e)) return -1;
    r->min_p = (float)x;
    r->has_min_p = true;
    return 0;
}
static int f_seed(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    int64_t x = 0;
    if (get_int(v, "seed", INT64_MIN, INT64_MAX, &x, e)) return -1;
    r->seed = (uint64_t)x;
    r->has_seed = true;
    return 0;
}

static int one_stop(sv_request *r, const json_t *x, const char *nm, sv_error *e) {
    if (!json_is_string(x)) return sv_fail(e, 400, nm, "%s must be a string, got %s", nm, sv_json_type(x));
    size_t n = json_string_length(x);
    if (n == 0) return sv_fail(e, 400, nm, "%s is an empty stop string", nm);
    if (n > SV_MAX_STOP_BYTES)
        return sv_fail(e, 400, nm, "%s is %zu bytes long; stop strings are at most %d bytes", nm, n, SV_MAX_STOP_BYTES);
    if (r->n_stop == SV_MAX_STOP)
        return sv_fail(e, 400, "stop", "stop holds more than %d strings", SV_MAX_STOP);
    return dup_string(x, nm, &r->stop[r->n_stop++], e);
}
static int f_stop(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (json_is_string(v)) return one_stop(r, v, "stop", e);
    if (!json_is_array(v)) return sv_fail(e, 400, "stop", "stop must be a string or a list of strings, got %s", sv_json_type(v));
    if (json_array_size(v) > SV_MAX_STOP)
        return sv_fail(e, 400, "stop", "stop holds %zu strings; at most %d are allowed", json_array_size(v), SV_MAX_STOP);
    for (size_t i = 0; i < json_array_size(v); i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "stop[%zu]", i);
        if (one_stop(r, json_array_get(v, i), nm, e)) return -1;
    }
    return 0;
}
/* A list of token ids named name, up to max entries, each in the vocabulary, into out[*n]. */
static int get_token_ids(const json_t *v, const char *name, size_t max, const sv_limits *lim, int32_t *out, int64_t *n,
                         sv_error *e) {
    if (!json_is_array(v)) return sv_fail(e, 400, name, "%s must be a list of token ids, got %s", name, sv_json_type(v));
    if (json_array_size(v) > max)
        return sv_fail(e, 400, name, "%s holds %zu ids; at most %zu are allowed", name, json_array_size(v), max);
    for (size_t i = 0; i < json_array_size(v); i++) {
        char nm[48];
        snprintf(nm, sizeof nm, "%s[%zu]", name, i);
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) return sv_fail(e, 400, nm, "%s must be a token id (an integer), got %s", nm, sv_json_type(x));
        int64_t id = (int64_t)json_integer_value(x);
        if (id < 0 || id >= lim->vocab)
            return sv_fail(e, 400, nm, "%s is token id %lld, outside the vocabulary [0, %lld)", nm, (long long)id,
                           (long long)lim->vocab);
        out[(*n)++] = (int32_t)id;
    }
    return 0;
}
static int f_stop_token_ids(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    int64_t n = 0;
    int rc = get_token_ids(v, "stop_token_ids", SV_MAX_STOP_IDS, lim, r->stop_ids, &n, e);
    r->n_stop_ids = (int)n;
    return rc;
}
static int f_ignore_eos(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "ignore_eos", &r->ignore_eos, e);
}
static int f_n(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    int64_t x = 0;
    if (get_int(v, "n", 1, lim->max_choices, &x, e)) return -1;
    r->n = (int)x;
    return 0;
}
static int f_best_of(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)r;
    int64_t x = 0;
    if (get_int(v, "best_of", 1, lim->max_choices, &x, e)) return -1;
    if (x != 1) return unsupported("best_of", "only best_of 1 (each choice is returned)", e);
    return 0;
}
static int f_stream(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "stream", &r->stream, e);
}
static int f_stream_options(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (!json_is_object(v)) return sv_fail(e, 400, "stream_options", "stream_options must be an object, got %s", sv_json_type(v));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (json_is_null(x)) continue;
        if (!strcmp(k, "include_usage")) {
            if (get_bool(x, "stream_options.include_usage", &r->include_usage, e)) return -1;
        } else if (!strcmp(k, "continuous_usage_stats")) {
            if (get_bool(x, "stream_options.continuous_usage_stats", &r->continuous_usage, e)) return -1;
        } else {
            char nm[96];
            snprintf(nm, sizeof nm, "stream_options.%.60s", k);
            return sv_fail(e, 400, nm, "unknown field %s", nm);
        }
    }
    return 0;
}
static int f_logprobs_cmpl(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    int64_t x = 0;
    if (get_int(v, "logprobs", 0, SV_MAX_TOP_LOGPROBS, &x, e)) return -1;
    r->logprobs = true;
    r->top_logprobs = (int)x;
    return 0;
}
static int f_logprobs_chat(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "logprobs", &r->logprobs, e);
}
static int f_top_logprobs(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    int64_t x = 0;
    if (get_int(v, "top_logprobs", 0, SV_MAX_TOP_LOGPROBS, &x, e)) return -1;
    r->top_logprobs = (int)x;
    return 0;
}
static int f_echo(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "echo", &r->echo, e);
}
static int f_presence_penalty(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    double x = 0;
    if (get_num(v, "presence_penalty", -2.0, 2.0, &x, e)) return -1;
    r->presence_penalty = (float)x;
    return 0;
}
static int f_frequency_penalty(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    double x = 0;
    if (get_num(v, "frequency_penalty", -2.0, 2.0, &x, e)) return -1;
    r->frequency_penalty = (float)x;
    return 0;
}
static int f_repetition_penalty(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    double x = 0;
    if (get_pos_num(v, "repetition_penalty", 10.0, &x, e)) return -1;
    r->repetition_penalty = (float)x;
    r->has_repetition_penalty = true;
    return 0;
}
/* {"token id": bias}: ids as decimal strings (OpenAI's shape), biases in
 * [-100, 100] (OpenAI's range; a value outside is a 400, not clamped) */
static int f_logit_bias(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    if (!json_is_object(v)) return sv_fail(e, 400, "logit_bias", "logit_bias must be an object, got %s", sv_json_type(v));
    size_t n = json_object_size(v);
    if (n > MR_ENGINE_MAX_LOGIT_BIAS)
        return sv_fail(e, 400, "logit_bias", "logit_bias holds %zu entries; at most %d are allowed", n,
                       MR_ENGINE_MAX_LOGIT_BIAS);
    if (!n) return 0;
    r->logit_bias = mr_malloc(n * sizeof *r->logit_bias);
    if (!r->logit_bias) return sv_fail(e, 500, NULL, "out of memory");
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        char nm[48];
        snprintf(nm, sizeof nm, "logit_bias[%.24s]", key);
        const char *q = key;
        int64_t id = 0;
        bool ok = *q != 0 && strlen(q) <= 10;
        for (; ok && *q; q++) {
            if (*q < '0' || *q > '9') ok = false;
            else id = id * 10 + (*q - '0');
        }
        if (!ok) return sv_fail(e, 400, nm, "logit_bias keys must be token ids (decimal digits, at most 10), got \"%.24s\"", key);
        if (id >= lim->vocab)
            return sv_fail(e, 400, nm, "%s: token id %lld is outside the vocabulary [0, %lld)", nm, (long long)id,
                           (long long)lim->vocab);
        double b = 0;
        if (get_num(x, nm, -100.0, 100.0, &b, e)) return -1;
        r->logit_bias[r->n_logit_bias++] = (mr_logit_bias){(int32_t)id, (float)b};
    }
    return 0;
}
static int f_priority(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    if (!json_is_integer(v)) return sv_fail(e, 400, "priority", "priority must be an integer, got %s", sv_json_type(v));
    r->priority = (int64_t)json_integer_value(v);
    if (r->priority != 0 && !lim->priority)
        return sv_fail(e, 400, "priority", "priority %lld: this server schedules first come, first served (start it with "
                       "--scheduling-policy priority to order requests by priority)", (long long)r->priority);
    return 0;
}

static int f_return_token_ids(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "return_token_ids", &r->return_token_ids, e);
}
static int f_tokens_as_ids(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "return_tokens_as_token_ids", &r->tokens_as_ids, e);
}

/* vLLM's cache_salt: the request shares prefix-cache blocks only with requests of the same salt */
static int f_cache_salt(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (!json_is_string(v) || json_string_length(v) == 0)
        return sv_fail(e, 400, "cache_salt", "cache_salt must be a non-empty string, got %s",
                       json_is_string(v) ? "an empty one" : sv_json_type(v));
    if (json_string_length(v) > MR_ENGINE_MAX_CACHE_SALT)
        return sv_fail(e, 400, "cache_salt", "cache_salt is %zu bytes; at most %d", json_string_length(v),
                       MR_ENGINE_MAX_CACHE_SALT);
    r->n_cache_salt = json_string_length(v);
    return dup_string(v, "cache_salt", &r->cache_salt, e);
}

static int f_user(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)r, (void)lim;
    if (!json_is_string(v)) return sv_fail(e, 400, "user", "user must be a string, got %s", sv_json_type(v));
    return 0; /* an end-user id for abuse tracking: nothing to do with it */
}
static int f_suffix(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)r, (void)lim;
    if (!json_is_string(v)) return sv_fail(e, 400, "suffix", "suffix must be a string, got %s", sv_json_type(v));
    return json_string_length(v) ? unsupported("suffix", NULL, e) : 0;
}
static int f_skip_special(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "skip_special_tokens", &r->skip_special_tokens, e);
}
static int f_include_stop(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "include_stop_str_in_output", &r->include_stop_str, e);
}
static int f_min_tokens(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    return get_int(v, "min_tokens", 0, lim->max_completion_tokens, &r->min_tokens, e);
}
static int f_allowed_token_ids(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    if (json_is_array(v) && json_array_size(v) == 0)
        return sv_fail(e, 400, "allowed_token_ids", "allowed_token_ids is an empty list (nothing could be sampled)");
    if (json_is_array(v) && !(r->allowed = mr_malloc(json_array_size(v) * sizeof *r->allowed)))
        return sv_fail(e, 500, NULL, "out of memory");
    return get_token_ids(v, "allowed_token_ids", (size_t)lim->vocab, lim, r->allowed, &r->n_allowed, e);
}
static int f_bad_words(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (!json_is_array(v)) return sv_fail(e, 400, "bad_words", "bad_words must be a list of strings, got %s", sv_json_type(v));
    if (json_array_size(v) > SV_MAX_BAD_WORDS)
        return sv_fail(e, 400, "bad_words", "bad_words holds %zu strings; at most %d are allowed", json_array_size(v),
                       SV_MAX_BAD_WORDS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "bad_words[%zu]", i);
        const json_t *x = json_array_get(v, i);
        if (json_is_string(x) && json_string_length(x) == 0) return sv_fail(e, 400, nm, "%s is an empty string", nm);
        if (json_is_string(x) && json_string_length(x) > SV_MAX_STOP_BYTES)
            return sv_fail(e, 400, nm, "%s is %zu bytes long; bad words are at most %d bytes", nm, json_string_length(x),
                           SV_MAX_STOP_BYTES);
        if (dup_string(x, nm, &r->bad_words[r->n_bad_words], e)) return -1;
        r->n_bad_words++;
    }
    return 0;
}
static int f_truncate_prompt_tokens(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (get_int(v, "truncate_prompt_tokens", -1, INT64_MAX, &r->truncate_prompt_tokens, e)) return -1;
    if (r->truncate_prompt_tokens == 0)
        return sv_fail(e, 400, "truncate_prompt_tokens", "truncate_prompt_tokens is 0; it must be >= 1, or -1 for the "
                       "context length");
    return 0;
}
static int f_prompt_logprobs(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    int64_t x = 0;
    if (get_int(v, "prompt_logprobs", 0, SV_MAX_TOP_LOGPROBS, &x, e)) return -1;
    r->prompt_logprobs = (int)x;
    return 0;
}
/* One source of structured outputs per request. */
static int so_set(sv_request *r, sv_so kind, const char *field, const json_t *schema, const json_t *choice, sv_error *e) {
    if (r->so) return sv_fail(e, 400, field, "%s and %s both ask for structured outputs; give one", r->so_field, field);
    r->so = kind;
    snprintf(r->so_field, sizeof r->so_field, "%s", field);
    r->so_schema = schema ? json_incref((json_t *)schema) : NULL;
    r->so_choice = choice ? json_incref((json_t *)choice) : NULL;
    return 0;
}
/* An object given as itself or as a string of its JSON text (vLLM's guided_json takes both; vLLM's
 * structured_outputs.structural_tag and sglang's sampling_params.structural_tag are JSON text): what names
 * what it must be in the errors. */
static int so_object(sv_request *r, sv_so kind, const json_t *v, const char *field, const char *what, sv_error *e) {
    if (json_is_object(v)) return so_set(r, kind, field, v, NULL, e);
    if (!json_is_string(v)) return sv_fail(e, 400, field, "%s must be %s (an object, or its JSON text), got %s", field, what,
                                           sv_json_type(v));
    json_t *x = json_loads(json_string_value(v), 0, NULL);
    if (!json_is_object(x)) {
        json_decref(x);
        return sv_fail(e, 400, field, "%s is a string that is not %s in JSON text", field, what);
    }
    int rc = so_set(r, kind, field, x, NULL, e);
    json_decref(x);
    return rc;
}
static int so_schema(sv_request *r, const json_t *v, const char *field, sv_error *e) {
    if (json_is_true(v)) return so_set(r, SV_SO_JSON, field, NULL, NULL, e);
    return so_object(r, SV_SO_JSON, v, field, "a JSON schema", e);
}
static int so_choice(sv_request *r, const json_t *v, const char *field, sv_error *e) {
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (!n) return sv_fail(e, 400, field, "%s must be a non-empty list of strings", field);
    for (size_t i = 0; i < n; i++)
        if (!json_is_string(json_array_get(v, i)) || !json_string_length(json_array_get(v, i)))
            return sv_fail(e, 400, field, "%s[%zu] must be a non-empty string", field, i);
    return so_set(r, SV_SO_CHOICE, field, NULL, v, e);
}
static int so_regex(sv_request *r, const json_t *v, const char *field, sv_error *e) {
    if (!json_is_string(v)) return sv_fail(e, 400, field, "%s must be a string (a regular expression), got %s", field, sv_json_type(v));
    return so_set(r, SV_SO_REGEX, field, v, NULL, e);
}
static int so_ebnf(sv_request *r, const json_t *v, const char *field, sv_error *e) {
    if (!json_is_string(v)) return sv_fail(e, 400, field, "%s must be a string (an EBNF grammar), got %s", field, sv_json_type(v));
    return so_set(r, SV_SO_EBNF, field, v, NULL, e);
}
/* A structural tag (xgrammar's; mr_grammar_structural_tag reads it). */
static int so_tags(sv_request *r, const json_t *v, const char *field, sv_error *e) {
    return so_object(r, SV_SO_TAGS, v, field, "a structural tag", e);
}
/* OpenAI's: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}; vLLM's
 * and sglang's {"type": "structural_tag", "structures", "triggers"} or {"type": "structural_tag", "format"} */
static int f_response_format(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (!json_is_object(v)) return sv_fail(e, 400, "response_format", "response_format must be an object, got %s", sv_json_type(v));
    const json_t *t = json_object_get(v, "type");
    if (!json_is_string(t)) return sv_fail(e, 400, "response_format.type", "response_format.type must be a string");
    const char *ts = json_string_value(t);
    if (!strcmp(ts, "text")) return 0;
    if (!strcmp(ts, "json_object")) return so_set(r, SV_SO_JSON, "response_format", NULL, NULL, e);
    if (!strcmp(ts, "json_schema")) {
        const json_t *js = json_object_get(v, "json_schema");
        if (!json_is_object(js))
            return sv_fail(e, 400, "response_format.json_schema", "response_format.json_schema must be an object");
        const json_t *sc = json_object_get(js, "schema");
        if (!sc || json_is_null(sc)) return so_set(r, SV_SO_JSON, "response_format", NULL, NULL, e);
        return so_schema(r, sc, "response_format.json_schema.schema", e);
    }
    if (!strcmp(ts, "structural_tag")) return so_tags(r, v, "response_format", e);
    return sv_fail(e, 400, "response_format.type",
                   "response_format.type is \"%.40s\"; it must be \"text\", \"json_object\", \"json_schema\" or "
                   "\"structural_tag\"", ts);
}
/* vLLM's guided_json, guided_choice, guided_regex, guided_grammar and structured_outputs {"json" | "choice" |
 * "json_object" | "regex" | "grammar"}; sglang's regex and ebnf */
static int f_guided_json(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return so_schema(r, v, "guided_json", e);
}
static int f_guided_choice(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return so_choice(r, v, "guided_choice", e);
}
static int f_guided_regex(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return so_regex(r, v, "guided_regex", e);
}
static int f_regex(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return so_regex(r, v, "regex", e);
}
static int f_guided_grammar(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return so_ebnf(r, v, "guided_grammar", e);
}
static int f_ebnf(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return so_ebnf(r, v, "ebnf", e);
}
static int f_structural_tag(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return so_tags(r, v, "structural_tag", e);
}
static int f_structured_outputs(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (!json_is_object(v))
        return sv_fail(e, 400, "structured_outputs", "structured_outputs must be an object, got %s", sv_json_type(v));
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (json_is_null(x)) continue;
        int rc;
        if (!strcmp(k, "json")) rc = so_schema(r, x, "structured_outputs.json", e);
        else if (!strcmp(k, "choice")) rc = so_choice(r, x, "structured_outputs.choice", e);
        else if (!strcmp(k, "json_object")) rc = json_is_true(x) ? so_set(r, SV_SO_JSON, "structured_outputs.json_object", NULL, NULL, e) : 0;
        else if (!strcmp(k, "regex")) rc = so_regex(r, x, "structured_outputs.regex", e);
        else if (!strcmp(k, "grammar")) rc = so_ebnf(r, x, "structured_outputs.grammar", e);
        else if (!strcmp(k, "structural_tag")) rc = so_tags(r, x, "structured_outputs.structural_tag", e);
        else if (!strcmp(k, "disable_any_whitespace")) {
            if (!json_is_boolean(x))
                return sv_fail(e, 400, "structured_outputs.disable_any_whitespace", "must be a boolean");
            r->so_compact = json_is_true(x);
            rc = 0;
        } else
            continue; /* options of other backends (disable_fallback, ...) */
        if (rc) return rc;
    }
    return 0;
}
static int f_chat_template_kwargs(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (!json_is_object(v))
        return sv_fail(e, 400, "chat_template_kwargs", "chat_template_kwargs must be an object, got %s", sv_json_type(v));
    r->chat_template_kwargs = json_incref((json_t *)v);
    return 0;
}
/* OpenAI's and vLLM's reasoning_effort: checked here, handed to the chat template as
 * chat_template_kwargs.reasoning_effort (below, once every field is read; an explicit kwarg wins) */
static int f_reasoning_effort(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)r, (void)lim;
    static const char *const ok[] = {"none", "minimal", "low", "medium", "high"};
    for (size_t i = 0; json_is_string(v) && i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(json_string_value(v), ok[i])) return 0;
    return sv_fail(e, 400, "reasoning_effort", "reasoning_effort must be none, minimal, low, medium or high");
}
static int f_add_generation_prompt(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    r->agp_given = true;
    return get_bool(v, "add_generation_prompt", &r->add_generation_prompt, e);
}
static int f_continue_final(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "continue_final_message", &r->continue_final, e);
}
static int f_forced(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    if (json_is_string(v)) return dup_string(v, "debug_forced_output", &r->forced_text, e);
    if (json_is_array(v)) return id_list(v, "debug_forced_output", lim, &r->forced_ids, &r->n_forced_ids, e);
    return sv_fail(e, 400, "debug_forced_output", "debug_forced_output must be a string or a list of token ids");
}
static int f_separate_reasoning(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    return get_bool(v, "separate_reasoning", &r->separate_reasoning, e);
}
static int f_parallel_tool_calls(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    bool b = true;
    if (get_bool(v, "parallel_tool_calls", &b, e)) return -1;
    r->one_tool_call = !b;
    return 0;
}
static int f_tool_choice(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "auto")) return (r->tool_choice = SV_TOOLS_AUTO), 0;
        if (!strcmp(s, "none")) return (r->tool_choice = SV_TOOLS_NONE), 0;
        if (!strcmp(s, "required")) return (r->tool_choice = SV_TOOLS_REQUIRED), 0;
        return sv_fail(e, 400, "tool_choice", "tool_choice is \"%.40s\"; it must be \"auto\", \"none\" or \"required\"", s);
    }
    if (json_is_object(v)) { /* {"type": "function", "function": {"name": ...}} */
        const json_t *nm = json_object_get(json_object_get(v, "function"), "name");
        if (!json_is_string(nm))
            return sv_fail(e, 400, "tool_choice.function.name", "tool_choice names a function: {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}");
        r->tool_choice = SV_TOOLS_NAMED;
        return dup_string(nm, "tool_choice.function.name", &r->tool_name, e);
    }
    return sv_fail(e, 400, "tool_choice", "tool_choice must be a string or an object, got %s", sv_json_type(v));
}

/* The grammar of structured outputs or of tool_choice required / named (after every field is read). */
static int compile_grammar(sv_request *r, sv_error *e) {
    bool tools_forced = r->tool_choice == SV_TOOLS_REQUIRED || r->tool_choice == SV_TOOLS_NAMED;
    if (tools_forced && !json_array_size(r->tools))
        return sv_fail(e, 400, "tool_choice", "tool_choice \"required\" or a named function needs tools");
    if (tools_forced && r->so)
        return sv_fail(e, 400, r->so_field, "%s and tool_choice %s both constrain the output; give one", r->so_field,
                       r->tool_choice == SV_TOOLS_REQUIRED ? "\"required\"" : "naming a function");
    bool strict = false; /* tool_choice auto with a strict tool: the calls follow the tools */
    for (size_t i = 0; r->tool_choice == SV_TOOLS_AUTO && i < json_array_size(r->tools); i++)
        strict |= json_is_true(json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "strict"));
    if (strict && r->so)
        return sv_fail(e, 400, r->so_field, "%s and strict tools both constrain the output; give one (or drop strict)",
                       r->so_field);
    mr_status st = MR_OK;
    const char *field = r->so_field;
    if (strict) {
        field = "tools";
        st = mr_grammar_minimax_tools(r->tools, r->one_tool_call ? 1 : 0, &r->grammar);
        r->grammar_tools = true;
    } else if (tools_forced) {
        field = r->tool_choice == SV_TOOLS_NAMED ? "tool_choice.function.name" : "tools";
        st = mr_grammar_tool_calls(r->tools, r->tool_name, r->one_tool_call ? 1 : 0, &r->grammar);
        /* and in MiniMax-M2's own format, which a model of that format writes instead (http.c); a tool whose
         * string rules raw text cannot keep leaves the JSON form alone */
        if (!st && mr_grammar_minimax_forced(r->tools, r->tool_name, r->one_tool_call ? 1 : 0, &r->grammar_native) == MR_ENOMEM)
            return sv_fail(e, 500, NULL, "out of memory");
    } else if (r->so == SV_SO_JSON) {
        st = mr_grammar_json_schema(r->so_schema, &r->grammar);
    } else if (r->so == SV_SO_CHOICE) {
        size_t n = json_array_size(r->so_choice);
        const char **c = mr_malloc(n * sizeof *c);
        if (!c) return sv_fail(e, 500, NULL, "out of memory");
        for (size_t i = 0; i < n; i++) c[i] = json_string_value(json_array_get(r->so_choice, i));
        st = mr_grammar_choice(c, n, &r->grammar);
        mr_free(c);
    } else if (r->so == SV_SO_REGEX) {
        st = mr_grammar_regex(json_string_value(r->so_schema), &r->grammar);
    } else if (r->so == SV_SO_EBNF) {
        st = mr_grammar_ebnf(json_string_value(r->so_schema), &r->grammar);
    } else if (r->so == SV_SO_TAGS) {
        st = mr_grammar_structural_tag(r->so_schema, &r->grammar);
    }
    if (st == MR_ENOMEM) return sv_fail(e, 500, NULL, "out of memory");
    if (st) return sv_fail(e, 400, field, "%s: %s", field, mr_error_last());
    return 0;
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}] */
static int f_tools(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (!json_is_array(v)) return sv_fail(e, 400, "tools", "tools must be a list, got %s", sv_json_type(v));
    if (json_array_size(v) > 256) return sv_fail(e, 400, "tools", "tools holds %zu tools; at most 256", json_array_size(v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *t = json_array_get(v, i);
        char nm[64];
        snprintf(nm, sizeof nm, "tools[%zu]", i);
        if (!json_is_object(t)) return sv_fail(e, 400, nm, "%s must be an object, got %s", nm, sv_json_type(t));
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)t, k, x) {
            if (strcmp(k, "type") && strcmp(k, "function")) {
                char f[128];
                snprintf(f, sizeof f, "%s.%.40s", nm, k);
                return sv_fail(e, 400, f, "unknown field %s", f);
            }
        }
        const json_t *ty = json_object_get(t, "type");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))
            return sv_fail(e, 400, nm, "%s.type must be \"function\"", nm);
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn)) return sv_fail(e, 400, nm, "%s.function must be an object", nm);
        json_object_foreach((json_t *)fn, k, x) {
            char f[120];
            snprintf(f, sizeof f, "%s.function.%.40s", nm, k);
            if (!strcmp(k, "name")) {
                if (!json_is_string(x) || !json_string_length(x)) return sv_fail(e, 400, f, "%s must be a non-empty string", f);
            } else if (!strcmp(k, "description")) {
                if (!json_is_string(x) && !json_is_null(x)) return sv_fail(e, 400, f, "%s must be a string", f);
            } else if (!strcmp(k, "parameters")) {
                if (!json_is_object(x) && !json_is_null(x)) return sv_fail(e, 400, f, "%s must be a JSON schema object", f);
            } else if (!strcmp(k, "strict")) {
                if (!json_is_boolean(x) && !json_is_null(x)) return sv_fail(e, 400, f, "%s must be a boolean", f);
            } else {
                return sv_fail(e, 400, f, "unknown field %s", f);
            }
        }
        if (!json_is_string(json_object_get(fn, "name"))) return sv_fail(e, 400, nm, "%s.function.name is required", nm);
    }
    if (json_array_size(v)) r->tools = json_incref((json_t *)v);
    return 0;
}

/* A message's content: a string, or a list of {"type": "text", "text"}
 * parts, which goes to the chat template as it is (as transformers'
 * apply_chat_template passes it; the templates join the parts). *out is a
 * new reference. */
static int content_text(const json_t *c, const char *nm, json_t **out, sv_error *e) {
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return 0;
    }
    if (!json_is_array(c))
        return sv_fail(e, 400, nm, "%s must be a string or a list of content parts, got %s", nm, sv_json_type(c));
    json_t *parts = json_array();
    if (!parts) return sv_fail(e, 500, NULL, "out of memory");
    for (size_t j = 0; j < json_array_size(c); j++) {
        const json_t *p = json_array_get(c, j);
        char pn[200];
        snprintf(pn, sizeof pn, "%s[%zu]", nm, j);
        const json_t *ty = json_is_object(p) ? json_object_get(p, "type") : NULL;
        if (!json_is_string(ty)) {
            json_decref(parts);
            return sv_fail(e, 400, pn, "%s must be an object with a \"type\"", pn);
        }
        if (strcmp(json_string_value(ty), "text")) {
            json_decref(parts);
            return sv_fail(e, 400, pn, "%s is a \"%.40s\" part; this server takes text only", pn, json_string_value(ty));
        }
        const json_t *tx = json_object_get(p, "text");
        if (!json_is_string(tx)) {
            json_decref(parts);
            return sv_fail(e, 400, pn, "%s.text must be a string", pn);
        }
        if (json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", tx))) {
            json_decref(parts);
            return sv_fail(e, 500, NULL, "out of memory");
        }
    }
    *out = parts;
    return 0;
}

/* One assistant tool call, normalized for the template: arguments parsed
 * from their JSON text into a value. */
static int tool_call(const json_t *c, const char *nm, json_t **out, sv_error *e) {
    if (!json_is_object(c)) return sv_fail(e, 400, nm, "%s must be an object", nm);
    const json_t *fn = json_object_get(c, "function");
    const json_t *id = json_object_get(c, "id");
    const json_t *ty = json_object_get(c, "type");
    if (ty && !json_is_null(ty) && (!json_is_string(ty) || strcmp(json_string_value(ty), "function")))
        return sv_fail(e, 400, nm, "%s.type must be \"function\"", nm);
    if (id && !json_is_null(id) && !json_is_string(id)) return sv_fail(e, 400, nm, "%s.id must be a string", nm);
    if (!json_is_object(fn)) return sv_fail(e, 400, nm, "%s.function must be an object", nm);
    const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
    if (!json_is_string(name)) return sv_fail(e, 400, nm, "%s.function.name must be a string", nm);
    json_t *a;
    if (json_is_string(args)) {
        json_error_t je;
        a = mr__json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, &je, NULL);
        if (!a) return sv_fail(e, 400, nm, "%s.function.arguments is not valid JSON: %s", nm, je.text);
    } else if (json_is_object(args)) {
        a = json_incref((json_t *)args);
    } else if (!args || json_is_null(args)) {
        a = json_object();
    } else {
        return sv_fail(e, 400, nm, "%s.function.arguments must be a JSON string", nm);
    }
    *out = json_pack("{s:O?,s:s,s:{s:O,s:o}}", "id", id, "type", "function", "function", "name", name, "arguments", a);
    if (!*out) return sv_fail(e, 500, NULL, "out of memory");
    return 0;
}

/* messages: validated and normalized into a new array that the template reads. */
static int f_messages(sv_request *r, const json_t *v, const sv_limits *lim, sv_error *e) {
    (void)lim;
    if (!json_is_array(v)) return sv_fail(e, 400, "messages", "messages must be a list, got %s", sv_json_type(v));
    size_t k = json_array_size(v);
    if (k == 0) return sv_fail(e, 400, "messages", "messages is an empty list");
    json_t *out = json_array();
    if (!out) return sv_fail(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < k; i++) {
        const json_t *m = json_array_get(v, i);
        char nm[48];
        snprintf(nm, sizeof nm, "messages[%zu]", i);
        json_t *o = NULL;
        if (!json_is_object(m)) {
            sv_fail(e, 400, nm, "%s must be an object, got %s", nm, sv_json_type(m));
            goto bad;
        }
        const json_t *role = json_object_get(m, "role");
        char rn[64];
        snprintf(rn, sizeof rn, "%s.role", nm);
        if (!json_is_string(role)) {
            sv_fail(e, 400, rn, "%s is required (a string)", rn);
            goto bad;
        }
        const char *rs = json_string_value(role);
        bool assistant = !strcmp(rs, "assistant"), tool = !strcmp(rs, "tool");
        if (!assistant && !tool && strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "developer")) {
            sv_fail(e, 400, rn, "%s is \"%.40s\"; it must be system, developer, user, assistant or tool", rn, rs);
            goto bad;
        }
        if (!(o = json_pack("{s:s}", "role", !strcmp(rs, "developer") ? "system" : rs))) goto oom;
        const char *key;
        json_t *x;
        bool has_calls = false;
        json_object_foreach((json_t *)m, key, x) {
            char fn[160];
            snprintf(fn, sizeof fn, "%s.%.40s", nm, key);
            if (!strcmp(key, "role") || json_is_null(x)) continue;
            if (!strcmp(key, "content")) {
                json_t *t = NULL;
                if (content_text(x, fn, &t, e)) goto bad;
                if (json_object_set_new(o, "content", t)) goto oom;
            } else if (!strcmp(key, "name") || (!strcmp(key, "tool_call_id") && tool) ||
                       (assistant && (!strcmp(key, "reasoning_content") || !strcmp(key, "reasoning") ||
                                      !strcmp(key, "thinking")))) {
                if (!json_is_string(x)) {
                    sv_fail(e, 400, fn, "%s must be a string, got %s", fn, sv_json_type(x));
                    goto bad;
                }
                /* an earlier answer's reasoning, under any of the names clients use */
                const char *as = !strcmp(key, "reasoning") || !strcmp(key, "thinking") ? "reasoning_content" : key;
                if (json_object_set(o, as, x)) goto oom;
            } else if (!strcmp(key, "tool_calls") && assistant) {
                if (!json_is_array(x)) {
                    sv_fail(e, 400, fn, "%s must be a list", fn);
                    goto bad;
                }
                json_t *calls = json_array();
                if (!calls || json_object_set_new(o, "tool_calls", calls)) goto oom;
                for (size_t j = 0; j < json_array_size(x); j++) {
                    char cn[200];
                    snprintf(cn, sizeof cn, "%s[%zu]", fn, j);
                    json_t *c;
                    if (tool_call(json_array_get(x, j), cn, &c, e)) goto bad;
                    if (json_array_append_new(calls, c)) goto oom;
                }
                has_calls = json_array_size(x) > 0;
            } else if (!strcmp(key, "refusal") || !strcmp(key, "annotations") || !strcmp(key, "audio") ||
                       !strcmp(key, "function_call")) {
                /* fields of a returned assistant message that clients pass back: only empty values */
                if (assistant && ((json_is_array(x) && !json_array_size(x)) || (json_is_string(x) && !json_string_length(x))))
                    continue;
                sv_fail(e, 400, fn, "%s is not supported by this server", fn);
                goto bad;
            } else {
                sv_fail(e, 400, fn, "unknown field %s", fn);
                goto bad;
            }
        }
        if (!json_object_get(o, "content")) {
            if (!assistant || !has_calls) {
                char cn[64];
                snprintf(cn, sizeof cn, "%s.content", nm);
                if (!assistant) {
                    sv_fail(e, 400, cn, "%s is required", cn);
                    goto bad;
                }
            }
            if (json_object_set_new(o, "content", json_string(""))) goto oom;
        }
        if (json_array_append_new(out, o)) {
            o = NULL;
            goto oom;
        }
        continue;
    oom:
        sv_fail(e, 500, NULL, "out of memory");
    bad:
        json_decref(o);
        json_decref(out);
        return -1;
    }
    r->messages = out;
    return 0;
}

/* ---- the tables ---- */

enum { K_CMPL = 1, K_CHAT = 2, K_BOTH = 3 };
typedef struct {
    const char *name;
    unsigned kinds;
    field_fn fn;
} field;

static const field fields[] = {
    {"model", K_BOTH, f_model},
    {"prompt", K_CMPL, f_prompt},
    {"messages", K_CHAT, f_messages},
    {"max_tokens", K_BOTH, f_max_tokens},
    {"max_completion_tokens", K_CHAT, f_max_completion_tokens},
    {"temperature", K_BOTH, f_temperature},
    {"top_p", K_BOTH, f_top_p},
    {"top_k", K_BOTH, f_top_k},
    {"min_p", K_BOTH, f_min_p},
    {"seed", K_BOTH, f_seed},
    {"stop", K_BOTH, f_stop},
    {"stop_token_ids", K_BOTH, f_stop_token_ids},
    {"ignore_eos", K_BOTH, f_ignore_eos},
    {"n", K_BOTH, f_n},
    {"best_of", K_CMPL, f_best_of},
    {"stream", K_BOTH, f_stream},
    {"stream_options", K_BOTH, f_stream_options},
    {"logprobs", K_CMPL, f_logprobs_cmpl},
    {"logprobs", K_CHAT, f_logprobs_chat},
    {"top_logprobs", K_CHAT, f_top_logprobs},
    {"echo", K_CMPL, f_echo},
    {"presence_penalty", K_BOTH, f_presence_penalty},
    {"frequency_penalty", K_BOTH, f_frequency_penalty},
    {"repetition_penalty", K_BOTH, f_repetition_penalty},
    {"logit_bias", K_BOTH, f_logit_bias},
    {"user", K_BOTH, f_user},
    {"cache_salt", K_BOTH, f_cache_salt},
    {"return_token_ids", K_BOTH, f_return_token_ids},
    {"priority", K_BOTH, f_priority},
    {"return_tokens_as_token_ids", K_BOTH, f_tokens_as_ids},
    {"suffix", K_CMPL, f_suffix},
    {"skip_special_tokens", K_BOTH, f_skip_special},
    {"include_stop_str_in_output", K_BOTH, f_include_stop},
    {"min_tokens", K_BOTH, f_min_tokens},
    {"allowed_token_ids", K_BOTH, f_allowed_token_ids},
    {"bad_words", K_BOTH, f_bad_words},
    {"truncate_prompt_tokens", K_BOTH, f_truncate_prompt_tokens},
    {"prompt_logprobs", K_BOTH, f_prompt_logprobs},
    {"response_format", K_BOTH, f_response_format},
    {"guided_json", K_BOTH, f_guided_json},
    {"guided_choice", K_BOTH, f_guided_choice},
    {"guided_regex", K_BOTH, f_guided_regex},
    {"regex", K_BOTH, f_regex},
    {"guided_grammar", K_BOTH, f_guided_grammar},
    {"ebnf", K_BOTH, f_ebnf},
    {"structural_tag", K_BOTH, f_structural_tag},
    {"structured_outputs", K_BOTH, f_structured_outputs},
    {"tools", K_CHAT, f_tools},
    {"tool_choice", K_CHAT, f_tool_choice},
    {"parallel_tool_calls", K_CHAT, f_parallel_tool_calls},
    {"chat_template_kwargs", K_CHAT, f_chat_template_kwargs},
    {"reasoning_effort", K_CHAT, f_reasoning_effort},
    {"add_generation_prompt", K_CHAT, f_add_generation_prompt},
    {"continue_final_message", K_CHAT, f_continue_final},
    {"separate_reasoning", K_CHAT, f_separate_reasoning},
    {"debug_forced_output", K_BOTH, f_forced}, /* only with lim->allow_forced */
};

int sv_request_parse(sv_kind kind, const char *body, size_t len, const sv_limits *lim, sv_request *r, sv_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->n = 1;
    r->top_p = 1.0f;
    r->repetition_penalty = 1.0f;
    r->skip_special_tokens = true;
    r->separate_reasoning = true;
    r->add_generation_prompt = true;
    r->tool_choice = SV_TOOLS_AUTO;
    r->prompt_logprobs = -1;
    if (!sv_json_depth_ok(body, len, SV_MAX_JSON_DEPTH, e)) return -1;
    json_error_t je;
    bool oom = false;
    json_t *root = mr__json_loadb(body, len, JSON_REJECT_DUPLICATES, &je, &oom);
    if (!root) {
        if (oom) return sv_fail(e, 500, NULL, "out of memory");
        return sv_fail(e, 400, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    }
    int rc = -1;
    unsigned k = kind == SV_CHAT ? K_CHAT : K_CMPL;
    if (!json_is_object(root)) {
        sv_fail(e, 400, NULL, "the body must be a JSON object, got %s", sv_json_type(root));
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        const field *f = NULL;
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            if ((fields[i].kinds & k) && !strcmp(fields[i].name, key) && (fields[i].fn != f_forced || lim->allow_forced)) {
                f = &fields[i];
                break;
            }
        if (!f) {
            char nm[96];
            snprintf(nm, sizeof nm, "%.80s", key);
            sv_fail(e, 400, nm, "unknown field '%s'%s", nm,
                    kind == SV_CHAT && !strcmp(key, "prompt")     ? " (chat takes messages; /v1/completions takes a prompt)"
                    : kind == SV_COMPLETIONS && !strcmp(key, "messages") ? " (/v1/completions takes a prompt; use /v1/chat/completions)"
                                                                 : "");
            goto out;
        }
        if (json_is_null(v)) continue;
        if (f->fn(r, v, lim, e)) goto out;
    }
    /* fields that depend on each other */
    if (kind == SV_COMPLETIONS && !r->n_prompts) {
        sv_fail(e, 400, "prompt", "prompt is required");
        goto out;
    }
    if (kind == SV_CHAT && !r->messages) {
        sv_fail(e, 400, "messages", "messages is required");
        goto out;
    }
    const json_t *eff = kind == SV_CHAT ? json_object_get(root, "reasoning_effort") : NULL;
    if (json_is_string(eff) && !json_object_get(r->chat_template_kwargs, "reasoning_effort")) {
        json_t *kw = r->chat_template_kwargs ? json_copy(r->chat_template_kwargs) : json_object();
        if (!kw || json_object_set(kw, "reasoning_effort", (json_t *)eff)) {
            json_decref(kw);
            sv_fail(e, 500, NULL, "out of memory");
            goto out;
        }
        json_decref(r->chat_template_kwargs);
        r->chat_template_kwargs = kw;
    }
    if (kind == SV_CHAT && r->top_logprobs && !r->logprobs) {
        sv_fail(e, 400, "top_logprobs", "top_logprobs needs logprobs: true");
        goto out;
    }
    if (r->max_tokens == 0 && !r->echo) { /* vLLM's echo without generation: the prompt (and its logprobs) alone */
        sv_fail(e, 400, "max_tokens", "max_tokens is 0; it must be in [1, %lld] (0 only with echo: the prompt alone)",
                (long long)lim->max_completion_tokens);
        goto out;
    }
    if (r->prompt_logprobs >= 0 && r->stream) { /* as vLLM */
        sv_fail(e, 400, "prompt_logprobs", "prompt_logprobs are not available when stream is true");
        goto out;
    }
    const json_t *so = json_object_get(root, "stream_options");
    if (!r->stream && so && !json_is_null(so)) {
        sv_fail(e, 400, "stream_options", "stream_options can only be given with stream: true");
        goto out;
    }
    if (r->continue_final) { /* vLLM's: the last message is continued, so no new assistant turn is opened */
        if (r->agp_given && r->add_generation_prompt) {
            sv_fail(e, 400, "continue_final_message", "continue_final_message and add_generation_prompt are both true: "
                    "the first continues the last message, the second starts a new one; set add_generation_prompt "
                    "to false");
            goto out;
        }
        r->add_generation_prompt = false;
    }
    if (compile_grammar(r, e)) goto out;
    if ((int64_t)(r->n_prompts ? r->n_prompts : 1) * r->n > lim->max_choices) {
        sv_fail(e, 400, "n", "%d prompts x n %d is %lld choices; this server takes at most %d per request (--max-choices)",
                r->n_prompts ? r->n_prompts : 1, r->n, (long long)(r->n_prompts ? r->n_prompts : 1) * r->n,
                lim->max_choices);
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    if (rc) sv_request_free(r);
    return rc;
}
