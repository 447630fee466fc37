/* sglang.c — sglang's native API (POST /generate), what `sglang.bench_serving --backend sglang` (its
 * default) and sglang's own clients send, run as the completions request it stands for:
 *   text (a string, or a list of them: a batch) | input_ids (ids, or a list of lists) -> prompt
 *   sampling_params {max_new_tokens (default 128), min_new_tokens, temperature, top_p, top_k, min_p,
 *     stop, stop_token_ids, ignore_eos, frequency_penalty, presence_penalty, repetition_penalty, n,
 *     skip_special_tokens, no_stop_trim (include_stop_str_in_output), json_schema (a string), regex,
 *     ebnf, structural_tag (a string)}                 -> the completions fields
 *   max_new_tokens 0 runs the prompt alone (the answer's text and output_ids empty, finish_reason length 0);
 *   stream, rid (echoed as meta_info.id), return_logprob with top_logprobs_num and
 *   return_text_in_logprobs (the output's: meta_info.output_token_logprobs [[logprob, id, text or null],
 *   ...] and output_top_logprobs, from completions' logprobs; the prompt's from logprob_start_len, -1 the
 *   last token: input_token_logprobs [[null, id, text], [logprob, id, text], ...] and input_top_logprobs
 *   [null, [...], ...], from the engine's prompt log-probabilities, streamed too; with token_ids_logprob
 *   (a list of ids, or one per prompt of a batch) output_token_ids_logprobs and input_token_ids_logprobs: those
 *   ids' [logprob, id, text] at each of the same positions, in the order given), and the neutral
 *   values of lora_path and image_data (null), stream_options.
 * The answer: {"text", "output_ids", "meta_info": {"id", "finish_reason": {"type": "length", "length"} |
 * {"type": "stop", "matched": the stop string or the stop token id}, "prompt_tokens",
 * "completion_tokens", "cached_tokens"}}; a list of them for a batch. A stream sends, per token,
 * the same object with the text so far (sglang's clients read the text whole and count tokens from
 * meta_info.completion_tokens), then "data: [DONE]". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

static int oom(sv_error *e) { return sv_fail(e, 500, NULL, "out of memory"); }

/* sampling_params' fields and the completions fields they become */
struct sgl_field {
    const char *sgl, *ours;
};
static const struct sgl_field SGL_FIELDS[] = {
    {"max_new_tokens", "max_tokens"}, {"min_new_tokens", "min_tokens"}, {"temperature", "temperature"},
    {"top_p", "top_p"}, {"top_k", "top_k"}, {"min_p", "min_p"}, {"stop", "stop"},
    {"stop_token_ids", "stop_token_ids"}, {"ignore_eos", "ignore_eos"},
    {"frequency_penalty", "frequency_penalty"}, {"presence_penalty", "presence_penalty"},
    {"repetition_penalty", "repetition_penalty"}, {"n", "n"},
    {"skip_special_tokens", "skip_special_tokens"}, {"no_stop_trim", "include_stop_str_in_output"},
    {"json_schema", "guided_json"}, {"regex", "regex"}, {"ebnf", "ebnf"}, {"structural_tag", "structural_tag"},
    {"seed", "seed"}, {"logit_bias", "logit_bias"}};
enum { N_SGL_FIELDS = sizeof SGL_FIELDS / sizeof SGL_FIELDS[0] };

void sv_sglang_param(sv_error *e) {
    char p[128];
    for (size_t i = 0; i < N_SGL_FIELDS; i++) {
        snprintf(p, sizeof p, "sampling_params.%s", SGL_FIELDS[i].sgl);
        if (!strcmp(SGL_FIELDS[i].ours, SGL_FIELDS[i].sgl)) {
            sv_error_rename(e, SGL_FIELDS[i].ours, p, NULL);
        } else {
            sv_error_rename(e, SGL_FIELDS[i].ours, p, SGL_FIELDS[i].sgl);
            if (!strcmp(SGL_FIELDS[i].ours, "max_tokens")) sv_error_rename(e, "max_completion_tokens", p, SGL_FIELDS[i].sgl);
        }
    }
    sv_error_rename(e, "prompt", "text", NULL);
}


