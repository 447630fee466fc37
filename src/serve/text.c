/* text.c — the text seam of the server over the text library: the model
 * folder's tokenizer (moerun/text.h), its chat template and output parser
 * (moerun/chat.h). A checkpoint without tokenizer.json is served by token
 * ids: prompts must be ids, chat is refused, and each choice carries the ids
 * it generated ("token_ids") with empty text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moerun/chat.h"
#include "moerun/grammar.h"
#include "moerun/text.h"
#include "serve/serve_internal.h"

struct sv_text {
    mr_tokenizer *tok;  /* NULL: ids only */
    mr_chat *chat;      /* NULL: no chat template */
    mr_chat_format format;
    mr_vocab_index *vix; /* structured outputs' token trie */
    bool append_think;   /* --reasoning-parser minimax_m2_append_think: the reasoning stays in content */
};

/* vLLM's and sglang's parser names for MiniMax-M2's output (vLLM: vllm/reasoning/minimax_m2_reasoning_parser.py,
 * vllm/entrypoints/openai/tool_parsers/minimax_m2_tool_parser.py; sglang: --reasoning-parser minimax /
 * minimax-append-think, --tool-call-parser minimax-m2). */
static const char *const SPLIT_THINK[] = {"minimax_m2", "minimax", NULL};
static const char *const APPEND_THINK[] = {"minimax_m2_append_think", "minimax-append-think", NULL};
static const char *const TOOL_PARSERS[] = {"minimax_m2", "minimax-m2", NULL};

static bool named(const char *const *list, const char *name) {
    for (; name && *list; list++)
        if (!strcmp(*list, name)) return true;
    return false;
}

bool mr_server_reasoning_parser_known(const char *name) { return named(SPLIT_THINK, name) || named(APPEND_THINK, name); }
bool mr_server_tool_call_parser_known(const char *name) { return named(TOOL_PARSERS, name); }

struct sv_detok {
    const mr_tokenizer *t;
    mr_tokstream *s;
};

struct sv_parse {
    mr_chat_parser *p;
    sv_tool_piece pieces[16];
    bool prefix;   /* "<think>" is still to lead the content (append-think) */
    sv_buf first;  /* the content that leads with it */
};

mr_status sv_text_open(const char *model_dir, const mr_server_opts *so, sv_text **out) {
    const char *chat_template = so ? so->chat_template : NULL;
    *out = NULL;
    sv_text *t = mr_calloc(1, sizeof *t);
    if (!t) return MR_ENOMEM;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    mr_status s = MR_OK;
    if (stat(path, &st) != 0 && chat_template) {
        s = mr_error_set(MR_EINVAL, "--chat-template needs a tokenizer (%s has no tokenizer.json)", model_dir);
        goto fail;
    }
    if (stat(path, &st) == 0) {
        if ((s = mr_tokenizer_load(model_dir, &t->tok))) goto fail;
        if ((s = mr_vocab_index_new(t->tok, &t->vix))) goto fail;
        s = chat_template ? mr_chat_open_override(model_dir, chat_template, &t->chat) : mr_chat_open(model_dir, &t->chat);
        if (s == MR_ENOTFOUND) {
            s = MR_OK; /* completions only */
            mr_error_clear();
        } else if (s) {
            goto fail;
        } else {
            t->format = mr_chat_format_of(t->chat);
        }
    }
    const char *rp = so ? so->reasoning_parser : NULL, *tp = so ? so->tool_call_parser : NULL;
    if ((rp || tp) && (!t->chat || t->format != MR_CHAT_FORMAT_MINIMAX_M2)) {
        s = mr_error_set(MR_EINVAL, "--%s %s: the chat template is not MiniMax-M2's (its tags are what the parser reads)",
                         rp ? "reasoning-parser" : "tool-call-parser", rp ? rp : tp);
        goto fail;
    }
    t->append_think = named(APPEND_THINK, rp);
    *out = t;
    return MR_OK;
fail:
    sv_text_close(t);
    return s;
}

mr_status sv_text_check_vocab(const sv_text *t, int64_t vocab) {
    if (t->tok && mr_tokenizer_id_limit(t->tok) > vocab)
        return mr_error_set(MR_ECONFIG, "tokenizer.json has ids up to %d, above the model's vocabulary of %lld",
                            (int)mr_tokenizer_id_limit(t->tok) - 1, (long long)vocab);
    return MR_OK;
}

