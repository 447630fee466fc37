/* respond.c — turning a job's tokens into what the client reads: per choice,
 * the streaming detokenizer (an incomplete UTF-8 sequence waits for the next
 * token), the stop strings (a partial match waits until it is decided; a
 * match ends the choice and cancels its gen), the reasoning / tool-call
 * parser of chat, the log-probabilities when asked, then either one SSE
 * event per token (serving.md section 2) or, at the end, the whole body.
 *
 * Event shapes (one JSON object per line, "data: " before, a blank line after):
 *   completions  {"id","object":"text_completion","created","model",
 *                 "choices":[{"index","text","logprobs","finish_reason"}]}
 *   chat         {"id","object":"chat.completion.chunk","created","model",
 *                 "choices":[{"index","delta":{...},"logprobs","finish_reason"}]}
 *   usage        the same head with "choices":[] and "usage":{...}, before "data: [DONE]".
 *   responses    (the Responses API) "event: TYPE" and "data: {...}" per event, built by responses.c:
 *                response.created, output items opened, their deltas, closed, then response.completed
 *                (or .incomplete, .failed); no [DONE].
 *   sglang       (/generate) "data: {"text": the text so far, "meta_info": {...}}" per token, the last with
 *                its finish_reason and output_ids, then "data: [DONE]".
 *   anthropic    (the Messages API) "event: TYPE" and "data: {...}", built by anthropic.c:
 *                message_start, content blocks started / filled / stopped, message_delta, message_stop.
 * A checkpoint without a tokenizer adds "token_ids" to each choice.
 *
 * The token that ended a choice by a stop id (an EOS, or stop_token_ids) is
 * counted in completion_tokens but not turned into text, as OpenAI's and
 * vLLM's servers do. Chat answers of a template whose output carries tags
 * (<think>, tool-call markup) are decoded with the special tokens kept, so
 * that the parser sees its tags. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

typedef struct {
    sv_gen *g;
    sv_detok *dt;
    sv_parse *ps;
    sv_stop stop;
    sv_buf text;          /* decoded completion so far */
    size_t scanned, sent; /* stop strings searched up to; bytes released to the client */
    int64_t consumed;     /* tokens taken from g->out */
    int64_t ids_sent;     /* return_token_ids: tokens of g->out listed in the stream's token_ids so far */
    bool ptids_sent;      /* return_token_ids, completions: the prompt's ids were streamed */
    int64_t counted;      /* completion tokens (up to the token that ended it) */
    int64_t cached;       /* prompt tokens found in the prefix cache */
    int64_t lp_offset;    /* text_offset of the next token's logprobs entry */
    bool echo_pending;    /* streaming echo with logprobs: the prompt's event waits for its entries */
    bool role_sent;       /* a chat stream's first chunk (delta.role) went out */
    bool done;
    const char *reason;
    bool failed, unavailable;
    char err[200];
    int n_calls;
    bool tool_json;       /* tool_choice required / named: the answer is JSON, turned into tool calls at the end */
    sv_buf json;          /* ... collected here */
    char call_id[40];     /* a named function's call, streamed as it comes */
    sv_tool_piece piece;
    /* the non-streaming body */
    sv_buf content, reasoning, ids;
    sv_buf lp_tokens, lp_values, lp_tops, lp_offsets; /* completions' logprobs arrays, or chat's content items
                                                        * (the Responses API: its message's) */
    /* the Responses API: the entries (JSON texts in lp_pend) of tokens whose text has not come out yet, each
     * with its bytes' place in text; the message's text came out up to lp_cend */
    sv_buf lp_pend;
    struct lp_pending { size_t a, b, off, len; } *pe;
    size_t n_pe, cap_pe, lp_pos, lp_cend;
    json_t *calls;
    sv_resp_stream rs;    /* the Responses and Messages APIs' stream */
    char *stop_hit;       /* the stop string that ended it (the Messages API's stop_sequence) */
    int64_t reasoning_tokens; /* the Responses API: tokens up to the last one that added reasoning */
} sv_choice;

struct sv_out {
    sv_job *j;
    const sv_text *t;
    const mr_model *m;
    bool chat, ids_mode, stream;
    bool resp;            /* the Responses API (chat underneath) */
    bool anth;            /* Anthropic's Messages API (chat underneath) */
    bool sgl;             /* sglang's /generate (completions underneath) */
    const char *model;    /* the served name (the server's, outlives this) */
    char rid[64];         /* its id's hex part */
    int n;
    sv_choice *c;
    sv_buf head;          /* {"id":..,"object":..,"created":..,"model":.., */
    bool ptids_sent;      /* return_token_ids, chat: the prompt's ids were streamed */
    bool started, finished;
    int64_t prompt_tokens;
};

static size_t piece_len(const sv_out *o, int32_t id);
/* completions with echo and logprobs: the prompt's entries lead the logprobs arrays */
static bool echo_lp(const sv_out *o) { return !o->chat && o->j->req.echo && o->j->req.logprobs; }

/* g->cancel from SV_CANCEL_NONE to why; a gen already ended by a stop string keeps that */
void sv_gen_cancel(sv_gen *g, int why) {
    int none = SV_CANCEL_NONE;
    atomic_compare_exchange_strong(&g->cancel, &none, why);
}

void sv_job_cancel(sv_job *j) {
    for (int i = 0; i < j->n_gen; i++) sv_gen_cancel(&j->gens[i], SV_CANCEL_ABORT);
}

void sv_out_free(sv_out *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        sv_choice *c = &o->c[i];
        sv_detok_free(c->dt);
        sv_parse_free(c->ps);
        sv_buf_free(&c->text);
        sv_buf_free(&c->content);
        sv_buf_free(&c->reasoning);
        sv_buf_free(&c->ids);
        sv_buf_free(&c->lp_tokens);
        sv_buf_free(&c->lp_values);
        sv_buf_free(&c->lp_tops);
        sv_buf_free(&c->lp_offsets);
        sv_buf_free(&c->lp_pend);
        mr_free(c->pe);
        sv_buf_free(&c->json);
        json_decref(c->calls);
        sv_resp_stream_free(&c->rs);
        mr_free(c->stop_hit);
    }
    mr_free(o->c);
    sv_buf_free(&o->head);
    mr_free(o);
}

mr_status sv_out_new(sv_job *j, const sv_text *t, const mr_model *m, const char *model_name, sv_out **out) {
    *out = NULL;
    sv_out *o = mr_calloc(1, sizeof *o);
    if (!o) return MR_ENOMEM;
    o->j = j;
    o->t = t;
    o->m = m;
    o->chat = j->req.kind == SV_CHAT;
    o->resp = j->req.resp_echo != NULL;
    o->anth = j->req.anthropic;
    o->sgl = j->req.sgl_meta != NULL;
    o->model = model_name;
    const char *dash = strchr(j->id, '-');
    if (j->req.resp_id[0]) snprintf(o->rid, sizeof o->rid, "%s", j->req.resp_id + 5); /* its items' ids: the Response's */
    else snprintf(o->rid, sizeof o->rid, "%s", dash ? dash + 1 : j->id);
    o->stream = j->req.stream;
    o->ids_mode = !sv_text_has_tokenizer(t);
    o->n = j->n_gen;
    for (int i = 0; i < j->n_prompts; i++) o->prompt_tokens += j->prompt_len[i];
    bool skip = o->chat && sv_text_tagged_output(t) ? false : j->req.skip_special_tokens;
    if (!(o->c = mr_calloc((size_t)o->n, sizeof *o->c))) goto oom;
    for (int i = 0; i < o->n; i++) {
        sv_choice *c = &o->c[i];
        c->g = &j->gens[i];
        sv_stop_init(&c->stop, j->req.n_stop, j->req.stop);
        if (!o->ids_mode && sv_detok_new(t, skip, &c->dt)) goto oom;
        if (o->chat && sv_parse_new(t, j->req.tool_choice == SV_TOOLS_NONE ? NULL : j->req.tools,
                                    j->req.separate_reasoning, !j->req.continue_final || j->req.think_open, &c->ps))
            goto oom;
        if (o->chat && !(c->calls = json_array())) goto oom;
        c->echo_pending = echo_lp(o) && o->stream;
        c->tool_json = o->chat && j->req.grammar && !j->req.grammar_tools &&
                       (j->req.tool_choice == SV_TOOLS_REQUIRED || j->req.tool_choice == SV_TOOLS_NAMED);
        for (int64_t p = 0; echo_lp(o) && p < c->g->n_prompt; p++) c->lp_offset += (int64_t)piece_len(o, c->g->prompt[p]);
    }
    if (sv_buf_printf(&o->head, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", j->id,
                      o->chat ? (o->stream ? "chat.completion.chunk" : "chat.completion") : "text_completion",
                      (long long)j->created) ||
        sv_buf_json_str(&o->head, model_name, strlen(model_name)) || sv_buf_lit(&o->head, ","))
        goto oom;
    *out = o;
    return MR_OK;
oom:
    sv_out_free(o);
    return mr_error_set(MR_ENOMEM, NULL);
}

