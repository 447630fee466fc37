/* dataset.c — the ShareGPT dataset of `moerun bench serve` (sglang's
 * bench_serving `--dataset-name sharegpt`): real conversations give the
 * prompts and the output lengths, so a run sees the length mix people send.
 * The file is a JSON array of conversations:
 *   [{"conversations": [{"from": "human", "value": "..."},
 *                       {"from": "gpt",   "value": "..."}, ...]}, ...]
 * ("conversation" is read too, as sglang reads it). As sglang samples it:
 *   - an entry with fewer than two turns is not usable; the first turn's text
 *     is the prompt, the second's token count the output length (or a fixed
 *     length);
 *   - the usable entries are shuffled (Fisher-Yates from the top, j =
 *     splitmix64 % (i + 1), the state seed * 0x9E3779B97F4A7C15 + 0x5EED),
 *     then taken in that order, each counted with the tokenizer (HF encode with
 *     special tokens), until enough are taken;
 *   - a prompt or an output of fewer than 2 tokens is pruned, and one whose
 *     prompt + output exceeds the context length (the given one, else the
 *     server's max_model_len from /tokenize) too.
 * Unlike sglang's script, an entry of the wrong shape (not an object, a turn
 * without a string value, a NUL in the text) is counted and skipped, not a
 * crash; nothing is downloaded. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moerun/chat.h"
#include "moerun/text.h"
#include "serve/serve_internal.h"

/* The text of turn k of a usable entry, NULL where the entry has another shape (*usable: it has two turns). */
static const char *turn(const json_t *e, size_t k, bool *usable, size_t *len) {
    const json_t *c = json_object_get(e, "conversations");
    if (!c) c = json_object_get(e, "conversation");
    *usable = json_is_array(c) && json_array_size(c) >= 2;
    const json_t *v = *usable ? json_object_get(json_array_get(c, k), "value") : NULL;
    if (!json_is_string(v)) return NULL;
    *len = json_string_length(v);
    const char *s = json_string_value(v);
    return strlen(s) == *len ? s : NULL; /* a \u0000 inside: not a prompt a server takes as text */
}

/* The server's token ids (a JSON array of ids in [0, 2^31)) into ids; false for anything else. */
static bool ids_of(const json_t *t, mr_tok_ids *ids) {
    const size_t k = json_array_size(t);
    if (!json_is_array(t)) return false;
    if (k > ids->cap) {
        int32_t *p = realloc(ids->ids, k * sizeof *p);
        if (!p) return false;
        ids->ids = p, ids->cap = k;
    }
    for (size_t i = 0; i < k; i++) {
        const json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) return false;
        ids->ids[i] = (int32_t)json_integer_value(v);
    }
    ids->n = k;
    return true;
}

/* Tokens of text: here with the tokenizer, else the server's /tokenize: vLLM's request ({"prompt"}; moerun
 * serve answers it) and then, where that is refused (or answered with no token for some text), llama-server's
 * ({"content", "add_special": true}); *form keeps the one that answered for the next calls. The answer's
 * "count", else its "tokens"; *ctx its max_model_len where it says one. With the tokenizer, or want_ids, the
 * ids are in *ids (the server's "tokens", as many as its count). */
static mr_status count_tokens(const mr_bench_sharegpt_opts *o, const mr_tokenizer *tok, mr_tok_ids *ids,
                              bool want_ids, const char *text, size_t len, int *form, int64_t *n, int64_t *ctx) {
    if (tok) {
        ids->n = 0;
        mr_status st = mr_tokenizer_encode(tok, text, len, MR_TOK_ADD_SPECIAL, ids, NULL);
        *n = (int64_t)ids->n;
        return st ? mr_error_set(st, "bench serve: --tokenizer %s: %s", o->tokenizer, mr_error_last()) : MR_OK;
    }
    char first[300] = "";
    for (int f = *form; f < 2; f++) {
        json_t *q = f ? json_pack("{s:s%,s:b}", "content", text, len, "add_special", 1)
                      : json_pack("{s:s%}", "prompt", text, len);
        char *body = q ? json_dumps(q, JSON_COMPACT) : NULL, *resp = NULL;
        json_decref(q);
        long http = 0;
        mr_status st = body ? mr_http_post(o->base_url, "/tokenize", body, o->api_key, 60, &http, &resp) : MR_ENOMEM;
        free(body);
        if (st) {
            free(resp);
            return st;
        }
        json_error_t je;
        json_t *r = http == 200 ? json_loads(resp, 0, &je) : NULL;
        const json_t *c = json_object_get(r, "count"), *t = json_object_get(r, "tokens");
        const json_t *m = json_object_get(r, "max_model_len");
        const bool counted = json_is_integer(c) && json_integer_value(c) >= 0;
        const int64_t k = counted ? (int64_t)json_integer_value(c) : (int64_t)json_array_size(t);
        bool ok = (counted || json_is_array(t)) && (k > 0 || len == 0); /* text has a token at least: an
                                                                           empty answer read no text */
        if (ok && want_ids && (!ids_of(t, ids) || (int64_t)ids->n != k)) {
            ok = false; /* an answer without its ids (or with fewer than it counts) */
            if (!first[0]) snprintf(first, sizeof first, "a count without the token ids --tokenize-prompt sends");
        }
        if (ok) {
            *n = k;
            if (ctx && json_is_integer(m) && json_integer_value(m) > 0) *ctx = (int64_t)json_integer_value(m);
            *form = f;
        } else if (!first[0]) {
            snprintf(first, sizeof first, "HTTP %ld (%.200s)", http, resp ? resp : "");
        }
        json_decref(r);
        free(resp);
        if (ok) return MR_OK;
    }
    return mr_error_set(MR_EUNSUPPORTED, "bench serve: %s/tokenize answered %s: counting the dataset's tokens needs a "
                        "server with vLLM's or llama-server's /tokenize, or --tokenizer DIR", o->base_url, first);
}

