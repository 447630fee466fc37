/* grammar_tags.c — structural tags (xgrammar's, as vLLM and sglang take them
 * in response_format {"type": "structural_tag", ...}): free text in which a
 * trigger opens a tagged value. Builds the G_TAGS root of a grammar: the tags
 * sorted by begin, each trigger's range of them, and one automaton over all
 * triggers (Aho-Corasick, every transition written out) that the matcher
 * steps once per byte of free text.
 *
 * The output, as the matcher follows it (grammar_match.c, the root frame):
 *   free text, until a trigger has just been written (the first place where
 *   one ends; where two end at once, the longer); then the rest of the begin
 *   of one tag that starts with that trigger; whitespace (as between JSON
 *   tokens); the tag's JSON value; whitespace, unless the end starts with
 *   some; the end; free text again (or nothing, stop_after_first).
 * The spec, in either of the two forms vLLM and sglang accept:
 *   {"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}
 *   {"format": {"type": "triggered_tags", "triggers": [...], "tags": [{"type":
 *     "tag", "begin", "content": {"type": "json_schema", "json_schema"},
 *     "end"}, ...], "at_least_one", "stop_after_first"}}
 * ("type": "structural_tag" beside them is fine). Every begin starts with a
 * trigger and every trigger starts a begin; no begin is a prefix of another. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar_internal.h"

#define MAX_TAGS 256
#define MAX_TRIGGERS 64
#define MAX_TRIGGER_BYTES 1024 /* all triggers together: the automaton's states */
#define MAX_MARK 1024          /* a begin or an end */

typedef struct {
    const char *begin, *end;
    const json_t *schema;
    char path[48], spath[96]; /* the tag's, its schema's */
    int32_t node;             /* the content's node when built already, else -1 */
} tagspec;

static mr_status fail(const char *where, const char *what) { return mr_error_set(MR_EINVAL, "%s: %s", where, what); }

/* A string field of a tag: non-empty (an end may be empty), at most MAX_MARK bytes. */
static mr_status mark(const json_t *o, const char *k, const char *path, bool empty_ok, const char **out) {
    char where[96];
    snprintf(where, sizeof where, "%s/%s", path, k);
    const json_t *v = json_object_get(o, k);
    if (!json_is_string(v)) return fail(where, "must be a string");
    if (!empty_ok && !json_string_length(v)) return fail(where, "must not be empty");
    if (json_string_length(v) > MAX_MARK) return fail(where, "is longer than 1024 bytes");
    if (strlen(json_string_value(v)) != json_string_length(v)) return fail(where, "holds a NUL character");
    *out = json_string_value(v);
    return MR_OK;
}

/* Only the listed keys. */
static mr_status only(const json_t *o, const char *path, const char *const *keys) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        int i = 0;
        while (keys[i] && strcmp(keys[i], k)) i++;
        if (!keys[i]) {
            char where[128];
            snprintf(where, sizeof where, "%s/%.60s", path, k);
            return fail(where, "is not a field of a structural tag here");
        }
    }
    return MR_OK;
}

static mr_status read_tag(const json_t *t, const char *path, bool legacy, tagspec *out) {
    if (!json_is_object(t)) return fail(path, "must be an object");
    static const char *const LEGACY[] = {"begin", "schema", "end", NULL}, *const TAG[] = {"type", "begin", "content", "end", NULL};
    mr_status st = only(t, path, legacy ? LEGACY : TAG);
    if (st) return st;
    snprintf(out->path, sizeof out->path, "%s", path);
    if ((st = mark(t, "begin", path, false, &out->begin)) || (st = mark(t, "end", path, true, &out->end))) return st;
    if (legacy) {
        out->schema = json_object_get(t, "schema");
        if (!out->schema) return fail(path, "has no schema");
        snprintf(out->spath, sizeof out->spath, "%s/schema", path);
        return MR_OK;
    }
    const json_t *ty = json_object_get(t, "type");
    if (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "tag"))) {
        char where[96];
        snprintf(where, sizeof where, "%s/type", path);
        return fail(where, "must be \"tag\"");
    }
    const json_t *c = json_object_get(t, "content");
    char where[96];
    snprintf(where, sizeof where, "%s/content", path);
    if (!json_is_object(c)) return fail(where, "must be an object: {\"type\": \"json_schema\", \"json_schema\": {...}}");
    const char *ct = json_string_value(json_object_get(c, "type"));
    if (!ct || strcmp(ct, "json_schema")) {
        mr_error_set(MR_EINVAL, "%s/type: content of type \"%.40s\" is not supported (json_schema is)", where, ct ? ct : "?");
        return MR_EINVAL;
    }
    static const char *const CONTENT[] = {"type", "json_schema", NULL};
    if ((st = only(c, where, CONTENT))) return st;
    out->schema = json_object_get(c, "json_schema");
    if (!out->schema) return fail(where, "has no json_schema");
    snprintf(out->spath, sizeof out->spath, "%s/content/json_schema", path);
    return MR_OK;
}