static const char *fin_reason(sv_fin f) {
    switch (f) {
    case SV_FIN_STOP: return "stop";
    case SV_FIN_LENGTH: return "length";
    case SV_FIN_ABORT: return "abort";
    default: return "error";
    }
}

static int64_t completion_tokens(const sv_out *o) {
    int64_t n = 0;
    for (int i = 0; i < o->n; i++) n += o->c[i].counted;
    return n;
}

static int usage_obj(const sv_out *o, sv_buf *b) {
    int64_t ct = completion_tokens(o), cached = 0;
    for (int i = 0; i < o->n; i += o->j->req.n) cached += o->c[i].cached; /* once per prompt */
    return sv_buf_printf(b,
                         "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld,"
                         "\"prompt_tokens_details\":{\"cached_tokens\":%lld}}",
                         (long long)o->prompt_tokens, (long long)ct, (long long)(o->prompt_tokens + ct),
                         (long long)cached);
}

/* A stop id ends the generation (from the min_tokens-th token on, as the
 * engine); its text is not the client's. count: tokens up to this one. */
static bool is_stop_token(const sv_out *o, const sv_gen *g, int32_t tok, int64_t count) {
    const sv_request *r = &o->j->req;
    if (count < r->min_tokens) return false;
    if (!g->ignore_eos && mr_model_is_eos(o->m, tok)) return true;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) return true;
    return false;
}

/* ---- log-probabilities ---- */

static double lp_value(float x) { return isfinite(x) ? (double)x : -9999.0; /* JSON has no -inf (vLLM clamps the same) */ }

/* The token as a JSON string: its text, or "token_id:N" without a tokenizer (as_id: always, vLLM's
 * return_tokens_as_token_ids). */
static int lp_token_as(const sv_out *o, int32_t id, bool as_id, sv_buf *b) {
    const char *p;
    size_t n;
    if (as_id || o->ids_mode || sv_text_piece(o->t, id, &p, &n)) return sv_buf_printf(b, "\"token_id:%d\"", id);
    return sv_buf_json_str(b, p, n);
}
static int lp_token(const sv_out *o, int32_t id, sv_buf *b) { return lp_token_as(o, id, o->j->req.tokens_as_ids, b); }

/* ids [n] as a JSON list after ,"key": (vLLM's return_token_ids) */
static int ids_field(sv_buf *b, const char *key, const int32_t *ids, int64_t n) {
    if (sv_buf_printf(b, ",\"%s\":[", key)) return -1;
    for (int64_t k = 0; k < n; k++)
        if (sv_buf_printf(b, "%s%d", k ? "," : "", (int)ids[k])) return -1;
    return sv_buf_lit(b, "]");
}

/* The token's bytes as a JSON list; an id without text: null (chat's Optional), [] in the Responses API
 * (whose bytes is a list). */
static int lp_bytes(const sv_out *o, int32_t id, sv_buf *b) {
    const char *p;
    size_t n;
    if (o->ids_mode || sv_text_piece(o->t, id, &p, &n)) return o->resp ? sv_buf_lit(b, "[]") : sv_buf_lit(b, "null");
    if (sv_buf_lit(b, "[")) return -1;
    for (size_t i = 0; i < n; i++)
        if (sv_buf_printf(b, "%s%u", i ? "," : "", (unsigned)(unsigned char)p[i])) return -1;
    return sv_buf_lit(b, "]");
}

static size_t piece_len(const sv_out *o, int32_t id) {
    const char *p;
    size_t n;
    return o->ids_mode || sv_text_piece(o->t, id, &p, &n) ? 0 : n;
}

/* Chat: one {"token","logprob","bytes","top_logprobs":[...]} item. */
static int lp_chat_item(const sv_out *o, int32_t tok, const sv_logprob *l, sv_buf *b) {
    if (sv_buf_lit(b, "{\"token\":") || lp_token(o, tok, b) || sv_buf_printf(b, ",\"logprob\":%.9g,\"bytes\":", lp_value(l->logprob)) ||
        lp_bytes(o, tok, b) || sv_buf_lit(b, ",\"top_logprobs\":["))
        return -1;
    for (int k = 0; k < l->n_top && k < o->j->req.top_logprobs; k++) {
        const mr_token_logprob *t = &l->top[k];
        if ((k && sv_buf_lit(b, ",")) || sv_buf_lit(b, "{\"token\":") || lp_token(o, t->token, b) ||
            sv_buf_printf(b, ",\"logprob\":%.9g,\"bytes\":", lp_value(t->logprob)) || lp_bytes(o, t->token, b) ||
            sv_buf_lit(b, "}"))
            return -1;
    }
    return sv_buf_lit(b, "]}");
}

/* "id": {"logprob", "rank", "decoded_token"} */
static int plp_item(const sv_out *o, int32_t id, float logprob, int rank, sv_buf *b) {
    return sv_buf_printf(b, "\"%d\":{\"logprob\":%.9g,\"rank\":%d,\"decoded_token\":", id, lp_value(logprob), rank) ||
           lp_token_as(o, id, false, b) || sv_buf_lit(b, "}");
}

/* vLLM's prompt_logprobs: [null, {"id": {"logprob", "rank", "decoded_token"}, ...}, ...], the prompt
 * token first (its own rank), then the alternatives asked for (ranks 1..k) other than it; a
 * position whose entry never came (the request failed) is null. */
static int plp_vllm(const sv_out *o, const sv_gen *g, sv_buf *b) {
    pthread_mutex_lock(&o->j->mu);
    const int64_t n_plp = g->n_plp;
    pthread_mutex_unlock(&o->j->mu);
    const int want = o->j->req.prompt_logprobs;
    if (sv_buf_lit(b, "[")) return -1;
    for (int64_t p = 0; p < g->n_prompt; p++) {
        const sv_logprob *l = p >= 1 && p < n_plp && g->plp ? sv_logprob_at(g->plp, o->j->req.plp_top, p) : NULL;
        if (p && sv_buf_lit(b, ",")) return -1;
        if (!l) {
            if (sv_buf_lit(b, "null")) return -1;
            continue;
        }
        const int32_t id = g->prompt[p];
        if (sv_buf_lit(b, "{") || plp_item(o, id, l->logprob, l->rank, b)) return -1;
        for (int k = 0; k < l->n_top && k < want; k++)
            if (l->top[k].token != id &&
                (sv_buf_lit(b, ",") || plp_item(o, l->top[k].token, l->top[k].logprob, k + 1, b)))
                return -1;
        if (sv_buf_lit(b, "}")) return -1;
    }
    return sv_buf_lit(b, "]");
}

/* Completions: the {"tok": logprob, ...} object of the alternatives. */
static int lp_top_obj(const sv_out *o, int32_t tok, const sv_logprob *l, sv_buf *b) {
    if (sv_buf_lit(b, "{")) return -1;
    bool listed = false;
    int k = 0;
    for (; k < l->n_top && k < o->j->req.top_logprobs; k++) {
        listed |= l->top[k].token == tok;
        if ((k && sv_buf_lit(b, ",")) || lp_token(o, l->top[k].token, b) ||
            sv_buf_printf(b, ":%.9g", lp_value(l->top[k].logprob)))
            return -1;
    }
    /* the sampled token is always beside them (OpenAI: up to logprobs + 1 entries; vLLM) */
    if (!listed && ((k && sv_buf_lit(b, ",")) || lp_token(o, tok, b) || sv_buf_printf(b, ":%.9g", lp_value(l->logprob))))
        return -1;
    return sv_buf_lit(b, "}");
}

/* Echo with logprobs: the prompt's entries of the four completions arrays (without brackets; the
 * first token, and one whose entry never came, has null), its alternatives with the prompt token
 * itself beside them (as vLLM's prompt logprobs). Offsets from 0 over the tokens' text. */