/* sglang's --apply-chat-template: the prompt as the chat template renders one user message with the generation
 * prompt, each occurrence of the BOS token's text taken out (where the tokenizer adds a BOS, its encode puts
 * it back; sglang's sample_sharegpt_requests does the same, and sends the rest as it is). */
static mr_status templated(const mr_chat *chat, const char *p, size_t len, char **out, size_t *out_len) {
    json_t *m = json_pack("[{s:s,s:s%}]", "role", "user", "content", p, len);
    const mr_chat_request r = {.messages = m, .add_generation_prompt = true};
    size_t n = 0;
    mr_status st = m ? mr_chat_apply(chat, &r, out, &n) : MR_ENOMEM;
    json_decref(m);
    if (st) return mr_error_set(st, "bench serve: --apply-chat-template: %s", mr_error_last());
    if (strlen(*out) != n) { /* a template that writes a NUL: no text prompt */
        mr_free(*out);
        *out = NULL;
        return mr_error_set(MR_EINPUT, "bench serve: --apply-chat-template: the template wrote a NUL byte");
    }
    const char *bos = mr_chat_special_token(chat, "bos_token");
    const size_t bl = bos ? strlen(bos) : 0;
    if (bl) { /* in place: the text only shrinks */
        char *w = *out;
        for (const char *r0 = *out; *r0;) {
            if (!strncmp(r0, bos, bl)) r0 += bl;
            else *w++ = *r0++;
        }
        *w = 0;
        n = (size_t)(w - *out);
    }
    *out_len = n;
    return MR_OK;
}

void mr_bench_dataset_free(mr_bench_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) free(d->rows[i].prompt), free(d->rows[i].ids);
    free(d->rows);
    free(d);
}