static _Thread_local const tagspec *tl_sort; /* qsort takes no context */
static int by_begin(const void *x, const void *y) {
    return strcmp(tl_sort[*(const int32_t *)x].begin, tl_sort[*(const int32_t *)y].begin);
}

/* The automaton over the triggers: a trie, then every missing transition filled from the failure state. */
static mr_status build_ac(mr_grammar *g, const char *const *trig, int32_t nt) {
    int32_t total = 1;
    for (int32_t i = 0; i < nt; i++) total += (int32_t)strlen(trig[i]);
    g->ac_next = mr_malloc((size_t)total * 256 * sizeof(int32_t));
    g->ac_fire = mr_malloc((size_t)total * sizeof(int32_t));
    int32_t *fail_of = mr_malloc((size_t)total * sizeof(int32_t)), *queue = mr_malloc((size_t)total * sizeof(int32_t));
    if (!g->ac_next || !g->ac_fire || !fail_of || !queue) {
        mr_free(fail_of), mr_free(queue);
        return MR_ENOMEM;
    }
    int32_t n = 1;
    for (int32_t i = 0; i < 256 * total; i++) g->ac_next[i] = -1;
    for (int32_t i = 0; i < total; i++) g->ac_fire[i] = -1;
    for (int32_t t = 0; t < nt; t++) {
        int32_t s = 0;
        for (const uint8_t *p = (const uint8_t *)trig[t]; *p; p++) {
            if (g->ac_next[s * 256 + *p] < 0) g->ac_next[s * 256 + *p] = n++;
            s = g->ac_next[s * 256 + *p];
        }
        g->ac_fire[s] = t; /* the whole path: the longest trigger ending here */
    }
    int32_t qh = 0, qt = 0;
    for (int c = 0; c < 256; c++) {
        int32_t u = g->ac_next[c];
        if (u < 0) g->ac_next[c] = 0;
        else fail_of[u] = 0, queue[qt++] = u;
    }
    while (qh < qt) {
        const int32_t s = queue[qh++];
        if (g->ac_fire[s] < 0) g->ac_fire[s] = g->ac_fire[fail_of[s]];
        for (int c = 0; c < 256; c++) {
            const int32_t u = g->ac_next[s * 256 + c], f = g->ac_next[fail_of[s] * 256 + c];
            if (u < 0) {
                g->ac_next[s * 256 + c] = f;
            } else {
                fail_of[u] = f;
                queue[qt++] = u;
            }
        }
    }
    g->n_ac = n;
    mr_free(fail_of), mr_free(queue);
    return MR_OK;
}