static int plp_entries(const sv_out *o, const sv_gen *g, int64_t n_plp, sv_buf *tk, sv_buf *lv, sv_buf *tp,
                       sv_buf *of) {
    int64_t off = 0;
    for (int64_t p = 0; p < g->n_prompt; p++) {
        const int32_t id = g->prompt[p];
        const sv_logprob *l = p >= 1 && p < n_plp ? sv_logprob_at(g->plp, o->j->req.plp_top, p) : NULL;
        if (p && (sv_buf_lit(tk, ",") || sv_buf_lit(lv, ",") || sv_buf_lit(tp, ",") || sv_buf_lit(of, ",")))
            return -1;
        if (lp_token(o, id, tk) || sv_buf_printf(of, "%lld", (long long)off)) return -1;
        off += (int64_t)piece_len(o, id);
        if (!l) {
            if (sv_buf_lit(lv, "null") || sv_buf_lit(tp, "null")) return -1;
            continue;
        }
        if (sv_buf_printf(lv, "%.9g", lp_value(l->logprob)) || sv_buf_lit(tp, "{")) return -1;
        bool listed = false;
        for (int k = 0; k < l->n_top && k < o->j->req.top_logprobs; k++) {
            listed |= l->top[k].token == id;
            if ((k && sv_buf_lit(tp, ",")) || lp_token(o, l->top[k].token, tp) ||
                sv_buf_printf(tp, ":%.9g", lp_value(l->top[k].logprob)))
                return -1;
        }
        if (!listed && (((l->n_top && o->j->req.top_logprobs) && sv_buf_lit(tp, ",")) || lp_token(o, id, tp) ||
                        sv_buf_printf(tp, ":%.9g", lp_value(l->logprob))))
            return -1;
        if (sv_buf_lit(tp, "}")) return -1;
    }
    return 0;
}

/* Streaming echo with logprobs: the prompt's text and entries, one event for choice i. */
static int echo_event(sv_out *o, sv_buf *b, int i, int64_t n_plp) {
    const sv_gen *g = o->c[i].g;
    const char *pt = o->j->prompt_text[i / o->j->req.n];
    sv_buf a[4] = {{0}};
    int rc = plp_entries(o, g, n_plp, &a[0], &a[1], &a[2], &a[3]) || sv_buf_lit(b, "data: ") ||
             sv_buf_add(b, o->head.p, o->head.len) || sv_buf_printf(b, "\"choices\":[{\"index\":%d,\"text\":", i) ||
             sv_buf_json_str(b, pt ? pt : "", pt ? strlen(pt) : 0) || sv_buf_lit(b, ",\"logprobs\":{\"tokens\":[") ||
             sv_buf_add(b, a[0].p ? a[0].p : "", a[0].len) || sv_buf_lit(b, "],\"token_logprobs\":[") ||
             sv_buf_add(b, a[1].p ? a[1].p : "", a[1].len) || sv_buf_lit(b, "],\"top_logprobs\":[") ||
             sv_buf_add(b, a[2].p ? a[2].p : "", a[2].len) || sv_buf_lit(b, "],\"text_offset\":[") ||
             sv_buf_add(b, a[3].p ? a[3].p : "", a[3].len) || sv_buf_lit(b, "]},\"finish_reason\":null}]");
    for (int k = 0; k < 4; k++) sv_buf_free(&a[k]);
    if (rc) return -1;
    if (o->j->req.continuous_usage) {
        if (sv_buf_lit(b, ",\"usage\":") || usage_obj(o, b)) return -1;
    } else if (o->j->req.include_usage) {
        if (sv_buf_lit(b, ",\"usage\":null")) return -1;
    }
    return sv_buf_lit(b, "}\n\n");
}

/* The "logprobs" value of an event that carries token tok of choice i. */
static int lp_event(sv_out *o, int i, int32_t tok, const sv_logprob *l, sv_buf *b) {
    sv_choice *c = &o->c[i];
    if (o->chat) return sv_buf_lit(b, "{\"content\":[") || lp_chat_item(o, tok, l, b) || sv_buf_lit(b, "]}");
    int rc = sv_buf_lit(b, "{\"tokens\":[") || lp_token(o, tok, b) ||
             sv_buf_printf(b, "],\"token_logprobs\":[%.9g],\"top_logprobs\":[", lp_value(l->logprob)) ||
             lp_top_obj(o, tok, l, b) || sv_buf_printf(b, "],\"text_offset\":[%lld]}", (long long)c->lp_offset);
    c->lp_offset += (int64_t)piece_len(o, tok);
    return rc;
}

/* Non-streaming: keeps the token's entry for the body. */
static int lp_keep(sv_out *o, int i, int32_t tok, const sv_logprob *l) {
    sv_choice *c = &o->c[i];
    if (o->chat) return (c->lp_tokens.len && sv_buf_lit(&c->lp_tokens, ",")) || lp_chat_item(o, tok, l, &c->lp_tokens);
    bool first = c->lp_tokens.len == 0;
    int rc = (!first && (sv_buf_lit(&c->lp_tokens, ",") || sv_buf_lit(&c->lp_values, ",") ||
                         sv_buf_lit(&c->lp_tops, ",") || sv_buf_lit(&c->lp_offsets, ","))) ||
             lp_token(o, tok, &c->lp_tokens) || sv_buf_printf(&c->lp_values, "%.9g", lp_value(l->logprob)) ||
             lp_top_obj(o, tok, l, &c->lp_tops) || sv_buf_printf(&c->lp_offsets, "%lld", (long long)c->lp_offset);
    c->lp_offset += (int64_t)piece_len(o, tok);
    return rc;
}

/* ---- events ---- */

/* One SSE event for choice i: the parsed piece po (completions: its content
 * is the text delta), the token it follows (ids mode / logprobs; -1 none),
 * the token's logprobs (NULL none), the finish reason or NULL, the role
 * (chat's first event). */
static int event(sv_out *o, sv_buf *b, int i, const sv_parse_out *po, int32_t tok, const sv_logprob *lp,
                 const char *reason, bool role) {
    if (sv_buf_lit(b, "data: ") || sv_buf_add(b, o->head.p, o->head.len) ||
        sv_buf_printf(b, "\"choices\":[{\"index\":%d,", i))
        return -1;
    if (o->chat) {
        if (sv_buf_lit(b, "\"delta\":{")) return -1;
        bool any = false;
        if (role) {
            if (sv_buf_lit(b, "\"role\":\"assistant\",\"content\":\"\"")) return -1;
            any = true;
        }
        if (po && po->n_reasoning) {
            if ((any && sv_buf_lit(b, ",")) || sv_buf_lit(b, "\"reasoning_content\":") ||
                sv_buf_json_str(b, po->reasoning, po->n_reasoning))
                return -1;
            any = true;
        }
        if (po && po->n_content) {
            if ((any && sv_buf_lit(b, ",")) || sv_buf_lit(b, "\"content\":") ||
                sv_buf_json_str(b, po->content, po->n_content))
                return -1;
            any = true;
        }
        if (po && po->n_tools) {
            if ((any && sv_buf_lit(b, ",")) || sv_buf_lit(b, "\"tool_calls\":[")) return -1;
            for (size_t k = 0; k < po->n_tools; k++) {
                const sv_tool_piece *t = &po->tools[k];
                if ((k && sv_buf_lit(b, ",")) || sv_buf_printf(b, "{\"index\":%d,", t->index)) return -1;
                if (t->id && (sv_buf_lit(b, "\"id\":") || sv_buf_json_str(b, t->id, strlen(t->id)) ||
                              sv_buf_lit(b, ",\"type\":\"function\",")))
                    return -1;
                if (sv_buf_lit(b, "\"function\":{")) return -1;
                if (t->name && (sv_buf_lit(b, "\"name\":") || sv_buf_json_str(b, t->name, strlen(t->name)) ||
                                sv_buf_lit(b, ",")))
                    return -1;
                if (sv_buf_lit(b, "\"arguments\":") || sv_buf_json_str(b, t->args ? t->args : "", t->args_len) ||
                    sv_buf_lit(b, "}}"))
                    return -1;
            }
            if (sv_buf_lit(b, "]")) return -1;
            any = true;
        }
        if (!any && !reason && sv_buf_lit(b, "\"content\":\"\"")) return -1;
        if (sv_buf_lit(b, "}")) return -1;
    } else {
        if (sv_buf_lit(b, "\"text\":") ||
            sv_buf_json_str(b, po && po->content ? po->content : "", po ? po->n_content : 0))
            return -1;
    }
    if (o->ids_mode && tok >= 0 && sv_buf_printf(b, ",\"token_ids\":[%d]", tok)) return -1;
    sv_choice *c = &o->c[i];
    if (!o->ids_mode && o->j->req.return_token_ids) { /* vLLM's: the prompt's ids in a choice's first event
                                                          (completions), the tokens counted since its last */
        if (!o->chat && !c->ptids_sent && ids_field(b, "prompt_token_ids", c->g->prompt, c->g->n_prompt)) return -1;
        c->ptids_sent = true;
        if (ids_field(b, "token_ids", c->g->out + c->ids_sent, c->counted - c->ids_sent)) return -1;
        c->ids_sent = c->counted;
    }
    if (sv_buf_lit(b, ",\"logprobs\":")) return -1;
    if (lp ? lp_event(o, i, tok, lp, b) : sv_buf_lit(b, "null")) return -1;
    if (sv_buf_lit(b, ",\"finish_reason\":")) return -1;
    if (reason ? sv_buf_printf(b, "\"%s\"", reason) : sv_buf_lit(b, "null")) return -1;
    if (sv_buf_lit(b, "}]")) return -1;
    if (o->chat && !o->ids_mode && o->j->req.return_token_ids && !o->ptids_sent) { /* chat: the response's, first */
        if (ids_field(b, "prompt_token_ids", c->g->prompt, c->g->n_prompt)) return -1;
        o->ptids_sent = true;
    }
    if (o->j->req.continuous_usage) {
        if (sv_buf_lit(b, ",\"usage\":") || usage_obj(o, b)) return -1;
    } else if (o->j->req.include_usage) {
        if (sv_buf_lit(b, ",\"usage\":null")) return -1;
    }
    return sv_buf_lit(b, "}\n\n");
}