mr_status mr_bench_sharegpt_load(const mr_bench_sharegpt_opts *o, mr_bench_dataset **out) {
    *out = NULL;
    if (!o->path || o->num < 1 || (o->fixed_output_len && o->fixed_output_len < 2))
        return mr_error_set(MR_EINVAL, "bench serve: sharegpt: bad options");
    if (o->apply_chat_template && !o->tokenizer)
        return mr_error_set(MR_EINVAL, "bench serve: --apply-chat-template needs --tokenizer DIR (the model folder "
                            "whose chat template renders the prompts)");
    struct stat sb;
    if (stat(o->path, &sb))
        return mr_error_set(MR_EIO, "bench serve: --dataset-path %s: %s", o->path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return mr_error_set(MR_EINPUT, "bench serve: --dataset-path %s: not a file", o->path);
    json_error_t je;
    json_t *doc = json_load_file(o->path, JSON_ALLOW_NUL, &je);
    if (!doc) /* jansson names the line and column */
        return mr_error_set(MR_EINPUT, "bench serve: --dataset-path %s: %s (line %d, column %d)", o->path, je.text,
                            je.line, je.column);
    if (!json_is_array(doc)) {
        json_decref(doc);
        return mr_error_set(MR_EINPUT, "bench serve: --dataset-path %s: not a JSON array of conversations (ShareGPT's "
                            "[{\"conversations\": [{\"from\", \"value\"}, ...]}, ...])", o->path);
    }
    mr_bench_dataset *d = calloc(1, sizeof *d);
    const size_t ne = json_array_size(doc);
    size_t *order = malloc((ne ? ne : 1) * sizeof *order);
    mr_tokenizer *tok = NULL;
    mr_chat *chat = NULL;
    mr_tok_ids ids = {0}, oids = {0};
    char *tp = NULL; /* a templated prompt */
    mr_status st = d && order ? MR_OK : MR_ENOMEM;
    if (!st && o->tokenizer && mr_tokenizer_load(o->tokenizer, &tok))
        st = mr_error_set(MR_EIO, "bench serve: --tokenizer %s: %s", o->tokenizer, mr_error_last());
    if (!st && o->apply_chat_template && mr_chat_open(o->tokenizer, &chat))
        st = mr_error_set(MR_EIO, "bench serve: --apply-chat-template: %s: %s", o->tokenizer, mr_error_last());
    size_t nu = 0;
    for (size_t i = 0; !st && i < ne; i++) { /* the usable entries, in file order */
        bool usable;
        size_t l0, l1;
        const json_t *e = json_array_get(doc, i);
        const bool ok = turn(e, 0, &usable, &l0) && turn(e, 1, &usable, &l1);
        if (usable) d->usable++;
        if (usable && ok) order[nu++] = i;
        else if (usable || !json_is_object(e)) d->malformed++;
    }
    d->entries = (int64_t)ne;
    if (!st) { /* Fisher-Yates from the top */
        uint64_t s = o->seed * 0x9E3779B97F4A7C15ull + 0x5EED;
        for (size_t i = nu; i > 1; i--) {
            const size_t j = (size_t)(sv_splitmix64(&s) % (uint64_t)i), t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
    }
    d->context_len = o->context_len > 0 ? o->context_len : 0;
    int form = 0; /* the /tokenize request the server answers: found here, on a word */
    if (!st && !o->context_len) { /* the server's context length, where its /tokenize says it */
        int64_t dummy;
        if (count_tokens(o, NULL, NULL, false, "Hello", 5, &form, &dummy, &d->context_len)) d->context_len = 0, form = 0;
    }
    if (!st && !(d->rows = calloc((size_t)o->num, sizeof *d->rows))) st = MR_ENOMEM;
    for (size_t k = 0; !st && k < nu && d->n < o->num; k++) {
        const json_t *e = json_array_get(doc, order[k]);
        bool usable;
        size_t l0, l1;
        const char *p = turn(e, 0, &usable, &l0), *c = turn(e, 1, &usable, &l1);
        int64_t pl, ol = o->prompts_only ? 2 : o->fixed_output_len; /* prompts only: no output counted */
        d->visited++;
        mr_free(tp);
        tp = NULL;
        if (chat && (st = templated(chat, p, l0, &tp, &l0))) break;
        if (tp) p = tp;
        if ((st = count_tokens(o, tok, &ids, o->tokenize_prompt || o->prompts_only, p, l0, &form, &pl, NULL))) break;
        if (!ol && (st = count_tokens(o, tok, &oids, false, c, l1, &form, &ol, NULL))) break;
        if (pl < (o->prompts_only ? 1 : 2) || ol < 2) { /* prompts only: sglang's random dataset skips an empty one */
            d->short_pruned++;
        } else if (!o->prompts_only && d->context_len && pl + ol > d->context_len) {
            d->long_pruned++;
        } else {
            mr_bench_row *r = &d->rows[d->n];
            if (!(r->prompt = malloc(l0 + 1))) {
                st = MR_ENOMEM;
                break;
            }
            memcpy(r->prompt, p, l0 + 1);
            r->prompt_len = pl, r->output_len = o->prompts_only ? 0 : ol, r->source = (int64_t)order[k];
            d->n++;
            if (o->tokenize_prompt || o->prompts_only) { /* the ids that were counted are the ones sent */
                if (!(r->ids = malloc((size_t)pl * sizeof *r->ids))) {
                    st = MR_ENOMEM;
                    break;
                }
                memcpy(r->ids, ids.ids, (size_t)pl * sizeof *r->ids);
            }
        }
    }
    if (!st && d->n == 0)
        st = mr_error_set(MR_EINPUT, "bench serve: --dataset-path %s: no usable conversation (%lld entries, %lld with two "
                          "turns, %lld malformed, %lld too short, %lld longer than the context)", o->path,
                          (long long)d->entries, (long long)d->usable, (long long)d->malformed,
                          (long long)d->short_pruned, (long long)d->long_pruned);
    mr_free(tp);
    mr_chat_free(chat);
    mr_tok_ids_free(&ids);
    mr_tok_ids_free(&oids);
    mr_tokenizer_free(tok);
    free(order);
    json_decref(doc);
    if (st) {
        mr_bench_dataset_free(d);
        return st;
    }
    *out = d;
    return MR_OK;
}