static mr_status build(mr_grammar *g, tagspec *ts, int32_t n, const char **trig, int32_t nt, const char *trig_key) {
    /* the tags by begin; none a prefix of the next (so of none) */
    int32_t *order = mr_malloc((size_t)n * sizeof(int32_t));
    g->tags = mr_calloc((size_t)n, sizeof(mr__gtag));
    g->trigs = mr_calloc((size_t)nt, sizeof(mr__gtrig));
    if (!order || !g->tags || !g->trigs) {
        mr_free(order);
        return MR_ENOMEM;
    }
    for (int32_t i = 0; i < n; i++) order[i] = i;
    tl_sort = ts;
    qsort(order, (size_t)n, sizeof(int32_t), by_begin);
    mr_status st = MR_OK;
    for (int32_t k = 0; k + 1 < n && !st; k++) {
        const char *a = ts[order[k]].begin, *b = ts[order[k + 1]].begin;
        if (!strncmp(a, b, strlen(a)))
            st = mr_error_set(MR_EINVAL, "%s/begin: \"%.80s\" %s the begin of %s; a tag's begin must decide it", ts[order[k]].path,
                              a, strlen(a) == strlen(b) ? "is also" : "starts", ts[order[k + 1]].path);
    }
    for (int32_t k = 0; k < n && !st; k++) {
        const tagspec *t = &ts[order[k]];
        mr__gtag *x = &g->tags[k];
        st = mr__grammar_lit(g, t->begin, strlen(t->begin), &x->begin);
        if (!st) st = mr__grammar_lit(g, t->end, strlen(t->end), &x->end);
        if (!st) st = t->node >= 0 ? (x->value = t->node, MR_OK) : mr__grammar_schema(g, NULL, t->schema, t->spath, &x->value);
    }
    g->n_tags = n;
    /* each trigger's tags (a range of the sorted begins), and each tag reached by a trigger */
    g->trig_lt = true;
    for (int32_t i = 0; i < nt && !st; i++) {
        const size_t len = strlen(trig[i]);
        int32_t lo = 0;
        while (lo < n && strncmp(ts[order[lo]].begin, trig[i], len) < 0) lo++;
        int32_t hi = lo;
        while (hi < n && !strncmp(ts[order[hi]].begin, trig[i], len)) hi++;
        if (lo == hi) st = mr_error_set(MR_EINVAL, "%s: \"%.80s\" starts no tag's begin", trig_key, trig[i]);
        g->trigs[i] = (mr__gtrig){lo, hi, (int32_t)len};
        g->trig_lt &= trig[i][0] == '<';
    }
    g->n_trigs = nt;
    for (int32_t k = 0; k < n && !st; k++) {
        int32_t i = 0;
        while (i < nt && strncmp(ts[order[k]].begin, trig[i], strlen(trig[i]))) i++;
        if (i == nt)
            st = mr_error_set(MR_EINVAL, "%s/begin: \"%.80s\" starts with none of the triggers", ts[order[k]].path,
                              ts[order[k]].begin);
    }
    mr_free(order);
    if (!st) st = build_ac(g, trig, nt);
    return st;
}