static int sgl_event(sv_out *o, int i, const char *reason, sv_buf *sse);

/* The Responses API's logprobs are the message's, an entry for each token whose text is in its output_text
 * (none for the reasoning's, a tool call's, or markup the parser took, such as </think>). A token's bytes
 * have their place in the decoded text (its piece's bytes follow the previous token's); a content piece
 * that comes out is found in the text released (the parser passes content through as it is, holding back
 * at most a tag's start), and takes the pending entries of the tokens it overlaps; those before it are
 * dropped. */
static int lp_pend_add(const sv_out *o, sv_choice *c, int32_t tok, const sv_logprob *lp) {
    if (c->n_pe == c->cap_pe) {
        const size_t cap = c->cap_pe ? 2 * c->cap_pe : 16;
        struct lp_pending *pe = mr_realloc(c->pe, cap * sizeof *pe);
        if (!pe) return -1;
        c->pe = pe, c->cap_pe = cap;
    }
    struct lp_pending *e = &c->pe[c->n_pe];
    e->a = c->lp_pos;
    e->b = c->lp_pos += piece_len(o, tok);
    e->off = c->lp_pend.len;
    if (lp_chat_item(o, tok, lp, &c->lp_pend)) return -1;
    e->len = c->lp_pend.len - e->off;
    c->n_pe++;
    return 0;
}

static int lp_take(sv_choice *c, const sv_parse_out *po, sv_buf *mine) {
    if (!po->n_content || !c->n_pe) return 0;
    const size_t n = po->n_content;
    size_t x = c->sent >= n ? c->sent - n : 0, y = SIZE_MAX; /* the piece is text[x, y) */
    const bool fits = x + n <= c->text.len;
    while (fits && x > c->lp_cend && memcmp(c->text.p + x, po->content, n)) x--;
    if (fits && !memcmp(c->text.p + x, po->content, n)) y = c->lp_cend = x + n;
    else x = 0; /* not found as it is (a tool-call answer's JSON given back as content): every entry is its */
    size_t k = 0;
    for (; k < c->n_pe && c->pe[k].a < y; k++) {
        const struct lp_pending *e = &c->pe[k];
        if (e->b <= x && e->a < x) continue; /* before the piece */
        if ((mine->len && sv_buf_lit(mine, ",")) || sv_buf_add(mine, c->lp_pend.p + e->off, e->len)) return -1;
    }
    if (k == c->n_pe) {
        c->n_pe = 0, c->lp_pend.len = 0;
        return 0;
    }
    const size_t off = c->pe[k].off;
    memmove(c->lp_pend.p, c->lp_pend.p + off, c->lp_pend.len - off);
    c->lp_pend.len -= off;
    memmove(c->pe, c->pe + k, (c->n_pe - k) * sizeof *c->pe);
    c->n_pe -= k;
    for (size_t i = 0; i < c->n_pe; i++) c->pe[i].off -= off;
    return 0;
}

/* Sends (stream) or keeps (body) one parsed piece of choice i. */
static int emit(sv_out *o, int i, const sv_parse_out *po, int32_t tok, const sv_logprob *lp, sv_buf *sse) {
    sv_choice *c = &o->c[i];
    for (size_t k = 0; k < po->n_tools; k++) /* a new call: its first piece has the id */
        if (po->tools[k].id) c->n_calls++;
    if (po->n_reasoning) c->reasoning_tokens = c->counted;
    if (o->resp) {
        sv_buf mine = {0};
        int rc = (lp && tok >= 0 && lp_pend_add(o, c, tok, lp)) || lp_take(c, po, &mine) ||
                 (o->stream && sv_resp_piece(&c->rs, o->rid, po, mine.p, mine.len, sse)) ||
                 (!o->stream && mine.len && ((c->lp_tokens.len && sv_buf_lit(&c->lp_tokens, ",")) ||
                                             sv_buf_add(&c->lp_tokens, mine.p, mine.len)));
        sv_buf_free(&mine);
        if (rc) return -1;
    }
    if (o->anth && o->stream && sv_anthropic_piece(&c->rs, po, sse)) return -1;
    if (o->sgl) { /* the text so far goes out whole (sglang's stream), and is kept for the body */
        if (sv_buf_add(&c->content, po->content ? po->content : "", po->n_content)) return -1;
        return o->stream && po->n_content ? sgl_event(o, i, NULL, sse) : 0;
    }
    if (o->stream && !o->resp && !o->anth) {
        bool has = po->n_content || po->n_reasoning || po->n_tools || (tok >= 0 && (o->ids_mode || lp));
        return has ? event(o, sse, i, po, tok, lp, NULL, false) : 0;
    }
    if (sv_buf_add(&c->content, po->content ? po->content : "", po->n_content) ||
        sv_buf_add(&c->reasoning, po->reasoning ? po->reasoning : "", po->n_reasoning))
        return -1;
    for (size_t k = 0; k < po->n_tools; k++) {
        const sv_tool_piece *t = &po->tools[k];
        json_t *call = json_array_get(c->calls, (size_t)t->index);
        if (!call) {
            call = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", t->id ? t->id : "", "type", "function", "function", "name",
                             t->name ? t->name : "", "arguments", "");
            if (!call || json_array_append_new(c->calls, call)) return -1;
        }
        json_t *fn = json_object_get(call, "function");
        const char *a = json_string_value(json_object_get(fn, "arguments"));
        sv_buf cat = {0};
        if (sv_buf_add(&cat, a ? a : "", a ? strlen(a) : 0) || sv_buf_add(&cat, t->args ? t->args : "", t->args_len) ||
            json_object_set_new(fn, "arguments", json_stringn(cat.p ? cat.p : "", cat.len))) {
            sv_buf_free(&cat);
            return -1;
        }
        sv_buf_free(&cat);
    }
    if (o->ids_mode && tok >= 0 && sv_buf_printf(&c->ids, "%s%d", c->ids.len ? "," : "", tok)) return -1;
    if (lp && tok >= 0 && !o->resp && lp_keep(o, i, tok, lp)) return -1;
    return 0;
}

/* A fresh tool-call id (the shape of the chat parser's, text/parse_output.c). */
static void new_call_id(char id[40]) {
    static atomic_ullong counter;
    snprintf(id, 40, "call_%016llx%08llx", (unsigned long long)mr_now_ns(),
             (unsigned long long)(atomic_fetch_add(&counter, 1) & 0xffffffffu));
}