/* The end of a translation (rc 0 so far): the completions request as JSON text and its meta handed out; the
 * objects dropped either way. */
static int translated(int rc, json_t *cmpl, json_t *m, json_t *req, char **out_json, json_t **meta, sv_error *e) {
    if (!rc && !(*out_json = json_dumps(cmpl, JSON_COMPACT))) rc = oom(e);
    if (!rc) *meta = json_incref(m);
    json_decref(m);
    json_decref(cmpl);
    json_decref(req);
    return rc;
}

/* One list of token_ids_logprob: integers, at most MR_ENGINE_MAX_LOGPROB_IDS (the vocabulary is checked with
 * the prompt). nm: the field's name as the error says it. */
static int lp_id_list(const json_t *l, const char *nm, sv_error *e) {
    if (!json_is_array(l))
        return sv_fail(e, 400, "token_ids_logprob", "%s must be a list of token ids, got %s", nm, sv_json_type(l));
    if (json_array_size(l) > MR_ENGINE_MAX_LOGPROB_IDS)
        return sv_fail(e, 400, "token_ids_logprob", "%s holds %zu ids; at most %d", nm, json_array_size(l),
                       MR_ENGINE_MAX_LOGPROB_IDS);
    for (size_t k = 0; k < json_array_size(l); k++)
        if (!json_is_integer(json_array_get(l, k))) {
            char at[64];
            snprintf(at, sizeof at, "%s[%zu]", nm, k);
            return sv_fail(e, 400, at, "%s must be a token id (an integer), got %s", at, sv_json_type(json_array_get(l, k)));
        }
    return 0;
}

/* sglang's token_ids_logprob: a list of ids (every prompt's), or for a batch a list of them per prompt (null:
 * none for that one); kept in meta, with lp_ids_each for the second form. */
static int lp_ids_field(const json_t *x, json_t *m, sv_error *e) {
    if (!json_is_array(x))
        return sv_fail(e, 400, "token_ids_logprob",
                       "token_ids_logprob must be a list of token ids (or, for a batch, a list of them per prompt), "
                       "got %s", sv_json_type(x));
    bool each = false;
    for (size_t i = 0; i < json_array_size(x); i++)
        each |= json_is_array(json_array_get(x, i)) || json_is_null(json_array_get(x, i));
    if (!each && lp_id_list(x, "token_ids_logprob", e)) return -1;
    for (size_t i = 0; each && i < json_array_size(x); i++) {
        char nm[48];
        snprintf(nm, sizeof nm, "token_ids_logprob[%zu]", i);
        if (!json_is_null(json_array_get(x, i)) && lp_id_list(json_array_get(x, i), nm, e)) return -1;
    }
    if (json_object_set(m, "token_ids_logprob", (json_t *)x) || (each && json_object_set_new(m, "lp_ids_each", json_true())))
        return oom(e);
    return 0;
}