mr_status mr_grammar_structural_tag(const json_t *spec, mr_grammar **out) {
    *out = NULL;
    if (!json_is_object(spec)) return fail("structural tag", "must be an object");
    const json_t *fmt = json_object_get(spec, "format"), *tags, *trigs;
    const bool legacy = !fmt;
    uint8_t flags = 0;
    const char *tags_key = legacy ? "structures" : "format/tags", *trig_key = legacy ? "triggers" : "format/triggers";
    mr_status st;
    if (legacy) {
        static const char *const TOP[] = {"type", "structures", "triggers", NULL};
        if ((st = only(spec, "structural tag", TOP))) return st;
        tags = json_object_get(spec, "structures");
        trigs = json_object_get(spec, "triggers");
    } else {
        static const char *const TOP[] = {"type", "format", NULL};
        static const char *const FMT[] = {"type", "triggers", "tags", "at_least_one", "stop_after_first", NULL};
        if ((st = only(spec, "structural tag", TOP))) return st;
        if (!json_is_object(fmt)) return fail("format", "must be an object");
        const char *ft = json_string_value(json_object_get(fmt, "type"));
        if (!ft || strcmp(ft, "triggered_tags"))
            return mr_error_set(MR_EINVAL, "format/type: a format of type \"%.40s\" is not supported (triggered_tags is, "
                                "with tags of json_schema content; or the structures / triggers form)", ft ? ft : "?");
        if ((st = only(fmt, "format", FMT))) return st;
        tags = json_object_get(fmt, "tags");
        trigs = json_object_get(fmt, "triggers");
        static const char *const FL[] = {"at_least_one", "stop_after_first"};
        for (int i = 0; i < 2; i++) {
            const json_t *b = json_object_get(fmt, FL[i]);
            char where[48];
            snprintf(where, sizeof where, "format/%s", FL[i]);
            if (b && !json_is_boolean(b)) return fail(where, "must be a boolean");
            if (json_is_true(b)) flags |= (uint8_t)(1u << i);
        }
    }
    const size_t n = json_array_size(tags), nt = json_array_size(trigs);
    if (!json_is_array(tags) || !n) return fail(tags_key, "must be a non-empty list of tags");
    if (n > MAX_TAGS) return fail(tags_key, "holds more than 256 tags");
    if (!json_is_array(trigs) || !nt) return fail(trig_key, "must be a non-empty list of strings");
    if (nt > MAX_TRIGGERS) return fail(trig_key, "holds more than 64 triggers");
    tagspec *ts = mr_calloc(n, sizeof *ts);
    const char **tr = mr_calloc(nt, sizeof *tr);
    if (!ts || !tr) {
        mr_free(ts), mr_free(tr);
        return MR_ENOMEM;
    }
    st = MR_OK;
    size_t bytes = 0, ntu = 0;
    for (size_t i = 0; i < nt && !st; i++) {
        const json_t *x = json_array_get(trigs, i);
        char where[48];
        snprintf(where, sizeof where, "%s/%zu", trig_key, i);
        if (!json_is_string(x) || !json_string_length(x) || strlen(json_string_value(x)) != json_string_length(x)) {
            st = fail(where, "must be a non-empty string");
            break;
        }
        bytes += json_string_length(x);
        size_t j = 0;
        while (j < ntu && strcmp(tr[j], json_string_value(x))) j++;
        if (j == ntu) tr[ntu++] = json_string_value(x); /* a repeat is the same trigger */
    }
    if (!st && bytes > MAX_TRIGGER_BYTES) st = fail(trig_key, "hold more than 1024 bytes together");
    for (size_t i = 0; i < n && !st; i++) {
        char path[40];
        snprintf(path, sizeof path, "%s/%zu", tags_key, i);
        ts[i].node = -1;
        st = read_tag(json_array_get(tags, i), path, legacy, &ts[i]);
    }
    mr_grammar *g = NULL;
    if (!st) st = mr__grammar_new(&g);
    if (!st) {
        g->tag_flags = flags;
        st = mr__grammar_node(g, G_TAGS, &g->root);
        if (!st) st = build(g, ts, (int32_t)n, tr, (int32_t)ntu, trig_key);
        st = mr__grammar_finish(g, st, "structural tag", out);
        if (!st)
            snprintf((*out)->desc, sizeof (*out)->desc, "structural tag: %d tags, %d triggers, %d nodes", (int)n, (int)ntu,
                     (int)(*out)->n_nodes);
    }
    mr_free(ts), mr_free(tr);
    return st;
}

/* ---- MiniMax-M2's tool calls, strict ---- */
/* A parameter's value as MiniMax-M2's parser reads it (src/text/parse_output.c): the text between the tags,
 * stripped, "null" (any case) read as null, a string when the schema admits one; else parsed by its types. */
static bool admits_string(const json_t *s) {
    if (json_is_true(s) || (json_is_object(s) && !json_object_size(s))) return true;
    const json_t *ty = json_object_get(s, "type");
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), "string");
    size_t i;
    const json_t *x;
    if (json_is_array(ty)) {
        json_array_foreach(ty, i, x) if (json_is_string(x) && !strcmp(json_string_value(x), "string")) return true;
        return false;
    }
    static const char *const COMB[] = {"anyOf", "oneOf"};
    for (int k = 0; k < 2; k++)
        json_array_foreach(json_object_get(s, COMB[k]), i, x) if (admits_string(x)) return true;
    return false;
}

static bool names_null(const json_t *s) {
    const json_t *ty = json_object_get(s, "type");
    size_t i;
    const json_t *x;
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), "null");
    json_array_foreach(ty, i, x) if (json_is_string(x) && !strcmp(json_string_value(x), "null")) return true;
    static const char *const COMB[] = {"anyOf", "oneOf"};
    for (int k = 0; k < 2; k++)
        json_array_foreach(json_object_get(s, COMB[k]), i, x) if (names_null(x)) return true;
    return false;
}