/* A tool-call answer's content goes to c->json, not to the client; streamed with a named function it
 * goes out as that call's argument text as it comes (its first piece with the id and the name), the way
 * OpenAI's and vLLM's servers stream a forced function's arguments. */
static int divert(sv_out *o, int i, sv_parse_out *po) {
    sv_choice *c = &o->c[i];
    if (!c->tool_json || !po->n_content) return 0;
    if (sv_buf_add(&c->json, po->content, po->n_content)) return -1;
    if (o->stream && o->j->req.tool_choice == SV_TOOLS_NAMED) {
        const bool first = !c->n_calls;
        if (first) new_call_id(c->call_id);
        c->piece = (sv_tool_piece){.index = 0, .id = first ? c->call_id : NULL, .name = first ? o->j->req.tool_name : NULL,
                                   .args = po->content, .args_len = po->n_content};
        po->tools = &c->piece;
        po->n_tools = 1;
    }
    po->n_content = 0;
    return 0;
}

/* Releases what the stop strings allow of c->text (everything when final),
 * parses it (chat) and emits or keeps it. tok / lp: the token this follows
 * (-1 / NULL: none). */
static int release(sv_out *o, int i, bool final, int32_t tok, const sv_logprob *lp, sv_buf *sse) {
    sv_choice *c = &o->c[i];
    const sv_request *r = &o->j->req;
    size_t safe = c->text.len;
    if (c->stop.n && c->text.len > c->scanned && c->counted < r->min_tokens) {
        /* before min_tokens no stop string ends the output (vLLM's rule) and none found then is
         * found later; a tail that could start one that completes later is held */
        const size_t h = c->stop.max_len - 1;
        safe = final ? c->text.len : c->text.len > h ? c->text.len - h : 0;
        c->scanned = c->text.len;
    } else if (c->stop.n && c->text.len > c->scanned) {
        size_t cut, cut_end, s;
        if (sv_stop_scan(&c->stop, c->text.p, c->text.len, c->scanned, &cut, &cut_end, &s)) {
            safe = r->include_stop_str ? cut_end : cut;
            if (!c->stop_hit && (c->stop_hit = mr_malloc(cut_end - cut + 1))) {
                memcpy(c->stop_hit, c->text.p + cut, cut_end - cut);
                c->stop_hit[cut_end - cut] = 0;
            }
            if (safe < c->sent) safe = c->sent;
            c->done = true;
            c->reason = "stop";
            sv_gen_cancel(c->g, SV_CANCEL_DONE); /* the engine frees it at its next step */
        } else {
            safe = final ? c->text.len : s;
        }
        c->scanned = c->text.len;
    } else if (c->stop.n && !final) {
        safe = c->sent; /* no new text: what is held stays held */
    }
    if (safe < c->sent) safe = c->sent;
    const char *d = c->text.p ? c->text.p + c->sent : "";
    size_t nd = safe - c->sent;
    c->sent = safe;
    sv_parse_out po = {0};
    if (o->chat) {
        if (sv_parse_push(c->ps, d, nd, &po)) return -1;
    } else {
        po.content = d;
        po.n_content = nd;
    }
    if (divert(o, i, &po) || emit(o, i, &po, tok, lp, sse)) return -1;
    if (o->chat && (final || c->done)) { /* the parser's held-back tail */
        if (sv_parse_finish(c->ps, &po) || divert(o, i, &po) || emit(o, i, &po, -1, NULL, sse)) return -1;
    }
    return 0;
}

/* The end of a tool-call answer: its JSON as calls (required: [{"name", "parameters"}, ...]; named: the
 * arguments), or, when it is not that (cut by max_tokens), as content, so that nothing is lost. */
static int tool_calls_emit(sv_out *o, int i, sv_buf *sse) {
    sv_choice *c = &o->c[i];
    const sv_request *r = &o->j->req;
    json_t *x = c->json.len ? json_loadb(c->json.p, c->json.len, 0, NULL) : NULL;
    size_t n = r->tool_choice == SV_TOOLS_NAMED ? (json_is_object(x) ? 1 : 0) : json_array_size(x);
    sv_tool_piece pc[16];
    char ids[16][40], *args[16] = {0};
    int rc = 0;
    if (n == 0 || n > 16) {
        sv_parse_out po = {.content = c->json.p, .n_content = c->json.len};
        rc = c->json.len ? emit(o, i, &po, -1, NULL, sse) : 0;
        json_decref(x);
        return rc;
    }
    for (size_t k = 0; k < n; k++) {
        const json_t *call = r->tool_choice == SV_TOOLS_NAMED ? NULL : json_array_get(x, k);
        const json_t *params = call ? json_object_get(call, "parameters") : x;
        new_call_id(ids[k]);
        args[k] = json_dumps(params, JSON_COMPACT);
        if (!args[k]) rc = -1;
        pc[k] = (sv_tool_piece){.index = c->n_calls + (int)k, .id = ids[k],
                                .name = call ? json_string_value(json_object_get(call, "name")) : r->tool_name,
                                .args = args[k], .args_len = args[k] ? strlen(args[k]) : 0};
    }
    sv_parse_out po = {.tools = pc, .n_tools = n};
    if (!rc) rc = emit(o, i, &po, -1, NULL, sse);
    for (size_t k = 0; k < n; k++) free(args[k]);
    json_decref(x);
    return rc;
}

/* The Responses API: the whole Response around output (stolen): status (cancelled: a background response's
 * cancel ended it), incomplete_details, usage. */