int sv_sglang_to_completions(const char *body, size_t len, char **out_json, json_t **meta, sv_error *e) {
    *out_json = NULL;
    *meta = NULL;
    json_t *req = sv_body_object(body, len, e);
    if (!req) return -1;
    json_t *cmpl = json_object(), *m = json_object();
    int rc = !cmpl || !m ? oom(e) : 0;
    bool batch = false;
    const char *k;
    json_t *x;
    if (!rc) json_object_foreach(req, k, x) {
        if (rc) break;
        if (!strcmp(k, "text") || !strcmp(k, "input_ids")) {
            if (json_is_null(x)) continue;
            if (json_object_get(cmpl, "prompt")) rc = sv_fail(e, 400, k, "give text or input_ids, not both");
            batch = json_is_array(x) && (!strcmp(k, "text") || json_is_array(json_array_get(x, 0)));
            if (!rc && json_object_set(cmpl, "prompt", x)) rc = oom(e);
        } else if (!strcmp(k, "stream") || !strcmp(k, "priority")) { /* priority: lower first, as vLLM orders */
            if (!json_is_null(x) && json_object_set(cmpl, k, x)) rc = oom(e);
        } else if (!strcmp(k, "rid")) { /* a string, or for a batch one per prompt */
            bool strings = json_is_array(x) && json_array_size(x) > 0;
            for (size_t i = 0; strings && i < json_array_size(x); i++) strings = json_is_string(json_array_get(x, i));
            if (!json_is_string(x) && !json_is_null(x) && !strings)
                rc = sv_fail(e, 400, k, "rid must be a string (or, for a batch, a list of them: one per prompt)");
            else if (!json_is_null(x)) json_object_set(m, "rid", x);
        } else if (!strcmp(k, "sampling_params")) {
            if (!json_is_object(x)) {
                rc = sv_fail(e, 400, k, "sampling_params must be an object, got %s", sv_json_type(x));
                break;
            }
            const struct sgl_field *MAP = SGL_FIELDS;
            const char *sk;
            json_t *sv;
            json_object_foreach(x, sk, sv) {
                if (json_is_null(sv)) continue;
                size_t i = 0;
                while (i < N_SGL_FIELDS && strcmp(MAP[i].sgl, sk)) i++;
                if (i == N_SGL_FIELDS) {
                    if (!strcmp(sk, "spaces_between_special_tokens") && json_is_true(sv)) continue; /* sglang's default */
                    rc = sv_fail(e, 400, "sampling_params", "sampling_params.%.60s is not supported", sk);
                    break;
                }
                if (!strcmp(sk, "max_new_tokens") && json_is_integer(sv) && json_integer_value(sv) == 0) {
                    /* the prompt alone (sglang's frontend caches a prefix and scores choices so): parsed as 1
                     * token, which the answer then does not count (sv_sglang_apply) */
                    if (json_object_set_new(m, "prefill_only", json_true()) ||
                        json_object_set_new(cmpl, "max_tokens", json_integer(1)))
                        rc = oom(e);
                    continue;
                }
                if (json_object_set(cmpl, MAP[i].ours, sv)) {
                    rc = oom(e);
                    break;
                }
            }
        } else if (!strcmp(k, "return_logprob")) {
            if (!json_is_boolean(x) && !json_is_null(x)) rc = sv_fail(e, 400, k, "return_logprob must be a boolean");
            else if (json_is_true(x)) json_object_set_new(m, "return_logprob", json_true());
        } else if (!strcmp(k, "top_logprobs_num")) {
            if (json_is_null(x)) continue;
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > SV_MAX_TOP_LOGPROBS)
                rc = sv_fail(e, 400, k, "top_logprobs_num must be an integer in [0, %d]", SV_MAX_TOP_LOGPROBS);
            else json_object_set(m, "top_logprobs_num", x);
        } else if (!strcmp(k, "return_text_in_logprobs")) {
            if (!json_is_boolean(x) && !json_is_null(x)) rc = sv_fail(e, 400, k, "return_text_in_logprobs must be a boolean");
            else if (json_is_true(x)) json_object_set_new(m, "text_in_logprobs", json_true());
        } else if (!strcmp(k, "logprob_start_len")) {
            if (json_is_null(x)) continue;
            if (!json_is_integer(x)) rc = sv_fail(e, 400, k, "logprob_start_len must be an integer");
            else if (json_integer_value(x) > INT32_MAX)
                rc = sv_fail(e, 400, k, "logprob_start_len %lld is past any prompt", (long long)json_integer_value(x));
            else if (json_integer_value(x) >= 0) json_object_set(m, "logprob_start_len", x);
        } else if (!strcmp(k, "token_ids_logprob")) {
            if (!json_is_null(x)) rc = lp_ids_field(x, m, e);
        } else if (!strcmp(k, "return_routed_experts")) {
            if (!json_is_boolean(x) && !json_is_null(x)) rc = sv_fail(e, 400, k, "return_routed_experts must be a boolean");
            else if (json_is_true(x)) json_object_set_new(m, "routes", json_true());
        } else if (!strcmp(k, "stream_options")) {
            continue;
        } else if (!strcmp(k, "lora_path") || !strcmp(k, "image_data") || !strcmp(k, "audio_data") ||
                   !strcmp(k, "video_data")) {
            if (!json_is_null(x)) rc = sv_fail(e, 400, k, "%s is not supported (text only, no adapters)", k);
        } else {
            rc = sv_fail(e, 400, k, "unknown field '%.60s'", k);
        }
    }
    if (!rc && !json_object_get(cmpl, "prompt")) rc = sv_fail(e, 400, "text", "text or input_ids is required");
    if (!rc && batch && json_is_true(json_object_get(cmpl, "stream")))
        rc = sv_fail(e, 400, "stream", "a batch (a list of texts or of id lists) is not streamed here; send one prompt per request");
    if (!rc && !json_object_get(cmpl, "max_tokens") && json_object_set_new(cmpl, "max_tokens", json_integer(128))) rc = oom(e);
    /* the output's log-probabilities, and top_logprobs_num alternatives, as completions' logprobs computes
     * them; the prompt's from logprob_start_len (>= 0) as vLLM's prompt_logprobs does (sv_sglang_apply) */
    if (!rc && json_is_true(json_object_get(m, "return_logprob")) &&
        json_object_set_new(cmpl, "logprobs", json_integer(json_integer_value(json_object_get(m, "top_logprobs_num")))))
        rc = oom(e);
    if (!rc && !batch && json_is_true(json_object_get(m, "lp_ids_each")))
        rc = sv_fail(e, 400, "token_ids_logprob", "token_ids_logprob is a list of lists, but the request has one prompt "
                     "(give a list of token ids)");
    const json_t *rid = json_object_get(m, "rid"), *prompts = json_object_get(cmpl, "prompt");
    if (!rc && json_is_array(rid) && (!batch || json_array_size(rid) != json_array_size(prompts)))
        rc = sv_fail(e, 400, "rid", "rid holds %zu ids for %s %zu prompt%s (a list of rids is one per prompt of a batch)",
                     json_array_size(rid), batch ? "a batch of" : "a request of", batch ? json_array_size(prompts) : 1,
                     batch && json_array_size(prompts) == 1 ? "" : "s");
    if (!rc && batch) json_object_set_new(m, "batch", json_true());
    return translated(rc, cmpl, m, req, out_json, meta, e);
}

