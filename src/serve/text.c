/* text.c — the text seam of the server: tokenizer, streaming detokenizer,
 * chat template and the reasoning / tool-call parsers, read from the model
 * folder. Until the text library (src/text) is linked in, a checkpoint is
 * served by token ids: prompts must be token ids, chat is refused, and each
 * choice carries the ids it generated. The functions keep the shape that the
 * text library's calls will fill. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "serve/serve_internal.h"

struct sv_text {
    int64_t vocab;
    bool tokenizer_file; /* tokenizer.json present */
};

struct sv_detok {
    int unused;
};

struct sv_parse {
    bool reasoning;
};

mr_status sv_text_open(const char *model_dir, int64_t vocab, sv_text **out) {
    *out = NULL;
    sv_text *t = mr_calloc(1, sizeof *t);
    if (!t) return MR_ENOMEM;
    t->vocab = vocab;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    t->tokenizer_file = stat(path, &st) == 0;
    if (t->tokenizer_file)
        MR_WARN("serve: %s has a tokenizer.json, but this build serves token ids only", model_dir);
    *out = t;
    return MR_OK;
}

void sv_text_close(sv_text *t) { mr_free(t); }
bool sv_text_has_tokenizer(const sv_text *t) { return t && false; }
bool sv_text_has_chat_template(const sv_text *t) { return t && false; }

mr_status sv_text_encode(const sv_text *t, const char *s, size_t n, bool add_special, int32_t **ids, int64_t *n_ids) {
    (void)t, (void)s, (void)n, (void)add_special;
    *ids = NULL;
    *n_ids = 0;
    return mr_error_set(MR_EUNSUPPORTED, "this model has no tokenizer: send the prompt as token ids");
}

mr_status sv_text_decode(const sv_text *t, const int32_t *ids, int64_t n, bool skip_special, char **out) {
    (void)t, (void)ids, (void)n, (void)skip_special;
    *out = NULL;
    return mr_error_set(MR_EUNSUPPORTED, "this model has no tokenizer: token ids cannot be turned into text");
}

mr_status sv_text_render_chat(const sv_text *t, const json_t *messages, const json_t *tools, const json_t *kwargs,
                              bool add_generation_prompt, char **out) {
    (void)t, (void)messages, (void)tools, (void)kwargs, (void)add_generation_prompt;
    *out = NULL;
    return mr_error_set(MR_EUNSUPPORTED, "this model has no chat template (tokenizer_config.json or chat_template.jinja)");
}

mr_status sv_detok_new(const sv_text *t, bool skip_special, sv_detok **out) {
    (void)t, (void)skip_special;
    *out = mr_calloc(1, sizeof **out);
    return *out ? MR_OK : MR_ENOMEM;
}
void sv_detok_free(sv_detok *d) { mr_free(d); }
mr_status sv_detok_push(sv_detok *d, int32_t id, char **buf, size_t *len, size_t *cap) {
    (void)d, (void)id, (void)buf, (void)len, (void)cap;
    return MR_OK; /* ids only: no text */
}
mr_status sv_detok_flush(sv_detok *d, char **buf, size_t *len, size_t *cap) {
    (void)d, (void)buf, (void)len, (void)cap;
    return MR_OK;
}

mr_status sv_parse_new(const sv_text *t, const json_t *tools, bool reasoning, sv_parse **out) {
    (void)t, (void)tools;
    sv_parse *p = mr_calloc(1, sizeof *p);
    if (!p) return MR_ENOMEM;
    p->reasoning = reasoning;
    *out = p;
    return MR_OK;
}
void sv_parse_free(sv_parse *p) { mr_free(p); }
mr_status sv_parse_push(sv_parse *p, const char *text, size_t n, sv_parse_out *o) {
    (void)p;
    memset(o, 0, sizeof *o);
    o->content = text;
    o->n_content = n;
    return MR_OK;
}
mr_status sv_parse_finish(sv_parse *p, sv_parse_out *o) {
    (void)p;
    memset(o, 0, sizeof *o);
    return MR_OK;
}