/* The value node of one parameter of a strict tool. */
static mr_status xparam(mr_grammar *g, const json_t *doc, const json_t *s, const char *path, int32_t *out) {
    const json_t *en = json_object_get(s, "enum"), *co = json_object_get(s, "const");
    if (en || co) { /* the values as the model writes them: strings raw, the others as JSON */
        const size_t n = co ? 1 : json_array_size(en);
        if (!n) return mr_error_set(MR_EINVAL, "%s/enum: an empty enum allows no value", path);
        char **txt = mr_calloc(n, sizeof *txt);
        if (!txt) return MR_ENOMEM;
        mr_status st = MR_OK;
        for (size_t i = 0; i < n && !st; i++) {
            const json_t *v = co ? co : json_array_get(en, i);
            txt[i] = json_is_string(v) ? strdup(json_string_value(v)) : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!txt[i]) {
                st = MR_ENOMEM;
                break;
            }
            const size_t L = strlen(txt[i]);
            if (json_is_string(v) && (!L || strchr(" \t\n\r", txt[i][0]) || strchr(" \t\n\r", txt[i][L - 1]) ||
                                      strcasecmp(txt[i], "null") == 0 || strstr(txt[i], "</parameter>") ||
                                      L != json_string_length(v)))
                st = mr_error_set(MR_EINVAL, "%s: the value \"%.60s\" cannot be written as MiniMax-M2's parameter text "
                                  "(it is stripped of whitespace, \"null\" reads as null, and it ends at </parameter>)",
                                  path, txt[i]);
        }
        if (!st) st = mr__grammar_raw_lits(g, (const char *const *)txt, (int32_t)n, out);
        for (size_t i = 0; i < n; i++) free(txt[i]);
        mr_free(txt);
        return st;
    }
    if (!admits_string(s)) return mr__grammar_schema(g, doc, s, path, out);
    static const char *const STRING_RULES[] = {"pattern", "format", "minLength", "maxLength", NULL};
    for (int i = 0; STRING_RULES[i]; i++)
        if (json_object_get(s, STRING_RULES[i]))
            return mr_error_set(MR_EINVAL, "%s/%s: a string parameter's %s is not enforced in MiniMax-M2's tool-call "
                                "text (strict); drop the keyword or strict", path, STRING_RULES[i], STRING_RULES[i]);
    *out = names_null(s) ? XV_TEXT_NULL : XV_TEXT;
    return MR_OK;
}