void sv_sglang_apply(const json_t *meta, sv_request *r) {
    if (json_is_true(json_object_get(meta, "prefill_only"))) r->max_tokens = 0;
    r->routes = json_is_true(json_object_get(meta, "routes"));
    const json_t *s = json_object_get(meta, "logprob_start_len");
    if (!json_is_true(json_object_get(meta, "return_logprob")) || !s) return;
    r->prompt_logprobs = (int)json_integer_value(json_object_get(meta, "top_logprobs_num"));
    r->plp_from = json_integer_value(s) + 1;
}

json_t *sv_sglang_object(const char *id, const char *text, size_t n, const int32_t *ids, int64_t n_ids, const char *reason,
                         const char *matched, int32_t matched_id, int64_t prompt, int64_t completion, int64_t cached) {
    json_t *fr;
    if (!reason) fr = json_null();
    else if (!strcmp(reason, "length")) fr = json_pack("{s:s,s:I}", "type", "length", "length", (json_int_t)completion);
    else if (matched) fr = json_pack("{s:s,s:s}", "type", "stop", "matched", matched);
    else if (matched_id >= 0) fr = json_pack("{s:s,s:i}", "type", "stop", "matched", (int)matched_id);
    else fr = json_pack("{s:s}", "type", !strcmp(reason, "stop") ? "stop" : "abort");
    json_t *o = json_pack("{s:s%,s:{s:s,s:o,s:I,s:I,s:I}}", "text", text ? text : "", n, "meta_info", "id", id,
                          "finish_reason", fr, "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                          (json_int_t)completion, "cached_tokens", (json_int_t)cached);
    if (o && ids) { /* the whole answer's ids (not on every streamed event) */
        json_t *a = json_array();
        for (int64_t i = 0; a && i < n_ids; i++) json_array_append_new(a, json_integer(ids[i]));
        json_object_set_new(o, "output_ids", a);
    }
    return o;
}

/* ---- sglang's POST /v1/score ---- */

/* The prompts of a score request: query + item (item + query with item_first), as texts when the query is
 * one (the items then strings), as ids when it is a list of ids (the items lists of ids). */
static json_t *score_prompts(const json_t *query, const json_t *items, bool item_first, sv_error *e) {
    json_t *one = json_is_string(items) ? json_pack("[O]", items) : json_incref((json_t *)items), *out = NULL;
    if (!one) return oom(e), NULL;
    if (!json_is_array(one) || json_array_size(one) == 0) {
        sv_fail(e, 400, "items", "items must be a string or a non-empty list of strings or of token-id lists, got %s",
                json_is_array(one) ? "an empty list" : sv_json_type(one));
        goto done;
    }
    const bool text = json_is_string(query);
    if (!text && !(json_is_array(query) && json_array_size(query) > 0)) {
        sv_fail(e, 400, "query", "query must be a string or a non-empty list of token ids, got %s", sv_json_type(query));
        goto done;
    }
    out = json_array();
    for (size_t i = 0; out && i < json_array_size(one); i++) {
        const json_t *it = json_array_get(one, i);
        char nm[48];
        snprintf(nm, sizeof nm, "items[%zu]", i);
        json_t *p = NULL;
        if (text && json_is_string(it)) {
            const json_t *a = item_first ? it : query, *b = item_first ? query : it;
            const size_t na = json_string_length(a), nb = json_string_length(b);
            char *s = malloc(na + nb + 1);
            if (s) {
                memcpy(s, json_string_value(a), na);
                memcpy(s + na, json_string_value(b), nb);
                p = json_stringn_nocheck(s, na + nb); /* two UTF-8 strings one after the other */
                free(s);
            }
        } else if (!text && json_is_array(it) && json_array_size(it) > 0) {
            p = json_array();
            if (p && (json_array_extend(p, (json_t *)(item_first ? it : query)) || json_array_extend(p, (json_t *)(item_first ? query : it))))
                json_decref(p), p = NULL;
        } else {
            sv_fail(e, 400, nm, "%s must be %s (as the query is), got %s", nm,
                    text ? "a string" : "a non-empty list of token ids", sv_json_type(it));
            json_decref(out), out = NULL;
            goto done;
        }
        if (!p || json_array_append_new(out, p)) {
            json_decref(out), out = NULL;
            oom(e);
        }
    }
    if (!out && !e->http) oom(e);
done:
    json_decref(one);
    return out;
}

int sv_score_to_completions(const char *body, size_t len, char **out_json, json_t **meta, sv_error *e) {
    *out_json = NULL;
    *meta = NULL;
    json_t *req = sv_body_object(body, len, e);
    if (!req) return -1;
    json_t *cmpl = json_object(), *m = json_object();
    int rc = !cmpl || !m ? oom(e) : 0;
    const json_t *query = NULL, *items = NULL, *labels = NULL;
    bool item_first = false;
    const char *k;
    json_t *x;
    if (!rc) json_object_foreach(req, k, x) {
        if (rc) break;
        if (!strcmp(k, "query")) query = x;
        else if (!strcmp(k, "items")) items = x;
        else if (!strcmp(k, "label_token_ids")) labels = x;
        else if (!strcmp(k, "apply_softmax") || !strcmp(k, "item_first")) {
            if (!json_is_boolean(x)) rc = sv_fail(e, 400, k, "%s must be a boolean, got %s", k, sv_json_type(x));
            else if (!strcmp(k, "item_first")) item_first = json_is_true(x);
            else if (json_is_true(x)) json_object_set_new(m, "apply_softmax", json_true());
        } else if (!strcmp(k, "model")) {
            if (json_object_set(cmpl, "model", x)) rc = oom(e);
        } else {
            rc = sv_fail(e, 400, k, "unknown field '%.60s'", k);
        }
    }
    if (!rc && (!query || json_is_null(query))) rc = sv_fail(e, 400, "query", "query is required");
    if (!rc && (!items || json_is_null(items))) rc = sv_fail(e, 400, "items", "items is required");
    if (!rc && (!labels || json_is_null(labels)))
        rc = sv_fail(e, 400, "label_token_ids", "label_token_ids is required (the token ids to score after each item)");
    if (!rc && lp_id_list(labels, "label_token_ids", e)) rc = -1;
    if (!rc && json_array_size(labels) == 0) rc = sv_fail(e, 400, "label_token_ids", "label_token_ids is an empty list");
    json_t *prompts = rc ? NULL : score_prompts(query, items, item_first, e);
    if (!rc && !prompts) rc = -1;
    /* the prompts alone (one engine token each, not counted), the labels' log-probabilities after them */
    if (!rc && (json_object_set_new(cmpl, "prompt", prompts) || json_object_set_new(cmpl, "max_tokens", json_integer(1)) ||
                json_object_set_new(cmpl, "logprobs", json_integer(0)) || json_object_set_new(m, "score", json_true()) ||
                json_object_set_new(m, "prefill_only", json_true()) || json_object_set_new(m, "return_logprob", json_true()) ||
                json_object_set_new(m, "batch", json_true()) || json_object_set(m, "token_ids_logprob", (json_t *)labels)))
        rc = oom(e);
    return translated(rc, cmpl, m, req, out_json, meta, e);
}

void sv_score_param(sv_error *e) {
    sv_error_rename(e, "token_ids_logprob", "label_token_ids", "label_token_ids");
    sv_error_rename(e, "prompt", "items", NULL);
}

json_t *sv_score_object(const json_t *meta, const char *model, int n_items, const float *const *lp, int n_labels,
                        int64_t prompt_tokens) {
    const bool softmax = json_is_true(json_object_get(meta, "apply_softmax"));
    json_t *scores = json_array();
    for (int i = 0; scores && i < n_items; i++) {
        json_t *row = json_array();
        double mx = -INFINITY, sum = 0.0;
        for (int t = 0; lp[i] && t < n_labels; t++) mx = lp[i][t] > mx ? lp[i][t] : mx;
        for (int t = 0; lp[i] && t < n_labels; t++) sum += exp((double)lp[i][t] - mx);
        for (int t = 0; row && t < n_labels; t++) {
            const double p = !lp[i] ? 0.0 : softmax ? exp((double)lp[i][t] - mx) / sum : exp((double)lp[i][t]);
            if (json_array_append_new(row, json_real(p))) json_decref(row), row = NULL;
        }
        if (!row || json_array_append_new(scores, row)) json_decref(scores), scores = NULL;
    }
    if (!scores) return NULL;
    return json_pack("{s:o,s:s,s:{s:I,s:i,s:I},s:s}", "scores", scores, "model", model, "usage", "prompt_tokens",
                     (json_int_t)prompt_tokens, "completion_tokens", 0, "total_tokens", (json_int_t)prompt_tokens,
                     "object", "scoring");
}

void sv_sglang_choice_id(const sv_job *j, int i, char *out, size_t cap) {
    const json_t *rid = json_object_get(j->req.sgl_meta, "rid");
    const int n = j->req.n > 0 ? j->req.n : 1;
    if (json_is_array(rid)) { /* one per prompt: that prompt's, its choices numbered when it has several */
        const char *r = json_string_value(json_array_get(rid, (size_t)(i / n)));
        if (n > 1) snprintf(out, cap, "%.80s-%d", r ? r : "", i % n);
        else snprintf(out, cap, "%.80s", r ? r : "");
        return;
    }
    const char *r = json_string_value(rid);
    if (j->n_gen > 1) snprintf(out, cap, "%.80s-%d", r ? r : j->id, i);
    else snprintf(out, cap, "%.80s", r ? r : j->id);
}