void sv_text_close(sv_text *t) {
    if (!t) return;
    mr_tokenizer_free(t->tok);
    mr_vocab_index_free(t->vix);
    mr_chat_free(t->chat);
    mr_free(t);
}

const mr_vocab_index *sv_text_vocab_index(const sv_text *t) { return t ? t->vix : NULL; }

bool sv_text_reasoning(const sv_text *t) {
    if (!t || !t->chat) return false;
    mr_chat_parser_opts o;
    mr_chat_parser_opts_default(&o, t->format);
    return o.reasoning;
}

int64_t sv_text_model_vocab(const sv_text *t) { return t && t->tok ? (int64_t)mr_tokenizer_model_vocab_size(t->tok) : 0; }

bool sv_text_has_tokenizer(const sv_text *t) { return t && t->tok; }
bool sv_text_has_chat_template(const sv_text *t) { return t && t->chat; }
bool sv_text_tagged_output(const sv_text *t) { return t && t->chat && t->format != MR_CHAT_FORMAT_PLAIN; }

mr_status sv_text_encode(const sv_text *t, const char *s, size_t n, bool add_special, int32_t **ids, int64_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!t->tok) return mr_error_set(MR_EUNSUPPORTED, "this model has no tokenizer: send the prompt as token ids");
    mr_tok_ids v = {0};
    mr_status st = mr_tokenizer_encode(t->tok, s, n, add_special ? MR_TOK_ADD_SPECIAL : 0, &v, NULL);
    if (st) {
        mr_tok_ids_free(&v);
        return st;
    }
    *ids = v.ids;
    *n_ids = (int64_t)v.n;
    return MR_OK;
}

mr_status sv_text_decode(const sv_text *t, const int32_t *ids, int64_t n, bool skip_special, char **out) {
    *out = NULL;
    if (!t->tok) return mr_error_set(MR_EUNSUPPORTED, "this model has no tokenizer: token ids cannot be turned into text");
    size_t len;
    /* an id of the model's padded vocabulary that names no token has no text (as sv_detok_push) */
    int32_t *kept = n ? malloc((size_t)n * sizeof *kept) : NULL;
    if (n && !kept) return mr_error_set(MR_ENOMEM, NULL);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (mr_tokenizer_id_to_piece(t->tok, ids[i], NULL)) kept[k++] = ids[i];
    mr_status st = mr_tokenizer_decode(t->tok, kept ? kept : ids, k, skip_special, out, &len);
    free(kept);
    return st;
}

mr_status sv_text_piece(const sv_text *t, int32_t id, const char **bytes, size_t *n) {
    *bytes = t->tok ? mr_tokenizer_id_to_bytes(t->tok, id, n) : NULL;
    if (!*bytes) {
        *n = 0;
        return mr_error_set(MR_ERANGE, "token %d has no text", id);
    }
    return MR_OK;
}

mr_status sv_text_render_chat(const sv_text *t, const json_t *messages, const json_t *tools, const json_t *kwargs,
                              bool add_generation_prompt, bool continue_final, char **out) {
    *out = NULL;
    if (!t->chat)
        return mr_error_set(MR_EUNSUPPORTED, "this model has no chat template (tokenizer_config.json or chat_template.jinja)");
    mr_chat_request r = {.messages = messages, .tools = tools, .kwargs = kwargs,
                         .add_generation_prompt = add_generation_prompt, .continue_final_message = continue_final};
    size_t len;
    return mr_chat_apply(t->chat, &r, out, &len);
}

mr_status sv_detok_new(const sv_text *t, bool skip_special, sv_detok **out) {
    *out = NULL;
    sv_detok *d = mr_calloc(1, sizeof *d);
    if (!d) return MR_ENOMEM;
    d->t = t->tok;
    mr_status st = mr_tokstream_new(t->tok, skip_special, &d->s);
    if (st) {
        mr_free(d);
        return st;
    }
    *out = d;
    return MR_OK;
}

void sv_detok_free(sv_detok *d) {
    if (!d) return;
    mr_tokstream_free(d->s);
    mr_free(d);
}