static _Thread_local const mr_grammar *tl_xg;
static int by_name(const void *x, const void *y) {
    size_t la, lb;
    const char *a = mr__glit(tl_xg, ((const mr__gxtool *)x)->name, &la), *b = mr__glit(tl_xg, ((const mr__gxtool *)y)->name, &lb);
    const int c = memcmp(a, b, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static mr_status xtool(mr_grammar *g, const json_t *tool, size_t i, bool forced, mr__gxtool *x) {
    const json_t *fn = json_object_get(tool, "function");
    if (!fn) fn = tool;
    const char *name = json_string_value(json_object_get(fn, "name"));
    char path[128];
    snprintf(path, sizeof path, "tools/%zu/function/name", i);
    if (!name || !*name || strpbrk(name, "\"<>\n"))
        return mr_error_set(MR_EINVAL, "%s: a tool name without '\"', '<', '>' or a newline is needed here", path);
    char *lit = mr_malloc(strlen(name) + 3);
    if (!lit) return MR_ENOMEM;
    sprintf(lit, "%s\">", name);
    mr_status st = mr__grammar_lit(g, lit, strlen(lit), &x->name);
    mr_free(lit);
    if (st) return st;
    const json_t *params = json_object_get(fn, "parameters"), *props = json_object_get(params, "properties");
    x->strict = (forced || json_is_true(json_object_get(fn, "strict"))) && json_is_object(props);
    x->pa = g->n_props, x->pb = 0;
    if (!x->strict) return MR_OK;
    if (json_object_size(props) > MR_GRAMMAR_MAX_PROPS)
        return mr_error_set(MR_EINVAL, "tools/%zu/function/parameters: more than %d properties", i, MR_GRAMMAR_MAX_PROPS);
    const json_t *req = json_object_get(params, "required");
    const char *k;
    const json_t *v;
    mr__gprop tmp[MR_GRAMMAR_MAX_PROPS]; /* appended together: a value's own objects add props of their own */
    int32_t np = 0;
    json_object_foreach((json_t *)props, k, v) {
        snprintf(path, sizeof path, "tools/%zu/function/parameters/properties/%.40s", i, k);
        if (strpbrk(k, "\"<>\n") || !*k)
            return mr_error_set(MR_EINVAL, "%s: a parameter name without '\"', '<', '>' or a newline is needed here", path);
        char *kl = mr_malloc(strlen(k) + 3);
        if (!kl) return MR_ENOMEM;
        sprintf(kl, "%s\">", k);
        int32_t key, value;
        st = mr__grammar_lit(g, kl, strlen(kl), &key);
        mr_free(kl);
        if (!st) st = xparam(g, params, v, path, &value);
        if (st) return st;
        bool required = false;
        size_t j;
        const json_t *r;
        json_array_foreach(req, j, r) required |= json_is_string(r) && !strcmp(json_string_value(r), k);
        tmp[np++] = (mr__gprop){.key = key, .value = value, .required = required};
    }
    x->pb = np;
    return mr__grammar_props(g, tmp, np, &x->pa);
}

static mr_status minimax(const json_t *tools, const char *name, int max_calls, bool forced, mr_grammar **out) {
    *out = NULL;
    const size_t nt = json_array_size(tools);
    if (!nt) return mr_error_set(MR_EINVAL, "grammar: tool calls need at least one tool");
    if (nt > MAX_TAGS) return mr_error_set(MR_EINVAL, "grammar: more than 256 tools");
    mr_grammar *g;
    mr_status st = mr__grammar_new(&g);
    if (st) return st;
    g->xtools = mr_calloc(nt, sizeof(mr__gxtool));
    if (!g->xtools) st = MR_ENOMEM;
    size_t nx = 0; /* the tools taken: all, or the named one */
    for (size_t i = 0; i < nt && !st; i++) {
        const json_t *t = json_array_get(tools, i), *fn = json_object_get(t, "function");
        const char *nm = json_string_value(json_object_get(fn ? fn : t, "name"));
        if (!name || (nm && !strcmp(nm, name))) st = xtool(g, t, i, forced, &g->xtools[nx++]);
    }
    if (!st && !nx) st = mr_error_set(MR_EINVAL, "grammar: no tool is named \"%.80s\"", name);
    if (!st) {
        g->n_xtools = (int32_t)nx;
        tl_xg = g;
        qsort(g->xtools, nx, sizeof(mr__gxtool), by_name);
        for (size_t i = 0; i + 1 < nx && !st; i++)
            if (!by_name(&g->xtools[i], &g->xtools[i + 1])) st = mr_error_set(MR_EINVAL, "grammar: two tools share a name");
    }
    int32_t calls = -1;
    if (!st) st = mr__grammar_node(g, G_XCALLS, &calls);
    if (!st) {
        g->nodes[calls].a = 0, g->nodes[calls].b = (int32_t)nx, g->nodes[calls].hi = max_calls > 0 ? max_calls : -1;
        if (max_calls > 0) g->tag_flags = MR__TAGS_STOP_AFTER_FIRST; /* one block: the calls of the answer */
        if (forced) g->tag_flags = MR__TAGS_STOP_AFTER_FIRST | MR__TAGS_AT_LEAST_ONE | MR__TAGS_NO_TEXT;
        st = mr__grammar_node(g, G_TAGS, &g->root);
    }
    tagspec t = {.begin = "<minimax:tool_call>", .end = "", .node = calls, .path = "tools"};
    const char *trig = t.begin;
    if (!st) st = build(g, &t, 1, &trig, 1, "triggers");
    st = mr__grammar_finish(g, st, "minimax tool calls", out);
    return st;
}

mr_status mr_grammar_minimax_tools(const json_t *tools, int max_calls, mr_grammar **out) {
    return minimax(tools, NULL, max_calls, false, out);
}

mr_status mr_grammar_minimax_forced(const json_t *tools, const char *name, int max_calls, mr_grammar **out) {
    return minimax(tools, name, max_calls, true, out);
}