static json_t *resp_whole(const sv_out *o, json_t *output) {
    const sv_choice *c = &o->c[0];
    const bool incomplete = c->reason && !strcmp(c->reason, "length");
    const bool cancelled = c->reason && !strcmp(c->reason, "abort");
    json_t *r = sv_resp_object(o->j, o->model, cancelled ? "cancelled" : incomplete ? "incomplete" : "completed");
    json_t *u = sv_resp_usage(o->prompt_tokens, c->cached, c->counted, c->reasoning_tokens);
    if (!r || !output || !u || json_object_set_new(r, "output", output) || json_object_set_new(r, "usage", u) ||
        (incomplete && json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens")))) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* One [logprob, id, text or null] entry of sglang's logprob lists (text: the token's, with
 * return_text_in_logprobs, where it is UTF-8 on its own). */
static json_t *sgl_lp_pack(const sv_out *o, json_t *logprob, int32_t id, bool text) {
    const char *p;
    size_t n;
    json_t *t = text && !o->ids_mode && !sv_text_piece(o->t, id, &p, &n) ? json_stringn(p, n) : NULL;
    return json_pack("[o,i,o]", logprob ? logprob : json_null(), (int)id, t ? t : json_null());
}
static json_t *sgl_lp_entry(const sv_out *o, float logprob, int32_t id, bool text) {
    return sgl_lp_pack(o, json_real(lp_value(logprob)), id, text);
}

/* One position's entry of sglang's token_ids_logprob lists: the gen's ids with their log-probabilities lp
 * [n_lp_ids], in the order asked (null: none, as sglang sends a position without them). */
static json_t *sgl_ids_row(const sv_out *o, const sv_gen *g, const float *lp, bool text) {
    if (!lp || g->n_lp_ids == 0) return json_null();
    json_t *row = json_array();
    for (int t = 0; row && t < g->n_lp_ids; t++)
        if (json_array_append_new(row, sgl_lp_entry(o, lp[t], g->lp_ids[t], text))) json_decref(row), row = NULL;
    return row;
}

/* sglang's input_token_logprobs (and with top_logprobs_num input_top_logprobs): the prompt tokens from
 * logprob_start_len s (-1: the last one), the first entry's value null as sglang sends it, then each
 * token's log-probability at the position before it. */
static int sgl_input_logprobs(const sv_out *o, const sv_gen *g, int top, bool text, json_t *meta) {
    const int64_t from = o->j->req.plp_from, s = from > 0 ? from - 1 : g->n_prompt - 1;
    json_t *lps = json_array(), *tops = top ? json_array() : NULL, *ids = g->has_lp_ids ? json_array() : NULL;
    int bad = !lps || (top && !tops) || (g->has_lp_ids && !ids);
    for (int64_t p = s; !bad && p < g->n_prompt; p++) {
        /* p > s: owed, and filled (every entry comes before the first token) */
        const sv_logprob *l = p > s && g->plp && p < g->n_plp ? sv_logprob_at(g->plp, o->j->req.plp_top, p) : NULL;
        bad = json_array_append_new(lps, sgl_lp_pack(o, l ? json_real(lp_value(l->logprob)) : NULL, g->prompt[p], text));
        if (ids)
            bad |= json_array_append_new(
                ids, sgl_ids_row(o, g, l && g->plp_idlp ? g->plp_idlp + (size_t)p * (size_t)g->n_lp_ids : NULL, text));
        if (tops) {
            json_t *row = l ? json_array() : json_null();
            for (int t = 0; l && row && t < l->n_top && t < top; t++)
                if (json_array_append_new(row, sgl_lp_entry(o, l->top[t].logprob, l->top[t].token, text)))
                    json_decref(row), row = NULL;
            bad |= json_array_append_new(tops, row);
        }
    }
    bad |= json_object_set_new(meta, "input_token_logprobs", lps);
    if (tops) bad |= json_object_set_new(meta, "input_top_logprobs", tops);
    if (ids) bad |= json_object_set_new(meta, "input_token_ids_logprobs", ids);
    return bad ? -1 : 0;
}

/* sglang's return_logprob: meta_info's output_token_logprobs over choice i's tokens so far, one entry a
 * completion token, and with top_logprobs_num its output_top_logprobs (as sglang streams them: the whole
 * lists in every event), then the prompt's input_token_logprobs (and input_top_logprobs). 0, or -1 out of
 * memory. */
static int sgl_logprobs(const sv_out *o, int i, json_t *meta) {
    const sv_choice *c = &o->c[i];
    const int top = o->j->req.top_logprobs;
    const bool text = json_is_true(json_object_get(o->j->req.sgl_meta, "text_in_logprobs"));
    const sv_gen *g = c->g;
    json_t *lps = json_array(), *tops = top ? json_array() : NULL, *ids = g->has_lp_ids ? json_array() : NULL;
    int bad = !lps || (top && !tops) || !g->lp || (g->has_lp_ids && !ids);
    for (int64_t k = 0; !bad && k < c->counted; k++) {
        const sv_logprob *l = sv_logprob_at(g->lp, top, k);
        bad = json_array_append_new(lps, sgl_lp_entry(o, l->logprob, g->out[k], text));
        if (ids) bad |= json_array_append_new(ids, sgl_ids_row(o, g, g->idlp + (size_t)k * (size_t)g->n_lp_ids, text));
        if (tops) {
            json_t *row = json_array();
            for (int t = 0; row && t < l->n_top && t < top; t++)
                if (json_array_append_new(row, sgl_lp_entry(o, l->top[t].logprob, l->top[t].token, text)))
                    json_decref(row), row = NULL;
            bad |= json_array_append_new(tops, row);
        }
    }
    if (ids && !bad && g->echo_only && g->idlp_next) /* the prompt alone: the ids at the position after it, as
                                                         sglang's prefill-only requests (its /v1/score reads them) */
        bad |= json_array_append_new(ids, sgl_ids_row(o, g, g->idlp, text));
    bad |= json_object_set_new(meta, "output_token_logprobs", lps);
    if (tops) bad |= json_object_set_new(meta, "output_top_logprobs", tops);
    if (ids) bad |= json_object_set_new(meta, "output_token_ids_logprobs", ids);
    return bad || sgl_input_logprobs(o, g, top, text, meta) ? -1 : 0;
}

/* sglang's routed_experts of a finished choice: base64 of the int32 (little-endian) ids of [prompt + completion
 * - 1][n_layers][top_k], every position that went through the model (the last token never does), as sglang
 * sends them for routing replay. */
static int sgl_routes(const sv_out *o, const sv_choice *c, json_t *meta) {
    const mr_model_config *mc = mr_model_config_of(o->m);
    const size_t row = (size_t)mc->n_layers * (size_t)mc->top_k;
    int64_t n = c->g->n_prompt + c->counted - 1;
    if (n > c->g->routes_cap) n = c->g->routes_cap;
    sv_buf b = {0};
    int rc = 0;
    pthread_mutex_lock(&o->j->mu);
    for (size_t i = 0; !rc && i < (size_t)(n > 0 ? n : 0) * row; i += 768) { /* pieces of 3072 bytes: 3 divides it */
        const size_t m = (size_t)n * row - i < 768 ? (size_t)n * row - i : 768;
        unsigned char le[3072];
        for (size_t q = 0; q < m; q++) {
            const uint32_t v = (uint32_t)c->g->routes[i + q];
            le[4 * q] = (unsigned char)v, le[4 * q + 1] = (unsigned char)(v >> 8);
            le[4 * q + 2] = (unsigned char)(v >> 16), le[4 * q + 3] = (unsigned char)(v >> 24);
        }
        rc = sv_buf_base64(&b, le, 4 * m);
    }
    pthread_mutex_unlock(&o->j->mu);
    rc = rc || json_object_set_new(meta, "routed_experts", json_stringn(b.p ? b.p : "", b.len));
    sv_buf_free(&b);
    return rc ? -1 : 0;
}

/* sglang's answer object for choice i (reason NULL: a streamed piece, without output_ids). */
static json_t *sgl_object(const sv_out *o, int i, const char *reason) {
    const sv_choice *c = &o->c[i];
    char id[96];
    sv_sglang_choice_id(o->j, i, id, sizeof id);
    const int32_t last = c->counted > 0 ? c->g->out[c->counted - 1] : -1;
    const bool by_id = reason && !strcmp(reason, "stop") && !c->stop_hit && last >= 0 && is_stop_token(o, c->g, last, c->counted);
    json_t *x = sv_sglang_object(id, c->content.p, c->content.len, reason ? c->g->out : NULL, c->counted, reason,
                                 c->stop_hit, by_id ? last : -1, o->j->prompt_len[i / o->j->req.n], c->counted, c->cached);
    if (x) { /* the weights' version it ran under (sglang's; the one it ended under once it has) */
        char wver[sizeof c->g->wver];
        pthread_mutex_lock(&o->j->mu);
        memcpy(wver, c->g->wver, sizeof wver);
        pthread_mutex_unlock(&o->j->mu);
        wver[sizeof wver - 1] = 0;
        if (json_object_set_new(json_object_get(x, "meta_info"), "weight_version", json_string(wver))) {
            json_decref(x);
            return NULL;
        }
    }
    if (x && reason && c->g->routes && sgl_routes(o, c, json_object_get(x, "meta_info"))) {
        json_decref(x);
        return NULL;
    }
    if (x && json_is_true(json_object_get(o->j->req.sgl_meta, "return_logprob")) &&
        sgl_logprobs(o, i, json_object_get(x, "meta_info"))) {
        json_decref(x);
        return NULL;
    }
    return x;
}

static int sgl_event(sv_out *o, int i, const char *reason, sv_buf *sse) {
    json_t *x = sgl_object(o, i, reason);
    if (x && o->n > 1) json_object_set_new(x, "index", json_integer(i));
    char *s = x ? json_dumps(x, JSON_COMPACT) : NULL;
    json_decref(x);
    const int rc = !s || sv_buf_lit(sse, "data: ") || sv_buf_add(sse, s, strlen(s)) || sv_buf_lit(sse, "\n\n");
    free(s);
    return rc ? -1 : 0;
}

/* The Messages API's stop_reason. */
static const char *anth_stop_reason(const sv_choice *c) {
    if (c->reason && !strcmp(c->reason, "length")) return "max_tokens";
    if (c->stop_hit) return "stop_sequence";
    return c->n_calls ? "tool_use" : "end_turn";
}

/* A Response that ended (completed, incomplete, cancelled) kept in the server's store, when the request is
 * stored: the Response, and the conversation items up to its output (previous_response_id reads them). One
 * that cannot be kept (alone larger than the store, or out of memory) says store false. A completed or
 * incomplete one in a conversation adds its input's items and its output to it, and gives up its claim on it
 * (else the request's free does). */
static void resp_keep(void *ctx, json_t *response) {
    const sv_out *o = ctx;
    sv_request *r = &o->j->req;
    const char *st = json_string_value(json_object_get(response, "status"));
    if (r->resp_convs && st && (!strcmp(st, "completed") || !strcmp(st, "incomplete")))
        sv_conv_append(r->resp_convs, r->resp_conv, r->resp_conv_input, json_object_get(response, "output"));
    if (r->resp_convs) { /* the conversation is free for the next response before this one's answer is out */
        sv_conv_release(r->resp_convs, r->resp_conv, r->resp_id, r->resp_conv_reserved);
        r->resp_convs = NULL;
    }
    if (r->resp_store && response && sv_resp_store(r->resp_store, r->resp_id, r->resp_ctx, response, NULL))
        json_object_set_new(response, "store", json_false());
}

/* The Responses API stream's last event. */
static int resp_final(sv_out *o, int i, sv_buf *sse) {
    sv_choice *c = &o->c[i];
    if (c->failed) {
        json_t *r = sv_resp_object(o->j, o->model, "failed");
        if (r) json_object_set_new(r, "error", json_pack("{s:s,s:s}", "code", "server_error", "message", c->err));
        return sv_resp_end(&c->rs, r, "response.failed", sse, NULL, NULL);
    }
    const bool incomplete = c->reason && !strcmp(c->reason, "length");
    return sv_resp_end(&c->rs, resp_whole(o, json_array()), incomplete ? "response.incomplete" : "response.completed", sse,
                       resp_keep, o);
}

/* The choice's last event: what is held back, then the finish reason. */
static int finalize(sv_out *o, int i, sv_fin fin, const char *err, sv_buf *sse) {
    sv_choice *c = &o->c[i];
    if (!c->done) {
        if (c->dt && sv_detok_flush(c->dt, &c->text.p, &c->text.len, &c->text.cap)) return -1;
        if (release(o, i, true, -1, NULL, sse)) return -1;
        const bool streamed = o->stream && o->j->req.tool_choice == SV_TOOLS_NAMED; /* went out as it came */
        if (c->tool_json && !streamed && fin != SV_FIN_ERROR && tool_calls_emit(o, i, sse)) return -1;
        if (!c->done) c->reason = fin_reason(fin);
        c->done = true;
        if (fin == SV_FIN_ERROR) {
            c->failed = true;
            c->unavailable = c->g && c->g->unavailable;
            snprintf(c->err, sizeof c->err, "%s", err && *err ? err : "the request failed in the engine");
        }
    }
    if (o->chat && c->n_calls && !strcmp(c->reason, "stop")) c->reason = "tool_calls";
    if (!o->stream) return 0;
    if (o->resp) return resp_final(o, i, sse);
    if (o->sgl && !c->failed) return sgl_event(o, i, c->reason, sse);
    if (o->anth)
        return c->failed ? sv_anthropic_fail(c->err, sse)
                         : sv_anthropic_end(&c->rs, anth_stop_reason(c), c->stop_hit,
                                            sv_anthropic_usage(o->prompt_tokens, c->cached, c->counted), sse);
    if (c->failed) {
        sv_error e;
        sv_fail(&e, c->unavailable ? 503 : 500, NULL, "%s", c->err);
        char *body = sv_error_body(&e);
        int rc = body ? sv_buf_printf(sse, "data: %s\n\n", body) : -1;
        mr_free(body);
        return rc;
    }
    return event(o, sse, i, NULL, -1, NULL, c->reason, false);
}

/* A chat stream's first chunk of choice i ({"role": "assistant"}), once: with the choice's first output (or
 * its end), as vLLM and sglang send it, so that a client's time to first chunk is the time to the first
 * token and never the time to admission. */
static int role_chunk(sv_out *o, int i, sv_buf *sse) {
    if (!o->stream || !o->chat || o->resp || o->anth || o->c[i].role_sent) return 0;
    o->c[i].role_sent = true;
    return event(o, sse, i, NULL, -1, NULL, NULL, true);
}

int sv_out_advance(sv_out *o, sv_buf *sse) {
    sv_job *j = o->j;
    if (o->finished) return 1;
    if (!o->started) {
        o->started = true;
        if (o->resp) o->c[0].rs.encrypted = j->req.resp_encrypted;
        if (o->stream && o->resp && sv_resp_begin(&o->c[0].rs, sv_resp_object(j, o->model, "in_progress"), sse)) return -1;
        if (o->stream && o->anth &&
            sv_anthropic_begin(sv_anthropic_message(j, o->model, NULL, 0, NULL, 0, NULL, NULL, NULL,
                                                    sv_anthropic_usage(o->prompt_tokens, 0, 0)), sse))
            return -1;
        if (o->stream && j->req.echo)
            for (int i = 0; i < o->n; i++) {
                if (o->c[i].echo_pending) continue; /* with logprobs: once its entries are in */
                if (role_chunk(o, i, sse)) return -1;
                const char *pt = j->prompt_text[i / j->req.n];
                sv_parse_out po = {.content = pt, .n_content = pt ? strlen(pt) : 0};
                if (po.n_content && event(o, sse, i, &po, -1, NULL, NULL, false)) return -1;
            }
    }
    /* per choice, a snapshot of what the engine published: out[] only grows and never moves */
    bool all_done = true;
    for (int i = 0; i < o->n; i++) {
        sv_choice *c = &o->c[i];
        if (c->done && c->reason) continue;
        pthread_mutex_lock(&j->mu);
        int64_t avail = c->g->n_out;
        sv_fin fin = c->g->fin;
        char err[200];
        snprintf(err, sizeof err, "%s", c->g->err);
        c->cached = c->g->cached_tokens;
        const int64_t n_plp = c->g->n_plp;
        pthread_mutex_unlock(&j->mu);
        if (c->echo_pending) { /* the prompt's event first, once every entry came (or the gen ended) */
            if (n_plp < c->g->n_prompt && fin == SV_FIN_NONE && avail == 0) {
                all_done = false;
                continue;
            }
            if (role_chunk(o, i, sse) || echo_event(o, sse, i, n_plp)) return -1;
            c->echo_pending = false;
        }
        if ((avail > c->consumed || fin != SV_FIN_NONE) && role_chunk(o, i, sse)) return -1;
        while (!c->done && c->consumed < avail) {
            int64_t k = c->consumed++;
            int32_t tok = c->g->out[k];
            const sv_logprob *lp = c->g->lp ? sv_logprob_at(c->g->lp, j->req.top_logprobs, k) : NULL;
            c->counted = c->consumed;
            bool text = !is_stop_token(o, c->g, tok, c->counted);
            if (o->resp && !text) lp = NULL; /* the Responses API's entries are of the message's text */
            if (c->dt && text && sv_detok_push(c->dt, tok, &c->text.p, &c->text.len, &c->text.cap)) return -1;
            if (release(o, i, false, o->ids_mode || lp ? tok : -1, lp, sse)) return -1;
        }
        if (c->done || (fin != SV_FIN_NONE && c->consumed == avail)) {
            if (finalize(o, i, fin == SV_FIN_NONE ? SV_FIN_STOP : fin, err, sse)) return -1;
        } else {
            all_done = false;
        }
    }
    if (!all_done) return 0;
    o->finished = true;
    if (o->stream && !o->resp && !o->anth) {
        if (j->req.include_usage && !o->sgl) {
            if (sv_buf_lit(sse, "data: ") || sv_buf_add(sse, o->head.p, o->head.len) ||
                sv_buf_lit(sse, "\"choices\":[],\"usage\":") || usage_obj(o, sse) || sv_buf_lit(sse, "}\n\n"))
                return -1;
        }
        if (sv_buf_lit(sse, "data: [DONE]\n\n")) return -1;
    }
    return 1;
}

static int body_logprobs(const sv_out *o, const sv_choice *c, sv_buf *b) {
    if (!o->j->req.logprobs) return sv_buf_lit(b, "null");
    if (o->chat)
        return sv_buf_lit(b, "{\"content\":[") || sv_buf_add(b, c->lp_tokens.p ? c->lp_tokens.p : "", c->lp_tokens.len) ||
               sv_buf_lit(b, "]}");
    if (echo_lp(o)) { /* echo: the prompt's entries, then the completion's */
        sv_buf a[4] = {{0}};
        pthread_mutex_lock(&o->j->mu);
        const int64_t n_plp = c->g->n_plp;
        pthread_mutex_unlock(&o->j->mu);
        const sv_buf *gen[4] = {&c->lp_tokens, &c->lp_values, &c->lp_tops, &c->lp_offsets};
        int rc = plp_entries(o, c->g, n_plp, &a[0], &a[1], &a[2], &a[3]);
        for (int k = 0; k < 4 && !rc; k++)
            rc = gen[k]->len && (sv_buf_lit(&a[k], ",") || sv_buf_add(&a[k], gen[k]->p, gen[k]->len));
        rc = rc || sv_buf_lit(b, "{\"tokens\":[") || sv_buf_add(b, a[0].p, a[0].len) ||
             sv_buf_lit(b, "],\"token_logprobs\":[") || sv_buf_add(b, a[1].p, a[1].len) ||
             sv_buf_lit(b, "],\"top_logprobs\":[") || sv_buf_add(b, a[2].p, a[2].len) ||
             sv_buf_lit(b, "],\"text_offset\":[") || sv_buf_add(b, a[3].p, a[3].len) || sv_buf_lit(b, "]}");
        for (int k = 0; k < 4; k++) sv_buf_free(&a[k]);
        return rc;
    }
    return sv_buf_lit(b, "{\"tokens\":[") || sv_buf_add(b, c->lp_tokens.p ? c->lp_tokens.p : "", c->lp_tokens.len) ||
           sv_buf_lit(b, "],\"token_logprobs\":[") ||
           sv_buf_add(b, c->lp_values.p ? c->lp_values.p : "", c->lp_values.len) ||
           sv_buf_lit(b, "],\"top_logprobs\":[") || sv_buf_add(b, c->lp_tops.p ? c->lp_tops.p : "", c->lp_tops.len) ||
           sv_buf_lit(b, "],\"text_offset\":[") ||
           sv_buf_add(b, c->lp_offsets.p ? c->lp_offsets.p : "", c->lp_offsets.len) || sv_buf_lit(b, "]}");
}

/* The body of the APIs whose answers are built as JSON objects (x stolen; NULL: out of memory). */
static char *dump_body(json_t *x, int *http) {
    char *s = x ? json_dumps(x, JSON_COMPACT) : NULL;
    json_decref(x);
    *http = s ? 200 : 500;
    return s;
}

const char *sv_out_failure(const sv_out *o) {
    for (int i = 0; i < o->n; i++)
        if (o->c[i].failed) return o->c[i].err;
    return NULL;
}

char *sv_out_body(sv_out *o, int *http) {
    for (int i = 0; i < o->n; i++)
        if (o->c[i].failed) {
            sv_error e;
            const int code = o->c[i].unavailable ? 503 : 500; /* 503: the server can run nothing any more */
            sv_fail(&e, code, NULL, "%s", o->c[i].err);
            *http = code;
            return o->anth ? sv_anthropic_error_body(&e) : sv_error_body(&e);
        }
    if (o->sgl && json_is_true(json_object_get(o->j->req.sgl_meta, "score"))) { /* sglang's /v1/score */
        const float **lp = mr_calloc((size_t)o->n, sizeof *lp);
        if (!lp) goto oom;
        for (int i = 0; i < o->n; i++) lp[i] = o->c[i].g->idlp_next ? o->c[i].g->idlp : NULL;
        json_t *x = sv_score_object(o->j->req.sgl_meta, o->model, o->n, lp, o->c[0].g->n_lp_ids, o->prompt_tokens);
        mr_free(lp);
        return dump_body(x, http);
    }
    if (o->sgl) { /* one object, or a list of them for a batch */
        const bool batch = json_is_true(json_object_get(o->j->req.sgl_meta, "batch")) || o->n > 1;
        json_t *all = batch ? json_array() : NULL;
        json_t *one = NULL;
        for (int i = 0; i < o->n; i++) {
            json_t *x = sgl_object(o, i, o->c[i].reason ? o->c[i].reason : "stop");
            if (batch) json_array_append_new(all, x);
            else one = x;
        }
        return dump_body(batch ? all : one, http);
    }
    if (o->anth) {
        const sv_choice *c = &o->c[0];
        json_t *m = sv_anthropic_message(o->j, o->model, c->reasoning.p, c->reasoning.len, c->content.p ? c->content.p : "",
                                         c->content.len, c->calls,
                                         anth_stop_reason(c), c->stop_hit, sv_anthropic_usage(o->prompt_tokens, c->cached, c->counted));
        return dump_body(m, http);
    }
    if (o->resp) {
        const sv_choice *c = &o->c[0];
        json_t *r = resp_whole(o, sv_resp_items(o->rid, c->reasoning.p, c->reasoning.len, c->content.p, c->content.len,
                                                c->lp_tokens.p, c->lp_tokens.len, c->calls, !strcmp(c->reason ? c->reason : "stop", "length"), o->j->req.resp_encrypted));
        resp_keep(o, r);
        return dump_body(r, http);
    }
    sv_buf b = {0};
    if (sv_buf_add(&b, o->head.p, o->head.len) || sv_buf_lit(&b, "\"choices\":[")) goto oom;
    for (int i = 0; i < o->n; i++) {
        sv_choice *c = &o->c[i];
        if (sv_buf_printf(&b, "%s{\"index\":%d,", i ? "," : "", i)) goto oom;
        if (o->chat) {
            if (sv_buf_lit(&b, "\"message\":{\"role\":\"assistant\",\"content\":")) goto oom;
            if (c->content.len || !json_array_size(c->calls)) {
                if (sv_buf_json_str(&b, c->content.p ? c->content.p : "", c->content.len)) goto oom;
            } else if (sv_buf_lit(&b, "null")) {
                goto oom;
            }
            if (c->reasoning.len && (sv_buf_lit(&b, ",\"reasoning_content\":") ||
                                     sv_buf_json_str(&b, c->reasoning.p, c->reasoning.len)))
                goto oom;
            if (json_array_size(c->calls)) {
                char *calls = json_dumps(c->calls, JSON_COMPACT);
                int bad = !calls || sv_buf_lit(&b, ",\"tool_calls\":") || sv_buf_add(&b, calls, strlen(calls));
                mr_free(calls);
                if (bad) goto oom;
            }
            if (sv_buf_lit(&b, "}")) goto oom;
        } else {
            const char *pt = o->j->req.echo ? o->j->prompt_text[i / o->j->req.n] : NULL;
            sv_buf t = {0};
            if ((pt && sv_buf_add(&t, pt, strlen(pt))) || sv_buf_add(&t, c->content.p ? c->content.p : "", c->content.len) ||
                sv_buf_lit(&b, "\"text\":") || sv_buf_json_str(&b, t.p ? t.p : "", t.len)) {
                sv_buf_free(&t);
                goto oom;
            }
            sv_buf_free(&t);
        }
        if (o->ids_mode && sv_buf_printf(&b, ",\"token_ids\":[%s]", c->ids.p ? c->ids.p : "")) goto oom;
        if (!o->ids_mode && o->j->req.return_token_ids &&
            ((!o->chat && ids_field(&b, "prompt_token_ids", c->g->prompt, c->g->n_prompt)) ||
             ids_field(&b, "token_ids", c->g->out, c->counted)))
            goto oom;
        if (sv_buf_lit(&b, ",\"logprobs\":") || body_logprobs(o, c, &b)) goto oom;
        if (!o->chat && o->j->req.prompt_logprobs >= 0 && (sv_buf_lit(&b, ",\"prompt_logprobs\":") || plp_vllm(o, c->g, &b)))
            goto oom;
        if (sv_buf_printf(&b, ",\"finish_reason\":\"%s\"}", c->reason ? c->reason : "stop")) goto oom;
    }
    if (sv_buf_lit(&b, "]")) goto oom;
    if (o->chat && !o->ids_mode && o->j->req.return_token_ids &&
        ids_field(&b, "prompt_token_ids", o->c[0].g->prompt, o->c[0].g->n_prompt))
        goto oom;
    if (o->chat && o->j->req.prompt_logprobs >= 0 && /* vLLM: chat's are the response's, of its one prompt */
        (sv_buf_lit(&b, ",\"prompt_logprobs\":") || plp_vllm(o, o->c[0].g, &b)))
        goto oom;
    { /* sglang's: the weights' version the (first) choice ended under */
        char wver[sizeof o->c[0].g->wver];
        pthread_mutex_lock(&o->j->mu);
        memcpy(wver, o->c[0].g->wver, sizeof wver);
        pthread_mutex_unlock(&o->j->mu);
        wver[sizeof wver - 1] = 0;
        if (sv_buf_lit(&b, ",\"metadata\":{\"weight_version\":") || sv_buf_json_str(&b, wver, strlen(wver)) ||
            sv_buf_lit(&b, "}"))
            goto oom;
    }
    if (sv_buf_lit(&b, ",\"usage\":") || usage_obj(o, &b) || sv_buf_lit(&b, "}")) goto oom;
    *http = 200;
    return b.p;
oom:
    sv_buf_free(&b);
    *http = 500;
    return NULL;
}