mr_status sv_detok_push(sv_detok *d, int32_t id, char **buf, size_t *len, size_t *cap) {
    const char *o;
    size_t n;
    /* an id of the model's padded vocabulary that names no token has no text */
    if (!mr_tokenizer_id_to_piece(d->t, id, NULL)) return MR_OK;
    mr_status st = mr_tokstream_push(d->s, &id, 1, &o, &n);
    if (st) return st;
    sv_buf b = {*buf, *len, *cap};
    if (n && sv_buf_add(&b, o, n)) return mr_error_set(MR_ENOMEM, NULL);
    *buf = b.p, *len = b.len, *cap = b.cap;
    return MR_OK;
}

mr_status sv_detok_flush(sv_detok *d, char **buf, size_t *len, size_t *cap) {
    const char *o;
    size_t n;
    mr_status st = mr_tokstream_flush(d->s, &o, &n);
    if (st) return st;
    sv_buf b = {*buf, *len, *cap};
    if (n && sv_buf_add(&b, o, n)) return mr_error_set(MR_ENOMEM, NULL);
    *buf = b.p, *len = b.len, *cap = b.cap;
    return MR_OK;
}

bool sv_text_think_open(const char *text) {
    const char *open = NULL, *close = NULL;
    for (const char *p = text; (p = strstr(p, "<think>")); p++) open = p;
    for (const char *p = text; (p = strstr(p, "</think>")); p++) close = p;
    return open && (!close || close < open);
}

mr_status sv_parse_new(const sv_text *t, const json_t *tools, bool reasoning, bool think_open, sv_parse **out) {
    *out = NULL;
    sv_parse *p = mr_calloc(1, sizeof *p);
    if (!p) return MR_ENOMEM;
    mr_chat_parser_opts o;
    mr_chat_parser_opts_default(&o, t->chat ? t->format : MR_CHAT_FORMAT_PLAIN);
    /* append-think (vLLM's MiniMaxM2AppendThinkReasoningParser): the whole output is content, "<think>" first */
    p->prefix = t->append_think && think_open;
    o.reasoning = o.reasoning && reasoning && !t->append_think;
    o.think_open = o.think_open && think_open;
    o.tool_calls = o.tool_calls && tools && json_array_size(tools) > 0;
    o.tools = tools;
    mr_status st = mr_chat_parser_new(&o, &p->p);
    if (st) {
        mr_free(p);
        return st;
    }
    *out = p;
    return MR_OK;
}

void sv_parse_free(sv_parse *p) {
    if (!p) return;
    mr_chat_parser_free(p->p);
    sv_buf_free(&p->first);
    mr_free(p);
}

static mr_status convert(sv_parse *p, const mr_chat_delta *d, bool last, sv_parse_out *o) {
    memset(o, 0, sizeof *o);
    o->reasoning = d->reasoning;
    o->n_reasoning = d->reasoning_len;
    o->content = d->content;
    o->n_content = d->content_len;
    size_t n = d->n_tools < sizeof p->pieces / sizeof p->pieces[0] ? d->n_tools : sizeof p->pieces / sizeof p->pieces[0];
    for (size_t i = 0; i < n; i++)
        p->pieces[i] = (sv_tool_piece){d->tools[i].index, d->tools[i].id, d->tools[i].name, d->tools[i].args,
                                       d->tools[i].args_len};
    o->tools = p->pieces;
    o->n_tools = n;
    if (p->prefix && (o->n_content || o->n_tools || last)) { /* the first text of the output */
        p->prefix = false;
        p->first.len = 0;
        if (sv_buf_lit(&p->first, "<think>") || sv_buf_add(&p->first, d->content, d->content_len))
            return mr_error_set(MR_ENOMEM, NULL);
        o->content = p->first.p;
        o->n_content = p->first.len;
    }
    for (size_t i = 0; i < d->n_warnings; i++) MR_DEBUG("serve: output parser: %s", d->warnings[i]);
    return n < d->n_tools ? mr_error_set(MR_ECAPACITY, "more than 16 tool-call pieces in one token") : MR_OK;
}

mr_status sv_parse_push(sv_parse *p, const char *text, size_t n, sv_parse_out *o) {
    const mr_chat_delta *d;
    mr_status st = mr_chat_parser_feed(p->p, text, n, &d);
    return st ? st : convert(p, d, false, o);
}

mr_status sv_parse_finish(sv_parse *p, sv_parse_out *o) {
    const mr_chat_delta *d;
    mr_status st = mr_chat_parser_finish(p->p, &d);
    return st ? st : convert(p, d, true, o);
}
